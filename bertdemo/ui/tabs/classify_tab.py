"""The Classify tab: the article's downstream recipe on the visitor's labelled lines, what it
costs the masked LM (forgetting, against the learning rate) and what MLM adaptation buys.

Layout in `classify_sections`, one function per section; module-level handlers `on_x(visitor, ...)`
wired with `handler`, the three runs with `live_run.wire` (declared in `bertdemo.runs`, which also
decides what a run keeps: the trained classifier, as the session's model of kind "classifier").
"""
from __future__ import annotations

import hashlib
import math
from pathlib import Path

import gradio as gr
import pandas as pd

from ... import plots
from ...config import Limits
from ...features import cls_features
from ...features.store import shared_store
from ...labelled import parse_examples, table_examples
from ...runs import life
from ...training.classification import (ADAPT_MLM_STEPS, MAX_TOKENS, Classifier, ClassifierForm, ClassifierHistory,
                                       classify)
from ...training.forgetting import DEFAULT_SWEEP_LRS, SweepForm, forgetting
from ...training.loop import EventLog
from ...views import embeddings
from . import classify_sections as sections
from ..parts import live_run
from ..parts.common import empty_table
from ..parts.context import AppContext, Visitor, handler

ASSETS = Path(__file__).resolve().parents[3] / "assets" / "classify"
WORD_ORDER = "Who acts: the same words in either order (96 lines)"  # where the layers differ
EXAMPLE_SETS = {"Topics: sport, cooking, space (45 lines)": "topics.csv",
                "Reviews: positive, negative (24 lines)": "reviews.csv",
                WORD_ORDER: "word_order.csv"}
FIRST_EXAMPLE = next(iter(EXAMPLE_SETS))
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


def render(ctx: AppContext) -> None:
    """The tab's layout and its events."""
    limits = ctx.settings.limits
    gr.Markdown(RECIPE)
    data = sections.data_section(limits, list(EXAMPLE_SETS), example_rows(FIRST_EXAMPLE))
    form = {"examples": data.table, **sections.settings_section(limits)}
    run = sections.run_section()
    use = sections.use_section()
    why = sections.why_section()
    sweep = sections.forgetting_section()
    adapt = sections.adapt_section()
    probe = sections.probe_section()
    data.load.click(handler(ctx, on_example), data.example, data.table, api_name="classify_example")
    data.upload.upload(handler(ctx, on_upload), data.upload, data.table, api_visibility="private")
    live_run.wire(ctx, "train_classifier", run.train, form, run.outputs, on_train)
    run.stop.click(handler(ctx, on_stop), None, run.status, api_name="stop_classifier", queue=False)
    use.classify.click(handler(ctx, on_classify), use.sentences, use.result, api_name="classify")
    use.download.click(handler(ctx, on_download), None, use.file, api_name="download_classifier",
                       concurrency_id="model")
    why.run.click(handler(ctx, on_classifier_features), [why.sentence, why.top], why.outputs,
                  api_name="classifier_features", concurrency_id="model")
    live_run.wire(ctx, "forgetting_sweep", sweep.run, form, sweep.outputs, on_sweep)  # rates swept
    live_run.wire(ctx, "adapt_then_classify", adapt.run, form, adapt.outputs, on_adapt)
    probe.word_order.click(on_word_order, None, [data.example, data.table], api_visibility="private")
    probe.run.click(handler(ctx, on_probe), [data.table, form["seed"]], probe.outputs,
                    api_name="probe_layers", validator=handler(ctx, check_probe), concurrency_id="model")


# ---------------------------------------------------------------- handlers

def on_word_order() -> tuple:
    """The word-order example set, chosen and loaded: the one where the probe's layers differ."""
    return WORD_ORDER, example_rows(WORD_ORDER)


def on_example(visitor: Visitor, example_set: str) -> list[list[str]]:
    """The bundled example set's rows."""
    if example_set not in EXAMPLE_SETS:
        raise ValueError(f"Pick one of the bundled example sets: {', '.join(EXAMPLE_SETS)}.")
    return example_rows(example_set)


def on_upload(visitor: Visitor, file) -> list[list[str]]:
    """A CSV/TSV file's rows (header optional), refused past the size cap or when not UTF-8 text."""
    limits = visitor.limits
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


