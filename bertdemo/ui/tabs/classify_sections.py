"""The Classify tab's layout, one function per section (the tab's `render` wires them): the labelled
examples and the training settings, training the classifier, using it, the features a decision rests
on, the forgetting sweep, adapt-then-classify and the probe per layer. Each returns a named record of
its components; the tables' columns are named here, once."""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from ...config import Limits
from ...features import cls_features
from ...training.classification import ADAPT_MLM_STEPS, MAX_TOKENS
from ...training.forgetting import DEFAULT_SWEEP_LRS
from ..parts.common import empty_table

COLUMNS = ["text", "label"]  # the examples' table
FORGETTING_NOTE = """Trains the same classifier at learning rates {lrs} (same seed, split and
steps) and plots its held-out accuracy against how much masked-LM skill its body kept (loss on
fixed masks of your text under the original MLM head; right is more forgetting). **Meaningful
only for a model whose MLM head is trained** (bert-base, the bundled model, other masked LMs). A
bare body whose MLM head is random (the MiniLM sentence-embedding package loaded as it is) has a
high MLM loss before and after, so this plot says nothing there."""
ADAPT_NOTE = """Don't stop pretraining (Gururangan et al. 2020): first train the model with MLM on
text from your domain, then train the classifier. This trains the same classifier (seed, split,
head initialisation, batches and steps) from the base body and from an MLM-adapted body, and
overlays them. The adapted body is your tuned model from the **Fine-tune** tab (domain-adaptive);
if you have none, a copy of the base is first MLM-tuned for {steps} steps on your examples' own
texts (task-adaptive)."""
PROBE_NOTE = """A linear probe per layer: logistic regression on the frozen hidden states after the
embeddings (layer 0) and after each layer, averaged over each text's tokens, trained on the same
split as the classifier and scored on its held-out examples. Nothing in the model is trained: the
chart says at which depth your labels can be read off by a straight line (the dashed line is
always answering the most frequent label). Seconds, not minutes.

Topics are written in their words, so every layer reads them, the embeddings too. In the
**word-order** set both labels use the same words, only their order differs ("The dog chased the
farmer." / "The farmer chased the dog."): the averaged embeddings of the same words cannot tell
who acts, the layers that mix in context can. On the bundled model (seed 0): 25% at the embeddings,
below the 50% of always answering one label, and 90% at layers 2 and 3."""


@dataclass
class DataSection:
    """The labelled examples: the bundled sets, their Load button, the upload and the table."""

    example: gr.Dropdown
    load: gr.Button
    upload: gr.UploadButton
    table: gr.Dataframe


def data_section(limits: Limits, example_sets: list[str], rows: list[list[str]]) -> DataSection:
    """`example_sets`: the bundled sets' names, the first shown; `rows`: its lines, in the table."""
    with gr.Row(equal_height=True):
        example = gr.Dropdown(example_sets, value=example_sets[0], label="Bundled examples", scale=3)
        load = gr.Button("Load these examples", scale=1)
        upload = gr.UploadButton("Upload CSV/TSV (text,label)", file_types=[".csv", ".tsv", ".txt"], scale=1)
    table = gr.Dataframe(rows, headers=COLUMNS, datatype=["str", "str"],
                         column_count=2, type="array", interactive=True,
                         label=f"Labelled examples: text, label (at most {limits.max_examples:,} rows "
                               f"and {limits.max_chars:,} characters; texts past {MAX_TOKENS} tokens are cut)",
                         max_height=320, wrap=True, elem_id="classify-table")
    return DataSection(example, load, upload, table)


def settings_section(limits: Limits) -> dict:
    with gr.Row():
        epochs = gr.Number(10, label="Epochs", precision=0, minimum=1, maximum=limits.max_steps)
        lr = gr.Number(2e-5, label="Learning rate", info="2e-5: the article's small rate.")
        batch = gr.Slider(1, limits.max_batch_size, value=8, step=1, label="Batch size")
        freeze = gr.Checkbox(False, label="Freeze the body (train the new layers only: a linear probe)")
        seed = gr.Number(0, label="Seed", precision=0, minimum=0)
    return dict(epochs=epochs, learning_rate=lr, batch_size=batch, freeze_body=freeze, seed=seed)


