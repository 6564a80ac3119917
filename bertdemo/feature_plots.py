"""The Features tab's plotly figures: a sentence's features, a feature's card (its histogram, what
it promotes), steering, a training run's curves and a layer's map. Data in, `go.Figure` out, as
`plots` (whose label helpers they share); pure functions, no model calls.
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .plots import plotly_text, share_range, unique_labels

def feature_heatmap(result: dict, title: str) -> go.Figure:
    """Tokens x features of `features.views.sentence_features`' heatmap: each counted token's
    activation of each feature shown (blank where it does not fire); hover names the feature."""
    grid = result["heatmap"]
    tokens = unique_labels([plotly_text(t["token"]) for t in result["per_token"]])
    columns = [f"#{f}" for f in grid["features"]]
    labels = [plotly_text(label) for label in grid["labels"]]
    z = [[a if a > 0 else None for a in row] for row in grid["activations"]]
    fig = go.Figure(go.Heatmap(
        z=z, x=columns, y=tokens, colorscale="Oranges", zmin=0, xgap=1, ygap=1,
        customdata=[labels] * len(tokens), colorbar=dict(title="activation"),
        hovertemplate="%{y}, feature %{x}: %{z:.3f}<br>%{customdata}<extra></extra>"))
    fig.update_layout(title=title, height=min(max(300, 150 + 26 * len(tokens)), 1400),
                      margin=dict(l=10, r=10, t=110, b=10),
                      xaxis=dict(side="top", type="category", tickangle=-60),
                      yaxis=dict(title="token", autorange="reversed", type="category"))
    return fig


def feature_histogram(card: dict) -> go.Figure:
    """A feature's activations where it fires (`feature_card`'s histogram): the share of its
    firings in each bin from 0 to its largest activation."""
    edges, shares = card["histogram"]["edges"], card["histogram"]["shares"]
    centres = [(a + b) / 2 for a, b in zip(edges[:-1], edges[1:])]
    width = (edges[1] - edges[0]) if len(edges) > 1 else 1.0
    fig = go.Figure(go.Bar(x=centres, y=shares, width=[width] * len(centres), marker_color="#f59e0b",
                           hovertemplate="activation %{x:.3f}: %{y:.1%} of its firings<extra></extra>"))
    fig.update_layout(title=f"Feature {card['feature']}: fires on {card['density']:.2%} of tokens, "
                            f"mean {card['mean']:.3f} where it fires",
                      height=300, margin=dict(l=10, r=10, t=50, b=10), bargap=0.05,
                      xaxis=dict(title="activation", rangemode="tozero"),
                      yaxis=dict(title="share of its firings", tickformat=".0%", rangemode="tozero"))
    return fig


def feature_effects(card: dict) -> go.Figure:
    """What a feature does to the MLM head's output at a [MASK]: the tokens whose logits it
    raises most (left) and lowers most (right), as `feature_card` measured them."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=["promoted", "suppressed"], horizontal_spacing=0.18)
    for col, key, colour in ((1, "promoted", "#16a34a"), (2, "suppressed", "#dc2626")):
        rows = card[key]
        fig.add_trace(go.Bar(x=[r["logit_change"] for r in rows][::-1],
                             y=unique_labels([plotly_text(r["token"]) for r in rows])[::-1], orientation="h",
                             marker_color=colour, showlegend=False,
                             hovertemplate="%{y}: logit %{x:+.3f}<extra></extra>"), row=1, col=col)
    fig.update_xaxes(title_text="logit change at a [MASK]")
    fig.update_yaxes(type="category")
    fig.update_layout(height=max(300, 80 + 24 * max(len(card["promoted"]), len(card["suppressed"]), 1)),
                      margin=dict(l=10, r=10, t=40, b=10))
    return fig


