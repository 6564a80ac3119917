"""The Circuits tab's answers worded: a graph's scores in words, its nodes' table and raw form, a
node's card as HTML, the heads behind an edge, an intervention's words, bars and table, and the
transcoders' training curves. Plain values in, Markdown, HTML, a `pd.DataFrame` or a figure out: no
model call."""
from __future__ import annotations

import html
import re

import pandas as pd
import plotly.graph_objects as go

from ...circuits.graph import Graph
from ...plots import shown_token
from . import circuits_sections as sections
from ..parts.common import FIRST_HEAD, escape_markdown

TOP_NODES = 40  # rows of the nodes table
LISTED_EDGES = 5_000  # edges in the graph's raw JSON at most (the drawing shows the strongest 300)


def training_curves(steps: list) -> go.Figure:
    """The transcoders' training, live: each layer's FVU against tokens seen."""
    fig = go.Figure()
    layers = len(steps[0].fvu) if steps else 0
    for i in range(layers):
        fig.add_trace(go.Scatter(x=[s.tokens for s in steps], y=[s.fvu[i] for s in steps], mode="lines",
                                 name=f"layer {i + 1}", hovertemplate="%{x:,} tokens: FVU %{y:.3f}<extra></extra>"))
    fig.update_layout(height=320, margin=dict(l=10, r=10, t=30, b=10), legend=dict(orientation="h", y=-0.25),
                      xaxis=dict(title="tokens seen", rangemode="tozero"),
                      yaxis=dict(title="FVU (lower is better)", rangemode="tozero"))
    return fig


def scores_words(graph: Graph) -> str:
    """The graph's scores, each with what it measures, and what they were measured on."""
    s, adjacency = graph.scores, graph.adjacency
    active = sum(1 for n in adjacency.columns if n.kind == "feature")
    traced = int((adjacency.row_nodes >= 0).sum())
    return (f"**Replacement score {s['replacement']:.0%}**: of the influence that reaches the prediction from the "
            "sentence, the share that starts at its words rather than at error nodes: how much of the whole path the "
            "transcoders' features explain.  \n"
            f"**Completeness {s['completeness']:.0%}**: per node, the share of its direct inputs that are features or "
            "words rather than errors, weighted by influence: how well each single step is explained.  \n"
            f"**Left {s['left']:.0%} · right {s['right']:.0%}** of the [MASK], the mask itself {s['mask']:.0%}, "
            f"[CLS]/[SEP] {s['framing']:.0%}: where the influence sits in the sentence (a decoder could only use "
            "the left).  \n"
            f"{_through_edges(graph)}  \n"
            f"Measured on this one sentence: {len(graph.tokens)} tokens, {active:,} active features of which "
            f"{traced:,} were traced to their inputs; {len(graph.nodes):,} nodes and {len(graph.edges):,} edges kept "
            f"at thresholds {graph.node_threshold:g} / {graph.edge_threshold:g}; "
            f"built in {_seconds(graph.timings.get('seconds', 0.0))}.")


def _through_edges(graph: Graph) -> str:
    """How much of the first predicted word's logit the drawn kind of path carries: its incoming
    edges' sum against its value; the rest is the bias."""
    adjacency = graph.adjacency
    word = adjacency.logits[0]
    value, edges = float(adjacency.value[0]), float(adjacency.rows[0].sum())
    rest = "what each LayerNorm keeps of its input whatever the nodes do (a LayerNorm fixes the size of its " \
           "output: nodes turn it, they cannot grow it) and every bias" \
        if adjacency.extra["norms"] == "slope" else "every bias"
    return (f"**The logit of “{escape_markdown(shown_token(word.token))}” is {value:.2f}** (less the vocabulary's "
            f"mean, as its node holds it): {edges:.2f} of it arrives through the nodes' edges; the other "
            f"{value - edges:.2f} is constant for this sentence, {rest}.")


def node_frame(graph: Graph, top: int = TOP_NODES) -> pd.DataFrame:
    """The most influential kept nodes, then the predicted words."""
    ordered = sorted(graph.nodes, key=lambda n: (n["kind"] == "logit", -(n.get("influence") or 0.0)))[:top]
    rows = [[n["id"], n["kind"], n["layer"], f"{shown_token(n['token'])} ({n['position']})", n["label"],
             round(n.get("influence") or 0.0, 4)] for n in ordered]
    return pd.DataFrame(rows, columns=list(sections.NODE_COLUMNS))


def raw_graph(graph: Graph) -> dict:
    edges = [{"source": e.source, "target": e.target, "weight": e.weight} for e in graph.edges[:LISTED_EDGES]]
    return {"text": graph.text, "tokens": graph.tokens, "mask_position": graph.mask_position, "target": graph.target,
            "scores": graph.scores, "node_threshold": graph.node_threshold, "edge_threshold": graph.edge_threshold,
            "nodes": graph.nodes, "edges": edges, "edges_kept": len(graph.edges)}


KIND_WORDS = {"feature": "Transcoder feature", "error": "Error node", "token": "Token", "logit": "Predicted word"}


