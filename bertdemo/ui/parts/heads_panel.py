"""The attention tab's heads, deeper: the neuron view (one head's query against every key) and head
importance (a clickable layers x heads grid: click a head to switch it off or on and see the
predictions change), each with its export.

What a session keeps between events is small: the neuron view's query (model by weak reference,
text) and the last importance result (layers x heads numbers). The heads switched off are the
text of one box, `layer:head` pairs: the grid's clicks edit it and every event reads it.
"""
from __future__ import annotations

import json
import sys
import weakref
from dataclasses import dataclass

import gradio as gr
import pandas as pd

from ... import plots, validate
from ...model.loading import LoadedModel
from ...views import view_files
from ...views.attention_views import first_query
from ...views.compare import compare_predictions
from ...views.fillmask import fill_mask
from ...views.heads import (HeadsOff, format_heads, head_importance, neuron_view, parse_heads, read_heads, shape,
                             without)
from . import view_downloads
from .common import FIRST_HEAD, empty_table
from .context import AppContext, Visitor, handler

NEURON_HELP = """**Neuron view** (Vig 2019, as in bertviz). For one layer and head: the query of the
token you pick (it starts on the sentence's first [MASK]: click another, or type its index), every token's key, their product per dimension (red
positive, blue negative), the score (sum of the products / √head size) and the weight (softmax of the
scores: the row of the attention heatmap for that head). The vectors are the model's own query and
key projections, read while it runs."""
IMPORTANCE_HELP = """**Reading the grid.** Each cell: Δ = log p(word | that head switched off alone) −
log p(word with every head on), at the chosen [MASK]. **Red**: switching the head off lowers the
word's probability (the head supports it); **blue**: it raises it. **✕**: switched off now. Click a
cell to switch that head off or on (the *layer* cell: the whole layer); the predictions below follow.
A head switched off has its part of the attention output set to zero (transformers' `head_mask=0`),
for your requests only. All layers x heads copies run in a few batched forwards."""
TOP_K = 5
FIRST_LAYER = 1  # the page counts layers from 1 (0 is the embeddings) and heads from 1; the views from 0


@dataclass(frozen=True)
class NeuronQuery:
    """What the neuron view was asked of: enough to draw it again for another layer, head or token."""

    model: weakref.ref[LoadedModel]
    text: str
    text_b: str | None

    @property
    def nbytes(self) -> int:
        return sys.getsizeof(self.text) + sys.getsizeof(self.text_b) + 200


@dataclass(frozen=True)
class Importance:
    """The last head importance: its sentence and result (layers x heads floats, a few kB)."""

    model: weakref.ref[LoadedModel]
    text: str
    result: dict

    @property
    def nbytes(self) -> int:
        return len(json.dumps(self.result)) + sys.getsizeof(self.text) + 200


def render(ctx: AppContext, text, text_b, n_layers: int, n_heads: int) -> None:
    """The two sections, below the tab's own; `text`, `text_b` are the tab's sentence boxes."""
    neuron = _section_neuron(n_layers, n_heads)
    importance = _section_importance(n_heads)
    heads_off = _section_heads_off()
    off, grid = heads_off.off, importance.grid

    neuron_options = neuron.options
    neuron.show.click(handler(ctx, on_neuron), [text, text_b, *neuron_options], neuron.outputs,
                      api_name="neuron_view", concurrency_id="model")
    gr.on([c.change for c in neuron_options], handler(ctx, on_neuron_options), neuron_options, neuron.outputs,
          api_visibility="private", trigger_mode="always_last", concurrency_id="model")
    neuron.tokens.select(on_token_click, None, neuron.token, api_visibility="private")
    gr.on([text.change, text_b.change], handler(ctx, on_sentence), [text, text_b], neuron.token,
          api_visibility="private", trigger_mode="always_last", queue=False)
    neuron.export_button.click(handler(ctx, on_export_neuron), neuron_options, neuron.export_files,
                               api_visibility="private", concurrency_id="model")

    importance.compute.click(handler(ctx, on_importance), [text, importance.mask_number, importance.target, off],
                             importance.outputs, api_name="head_importance", concurrency_id="model")
    grid.select(handler(ctx, on_grid_click), off, [off, grid, *heads_off.outputs],
                api_visibility="private", concurrency_id="model")
    importance.export_button.click(handler(ctx, on_export_importance), None, importance.export_files,
                                   api_visibility="private")
    heads_off.predict.click(handler(ctx, on_heads_off), [text, off], heads_off.outputs, api_name="heads_off",
                            concurrency_id="model").success(handler(ctx, on_marks), off, grid,
                                                            api_visibility="private")
    heads_off.export_button.click(handler(ctx, on_export_heads_off), [text, off], heads_off.export_files,
                                  api_visibility="private", concurrency_id="model")


