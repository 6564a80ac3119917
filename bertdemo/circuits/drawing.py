"""An attribution graph drawn: in the page (plotly) and as files (JSON, CSV, PNG, SVG).

    figure(graph)                         # go.Figure: the page's drawing
    graph_files(graph, folder, ...)       # [graph.csv, graph.json (the viewer's), graph.png, graph.svg]

The sentence's tokens run along x (the [MASK]'s column shaded), depth up y: the embeddings (token
nodes) at the bottom, layers 1..L (features and errors), the logits at the top. A node's size
grows with its influence; its marker tells its kind (token: square, feature: circle, error:
diamond, logit: hexagon). Edges are line segments, blue where the source raises the target and red
where it lowers it, wider for a larger |weight|: the strongest `max_edges` only, drawn as a few
traces (by sign and a width band) so a graph of thousands of edges stays quick in the browser.
Several nodes at one (layer, position) sit side by side. Each node carries its id as its first
`customdata`, which the page reads on a click.
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass
from pathlib import Path

import plotly.graph_objects as go

from ..plots import shown_token
from .files import graph_json
from .graph import Graph

MAX_EDGES = 300
KIND_ORDER = {"logit": 0, "feature": 1, "error": 2, "token": 3}
STYLE = {  # kind -> (plotly symbol, matplotlib marker, colour, name in the legend)
    "token": ("square", "s", "#6b7280", "token (embedding)"),
    "feature": ("circle", "o", "#f59e0b", "transcoder feature"),
    "error": ("diamond", "D", "#a3a3a3", "error (what the transcoder misses)"),
    "logit": ("hexagon", "h", "#16a34a", "logit (a predicted word)"),
}
POSITIVE, NEGATIVE = "#2563eb", "#dc2626"
WIDTHS = (0.6, 1.4, 2.6, 4.2)  # the edges' line widths, by quarter of the largest |weight|
SPREAD = 0.84  # the share of a column several nodes at one place may fill


@dataclass(frozen=True)
class Placed:
    """A node where it is drawn, and its size (pixels of diameter)."""

    node: dict
    x: float
    y: float
    size: float


@dataclass(frozen=True)
class Layout:
    """Where everything is drawn: the nodes placed, the edges kept as (source, target, weight)
    with their ends, the axes' labels."""

    nodes: list[Placed]
    edges: list[tuple[Placed, Placed, float]]
    tokens: list[str]
    layers: int
    mask_position: int
    title: str


def layout(graph: Graph, max_edges: int = MAX_EDGES) -> Layout:
    """The graph placed (see the module doc): nodes by (layer, position), spread within a place;
    the `max_edges` strongest kept edges."""
    layers = max((n["layer"] for n in graph.nodes), default=1) - 1
    largest = max((n.get("influence") or 0.0 for n in graph.nodes), default=0.0) or 1.0
    places: dict[tuple[int, int], list[dict]] = {}
    for node in graph.nodes:
        places.setdefault((node["layer"], node["position"]), []).append(node)
    placed: dict[str, Placed] = {}
    for (layer, position), members in places.items():
        members.sort(key=lambda n: (KIND_ORDER[n["kind"]], -(n.get("influence") or 0.0), n["id"]))
        xs = _spread(position, len(members), len(graph.tokens), alone=layer > layers)
        for node, x in zip(members, xs):
            share = max(node.get("influence") or 0.0, 0.0) / largest
            placed[node["id"]] = Placed(node, x, layer, 7.0 + 23.0 * math.sqrt(share))
    edges = [(placed[e.source], placed[e.target], e.weight) for e in graph.edges
             if e.source in placed and e.target in placed][:max_edges]
    title = f"How the model fills the [MASK] at position {graph.mask_position}: {graph.target}"
    return Layout(list(placed.values()), edges, list(graph.tokens), layers, graph.mask_position, title)


def _spread(position: int, count: int, width: int, alone: bool) -> list[float]:
    """x of `count` nodes at one place: side by side within the column, or for the logits (alone in
    their row) up to 0.7 of a column apart, centred on the mask and kept inside the drawing."""
    if count < 2:
        return [float(position)]
    step = min(0.7, (width - 1) / (count - 1)) if alone else min(0.12, SPREAD / (count - 1))
    start = position - step * (count - 1) / 2
    start = min(max(start, -0.3), width - 0.7 - step * (count - 1))
    return [start + i * step for i in range(count)]


