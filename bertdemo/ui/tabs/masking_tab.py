"""The mask-sampling tab: how MLM corrupts its input, static vs dynamic masking, the 80/10/10 law,
and the article's `mask_tokens` next to transformers' collator."""
import html
import math
from dataclasses import dataclass

import gradio as gr
import pandas as pd

from ... import plots
from ...config import Settings
from ...training import experiments
from ...training.experiments import LabellingForm
from ...views import masking
from ..parts import live_run
from ..parts.common import empty_table
from ..parts.context import AppContext, Visitor, handler, standalone_demo

EXAMPLES = [
    "Paris is the capital of France.",
    "The Eiffel tower is a famous landmark.",
    "Unbelievably, BERT learns by predicting masked words from both sides.",
]
INTRO = """**How MLM corrupts its input.** Each token that is not special is *chosen* with probability
`mlm_probability` (15%). A chosen token is then replaced by `[MASK]` (80%), by a random token (10%) or
left as it is (10%), and the loss is computed **only on the chosen tokens**: their label is their own
id, every other label is `-100`, which the loss ignores. Special tokens (`[CLS]`, `[SEP]`, `[PAD]`,
`[UNK]`, a typed `[MASK]`) are never chosen. Every draw here is made by transformers'
`DataCollatorForLanguageModeling` with the seed below: a Trainer using it sees exactly this.
A random replacement is drawn from the whole vocabulary, so once in a while it draws the original
token; it is still shown as *random*, because that is the draw that was made."""
STATIC_HELP = """**Static** masking (original BERT) draws the masks once, when the data is prepared, and
shows the model the same corrupted sentence every epoch (BERT made 10 copies of its data, so each
sentence had 10 masks over 40 epochs: set *masks drawn in advance* to 10). **Dynamic** masking
(RoBERTa) draws a fresh mask each time: epoch *e* uses seed + *e*. The curve measures, over thousands
of copies of the text, the share of tokens chosen at least once after *n* epochs: static stays at
1 − (1 − p)^min(n, copies), which is *p* with one mask; dynamic follows 1 − (1 − p)^n."""
ARTICLE_HELP = """The `mask_tokens` of the article *Fine-Tuning BERT with Masked Language Modeling: A
Comprehensive Guide* (kept verbatim in `bertdemo.views.masking.article_mask_tokens`) on the same text,
tokenized its way (`padding="max_length", max_length=20, truncation=True`), next to the collator.
What it gets wrong: it sets the labels of the **masked** tokens to `-100`, so the loss is
computed on the tokens the model can see (copying them is enough); it can mask `[CLS]`, `[SEP]` and
`[PAD]` and scores them; and every chosen token becomes `[MASK]` (no 80/10/10). With the same seed
both usually pick the same positions (both compare uniform draws with 0.15), so the rows differ in
what is scored."""
ARTICLE_TEXT = ("Paris is the capital of France. The Eiffel Tower is a famous landmark. "
                "La Tour Eiffel est située à Paris.")
CONSEQUENCE_HELP = """**The consequence, in numbers.** Two short fine-tunes of this session's model on
the text above, with the same seed, data and steps: one labelled by the article's `mask_tokens`, one
by the collator. Each training loss is its own labelling's; both models are then scored on the same
fixed, properly masked copies of the text (with fewer than 4 sentences these are the training
sentences themselves). The models are not kept."""


