"""The Classify tab: the article's downstream recipe on the visitor's labelled lines, what it
costs the masked LM (forgetting, against the learning rate) and what MLM adaptation buys.

Layout in section helpers; module-level handlers `on_x(visitor, ...)` wired with `handler`.
Training runs go through `_run` (the run lifecycle) and the trained classifier is kept per
session through `_keep`/`_kept`: the one place that talks to the run and session machinery.
"""
from __future__ import annotations

from pathlib import Path

import gradio as gr
import pandas as pd

from .. import plots, runs
from ..classification import (DEFAULT_SWEEP_LRS, MAX_TOKENS, Classifier, ClassifyHistory, ClassifyLimits,
                              adapt_then_classify, check_request, classify, forgetting, lr_sweep,
                              parse_examples, train_classifier)
from ..config import Settings
from .context import AppContext, Visitor, handler
from .live_run import show_steps, watch_queue

ASSETS = Path(__file__).resolve().parents[2] / "assets" / "classify"
EXAMPLE_SETS = {"Topics: sport, cooking, space (45 lines)": "topics.csv",
                "Reviews: positive, negative (24 lines)": "reviews.csv"}
FIRST_EXAMPLE = next(iter(EXAMPLE_SETS))
COLUMNS = ["text", "label"]
RECIPE = """Turn the masked LM into a **classifier** the way the article *Fine-Tuning BERT with Masked
Language Modeling: A Comprehensive Guide* describes (its GLUE table is made exactly so), on your own
labelled lines. The article's four differences from pre-training, as this tab does them:
1. **Start from the pre-trained weights**: a copy of the model's body (the shared model never changes).
2. **A task-specific output layer**: a new head with one output per label
   (`AutoModelForSequenceClassification`).
3. **The supervised loss**: cross-entropy on your labels.
4. **A small learning rate** (2e-5) *to avoid catastrophic forgetting*: measured below, as the
   masked-LM loss of the tuned body on your text, read through the original MLM head.

About 20% of each label is held out (at least one example, fixed by the seed) and never trained
on: every score below is on those. Few examples need more epochs than GLUE's 3."""
FORGETTING_NOTE = """Trains the same classifier at learning rates {lrs} (same seed, split and
steps) and plots its held-out accuracy against how much masked-LM skill its body kept (loss on
fixed masks of your text under the original MLM head; right is more forgetting). **Meaningful
only for a model whose MLM head is trained** (bert-base and other masked LMs). The bundled
MiniLM body has a random MLM head: its MLM loss is high before and after, so this plot says
nothing there."""
ADAPT_NOTE = """Don't stop pretraining (Gururangan et al. 2020): first train the model with MLM on
text from your domain, then train the classifier. This trains the same classifier (seed, split,
head initialisation, batches and steps) from the base body and from an MLM-adapted body, and
overlays them. The adapted body is your tuned model from the **Fine-tune** tab (domain-adaptive);
if you have none, a copy of the base is first MLM-tuned for {steps} steps on your examples' own
texts (task-adaptive)."""
ADAPT_MLM_STEPS = 60


def render(ctx: AppContext) -> None:
    """The tab's layout and its events."""
    watch_queue(ctx.store, RUN_ENDPOINTS)  # a cancelled queued run frees the slot (runs.reserve)
    limits = limits_from(ctx.settings)
    gr.Markdown(RECIPE)
    data = _section_data(limits)
    form = [data["table"], *_section_settings(limits)]
    run = _section_run()
    use = _section_use()
    sweep = _section_forgetting()
    adapt = _section_adapt()
    heavy = dict(concurrency_limit=ctx.settings.finetune_concurrency, concurrency_id="finetune")
    data["load"].click(handler(ctx, on_example), data["example"], data["table"], api_name="classify_example")
    data["upload"].upload(handler(ctx, on_upload), data["upload"], data["table"], api_visibility="private")
    run["train"].click(handler(ctx, on_train), form, run["outputs"], api_name="train_classifier",
                       validator=train_validator(ctx), **heavy)
    run["stop"].click(handler(ctx, on_stop), None, run["outputs"][0], api_name="stop_classifier", queue=False)
    use["classify"].click(handler(ctx, on_classify), use["sentences"], use["result"], api_name="classify")
    use["download"].click(handler(ctx, on_download), None, use["file"], api_name="download_classifier",
                          concurrency_id="model")
    sweep_form = [form[0], form[1], form[3], form[5]]  # the lr is swept, freezing is off
    sweep["run"].click(handler(ctx, on_sweep), sweep_form, sweep["outputs"], api_name="forgetting_sweep",
                       validator=sweep_validator(ctx), **heavy)
    adapt["run"].click(handler(ctx, on_adapt), form, adapt["outputs"], api_name="adapt_then_classify",
                       validator=train_validator(ctx), **heavy)


