"""The fill-mask tab: top-k bars per mask, joint completion, candidate words, sentence score."""
import gradio as gr
import pandas as pd
from gradio.context import get_render_context

from .. import fillmask, plots
from ..batching import MicroBatcher
from ..config import Settings
from ..models import USER_MASK_RE
from ..sessions import SessionStore
from .common import friendly_errors, session_id

EXAMPLES = [  # the seed article's three sentences first
    "Paris is the [MASK] of France.",
    "The Eiffel [MASK] is a famous landmark.",
    "La Tour Eiffel est située à [MASK].",
    "The man went to the [MASK] to buy a [MASK] of milk.",
    "BERT learns by predicting [MASK] words from both sides.",
]
CANDIDATE_HELP = """**How candidate words are scored.** A word that the tokenizer splits into *n* pieces
replaces the `[MASK]` by *n* pieces, and its score is the chain rule from left to right:
log p(piece 1 | all *n* masked) + log p(piece 2 | piece 1, rest masked) + … — the probability of the
whole word, not just its first piece. The *pipeline-style* column is what
`pipeline("fill-mask", targets=[...])` reports: the probability of the first piece alone at the
single mask, which overrates long words that start with a common piece."""


def render(store: SessionStore, settings: Settings) -> None:
    """Build the tab's components and events inside the current Blocks/Tab context."""
    tab = get_render_context()
    model_info = gr.Markdown(_model_line(store, None))
    text = gr.Textbox(label="Sentence with [MASK]s", value=EXAMPLES[0], lines=2,
                      info=f"Type [MASK] (any case) where a word is missing; at most {settings.max_masks}.")
    words = gr.HighlightedText(label="Click a word to turn it into [MASK]", combine_adjacent=False,
                               color_map={"MASK": "orange"}, show_legend=False,
                               value=_word_segments(EXAMPLES[0]))
    gr.Examples(EXAMPLES, inputs=text)
    with gr.Row():
        top_k = gr.Slider(1, settings.max_top_k, value=5, step=1, label="Top-k per mask")
        beam = gr.Slider(1, 5, value=3, step=1, label="Beam size (joint completion)")
    predict = gr.Button("Predict", variant="primary")
    bars = gr.Plot(label="Predictions per mask")
    joint = gr.Dataframe(label="Joint completions: masks filled most-confident first, re-run each time",
                         headers=["sentence", "joint log-prob", "fill order"], interactive=False)
    with gr.Accordion("Raw predictions (JSON)", open=False):
        raw = gr.JSON()
    with gr.Accordion("Score candidate words at a mask", open=True):
        with gr.Row():
            candidates = gr.Textbox(label="Candidate words, comma separated", value="capital, city, heart")
            mask_number = gr.Number(label="Mask number (1 = first)", value=1, precision=0, minimum=1)
        score_btn = gr.Button("Score candidates")
        candidate_table = gr.Dataframe(interactive=False, label="Candidates, best first",
                                       headers=list(CANDIDATE_COLUMNS))
        gr.Markdown(CANDIDATE_HELP)
    with gr.Accordion("Sentence score (pseudo-log-likelihood)", open=False):
        gr.Markdown("Each token is masked in turn and scored given the rest (Salazar et al. 2020), "
                    "all copies in one batched pass. With masks in the text, the best joint "
                    "completion is scored.")
        pll_btn = gr.Button("Score the sentence")
        pll_summary = gr.Markdown()
        pll_plot = gr.Plot(label="Each token's log-probability")

    batcher = MicroBatcher(max_batch=settings.max_batch)  # shared by all visitors of this tab

    def lm_for(request):
        return store.for_session(session_id(request))

    @friendly_errors
    def on_predict(sentence, k, request: gr.Request):
        lm = lm_for(request)
        predictions = batcher.fill_mask(lm, sentence, _whole(k, "Top-k"), max_masks=settings.max_masks)
        return plots.prediction_bars(predictions), predictions, _model_line(store, request)

    @friendly_errors
    def on_joint(sentence, beam_size, request: gr.Request):
        results = fillmask.fill_jointly(lm_for(request), sentence, _whole(beam_size, "Beam size"),
                                        max_masks=settings.max_masks)
        return pd.DataFrame([_joint_row(r) for r in results], columns=joint.headers)

    @friendly_errors
    def on_candidates(sentence, words_text, number, request: gr.Request):
        index = _mask_index(number)
        results = fillmask.score_candidates(lm_for(request), sentence, words_text, index,
                                            settings.max_candidates, settings.max_masks)
        return pd.DataFrame([_candidate_row(r) for r in results])

    @friendly_errors
    def on_sentence_score(sentence, request: gr.Request):
        lm = lm_for(request)
        if USER_MASK_RE.search(sentence or ""):
            sentence = fillmask.fill_jointly(lm, sentence, 1, max_masks=settings.max_masks)[0]["text"]
        result = fillmask.sentence_score(lm, sentence)
        summary = (f"**{sentence}** — PLL = {result['pll']:.2f}, pseudo-perplexity = "
                   f"{result['pseudo_perplexity']:.2f} over {len(result['tokens'])} tokens")
        return summary, plots.token_scores(result["tokens"], result["log_probs"], "PLL by token")

    def on_show(request: gr.Request):
        return _model_line(store, request)

    def on_word_click(sentence, evt: gr.SelectData):
        if evt.index is None:
            return sentence
        index = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        try:
            return fillmask.mask_word(sentence, int(index))
        except ValueError:
            return sentence

    # Its own concurrency group, wide enough for the micro-batcher to gather a crowd.
    predict.click(on_predict, [text, top_k], [bars, raw, model_info], api_name="fill_mask",
                  concurrency_id="fill_mask", concurrency_limit=settings.max_batch).then(on_joint, [text, beam], joint,
                                               api_name="fill_jointly", concurrency_id="model")
    text.submit(on_predict, [text, top_k], [bars, raw, model_info], api_visibility="private",
                concurrency_id="fill_mask", concurrency_limit=settings.max_batch).then(on_joint, [text, beam], joint,
                                             api_visibility="private", concurrency_id="model")
    score_btn.click(on_candidates, [text, candidates, mask_number], candidate_table,
                    api_name="score_candidates", concurrency_id="model")
    pll_btn.click(on_sentence_score, text, [pll_summary, pll_plot], api_name="sentence_score",
                  concurrency_id="model")
    text.change(_word_segments, text, words, api_visibility="private", queue=False)
    words.select(on_word_click, text, text, api_visibility="private")
    if isinstance(tab, gr.Tab):  # back on this tab: the Fine-tune tab may have switched the model
        tab.select(on_show, None, model_info, api_visibility="private", queue=False)