@dataclass(kw_only=True)
class Numbers:
    """What every view of the panel ends with: its numbers (raw JSON, folded) and its export (the
    button and the files it fills). Keyword-only: each section's own fields stay positional."""

    raw: gr.JSON
    export_button: gr.Button
    export_files: gr.File


def _numbers(title: str, what: str) -> dict:
    """A view's numbers folded under `title` and its export controls for `what`: `Numbers`' fields."""
    with gr.Accordion(title, open=False):
        raw = gr.JSON()
    export_button, export_files = view_downloads.controls(what)
    return dict(raw=raw, export_button=export_button, export_files=export_files)


@dataclass
class NeuronSection(Numbers):
    """The neuron view: its options, the clickable tokens, the button, what `on_neuron` returns (in
    `outputs` order) and its numbers and export."""

    layer: gr.Slider
    head: gr.Slider
    token: gr.Number
    tokens: gr.HighlightedText
    show: gr.Button
    plot: gr.Plot

    @property
    def options(self) -> list:
        """The layer, head and query token: what a change redraws the view for."""
        return [self.layer, self.head, self.token]

    @property
    def outputs(self) -> list:
        return [self.plot, self.tokens, self.raw]


def _section_neuron(n_layers: int, n_heads: int) -> NeuronSection:
    gr.Markdown("### Neuron view: how one head weighs every key")
    gr.Markdown(NEURON_HELP)
    with gr.Row():
        layer = gr.Slider(1, n_layers, value=1, step=1, label="Neuron view: layer (1 = the first)", scale=2)
        head = gr.Slider(1, n_heads, value=1, step=1, label="Neuron view: head (1 = the first)", scale=2)
        token = gr.Number(label="Query token (its index, [CLS] = 0)", value=1, precision=0, minimum=0, scale=1,
                          info="Starts on the sentence's first [MASK].")
    tokens = gr.HighlightedText(label="Click a token to see its query", combine_adjacent=False, show_legend=False,
                                color_map={"query": "orange"}, elem_id="neuron-tokens")
    show = gr.Button("Show the neuron view", variant="primary")
    plot = gr.Plot(label="Neuron view: query, keys, query × key, score, weight")
    return NeuronSection(layer, head, token, tokens, show, plot,
                         **_numbers("The neuron view's numbers (JSON)", "the neuron view"))


@dataclass
class ImportanceSection(Numbers):
    """Head importance: its form, the button, what `on_importance` returns (in `outputs` order; the
    grid is clickable) and its numbers and export."""

    mask_number: gr.Number
    target: gr.Textbox
    compute: gr.Button
    grid: gr.Dataframe
    note: gr.Markdown

    @property
    def outputs(self) -> list:
        return [self.note, self.grid, self.raw]


def _section_importance(n_heads: int) -> ImportanceSection:
    gr.Markdown("### Head importance: what each head does for the [MASK]")
    with gr.Row():
        mask_number = gr.Number(label="Head importance at mask number (1 = first)", value=1, precision=0,
                                minimum=1, scale=1)
        target = gr.Textbox(label="Word to score (empty: the top prediction)", scale=2)
    compute = gr.Button("Compute head importance", variant="primary")
    note = gr.Markdown()
    columns = ["layer", *[f"head {h + FIRST_HEAD}" for h in range(n_heads)]]
    # widths set, so that every head's column fits a 1280 px page (its own width: the last was cut)
    grid = gr.Dataframe(empty_table(columns), label="Change in log p(word) with each head switched "
                        "off: click a head", interactive=False, elem_id="head-importance",
                        column_widths=["8%"] + [f"{92 / n_heads:.2f}%"] * n_heads)
    gr.Markdown(IMPORTANCE_HELP)
    return ImportanceSection(mask_number, target, compute, grid, note,
                             **_numbers("Head importance's numbers (JSON)", "the head importance"))