def render(ctx: AppContext) -> None:
    """Build the tab's components and events inside the current Blocks/Tab context."""
    gr.Markdown(INTRO)
    sample = _section_sample()
    epochs = _section_epochs()
    law = _section_law()
    article = _section_article(sample.text)
    consequence = article.consequence

    text, seed = sample.text, sample.seed
    inputs = sample.inputs
    sample.button.click(handler(ctx, on_sample), inputs, sample.outputs, api_name="mask_sample")
    text.submit(handler(ctx, on_sample), inputs, sample.outputs, api_visibility="private")
    sample.resample.click(_next_seed, seed, seed, api_visibility="private", queue=False).then(
        handler(ctx, on_sample), inputs, sample.outputs, api_visibility="private")
    epochs.button.click(handler(ctx, on_epochs), inputs + [epochs.epochs, epochs.copies], epochs.outputs,
                        api_name="static_vs_dynamic")
    law.button.click(handler(ctx, on_law), inputs + [law.draws], law.outputs, api_name="masking_law")
    article.button.click(handler(ctx, on_article), inputs + [article.max_length], article.outputs,
                         api_name="article_snippet", concurrency_id="model")
    # Two fine-tunes: they share the Fine-tune tab's slot, so the server never runs more at once.
    live_run.wire(ctx, "article_finetune", consequence.button,
                  dict(text=text, seed=seed, steps=consequence.steps, learning_rate=consequence.learning_rate),
                  consequence.outputs, on_consequence)
    consequence.stop.click(handler(ctx, on_stop), None, None, api_visibility="private", queue=False)


@dataclass
class SampleSection:
    """One seeded draw: the text, the seed, the rates, and what `on_sample` returns, in `outputs` order."""

    text: gr.Textbox
    seed: gr.Number
    p: gr.Slider
    p_mask: gr.Slider
    p_random: gr.Slider
    whole_word: gr.Checkbox
    button: gr.Button
    resample: gr.Button
    strip: gr.HighlightedText
    table: gr.HTML
    counts: gr.Dataframe
    rows: gr.JSON

    @property
    def inputs(self) -> list:
        """What every handler of the tab reads first: the text, the seed and the four rates."""
        return [self.text, self.seed, self.p, self.p_mask, self.p_random, self.whole_word]

    @property
    def outputs(self) -> list:
        return [self.strip, self.table, self.counts, self.rows]


def _section_sample() -> SampleSection:
    text = gr.Textbox(label="Text", value=EXAMPLES[0], lines=2,
                      info=f"At most {masking.MAX_TEXT_TOKENS} tokens.")
    gr.Examples(EXAMPLES, inputs=text)
    with gr.Row():
        p = gr.Slider(0, 1, value=0.15, step=0.01, label="mlm_probability (chosen)")
        p_mask = gr.Slider(0, 1, value=0.8, step=0.01, label="mask_replace_prob (chosen → [MASK])")
        p_random = gr.Slider(0, 1, value=0.1, step=0.01, label="random_replace_prob (chosen → random)")
    with gr.Row():
        whole_word = gr.Checkbox(False, label="Whole-word masking",
                                 info="All pieces of a word are chosen together; transformers then "
                                      "replaces every chosen piece by [MASK] (no random, no keep).")
        seed = gr.Number(0, precision=0, minimum=0, label="Seed")
        sample_btn = gr.Button("Sample", variant="primary")
        resample_btn = gr.Button("Resample (seed + 1)")
    strip = gr.HighlightedText(label="Tokens coloured by outcome", color_map=plots.OUTCOME_COLORS,
                               show_legend=True, show_inline_category=False, combine_adjacent=False)
    table = gr.HTML()
    counts = gr.Dataframe(empty_table(COUNT_COLUMNS), label="This sample against the expected numbers",
                          interactive=False)
    with gr.Accordion("Rows (JSON)", open=False):
        rows_json = gr.JSON()
    return SampleSection(text, seed, p, p_mask, p_random, whole_word, sample_btn, resample_btn,
                         strip, table, counts, rows_json)


@dataclass
class EpochsSection:
    """Static vs dynamic masking: its form and what `on_epochs` returns, in `outputs` order."""

    epochs: gr.Slider
    copies: gr.Slider
    button: gr.Button
    summary: gr.Markdown
    grid: gr.Plot
    curve: gr.Plot

    @property
    def outputs(self) -> list:
        return [self.summary, self.grid, self.curve]