# ---------------------------------------------------------------- layout sections

def _section_data(limits: ClassifyLimits) -> dict:
    with gr.Row(equal_height=True):
        example = gr.Dropdown(list(EXAMPLE_SETS), value=FIRST_EXAMPLE, label="Bundled examples", scale=3)
        load = gr.Button("Load these examples", scale=1)
        upload = gr.UploadButton("Upload CSV/TSV (text,label)", file_types=[".csv", ".tsv", ".txt"], scale=1)
    table = gr.Dataframe(example_rows(FIRST_EXAMPLE), headers=COLUMNS, datatype=["str", "str"],
                         column_count=2, type="array", interactive=True,
                         label=f"Labelled examples: text, label (at most {limits.max_examples:,} rows "
                               f"and {limits.max_chars:,} characters; texts past {MAX_TOKENS} tokens are cut)",
                         max_height=320, wrap=True, elem_id="classify-table")
    return {"example": example, "load": load, "upload": upload, "table": table}


def _section_settings(limits: ClassifyLimits) -> list:
    with gr.Row():
        epochs = gr.Number(10, label="Epochs", precision=0, minimum=1, maximum=limits.max_steps)
        lr = gr.Number(2e-5, label="Learning rate", info="2e-5: the article's small rate.")
        batch = gr.Slider(1, limits.max_batch_size, value=8, step=1, label="Batch size")
        freeze = gr.Checkbox(False, label="Freeze the body (train the new layers only: a linear probe)")
        seed = gr.Number(0, label="Seed", precision=0, minimum=0)
    return [epochs, lr, batch, freeze, seed]


def _section_run() -> dict:
    with gr.Row():
        train = gr.Button("Train the classifier", variant="primary")
        stop = gr.Button("Stop", variant="stop")
    status = gr.Markdown(elem_id="classify-status")
    curve = gr.Plot(label="Training loss and held-out accuracy, live")
    with gr.Row():
        before_after = gr.Dataframe(label="Held-out scores: before (untrained head) and after",
                                    headers=["held-out", "before", "after"], interactive=False,
                                    column_widths=["60%", "20%", "20%"])
        confusion = gr.Plot(label="Confusion matrix (held-out)", elem_id="classify-confusion")
    predictions = gr.Dataframe(label="Held-out predictions, mistakes first", interactive=False,
                               headers=["", "text", "label", "predicted", "probabilities"],
                               wrap=True, max_height=320, elem_id="classify-predictions")
    return {"train": train, "stop": stop, "outputs": [status, curve, before_after, confusion, predictions]}


def _section_use() -> dict:
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
    return {"sentences": sentences, "classify": classify_btn, "download": download, "result": result,
            "file": file}


def _section_forgetting() -> dict:
    with gr.Accordion("Forgetting, measured: learning rate against the MLM it keeps", open=False):
        gr.Markdown(FORGETTING_NOTE.format(lrs=", ".join(f"{lr:g}" for lr in DEFAULT_SWEEP_LRS)))
        run = gr.Button("Run the learning-rate sweep")
        status = gr.Markdown()
        plot = gr.Plot(label="Held-out accuracy against the body's MLM loss")
        table = gr.Dataframe(interactive=False, label="The sweep")
    return {"run": run, "outputs": [status, plot, table]}


def _section_adapt() -> dict:
    with gr.Accordion("Adapt, then classify: does MLM on your domain help?", open=False):
        gr.Markdown(ADAPT_NOTE.format(steps=ADAPT_MLM_STEPS))
        run = gr.Button("Train from the base and from my MLM-tuned model")
        status = gr.Markdown()
        plot = gr.Plot(label="Base body vs MLM-adapted body, overlaid")
        table = gr.Dataframe(interactive=False, label="Held-out scores after")
    return {"run": run, "outputs": [status, plot, table]}


