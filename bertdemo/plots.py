"""Plotly figure builders. Pure functions: data in, `go.Figure` out, no model calls."""
from __future__ import annotations

import html

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots


def prediction_bars(predictions: list[list[dict]]) -> go.Figure:
    """One horizontal bar chart per mask (rows of subplots), best prediction on top.

    `predictions` is `fill_mask`'s output: per mask a list of {"token", "score"}.
    """
    n = max(len(predictions), 1)
    titles = [f"[MASK] {i + 1}" for i in range(len(predictions))]
    fig = make_subplots(rows=n, cols=1, subplot_titles=titles, vertical_spacing=0.25 / n)
    for i, preds in enumerate(predictions, start=1):
        tokens = [p["token"] for p in preds][::-1]
        scores = [p["score"] for p in preds][::-1]
        fig.add_trace(go.Bar(x=scores, y=_unique_labels(tokens), orientation="h",
                             text=[f"{s:.1%}" for s in scores], textposition="auto",
                             hovertemplate="%{y}: %{x:.4f}<extra></extra>", showlegend=False),
                      row=i, col=1)
        fig.update_xaxes(range=[0, 1], tickformat=".0%", row=i, col=1)
    height = 120 + 40 * sum(max(len(p), 1) for p in predictions)
    fig.update_layout(height=min(height, 2400), margin=dict(l=10, r=10, t=40, b=10))
    return fig


def token_scores(tokens: list[str], log_probs: list[float], title: str) -> go.Figure:
    """Bar per token of its log-probability (PLL contributions): the surprising tokens stand out."""
    fig = go.Figure(go.Bar(x=_unique_labels(tokens), y=log_probs,
                           hovertemplate="%{x}: %{y:.3f}<extra></extra>"))
    fig.update_layout(title=title, yaxis_title="log p(token | rest)", height=320,
                      margin=dict(l=10, r=10, t=50, b=10))
    return fig


def _unique_labels(labels: list[str]) -> list[str]:
    """Plotly merges equal category labels; suffix zero-width spaces so repeats stay separate bars."""
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label + "\u200b" * (seen[label] - 1))
    return out


# ---------------------------------------------------------------- masking (issue 4)

OUTCOME_COLORS = {"mask": "#f59e0b", "random": "#ef4444", "keep": "#22c55e"}  # orange, red, green
_NOT_CHOSEN = "#eef0f3"


def outcome_grid(tokens: list[str], grids: dict[str, dict]) -> go.Figure:
    """Epochs x tokens heatmaps side by side (one per mode, e.g. static and dynamic).

    `grids[mode]` holds "outcome" (E x T of "mask"/"random"/"keep"/None) and "seen" (E x T
    tokens the model sees, written in the cells).
    """
    codes = {None: 0, "mask": 1, "random": 2, "keep": 3}
    colors = [_NOT_CHOSEN, *OUTCOME_COLORS.values()]
    # Four flat bands over z = 0..3: a discrete colour per outcome.
    scale = [[0, colors[0]], [1 / 6, colors[0]], [1 / 6, colors[1]], [1 / 2, colors[1]],
             [1 / 2, colors[2]], [5 / 6, colors[2]], [5 / 6, colors[3]], [1, colors[3]]]
    modes = list(grids)
    fig = make_subplots(rows=1, cols=len(modes), subplot_titles=modes, shared_yaxes=True,
                        horizontal_spacing=0.03)
    x = _unique_labels(tokens)
    for col, mode in enumerate(modes, start=1):
        outcome = grids[mode]["outcome"]
        y = [f"epoch {e + 1}" for e in range(len(outcome))]
        fig.add_trace(go.Heatmap(
            z=[[codes[o] for o in row] for row in outcome], x=x, y=y, zmin=0, zmax=3,
            colorscale=scale, showscale=False, text=grids[mode]["seen"], texttemplate="%{text}",
            xgap=1, ygap=1, customdata=[[o or "not chosen" for o in row] for row in outcome],
            hovertemplate="%{y}, %{x}: %{customdata}, model sees %{text}<extra></extra>"),
            row=1, col=col)
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(height=min(160 + 24 * len(grids[modes[0]]["outcome"]), 1400),
                      margin=dict(l=10, r=10, t=40, b=10))
    return fig