def on_train(visitor: Visitor, form: ClassifierForm, progress=gr.Progress()):
    """Train on the table; streams (status, curve, before/after, confusion, predictions)."""
    # the last run's results go
    cleared = ("Starting…", None, empty_table(sections.BEFORE_AFTER_COLUMNS), None,
               empty_table(sections.PREDICTION_COLUMNS))
    outcome = yield from live_run.stream(visitor, "train_classifier", form, progress, _live_curves, cleared=cleared)
    (classifier, history), plan = outcome.result, outcome.plan
    mlm = forgetting(plan.lm, classifier, [t for t, _ in plan.examples], plan.settings.seed)
    yield (_final_status(history, plan.lm.name, live_run.kept_note(outcome.kept, visitor.limits), visitor.limits),
           plots.classifier_curves({"": history}, history.planned_steps),
           before_after_frame(history, mlm, _head_trained(plan.lm)),
           plots.confusion_heatmap(history.labels, history.confusion), predictions_frame(history))


def _live_curves(log: EventLog) -> tuple:
    run = log.latest
    return (_live_status(run), plots.classifier_curves({"": run}, run.planned_steps or None),
            gr.skip(), gr.skip(), gr.skip())


def on_stop(visitor: Visitor) -> str:
    if live_run.stop(visitor):
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


def on_classifier_features(visitor: Visitor, sentence: str, top_features) -> tuple:
    """The features of a sentence's [CLS] vector (the one the classifier's head reads) that this
    session's classifier's decision rests on: each switched off in turn at [CLS], the probability
    of the decided label before and after.

    Args:
        sentence: one sentence to classify and explain.
        top_features: how many features to show (1-32), the largest fall of probability first.

    Returns:
        a line (the decision, the dictionary's quality and how well it reconstructs this vector) and
        the table of features (what each fires on most, its activation, the probability with and without it).
    """
    result = cls_features.classifier_features(_kept(visitor), sentence, top_features, _feature_store(visitor))
    return why_note(result), why_frame(result)


def on_download(visitor: Visitor) -> str:
    """The session's classifier as a save_pretrained zip (made once per classifier)."""
    if _kept(visitor) is None:
        raise ValueError("You have no classifier to download: train one first.")
    return str(_zip(visitor))


def on_sweep(visitor: Visitor, form: SweepForm, progress=gr.Progress()):
    """The learning-rate sweep; streams (status, plot, table)."""
    outcome = yield from live_run.stream(
        visitor, "forgetting_sweep", form, progress,
        lambda log: (f"Training at lr {log.current}… {_live_status(log.latest)}", gr.skip(), gr.skip()),
        cleared=("Starting…", None, empty_table(sections.SWEEP_COLUMNS)))  # the last sweep's results go
    sweep, lm = outcome.result, outcome.plan.plan.lm
    yield (_sweep_status(sweep, lm.name, _head_trained(lm)),
           plots.forgetting_plot(sweep["points"], sweep["mlm_before"].loss), sweep_frame(sweep))


def on_adapt(visitor: Visitor, form: ClassifierForm, progress=gr.Progress()):
    """Base body vs this session's MLM-tuned body (or one MLM-tuned on the examples' texts first);
    streams (status, plot, table)."""
    outcome = yield from live_run.stream(visitor, "adapt_then_classify", form, progress, _adapt_live,
                                         cleared=("Starting…", None, empty_table(sections.ADAPT_COLUMNS)))
    histories = outcome.result
    if not histories:
        yield "Stopped while adapting: nothing to compare.", None, empty_table(sections.ADAPT_COLUMNS)
        return
    curves = {f"{run} body": h for run, h in histories.items()}
    planned = next(iter(histories.values())).planned_steps
    adapted_by = ("your tuned model from the Fine-tune tab" if outcome.plan.adapted is not None
                  else f"{ADAPT_MLM_STEPS} MLM steps on your examples' texts")
    yield _adapt_status(histories, adapted_by), plots.classifier_curves(curves, planned), adapt_frame(histories)


def on_probe(visitor: Visitor, examples, seed):
    """Which layer knows the labels: a logistic-regression probe on each layer's frozen,
    mean-pooled hidden states (0 = embeddings), trained and scored on the classifier's split.

    Args:
        examples: the labelled examples, a table of (text, label) rows, at least two labels with two examples each; at most the server's example limit (2,000 by default).
        seed: fixes the held-out split (the classifier's with the same seed).

    Returns:
        a summary line and the accuracy-by-layer chart (plotly) with the majority-class baseline.
    """
    lm = visitor.lm
    result = embeddings.run_probe(lm, _probe_plan(visitor, examples, seed))
    best = result["layers"][result["best_layer"]]
    status = (f"Best: layer {best['layer']}, {best['accuracy']:.0%} held-out accuracy on "
              f"{result['held_out_size']} examples (trained on {result['train_size']}; always the most "
              f"frequent label: {result['baseline']:.0%}), {lm.name}.")
    if min(entry["accuracy"] for entry in result["layers"]) >= best["accuracy"] - 0.05:
        status += (" Every layer reads these labels, the embeddings too: they are in the words themselves. "
                   "Load the word-order examples to see where depth matters.")
    return status, plots.probe_accuracy_lines(result, f"Which layer knows your labels? ({lm.name})")


