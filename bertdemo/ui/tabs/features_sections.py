"""The Features tab's layout, one function per section (the tab's `render` wires them): the
layer picker, a sentence's features, a feature's card, a prediction feature by feature (steer,
the features behind it), two uses of a word, the dictionaries' quality, and training one."""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from ...config import Limits
from ...features.drift import SORTS
from ...features.senses import sense_lists
from ...features.views import MAX_ADD, MAX_SCALE
from ..parts import view_downloads
from ..parts.common import empty_table

SENTENCE = "I sat on the river bank and watched the water."
MASKED = "The [MASK] was on the table."
# Every table that shows a feature's label shows beside it how well the label fits: the card's score
# (its detection F1 on held-out text) and the kind of feature that makes it, said in the tab's intro
LABEL_FITS = "label fits"
TOKEN_COLUMNS = ("feature", "token", "position", "activation", LABEL_FITS, "label")
COFIRING_COLUMNS = ("feature", "fires with it (share)", LABEL_FITS, "label")
PREDICTION_COLUMNS = ("feature", "mask", "word", "rank", "p(word): with it → switched off", "change (points)",
                      "estimated change (points)", LABEL_FITS, "label")
PREDICTION_HELP = ("*p(word)*: the top word's probability with every feature on → with this one switched off at "
                   "every token, in the real model. *Change*: the difference in percentage points, the unit of "
                   "Steer's before/after bars; it is large when it halves the word's probability or more (e.g. "
                   "12% → 6%) and small under a twentieth of it (12% → 11.4%). *Estimated change*: the same change "
                   "predicted from the model's slope without running it again: how the features are picked before "
                   "they are measured.")
CONTRAST_COLUMNS = ("feature", "share of A", "share of B", "separation", LABEL_FITS, "label")
WORD_COLUMNS = ("feature", "lift", "fires on the word", "of its firings on the word", LABEL_FITS, "label")
LABEL_COLUMNS = ("feature", "fires on (share of tokens)", LABEL_FITS, "label")
SIMILAR_COLUMNS = ("feature", "cosine", LABEL_FITS, "label")
# The quality table's plain headings, each with the line said under the table (QUALITY_HELP); its
# widths keep it within a 1280 px page
QUALITY = (
    ("layer", None),
    ("loss added (nats)", "how much worse the masked LM predicts the hidden words of held-out text with the layer "
                          "replaced by its dictionary's reconstruction (the spliced model) than as it is: its "
                          "cross-entropy, spliced − clean, in nats (0 = no cost)."),
    ("perplexity ×", "the same cost as a ratio of perplexities (1.10 = 10% more perplexed)."),
    ("KL (nats)", "how far the spliced model's predicted words move from the clean model's at the masked "
                  "positions (the KL divergence; 0 = the same predictions)."),
    ("unexplained share (FVU)", "the fraction of the layer's variance the reconstruction misses (0 = all of it "
                                "explained, 1 = none)."),
    ("its 95% range", "a bootstrap interval on that share, over the held-out lines."),
    ("never fired (dead)", "the share of its features that never fired in the tokens stated."),
    ("features active per token", "how many features fire at a token on average (L0), out of at most *k* (the "
                                  "number the dictionary keeps per token)."),
    ("loss recovered: vs zeros / vs mean", "how much of the loss lost by replacing the layer with zeros "
                                           "(zero-ablated) or with its mean over the corpus (mean-ablated) the "
                                           "dictionary wins back (100% = all of it)."),
    ("held-out tokens", "the text it was measured on, not trained on."),
    ("how it was made", "its size and *k*, the tokens it trained on and the passes over its text, the minutes "
                        "and machine, and what ended the training."),
)
QUALITY_COLUMNS = tuple(heading for heading, _ in QUALITY)
QUALITY_WIDTHS = ("5%", "8%", "8%", "7%", "9%", "10%", "10%", "8%", "10%", "8%", "17%")
QUALITY_HELP = ("\n".join(f"- **{heading}**: {line}" for heading, line in QUALITY if line)
                + "\n\nThe cross-entropies themselves (clean, spliced, zero- and mean-ablated) are in the raw figures.")


# The tab's tables (headers break between words only on every tab: `lifecycle.PAGE_CSS`)
TABLE_CLASS = "features-table"


def _table(columns, label: str, elem_id: str, widths=None, max_height: int = 500) -> gr.Dataframe:
    return gr.Dataframe(empty_table(columns), label=label, interactive=False, elem_id=elem_id, wrap=True,
                        elem_classes=[TABLE_CLASS], column_widths=list(widths) if widths else None,
                        max_height=max_height)


def layer_picker(n_layers: int, default: int, line: str):
    """The one layer every section reads, and the line saying which layers have a dictionary."""
    with gr.Row():
        layer = gr.Slider(0, n_layers, value=default, step=1, label="Features of layer (0 = embeddings)", scale=1)
        available = gr.Markdown(line, elem_id="features-available")
    return layer, available