def ever_chosen_curve(curve: dict) -> go.Figure:
    """Share of tokens chosen at least once after n epochs: measured (solid) vs theory (dashed)."""
    fig = go.Figure()
    for mode, color in (("static", "#6366f1"), ("dynamic", "#f59e0b")):
        fig.add_trace(go.Scatter(x=curve["epochs"], y=curve[mode], mode="lines+markers",
                                 name=f"{mode}, measured", line=dict(color=color)))
        fig.add_trace(go.Scatter(x=curve["epochs"], y=curve[f"{mode}_theory"], mode="lines",
                                 name=f"{mode}, theory", line=dict(color=color, dash="dash")))
    fig.update_layout(title=f"Tokens ever chosen (over {curve['tokens']:,} token draws per epoch)",
                      xaxis_title="epochs", yaxis_title="share ever chosen", yaxis_tickformat=".0%",
                      yaxis_range=[0, 1.02], height=360, margin=dict(l=10, r=10, t=50, b=10))
    return fig


def masking_law_bars(rows: list[dict]) -> go.Figure:
    """Measured rates with 95% intervals (bars) against the configured rates (diamonds).

    `rows` is `masking.masking_law`'s output: {"rate", "configured", "measured", "low", "high", "n"}.
    """
    names = [f"{r['rate']}<br>(n={r['n']:,})" for r in rows]
    fig = go.Figure(go.Bar(
        x=names, y=[r["measured"] for r in rows], name="measured (95% interval)",
        error_y=dict(type="data", symmetric=False, array=[r["high"] - r["measured"] for r in rows],
                     arrayminus=[r["measured"] - r["low"] for r in rows]),
        marker_color="#93c5fd", hovertemplate="%{x}: %{y:.4f}<extra></extra>"))
    fig.add_trace(go.Scatter(x=names, y=[r["configured"] for r in rows], mode="markers",
                             name="configured", marker=dict(symbol="diamond", size=12, color="#111827")))
    fig.update_layout(yaxis_title="rate", yaxis_tickformat=".0%", yaxis_range=[0, 1.05], height=360,
                      margin=dict(l=10, r=10, t=30, b=10))
    return fig


def grouped_bars(groups: list[str], series: dict[str, list[float]], title: str,
                 yaxis_title: str) -> go.Figure:
    """One group of bars per entry of `groups`, one bar per series (e.g. GLUE: tasks x systems).

    `series` maps a name to one value per group, in the order of `groups`.
    """
    fig = go.Figure([go.Bar(name=name, x=groups, y=values,
                            hovertemplate=f"{name}<br>%{{x}}: %{{y}}<extra></extra>")
                     for name, values in series.items()])
    fig.update_layout(barmode="group", title=title, yaxis_title=yaxis_title, height=420,
                      yaxis_range=[0, 100], legend=dict(orientation="h", y=-0.15),
                      margin=dict(l=10, r=10, t=50, b=10))
    return fig


# ---------------------------------------------------------------- attention

def attention_heatmap(labels: list[str], matrix, title: str, boundary: int | None = None,
                      threshold: float = 0.0) -> go.Figure:
    """Heatmap of an (N, N) attention matrix: row = query token, column = the token it attends to.

    Cells below `threshold` are left blank (display only). `boundary` draws the sentence A/B
    line. Small inputs get each value written in its cell.
    """
    shown = [[w if w >= threshold else None for w in row] for row in matrix.tolist()]
    names = _unique_labels([_plotly_text(x) for x in labels])
    n = len(names)
    fig = go.Figure(go.Heatmap(
        z=shown, x=names, y=names, colorscale="Blues", zmin=0, zmax=max(float(matrix.max()), 1e-6),
        hovertemplate="%{y} → %{x}: %{z:.4f}<extra></extra>", colorbar=dict(title="weight"),
        texttemplate="%{z:.2f}" if n <= 20 else None, xgap=1, ygap=1))
    if boundary is not None:  # sentence B starts here: a line down and a line across
        line = dict(type="line", line=dict(color="crimson", width=2, dash="dash"))
        at, end = boundary - 0.5, n - 0.5
        fig.add_shape(**line, x0=at, x1=at, y0=-0.5, y1=end)
        fig.add_shape(**line, x0=-0.5, x1=end, y0=at, y1=at)
    size = min(max(420, 110 + 22 * n), 1600)
    fig.update_layout(title=title, height=size, margin=dict(l=10, r=10, t=50, b=10),
                      xaxis=dict(title="attends to (key)", side="top", tickangle=-60, type="category"),
                      yaxis=dict(title="token (query)", autorange="reversed", type="category"))
    return fig