def steer_bars(result: dict) -> go.Figure:
    """Fill-mask before and after a feature is steered (`features.views.steer`): per mask, each
    token of either top-k with its probability before and after."""
    masks = result["masks"]
    fig = make_subplots(rows=max(len(masks), 1), cols=1, vertical_spacing=0.3 / max(len(masks), 1),
                        subplot_titles=[f"[MASK] {m['mask']}" for m in masks])
    for row, mask in enumerate(masks, start=1):
        labels = unique_labels([plotly_text(t["token"]) for t in mask["tokens"]])
        for key, name, colour in (("before", "before", "#94a3b8"), ("after", "after steering", "#f59e0b")):
            fig.add_trace(go.Bar(x=labels, y=[t[key] for t in mask["tokens"]], name=name, marker_color=colour,
                                 legendgroup=key, showlegend=row == 1,
                                 hovertemplate=f"{name}<br>%{{x}}: p = %{{y:.4f}}<extra></extra>"), row=row, col=1)
    fig.update_yaxes(title_text="probability", tickformat=".0%", rangemode="tozero")
    fig.update_layout(barmode="group", height=min(120 + 260 * len(masks), 2400),
                      title=f"Feature {result['feature']} at layer {result['layer']}: scale {result['scale']:g}, "
                            f"added {result['add']:g}",
                      legend=dict(orientation="h", y=1.02, yanchor="bottom", x=1, xanchor="right"),
                      margin=dict(l=10, r=10, t=80, b=10))
    return fig


def feature_curves(steps: list) -> go.Figure:
    """A dictionary's training, live: FVU (the share of the layer it does not explain) and the
    share of dead latents, against tokens seen. `steps`: `features.training.FeatureStep`s of
    one layer's run (their first layer's figures are drawn)."""
    tokens = [s.tokens for s in steps]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Scatter(x=tokens, y=[s.fvu[0] for s in steps], mode="lines", name="FVU (lower is better)",
                             hovertemplate="%{x:,} tokens: FVU %{y:.3f}<extra></extra>"), secondary_y=False)
    fig.add_trace(go.Scatter(x=tokens, y=[s.dead[0] for s in steps], mode="lines", name="dead latents",
                             line=dict(dash="dot"),
                             hovertemplate="%{x:,} tokens: %{y:.1%} dead<extra></extra>"), secondary_y=True)
    fig.update_xaxes(title_text="tokens seen", rangemode="tozero")
    fig.update_yaxes(title_text="fraction of variance unexplained", rangemode="tozero", secondary_y=False)
    fig.update_yaxes(title_text="dead latents", tickformat=".0%", secondary_y=True,
                     range=share_range([s.dead[0] for s in steps]))
    fig.update_layout(height=360, margin=dict(l=10, r=10, t=40, b=10),
                      legend=dict(orientation="h", x=1, xanchor="right", y=1.02, yanchor="bottom"))
    return fig

def feature_map(result: dict) -> go.Figure:
    """A layer's features as points (`features.feature_map.feature_map`): placed by their decoder
    directions, coloured by `result["colour"]`; hover: the feature, its label and firings. Each
    point's customdata is its feature number (a click opens its card).

    Every per-point array is a numpy array: plotly checks one as a whole where it checks a list item
    by item (3,072 hover texts as a list took ~80 ms a map), and sends numbers as typed arrays (base64
    float32: finer than a pixel, and shorter than decimals rounded to 3 places)."""
    method = {"umap": "UMAP", "pca": "PCA"}.get(result["method"], result["method"])
    points = go.Scatter(  # SVG: each point clickable (WebGL was no faster in chromium without a GPU)
        x=np.asarray(result["x"], dtype=np.float32), y=np.asarray(result["y"], dtype=np.float32), mode="markers",
        customdata=np.asarray(result["features"], dtype=np.int32),
        text=np.array([f"{plotly_text(name)}<br>{count:,} firings"
                       for name, count in zip(result["labels"], result["firings"])], dtype=object),
        marker=dict(size=6, color=np.asarray(result["colour"]["values"], dtype=np.float32), colorscale="Viridis",
                    opacity=0.8, colorbar=dict(title=result["colour"]["name"])),
        hovertemplate="feature %{customdata}: %{text}<extra></extra>")
    fig = go.Figure(points)
    fig.update_layout(title=f"Layer {result['layer']}: its {len(result['features']):,} features by the direction "
                            f"each writes ({method} of the decoder rows); click one for its card",
                      height=560, margin=dict(l=10, r=10, t=50, b=10), hovermode="closest", dragmode="pan",
                      xaxis=dict(showticklabels=False, zeroline=False, title=f"{method} 1"),
                      yaxis=dict(showticklabels=False, zeroline=False, title=f"{method} 2"))
    return fig