@dataclass
class SentenceSection:
    """A sentence's features: the form and what `on_sentence_features` returns, in `outputs` order."""

    text: gr.Textbox
    top: gr.Slider
    button: gr.Button
    heatmap: gr.Plot
    table: gr.Dataframe
    raw: gr.JSON

    @property
    def outputs(self) -> list:
        return [self.heatmap, self.table, self.raw]


def sentence_section() -> SentenceSection:
    gr.Markdown("### A sentence's features")
    with gr.Row():
        text = gr.Textbox(label="Sentence", value=SENTENCE, lines=2, scale=4, elem_id="features-sentence")
        top = gr.Slider(1, 20, value=5, step=1, label="Features per token", scale=1)
    button = gr.Button("Show the sentence's features", variant="primary")
    heatmap = gr.Plot(label="Tokens x features: activation")
    table = _table(TOKEN_COLUMNS, "The sentence's strongest features, strongest first (click a row for its card)",
                   "features-tokens")
    with gr.Accordion("Raw features (JSON)", open=False):
        raw = gr.JSON()
    return SentenceSection(text, top, button, heatmap, table, raw)


@dataclass
class Card:
    """The card's components: its outputs in the order `on_feature_card` returns them, and the similar
    features (filled whenever a card is drawn)."""

    summary: gr.Markdown
    histogram: gr.Plot
    contexts: gr.HTML
    effects: gr.Plot
    cofiring: gr.Dataframe
    similar: gr.Dataframe
    raw: gr.JSON

    @property
    def outputs(self) -> list:
        return [self.summary, self.histogram, self.contexts, self.effects, self.cofiring, self.raw]


@dataclass
class CardSection:
    """The card's form (the feature's number, its button), the card, and its export (the button and
    the files it fills)."""

    feature: gr.Number
    button: gr.Button
    card: Card
    export_button: gr.Button
    export_files: gr.File


def card_section(default: int) -> CardSection:
    gr.Markdown("### A feature's card")
    with gr.Row():
        feature = gr.Number(label="Feature", value=default, precision=0, minimum=0, scale=1, elem_id="features-feature",
                            info="Its number in the layer's dictionary; or click a row of any table here.")
        button = gr.Button("Open the card", variant="primary", scale=1, elem_id="features-open-card")
    summary = gr.Markdown(elem_id="feature-summary")
    with gr.Row():
        histogram = gr.Plot(label="How strongly it fires")
        effects = gr.Plot(label="What it does to the prediction at a [MASK]")
    contexts = gr.HTML(elem_id="feature-contexts")
    with gr.Row():
        cofiring = _table(COFIRING_COLUMNS, "Features that fire with it most", "feature-cofiring")
        similar = _table(SIMILAR_COLUMNS, "Similar features: the nearest decoder directions (cosine)",
                         "feature-similar")
    with gr.Accordion("Raw card (JSON)", open=False):
        raw = gr.JSON()
    export_button, export_files = view_downloads.controls("the feature card")
    return CardSection(feature, button, Card(summary, histogram, contexts, effects, cofiring, similar, raw),
                       export_button, export_files)


@dataclass
class Finder:
    """The "Find a feature" section: a search by word or label text, and the layer's map."""

    query: gr.Textbox
    by: gr.Radio
    top: gr.Slider
    find: gr.Button
    note: gr.Markdown
    table: gr.Dataframe
    raw: gr.JSON
    draw: gr.Button
    map_note: gr.Markdown
    map: gr.Plot

    @property
    def outputs(self) -> list:
        return [self.note, self.table, self.raw]


def find_section() -> Finder:
    gr.Markdown("### Find a feature")
    with gr.Row():
        query = gr.Textbox(label="A word, or text of a label", placeholder="e.g. river, bank, capital", scale=3,
                           elem_id="features-query",
                           info="By word: the features that fire on it most, by lift (how many times more often "
                                "the feature fires on the word than the word occurs). By label: the labels that "
                                "hold the text.")
        by = gr.Radio([("by word", "word"), ("by label", "label")], value="word", label="Search",
                      elem_id="features-search-by", scale=1)
        top = gr.Slider(1, 30, value=10, step=1, label="Features listed", scale=1)
        find = gr.Button("Find features", variant="primary", scale=1, elem_id="features-find")
    note = gr.Markdown(elem_id="features-found-note")
    table = _table(WORD_COLUMNS, "Features found (click a row for its card)", "features-found")
    with gr.Accordion("Raw search result (JSON)", open=False):
        raw = gr.JSON()
    with gr.Row():
        draw = gr.Button("Draw the map of this layer's features", scale=1, elem_id="features-draw-map")
        map_note = gr.Markdown(elem_id="features-map-note")
    plot = gr.Plot(label="The layer's features, placed by the direction each writes", elem_id="features-map")
    return Finder(query, by, top, find, note, table, raw, draw, map_note, plot)