@dataclass
class HeadsOffSection(Numbers):
    """Heads switched off: the box every event reads, the button, what `on_heads_off` returns (in
    `outputs` order) and its numbers and export."""

    off: gr.Textbox
    predict: gr.Button
    bars: gr.Plot
    note: gr.Markdown

    @property
    def outputs(self) -> list:
        return [self.bars, self.note, self.raw]


def _section_heads_off() -> HeadsOffSection:
    with gr.Row():
        off = gr.Textbox(label="Heads switched off (layer:head, both from 1, e.g. 1:1, 3:*)", scale=3,
                         info="Click the grid above, or type; * is every layer or head.")
        predict = gr.Button("Predict with these heads off", scale=1)
    bars = gr.Plot(label="Predictions: every head on vs these heads off")
    note = gr.Markdown()
    return HeadsOffSection(off, predict, bars, note,
                           **_numbers("The predictions' numbers (JSON)", "the predictions with heads off"))


# ---------------------------------------------------------------- handlers: the neuron view

def on_neuron(visitor: Visitor, sentence, second_sentence, layer, head, token):
    """One attention head's query for one token against every token's key (bertviz's neuron view).

    Args:
        sentence: the text, e.g. "The cat sat on the mat."; at most the model's length (512 tokens for BERT).
        second_sentence: optional second sentence of a pair ([CLS] A [SEP] B [SEP]); empty for one sentence.
        layer: the layer, 1 = the first (as every tab counts layers: 0 is the embeddings, which have no heads).
        head: the head in that layer, 1 = the first (as every tab counts heads; the Python API's `bertdemo.neuron_view` counts from 0).
        token: the query token's index among the tokens ([CLS] = 0); empty (None): the first [MASK], else token 1.

    Returns:
        the plotly figure (query, keys, query x key per dimension, scores, weights), the tokens with the query token marked, and the numbers {"tokens", "query", "keys", "products", "scores", "weights", "layer" (1 = the first), "head" (1 = the first), "token", "head_dim"}; the weights equal the model's own attention.
    """
    lm = visitor.lm
    if token is None:
        token = first_query(lm, sentence, second_sentence or None)
    result = _neuron(lm, sentence, second_sentence or None, layer, head, token)
    query = NeuronQuery(weakref.ref(lm), sentence, second_sentence or None)
    visitor.store.keep_result(visitor.session, "neuron", query, query.nbytes)
    return _neuron_outputs(result)


def on_neuron_options(visitor: Visitor, layer, head, token):
    query = visitor.store.result(visitor.session, "neuron")
    if query is None:
        return (gr.skip(),) * 3
    return _neuron_outputs(_neuron_again(query, layer, head, token))


def on_sentence(visitor: Visitor, sentence, second_sentence):
    """A new sentence: the neuron view's query starts on its first [MASK] (else token 1)."""
    try:
        return first_query(visitor.lm, sentence, second_sentence or None)
    except ValueError:  # empty or too long: the view says so when shown
        return gr.skip()


def on_token_click(evt: gr.SelectData) -> int:
    """The index of the token clicked (the neuron view's query)."""
    index = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
    return int(index) if index is not None else gr.skip()


def on_export_neuron(visitor: Visitor, layer, head, token) -> dict:
    query = visitor.store.result(visitor.session, "neuron")
    if query is None:
        raise ValueError("Press Show the neuron view first: there is nothing to export yet.")
    return view_downloads.listed(view_files.neuron(_neuron_again(query, layer, head, token),
                                                   view_downloads.folder(visitor)))


def _neuron_again(query: NeuronQuery, layer, head, token) -> dict:
    lm = _alive(query.model)
    if token is None:
        token = first_query(lm, query.text, query.text_b)
    return _neuron(lm, query.text, query.text_b, layer, head, token)


