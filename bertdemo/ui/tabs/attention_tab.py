"""The attention tab: bertviz head/model views that work offline, and heatmaps read exactly.

What a session keeps between events is its query (the model, by weak reference, and the text),
not the weights: an option change recomputes them (one forward pass, tens of milliseconds), so an
idle session costs a few hundred bytes whatever its sentence length. The weights of a 450-token
MiniLM sentence are 58 MB as float32; the page state used to hold them for an hour.
"""
import json
import sys
import time
import weakref
from dataclasses import dataclass

import gradio as gr

from ... import plots, validate
from ...config import Settings
from ...model.loading import LoadedModel
from ...sessions import SessionStore
from ...views import view_files
from ...views.attention_views import (VENDOR_DIR, VIEWS, Attention, attention, bertviz_html, default_selection,
                               mask_rows, script_urls, srcdoc_iframe, standalone, view, view_height)
from ..parts import bertviz_frame, heads_panel, view_downloads
from ..parts.common import FIRST_HEAD
from ..parts.context import AppContext, Visitor, handler, standalone_demo

GRADIO_FILE_ROUTE = "gradio_api/file="  # where Gradio serves files by path (set_static_paths)

EXAMPLES = [
    ["The cat sat on the mat because it was tired.", ""],
    ["Paris is the [MASK] of France.", ""],
    ["The man went to the store.", "He bought a gallon of milk."],
]
WORDS_HELP = """**Reading the heatmap.** Row = the token whose new representation is being computed
(the query), column = the token it draws from (the key); each row sums to 1. *Whole words* merges word
pieces back into words: a word **receives** the sum of what its pieces receive (sum over key pieces)
and **gives** the mean of what its pieces give (mean over query pieces), so rows still sum to 1.
*Hide [CLS]/[SEP]* drops them and renormalises each row over the tokens left. *Hide weights below*
only blanks weak cells. *Rollout* (Abnar & Zuidema 2020) follows attention through the layers: each
layer's head-mean plus the residual (0.5·A + 0.5·I, renormalised), multiplied from the first layer up to
the chosen layer. Layers count from 1 (the first layer; 0 is the embeddings, which attend to nothing),
heads from 1 too. Hover a cell for its exact value; the camera icon saves a PNG."""
EXPLAINER = """**What attention weights are.** In each layer, every head computes for every token a
probability distribution over all tokens (a row of the heatmap); the token's new representation is
that weighted average of the other tokens' *value* vectors, one per head, then mixed by the next
layers. The views above show exactly these weights (`output_attentions` of the model).

**What they are not.** They are not, by themselves, an explanation of the prediction. A weight says
how much a vector was mixed in, not how large or how important that vector is (value vectors differ
in size), and after the first layer each position already mixes the whole sentence, which is what
rollout tries to follow. Jain & Wallace (2019, *Attention is not Explanation*) found attention often
disagrees with gradient-based importance and that very different weights can give the same output;
Wiegreffe & Pinter (2019, *Attention is not not Explanation*) answered that it depends on what one
calls an explanation and showed such alternative weights are hard to reach by training. Much of
BERT's attention goes to `[CLS]`, `[SEP]` and punctuation, often a "no-op" (Clark et al. 2019,
*What does BERT look at?*). Use the views to explore patterns (heads that track the previous word,
the object of a verb, coreference), not as proof of why the model chose a word. The bertviz README
(github.com/jessevig/bertviz) explains its head view and model view."""


@dataclass(frozen=True)
class Query:
    """What a session is looking at: enough to recompute its `Attention` (see the module doc)."""

    model: "weakref.ref[LoadedModel]"
    text: str
    text_b: str | None

    @property
    def nbytes(self) -> int:
        return sys.getsizeof(self.text) + sys.getsizeof(self.text_b) + 200  # + the record and ref