def _section_epochs() -> EpochsSection:
    with gr.Accordion("Static vs dynamic masking", open=True):
        gr.Markdown(STATIC_HELP)
        with gr.Row():
            epochs = gr.Slider(1, masking.MAX_EPOCHS, value=10, step=1, label="Epochs")
            copies = gr.Slider(1, masking.MAX_EPOCHS, value=1, step=1,
                               label="Static: masks drawn in advance (BERT: 10)")
        epochs_btn = gr.Button("Show the epochs")
        summary = gr.Markdown()
        grid = gr.Plot(label="What the model sees each epoch (colour = outcome)")
        curve = gr.Plot(label="Tokens ever chosen")
    return EpochsSection(epochs, copies, epochs_btn, summary, grid, curve)


@dataclass
class LawSection:
    """Many samples: the number of draws, the button, and what `on_law` returns, in `outputs` order."""

    draws: gr.Slider
    button: gr.Button
    plot: gr.Plot
    table: gr.Dataframe

    @property
    def outputs(self) -> list:
        return [self.plot, self.table]


def _section_law() -> LawSection:
    with gr.Accordion("The law behind it: many samples", open=False):
        gr.Markdown("The same text sampled many times in one collator call: the measured rates, "
                    "with 95% intervals, against the configured ones. *z* is the distance in "
                    "standard errors; beyond ±4 would mean the sampler is wrong.")
        draws = gr.Slider(1_000, masking.MAX_LAW_TOKENS, value=20_000, step=1_000, label="Token draws")
        law_btn = gr.Button("Sample many times")
        law_plot = gr.Plot(label="Measured vs configured rates")
        law_table = gr.Dataframe(empty_table(LAW_COLUMNS), interactive=False, label="Rates, measured")
    return LawSection(draws, law_btn, law_plot, law_table)


@dataclass
class ConsequenceSection:
    """The two fine-tunes: their form, and what `on_consequence` streams, in `outputs` order."""

    steps: gr.Slider
    learning_rate: gr.Number
    button: gr.Button
    stop: gr.Button
    plot: gr.Plot
    table: gr.Dataframe
    note: gr.Markdown

    @property
    def outputs(self) -> list:
        return [self.plot, self.table, self.note]


@dataclass
class ArticleSection:
    """The article's mask_tokens: its form, what `on_article` returns (in `outputs` order), and the
    fine-tunes that show the consequence."""

    max_length: gr.Slider
    button: gr.Button
    table: gr.HTML
    counts: gr.Dataframe
    notes: gr.Markdown
    consequence: ConsequenceSection

    @property
    def outputs(self) -> list:
        return [self.table, self.counts, self.notes]


def _section_article(text) -> ArticleSection:
    with gr.Accordion("The article's mask_tokens, side by side", open=False):
        gr.Markdown(ARTICLE_HELP)
        max_length = gr.Slider(8, 64, value=20, step=1, label="max_length (the article uses 20)")
        article_btn = gr.Button("Run the article's mask_tokens")
        table = gr.HTML()
        counts = gr.Dataframe(empty_table(ARTICLE_COUNT_COLUMNS), label="In numbers", interactive=False)
        notes = gr.Markdown()
        gr.Markdown(CONSEQUENCE_HELP)
        gr.Examples([[ARTICLE_TEXT]], inputs=text, example_labels=["The article's three sentences"])
        consequence = _section_consequence()
    return ArticleSection(max_length, article_btn, table, counts, notes, consequence)


def _section_consequence() -> ConsequenceSection:
    with gr.Row():
        steps = gr.Slider(5, experiments.MAX_CONSEQUENCE_STEPS, value=experiments.MAX_CONSEQUENCE_STEPS,
                          step=1, label="Steps per run")
        lr = gr.Number(3e-4, label="Learning rate",
                       info="The article uses 5e-5; 3e-4 shows the effect within 60 steps.")
    with gr.Row():
        run_btn = gr.Button("Fine-tune with each labelling")
        stop_btn = gr.Button("Stop", variant="stop")
    plot = gr.Plot(label="Training loss (own labelling) and eval loss (proper masks)")
    table = gr.Dataframe(empty_table(CONSEQUENCE_COLUMNS), label="Before and after, on properly masked tokens",
                         interactive=False)
    note = gr.Markdown()
    return ConsequenceSection(steps, lr, run_btn, stop_btn, plot, table, note)


