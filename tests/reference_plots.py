"""The hot-path figure builders as they were written with plotly's validated API (make_subplots,
go.Bar, update_layout), before bertdemo/plots.py built them from dicts: the reference that
tests/test_fast_figures.py compares the fast builders with. Not used by the app.

Each keeps its counterpart's signature, docstring and input handling (the lines before the figure
is built repeat bertdemo/plots.py on purpose): only how the figure is built differs, and that is
what the test compares. Importing plots' own helpers here would compare plots with itself."""
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
    top = max((p["score"] for preds in predictions for p in preds), default=0.0)
    shares = [0, min(1.0, max(top * 1.15, 0.05))]  # the axis fits the bars (as plots.share_range)
    for i, preds in enumerate(predictions, start=1):
        tokens = [p["token"] for p in preds][::-1]
        scores = [p["score"] for p in preds][::-1]
        fig.add_trace(go.Bar(x=scores, y=unique_labels(tokens), orientation="h",
                             text=[f"{s:.1%}" for s in scores], textposition="auto",
                             hovertemplate="%{y}: %{x:.4f}<extra></extra>", showlegend=False),
                      row=i, col=1)
        fig.update_xaxes(range=shares, tickformat=".0%", row=i, col=1)
    height = 120 + 40 * sum(max(len(p), 1) for p in predictions)
    fig.update_layout(height=min(height, 2400), margin=dict(l=10, r=10, t=40, b=10))
    return fig


def token_scores(tokens: list[str], log_probs: list[float], title: str) -> go.Figure:
    """Bar per token of its log-probability (PLL contributions): the surprising tokens stand out."""
    fig = go.Figure(go.Bar(x=unique_labels(tokens), y=log_probs,
                           hovertemplate="%{x}: %{y:.3f}<extra></extra>"))
    fig.update_layout(title=title, yaxis_title="log p(token | rest)", height=320,
                      margin=dict(l=10, r=10, t=50, b=10))
    return fig


def attention_heatmap(labels: list[str], matrix, title: str, boundary: int | None = None,
                      threshold: float = 0.0) -> go.Figure:
    """Heatmap of an (N, N) attention matrix: row = query token, column = the token it attends to.

    Cells below `threshold` are left blank (display only). `boundary` draws the sentence A/B
    line. Small inputs get each value written in its cell.
    """
    shown = [[w if w >= threshold else None for w in row] for row in matrix.tolist()]
    names = unique_labels([plotly_text(x) for x in labels])
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
    longest = max((len(x) for x in names), default=1)  # margins that fit the labels (as plots.label_margins)
    fig.update_layout(title=title, height=size, margin=dict(l=50 + 7 * longest, r=110, t=max(100, 50 + 6 * longest), b=10),
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
    names = [plotly_text(x) for x in labels]
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
                      margin=dict(l=60, r=110, t=100, b=10),
                      xaxis=dict(title="head", dtick=1, side="top"),
                      yaxis=dict(title="layer", dtick=1, autorange="reversed"))
    return fig


def finetune_curves(steps: list, evals: list, planned_steps: int | None = None,
                    best: tuple[int, str] | None = None) -> go.Figure:
    """Training loss per step and eval loss (same axis), eval accuracy on a second axis.

    `steps`/`evals` are a `training.RunHistory`'s `Step`s and `Evaluation`s; `best`: (step,
    label), a dashed line there.
    """
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Scatter(x=[s.step for s in steps], y=[s.loss for s in steps],
                             mode="lines", name="training loss", line=dict(width=1)))
    fig.add_trace(go.Scatter(x=[e.step for e in evals], y=[e.loss for e in evals],
                             mode="lines+markers", name="eval loss (fixed masks)"))
    fig.add_trace(go.Scatter(x=[e.step for e in evals], y=[e.accuracy for e in evals],
                             mode="lines+markers", name="eval accuracy", line=dict(dash="dot")),
                  secondary_y=True)
    fig.update_xaxes(title_text="step", range=[0, planned_steps] if planned_steps else None)
    fig.update_yaxes(title_text="masked-token loss", secondary_y=False)
    fig.update_yaxes(title_text="accuracy", range=[0, 1], tickformat=".0%", secondary_y=True)
    fig.update_layout(height=380, margin=dict(l=10, r=10, t=40, b=10),  # legend clear of the label
                      legend=dict(orientation="h", x=1, xanchor="right", y=1.02, yanchor="bottom"))
    if best is not None:
        fig.add_shape(type="line", x0=best[0], x1=best[0], y0=0, y1=1, xref="x", yref="paper",
                      line=dict(dash="dash", color="#16a34a", width=1.5))
        fig.add_annotation(x=best[0], y=1, xref="x", yref="paper", text=best[1], showarrow=False,
                           xanchor="left", yanchor="top", font=dict(color="#16a34a"))
    return fig


def unique_labels(labels: list[str]) -> list[str]:
    """Plotly merges equal category labels; suffix zero-width spaces so repeats stay separate bars."""
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label + "\u200b" * (seen[label] - 1))
    return out


def plotly_text(label: str) -> str:
    """Plotly reads `<b>`, `<br>`, `<a href>` in labels as markup; escape user text so it stays text."""
    return html.escape(str(label), quote=False)