@dataclass
class PredictionSection:
    """A prediction feature by feature: steering (its form and outputs) and the features behind the
    top word (its form and outputs), each output list in its handler's return order."""

    masked: gr.Textbox
    target: gr.Markdown
    scale: gr.Slider
    add: gr.Slider
    top_k: gr.Slider
    steer: gr.Button
    steer_note: gr.Markdown
    steer_plot: gr.Plot
    steer_raw: gr.JSON
    why_top: gr.Slider
    why: gr.Button
    why_table: gr.Dataframe
    why_raw: gr.JSON

    @property
    def steered(self) -> list:
        return [self.steer_note, self.steer_plot, self.steer_raw]

    @property
    def named(self) -> list:
        """What names the feature steered: the line above the controls and the button."""
        return [self.target, self.steer]

    @property
    def why_outputs(self) -> list:
        return [self.why_table, self.why_raw]


def prediction_section(layer: int, feature: int) -> PredictionSection:
    """The steer form names the card's feature (`steer_target`, `steer_button`: the tab redraws both
    when the feature or the layer changes)."""
    gr.Markdown("### A prediction, feature by feature")
    masked = gr.Textbox(label="Sentence with [MASK]", value=MASKED, lines=2, elem_id="features-masked")
    target = gr.Markdown(steer_target(layer, feature), elem_id="steer-target")
    with gr.Row():
        scale = gr.Slider(0, MAX_SCALE, value=0, step=0.1, label="Scale the feature where it fires",
                          info="0 (as it starts) = switched off, 1 = unchanged, 2 = doubled.", elem_id="steer-scale")
        add = gr.Slider(0, MAX_ADD, value=0, step=0.1, label="Add it where it does not fire",
                        info="At the [MASK]s, this many times its mean activation (0 = nothing added).")
        top_k = gr.Slider(1, 20, value=5, step=1, label="Predictions per mask")
    steer_button = gr.Button(steer_button_text(feature), variant="primary", elem_id="steer-button")
    steer_note = gr.Markdown(elem_id="steer-note")
    steer_plot = gr.Plot(label="Before and after steering")
    with gr.Accordion("Raw steering (JSON)", open=False):
        steer_raw = gr.JSON()
    with gr.Row():
        top = gr.Slider(1, 20, value=5, step=1, label="Features per mask", scale=1)
        why_button = gr.Button("Which features made the top word", scale=2)
    why_table = _table(PREDICTION_COLUMNS, "The features behind each mask's top word, switched off one at a "
                                           "time (click a row for its card)", "prediction-features",
                       widths=("8%", "5%", "9%", "5%", "15%", "9%", "10%", "9%", "30%"))
    gr.Markdown(PREDICTION_HELP, elem_id="prediction-features-help")
    with gr.Accordion("Raw features behind the prediction (JSON)", open=False):
        why_raw = gr.JSON()
    return PredictionSection(masked, target, scale, add, top_k, steer_button, steer_note, steer_plot, steer_raw,
                             top, why_button, why_table, why_raw)


def steer_target(layer, feature) -> str:
    """The line above the steer form: which feature it steers, and where that is chosen."""
    return (f"Steers **feature {feature} of layer {layer}**: the one in *A feature's card* above (type another "
            "number there, or click a row of any table here).")


def steer_button_text(feature) -> str:
    return f"Steer feature {feature}: fill the masks with it changed"


@dataclass
class ContrastSection:
    """Two uses of a word: the form, and what `on_contrast` returns, in `outputs` order."""

    texts_a: gr.Textbox
    texts_b: gr.Textbox
    word: gr.Textbox
    top: gr.Slider
    button: gr.Button
    note: gr.Markdown
    table_a: gr.Dataframe
    table_b: gr.Dataframe

    @property
    def outputs(self) -> list:
        return [self.note, self.table_a, self.table_b]


CONTRAST_WIDTHS = ("13%", "12%", "12%", "16%", "13%", "34%")


def contrast_section() -> ContrastSection:
    gr.Markdown("### Two uses of a word")
    river, money = sense_lists("bank")
    with gr.Row():
        texts_a = gr.Textbox(label="List A, one sentence per line", value="\n".join(river), lines=6, max_lines=12)
        texts_b = gr.Textbox(label="List B, one sentence per line", value="\n".join(money), lines=6, max_lines=12)
    with gr.Row():
        word = gr.Textbox(label="The word both lists use", value="bank", scale=2)
        top = gr.Slider(1, 20, value=8, step=1, label="Features per list", scale=2)
        button = gr.Button("Contrast the two uses", scale=1)
    note = gr.Markdown()
    with gr.Row():
        table_a = _table(CONTRAST_COLUMNS, "Features of list A's use", "contrast-a", widths=CONTRAST_WIDTHS)
        table_b = _table(CONTRAST_COLUMNS, "Features of list B's use", "contrast-b", widths=CONTRAST_WIDTHS)
    return ContrastSection(texts_a, texts_b, word, top, button, note, table_a, table_b)