BEFORE_AFTER_COLUMNS = ("held-out", "before", "after")
PREDICTION_COLUMNS = ("", "text", "label", "predicted", "probabilities")
SWEEP_COLUMNS = ("learning rate", "held-out accuracy", "macro-F1", "MLM loss before", "MLM loss after", "steps")
ADAPT_COLUMNS = ("body", "accuracy before", "accuracy after", "macro-F1 after", "loss after", "steps")


@dataclass
class RunSection:
    """Training the classifier: its buttons and what `on_train` streams, in `outputs` order."""

    train: gr.Button
    stop: gr.Button
    status: gr.Markdown
    curve: gr.Plot
    before_after: gr.Dataframe
    confusion: gr.Plot
    predictions: gr.Dataframe

    @property
    def outputs(self) -> list:
        return [self.status, self.curve, self.before_after, self.confusion, self.predictions]


def run_section() -> RunSection:
    with gr.Row():
        train = gr.Button("Train the classifier", variant="primary")
        stop = gr.Button("Stop", variant="stop")
    status = gr.Markdown(elem_id="classify-status")
    curve = gr.Plot(label="Training loss and held-out accuracy, live")
    with gr.Row():
        before_after = gr.Dataframe(label="Held-out scores: before (untrained head) and after",
                                    headers=list(BEFORE_AFTER_COLUMNS), interactive=False,
                                    column_widths=["60%", "20%", "20%"])
        confusion = gr.Plot(label="Confusion matrix (held-out)", elem_id="classify-confusion")
    predictions = gr.Dataframe(label="Held-out predictions, mistakes first", interactive=False,
                               headers=list(PREDICTION_COLUMNS),
                               wrap=True, max_height=320, elem_id="classify-predictions")
    return RunSection(train, stop, status, curve, before_after, confusion, predictions)


@dataclass
class UseSection:
    """Using the trained classifier: new sentences, their predictions, and its download."""

    sentences: gr.Textbox
    classify: gr.Button
    download: gr.Button
    result: gr.Dataframe
    file: gr.File


def use_section() -> UseSection:
    with gr.Row(equal_height=True):
        sentences = gr.Textbox(label="Classify new sentences (one per line)", lines=3, scale=3,
                               value="The midfielder scored in the last minute.\nStir the sauce gently.")
        with gr.Column(scale=1):
            classify_btn = gr.Button("Classify")
            download = gr.Button("Download the classifier (.zip)")
    result = gr.Dataframe(label="Predictions of your classifier", interactive=False, wrap=True,
                          headers=["sentence", "label", "probabilities…"],
                          elem_id="classify-result")
    file = gr.File(label="save_pretrained folder + tokenizer, zipped: AutoModelForSequenceClassification"
                         ".from_pretrained(folder)", height=90)
    return UseSection(sentences, classify_btn, download, result, file)


WHY_NOTE = """**The features this decision rests on.** A sparse dictionary of the sentence's own
vector, the one your classifier's head reads (the last layer's output at [CLS]), names what that
vector is made of; each of the sentence's active features is then switched off there in turn (its
activation times its direction removed, the rest of the vector kept) and your classifier's
probability of the label it decided is measured again. One dictionary is shipped, for the bundled
model: train the classifier from it."""
WHY_COLUMNS = ("feature", "fires most on (corpus sentences)", "activation", "probability: with → without",
               "change (points)", "fires on")
WHY_WIDTHS = ("8%", "42%", "10%", "17%", "10%", "13%")
WHY_TABLE_LINE = """Each row is one feature active at [CLS] for this sentence, the largest fall first.
*with → without*: your classifier's probability of its decided label with the feature as it is and
switched off (measured, not estimated); *change*: the difference in percentage points (a fall of
more than a few points is large, a rise means the feature argued against the label). *fires most
on*: the corpus sentences where it fires most; *fires on*: on how many of the corpus lines it fires."""