def mask_attention_grid(rows, labels: list[str], hidden: list[bool] | None = None,
                        title: str = "What the [MASK] looked at") -> go.Figure:
    """Layers x heads grid for one [MASK]: each cell names the token the mask attends to most in
    that head, coloured by the weight; hover lists the top 3. `rows` is (layers, heads, T);
    tokens with `hidden[j]` true are skipped (e.g. [CLS]/[SEP])."""
    weights = np.array(rows, dtype=np.float64)
    if hidden is not None and not all(hidden):
        weights[:, :, np.array(hidden, dtype=bool)] = -1.0  # never the top choice
    order = np.argsort(-weights, axis=-1)[:, :, :3]  # (L, H, 3)
    names = [_plotly_text(x) for x in labels]
    top = np.take_along_axis(weights, order[:, :, :1], -1)[:, :, 0]
    n_layers, n_heads = weights.shape[:2]
    text = [[names[order[i, h, 0]] for h in range(n_heads)] for i in range(n_layers)]
    hover = [["<br>".join(f"{names[j]}: {weights[i, h, j]:.3f}" for j in order[i, h])
              for h in range(n_heads)] for i in range(n_layers)]
    fig = go.Figure(go.Heatmap(
        z=top.tolist(), text=text, customdata=hover, texttemplate="%{text}", colorscale="Oranges",
        zmin=0, zmax=1, x=list(range(n_heads)), y=list(range(n_layers)),
        hovertemplate="layer %{y}, head %{x}<br>%{customdata}<extra></extra>",
        colorbar=dict(title="weight"), xgap=1, ygap=1))
    fig.update_layout(title=title, height=min(max(300, 90 + 34 * n_layers), 1200),
                      margin=dict(l=10, r=10, t=50, b=10),
                      xaxis=dict(title="head", dtick=1, side="top"),
                      yaxis=dict(title="layer", dtick=1, autorange="reversed"))
    return fig


def _plotly_text(label: str) -> str:
    """Plotly reads `<b>`, `<br>`, `<a href>` in labels as markup; escape user text so it stays text."""
    return html.escape(str(label), quote=False)


def finetune_curves(steps: list[dict], evals: list[dict], planned_steps: int | None = None) -> go.Figure:
    """Training loss per step and eval loss (same axis), eval accuracy on a second axis.

    `steps`/`evals` are `finetune`'s History lists (or the events so far, for a live plot).
    """
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Scatter(x=[s["step"] for s in steps], y=[s["loss"] for s in steps],
                             mode="lines", name="training loss", line=dict(width=1)))
    fig.add_trace(go.Scatter(x=[e["step"] for e in evals], y=[e["loss"] for e in evals],
                             mode="lines+markers", name="eval loss (fixed masks)"))
    fig.add_trace(go.Scatter(x=[e["step"] for e in evals], y=[e["accuracy"] for e in evals],
                             mode="lines+markers", name="eval accuracy", line=dict(dash="dot")),
                  secondary_y=True)
    fig.update_xaxes(title_text="step", range=[0, planned_steps] if planned_steps else None)
    fig.update_yaxes(title_text="masked-token loss", secondary_y=False)
    fig.update_yaxes(title_text="accuracy", range=[0, 1], tickformat=".0%", secondary_y=True)
    fig.update_layout(height=380, margin=dict(l=10, r=10, t=40, b=10),  # legend clear of the label
                      legend=dict(orientation="h", x=1, xanchor="right", y=1.02, yanchor="bottom"))
    return fig


def masking_comparison(runs: dict[str, dict]) -> go.Figure:
    """Static vs dynamic (or any runs) overlaid: eval loss and eval accuracy against step.

    `runs` maps a label to {"steps": [...], "evals": [...]} as in `finetune`'s History.
    """
    fig = make_subplots(rows=1, cols=2, subplot_titles=["eval loss (fixed masks)", "eval accuracy"])
    colors = ["#636efa", "#ef553b", "#00cc96", "#ab63fa"]
    for i, (label, run) in enumerate(runs.items()):
        color = colors[i % len(colors)]
        evals = run["evals"]
        x = [e["step"] for e in evals]
        fig.add_trace(go.Scatter(x=x, y=[e["loss"] for e in evals], mode="lines+markers",
                                 name=label, line=dict(color=color), legendgroup=label), row=1, col=1)
        fig.add_trace(go.Scatter(x=x, y=[e["accuracy"] for e in evals], mode="lines+markers",
                                 name=label, line=dict(color=color), legendgroup=label,
                                 showlegend=False), row=1, col=2)
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(range=[0, 1], tickformat=".0%", row=1, col=2)
    fig.update_layout(height=360, margin=dict(l=10, r=10, t=40, b=10))
    return fig