def _band(weight: float, largest: float) -> int:
    return min(len(WIDTHS) - 1, int(len(WIDTHS) * abs(weight) / largest)) if largest > 0 else 0


def _hover(node: dict) -> list:
    """customdata of a node: [id, label, token, activation, influence] (text, escaped)."""
    activation = node.get("activation")
    if node["kind"] == "logit":
        shown_activation = f"probability {activation:.3f}"
    elif activation is None:
        shown_activation = "-"
    else:
        shown_activation = f"activation {activation:.3f}" if node["kind"] == "feature" else f"size {activation:.3f}"
    influence = node.get("influence")
    return [node["id"], html.escape(str(node["label"]) or "-", quote=False),
            html.escape(shown_token(node["token"]), quote=False), shown_activation,
            "-" if influence is None else f"{influence:.2%}"]


def figure(graph: Graph, max_edges: int = MAX_EDGES, selected: str | None = None) -> go.Figure:
    """The page's drawing of `graph` (see the module doc); `selected`: a node id drawn ringed."""
    placed = layout(graph, max_edges)
    fig = go.Figure()
    largest = max((abs(w) for _, _, w in placed.edges), default=0.0)
    segments: dict[tuple[bool, int], tuple[list, list]] = {}
    for source, target, weight in placed.edges:
        xs, ys = segments.setdefault((weight >= 0, _band(weight, largest)), ([], []))
        xs += [source.x, target.x, None]
        ys += [source.y, target.y, None]
    for (positive, band), (xs, ys) in sorted(segments.items(), key=lambda item: item[0][1]):
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", hoverinfo="skip", showlegend=False,
                                 line=dict(color=POSITIVE if positive else NEGATIVE, width=WIDTHS[band]),
                                 opacity=0.35 + 0.15 * band, name="raises" if positive else "lowers"))
    for kind in ("token", "error", "feature", "logit"):
        members = [p for p in placed.nodes if p.node["kind"] == kind]
        if not members:
            continue
        symbol, _, colour, name = STYLE[kind]
        words = kind == "logit"
        fig.add_trace(go.Scatter(
            x=[p.x for p in members], y=[p.y for p in members], mode="markers+text" if words else "markers",
            text=[html.escape(shown_token(p.node["token"]), quote=False) for p in members] if words else None,
            textposition="top center", name=name, customdata=[_hover(p.node) for p in members],
            marker=dict(symbol=symbol, size=[p.size for p in members], color=colour, opacity=0.95,
                        line=dict(width=[3 if p.node["id"] == selected else 1 for p in members],
                                  color=["#111827" if p.node["id"] == selected else "white" for p in members])),
            hovertemplate=("<b>%{customdata[1]}</b><br>%{customdata[0]}, token %{customdata[2]}<br>"
                           "%{customdata[3]}, influence %{customdata[4]}<extra>" + kind + "</extra>")))
    for sign, colour in (("raises", POSITIVE), ("lowers", NEGATIVE)):  # the edges' legend
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", line=dict(color=colour, width=2),
                                 name=f"edge: {sign} its target", hoverinfo="skip"))
    ticks = [_tick(token, i == placed.mask_position) for i, token in enumerate(placed.tokens)]
    layers = ["embeddings", *(f"layer {l}" for l in range(1, placed.layers + 1)), "logits"]
    fig.update_layout(
        title=dict(text=html.escape(placed.title, quote=False), font=dict(size=14)),
        height=max(420, 150 + 75 * (placed.layers + 2)), margin=dict(l=10, r=10, t=50, b=10),
        hovermode="closest", clickmode="event", dragmode="pan", plot_bgcolor="white",
        legend=dict(orientation="h", yanchor="top", y=-0.12, xanchor="left", x=0),
        xaxis=dict(tickmode="array", tickvals=list(range(len(ticks))), ticktext=ticks, showgrid=True,
                   gridcolor="#f1f5f9", zeroline=False, range=[-0.6, len(ticks) - 0.4]),
        yaxis=dict(tickmode="array", tickvals=list(range(placed.layers + 2)), ticktext=layers, showgrid=True,
                   gridcolor="#e5e7eb", zeroline=False, range=[-0.6, placed.layers + 1.7]),
        shapes=[dict(type="rect", xref="x", yref="paper", x0=placed.mask_position - 0.5,
                     x1=placed.mask_position + 0.5, y0=0, y1=1, fillcolor="#f59e0b", opacity=0.08,
                     line=dict(width=0), layer="below")])
    return fig