def card_html(node: dict, card: dict | None) -> str:
    """A node's card as HTML: every piece of text escaped."""
    e = lambda text: html.escape(str(text))  # noqa: E731
    token = f"“{e(shown_token(node['token']))}” (position {node['position']})"
    influence = node.get("influence")
    facts = [f"influence {influence:.2%}" if influence is not None else ""]
    if node["kind"] == "feature":
        head = f"Feature {node['feature']} of layer {node['layer']}'s transcoder, at {token}"
        facts.insert(0, f"activation {node['activation']:.3f}")
    elif node["kind"] == "error":
        head = f"What layer {node['layer']}'s transcoder misses at {token}"
        facts.insert(0, f"size (norm) {node['activation']:.3f}")
    elif node["kind"] == "token":
        head = f"The embedding of {token}"
    else:
        head = f"The logit of “{e(shown_token(node['token']))}” at the [MASK]"
        facts = [f"probability {node['activation']:.3f}"]
    parts = [f"<p><b>{head}</b> <code>{e(node['id'])}</code><br>{e(', '.join(f for f in facts if f))}</p>"]
    if node["kind"] == "feature":
        parts.append(f"<p>Label: <i>{e(node['label'])}</i></p>")
        if card is None:
            parts.append("<p>This transcoder has no statistics yet: no contexts or outputs to show.</p>")
        else:
            parts.append(f"<p>Fires on {card['density']:.2%} of the {card['statistics_tokens']:,} tokens its "
                         f"statistics counted; mean activation {card['mean']:.3f} where it fires.</p>")
            contexts = "".join(f"<li>{e(c['text'][:c['start']])}<mark>{e(c['text'][c['start']:c['end']] or c['token'])}"
                               f"</mark>{e(c['text'][c['end']:])} <small>({c['activation']:.2f})</small></li>"
                               for c in card["contexts"][:8])
            if contexts:
                parts.append(f"<p>Top contexts:</p><ul>{contexts}</ul>")
    return "".join(parts)


def heads_words(graph: Graph, split: dict) -> str:
    source, target = graph.node(split["source"]), graph.node(split["target"])
    shown = lambda n: f"{n['id']} at “{escape_markdown(shown_token(n['token']))}”"  # noqa: E731
    where = (f"All of it crosses at layer {split['layer']}'s attention, so its heads' parts add up to the edge."
             if split["adjacent"] and split["across"] else
             f"The split is of layer {split['layer']}'s attention only (the target's); {split['elsewhere']:+.4f} of it "
             "reached the target's position at an earlier layer.")
    return (f"Its strongest kept edge from another position: **{shown(source)} → {shown(target)}**, weight "
            f"{split['weight']:+.4f}. At frozen attention an edge across positions is a sum over heads. {where}")


def head_frame(split: dict) -> pd.DataFrame:
    rows = [[f"{split['layer']}:{h['head'] + FIRST_HEAD}", round(h["weight"], 5),
             "" if h["share"] is None else f"{h['share']:.0%}"] for h in split["heads"]]
    return pd.DataFrame(rows, columns=list(sections.HEAD_COLUMNS))


def intervention_words(result: dict, groups: dict, asked) -> str:
    scale = result["scale"]
    what = "switched off" if scale == 0 else "unchanged" if scale == 1 else f"scaled by {scale:g}"
    listed = lambda words: ", ".join(f"{escape_markdown(shown_token(w['word']))} {w['probability']:.1%}"  # noqa: E731
                                     for w in words)
    named = [g for g in groups if g in re.split(r"[\s,]+", str(asked or ""))]
    groups_note = f" (groups: {', '.join(escape_markdown(g) for g in named)})" if named else ""
    return (f"{len(result['nodes'])} node(s){groups_note} {what} in the real model (attention not frozen, the "
            f"transcoders' errors kept).  \n**Before**: {listed(result['before'])}  \n**After**: "
            f"{listed(result['after'])}  \nThe graph's prediction is linear: it assumes every other node follows "
            "its edges, attention held and each LayerNorm as the graph froze it (at its slope by default).")


def intervention_bars(result: dict) -> go.Figure:
    words = [shown_token(w["word"]) for w in result["words"]]
    fig = go.Figure([go.Bar(name=name, x=words, y=[w[key] for w in result["words"]],
                            hovertemplate=f"{name}<br>%{{x}}: %{{y:.3f}}<extra></extra>")
                     for name, key in (("before", "probability_before"), ("after", "probability_after"))])
    fig.update_layout(barmode="group", height=320, yaxis=dict(title="probability", rangemode="tozero"),
                      legend=dict(orientation="h", y=-0.2), margin=dict(l=10, r=10, t=30, b=10))
    return fig


def word_frame(result: dict) -> pd.DataFrame:
    rows = [[shown_token(w["word"]), round(w["probability_before"], 4), round(w["probability_after"], 4),
             round(w["change"], 4), round(w["predicted_change"], 4), round(w["first_order_change"], 4)]
            for w in result["words"]]
    return pd.DataFrame(rows, columns=list(sections.WORD_COLUMNS))


def _seconds(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds >= 1 else f"{seconds * 1000:.0f} ms"