def create_demo(store=None, settings: Settings | None = None) -> gr.Blocks:
    """The tab on its own, for running or testing it alone."""
    return standalone_demo("mask sampling", render, store, settings)


# ---------------------------------------------------------------- handlers

def on_sample(visitor: Visitor, text, seed, mask_probability, mask_replace_probability,
              random_replace_probability, whole_words):
    """One seeded draw of BERT's masked-LM corruption of a text, as
    DataCollatorForLanguageModeling does it: which tokens are chosen, and whether each chosen
    one becomes [MASK], a random token or stays unchanged.

    Args:
        text: the text to corrupt, one or more sentences (no [MASK] needed), up to the model's length.
        seed: a whole number from 0 to 2**32-1; the same seed gives the same draw.
        mask_probability: probability that a token is chosen for prediction, above 0 and at most 1 (BERT: 0.15).
        mask_replace_probability: of the chosen tokens, the share replaced by [MASK], 0 to 1 (BERT: 0.8).
        random_replace_probability: of the chosen tokens, the share replaced by a random token, 0 to 1 with mask_replace_probability + random_replace_probability at most 1 (BERT: 0.1); the rest stay unchanged.
        whole_words: true to choose whole words (all their pieces together) instead of single pieces.

    Returns:
        the text as the model sees it (highlighted), a per-token table, counts against the configured rates, and the raw rows: per token {"token", "chosen", "outcome" ("mask", "random", "keep" or null), "seen", "label" (-100 or the original id), ...}.
    """
    rows = masking.mask_sample(visitor.lm.tokenizer, text, seed, mask_probability, mask_replace_probability,
                               random_replace_probability, whole_words)
    table_counts = masking.outcome_counts(rows, mask_probability, mask_replace_probability,
                                          random_replace_probability, whole_words)
    return _strip(rows), _sample_table(rows), _counts_frame(table_counts), rows


def on_epochs(visitor: Visitor, text, seed, mask_probability, mask_replace_probability,
              random_replace_probability, whole_words, epochs, static_copies):
    result = masking.static_vs_dynamic(visitor.lm.tokenizer, text, epochs, seed, mask_probability,
                                       mask_replace_probability, random_replace_probability, whole_words,
                                       static_copies)
    grids = {mode: result[mode] for mode in ("static", "dynamic")}
    return (_curve_summary(result["curve"]), plots.outcome_grid(result["tokens"], grids),
            plots.ever_chosen_curve(result["curve"]))


def on_law(visitor: Visitor, text, seed, mask_probability, mask_replace_probability,
           random_replace_probability, whole_words, token_draws):
    rows = masking.masking_law(visitor.lm.tokenizer, text, token_draws, seed, mask_probability,
                               mask_replace_probability, random_replace_probability, whole_words)
    return plots.masking_law_bars(rows), _law_frame(rows)


def on_article(visitor: Visitor, text, seed, mask_probability, mask_replace_probability,
               random_replace_probability, whole_words, max_length):
    lm = visitor.lm
    loss_fn = experiments.model_loss(lm) if max_length <= lm.max_length else None
    result = masking.article_comparison(lm.tokenizer, text, seed, max_length, mask_probability,
                                        mask_replace_probability, random_replace_probability, whole_words,
                                        loss_fn=loss_fn)
    return _article_table(result), pd.DataFrame(result["counts"]), _article_notes(result, lm.name)


def on_consequence(visitor: Visitor, form: LabellingForm, progress=gr.Progress()):
    """Two short fine-tunes, the article's labelling then the collator's; streams the three outputs."""
    outcome = yield from live_run.stream(visitor, "article_finetune", form, progress,
                                         lambda log: (gr.skip(),) * 3, desc="labelling",
                                         cleared=(None, empty_table(CONSEQUENCE_COLUMNS), ""))  # the last run's go
    result = outcome.result
    curves = {LABELS[name]: history for name, history in result.runs.items()}
    yield plots.labelling_curves(curves), _consequence_frame(result), _consequence_note(result)


