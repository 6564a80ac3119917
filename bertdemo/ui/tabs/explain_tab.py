"""The "Inside a prediction" tab: what each layer would predict, and which tokens caused the answer
next to what the mask attended to."""
from __future__ import annotations

import html
from dataclasses import dataclass

import gradio as gr

from ... import plots, validate
from ...config import Settings
from ...views import explain
from ...views.attention_views import attention, mask_rows
from ..parts.context import AppContext, Visitor, handler, standalone_demo

EXAMPLES = ["Paris is the [MASK] of France.", "The doctor said that [MASK] would be late.",
            "The man went to the [MASK] to buy a [MASK] of milk."]
INTRO = """**Layer by layer** applies the model's own MLM head to the hidden state after the embeddings
and after every layer (a "logit lens"): where does the final answer appear? **Which tokens caused
it** attributes log p(answer) at one mask to every input token with Captum, shown next to what that
mask attended to in a layer you choose (layer 1 = the first; the heatmap's "embeddings" row is
layer 0): attention says where a head looked, attribution what changed the answer."""
SALIENCY_HELP = """**Reading the colours.** Red tokens raised the probability of the explained token,
blue ones lowered it; hover a token for its value. *Integrated gradients* integrates the gradient
from a baseline (every word replaced by [PAD]; [CLS], [SEP] and the masks kept) to the sentence, so
the values add up to log p(sentence) − log p(baseline), up to the small *delta* shown. *Gradient ×
input* is one backward pass: cheaper, local, and it does not add up to anything. The attention row
is the mask's attention in the chosen layer, averaged over heads."""


def render(ctx: AppContext) -> None:
    """Layout, then one line per event."""
    n_layers = _layer_count(ctx)
    gr.Markdown(INTRO)
    text = gr.Textbox(label="Sentence to look inside (with [MASK]s)", value=EXAMPLES[0], lines=2,
                      info="Type [MASK] (any case) where a word is missing.")
    gr.Examples(EXAMPLES, inputs=text)
    with gr.Row():
        mask_number = gr.Number(label="Which mask (1 = first)", value=1, precision=0, minimum=1)
        top_k = gr.Slider(1, 20, value=5, step=1, label="Tokens per layer")
    layers = _section_layers()
    saliency = _section_saliency(n_layers)
    layers.button.click(handler(ctx, on_layers), [text, mask_number, top_k], layers.outputs,
                        api_name="layer_predictions", concurrency_id="model")
    saliency.button.click(handler(ctx, on_saliency),
                          [text, saliency.target, mask_number, saliency.method, saliency.steps, saliency.layer],
                          saliency.outputs, api_name="saliency", concurrency_id="model")


@dataclass
class LayersSection:
    """Layer by layer: the button and what `on_layers` returns, in `outputs` order."""

    button: gr.Button
    heatmap: gr.Plot
    ranks: gr.Plot
    raw: gr.JSON

    @property
    def outputs(self) -> list:
        return [self.heatmap, self.ranks, self.raw]


def _section_layers() -> LayersSection:
    gr.Markdown("### Layer by layer")
    button = gr.Button("Show predictions after each layer", variant="primary")
    heatmap = gr.Plot(label="Top tokens after each layer, for the chosen mask")
    ranks = gr.Plot(label="Rank of the final answer after each layer")
    gr.Markdown(f"*Caveat.* {explain.LENS_CAVEAT}")
    with gr.Accordion("Raw layer predictions (JSON)", open=False):
        raw = gr.JSON()
    return LayersSection(button, heatmap, ranks, raw)


@dataclass
class SaliencySection:
    """Which tokens caused it: the form (beside the shared sentence and mask number), the button, and
    what `on_saliency` returns, in `outputs` order."""

    target: gr.Textbox
    method: gr.Radio
    steps: gr.Slider
    layer: gr.Slider
    button: gr.Button
    note: gr.Markdown
    coloured: gr.HTML
    raw: gr.JSON

    @property
    def outputs(self) -> list:
        return [self.note, self.coloured, self.raw]


def _section_saliency(n_layers: int) -> SaliencySection:
    gr.Markdown("### Which tokens caused it")
    with gr.Row():
        target = gr.Textbox(label="Explain which word (empty: the top prediction)", value="", scale=2)
        method = gr.Radio([(label, key) for key, label in explain.METHODS.items()],
                          value="integrated_gradients", label="Method", scale=2)
        steps = gr.Slider(1, explain.MAX_STEPS, value=32, step=1, label="Integration steps", scale=2)
        layer = gr.Slider(1, n_layers, value=n_layers, step=1, label="Attention in layer (1 = the first)",
                          scale=2)
    button = gr.Button("Explain this mask", variant="primary")
    note = gr.Markdown()
    coloured = gr.HTML(elem_id="explain-tokens")
    gr.Markdown(SALIENCY_HELP)
    with gr.Accordion("Raw attributions (JSON)", open=False):
        raw = gr.JSON()
    return SaliencySection(target, method, steps, layer, button, note, coloured, raw)


def create_demo(store=None, settings: Settings | None = None) -> gr.Blocks:
    """The tab on its own, for running or testing it alone."""
    return standalone_demo("inside a prediction", render, store, settings)


# ---------------------------------------------------------------- handlers