def create_demo(store: SessionStore, settings: Settings) -> gr.Blocks:
    """The tab on its own, for running or testing it alone."""
    with gr.Blocks(title="bertdemo: fill mask") as demo:
        render(store, settings)
    return demo


def _model_line(store: SessionStore, request) -> str:
    try:
        lm = store.for_session(session_id(request))
    except ValueError as err:
        return f"⚠️ {err}"
    return f"Model: **{lm.name}** on `{lm.device}`"


def _word_segments(sentence: str) -> list[tuple[str, str | None]]:
    """The sentence cut after each word (trailing spaces kept), masks labelled, for clicking."""
    words = fillmask.split_words(sentence or "")
    ends = [w[1] for w in words[1:]] + [len(sentence or "")]
    return [(sentence[start:end] if i else sentence[:end], "MASK" if w.upper() == "[MASK]" else None)
            for i, ((w, start, _), end) in enumerate(zip(words, ends))]


def _whole(value, name: str) -> int:
    """A slider value as an int; API callers can send anything, so check it."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a whole number.") from None
    if number != number or abs(number) == float("inf") or not number.is_integer():
        raise ValueError(f"{name} must be a whole number, got {value!r}.")
    return int(number)


def _mask_index(number) -> int:
    try:
        value = float(number)
    except (TypeError, ValueError):
        raise ValueError("Mask number must be a whole number: 1 for the first [MASK].") from None
    if value != value or value < 1 or value > 1000 or not value.is_integer():
        raise ValueError("Mask number must be a whole number: 1 for the first [MASK].")
    return int(value) - 1


def _joint_row(result: dict) -> list:
    order = " → ".join(f"#{f['mask'] + 1}={f['token'].strip()}"
                       for f in sorted(result["fills"], key=lambda f: f["step"]))
    return [result["text"], round(result["log_prob"], 4), order]


CANDIDATE_COLUMNS = ("word", "pieces", "log p(word)", "mean log p per piece",
                     "pipeline-style p(first piece)")


def _candidate_row(result: dict) -> dict:
    values = (result["word"], " ".join(result["pieces"]), round(result["log_prob"], 4),
              round(result["mean_log_prob"], 4), round(result["first_piece_prob"], 6))
    return dict(zip(CANDIDATE_COLUMNS, values))