# ---------------------------------------------------------------- handlers

def on_example(visitor: Visitor, example_set: str) -> list[list[str]]:
    """The bundled example set's rows."""
    if example_set not in EXAMPLE_SETS:
        raise ValueError(f"Pick one of the bundled example sets: {', '.join(EXAMPLE_SETS)}.")
    return example_rows(example_set)


def on_upload(visitor: Visitor, file) -> list[list[str]]:
    """A CSV/TSV file's rows (header optional), refused past the size cap or when not UTF-8 text."""
    limits = limits_from(visitor.settings)
    path = Path(file if isinstance(file, str) else getattr(file, "name", ""))
    if not path.is_file():
        raise ValueError("No file received: upload a .csv or .tsv file of text,label lines.")
    most = 8 * limits.max_chars  # parse_examples reads 2 x max_chars characters, of up to 4 UTF-8 bytes
    if path.stat().st_size > most:
        raise ValueError(f"The file has {path.stat().st_size:,} bytes; at most {most:,} are allowed. "
                         "Upload fewer examples.")
    try:
        content = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError("The file is not UTF-8 text: save it as CSV (UTF-8).") from None
    return [list(pair) for pair in parse_examples(content, limits)]


def on_train(visitor: Visitor, examples, epochs, learning_rate, batch_size, freeze_body, seed,
             progress=gr.Progress()):
    """Train on the table; streams (status, curve, before/after, confusion, predictions)."""
    lm, limits = visitor.lm, limits_from(visitor.settings)
    pairs, opts, _, _ = check_request(table_rows(examples), epochs=epochs, lr=learning_rate,
                                      batch_size=batch_size, seed=seed, freeze_body=freeze_body, limits=limits)
    job = lambda emit, stop: train_classifier(lm, pairs, on_step=emit, should_stop=stop,  # noqa: E731
                                              limits=limits, **opts)
    events = {"steps": [], "evals": []}
    for result in _run(visitor, job, events, progress):
        if result is None:
            yield (_live_status(events), plots.classifier_curves({"": events}, _planned(events)),
                   gr.skip(), gr.skip(), gr.skip())
    classifier, history = result
    kept = _keep_or_discard(visitor, classifier, history, limits)
    mlm = forgetting(lm, classifier, [t for t, _ in pairs], history.settings["seed"])
    yield (_final_status(history, lm.name, kept, limits),
           plots.classifier_curves({"": vars(history)}, history.planned_steps),
           before_after_frame(history, mlm, _head_trained(lm)),
           plots.confusion_heatmap(history.labels, history.confusion), predictions_frame(history))


def on_stop(visitor: Visitor) -> str:
    if _request_stop(visitor):
        return "Stopping after the current step…"
    return "Nothing is running: there is no training of yours to stop."


def on_classify(visitor: Visitor, sentences: str) -> pd.DataFrame:
    """Each line's label and probabilities under this session's classifier."""
    classifier = _kept(visitor)
    if classifier is None:
        raise ValueError("You have no classifier yet: press “Train the classifier” first.")
    texts = [line.strip() for line in (sentences or "").splitlines() if line.strip()]
    if not texts:
        raise ValueError("Write one or more sentences to classify, one per line.")
    rows = []
    for text, probs in zip(texts, classify(classifier, texts)):
        best = max(probs, key=probs.get)
        rows.append({"sentence": text, "label": best, **{k: f"{v:.1%}" for k, v in probs.items()}})
    return pd.DataFrame(rows)


def on_download(visitor: Visitor) -> str:
    """The session's classifier as a save_pretrained zip (made once per classifier)."""
    if _kept(visitor) is None:
        raise ValueError("You have no classifier to download: train one first.")
    return str(_zip(visitor))