def render(ctx: AppContext) -> None:
    """Build the tab's components and events inside the current Blocks/Tab context."""
    _serve_vendored_scripts()
    n_layers, n_heads = _model_shape(ctx.store)
    sentence = _section_input()
    bertviz = _section_bertviz(n_layers, n_heads)
    heatmaps = _section_heatmaps(n_layers, n_heads)
    mask = _section_mask()
    text, text_b = sentence.text, sentence.text_b
    viz_inputs, viz_outputs = bertviz.inputs, bertviz.outputs
    heatmap_inputs = heatmaps.inputs
    heatmap_outputs = [heatmaps.heatmap, mask.raw]
    mask_inputs = [mask.mask_number, heatmaps.hide_special]
    mask_outputs = mask.outputs
    heads_panel.render(ctx, text, text_b, n_layers, n_heads)
    with gr.Accordion("What attention weights are, and are not", open=False):
        gr.Markdown(EXPLAINER)
    for section, shown in mask.folded:
        _drawn_when_open(section, shown)

    run_inputs = [text, text_b, *viz_inputs, *heatmap_inputs, mask.mask_number]
    run_outputs = [*viz_outputs, *heatmap_outputs, *mask_outputs]
    sentence.button.click(handler(ctx, on_run), run_inputs, run_outputs, api_name="attention", concurrency_id="model")
    gr.on([text.submit, text_b.submit], handler(ctx, on_run), run_inputs, run_outputs,
          api_visibility="private", concurrency_id="model")
    gr.on([c.change for c in viz_inputs], handler(ctx, on_viz), viz_inputs, viz_outputs,
          api_visibility="private", trigger_mode="always_last", concurrency_id="model")
    gr.on([c.change for c in heatmap_inputs], handler(ctx, on_heatmap), heatmap_inputs, heatmap_outputs,
          api_visibility="private", trigger_mode="always_last", concurrency_id="model")
    gr.on([c.change for c in mask_inputs], handler(ctx, on_mask), mask_inputs, mask_outputs,
          api_visibility="private", trigger_mode="always_last", concurrency_id="model")
    heatmaps.export_button.click(handler(ctx, on_export_heatmap), heatmap_inputs, heatmaps.export_files,
                                 api_visibility="private", concurrency_id="model")
    mask.export_button.click(handler(ctx, on_export_mask), mask_inputs, mask.export_files,
                             api_visibility="private", concurrency_id="model")


@dataclass
class InputSection:
    """The sentence (or pair) and the button that shows its attention."""

    text: gr.Textbox
    text_b: gr.Textbox
    button: gr.Button


def _section_input() -> InputSection:
    with gr.Row():
        text = gr.Textbox(label="Sentence", value=EXAMPLES[0][0], lines=2, scale=3,
                          info="Type a sentence; put [MASK] in it to see what the mask looks at.")
        text_b = gr.Textbox(label="Second sentence (optional)", lines=2, scale=2,
                            info="A sentence pair, as in next-sentence prediction: [CLS] A [SEP] B [SEP].")
    gr.Examples(EXAMPLES, [text, text_b])
    return InputSection(text, text_b, gr.Button("Show attention", variant="primary"))


@dataclass
class BertvizSection:
    """bertviz: its options (`inputs`) and what `on_viz` returns, in `outputs` order."""

    kind: gr.Radio
    layers: gr.CheckboxGroup
    heads: gr.CheckboxGroup
    note: gr.Markdown
    viz: gr.HTML
    download: gr.DownloadButton

    @property
    def inputs(self) -> list:
        return [self.kind, self.layers, self.heads]

    @property
    def outputs(self) -> list:
        return [self.viz, self.download, self.note]


def _section_bertviz(n_layers: int, n_heads: int) -> BertvizSection:
    gr.Markdown("### bertviz")
    with gr.Row():
        kind = gr.Radio([("Head view", "head"), ("Model view", "model")], value="head", label="View",
                        scale=1)
        layers = gr.CheckboxGroup(list(range(1, n_layers + 1)), label="Layers, 1 = the first (none ticked: automatic)",
                                  scale=2)
        heads = gr.CheckboxGroup(list(range(1, n_heads + 1)), label="Heads, model view, 1 = the first (none: automatic)",
                                 scale=2)
    note = gr.Markdown()
    viz = bertviz_frame.render(served_urls(), elem_id="bertviz-view")
    download = gr.DownloadButton("Download this view as standalone HTML", value=None, size="sm")
    return BertvizSection(kind, layers, heads, note, viz, download)


@dataclass
class HeatmapSection:
    """The heatmaps: their options (`inputs`, in `on_heatmap`'s order), the heatmap and its export
    (the button and the files it fills)."""

    kind: gr.Dropdown
    layer: gr.Slider
    head: gr.Slider
    words: gr.Checkbox
    hide_special: gr.Checkbox
    threshold: gr.Slider
    heatmap: gr.Plot
    export_button: gr.Button
    export_files: gr.File

    @property
    def inputs(self) -> list:
        return [self.kind, self.layer, self.head, self.words, self.hide_special, self.threshold]


