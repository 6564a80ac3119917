"""One concept, one module (over 500 lines): plotly figure builders. Data in, `go.Figure` out.

Pure functions, no model calls.

The builders on a request's path (predictions, PLL, attention, live fine-tune curves) write the
figure as plain dicts and skip plotly's per-property validation (`fast_figure`), which cost
most of a request's time for a crowd; tests/test_fast_figures.py checks each against the
same chart built through plotly's validated API (tests/reference_plots.py: it repeats each
builder's signature, docstring and input handling on purpose, and differs in how it builds).
"""
from __future__ import annotations

import html

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots


def prediction_bars(predictions: list[list[dict]]) -> go.Figure:
    """One horizontal bar chart per mask (rows of subplots), best prediction on top.

    `predictions` is `fill_mask`'s output: per mask a list of {"token", "score"}.
    """
    return fast_figure(*_prediction_bars_parts(predictions))


def prediction_bars_json(predictions: list[list[dict]]) -> str:
    """`prediction_bars(predictions).to_json()`, without building the figure: 0.2 ms instead of
    2 ms, for the one chart every visitor's Predict sends (a crowd's server runs it 16 times)."""
    return figure_json(*_prediction_bars_parts(predictions))


def share_range(values, floor: float = 0.05) -> list[float]:
    """An axis of shares (0-1) that fits its data: from 0 to a little past the largest value (room
    for the bar's label), never past 100% nor under `floor`; a 10% bar then fills most of the width
    instead of a sliver of a 0-100% axis. Every bar of one chart shares it, so bars compare."""
    top = max((v for v in values if v == v), default=0.0)  # NaN (v != v) ignored
    return [0, min(1.0, max(top * 1.15, floor))]


def _prediction_bars_parts(predictions: list[list[dict]]) -> tuple[list[dict], dict]:
    layout = _subplot_rows(len(predictions))
    shares = share_range([p["score"] for preds in predictions for p in preds])
    data = []
    for i, preds in enumerate(predictions, start=1):
        tokens = [p["token"] for p in preds][::-1]
        scores = [p["score"] for p in preds][::-1]
        suffix = "" if i == 1 else str(i)
        data.append(dict(type="bar", x=scores, y=unique_labels(tokens), orientation="h",
                         text=[f"{s:.1%}" for s in scores], textposition="auto",
                         hovertemplate="%{y}: %{x:.4f}<extra></extra>", showlegend=False,
                         xaxis=f"x{suffix}", yaxis=f"y{suffix}"))
        layout[f"xaxis{suffix}"].update(range=shares, tickformat=".0%")
    height = 120 + 40 * sum(max(len(p), 1) for p in predictions)
    layout.update(height=min(height, 2400), margin=dict(l=10, r=10, t=40, b=10))
    return data, layout


def token_scores(tokens: list[str], log_probs: list[float], title: str) -> go.Figure:
    """Bar per token of its log-probability (PLL contributions): the surprising tokens stand out."""
    bars = dict(type="bar", x=unique_labels(tokens), y=log_probs,
                hovertemplate="%{x}: %{y:.3f}<extra></extra>")
    return fast_figure([bars], dict(title=dict(text=title), yaxis=dict(title=dict(text="log p(token | rest)")),
                                    height=320, margin=dict(l=10, r=10, t=50, b=10)))


def fast_figure(data: list[dict], layout: dict) -> go.Figure:
    """`go.Figure` from plain dicts, without plotly's validation of every property (10-30x
    faster to build; the JSON sent to the page is the same). Only for builders whose output a
    test compares with the validated figure: a typo here would not raise."""
    layout.setdefault("template", _TEMPLATE)  # as a dict: validated once, not per figure
    return go.Figure({"data": data, "layout": layout}, _validate=False)


def figure_json(data: list[dict], layout: dict) -> str:
    """The JSON `fast_figure(data, layout).to_json()` gives (plotly's own encoder, on the dicts:
    no figure objects, no deep copy of the template)."""
    return pio.json.to_json_plotly({"data": data, "layout": {"template": _TEMPLATE, **layout}})


# plotly's default template as a dict, read once at import (never written): a figure takes it as it
# is, where a template object would be validated per figure
_TEMPLATE = pio.templates[pio.templates.default].to_plotly_json()