def on_layers(visitor: Visitor, sentence, mask_number, top_k):
    """What the model would predict at a [MASK] after each layer (logit lens: its own MLM head
    applied to every layer's hidden states), and the final answer's rank per layer.

    Args:
        sentence: text with one or more [MASK] (any case), e.g. "Paris is the [MASK] of France."; at most the server's mask limit (10 by default) and the model's length (512 tokens for BERT).
        mask_number: which [MASK] the heatmap shows, 1 = the first; the raw entries cover every mask.
        top_k: tokens listed per layer, 1 to the server's top-k limit (50 by default).

    Returns:
        a layers x tokens heatmap (plotly) for the chosen mask, a plot of each mask's final answer's rank per layer, and the raw entries: per mask {"mask", "position", "layer_names", "layers": per layer a list of {"token", "token_id", "score"}, ...}; the last layer equals fill_mask.
    """
    lm = visitor.lm
    k = validate.whole_number(top_k, "number of tokens per layer", 1, visitor.settings.max_top_k)
    entries = explain.layer_predictions(lm, sentence, k, max_masks=visitor.settings.max_masks)
    index = validate.whole_number(mask_number, "mask number", 1, len(entries),
                                  " (1 = the first [MASK])", field="mask") - 1
    title = f"[MASK] {index + 1}, {lm.name}: top {k} after each layer (bold: the final answer)"
    return plots.layer_heatmap(entries[index], title), plots.final_rank_lines(entries), entries


def on_saliency(visitor: Visitor, sentence, target, mask_number, method, steps, layer):
    """Which input words caused a prediction at a [MASK]: attribution of log p(target) to every
    input token (Captum), beside the same mask's attention in one layer.

    Args:
        sentence: text with one or more [MASK] (any case), e.g. "Paris is the [MASK] of France.".
        target: the word to explain; empty explains the model's top prediction. A word the tokenizer splits is explained for its first piece.
        mask_number: which [MASK] to explain, 1 = the first.
        method: "integrated_gradients" (baseline: non-special tokens replaced by [PAD]) or "gradient_x_input".
        steps: integration steps for integrated gradients, 1 to 256 (32 is a good default; more is slower and more exact).
        layer: the layer whose attention is shown beside the attributions, 1 = the first (as every tab counts layers: 0 is the embeddings, which have none).

    Returns:
        a summary line, the tokens coloured by attribution beside the attention (HTML), and the raw result {"tokens", "attributions" (one float per token), "delta" (Captum's convergence delta), "target", ...}.
    """
    lm = visitor.lm
    result = explain.saliency(lm, sentence, target or None, mask_number, method, steps,
                              max_masks=visitor.settings.max_masks)
    att = attention(lm, sentence)
    rows = mask_rows(att, result["mask"] - 1)  # (layers, heads, T)
    layer = validate.whole_number(layer, "attention layer", 1, rows.shape[0],
                                  " (1 = the first layer)", field="layer")
    weights = rows[layer - 1].mean(0).tolist()  # (T,): mean over heads
    return _summary(lm.name, result), token_rows(result, weights, layer), result


def _summary(model: str, result: dict) -> str:
    target = result["target"]
    lines = [f"**{html.escape(target['token'])}** at [MASK] {result['mask']} ({model}): "
             f"log p = {result['log_prob']:.3f}, method: {explain.METHODS[result['method']]}"]
    if result["delta"] is not None:
        lines.append(f"baseline log p = {result['baseline_log_prob']:.3f}; attributions sum to "
                     f"{sum(result['attributions']):.3f}, convergence delta {result['delta']:.2e} "
                     f"({result['steps']} steps)")
    if result["note"]:
        lines.append(html.escape(result["note"]))
    return "  \n".join(lines)


def token_rows(result: dict, attention_weights: list[float], layer: int) -> str:
    """Two aligned rows of tokens: attribution (diverging red/blue, centred at 0) and the mask's
    attention in `layer` (1 = the first, as the page counts; white to orange). Hover a token for
    its value; every token is escaped."""
    values = result["attributions"]
    scale = max((abs(v) for v in values), default=0.0) or 1.0
    top = max(attention_weights, default=0.0) or 1.0
    attribution = "".join(_chip(t, _diverging(v / scale), f"{t}: {v:+.4f}", i == result["position"])
                          for i, (t, v) in enumerate(zip(result["tokens"], values)))
    looked = "".join(_chip(t, f"rgba(234,88,12,{w / top:.3f})", f"{t}: {w:.4f}", i == result["position"])
                     for i, (t, w) in enumerate(zip(result["tokens"], attention_weights)))
    explained = html.escape(result["target"]["token"])
    return (f'<div class="explain-rows"><p><b>Attribution to log p({explained})</b></p>'
            f'<div data-row="attribution">{attribution}</div>'
            f"<p><b>Attention of the [MASK], layer {layer}, mean over heads</b></p>"
            f'<div data-row="attention">{looked}</div></div>')


def _chip(token: str, colour: str, hover: str, is_mask: bool) -> str:
    border = "2px solid #111" if is_mask else "1px solid #ddd"
    return (f'<span class="explain-token" title="{html.escape(hover, quote=True)}" style="display:inline-block;'
            f'margin:2px;padding:2px 5px;border-radius:4px;border:{border};background:{colour};'
            f'color:#111">{html.escape(token)}</span>')


def _diverging(x: float) -> str:
    """x in [-1, 1] -> blue (negative) through white to red (positive)."""
    x = max(-1.0, min(1.0, x))
    return f"rgba(220,38,38,{x:.3f})" if x >= 0 else f"rgba(37,99,235,{-x:.3f})"


def _layer_count(ctx: AppContext) -> int:
    """Layers of the app's model, for the slider's range; bert-base's 12 if none is loaded."""
    config = getattr(getattr(getattr(ctx.store, "base", None), "model", None), "config", None)
    return getattr(config, "num_hidden_layers", None) or getattr(config, "n_layers", None) or 12