def _section_heatmaps(n_layers: int, n_heads: int) -> HeatmapSection:
    gr.Markdown("### Heatmaps")
    with gr.Row():
        kind = gr.Dropdown([(label, key) for key, label in VIEWS.items()], value="head", label="Show",
                           scale=2)
        layer = gr.Slider(1, n_layers, value=n_layers, step=1, label="Layer (1 = the first)", scale=2)
        head = gr.Slider(1, n_heads, value=1, step=1, label="Head (1 = the first)", scale=2)
    with gr.Row():
        words = gr.Checkbox(label="Whole words (merge word pieces)")
        hide_special = gr.Checkbox(label="Hide [CLS]/[SEP]")
        threshold = gr.Slider(0, 1, value=0, step=0.01, label="Hide weights below")
    heatmap = gr.Plot(label="Attention heatmap")
    gr.Markdown(WORDS_HELP)
    export_button, export_files = view_downloads.controls("the heatmap")
    return HeatmapSection(kind, layer, head, words, hide_special, threshold, heatmap, export_button, export_files)


@dataclass
class MaskSection:
    """What the [MASK] looked at: the mask's number, what `on_mask` returns (in `outputs` order), its
    export, and the JSON of the heatmap's numbers below it; each in a folded section (`folded`:
    the section and the components drawn only while it is open)."""

    mask_number: gr.Number
    note: gr.Markdown
    grid: gr.Plot
    predictions: gr.Plot
    export_button: gr.Button
    export_files: gr.File
    raw: gr.JSON
    folded: list[tuple[gr.Accordion, list]]

    @property
    def outputs(self) -> list:
        return [self.grid, self.predictions, self.note]


def _section_mask() -> MaskSection:
    """The [MASK] section, then the accordion that shows the heatmap's numbers (JSON). Both start
    folded, their charts and JSON unmounted (`visible=False`): every answer still carries them (the
    API's /attention is unchanged) and the page draws them when the visitor opens the section."""
    with gr.Accordion("What the [MASK] looked at", open=False) as section:
        mask_number = gr.Number(label="Mask number (1 = first)", value=1, precision=0, minimum=1)
        mask_note = gr.Markdown()
        with gr.Row():
            mask_grid = gr.Plot(label="Most-attended token per layer and head", scale=3, visible=False)
            mask_preds = gr.Plot(label="Fill-mask predictions for this mask", scale=2, visible=False)
        export_button, export_files = view_downloads.controls("what the [MASK] looked at")
    with gr.Accordion("Tokens and the heatmap's numbers (JSON)", open=False) as numbers:
        raw = gr.JSON(visible=False, elem_id="attention-numbers")
    return MaskSection(mask_number, mask_note, mask_grid, mask_preds, export_button, export_files, raw,
                       [(section, [mask_grid, mask_preds]), (numbers, [raw])])


def _drawn_when_open(section: gr.Accordion, shown: list) -> None:
    """Mount `shown` when `section` opens (they draw the value they were last sent) and unmount them
    when it folds, so an answer draws nothing the visitor cannot see. In the browser alone: Gradio
    applies an update (`gr.update`'s `__type__`) returned by an event's JavaScript as it applies the
    server's, and a round trip would add 30-100 ms to the opening (the browser tests open it)."""
    def showing(visible: bool) -> str:
        update = json.dumps({"__type__": "update", "visible": visible})
        return f"() => ({update if len(shown) == 1 else json.dumps([json.loads(update)] * len(shown))})"

    section.expand(None, None, shown, js=showing(True), queue=False, api_visibility="private")
    section.collapse(None, None, shown, js=showing(False), queue=False, api_visibility="private")


def create_demo(store=None, settings: Settings | None = None) -> gr.Blocks:
    """The tab on its own, for running or testing it alone."""
    return standalone_demo("attention", render, store, settings)


# ---------------------------------------------------------------- handlers