def check_probe(visitor: Visitor, examples, seed) -> list:
    """The validator: the probe's inputs checked once into its plan when the request is queued
    (`embeddings.plan_probe`), the problem beside its field (the error's `field`). The plan is
    kept for `on_probe`, which runs it."""
    fields = ["examples", "seed"]
    verdicts = [gr.validate(True, "")] * len(fields)
    try:
        plan = embeddings.plan_probe(table_examples(examples), seed, visitor.limits)
    except ValueError as err:
        field = getattr(err, "field", None)
        verdicts[fields.index(field) if field in fields else 0] = gr.validate(False, str(err))
    else:
        if visitor.session:  # a script's session is one too; no session: nothing to keep it for
            visitor.store.keep_result(visitor.session, PROBE_PLAN, (_request_key(examples, seed), plan),
                                      plan.nbytes)
    return verdicts


PROBE_PLAN = "probe plan"  # the session's kept result: (request key, plan) from the last check_probe


def _probe_plan(visitor: Visitor, examples, seed) -> embeddings.ProbePlan:
    """The plan `check_probe` made of these very inputs; for a caller whose request was not
    validated (a test, a plan freed since), the inputs checked into one now."""
    kept = visitor.store.result(visitor.session, PROBE_PLAN) if visitor.session else None
    if kept is not None and kept[0] is not None and kept[0] == _request_key(examples, seed):
        return kept[1]
    return embeddings.plan_probe(table_examples(examples), seed, visitor.limits)


def _request_key(examples, seed) -> str | None:
    """What identifies a probe request's inputs, unparsed: a digest of the table's rows as Gradio
    sends them (a list) and the seed; None for anything else (planned again, never confused)."""
    if not isinstance(examples, list):
        return None
    return hashlib.sha256(repr((examples, seed)).encode()).hexdigest()


def _adapt_live(log: EventLog) -> tuple:
    doing = ("MLM-adapting a copy of the base on your examples' texts…" if log.current == "adapting"
             else f"Training the classifier from the {log.current} body…")
    return f"{doing} {_live_status(log.latest)}", gr.skip(), gr.skip()


# ---------------------------------------------------------------- values in and out

def example_rows(name: str) -> list[list[str]]:
    return [list(pair) for pair in parse_examples((ASSETS / EXAMPLE_SETS[name]).read_text("utf-8"))]


def before_after_frame(history: ClassifierHistory, mlm: dict, head_trained: bool = True) -> pd.DataFrame:
    mlm_row = ("MLM loss of the body on your text (original MLM head)" if head_trained else
               "MLM loss of the body on your text (this model's MLM head is untrained: not meaningful)")

    def column(scores, mlm_scores) -> list[str]:
        return [f"{scores.loss:.3f}", f"{scores.accuracy:.1%}", f"{scores.macro_f1:.3f}", f"{mlm_scores.loss:.3f}"]
    return pd.DataFrame({"held-out": ["loss (cross-entropy)", "accuracy", "macro-F1", mlm_row],
                         "before": column(history.before, mlm["before"]),
                         "after": column(history.after, mlm["after"])})


def predictions_frame(history: ClassifierHistory) -> pd.DataFrame:
    return pd.DataFrame([{
        "": "✓" if p["correct"] else "✗", "text": p["text"], "label": p["label"],
        "predicted": p["predicted"],
        "probabilities": ", ".join(f"{k} {v:.0%}" for k, v in
                                   sorted(p["probabilities"].items(), key=lambda kv: -kv[1]))}
        for p in history.predictions])


def why_note(result: dict) -> str:
    """The decision, then how far to trust the dictionary: its held-out FVU and how well it
    reconstructs this very vector, and every active feature switched off at once."""
    quality, training = result["dictionary"]["quality"], result["dictionary"]["training"]
    interval = quality.get("interval") or [math.nan, math.nan]
    fit = (f"held-out FVU **{quality['fvu']:.2f}** ({interval[0]:.2f}-{interval[1]:.2f}, 95%) on "
           f"{quality.get('held_out_lines', quality.get('vectors', 0)):,} held-out lines, trained on "
           f"{training.get('lines', 0):,} lines" if "fvu" in quality else "no quality figures recorded")
    here = result["unexplained"]
    moved = (" (far more than on held-out lines: your classifier's tuned body has moved the [CLS] vector "
             "away from the ones the dictionary learnt)" if "fvu" in quality and here > 2 * quality["fvu"] else "")
    return (f"Decided **{result['label']}** at {result['probability']:.1%}. The [CLS] dictionary "
            f"({result['dictionary']['latents']:,} features, {result['dictionary']['k']} at most per sentence; "
            f"{fit}) leaves {here:.0%} of this vector's variance unexplained{moved}. "
            f"All {result['active']} active features switched off at once: {result['probability']:.1%} → "
            f"{result['together']:.1%}.")