def on_sweep(visitor: Visitor, examples, epochs, batch_size, seed, progress=gr.Progress()):
    """The learning-rate sweep; streams (status, plot, table)."""
    lm, limits = visitor.lm, limits_from(visitor.settings)
    pairs, opts, _, _ = check_request(table_rows(examples), epochs=epochs, batch_size=batch_size,
                                      seed=seed, limits=limits)
    opts.pop("lr")
    job = lambda emit, stop: lr_sweep(lm, pairs, DEFAULT_SWEEP_LRS, on_step=emit,  # noqa: E731
                                      should_stop=stop, limits=limits, **opts)
    events: dict = {"steps": [], "evals": []}
    for result in _run(visitor, job, events, progress, runs_in_job=len(DEFAULT_SWEEP_LRS)):
        if result is None:
            yield f"Training at lr {events.get('run') or 0:g}… {_live_status(events)}", gr.skip(), gr.skip()
    points = result["points"]
    yield (_sweep_status(result, lm.name, _head_trained(lm)),
           plots.forgetting_plot(points, result["mlm_before"]["loss"]), sweep_frame(result))


def on_adapt(visitor: Visitor, examples, epochs, learning_rate, batch_size, freeze_body, seed,
             progress=gr.Progress()):
    """Base body vs this session's MLM-tuned body (or one MLM-tuned on the examples' texts first);
    streams (status, plot, table)."""
    base, tuned = visitor.store.base_for(visitor.session), visitor.store.tuned(visitor.session)
    limits = limits_from(visitor.settings)
    pairs, opts, _, _ = check_request(table_rows(examples), epochs=epochs, lr=learning_rate,
                                      batch_size=batch_size, seed=seed, freeze_body=freeze_body, limits=limits)
    job = lambda emit, stop: adapt_then_classify(  # noqa: E731
        base, tuned, pairs, mlm_steps=ADAPT_MLM_STEPS, on_step=emit, should_stop=stop, limits=limits, **opts)
    events: dict = {"steps": [], "evals": []}
    for result in _run(visitor, job, events, progress, runs_in_job=3):
        if result is None:
            doing = (f"Training the classifier from the {events['run']} body…" if events["run"] != "adapting"
                     else "MLM-adapting a copy of the base on your examples' texts…")
            yield f"{doing} {_live_status(events)}", gr.skip(), gr.skip()
    if not result:
        yield "Stopped while adapting: nothing to compare.", None, None
        return
    curves = {f"{run} body": vars(h) for run, h in result.items()}
    planned = next(iter(result.values())).planned_steps
    adapted_by = ("your tuned model from the Fine-tune tab" if tuned is not None
                  else f"{ADAPT_MLM_STEPS} MLM steps on your examples' texts")
    yield _adapt_status(result, adapted_by), plots.classifier_curves(curves, planned), adapt_frame(result)


# Validators run when a request is queued: bad input is refused at once with the message beside
# the field at fault (the table keeps what was typed), and the session's run slot is claimed.
# Gradio passes the inputs positionally and `request` by its annotation, hence the signatures.

def train_validator(ctx: AppContext):
    def check(examples, epochs, learning_rate, batch_size, freeze_body, seed, request: gr.Request):
        return _verdicts(ctx, request, dict(examples=examples, epochs=epochs, learning_rate=learning_rate,
                                            batch_size=batch_size, freeze_body=freeze_body, seed=seed))
    return check


def sweep_validator(ctx: AppContext):
    def check(examples, epochs, batch_size, seed, request: gr.Request):
        return _verdicts(ctx, request, dict(examples=examples, epochs=epochs, batch_size=batch_size,
                                            seed=seed))
    return check


def _verdicts(ctx: AppContext, request, values: dict) -> list:
    """One `gr.validate` per input; the first problem found is shown beside its input."""
    names = list(values)
    verdicts = [gr.validate(True, "")] * len(names)
    try:
        visitor, limits = ctx.visitor(request), limits_from(ctx.settings)
        examples = table_rows(values.pop("examples"))
        values["lr"] = values.pop("learning_rate", 2e-5)
        check_request(examples, limits=limits, **values)
        _reserve(visitor, request)
    except ValueError as err:
        field = getattr(err, "field", "examples").replace(" ", "_")
        verdicts[names.index(field) if field in names else 0] = gr.validate(False, str(err))
    return verdicts


# ---------------------------------------------------------------- values in and out