def _tick(token: str, mask: bool) -> str:
    shown = html.escape(shown_token(token), quote=False)
    return f"<b style='color:#b45309'>{shown}</b>" if mask else shown


# ---------------------------------------------------------------- files

def draw(fig, graph: Graph, max_edges: int = MAX_EDGES) -> None:
    """`graph` drawn on a matplotlib figure (PNG and SVG): the page's drawing, without hover."""
    from matplotlib.collections import LineCollection
    from matplotlib.lines import Line2D

    placed = layout(graph, max_edges)
    ax = fig.add_subplot(1, 1, 1)
    ax.axvspan(placed.mask_position - 0.5, placed.mask_position + 0.5, color="#f59e0b", alpha=0.08, lw=0)
    largest = max((abs(w) for _, _, w in placed.edges), default=0.0)
    if placed.edges:
        lines = [[(s.x, s.y), (t.x, t.y)] for s, t, _ in placed.edges][::-1]  # the strongest on top
        weights = [w for _, _, w in placed.edges][::-1]
        ax.add_collection(LineCollection(lines, colors=[POSITIVE if w >= 0 else NEGATIVE for w in weights],
                                         linewidths=[WIDTHS[_band(w, largest)] for w in weights], alpha=0.45,
                                         zorder=1))
    for kind in ("token", "error", "feature", "logit"):
        members = [p for p in placed.nodes if p.node["kind"] == kind]
        if members:
            _, marker, colour, name = STYLE[kind]
            ax.scatter([p.x for p in members], [p.y for p in members], s=[(p.size * 0.75) ** 2 for p in members],
                       marker=marker, c=colour, edgecolors="white", linewidths=0.6, zorder=2, label=name)
            if kind == "logit":
                for p in members:
                    ax.annotate(shown_token(p.node["token"]), (p.x, p.y), xytext=(0, 10), textcoords="offset points",
                                ha="center", fontsize=8)
    ax.set_xticks(range(len(placed.tokens)), [shown_token(t) for t in placed.tokens], rotation=45, ha="right")
    ax.get_xticklabels()[placed.mask_position].set_color("#b45309")
    ax.get_xticklabels()[placed.mask_position].set_fontweight("bold")
    ax.set_yticks(range(placed.layers + 2), ["embeddings", *(f"layer {l}" for l in range(1, placed.layers + 1)),
                                              "logits"])
    ax.set_xlim(-0.6, len(placed.tokens) - 0.4)
    ax.set_ylim(-0.6, placed.layers + 1.7)
    ax.grid(True, color="#e5e7eb", lw=0.5)
    ax.set_axisbelow(True)
    handles = [Line2D([], [], ls="", marker=STYLE[k][1], color=STYLE[k][2], markersize=7, label=STYLE[k][3])
               for k in ("token", "error", "feature", "logit")]
    handles += [Line2D([], [], color=POSITIVE, lw=2, label="edge: raises"),
                Line2D([], [], color=NEGATIVE, lw=2, label="edge: lowers")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=7, frameon=False)


COLUMNS = ["part", "id", "kind", "layer", "position", "token", "label", "activation", "influence", "source", "target",
           "weight"]


def graph_files(graph: Graph, folder: Path, *, supernodes: dict | None = None, model: str = "",
                name: str = "circuit", max_edges: int = MAX_EDGES) -> list[Path]:
    """The graph as files in `folder`: `name`.json (the viewer's JSON, `files.graph_json`, with the
    named groups), .csv (a row per kept node, then one per kept edge: its source, target and weight),
    and the drawing as .png and .svg (matplotlib, as the attention views' images)."""
    from ..views import view_files

    rows = [["node", n["id"], n["kind"], n["layer"], n["position"], n["token"], n["label"], n["activation"],
             n.get("influence"), "", "", ""] for n in graph.nodes]
    rows += [["edge", *[""] * 8, e.source, e.target, e.weight] for e in graph.edges]
    data = graph_json(graph, supernodes=supernodes, model=model)
    return view_files._write(Path(folder), name, COLUMNS, rows, data, layout(graph).title,
                             (max(8.0, 1.0 + 0.7 * len(graph.tokens)), 2.0 + 0.9 * (_layers(graph) + 2)),
                             lambda fig: draw(fig, graph, max_edges))


def _layers(graph: Graph) -> int:
    return max((n["layer"] for n in graph.nodes), default=1) - 1