def on_run(visitor: Visitor, sentence, second_sentence, bertviz_view, bertviz_layers, bertviz_heads,
           heatmap, layer, head, whole_words, hide_special, threshold, mask_number):
    """Compute the attention of a sentence (or pair) and every view of it; keep only the query.

    Args:
        sentence: the text, e.g. "Paris is the [MASK] of France."; at most the model's length.
        second_sentence: optional second sentence of a pair ([CLS] A [SEP] B [SEP]); empty for one sentence.
        bertviz_view: "head" (bertviz's head view) or "model" (its model view).
        bertviz_layers: the layers bertviz shows, 1 = the first (as every tab counts); empty: chosen to fit.
        bertviz_heads: the heads the model view shows, 1 = a layer's first (as every tab counts); empty: chosen to fit.
        heatmap: "head", "mean_heads", "mean_layers" or "rollout".
        layer: the heatmap's layer, 1 = the first (0 is the embeddings, which attend to nothing).
        head: the heatmap's head in that layer, 1 = the first (the Python API's `view` counts from 0).
        whole_words: merge word pieces into words.
        hide_special: drop [CLS]/[SEP] and renormalise each row.
        threshold: blank weights below this, 0 to 1.
        mask_number: which [MASK] the grid is of, 1 = the first.

    Returns:
        the bertviz view (HTML), its standalone file, a line on what it shows, the heatmap (plotly), its numbers {"tokens", "sentence_b_start", "weights_shape", "heatmap": {"title", "labels", "matrix"}}, the [MASK]'s layers x heads grid (plotly), its predictions (plotly) and a line on the mask.
    """
    lm = visitor.lm
    att = attention(lm, sentence, second_sentence)
    query = Query(weakref.ref(lm), sentence, second_sentence or None)
    visitor.store.keep_result(visitor.session, "attention", query, query.nbytes)
    return (*_viz_outputs(visitor, att, bertviz_view, bertviz_layers, bertviz_heads),
            *_heatmap_outputs(att, heatmap, layer, head, whole_words, hide_special, threshold),
            *_mask_outputs(att, mask_number, hide_special))


def on_viz(visitor: Visitor, bertviz_view, bertviz_layers, bertviz_heads):
    att = recall(visitor)
    if att is None:
        return (gr.skip(),) * 3
    return _viz_outputs(visitor, att, bertviz_view, bertviz_layers, bertviz_heads)


def on_heatmap(visitor: Visitor, heatmap, layer, head, whole_words, hide_special, threshold):
    att = recall(visitor)
    if att is None:
        return (gr.skip(),) * 2
    return _heatmap_outputs(att, heatmap, layer, head, whole_words, hide_special, threshold)


def on_mask(visitor: Visitor, mask_number, hide_special):
    att = recall(visitor)
    return _mask_outputs(att, mask_number, hide_special) if att is not None else (gr.skip(),) * 3


def on_export_heatmap(visitor: Visitor, heatmap, layer, head, whole_words, hide_special, threshold) -> dict:
    """The heatmap as shown, as files: its numbers (CSV, JSON with the tokens) and image (PNG, SVG)."""
    att = _recalled(visitor)
    shown = _shown(att, heatmap, layer, head, whole_words, hide_special)
    return view_downloads.listed(view_files.heatmap(shown, view_downloads.folder(visitor), att.tokens,
                                                    float(threshold or 0)))


def on_export_mask(visitor: Visitor, mask_number, hide_special) -> dict:
    """What the [MASK] looked at, as files: every layer's and head's weights and the grid's image."""
    att = _recalled(visitor)
    if not att.mask_positions:
        raise ValueError("There is no [MASK] in the sentence: put one where a word is missing.")
    index = _mask_index(mask_number, len(att.mask_positions))
    return view_downloads.listed(view_files.mask_grid(att, index, view_downloads.folder(visitor),
                                                      bool(hide_special), first_layer=1, first_head=FIRST_HEAD))


def _shown(att: Attention, heatmap, layer, head, whole_words, hide_special):
    """The heatmap's view, its layer and head (1 = the first, as the page counts) kept within the
    model's (the sliders are the app's)."""
    layer = min(max(int(layer), 1), att.num_layers) - 1
    head = min(max(int(head), FIRST_HEAD), att.num_heads - 1 + FIRST_HEAD) - FIRST_HEAD
    return view(att, heatmap, layer, head, bool(whole_words), bool(hide_special), first_layer=1,
                first_head=FIRST_HEAD)


def _recalled(visitor: Visitor) -> Attention:
    att = recall(visitor)
    if att is None:
        raise ValueError("Press Show attention first: there is nothing to export yet.")
    return att


def recall(visitor: Visitor) -> Attention | None:
    """This session's last attention, recomputed from its kept query; None before the first run."""
    query = visitor.store.result(visitor.session, "attention")
    if query is None:
        return None
    lm = query.model()
    if lm is None:
        raise ValueError("The model of this view was freed (a tuned model evicted or replaced): "
                         "press Show attention again.")
    return attention(lm, query.text, query.text_b)


def served_urls() -> dict[str, str]:
    """The vendored scripts' URLs as this Gradio app serves them (relative to the page)."""
    return script_urls(GRADIO_FILE_ROUTE)


