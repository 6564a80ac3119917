"""The Corpus search tab: a word in a sentence against every word of a corpus, at one layer, the
nearest contexts listed keyword-in-context.

Its own tab rather than a section of Embeddings: the map compares a few sentences the visitor
types, all in one forward; the search reads a corpus of thousands of lines through an index built
once (a progress bar, a Stop button), and a slider that steps the same query through the layers.
"""
from __future__ import annotations

import html
from pathlib import Path

import gradio as gr

from ... import plots
from ...config import Settings
from ...views import corpus_search, embeddings
from ..parts.cached_examples import ModelExamples
from ..parts.context import AppContext, Visitor, handler, standalone_demo

EXAMPLES = [
    ["I sat on the river bank and watched the water.", "bank"],
    ["The bank lent me money for a house.", "bank"],
    ["He swung the bat and hit the ball.", "bat"],
    ["The box is light enough to carry.", "light"],
]
INTRO = """**What the model treats as the same.** Pick a word in a sentence: its hidden state at a
layer is compared, by cosine similarity, with every word of a corpus at the same layer, and the
nearest are listed in their lines. Step the layer slider and watch the senses separate: near the
embeddings every "bank" is alike; higher up, a river bank's neighbours are river banks. The default
corpus is {lines:,} everyday lines (conversation lines of the ChatterBot corpus, BSD-3-Clause, and lines
written for bertdemo that use one word in two senses); paste or upload your own instead. The first
search of a corpus with a model builds its index (every layer at once; for bert-base and the default
corpus, on a CPU, well under a minute); later searches take milliseconds."""


def render(ctx: AppContext) -> None:
    """Layout, then one line per event."""
    settings = ctx.settings
    n_layers = _layer_count(ctx)
    gr.Markdown(INTRO.format(lines=len(corpus_search.read_corpus(None).lines)))
    with gr.Row():
        sentence = gr.Textbox(label="Sentence", value=EXAMPLES[0][0], lines=2, scale=3)
        with gr.Column(scale=2):
            word = gr.Textbox(label="Word to search for (one the sentence uses)", value=EXAMPLES[0][1])
            layer = gr.Slider(0, n_layers, value=n_layers, step=1, label="Layer (0 = embeddings)")
            top_k = gr.Slider(1, corpus_search.MAX_TOP_K, value=10, step=1, label="Hits")
    with gr.Accordion("Corpus: the default one, or your own lines", open=False):
        corpus = gr.Textbox(label="Your lines, one sentence per line (empty: the default corpus)", lines=5,
                            max_lines=12, info=f"At most {settings.search_max_lines:,} lines and "
                                               f"{settings.search_max_chars:,} characters.")
        upload = gr.File(label="or upload a .txt file", file_types=[".txt"], type="filepath", height=90)
    with gr.Row():
        search = gr.Button("Search the corpus", variant="primary", scale=3)
        stop = gr.Button("Stop building the index", variant="stop", scale=1)
    status = gr.Markdown(render=False)
    hits = gr.HTML(elem_id="search-hits", render=False)
    counts = gr.Plot(label="How often each word occurs in the top hits", elem_id="search-counts", render=False)
    raw = gr.JSON(render=False)
    inputs, outputs = [sentence, word, layer, top_k, corpus], [status, hits, counts, raw]
    # the default corpus at the last layer, cached per model on first use
    ModelExamples(ctx, [[s, w, n_layers, 10, ""] for s, w in EXAMPLES], inputs, outputs,
                  handler(ctx, on_search), "corpus-search", visible_columns=[0, 1], label="Words with two senses")
    status.render()
    hits.render()
    counts.render()
    with gr.Accordion("Raw hits (JSON)", open=False):
        raw.render()
    search.click(handler(ctx, on_search), inputs, outputs, api_name="search_corpus", concurrency_id="model")
    gr.on([sentence.submit, word.submit, layer.release], handler(ctx, on_search), inputs, outputs,
          api_visibility="private", concurrency_id="model")
    stop.click(handler(ctx, on_stop), None, status, api_visibility="private", queue=False)
    upload.upload(handler(ctx, on_upload), upload, corpus, api_visibility="private", queue=False)


def create_demo(store=None, settings: Settings | None = None) -> gr.Blocks:
    """The tab on its own, for running or testing it alone."""
    return standalone_demo("corpus search", render, store, settings)