def _subplot_rows(n_rows: int) -> dict:
    """Layout of `n_rows` stacked subplots titled "[MASK] i", as `make_subplots(rows=n, cols=1,
    subplot_titles=..., vertical_spacing=0.25 / n)` draws it (its template aside), worked out as
    plotly works it out (tests/test_fast_figures.py compares them): make_subplots takes ~30 ms."""
    n = max(n_rows, 1)
    spacing = 0.25 / n
    heights = [(1.0 - spacing * (n - 1)) / n] * n
    layout, titles = {}, []
    for row in range(n):  # from the top: the last row's domain starts at 0
        below = n - 1 - row
        start = sum(heights[:below]) + below * spacing
        domain = [min(max(end, 0.0), 1.0) for end in (start, start + heights[-1 - row])]  # float error cut
        axis = "" if row == 0 else str(row + 1)
        layout[f"xaxis{axis}"] = {"anchor": f"y{axis}", "domain": [0.0, 1.0]}
        layout[f"yaxis{axis}"] = {"anchor": f"x{axis}", "domain": domain}
        if row < n_rows:  # none for no [MASK]
            titles.append({"font": {"size": 16}, "showarrow": False, "text": f"[MASK] {row + 1}", "x": 0.5,
                           "xanchor": "center", "xref": "paper", "y": domain[1], "yanchor": "bottom", "yref": "paper"})
    return {**layout, "annotations": titles} if titles else layout


_WORD_START = ("Ġ", "▁")  # byte-level BPE's (RoBERTa, ModernBERT) and SentencePiece's (ALBERT, XLM-R, DeBERTa)


def shown_token(token: str) -> str:
    """A token as a reader reads it, whatever the tokenizer: the word-start marks of byte-level BPE
    ("Ġcapital") and SentencePiece ("▁capital") and the leading space of a decoded BPE token
    (" capital", as ModernBERT's and RoBERTa's predictions decode) dropped; BPE's newline byte
    ("Ċ") shown as ⏎; WordPiece's "##" (a piece inside a word) kept, as BERT's readers know it."""
    text = str(token)
    if len(text) > 1 and text[0] in _WORD_START:
        text = text[1:]
    elif text.strip() and text[0] == " ":
        text = text.lstrip(" ")
    return text.replace("Ċ", "⏎").replace("\n", "⏎") or str(token)


def unique_labels(labels: list[str]) -> list[str]:
    """Tokens as words (`shown_token`); plotly merges equal category labels, so repeats get
    zero-width spaces and stay separate bars."""
    seen: dict[str, int] = {}
    out = []
    for label in map(shown_token, labels):
        seen[label] = seen.get(label, 0) + 1
        out.append(label + "\u200b" * (seen[label] - 1))
    return out


# ---------------------------------------------------------------- masking

OUTCOME_COLORS = {"mask": "#f59e0b", "random": "#ef4444", "keep": "#22c55e"}  # orange, red, green
_NOT_CHOSEN = "#eef0f3"