def _neuron(lm: LoadedModel, text: str, text_b: str | None, layer, head, token) -> dict:
    """The neuron view of `layer` and `head` as the page counts them (1 = the first), its result saying so."""
    n_layers, n_heads = shape(lm, "The neuron view")
    layer = validate.whole_number(layer, "layer", 1, n_layers, " (1 = the first layer)", field="layer")
    head = validate.whole_number(head, "head", FIRST_HEAD, n_heads - 1 + FIRST_HEAD, " (1 = the first head)",
                                 field="head")
    result = neuron_view(lm, text, layer=layer - 1, head=head - FIRST_HEAD, token=token, text_b=text_b)
    return {**result, "layer": layer, "head": head}


def _neuron_outputs(result: dict):
    marked = [(f"{t} ", "query" if i == result["token"] else None) for i, t in enumerate(result["tokens"])]
    return plots.neuron_view(result), marked, result


# ---------------------------------------------------------------- handlers: importance, heads off

def on_importance(visitor: Visitor, sentence, mask_number, target, heads):
    """How much each attention head matters to a [MASK]'s prediction: for every layer and head,
    log p(word | that head switched off alone) - log p(word).

    Args:
        sentence: text with one or more [MASK] (any case), e.g. "Paris is the [MASK] of France.".
        mask_number: which [MASK], 1 = the first.
        target: the word to score; empty for the model's top prediction. A word the tokenizer splits is scored by its first piece.
        heads: heads already switched off, "layer:head" pairs such as "1:1, 3:*" (layers and heads 1 = the first, as the page counts; * is every layer or head); empty for none. Their change is 0.

    Returns:
        a summary line, the layers x heads grid of changes (a table; rows are layers, columns heads), and the numbers {"target", "log_prob", "delta" (layers x heads), "tokens", "mask", "position", "heads_off"}.
    """
    lm = visitor.lm
    view = without(lm, read_heads(lm, heads, required=False, first_layer=FIRST_LAYER, first_head=FIRST_HEAD))
    result = head_importance(view, sentence, mask=mask_number, first=1, target=target or None,
                             max_masks=visitor.settings.max_masks)
    kept = Importance(weakref.ref(lm), sentence, result)
    visitor.store.keep_result(visitor.session, "importance", kept, kept.nbytes)
    return _summary(lm.name, result), importance_table(result, view.heads_off), result


def on_grid_click(visitor: Visitor, heads, evt: gr.SelectData):
    """A click on the grid: switch that head (or the whole layer) off or on; the predictions follow."""
    kept = _kept_importance(visitor)
    n_layers, n_heads = kept.result["layers"], kept.result["heads"]
    now = _parsed(heads, n_layers, n_heads)
    row, col = evt.index if isinstance(evt.index, (list, tuple)) else (None, None)
    if row is None or not 0 <= row < n_layers:
        return (gr.skip(),) * 5
    clicked = {(row, h) for h in range(n_heads)} if col == 0 else {(row, col - 1)}
    now = now - clicked if clicked <= now else now | clicked
    lm = _alive(kept.model)  # the model the grid was computed on: `now` is within its shape
    bars, note, raw = _predictions(lm, kept.text, HeadsOff(now, n_layers, n_heads), visitor.settings.max_masks)
    return format_heads(now, FIRST_LAYER, FIRST_HEAD), importance_table(kept.result, now), bars, note, raw


def on_heads_off(visitor: Visitor, sentence, heads):
    """The predictions at each [MASK] with some attention heads switched off, beside every head on.

    Args:
        sentence: text with one or more [MASK] (any case), e.g. "Paris is the [MASK] of France.".
        heads: "layer:head" pairs, layers and heads counted from 1 (as every tab: layer 0 is the embeddings, head 1 a layer's first), e.g. "1:1, 3:*" (* is every layer or head; "*:*" every head of every layer).

    Returns:
        grouped bars of each token's probability with every head on and with these heads off, a summary line, and the numbers {"models", "masks": [{"mask", "a", "b", "changes": [{"token", "a", "b", "change"}]}]}.
    """
    lm = visitor.lm
    return _predictions(lm, sentence, read_heads(lm, heads, required=True, first_layer=FIRST_LAYER,
                                                 first_head=FIRST_HEAD), visitor.settings.max_masks)


def on_marks(visitor: Visitor, heads):
    """The grid again, with the heads of the box marked."""
    kept = visitor.store.result(visitor.session, "importance")
    if kept is None:
        return gr.skip()
    return importance_table(kept.result, _parsed(heads, kept.result["layers"], kept.result["heads"]))


