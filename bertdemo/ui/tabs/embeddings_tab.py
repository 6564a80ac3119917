"""The Embeddings tab: one word, a different vector in each context, and the layer where the
contexts pull apart (PCA of the hidden states, with each point's nearest neighbours)."""
from __future__ import annotations

import gradio as gr
import pandas as pd

from ... import plots
from ...config import Settings
from ...views import embeddings
from ..parts.common import empty_table
from ..parts.context import AppContext, Visitor, handler, standalone_demo

EXAMPLES = {
    "bank": ["I sat on the river bank and watched the water.", "We fished from the bank of the river.",
             "The muddy bank of the stream gave way.", "The bank lent me money for a house.",
             "She deposited her salary at the bank.", "The bank raised its interest rates."],
    "bat": ["A bat flew out of the cave at dusk.", "The bat hung upside down in the barn.",
            "Bats hunt insects at night, and this bat was no different.",
            "He swung the bat and hit the ball.", "She bought a new cricket bat.",
            "The baseball bat was made of wood."],
    "light": ["Turn on the light, it is dark in here.", "The light from the lamp was warm.",
              "Sunlight is light that comes from the sun.", "The box is light enough to carry.",
              "She packed a light bag for the trip.", "This jacket is very light."],
}
INTRO = """**One word, many vectors.** BERT gives a word a new vector in every sentence: h_i^l, the
hidden state of token i after layer l (layer 0 is the embeddings, before any attention). Type
sentences (one per line) that use a word in different senses, and see where the senses separate:
at layer 0 every "bank" sits together (the same embedding, only its position differs); in the upper
layers the river banks and the money banks drift apart. The map is PCA of the states at the chosen
layer (centred, the top two components; the axis titles say how much of the variance each keeps);
the table lists each point's nearest other points by cosine similarity in the full hidden space,
where the map's two axes lose nothing."""


def render(ctx: AppContext) -> None:
    """Layout, then one event."""
    n_layers = _layer_count(ctx)
    gr.Markdown(INTRO)
    with gr.Row():
        texts = gr.Textbox(label="Sentences, one per line", value="\n".join(EXAMPLES["bank"]), lines=6, scale=3)
        with gr.Column(scale=1):
            word = gr.Textbox(label="Word to follow (empty: every token)", value="bank")
            layer = gr.Slider(0, n_layers, value=n_layers, step=1, label="Layer (0 = embeddings)")
            button = gr.Button("Map the embeddings", variant="primary")
    gr.Examples([["\n".join(lines), name] for name, lines in EXAMPLES.items()], inputs=[texts, word],
                label="Words with two senses")
    scatter = gr.Plot(label="Hidden states at the chosen layer, on their top two principal components",
                      elem_id="embedding-map")
    # the neighbour cells name a point by its token and line (the rows give each line's words), so
    # that the last neighbour fits a 1280 px page beside the point's own label
    neighbours = gr.Dataframe(empty_table(NEIGHBOUR_COLUMNS), label="Nearest neighbours (cosine, full hidden space)",
                              interactive=False, wrap=True, elem_id="embedding-neighbours",
                              column_widths=["40%"] + [f"{60 // embeddings.NEIGHBOURS}%"] * embeddings.NEIGHBOURS)
    with gr.Accordion("Raw map (JSON)", open=False):
        raw = gr.JSON()
    inputs, outputs = [texts, layer, word], [scatter, neighbours, raw]
    button.click(handler(ctx, on_map), inputs, outputs, api_name="embedding_map", concurrency_id="model")
    layer.release(handler(ctx, on_map), inputs, outputs, api_visibility="private", concurrency_id="model")


def create_demo(store=None, settings: Settings | None = None) -> gr.Blocks:
    """The tab on its own, for running or testing it alone."""
    return standalone_demo("embeddings", render, store, settings)


def on_map(visitor: Visitor, texts, layer, word):
    """Where a word's meaning lives: the hidden states of every token (or of each occurrence of one
    word) at one layer, as a 2-D PCA map, with each point's nearest neighbours by cosine.

    Args:
        texts: sentences, one per line (at least two points in all), e.g. "I sat on the river bank.\\nThe bank lent me money."; at most the server's line and token limits (50 lines, 2,000 tokens by default).
        layer: 0 = the embeddings, up to the model's number of layers (12 for bert-base) = the last.
        word: a word to follow, e.g. "bank" (whole word, any case; split words are the mean of their pieces): lines without it are left out and listed; empty maps every token.

    Returns:
        the scatter (plotly, coloured by sentence; its title lists the lines left out), a table of each point's nearest neighbours, and the raw map {"layer", "word", "points": [{"sentence", "text", "token", "position", "x", "y", "neighbours"}], "explained": [variance share of each axis], "missing": [{"line", "text"}] (lines without the word)}.
    """
    lm = visitor.lm
    result = embeddings.embedding_map(lm, texts, layer=layer, word=word or None,
                                      max_lines=visitor.settings.embedding_max_lines,
                                      max_tokens=visitor.settings.embedding_max_tokens)
    what = f"'{result['word']}'" if result["word"] else "every token"
    title = f"{what} at layer {result['layer']} ({lm.name})"
    return plots.embedding_scatter(result, title), neighbour_frame(result), result


def neighbour_frame(result: dict) -> pd.DataFrame:
    """One row per point: its label, and its nearest points (token and line) with their cosine
    similarity."""
    points = result["points"]
    rows = []
    for point in points:
        near = [f"{short_label(points[n['point']])} {n['similarity']:.2f}" for n in point["neighbours"]]
        rows.append({"point": label(point), **{f"nearest {i + 1}": v for i, v in enumerate(near)}})
    return pd.DataFrame(rows, columns=NEIGHBOUR_COLUMNS).fillna("")  # fewer points than neighbours


NEIGHBOUR_COLUMNS = ["point", *[f"nearest {i + 1}" for i in range(embeddings.NEIGHBOURS)]]


def short_label(point: dict) -> str:
    """"bank (line 2)": a neighbour's token and line."""
    return f"{point['token']} (line {point['sentence'] + 1})"


def label(point: dict) -> str:
    """"bank (line 2: The bank lent me…)": the token and where it comes from."""
    text = point["text"]
    return f"{point['token']} (line {point['sentence'] + 1}: {text[:32]}{'…' if len(text) > 32 else ''})"


def _layer_count(ctx: AppContext) -> int:
    lm = ctx.store.base
    return embeddings.layer_count(lm) if lm is not None else 12