def outcome_grid(tokens: list[str], grids: dict[str, dict]) -> go.Figure:
    """Epochs x tokens heatmaps, one above the other (one per mode, e.g. static and dynamic).

    `grids[mode]` holds "outcome" (E x T of "mask"/"random"/"keep"/None) and "seen" (E x T
    tokens the model sees, written in the cells).
    """
    codes = {None: 0, "mask": 1, "random": 2, "keep": 3}
    colors = [_NOT_CHOSEN, *OUTCOME_COLORS.values()]
    # Four flat bands over z = 0..3: a discrete colour per outcome.
    scale = [[0, colors[0]], [1 / 6, colors[0]], [1 / 6, colors[1]], [1 / 2, colors[1]],
             [1 / 2, colors[2]], [5 / 6, colors[2]], [5 / 6, colors[3]], [1, colors[3]]]
    modes = list(grids)
    # One above the other, each the page's full width, with the cells' text at a size one reads
    # (plotly's own shrinks it to fit the cell: at 20 tokens side by side, about 7 px)
    fig = make_subplots(rows=len(modes), cols=1, subplot_titles=modes, vertical_spacing=0.12 / len(modes))
    x = unique_labels(tokens)
    size = 13 if len(tokens) <= 20 else 12 if len(tokens) <= 28 else 11 if len(tokens) <= 36 else 10
    for row, mode in enumerate(modes, start=1):
        outcome = grids[mode]["outcome"]
        y = [f"epoch {e + 1}" for e in range(len(outcome))]
        fig.add_trace(go.Heatmap(
            z=[[codes[o] for o in row] for row in outcome], x=x, y=y, zmin=0, zmax=3,
            colorscale=scale, showscale=False, text=grids[mode]["seen"], texttemplate="%{text}",
            textfont=dict(size=size), xgap=1, ygap=1,
            customdata=[[o or "not chosen" for o in cells] for cells in outcome],
            hovertemplate="%{y}, %{x}: %{customdata}, model sees %{text}<extra></extra>"),
            row=row, col=1)
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(tickfont=dict(size=size))
    epochs = len(grids[modes[0]]["outcome"])
    fig.update_layout(height=min(120 + len(modes) * (50 + 26 * epochs), 2400),
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
    fig.update_layout(yaxis_title="rate", yaxis_tickformat=".0%", height=360,
                      yaxis_range=share_range([r["high"] for r in rows] + [r["configured"] for r in rows]),
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
    names = unique_labels([plotly_text(x) for x in labels])
    n = len(names)
    heatmap = dict(type="heatmap", z=shown, x=names, y=names, colorscale=_colorscale("Blues"), zmin=0,
                   zmax=max(float(matrix.max()), 1e-6), hovertemplate="%{y} → %{x}: %{z:.4f}<extra></extra>",
                   colorbar=dict(title=dict(text="weight")), xgap=1, ygap=1)
    if n <= 20:
        heatmap["texttemplate"] = "%{z:.2f}"
    size = min(max(420, 110 + 22 * n), 1600)
    layout = dict(title=dict(text=title), height=size, margin=label_margins(names),
                  xaxis=dict(title=dict(text="attends to (key)"), side="top", tickangle=-60, type="category"),
                  yaxis=dict(title=dict(text="token (query)"), autorange="reversed", type="category"))
    if boundary is not None:  # sentence B starts here: a line down and a line across
        line = dict(type="line", line=dict(color="crimson", width=2, dash="dash"))
        at, end = boundary - 0.5, n - 0.5
        layout["shapes"] = [dict(**line, x0=at, x1=at, y0=-0.5, y1=end),
                            dict(**line, x0=-0.5, x1=end, y0=at, y1=at)]
    return fast_figure([heatmap], layout)


def label_margins(names: list[str]) -> dict:
    """Margins (px) for a heatmap whose axes are labelled with `names` (the y labels left, the x
    labels on top at -60 degrees, a colorbar right, a title). With margins too small for its labels
    plotly draws the whole chart, measures the labels and draws it all again with wider margins:
    half of the Attention heatmap's drawing in the page. These fit the labels plotly measured in
    chromium (l 76, t 100 at 6 characters; l 136, t 133 at 20; r 95-103) with room to spare, so
    one pass draws it; a label wider than guessed still fits, after the second pass."""
    longest = max((len(x) for x in names), default=1)
    return dict(l=50 + 7 * longest, r=110, t=max(100, 50 + 6 * longest), b=10)


def mask_attention_grid(rows, labels: list[str], hidden: list[bool] | None = None,
                        title: str = "What the [MASK] looked at", first_layer: int = 0,
                        first_head: int = 0) -> go.Figure:
    """Layers x heads grid for one [MASK]: each cell names the token the mask attends to most in
    that head, coloured by the weight; hover lists the top 3. `rows` is (layers, heads, T);
    tokens with `hidden[j]` true are skipped (e.g. [CLS]/[SEP]); layers are named from
    `first_layer` (the page's 1: 0 is the embeddings), heads from `first_head` (the page's 1)."""
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
    grid = dict(type="heatmap", z=top.tolist(), text=text, customdata=hover, texttemplate="%{text}",
                colorscale=_colorscale("Oranges"), zmin=0, zmax=1,
                x=list(range(first_head, first_head + n_heads)),
                y=list(range(first_layer, first_layer + n_layers)),
                hovertemplate="layer %{y}, head %{x}<br>%{customdata}<extra></extra>",
                colorbar=dict(title=dict(text="weight")), xgap=1, ygap=1)
    return fast_figure([grid], dict(  # margins that fit its labels: one drawing pass (label_margins)
        title=dict(text=title), height=min(max(300, 90 + 34 * n_layers), 1200),
        margin=dict(l=60, r=110, t=100, b=10), xaxis=dict(title=dict(text="head"), dtick=1, side="top"),
        yaxis=dict(title=dict(text="layer"), dtick=1, autorange="reversed")))


def neuron_view(result: dict) -> go.Figure:
    """One head's query against every key (`heads.neuron_view`'s result): the query (one row of
    head_dim cells), each token's key and query * key per dimension (T rows each, red positive,
    blue negative), then each key's score (sum of products / sqrt(head_dim)) and its weight."""
    tokens = unique_labels([plotly_text(t) for t in result["tokens"]])
    asking = tokens[result["token"]]
    dims = list(range(result["head_dim"]))
    fig = make_subplots(rows=2, cols=4, shared_yaxes=True, row_heights=[0.08, 0.92], vertical_spacing=0.08,
                        horizontal_spacing=0.02, column_widths=[0.36, 0.36, 0.14, 0.14],
                        subplot_titles=["query", "", "", "", "keys", "query × key", "score", "weight"])
    span = max(max(abs(x) for x in result["query"]), max(abs(x) for row in result["keys"] for x in row), 1e-6)
    products = max(max(abs(x) for row in result["products"] for x in row), 1e-6)

    def cells(z, y, limit, name):
        return go.Heatmap(z=z, x=dims, y=y, zmin=-limit, zmax=limit, zmid=0, colorscale="RdBu",
                          reversescale=True, showscale=False,
                          hovertemplate=f"{name}: %{{y}}, dimension %{{x}}: %{{z:.4f}}<extra></extra>")
    fig.add_trace(cells([result["query"]], [asking], span, "query"), row=1, col=1)
    fig.add_trace(cells(result["keys"], tokens, span, "key"), row=2, col=1)
    fig.add_trace(cells(result["products"], tokens, products, "query × key"), row=2, col=2)
    fig.add_trace(go.Bar(x=result["scores"], y=tokens, orientation="h", marker_color="#64748b",
                         hovertemplate="%{y}: score %{x:.4f}<extra></extra>"), row=2, col=3)
    fig.add_trace(go.Bar(x=result["weights"], y=tokens, orientation="h", marker_color="#f59e0b",
                         text=[f"{w:.2f}" for w in result["weights"]], textposition="auto",
                         hovertemplate="%{y}: weight %{x:.4f}<extra></extra>"), row=2, col=4)
    fig.update_yaxes(type="category", autorange="reversed")
    fig.update_xaxes(showticklabels=False, row=1)
    fig.update_xaxes(title_text="dimension", row=2, col=1)
    fig.update_xaxes(title_text="dimension", row=2, col=2)
    fig.update_xaxes(range=share_range(result["weights"]), row=2, col=4)
    named = plotly_text(result["tokens"][result["token"]])
    fig.update_layout(title=f"Layer {result['layer']}, head {result['head']}: the query of token "
                            f"{result['token']}, “{named}”, against every key", showlegend=False,
                      height=min(max(360, 140 + 24 * len(tokens)), 2400), margin=dict(l=10, r=10, t=70, b=10))
    return fig


def _colorscale(name: str) -> tuple:
    """A named plotly colour scale as the (position, colour) pairs the validated figure sends."""
    return tuple(tuple(pair) for pair in go.Heatmap(colorscale=name).colorscale)


def plotly_text(label: str) -> str:
    """Plotly reads `<b>`, `<br>`, `<a href>` in labels as markup; escape user text so it stays text
    (tokens shown as words, `shown_token`)."""
    return html.escape(shown_token(label), quote=False)


def finetune_curves(steps: list, evals: list, planned_steps: int | None = None,
                    best: tuple[int, str] | None = None) -> go.Figure:
    """Training loss per step and eval loss (same axis), eval accuracy on a second axis.

    `steps`/`evals` are a `training.loop.RunHistory`'s `Step`s and `Evaluation`s (or the events so
    far, for a live plot). `best`: (step, label), a dashed line at the best evaluation (e.g.
    "kept: step 24").
    Rebuilt on every live update, so it is built from dicts (`fast_figure`).
    """
    eval_steps = [e.step for e in evals]
    data = [dict(type="scatter", x=[s.step for s in steps], y=[s.loss for s in steps],
                 mode="lines", name="training loss", line=dict(width=1)),
            dict(type="scatter", x=eval_steps, y=[e.loss for e in evals], mode="lines+markers",
                 name="eval loss (fixed masks)"),
            dict(type="scatter", x=eval_steps, y=[e.accuracy for e in evals], mode="lines+markers",
                 name="eval accuracy", line=dict(dash="dot"), xaxis="x", yaxis="y2")]
    layout = _secondary_y_layout()
    layout["xaxis"]["title"] = dict(text="step")
    if planned_steps:
        layout["xaxis"]["range"] = [0, planned_steps]
    layout["yaxis"]["title"] = dict(text="masked-token loss")
    layout["yaxis2"].update(title=dict(text="accuracy"), range=[0, 1], tickformat=".0%")
    layout.update(height=380, margin=dict(l=10, r=10, t=40, b=10),  # legend clear of the label
                  legend=dict(orientation="h", x=1, xanchor="right", y=1.02, yanchor="bottom"))
    if best is not None:
        step, label = best
        layout["shapes"] = [dict(type="line", x0=step, x1=step, y0=0, y1=1, xref="x", yref="paper",
                                 line=dict(dash="dash", color="#16a34a", width=1.5))]
        layout["annotations"] = [*layout.get("annotations", ()), dict(
            x=step, y=1, xref="x", yref="paper", text=plotly_text(label), showarrow=False,
            xanchor="left", yanchor="top", font=dict(color="#16a34a"))]
    return fast_figure(data, layout)


def _secondary_y_layout() -> dict:
    """Layout of one plot with a second y axis on the right, as `make_subplots(specs=[[{"secondary_y":
    True}]])` draws it (its template aside; tests/test_fast_figures.py compares them)."""
    return {"xaxis": {"anchor": "y", "domain": [0.0, 0.94]}, "yaxis": {"anchor": "x", "domain": [0.0, 1.0]},
            "yaxis2": {"anchor": "x", "overlaying": "y", "side": "right"}}


def masking_comparison(runs: dict) -> go.Figure:
    """Static vs dynamic (or any runs) overlaid: eval loss and eval accuracy against step.

    `runs` maps a label to a `training.loop.RunHistory` (or the events so far: `EventLog.runs`).
    """
    fig = make_subplots(rows=1, cols=2, subplot_titles=["eval loss (fixed masks)", "eval accuracy"])
    colors = ["#636efa", "#ef553b", "#00cc96", "#ab63fa"]
    for i, (label, run) in enumerate(runs.items()):
        color = colors[i % len(colors)]
        evals = run.evals
        x = [e.step for e in evals]
        fig.add_trace(go.Scatter(x=x, y=[e.loss for e in evals], mode="lines+markers",
                                 name=label, line=dict(color=color), legendgroup=label), row=1, col=1)
        fig.add_trace(go.Scatter(x=x, y=[e.accuracy for e in evals], mode="lines+markers",
                                 name=label, line=dict(color=color), legendgroup=label,
                                 showlegend=False), row=1, col=2)
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(range=[0, 1], tickformat=".0%", row=1, col=2)
    fig.update_layout(height=360, margin=dict(l=10, r=10, t=40, b=10))
    return fig


def labelling_curves(runs: dict) -> go.Figure:
    """Each run's training loss per step (solid) and its eval loss on fixed, properly masked
    tokens (dashed, same colour), overlaid.

    `runs` maps a label to a `training.loop.RunHistory`. Each training loss is its own labelling's, so
    only the eval losses compare like with like.
    """
    fig = go.Figure()
    colors = ["#ef553b", "#636efa", "#00cc96", "#ab63fa"]
    for i, (label, run) in enumerate(runs.items()):
        color = colors[i % len(colors)]
        fig.add_trace(go.Scatter(x=[s.step for s in run.steps], y=[s.loss for s in run.steps],
                                 mode="lines", name=f"{label}: training loss", line=dict(color=color)))
        fig.add_trace(go.Scatter(x=[e.step for e in run.evals], y=[e.loss for e in run.evals],
                                 mode="lines+markers", name=f"{label}: eval loss (masked tokens)",
                                 line=dict(color=color, dash="dash")))
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(title_text="loss", rangemode="tozero")
    fig.update_layout(height=420, margin=dict(l=10, r=10, t=40, b=10),  # legend below: 4 long names
                      legend=dict(orientation="h", x=0, y=-0.2, yanchor="top"))
    return fig


# ---------------------------------------------------------------- inside a prediction

def layer_heatmap(entry: dict, title: str) -> go.Figure:
    """Layers x top-k for one mask (`explain.layer_predictions`' entry): each cell names the
    token at that rank after that layer, coloured by its probability; the final answer is bold."""
    layers, final = entry["layers"], entry["final"]["token_id"]
    text = [[_bold_if(plotly_text(p["token"]), p["token_id"] == final) for p in row] for row in layers]
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
        name = f"[MASK] {entry['mask']}: {plotly_text(entry['final']['token'])}"
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
    per mask (`compare.compare_predictions`' result); hover gives the change."""
    masks, names = result["masks"], [plotly_text(n) for n in result["models"]]
    fig = make_subplots(rows=max(len(masks), 1), cols=1, vertical_spacing=0.3 / max(len(masks), 1),
                        subplot_titles=[f"[MASK] {m['mask']}" for m in masks])
    for row, mask in enumerate(masks, start=1):
        labels = unique_labels([plotly_text(r["token"]) for r in mask["changes"]])
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


# ---------------------------------------------------------------- classify

_RUN_COLORS = ["#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a"]


def classifier_curves(runs: dict, planned_steps: int | None = None) -> go.Figure:
    """Training loss per step (left) and held-out accuracy (right) of one or more classifier runs,
    overlaid (e.g. from the base body and from an MLM-adapted one).

    `runs` maps a name to a `training.loop.RunHistory` (or the events so far, for a live plot).
    """
    fig = make_subplots(rows=1, cols=2, subplot_titles=["training loss", "held-out accuracy"])
    for i, (name, run) in enumerate(runs.items()):
        color, label = _RUN_COLORS[i % len(_RUN_COLORS)], plotly_text(name)
        fig.add_trace(go.Scatter(x=[s.step for s in run.steps], y=[s.loss for s in run.steps],
                                 mode="lines", name=label, line=dict(color=color), legendgroup=label),
                      row=1, col=1)
        fig.add_trace(go.Scatter(x=[e.step for e in run.evals], y=[e.accuracy for e in run.evals],
                                 mode="lines+markers", name=label, line=dict(color=color),
                                 legendgroup=label, showlegend=False), row=1, col=2)
    fig.update_xaxes(title_text="step", range=[0, planned_steps] if planned_steps else None)
    fig.update_yaxes(title_text="cross-entropy", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(range=[0, 1.02], tickformat=".0%", row=1, col=2)
    fig.update_layout(height=360, margin=dict(l=10, r=10, t=40, b=10), showlegend=len(runs) > 1,
                      legend=dict(orientation="h", x=1, xanchor="right", y=1.08, yanchor="bottom"))
    return fig


def confusion_heatmap(labels: list[str], confusion: list[list[int]]) -> go.Figure:
    """counts[i][j] = held-out examples of label i predicted as j; true labels down, predicted
    across, each cell written out (a person reads the mistakes off the diagonal)."""
    names = unique_labels([plotly_text(label) for label in labels])
    fig = go.Figure(go.Heatmap(z=confusion, x=names, y=names, colorscale="Blues", showscale=False,
                               text=confusion, texttemplate="%{text}",
                               hovertemplate="true %{y}, predicted %{x}: %{z}<extra></extra>"))
    fig.update_xaxes(title_text="predicted", side="top", type="category")
    fig.update_yaxes(title_text="true label", autorange="reversed", type="category")
    side = 160 + 50 * len(labels)
    fig.update_layout(height=min(side, 900), margin=dict(l=10, r=10, t=60, b=10))
    return fig


def forgetting_plot(points: list[dict], mlm_before: float) -> go.Figure:
    """One point per learning rate: the body's MLM loss after the classification fine-tune (x)
    against held-out accuracy (y); a dashed line at the MLM loss before. Right is more forgetting."""
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[p["mlm_loss"] for p in points], y=[p["accuracy"] for p in points],
                             mode="markers+text+lines", text=[f"lr {p['learning_rate']:.0e}" for p in points],
                             textposition="top center", line=dict(dash="dot", color="#636efa"),
                             marker=dict(size=11), name="classifier",
                             hovertemplate="MLM loss %{x:.3f}, accuracy %{y:.0%}<extra></extra>"))
    fig.add_vline(x=mlm_before, line_dash="dash", line_color="#888",
                  annotation_text="MLM loss before", annotation_position="bottom right")
    fig.update_xaxes(title_text="masked-LM loss of the body after (original MLM head, fixed masks)")
    fig.update_yaxes(title_text="held-out accuracy", range=[0, 1.05], tickformat=".0%")
    fig.update_layout(height=380, margin=dict(l=10, r=10, t=30, b=10), showlegend=False)
    return fig


def embedding_scatter(result: dict, title: str) -> go.Figure:
    """`embeddings.embedding_map`'s points, one colour per sentence; hover: the token and its sentence."""
    fig = go.Figure()
    by_sentence: dict[int, list[dict]] = {}
    for point in result["points"]:
        by_sentence.setdefault(point["sentence"], []).append(point)
    word_only = result["word"] is not None
    for s, points in by_sentence.items():
        text = points[0]["text"]
        name = f"{s + 1}: {plotly_text(text[:40] + ('…' if len(text) > 40 else ''))}"
        fig.add_trace(go.Scatter(
            x=[p["x"] for p in points], y=[p["y"] for p in points], name=name,
            mode="markers+text" if word_only else "markers", marker=dict(size=11 if word_only else 8),
            text=[plotly_text(p["token"]) for p in points], textposition="top center",
            customdata=[[plotly_text(p["text"])] for p in points],
            hovertemplate="<b>%{text}</b><br>%{customdata[0]}<extra></extra>"))
    x, y = (f"PC{i + 1} ({share:.0%} of the variance)" for i, share in enumerate(result["explained"]))
    missing = result.get("missing") or []
    if missing:  # the lines without the word: left out of the map, and said
        lines = "; ".join(f"line {m['line']} ({plotly_text(m['text'][:30] + ('…' if len(m['text']) > 30 else ''))})"
                          for m in missing[:4]) + ("; …" if len(missing) > 4 else "")
        title = f"{title}<br><sup>Left out, without '{plotly_text(result['word'])}': {lines}</sup>"
    fig.update_layout(title=title, height=460, xaxis=dict(title=x), yaxis=dict(title=y),
                      legend=dict(title="sentence"), margin=dict(l=10, r=10, t=70 if missing else 50, b=10))
    return fig


def probe_accuracy_lines(result: dict, title: str) -> go.Figure:
    """`embeddings.probe_layers`' held-out accuracy per layer, with the majority-class baseline."""
    layers = [entry["layer"] for entry in result["layers"]]
    fig = go.Figure(go.Scatter(x=layers, y=[entry["accuracy"] for entry in result["layers"]],
                               mode="lines+markers", name="linear probe (held-out)",
                               hovertemplate="layer %{x}: %{y:.1%}<extra></extra>"))
    fig.add_trace(go.Scatter(x=layers, y=[result["baseline"]] * len(layers), mode="lines",
                             name="majority class", line=dict(dash="dash"),
                             hovertemplate="always the most frequent label: %{y:.1%}<extra></extra>"))
    fig.update_layout(title=title, height=340, margin=dict(l=10, r=10, t=50, b=10),
                      xaxis=dict(title="layer (0 = embeddings)", dtick=1),
                      yaxis=dict(title="held-out accuracy", range=[0, 1.05], tickformat=".0%"))
    return fig


def search_word_counts(result: dict, title: str) -> go.Figure:
    """`corpus_search.search_corpus`'s hits counted by the word they matched, most frequent first."""
    counts = result["counts"]
    fig = go.Figure(go.Bar(x=[plotly_text(c["word"]) for c in counts], y=[c["count"] for c in counts],
                           marker_color="#93c5fd", hovertemplate="%{x}: %{y} of the top hits<extra></extra>"))
    fig.update_layout(title=title, height=320, margin=dict(l=10, r=10, t=50, b=10),
                      xaxis=dict(title="word matched", type="category"),
                      yaxis=dict(title="hits", dtick=1, rangemode="tozero"))
    return fig