def on_stop(visitor: Visitor) -> None:
    live_run.stop(visitor)


def _next_seed(value) -> int:
    try:
        return int(value) + 1
    except (TypeError, ValueError, OverflowError):
        return 0


def _strip(rows: list[dict]) -> list[tuple[str, str | None]]:
    """The tokens as HighlightedText segments, a space between them."""
    segments = []
    for row in rows:
        segments += [(row["token"], row["outcome"]), (" ", None)]
    return segments[:-1]


def _cell(text, outcome=None, title: str = "") -> str:
    color = plots.OUTCOME_COLORS.get(outcome, "transparent")
    hint = f' title="{html.escape(title)}"' if title else ""
    return (f'<td style="background:{color};padding:2px 6px;border:1px solid #ddd;'
            f'white-space:nowrap"{hint}>{html.escape(str(text))}</td>')


def _html_table(rows: list[tuple[str, list[str]]]) -> str:
    """A row-labelled table, one column per token, in a horizontally scrolling box."""
    body = "".join(f'<tr><th style="text-align:left;padding:2px 6px">{html.escape(name)}</th>'
                   f'{"".join(cells)}</tr>' for name, cells in rows)
    return ('<div style="overflow-x:auto"><table style="border-collapse:collapse;'
            f'font-family:monospace;font-size:13px">{body}</table></div>')


def _label_text(label: int) -> str:
    return "-100" if label == -100 else str(label)


def _sample_table(rows: list[dict]) -> str:
    def title(row):
        if row["outcome"] == "random" and row["seen_id"] == row["token_id"]:
            return "random draw that picked the same token"
        return row["outcome"] or ("special: never chosen" if row["special"] else "not chosen")

    return _html_table([
        ("token", [_cell(r["token"]) for r in rows]),
        ("model sees", [_cell(r["seen"], r["outcome"], title(r)) for r in rows]),
        ("label", [_cell(_label_text(r["label"]), r["outcome"], title(r)) for r in rows]),
    ])


COUNT_COLUMNS = ("what", "count", "expected")
LAW_COLUMNS = ("rate", "configured", "measured", "count", "of", "95% interval", "z")
ARTICLE_COUNT_COLUMNS = ("what", "article", "collator")


def _counts_frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([{"what": r["what"], "count": r["count"], "expected": round(r["expected"], 2)}
                         for r in rows], columns=list(COUNT_COLUMNS))


def _curve_summary(curve: dict) -> str:
    n = curve["epochs"][-1]
    return (f"After **{n}** epochs, tokens ever chosen: static **{curve['static'][-1]:.1%}** "
            f"(theory {curve['static_theory'][-1]:.1%}), dynamic **{curve['dynamic'][-1]:.1%}** "
            f"(theory {curve['dynamic_theory'][-1]:.1%}); measured over "
            f"{curve['tokens']:,} token draws per epoch.")


def _law_frame(rows: list[dict]) -> pd.DataFrame:
    def z(row):
        if not row["se"]:
            return 0.0 if row["measured"] == row["configured"] else math.inf
        return round((row["measured"] - row["configured"]) / row["se"], 2)

    def interval(row):
        return f"{row['low']:.4f} – {row['high']:.4f}" if row["n"] else "nothing drawn"

    return pd.DataFrame([{"rate": r["rate"], "configured": round(r["configured"], 4),
                          "measured": round(r["measured"], 4), "count": r["count"], "of": r["n"],
                          "95% interval": interval(r), "z": z(r)} for r in rows])


def _article_table(result: dict) -> str:
    art, col = result["article"], result["collator"]
    art_outcome = ["mask" if m else None for m in art["masked"]]
    return _html_table([
        ("token", [_cell(t) for t in result["tokens"]]),
        ("article: model sees", [_cell(s, o) for s, o in zip(art["seen"], art_outcome)]),
        ("article: label", [_cell(_label_text(lab), o) for lab, o in zip(art["labels"], art_outcome)]),
        ("collator: model sees", [_cell(s, o) for s, o in zip(col["seen"], col["outcome"])]),
        ("collator: label", [_cell(_label_text(lab), o) for lab, o in zip(col["labels"], col["outcome"])]),
    ])


