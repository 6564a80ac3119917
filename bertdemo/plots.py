"""Plotly figure builders. Pure functions: data in, `go.Figure` out, no model calls."""
from __future__ import annotations

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