def on_search(visitor: Visitor, sentence, word, layer, top_k, corpus, progress=gr.Progress()):
    """The words of a corpus whose hidden states at a layer are nearest (cosine) to a word as a sentence uses it.

    Args:
        sentence: a sentence that uses the word, e.g. "I sat on the river bank."
        word: the word to search for, as the sentence spells it (whole word, any case), e.g. "bank"; a word split into pieces is the mean of its pieces.
        layer: 0 = the embeddings, up to the model's number of layers (12 for bert-base) = the last.
        top_k: how many hits, 1 to 50.
        corpus: lines to search, one sentence per line (at most the server's limits, 2,000 lines and 100,000 characters by default); empty searches the default corpus of everyday lines.

    Returns:
        a status line, the hits keyword-in-context (HTML), a bar chart of how often each word occurs in the hits, and the raw result {"sentence", "word", "layer", "corpus", "lines", "occurrences", "hits": [{"line", "text", "word", "start", "end", "position", "similarity"}], "counts": [{"word", "count"}], "left_out" (lines that are the sentence itself, never hits), "built"}.
    """
    lm, settings, stops = visitor.lm, visitor.settings, visitor.engine.search_stops
    stops.clear(visitor.session)

    def building(done: int, total: int) -> None:
        progress(done / total, desc=f"Building the index: {done:,} of {total:,} lines")

    try:
        result = corpus_search.search_corpus(
            lm, sentence, word=word, layer=layer, top_k=top_k, corpus=corpus or None, cache=visitor.engine.search,
            on_progress=building, should_stop=lambda: stops.asked(visitor.session),
            max_lines=settings.search_max_lines, max_chars=settings.search_max_chars)
    except corpus_search.Stopped:
        return "Stopped: the index was not built (nothing of it is kept). Search again to build it.", \
            gr.skip(), gr.skip(), gr.skip()
    finally:
        stops.clear(visitor.session)
    title = f"'{result['word']}' at layer {result['layer']}: words of the top {len(result['hits'])} hits ({lm.name})"
    return status_line(result, lm.name), kwic_html(result), plots.search_word_counts(result, title), result


def on_stop(visitor: Visitor) -> str:
    """Stop this visitor's index build after its current batch."""
    visitor.engine.search_stops.ask(visitor.session)
    return "Stopping the index build…"


def on_upload(visitor: Visitor, file) -> str:
    """A .txt file's text, for the corpus box (refused past the character limit)."""
    limit = visitor.settings.search_max_chars
    if not file:
        return gr.skip()
    try:
        with open(file, encoding="utf-8") as handle:
            text = handle.read(limit + 1)
    except UnicodeDecodeError:
        raise ValueError(f"{Path(file).name} is not UTF-8 text: save it as plain text (.txt, UTF-8).") from None
    if len(text) > limit:
        raise ValueError(f"{Path(file).name} has more than {limit:,} characters: upload a shorter file.")
    return text


def status_line(result: dict, model: str) -> str:
    corpus = "the default corpus" if result["corpus"] == "default" else "your corpus"
    built = " (its index was built now, every layer at once)" if result["built"] else ""
    own = result.get("left_out") or []
    left_out = (f" Left out {'line' if len(own) == 1 else 'lines'} {', '.join(str(i + 1) for i in own)}: "
                "your sentence itself (it would match itself at cosine 1.000)." if own else "")
    return (f"Searched {corpus}: {result['lines']:,} lines, {result['occurrences']:,} words, at layer "
            f"{result['layer']} of {model}{built}.{left_out}")


def kwic_html(result: dict, width: int = 60) -> str:
    """The hits keyword-in-context: the line's text left of the word, the word highlighted, the
    text right of it, and the similarity. Every piece of text is HTML-escaped."""
    rows = []
    for rank, hit in enumerate(result["hits"], 1):
        text, start, end = hit["text"], hit["start"], hit["end"]
        left, right = text[max(0, start - width):start], text[end:end + width]
        left = ("…" if start > width else "") + left
        right += "…" if end + width < len(text) else ""
        rows.append(f"<tr><td class='rank'>{rank}</td><td class='left'>{html.escape(left)}</td>"
                    f"<td class='word'><mark>{html.escape(hit['word'])}</mark></td>"
                    f"<td class='right'>{html.escape(right)}</td><td class='sim'>{hit['similarity']:.3f}</td>"
                    f"<td class='line'>line {hit['line'] + 1}</td></tr>")
    return ("<style>#search-hits table{border-collapse:collapse;width:100%;font-size:0.95em}"
            "#search-hits td{padding:2px 6px;white-space:nowrap}#search-hits td.left{text-align:right;"
            "overflow:hidden;max-width:40ch}#search-hits td.right{overflow:hidden;max-width:40ch}"
            "#search-hits td.rank,#search-hits td.sim,#search-hits td.line{color:#6b7280}</style>"
            "<table><thead><tr><th>#</th><th colspan='3'>context</th><th>cosine</th><th></th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


def _layer_count(ctx: AppContext) -> int:
    lm = ctx.store.base
    return embeddings.layer_count(lm) if lm is not None else 12