def labelling_curves(runs: dict[str, dict]) -> go.Figure:
    """Each run's training loss per step (solid) and its eval loss on fixed, properly masked
    tokens (dashed, same colour), overlaid.

    `runs` maps a label to {"steps": [...], "evals": [...]} as in `finetune`'s History. Each
    training loss is its own labelling's, so only the eval losses compare like with like.
    """
    fig = go.Figure()
    colors = ["#ef553b", "#636efa", "#00cc96", "#ab63fa"]
    for i, (label, run) in enumerate(runs.items()):
        color = colors[i % len(colors)]
        fig.add_trace(go.Scatter(x=[s["step"] for s in run["steps"]], y=[s["loss"] for s in run["steps"]],
                                 mode="lines", name=f"{label}: training loss", line=dict(color=color)))
        fig.add_trace(go.Scatter(x=[e["step"] for e in run["evals"]], y=[e["loss"] for e in run["evals"]],
                                 mode="lines+markers", name=f"{label}: eval loss (masked tokens)",
                                 line=dict(color=color, dash="dash")))
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(title_text="loss", rangemode="tozero")
    fig.update_layout(height=420, margin=dict(l=10, r=10, t=40, b=10),  # legend below: 4 long names
                      legend=dict(orientation="h", x=0, y=-0.2, yanchor="top"))
    return fig


# ---------------------------------------------------------------- inside a prediction (issue 13)

def layer_heatmap(entry: dict, title: str) -> go.Figure:
    """Layers x top-k for one mask (`explain.layer_predictions`' entry): each cell names the
    token at that rank after that layer, coloured by its probability; the final answer is bold."""
    layers, final = entry["layers"], entry["final"]["token_id"]
    text = [[_bold_if(_plotly_text(p["token"]), p["token_id"] == final) for p in row] for row in layers]
    fig = go.Figure(go.Heatmap(
        z=[[p["score"] for p in row] for row in layers], text=text, texttemplate="%{text}",
        x=[f"#{r + 1}" for r in range(len(layers[0]))], y=entry["layer_names"], colorscale="Purples",
        zmin=0, zmax=1, xgap=1, ygap=1, colorbar=dict(title="p"),
        hovertemplate="%{y}, rank %{x}: %{text} (p = %{z:.4f})<extra></extra>"))
    fig.update_layout(title=title, height=min(max(260, 90 + 30 * len(layers)), 1200),
                      margin=dict(l=10, r=10, t=50, b=10),
                      xaxis=dict(title="rank at that layer", side="top"),
                      yaxis=dict(title="read after", autorange="reversed", type="category"))
    return fig


def _bold_if(label: str, bold: bool) -> str:
    return f"<b>{label}</b>" if bold else label


def final_rank_lines(entries: list[dict]) -> go.Figure:
    """Rank of each mask's final answer after every layer (log scale, rank 1 at the top)."""
    fig = go.Figure()
    for entry in entries:
        name = f"[MASK] {entry['mask']}: {_plotly_text(entry['final']['token'])}"
        fig.add_trace(go.Scatter(x=entry["layer_names"], y=entry["final_rank"], mode="lines+markers",
                                 name=name, customdata=entry["final_prob"],
                                 hovertemplate=f"{name}<br>%{{x}}: rank %{{y}}, p = %{{customdata:.4f}}"
                                               "<extra></extra>"))
    fig.update_layout(title="Rank of the final answer after each layer", height=340,
                      xaxis=dict(title="read after", type="category"),
                      yaxis=dict(title="rank (1 = top)", type="log", autorange="reversed"),
                      margin=dict(l=10, r=10, t=50, b=10))
    return fig


def comparison_bars(result: dict) -> go.Figure:
    """Both models' probabilities of each token of either top-k, side by side, one row of bars
    per mask (`explain.compare_predictions`' result); hover gives the change."""
    masks, names = result["masks"], [_plotly_text(n) for n in result["models"]]
    fig = make_subplots(rows=max(len(masks), 1), cols=1, vertical_spacing=0.3 / max(len(masks), 1),
                        subplot_titles=[f"[MASK] {m['mask']}" for m in masks])
    for row, mask in enumerate(masks, start=1):
        labels = _unique_labels([_plotly_text(r["token"]) for r in mask["changes"]])
        for key, name, colour in (("a", names[0], "#6366f1"), ("b", names[1], "#f59e0b")):
            fig.add_trace(go.Bar(
                x=labels, y=[r[key] for r in mask["changes"]], name=name, marker_color=colour,
                legendgroup=key, showlegend=row == 1,
                customdata=[r["change"] if r["change"] is not None else float("nan") for r in mask["changes"]],
                hovertemplate=f"{name}<br>%{{x}}: p = %{{y:.4f}}, change %{{customdata:+.4f}}<extra></extra>"),
                row=row, col=1)
    fig.update_yaxes(title_text="probability", tickformat=".0%")
    fig.update_layout(barmode="group", height=min(120 + 260 * len(masks), 2400),
                      legend=dict(orientation="h", y=1.02, yanchor="bottom", x=1, xanchor="right"),
                      margin=dict(l=10, r=10, t=60, b=10))
    return fig