@dataclass
class WhySection:
    """The features a decision rests on: a sentence, how many features, the button, and what
    `on_classifier_features` returns, in `outputs` order."""

    sentence: gr.Textbox
    top: gr.Number
    run: gr.Button
    note: gr.Markdown
    table: gr.Dataframe

    @property
    def outputs(self) -> list:
        return [self.note, self.table]


def why_section() -> WhySection:
    with gr.Accordion("The features this decision rests on", open=False):
        gr.Markdown(WHY_NOTE)
        with gr.Row(equal_height=True):
            sentence = gr.Textbox("The midfielder scored in the last minute.", label="A sentence to classify",
                                  scale=3)
            top = gr.Number(8, label="Features shown", precision=0, minimum=1, maximum=cls_features.MAX_TOP,
                            scale=1)
            run = gr.Button("Show the features it rests on", scale=1)
        note = gr.Markdown(elem_id="classify-why-note")
        table = gr.Dataframe(empty_table(WHY_COLUMNS), interactive=False, wrap=True, elem_id="classify-why",
                             label="The sentence's [CLS] features, switched off one at a time",
                             column_widths=list(WHY_WIDTHS))  # else its sentences push the numbers off the page
        gr.Markdown(WHY_TABLE_LINE)
    return WhySection(sentence, top, run, note, table)


def forgetting_section() -> RunsSection:
    return _runs_section("Forgetting, measured: learning rate against the MLM it keeps",
                            FORGETTING_NOTE.format(lrs=", ".join(f"{lr:g}" for lr in DEFAULT_SWEEP_LRS)),
                            "Run the learning-rate sweep", "Held-out accuracy against the body's MLM loss",
                            SWEEP_COLUMNS, "The sweep")


def adapt_section() -> RunsSection:
    return _runs_section("Adapt, then classify: does MLM on your domain help?",
                            ADAPT_NOTE.format(steps=ADAPT_MLM_STEPS),
                            "Train from the base and from my MLM-tuned model",
                            "Base body vs MLM-adapted body, overlaid", ADAPT_COLUMNS, "Held-out scores after")


@dataclass
class RunsSection:
    """A section that runs several classifiers: its button and what its handler streams, in `outputs` order."""

    run: gr.Button
    status: gr.Markdown
    plot: gr.Plot
    table: gr.Dataframe

    @property
    def outputs(self) -> list:
        return [self.status, self.plot, self.table]


def _runs_section(title: str, note: str, button: str, plot_label: str, columns, table_label: str) -> RunsSection:
    """A folded section that runs several classifiers: its note, button, status, plot and table."""
    with gr.Accordion(title, open=False):
        gr.Markdown(note)
        run = gr.Button(button)
        status = gr.Markdown()
        plot = gr.Plot(label=plot_label)
        table = gr.Dataframe(empty_table(columns), interactive=False, label=table_label)
    return RunsSection(run, status, plot, table)


@dataclass
class ProbeSection:
    """Which layer knows the labels: the word-order examples' button, the probe's, and what `on_probe`
    returns, in `outputs` order."""

    word_order: gr.Button
    run: gr.Button
    status: gr.Markdown
    plot: gr.Plot

    @property
    def outputs(self) -> list:
        return [self.status, self.plot]


def probe_section() -> ProbeSection:
    with gr.Accordion("Which layer knows your labels?", open=False):
        gr.Markdown(PROBE_NOTE)
        with gr.Row():
            word_order = gr.Button("Load the word-order examples")
            run = gr.Button("Probe every layer", variant="primary")
        status = gr.Markdown(elem_id="probe-status")
        plot = gr.Plot(label="Held-out accuracy of a linear probe, by layer", elem_id="probe-chart")
    return ProbeSection(word_order, run, status, plot)