def limits_from(settings: Settings) -> ClassifyLimits:
    """The fine-tune's caps (characters, steps, seconds) and the examples cap, from the flags."""
    return ClassifyLimits(max_chars=settings.finetune_max_chars, max_steps=settings.finetune_max_steps,
                          max_seconds=float(settings.finetune_max_seconds),
                          max_examples=settings.classify_max_examples)


def example_rows(name: str) -> list[list[str]]:
    return [list(pair) for pair in parse_examples((ASSETS / EXAMPLE_SETS[name]).read_text("utf-8"))]


def table_rows(table) -> list:
    """The table's rows as (text, label) pairs, rows left wholly blank dropped (a row added and not
    filled in). Takes what Gradio gives (a list of rows) and what a script sends ({"data": rows}
    or a DataFrame); anything else is returned as it is, for the service to refuse."""
    if isinstance(table, pd.DataFrame):
        table = table.values.tolist()
    if isinstance(table, dict) and "data" in table:
        table = table["data"]
    if not isinstance(table, list):
        return table
    return [tuple(row) if isinstance(row, list) else row for row in table
            if not (isinstance(row, list) and all(cell is None or str(cell).strip() == "" for cell in row))]


def before_after_frame(history: ClassifyHistory, mlm: dict, head_trained: bool = True) -> pd.DataFrame:
    before, after = history.before, history.after
    mlm_row = ("MLM loss of the body on your text (original MLM head)" if head_trained else
               "MLM loss of the body on your text (this model's MLM head is untrained: not meaningful)")
    return pd.DataFrame({
        "held-out": ["loss (cross-entropy)", "accuracy", "macro-F1", mlm_row],
        "before": [f"{before['loss']:.3f}", f"{before['accuracy']:.1%}", f"{before['macro_f1']:.3f}",
                   f"{mlm['before']['loss']:.3f}"],
        "after": [f"{after['loss']:.3f}", f"{after['accuracy']:.1%}", f"{after['macro_f1']:.3f}",
                  f"{mlm['after']['loss']:.3f}"]})


def predictions_frame(history: ClassifyHistory) -> pd.DataFrame:
    return pd.DataFrame([{
        "": "✓" if p["correct"] else "✗", "text": p["text"], "label": p["label"],
        "predicted": p["predicted"],
        "probabilities": ", ".join(f"{k} {v:.0%}" for k, v in
                                   sorted(p["probabilities"].items(), key=lambda kv: -kv[1]))}
        for p in history.predictions])


def sweep_frame(sweep: dict) -> pd.DataFrame:
    before = sweep["mlm_before"]["loss"]
    return pd.DataFrame([{"learning rate": f"{p['lr']:g}", "held-out accuracy": f"{p['accuracy']:.1%}",
                          "macro-F1": f"{p['macro_f1']:.3f}", "MLM loss before": f"{before:.3f}",
                          "MLM loss after": f"{p['mlm_loss']:.3f}", "steps": p["steps"]}
                         for p in sweep["points"]])


def adapt_frame(runs: dict[str, ClassifyHistory]) -> pd.DataFrame:
    return pd.DataFrame([{"body": f"{run} body", "accuracy before": f"{h.before['accuracy']:.1%}",
                          "accuracy after": f"{h.after['accuracy']:.1%}",
                          "macro-F1 after": f"{h.after['macro_f1']:.3f}",
                          "loss after": f"{h.after['loss']:.3f}", "steps": len(h.steps)}
                         for run, h in runs.items()])


def _planned(events: dict) -> int | None:
    return events["steps"][-1]["steps"] if events["steps"] else None


def _live_status(events: dict) -> str:
    if not events["steps"]:
        return "Scoring the untrained head on the held-out examples…"
    last = events["steps"][-1]
    return f"Step {last['step']}/{last['steps']}: loss {last['loss']:.3f}, lr {last['lr']:.1e}"


def _final_status(history: ClassifyHistory, model: str, kept: str, limits: ClassifyLimits) -> str:
    chance = 1 / len(history.labels)
    why = runs.ENDED_BECAUSE.get(history.stopped, "").format(seconds=int(limits.max_seconds))
    head = (f"**Done**: {len(history.steps)} steps in {history.seconds:.1f} s" if history.completed
            else f"**Ended early** because {why}, after {len(history.steps)} of {history.planned_steps} "
                 f"steps ({history.seconds:.1f} s)")
    cut = f" {history.truncated} text(s) were cut at {MAX_TOKENS} tokens." if history.truncated else ""
    return (f"{head}, from **{model}**, on {history.train_size} examples; held-out accuracy "
            f"{history.before['accuracy']:.0%} → **{history.after['accuracy']:.0%}** on "
            f"{history.held_out_size} examples of {len(history.labels)} labels (chance "
            f"{chance:.0%}).{cut}\n\n{kept}")