def _serve_vendored_scripts() -> None:
    """Let the app serve assets/vendor (require.js, d3, jQuery) so bertviz needs no CDN. Gradio
    keeps one list of such folders for the process; naming this one again changes nothing."""
    gr.set_static_paths([VENDOR_DIR])


def _model_shape(store: SessionStore) -> tuple[int, int]:
    """(layers, heads) of the base model, for the controls; bert-base's 12 x 12 if none loaded."""
    config = getattr(getattr(store.base, "model", None), "config", None)
    return (getattr(config, "num_hidden_layers", None) or getattr(config, "n_layers", None) or 12,
            getattr(config, "num_attention_heads", None) or getattr(config, "n_heads", None) or 12)


def _viz_outputs(visitor: Visitor, att: Attention, bertviz_view: str, layers, heads):
    """The bertviz view in an iframe, the same view as a download, and a line on what is shown
    (`layers` and `heads` as the page counts them, 1 = the first)."""
    auto_layers, auto_heads = default_selection(att, bertviz_view)
    layers = [x - 1 for x in layers or [] if 1 <= x <= att.num_layers] or auto_layers
    heads = [x - FIRST_HEAD for x in heads or [] if FIRST_HEAD <= x < att.num_heads + FIRST_HEAD] or auto_heads
    start = time.perf_counter()
    urls = served_urls()
    in_page = bertviz_html(att, bertviz_view, layers, heads, script_urls=urls, first_layer=1, first_head=FIRST_HEAD)
    ms = (time.perf_counter() - start) * 1e3
    frame = srcdoc_iframe(in_page, view_height(att, bertviz_view, len(layers)), title=f"bertviz {bertviz_view} view")
    shown_heads = f", heads {_ranges([x + FIRST_HEAD for x in heads])}" if bertviz_view == "model" else ""
    note = (f"Layers {_ranges([x + 1 for x in layers])}{shown_heads} of {att.num_layers} x {att.num_heads}; "
            f"{len(in_page) / 1e3:,.0f} kB built in {ms:.0f} ms. Tick layers/heads to choose others "
            "(fewer keep long inputs responsive).")
    return frame, _export(visitor, standalone(in_page, urls), bertviz_view), note


def _heatmap_outputs(att: Attention, heatmap, layer, head, whole_words, hide_special, threshold):
    shown = _shown(att, heatmap, layer, head, whole_words, hide_special)
    fig = plots.attention_heatmap(shown.labels, shown.matrix, shown.title, shown.boundary,
                                  float(threshold or 0))
    raw = {"tokens": att.tokens, "sentence_b_start": att.sentence_b_start,
           "weights_shape": list(att.weights.shape), "heatmap": {
               "title": shown.title, "labels": shown.labels,
               "matrix": [[round(w, 4) for w in row] for row in shown.matrix.tolist()]}}
    return fig, raw


def _mask_outputs(att: Attention, mask_number, hide_special):
    if not att.mask_positions:
        return None, None, ("No `[MASK]` in the sentence: put one where a word is missing to see "
                            "what it looks at.")
    index = _mask_index(mask_number, len(att.mask_positions))
    hidden = att.special if hide_special else None
    grid = plots.mask_attention_grid(mask_rows(att, index), att.tokens, hidden,
                                     title=f"What [MASK] {index + 1} looked at (token with the most weight)",
                                     first_layer=1, first_head=FIRST_HEAD)
    bars = plots.prediction_bars([att.predictions[index]])
    note = (f"`[MASK]` {index + 1} of {len(att.mask_positions)} (token {att.mask_positions[index]}). "
            "Each cell: the token this mask attends to most in that layer and head; hover for the top 3.")
    return grid, bars, note


def _mask_index(mask_number, n_masks: int) -> int:
    return validate.whole_number(mask_number, "mask number", 1, n_masks) - 1


def _ranges(indices: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    parts, start = [], None
    for i, x in enumerate(indices):
        if start is None:
            start = x
        if i + 1 == len(indices) or indices[i + 1] != x + 1:
            parts.append(f"{start}" if start == x else f"{start}-{x}")
            start = None
    return ", ".join(parts)


def _export(visitor: Visitor, document: str, bertviz_view: str) -> str:
    """Write the standalone HTML for the download button into the session's folder, one file per
    view bertviz_view (Gradio serves a copy): the store deletes it with the session's other files."""
    folder = visitor.store.session_dir(visitor.session) / "bertviz"
    folder.mkdir(exist_ok=True)
    path = folder / f"bertviz-{bertviz_view}-view.html"
    path.write_text(document, encoding="utf-8")
    return str(path)