def on_export_importance(visitor: Visitor) -> dict:
    return view_downloads.listed(view_files.importance(_kept_importance(visitor).result,
                                                       view_downloads.folder(visitor), FIRST_LAYER, FIRST_HEAD))


def on_export_heads_off(visitor: Visitor, sentence, heads) -> dict:
    lm = visitor.lm
    result = _compared(lm, sentence, read_heads(lm, heads, required=True, first_layer=FIRST_LAYER,
                                                first_head=FIRST_HEAD), visitor.settings.max_masks)
    return view_downloads.listed(view_files.comparison(result, view_downloads.folder(visitor)))


def importance_table(result: dict, off) -> pd.io.formats.style.Styler:
    """The grid as a table, a row per layer: each cell's change, red where switching the head off
    lowers the word's probability and blue where it raises it; heads switched off marked ✕ (grey)."""
    delta = result["delta"]
    span = max((abs(d) for row in delta for d in row), default=0.0) or 1.0
    frame = pd.DataFrame([[f"layer {layer + FIRST_LAYER}", *[("✕ " if (layer, h) in off else "") + f"{d:+.3f}"
                                               for h, d in enumerate(row)]] for layer, row in enumerate(delta)],
                         columns=["layer", *[f"head {h + FIRST_HEAD}" for h in range(result["heads"])]])

    def colour(layer: int, h: int) -> str:
        if (layer, h) in off:
            return "background-color: #d1d5db; color: #4b5563"
        d = delta[layer][h] / span
        rgb = "220, 38, 38" if d < 0 else "37, 99, 235"
        return f"background-color: rgba({rgb}, {min(abs(d), 1.0) * 0.85:.3f}); color: #111"
    styles = pd.DataFrame([["", *[colour(layer, h) for h in range(result["heads"])]]
                           for layer in range(len(delta))], columns=frame.columns)
    return frame.style.apply(lambda _: styles, axis=None)


def _predictions(lm: LoadedModel, sentence: str, off: HeadsOff, max_masks: int):
    """Bars, a note and the numbers: every head on vs `off` switched off (just the predictions
    when none is)."""
    if not off.pairs:
        predictions = fill_mask(lm, sentence, TOP_K, max_masks)
        return plots.prediction_bars(predictions), "Every head is on: the model's own predictions.", predictions
    result = _compared(lm, sentence, off, max_masks)
    note = (f"{len(off.pairs)} of {off.total} heads switched off ({format_heads(off.pairs, FIRST_LAYER, FIRST_HEAD)}): "
            "bars show each token's probability with every head on and with these off.")
    return plots.comparison_bars(result), note, result


def _compared(lm: LoadedModel, sentence: str, off: HeadsOff, max_masks: int) -> dict:
    result = compare_predictions(lm, without(lm, off), sentence, TOP_K, max_masks)
    return {**result, "models": ["every head on", f"{len(off.pairs)} heads off"]}


def _summary(model: str, result: dict) -> str:
    flat = sorted(((d, layer, h) for layer, row in enumerate(result["delta"]) for h, d in enumerate(row)))
    most = ", ".join(f"{layer + FIRST_LAYER}:{h + FIRST_HEAD} ({d:+.3f})" for d, layer, h in flat[:3])
    word = result["target"]["token"]
    off = (f", with {format_heads(result['heads_off'], FIRST_LAYER, FIRST_HEAD)} already off"
           if result["heads_off"] else "")
    return (f"**{word}** at [MASK] {result['mask'] + 1} ({model}{off}): log p = {result['log_prob']:.3f}. "
            f"The heads it most needs (switching them off lowers log p most): {most}.")


def _parsed(text, n_layers: int, n_heads: int) -> frozenset:
    return parse_heads(text if text is not None else "", n_layers, n_heads, FIRST_LAYER, FIRST_HEAD)


def _kept_importance(visitor: Visitor) -> Importance:
    kept = visitor.store.result(visitor.session, "importance")
    if kept is None:
        raise ValueError("Press Compute head importance first.")
    return kept


def _alive(model: weakref.ref[LoadedModel]) -> LoadedModel:
    lm = model()
    if lm is None:
        raise ValueError("The model of this view was freed (a tuned model evicted or replaced): press the "
                         "view's button again.")
    return lm