def why_frame(result: dict) -> pd.DataFrame:
    rows = []
    for f in result["features"]:
        top = " · ".join(_clipped(t["text"]) for t in f["top"]) or "(no statistics)"
        fires = f"{f['fired']:,} of {f['lines']:,} lines" if f["fired"] is not None else ""
        rows.append(dict(zip(sections.WHY_COLUMNS, [f["feature"], top, f"{f['activation']:.2f}",
                                           f"{f['before']:.1%} → {f['after']:.1%}", f"{f['change']:+.1f}", fires])))
    return pd.DataFrame(rows, columns=list(sections.WHY_COLUMNS)) if rows else empty_table(sections.WHY_COLUMNS)


def _clipped(text: str, most: int = 60) -> str:
    return text if len(text) <= most else text[:most - 1].rstrip() + "…"


def _feature_store(visitor: Visitor):
    """The app's feature store, else the one its engine holds (where a [CLS] dictionary trained here is)."""
    return visitor.features if visitor.features is not None else shared_store(visitor.engine.caches)


def sweep_frame(sweep: dict) -> pd.DataFrame:
    before = sweep["mlm_before"].loss
    return pd.DataFrame([{"learning rate": f"{p['learning_rate']:g}", "held-out accuracy": f"{p['accuracy']:.1%}",
                          "macro-F1": f"{p['macro_f1']:.3f}", "MLM loss before": f"{before:.3f}",
                          "MLM loss after": f"{p['mlm_loss']:.3f}", "steps": p["steps"]}
                         for p in sweep["points"]])


def adapt_frame(histories: dict[str, ClassifierHistory]) -> pd.DataFrame:
    return pd.DataFrame([{"body": f"{run} body", "accuracy before": f"{h.before.accuracy:.1%}",
                          "accuracy after": f"{h.after.accuracy:.1%}",
                          "macro-F1 after": f"{h.after.macro_f1:.3f}",
                          "loss after": f"{h.after.loss:.3f}", "steps": len(h.steps)}
                         for run, h in histories.items()])


def _live_status(run) -> str:
    """A line on the training run the last events came from (a `loop.RunHistory`)."""
    if not run.steps:
        return "Scoring the untrained head on the held-out examples…"
    last = run.steps[-1]
    return f"Step {last.step}/{last.steps}: loss {last.loss:.3f}, lr {last.learning_rate:.1e}"


def _final_status(history: ClassifierHistory, model: str, kept: str, limits: Limits) -> str:
    chance = 1 / len(history.labels)
    why = live_run.ended_because(history.stopped, limits)
    head = (f"**Done**: {len(history.steps)} steps in {history.seconds:.1f} s" if history.completed
            else f"**Ended early** because {why}, after {len(history.steps)} of {history.planned_steps} "
                 f"steps ({history.seconds:.1f} s)")
    cut = f" {history.truncated} text(s) were cut at {MAX_TOKENS} tokens." if history.truncated else ""
    return (f"{head}, from **{model}**, on {history.train_size} examples; held-out accuracy "
            f"{history.before.accuracy:.0%} → **{history.after.accuracy:.0%}** on "
            f"{history.held_out_size} examples of {len(history.labels)} labels (chance "
            f"{chance:.0%}).{cut}\n\n{kept}")


def _head_trained(lm) -> bool:
    """False for a body with a newly initialised MLM head (a bare sentence-embedding body): its MLM loss
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
            f"{sweep['mlm_before'].loss:.3f}.{note}")


def _adapt_status(histories: dict[str, ClassifierHistory], adapted_by: str) -> str:
    if len(histories) < 2:
        return "Stopped before the second run: nothing to compare."
    base, adapted = histories["base"], histories["adapted"]
    gain = adapted.after.accuracy - base.after.accuracy
    return (f"Adapted body: {adapted_by}. Same seed, split and {base.planned_steps} steps. "
            f"Held-out accuracy: base body "
            f"{base.after.accuracy:.0%}, MLM-adapted body {adapted.after.accuracy:.0%} "
            f"({gain:+.0%}). With a few dozen held-out examples, one example is several points: "
            "try other seeds before believing a small difference.")


# ---------------------------------------------------------------- what a session keeps

KIND = "classifier"  # the session's model of this kind is its trained classifier (kinds.keep_classifier)


def _kept(visitor: Visitor) -> Classifier | None:
    return visitor.store.model(visitor.session, KIND)


def _zip(visitor: Visitor) -> Path:
    return life.model_zip(visitor.store, visitor.session, kind=KIND)
