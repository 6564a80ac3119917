"""The fill-mask tab: top-k bars per mask, joint completion, candidate words, sentence score, and
the same sentence through two models side by side."""
import math
from dataclasses import dataclass

import gradio as gr
import pandas as pd
from gradio.context import get_render_context

from ... import plots, validate
from ...config import Settings
from ...model.loading import USER_MASK_RE, LoadedModel, allowed_choices, display_name
from ...views import compare, fillmask, reading
from ..parts.cached_examples import ModelExamples
from ..parts.common import plotly_chart
from ..parts.context import AppContext, Visitor, handler, standalone_demo
from ..parts.model_line import model_line
from ..parts.model_picker import pick

MAX_BEAM = 5  # the beam slider's top: each step runs beam x masks rows
JOINT_COLUMNS = ("filled words (p when filled)", "joint log-prob", "fill order", "sentence")
TUNED_CHOICE = "Your fine-tuned model"
COMPARE_COLUMNS = ("mask", "token", "p (A)", "p (B)", "change (B - A)")

EXAMPLES = [  # the article's three sentences first
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


def render(ctx: AppContext) -> None:
    """The tab's components and events, inside the current Blocks/Tab context."""
    settings = ctx.settings
    model_info = gr.Markdown(model_line(ctx.store))
    form = _section_input(settings)
    text, top_k, beam = form.text, form.top_k, form.beam
    bars = gr.Plot(label="Predictions per mask", render=False)
    joint = gr.Dataframe(label="Joint completions: masks filled most-confident first, re-run each time",
                         headers=list(JOINT_COLUMNS), interactive=False, render=False, wrap=True,
                         elem_id="joint-completions",
                         column_widths=["22%", "10%", "18%", "50%"])  # the words first: a long sentence wraps
    raw = gr.JSON(render=False)
    # A click on an example answers at once: its results are cached, per model, on first use.
    ModelExamples(ctx, [[e, 5, 3] for e in EXAMPLES], [text, top_k, beam], [bars, raw, model_info, joint],
                  handler(ctx, on_example), "fill-mask", visible_columns=[0])
    bars.render()
    joint.render()
    with gr.Accordion("Raw predictions (JSON)", open=False):
        raw.render()
    candidates = _section_candidates()
    sentence_score = _section_sentence_score()
    comparison = _section_compare(settings)

    # Predictions get their own concurrency group, wide enough for the micro-batcher to gather a
    # crowd; the rest share the "model" group with the other tabs' model calls.
    fill = dict(concurrency_id="fill_mask", concurrency_limit=settings.max_batch)
    form.predict.click(handler(ctx, on_predict), [text, top_k], [bars, raw, model_info], api_name="fill_mask",
                  **fill).then(handler(ctx, on_joint), [text, beam], joint, api_name="fill_jointly",
                               concurrency_id="model")
    text.submit(handler(ctx, on_predict), [text, top_k], [bars, raw, model_info], api_visibility="private",
                **fill).then(handler(ctx, on_joint), [text, beam], joint, api_visibility="private",
                             concurrency_id="model")
    candidates.button.click(handler(ctx, on_candidates), [text, candidates.words, candidates.mask_number],
                            candidates.table, api_name="score_candidates", concurrency_id="model")
    sentence_score.button.click(handler(ctx, on_sentence_score), text, sentence_score.outputs,
                                api_name="sentence_score", concurrency_id="model")
    comparison.button.click(handler(ctx, on_compare), [text, comparison.other_model, top_k], comparison.outputs,
                            api_name="compare_models", concurrency_id="model")
    text.change(_word_segments, text, form.words, api_visibility="private", queue=False)
    form.words.select(on_word_click, text, text, api_visibility="private")
    tab = get_render_context()
    if isinstance(tab, gr.Tab):  # back on this tab: the Fine-tune tab may have switched the model
        tab.select(handler(ctx, on_show), None, model_info, api_visibility="private", queue=False)


@dataclass
class InputSection:
    """The sentence, its clickable words, the two sliders and the Predict button."""

    text: gr.Textbox
    words: gr.HighlightedText
    top_k: gr.Slider
    beam: gr.Slider
    predict: gr.Button


def _section_input(settings: Settings) -> InputSection:
    text = gr.Textbox(label="Sentence with [MASK]s", value=EXAMPLES[0], lines=2,
                      info=f"Type [MASK] (any case) where a word is missing; at most {settings.max_masks}.")
    words = gr.HighlightedText(label="Click a word to turn it into [MASK]", combine_adjacent=False,
                               color_map={"MASK": "#c2410c"}, show_legend=False,  # orange 700: 5.2:1
                               value=_word_segments(EXAMPLES[0]))
    with gr.Row():
        top_k = gr.Slider(1, settings.max_top_k, value=5, step=1, label="Top-k per mask")
        beam = gr.Slider(1, MAX_BEAM, value=3, step=1, label="Beam size (joint completion)")
    return InputSection(text, words, top_k, beam, gr.Button("Predict", variant="primary"))


@dataclass
class CandidatesSection:
    """Candidate words at a mask: the words, the mask's number, the button and `on_candidates`' table."""

    words: gr.Textbox
    mask_number: gr.Number
    button: gr.Button
    table: gr.Dataframe


def _section_candidates() -> CandidatesSection:
    with gr.Accordion("Score candidate words at a mask", open=True):
        with gr.Row():
            candidates = gr.Textbox(label="Candidate words, comma separated", value="capital, city, heart")
            mask_number = gr.Number(label="Mask number (1 = first)", value=1, precision=0, minimum=1)
        score_btn = gr.Button("Score candidates")
        table = gr.Dataframe(interactive=False, label="Candidates, best first", headers=list(CANDIDATE_COLUMNS))
        gr.Markdown(CANDIDATE_HELP)
    return CandidatesSection(candidates, mask_number, score_btn, table)


@dataclass
class SentenceScoreSection:
    """The sentence score: its button and what `on_sentence_score` returns, in `outputs` order."""

    button: gr.Button
    summary: gr.Markdown
    plot: gr.Plot

    @property
    def outputs(self) -> list:
        return [self.summary, self.plot]


def _section_sentence_score() -> SentenceScoreSection:
    with gr.Accordion("Sentence score (pseudo-log-likelihood)", open=False):
        gr.Markdown("Each token is masked in turn and scored given the rest (Salazar et al. 2020), "
                    "all copies in one batched pass. With masks in the text, the best joint "
                    "completion is scored.")
        button = gr.Button("Score the sentence")
        summary = gr.Markdown()
        plot = gr.Plot(label="Each token's log-probability")
    return SentenceScoreSection(button, summary, plot)


@dataclass
class CompareSection:
    """Two models side by side: the second model, the button, and what `on_compare` returns, in
    `outputs` order."""

    other_model: gr.Dropdown
    button: gr.Button
    note: gr.Markdown
    bars: gr.Plot
    table: gr.Dataframe
    score_changes: gr.Plot

    @property
    def outputs(self) -> list:
        return [self.note, self.bars, self.table, self.score_changes]


def _section_compare(settings: Settings) -> CompareSection:
    with gr.Accordion("Compare with another model", open=False):
        gr.Markdown("The sentence above through two models: **A**, the model your tabs use (your "
                    "base model when B is your fine-tuned one), and **B**, chosen here. Per mask, "
                    "each model's top-k and every token's change in probability; then both "
                    "sentence scores.")
        with gr.Row():
            other_model = gr.Dropdown([TUNED_CHOICE, *allowed_choices(settings.allowed_models)], value=TUNED_CHOICE,
                                label="Compare with (B)", scale=3)
            button = gr.Button("Compare", scale=1)
        note = gr.Markdown()
        bars = gr.Plot(label="Probability under A and B, per mask")
        table = gr.Dataframe(interactive=False, headers=list(COMPARE_COLUMNS),
                             label="Tokens of either top-k: probability under each model and the change")
        score_changes = gr.Plot(label="Sentence score: change in each token's log-probability (B - A)")
    return CompareSection(other_model, button, note, bars, table, score_changes)


def create_demo(store=None, settings: Settings | None = None) -> gr.Blocks:
    """The tab on its own, for running or testing it alone."""
    return standalone_demo("fill mask", render, store, settings)


# ---------------------------------------------------------------- handlers

async def on_predict(visitor: Visitor, sentence, top_k):
    """BERT's top-k predictions for every [MASK] in a sentence, each filled on its own.

    Args:
        sentence: text with one or more [MASK] (any case), e.g. "Paris is the [MASK] of France."; at most the server's mask limit (10 by default) and the model's length (512 tokens for BERT).
        top_k: predictions per mask, a whole number from 1 to the server's top-k limit (50 by default).

    Returns:
        a bar chart (plotly), the predictions (one list per mask, best first, of {"token", "token_id", "score"} where score is the probability), and the model line (it warns when the model's MLM head is untrained, and when the sentence is in a script or words the model cannot read).
    """
    settings = visitor.settings
    # awaited on the server's event loop: a crowd's requests cost it no hand-off to a worker thread
    predictions = await visitor.engine.batcher.fill_mask_async(visitor.lm, sentence, top_k, max_masks=settings.max_masks,
                                                               max_top_k=settings.max_top_k)
    return predicted(visitor, sentence, predictions)


def predict_now(visitor: Visitor, sentence, top_k):
    """`on_predict` for a caller in a thread (an example's click): waits for the micro-batcher."""
    settings = visitor.settings
    predictions = visitor.engine.batcher.fill_mask(visitor.lm, sentence, top_k, max_masks=settings.max_masks,
                                                   max_top_k=settings.max_top_k)
    return predicted(visitor, sentence, predictions)


def predicted(visitor: Visitor, sentence: str, predictions: list[list[dict]]):
    """Predict's outputs for `predictions`: the bar chart, the predictions, the model line (with
    the reading notice when the model cannot read the sentence)."""
    notice = reading.reading_notice(visitor.lm, sentence)
    line = on_show(visitor) + (f"\n\n{reading_words(notice, visitor.lm.name)}" if notice else "")
    return plotly_chart(plots.prediction_bars_json(predictions)), predictions, line


def reading_words(notice: reading.ReadingNotice, model: str) -> str:
    """A `reading.ReadingNotice` as the page says it."""
    share = f" ({notice.reads_share:.0%} of its vocabulary)" if notice.reads_share is not None else ""
    if notice.script is not None:
        why = f"this sentence is in **{notice.script} script**, {notice.script_share:.1%} of its vocabulary"
    else:
        why = f"{notice.unknown} of the {notice.words} words of this sentence come out as unknown pieces ([UNK])"
    return f"⚠️ **{model} reads mostly {notice.reads}**{share}: {why}, so its predictions here mean little."


def on_example(visitor: Visitor, sentence, top_k, beam_size):
    """An example's predictions and joint completions, as Predict shows them (cached per model)."""
    return (*predict_now(visitor, sentence, top_k), on_joint(visitor, sentence, beam_size))


def on_joint(visitor: Visitor, sentence, beam_size) -> pd.DataFrame:
    """Completions of all [MASK]s together: beam search filling the most confident mask first and
    re-running the model after each fill, so later words fit earlier ones.

    Args:
        sentence: text with one or more [MASK] (any case), e.g. "The man went to the [MASK] to buy a [MASK] of milk.".
        beam_size: completions kept at each step and returned, a whole number from 1 to 5.

    Returns:
        a table with one row per completion: the words filled in (each with its probability when filled), the joint log-probability, the order the masks were filled in, and the filled sentence.
    """
    beam_size = validate.whole_number(beam_size, "beam size", 1, MAX_BEAM)
    results = fillmask.fill_jointly(visitor.lm, sentence, beam_size, max_masks=visitor.settings.max_masks)
    return pd.DataFrame([_joint_row(r) for r in results], columns=list(JOINT_COLUMNS))


def on_candidates(visitor: Visitor, sentence, candidates, mask_number) -> pd.DataFrame:
    """How likely given words are at one [MASK], whole words included: a word of n pieces is
    scored by the chain rule over its pieces, not by its first piece alone.

    Args:
        sentence: text with one or more [MASK] (any case), e.g. "Paris is the [MASK] of France.".
        candidates: candidate words, comma separated, e.g. "capital, city, heart"; at most the server's limit (10 by default).
        mask_number: which [MASK] to score at, 1 = the first.

    Returns:
        a table, best first: word, its pieces, log-probability of the whole word, mean per piece, and the first piece's probability (what pipeline("fill-mask", targets=...) reports).
    """
    settings = visitor.settings
    index = validate.whole_number(mask_number, "mask number", 1, settings.max_masks, ": 1 for the first [MASK]") - 1
    results = fillmask.score_candidates(visitor.lm, sentence, candidates, index,
                                        settings.max_candidates, settings.max_masks)
    return pd.DataFrame([_candidate_row(r) for r in results])


def on_sentence_score(visitor: Visitor, sentence):
    """How natural a sentence is to the model: its pseudo-log-likelihood (each token masked in
    turn and scored given the rest, Salazar et al. 2020). With [MASK]s, its best joint completion
    is scored, and the summary says so, naming the words filled in.

    Args:
        sentence: the text to score, up to the model's length (512 tokens for BERT).

    Returns:
        a summary line with the PLL and pseudo-perplexity (higher PLL, lower perplexity: more natural), and a bar chart of each token's log-probability.
    """
    lm = visitor.lm
    filled = ""
    if USER_MASK_RE.search(sentence or ""):
        best = fillmask.fill_jointly(lm, sentence, 1, max_masks=visitor.settings.max_masks)[0]
        sentence, words = best["text"], [f["token"].strip() for f in sorted(best["fills"], key=lambda f: f["mask"])]
        filled = (f"The [MASK]{'s were' if len(words) > 1 else ' was'} filled with the model's own top guess "
                  f"({', '.join(words)}: its best joint completion) before scoring, so this scores the model's "
                  "sentence, not yours.\n\n")
    result = fillmask.sentence_score(lm, sentence)
    summary = (f"{filled}**{sentence}** — PLL = {result['pll']:.2f}, pseudo-perplexity = "
               f"{result['pseudo_perplexity']:.2f} over {len(result['tokens'])} tokens")
    return summary, plots.token_scores(result["tokens"], result["log_probs"], "PLL by token")


def on_compare(visitor: Visitor, sentence, other_model, top_k):
    """The sentence through two models side by side: both top-k per [MASK], each token's change in
    probability, and both sentence scores (pseudo-log-likelihood).

    Args:
        sentence: text with one or more [MASK] (any case), e.g. "Paris is the [MASK] of France.".
        other_model: model B: "Your fine-tuned model" (this session's, compared with its base model) or a model this server offers (compared with the model this session uses).
        top_k: predictions per mask and model, a whole number from 1 to the server's top-k limit (50 by default).

    Returns:
        a line naming A and B with both sentence scores, grouped bars of each token's probability under A and B per mask, a table (mask, token, p under A, p under B, change), and the per-token change in log-probability of the sentence score (None when the two tokenizers cut the sentence differently).
    """
    lm, other_lm = _compared_models(visitor, other_model)
    max_masks = visitor.settings.max_masks
    predictions = compare.compare_predictions(lm, other_lm, sentence, top_k, max_masks=max_masks,
                                              max_top_k=visitor.settings.max_top_k)
    scores = compare.compare_scores(lm, other_lm, sentence, max_masks=max_masks)
    for result in (predictions, scores):  # a folder by its name only: no server path in the page
        result["models"] = [display_name(name) for name in result["models"]]
    rows = [[m["mask"], c["token"], *(_rounded(c[key]) for key in ("a", "b", "change"))]
            for m in predictions["masks"] for c in m["changes"]]
    changes = scores["token_changes"]
    score_plot = (plots.token_scores(scores["a"]["tokens"], changes, "Change in log p(token | rest), B - A")
                  if changes is not None else None)
    blank = any(None in row for row in rows)
    return (_compare_note(scores, blank), plots.comparison_bars(predictions),
            pd.DataFrame(rows, columns=list(COMPARE_COLUMNS)), score_plot)


def _compared_models(visitor: Visitor, other_model) -> tuple[LoadedModel, LoadedModel]:
    """(A, B): the tuned model against its base, or the session's model against a listed one."""
    if other_model == TUNED_CHOICE:
        tuned = visitor.store.tuned(visitor.session)
        if tuned is None:
            raise ValueError("No fine-tuned model in this session yet: fine-tune one in the Fine-tune "
                             "tab, or compare with a model from the list.")
        return visitor.store.base_for(visitor.session), tuned
    return visitor.lm, pick(visitor, other_model)


def _compare_note(scores: dict, blank: bool) -> str:
    a, b = scores["models"]
    cut = ("" if scores["token_changes"] is not None
           else " The two tokenizers cut it differently: no per-token change.")
    cut += " A blank cell: that model's vocabulary has no such token." if blank else ""
    return (f"**A** = {a}, **B** = {b}. Sentence score of *{scores['sentence']}*: PLL "
            f"{scores['a']['pll']:.2f} (A) vs {scores['b']['pll']:.2f} (B), change "
            f"{scores['change']:+.2f} (higher is more natural to the model).{cut}")


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def on_show(visitor: Visitor) -> str:
    return model_line(visitor.store, visitor.session)


def on_word_click(sentence, evt: gr.SelectData) -> str:
    """The sentence with the clicked word turned into [MASK] (unchanged if nothing fits)."""
    if evt.index is None:
        return sentence
    index = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
    try:
        return fillmask.mask_word(sentence, int(index))
    except ValueError:
        return sentence


def _word_segments(sentence: str) -> list[tuple[str, str | None]]:
    """The sentence cut after each word (trailing spaces kept), masks labelled, for clicking."""
    words = fillmask.split_words(sentence or "")
    ends = [w[1] for w in words[1:]] + [len(sentence or "")]
    return [(sentence[start:end] if i else sentence[:end], "MASK" if w.upper() == "[MASK]" else None)
            for i, ((w, start, _), end) in enumerate(zip(words, ends))]


def _joint_row(result: dict) -> list:
    words = ", ".join(f"{f['token'].strip()} {math.exp(f['log_prob']):.0%}"
                      for f in sorted(result["fills"], key=lambda f: f["mask"]))
    order = " → ".join(f"#{f['mask'] + 1}={f['token'].strip()}"
                       for f in sorted(result["fills"], key=lambda f: f["step"]))
    return [words, round(result["log_prob"], 4), order, result["text"]]


CANDIDATE_COLUMNS = ("word", "pieces", "log p(word)", "mean log p per piece",
                     "pipeline-style p(first piece)")


def _candidate_row(result: dict) -> dict:
    values = (result["word"], " ".join(result["pieces"]), round(result["log_prob"], 4),
              round(result["mean_log_prob"], 4), round(result["first_piece_prob"], 6))
    return dict(zip(CANDIDATE_COLUMNS, values))