@dataclass
class QualitySection:
    """The dictionaries' quality: the button, what `on_quality` returns (`outputs`), and the words
    under the table."""

    button: gr.Button
    table: gr.Dataframe
    raw: gr.JSON
    words: gr.Markdown

    @property
    def outputs(self) -> list:
        return [self.table, self.raw]


def quality_section() -> QualitySection:
    gr.Markdown("### How far to trust them")
    gr.Markdown("What replacing a layer by its dictionary's reconstruction costs the masked LM on held-out text "
                "comes first, then how much of the layer it explains; each column is said in a line under the "
                "table.")
    button = gr.Button("Show every dictionary's quality")
    table = _table(QUALITY_COLUMNS, "Each layer's dictionary, measured on held-out text", "features-quality",
                   widths=QUALITY_WIDTHS)
    gr.Markdown(QUALITY_HELP, elem_id="features-quality-help")
    words = gr.Markdown(elem_id="features-quality-notes")
    with gr.Accordion("Raw quality (JSON)", open=False):
        raw = gr.JSON()
    return QualitySection(button, table, raw, words)


DRIFT_COLUMNS = ("feature", "fires on (base)", "fires on (tuned)", "change of firing share (points)",
                 "mean activation (base)", "mean activation (tuned)", "change of mean activation", LABEL_FITS, "label")


@dataclass
class DriftSection:
    """After a fine-tune: the form, and what `on_tuning_drift` returns, in `outputs` order."""

    text: gr.Textbox
    top: gr.Slider
    sort_by: gr.Radio
    button: gr.Button
    note: gr.Markdown
    table: gr.Dataframe

    @property
    def outputs(self) -> list:
        return [self.note, self.table]


def drift_section() -> DriftSection:
    gr.Markdown("### After your fine-tune: what changed at this layer")
    with gr.Row():
        text = gr.Textbox(label="Text to compare on, one sentence per line (empty: the text your last fine-tune "
                                "trained on, else the default corpus)", lines=3, max_lines=8, scale=4)
        top = gr.Slider(1, 30, value=10, step=1, label="Features listed", scale=1)
    sort_by = gr.Radio([(what, key) for key, what in SORTS.items()], value="share", label="Sort by",
                       elem_id="features-drift-sort", info="Largest first, whichever way it changed.")
    button = gr.Button("Compare the base model's features with your fine-tuned model's")
    note = gr.Markdown(elem_id="features-drift-note")
    table = _table(DRIFT_COLUMNS, "The base dictionary's features that changed most (click a row for its card)",
                   "features-drift")
    return DriftSection(text, top, sort_by, button, note, table)


@dataclass
class TrainingSection:
    """Training a layer's features: the form, Stop and its line, and the run's live outputs
    (`outputs`, in `on_train_features`' order)."""

    texts: gr.Textbox
    keep_partial: gr.Checkbox
    button: gr.Button
    stop: gr.Button
    stopping: gr.Markdown
    status: gr.Markdown
    curve: gr.Plot
    quality: gr.Dataframe

    @property
    def outputs(self) -> list:
        return [self.status, self.curve, self.quality]


def training_section(limits: Limits, layer: int) -> TrainingSection:
    gr.Markdown("### Train features for a layer")
    texts = gr.Textbox(label="Text to train on, one sentence per line (empty: the default corpus)", lines=4,
                       max_lines=10, info=f"At most {limits.max_chars:,} characters; training stops after "
                                          f"{limits.features_max_tokens:,} tokens or "
                                          f"{min(limits.features_max_seconds, limits.max_seconds):.0f} s.")
    keep_partial = gr.Checkbox(True, label="Keep the dictionary if I press Stop or the time runs out",
                               info="Off: a stopped run's dictionary is thrown away.")
    with gr.Row():
        button = gr.Button(f"Train features for layer {layer}", variant="primary", elem_id="train-features")
        with gr.Column():
            stop = gr.Button("Stop", variant="stop")
            stopping = gr.Markdown(elem_id="features-stopping")  # its own line: the run's status is the run's
    status = gr.Markdown(elem_id="features-status")
    curve = gr.Plot(label="FVU and dead latents, live")
    quality = _table(QUALITY_COLUMNS, "The new dictionary's quality (each column: under *How far to trust "
                                      "them*)", "features-new-quality", widths=QUALITY_WIDTHS)
    return TrainingSection(texts, keep_partial, button, stop, stopping, status, curve, quality)