def _head_trained(lm) -> bool:
    """False for a body with a newly initialised MLM head (the bundled MiniLM): its MLM loss
    measures nothing, before or after."""
    card = getattr(lm, "card", None)
    return bool(getattr(card, "head_trained", True))


def _sweep_status(sweep: dict, model: str, head_trained: bool = True) -> str:
    done = [p for p in sweep["points"] if not p["stopped"]]
    note = "" if len(done) == len(DEFAULT_SWEEP_LRS) else " Some runs ended early: the sweep is incomplete."
    if not head_trained:
        note += (" ⚠️ This model's MLM head is untrained (randomly initialised), so its MLM loss "
                 "says nothing about forgetting: use a masked LM such as bert-base.")
    return (f"Swept {len(sweep['points'])} learning rate(s) on **{model}**; MLM loss before "
            f"{sweep['mlm_before']['loss']:.3f}.{note}")


def _adapt_status(runs: dict[str, ClassifyHistory], adapted_by: str) -> str:
    if len(runs) < 2:
        return "Stopped before the second run: nothing to compare."
    gain = runs["adapted"].after["accuracy"] - runs["base"].after["accuracy"]
    return (f"Adapted body: {adapted_by}. Same seed, split and {runs['base'].planned_steps} steps. "
            f"Held-out accuracy: base body "
            f"{runs['base'].after['accuracy']:.0%}, MLM-adapted body {runs['adapted'].after['accuracy']:.0%} "
            f"({gain:+.0%}). With a few dozen held-out examples, one example is several points: "
            "try other seeds before believing a small difference.")


# ---------------------------------------------------------------- runs and what a session keeps
# The one place that talks to the run lifecycle (bertdemo.runs) and the session store.

KIND = "classifier"  # the session's model of this kind is its trained classifier
RUN_ENDPOINTS = {"train_classifier", "forgetting_sweep", "adapt_then_classify"}


def _run(visitor: Visitor, job, events: dict, progress, runs_in_job: int = 1):
    """Run `job(emit, should_stop)` as this session's one run (Stop, time limit per training run,
    slot released however it ends): yields None after each batch of events (collected into
    `events`: "steps", "evals" and the latest "run"), then the job's result."""
    seconds = runs_in_job * visitor.settings.finetune_max_seconds
    with runs.start(visitor.store, visitor.session, job, max_seconds=seconds) as run:
        for batch in run.updates():
            for event in batch:
                if event.get("run", events.get("run")) != events.get("run"):  # the next run starts
                    events.update(steps=[], evals=[])
                events["run"] = event.get("run")
                events["steps" if event["kind"] == "step" else "evals"].append(event)
            show_steps(progress, len(events["steps"]), _planned(events) or 0, desc="training")
            yield None
        yield run.outcome()


def _reserve(visitor: Visitor, request: gr.Request | None) -> None:
    """Claim the session's run slot when the request is queued (ValueError if a run is going)."""
    runs.reserve(visitor.store, visitor.session)


def _request_stop(visitor: Visitor) -> bool:
    return runs.stop(visitor.store, visitor.session)


def _keep_or_discard(visitor: Visitor, classifier: Classifier, history: ClassifyHistory,
                     limits: ClassifyLimits) -> str:
    """A classifier is kept even when stopped (its scores are shown where it stopped), never
    when its loss diverged; it replaces the session's earlier one."""
    return runs.keep_or_discard(visitor.store, visitor.session, classifier, history,
                                keep_partial=True, limits=limits, kind=KIND)


def _kept(visitor: Visitor) -> Classifier | None:
    return visitor.store.model(visitor.session, KIND)


def _zip(visitor: Visitor) -> Path:
    return runs.model_zip(visitor.store, visitor.session, kind=KIND)