def _article_notes(result: dict, model_name: str) -> str:
    notes = []
    if result["truncated"]:
        notes.append("⚠️ The text is longer than max_length: it was **cut**, as the article's "
                     "`truncation=True` does (silently, there).")
    losses = result["losses"]
    if losses:
        def fmt(x):
            return "n/a (no token scored)" if math.isnan(x) else f"{x:.3f}"
        notes.append(f"Loss of **{model_name}** as it is now (no training) under each labelling: "
                     f"article {fmt(losses['article'])}, collator {fmt(losses['collator'])}. The "
                     "article's loss scores tokens the model can see, so a model that copies its "
                     "input drives it to zero without learning to fill a gap.")
    return "\n\n".join(notes)


LABELS = {"article": "article's labelling", "collator": "collator's labelling"}
CONSEQUENCE_COLUMNS = ("measure", "before", *(f"after, {label}" for label in LABELS.values()))


def _consequence_frame(result: experiments.Consequence) -> pd.DataFrame:
    """Measures as rows; the base model, then each tuned one, as columns."""
    runs, hidden = result.runs, result.hidden
    names = [run for run in LABELS if run in runs]

    def loss(x):
        return f"{x:.2f}"

    def share(x):
        return f"{x:.0%}"

    rows = [("training loss, first step (own labelling)", "",
             [loss(runs[r].steps[0].loss) if runs[r].steps else "" for r in names]),
            ("training loss, last step (own labelling)", "",
             [loss(runs[r].steps[-1].loss) if runs[r].steps else "" for r in names]),
            ("eval loss, 80/10/10 masks", loss(runs[names[0]].before.loss),
             [loss(runs[r].after.loss) for r in names]),
            ("eval accuracy, 80/10/10 masks", share(runs[names[0]].before.accuracy),
             [share(runs[r].after.accuracy) for r in names]),
            ("loss, every chosen token [MASK]", loss(hidden["before"].loss),
             [loss(hidden[r].loss) for r in names]),
            ("accuracy, every chosen token [MASK]", share(hidden["before"].accuracy),
             [share(hidden[r].accuracy) for r in names])]
    return pd.DataFrame([{"measure": what, "before": before,
                          **{f"after, {LABELS[r]}": value for r, value in zip(names, after)}}
                         for what, before, after in rows])


def _consequence_note(result: experiments.Consequence) -> str:
    """One sentence on what the numbers say, whichever way they went."""
    runs, hidden = result.runs, result.hidden
    if len(runs) < 2 or not all(h.steps for h in runs.values()):
        return "The two runs did not both train; nothing to compare."
    article, collator = hidden["article"], hidden["collator"]
    trained = (f"The article's training loss fell to **{runs['article'].steps[-1].loss:.2f}** "
               f"(the collator's: {runs['collator'].steps[-1].loss:.2f})")
    scores = (f"on hidden tokens its model scores **{article.accuracy:.0%}** (loss "
              f"{article.loss:.2f}) against **{collator.accuracy:.0%}** "
              f"({collator.loss:.2f}) for the collator's labelling")
    stopped = [f"{LABELS[r]}: {h.stopped}" for r, h in runs.items() if h.stopped]
    note = " (stopped early: " + ", ".join(stopped) + ")" if stopped else ""
    if collator.loss < article.loss:
        return (f"{trained} because it scores tokens the model can see, and copying them is easy; "
                f"yet {scores}: a low training loss that taught it little about filling a "
                f"[MASK]{note}.")
    return (f"{trained}, and here {scores}: with text this short the evaluation uses the training "
            "sentences, each position of which can be memorised, and the article scores about 85% "
            f"of the positions against 15%. Try 4 sentences or more, so that some are held out{note}.")
