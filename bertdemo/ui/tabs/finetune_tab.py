"""The fine-tune tab: a short MLM fine-tune on pasted text, live curves, Stop, before/after,
download, and switching this session's other tabs to the tuned model.

The run's life (its declaration, slot, plan, worker thread, Stop, time limit, what a stopped run
keeps, the zip) is `bertdemo.runs`'; this tab lays out the form, wires its two runs with
`live_run.wire` and turns their events into the live curve. One run per session: the validator
reserves the session's slot when the request enters the queue, so a second click is refused at
once, not queued behind.
"""
import re
from dataclasses import dataclass

import gradio as gr
import pandas as pd

from ... import plots
from ...config import Limits, Settings
from ...runs import life
from ...training.fine_tuning import FinetuneForm, MLMHistory, TuningRequest, default_probes
from ...training.loop import EventLog, overfitting
from ...training.mlm_data import split_units
from ...views.compare import compare_probes
from . import export_button
from ..parts import live_run
from ..parts.common import empty_table
from ..parts.context import AppContext, Visitor, handler, standalone_demo
from ..parts.model_line import model_line

EXAMPLE_TEXT = """Paris is the capital of France.
The Eiffel Tower is a famous landmark.
La Tour Eiffel est située à Paris.
The Louvre in Paris is the most visited museum in the world.
The Seine flows through the centre of Paris.
Montmartre is a hill in the north of Paris.
The Eiffel Tower was built for the World's Fair of 1889.
Notre-Dame is a cathedral on an island in the Seine."""
ARTICLE_TEXT = """Paris is the capital of France.
The Eiffel Tower is a famous landmark.
La Tour Eiffel est située à Paris."""
INTRO = """Paste some text, fine-tune a copy of the model on it with masked-language modelling, and
watch it learn. The base model is never changed and nobody else sees your model. About one line
in ten is held out for evaluation with **fixed masks**, so the before/after numbers compare
(with fewer than 4 lines, evaluation uses the training lines themselves: it then measures
memorising, and the page says so). Masking: *dynamic* draws fresh masks for every batch,
*static* draws them once and reuses them every epoch (the original BERT). Once held-out loss has
risen for two evaluations past its lowest the run is overfitting, and the page says so; by default
the model keeps the weights of that best evaluation (as Trainer's `load_best_model_at_end`)."""
PROBES_INFO = ("The suggested probes are lines of your training text with a word masked: the run trains on "
               "them, so their scores measure memorisation. To see what it learnt in general, write "
               "sentences it never saw.")


def render(ctx: AppContext) -> None:
    """Build the tab's components and events inside the current Blocks/Tab context."""
    limits = ctx.settings.limits
    gr.Markdown(INTRO)
    active = gr.Markdown(model_line(ctx.store, None, "finetune"))
    form = _section_form(limits)
    run = _section_run()
    model = _section_model()
    export_button.render(ctx)
    compare_status, compare_plot = _section_compare()

    live_run.wire(ctx, "finetune", run.button, form.finetune_form, [*run.outputs, active], on_finetune)
    live_run.wire(ctx, "compare_masking", run.compare, form.fields, [compare_status, compare_plot], on_compare)
    run.stop.click(handler(ctx, on_stop), None, run.status, api_name="stop_finetune", queue=False)
    model.use_tuned.click(handler(ctx, on_use_tuned), None, active, api_name="use_tuned", queue=False)
    model.use_base.click(handler(ctx, on_use_base), None, active, api_name="use_base", queue=False)
    model.download_button.click(handler(ctx, on_download), None, model.download, api_name="download_tuned",
                                concurrency_id="model")
    form.suggest.click(handler(ctx, on_suggest), form.fields["text"], form.probes, api_name="suggest_probes",
                       queue=False)


@dataclass
class FormSection:
    """The run's form: `fields` maps the request's field names (both runs read them) to their
    components; the two keep boxes, the probes and their Suggest button are the fine-tune's own."""

    fields: dict
    keep_partial: gr.Checkbox
    keep_best: gr.Checkbox
    probes: gr.Textbox
    suggest: gr.Button

    @property
    def finetune_form(self) -> dict:
        """The fine-tune's form: the shared fields, the keep boxes and the probes."""
        return {**self.fields, "keep_partial": self.keep_partial, "keep_best": self.keep_best,
                "probes": self.probes}


def _section_form(limits: Limits) -> FormSection:
    text = gr.Textbox(label="Your text (one sentence or paragraph per line)", value=EXAMPLE_TEXT,
                      lines=8, info=f"At most {limits.max_chars:,} characters.")
    # no max_length: the browser would cut a longer paste silently; the plan refuses it, saying both lengths
    gr.Examples([[EXAMPLE_TEXT], [ARTICLE_TEXT]], inputs=text,
                example_labels=["Paris, 8 lines", "The article's 3 sentences"])
    with gr.Row():
        length = gr.Number(label="Training length", value=30, minimum=0,
                           info=f"Steps (at most {limits.max_steps}) or epochs.")
        unit = gr.Radio(["steps", "epochs"], value="steps", label="Counted in")
        lr = gr.Number(label="Learning rate", value=5e-5, info="5e-5 as in the article.")
        batch = gr.Slider(1, limits.max_batch_size, value=8, step=1, label="Batch size (blocks)")
        block = gr.Slider(16, 512, value=128, step=8, label="Block length (tokens)",
                          info="Sentences are packed into blocks of this many tokens at most "
                               "(capped at the model's maximum).")
    with gr.Row():
        probability = gr.Slider(0.05, 0.5, value=0.15, step=0.01, label="Mask probability")
        masking = gr.Radio(["dynamic", "static"], value="dynamic", label="Masking")
        seed = gr.Number(label="Seed", value=0, precision=0)
        keep_partial = gr.Checkbox(False, label="Keep the model if I press Stop or the time runs out",
                                   info="Off: a stopped run never replaces your previous tuned model.")
        keep_best = gr.Checkbox(True, label="Keep the weights of the best evaluation",
                                info="As Trainer's load_best_model_at_end: once held-out loss rises, the "
                                     "model of its lowest point is kept, not the last step's.")
    probes = gr.Textbox(label="Probe sentences, one per line, with [MASK]", lines=3,
                        value="\n".join(default_probes(EXAMPLE_TEXT)), info=PROBES_INFO)
    suggest = gr.Button("Suggest probes from my text", size="sm")
    fields = dict(text=text, training_length=length, length_unit=unit, learning_rate=lr, batch_size=batch,
                  block_length=block, mask_probability=probability, masking=masking, seed=seed)
    return FormSection(fields, keep_partial, keep_best, probes, suggest)


@dataclass
class RunSection:
    """The run's buttons, and what `on_finetune` streams (before the model line), in `outputs` order."""

    button: gr.Button
    stop: gr.Button
    compare: gr.Button
    status: gr.Markdown
    curve: gr.Plot
    metrics: gr.Dataframe
    probes: gr.Dataframe

    @property
    def outputs(self) -> list:
        return [self.status, self.curve, self.metrics, self.probes]


def _section_run() -> RunSection:
    with gr.Row():
        run_btn = gr.Button("Fine-tune", variant="primary")
        stop_btn = gr.Button("Stop", variant="stop")
        compare_btn = gr.Button("Compare static vs dynamic masking")
    status = gr.Markdown(elem_id="finetune-status")
    curve = gr.Plot(label="Loss and eval accuracy, live")
    metrics = gr.Dataframe(empty_table(METRIC_COLUMNS), label="Evaluation on held-out lines, fixed masks",
                           interactive=False, elem_id="finetune-metrics")
    probe_table = gr.Dataframe(empty_table(PROBE_COLUMNS), label="Top-3 fill-mask predictions, before and after",
                               interactive=False, elem_id="finetune-probes")
    return RunSection(run_btn, stop_btn, compare_btn, status, curve, metrics, probe_table)


@dataclass
class ModelSection:
    """What to do with the tuned model: use it, go back to the base one, download it (and the file)."""

    use_tuned: gr.Button
    use_base: gr.Button
    download_button: gr.Button
    download: gr.File


def _section_model() -> ModelSection:
    with gr.Row():
        use_tuned_btn = gr.Button("Use my tuned model in all tabs")
        use_base_btn = gr.Button("Back to the base model")
        download_btn = gr.Button("Download my tuned model (.zip)")
    download = gr.File(label="Tuned model: save_pretrained folder + tokenizer, zipped", height=90)
    return ModelSection(use_tuned_btn, use_base_btn, download_btn, download)


def _section_compare():
    with gr.Accordion("Static vs dynamic masking, measured on your text", open=False):
        gr.Markdown("Runs the fine-tune twice with the same seed, text, steps and eval masks; only "
                    "the training masks differ. The models are not kept.")
        return gr.Markdown(), gr.Plot(label="Eval curves, overlaid")


def create_demo(store=None, settings: Settings | None = None) -> gr.Blocks:
    """The tab on its own, for running or testing it alone."""
    return standalone_demo("fine-tune", render, store, settings)


# ---------------------------------------------------------------- handlers

def on_finetune(visitor: Visitor, request: TuningRequest, progress=gr.Progress()):
    outcome = yield from live_run.stream(visitor, "finetune", request, progress, _live_outputs,
                                         desc="fine-tuning", cleared=_cleared())  # the last run's tables go
    (tuned, history), plan = outcome.result, outcome.plan
    rows = compare_probes(plan.finetune.lm, tuned, plan.probes, max_masks=visitor.settings.max_masks)
    saved = outcome.kept.kept  # a stopped run not kept: its "after" is shown, said to be gone
    best = history.kept and (history.kept.step, f"{'kept' if saved else 'best'}: step {history.kept.step}")
    note = "\n\n".join(filter(None, [memorised_note(plan.probes, plan.text),
                                      live_run.kept_note(outcome.kept, visitor.limits)]))
    yield (_final_status(history, note, saved),
           plots.finetune_curves(history.steps, history.evals, history.planned_steps, best=best or None),
           _metrics_frame(history, saved), _probe_frame(rows, history, saved),
           model_line(visitor.store, visitor.session, "finetune"))


def on_compare(visitor: Visitor, form: FinetuneForm, progress=gr.Progress()):
    outcome = yield from live_run.stream(
        visitor, "compare_masking", form, progress,
        lambda log: ("Running static, then dynamic masking…", plots.masking_comparison(log.runs)))
    yield _compare_status(outcome.result, visitor.limits), plots.masking_comparison(outcome.result)


def _cleared() -> tuple:
    return ("Starting…", None, empty_table(METRIC_COLUMNS), empty_table(PROBE_COLUMNS), gr.skip())


def _live_outputs(log: EventLog) -> tuple:
    run = log.latest
    best = overfitting(run.evals)
    lowest = (best.step, f"lowest held-out loss: step {best.step}") if best else None
    return (_live_status(run.steps, run.evals),
            plots.finetune_curves(run.steps, run.evals, run.planned_steps or None, best=lowest),
            gr.skip(), gr.skip(), gr.skip())


def on_stop(visitor: Visitor) -> str:
    if live_run.stop(visitor):
        return "Stopping after the current step…"
    return "Nothing is running: there is no fine-tune of yours to stop."


def on_use_tuned(visitor: Visitor) -> str:
    visitor.store.use_tuned(visitor.session)
    return model_line(visitor.store, visitor.session, "finetune")


def on_use_base(visitor: Visitor) -> str:
    visitor.store.use_base(visitor.session)
    return model_line(visitor.store, visitor.session, "finetune")


def on_download(visitor: Visitor) -> str:
    return str(life.model_zip(visitor.store, visitor.session))


def on_suggest(visitor: Visitor, text) -> str:
    found = default_probes(text)
    if not found:
        raise ValueError("No line of your text has 3 to 40 words to make a probe from: "
                         "write probes by hand, e.g. 'Paris is the [MASK] of France.'")
    return "\n".join(found)


# ---------------------------------------------------------------- results

def memorised_note(probes: list[str], text: str) -> str:
    """What the page says when probes are sentences of the training text (a word masked, as
    "Suggest probes from my text" makes them): their "after" measures memorisation; "" if none."""
    lines = split_units(text)
    trained = [p for p in probes
               if any(re.fullmatch(re.escape(p).replace(re.escape("[MASK]"), ".+?"), line) for line in lines)]
    if not trained:
        return ""
    which = ("The probe is" if len(probes) == 1 else "All the probes are" if len(trained) == len(probes)
             else f"{len(trained)} of the {len(probes)} probes {'is' if len(trained) == 1 else 'are'}")
    return (f"⚠️ {which} from your training text: their “after” measures **memorisation** (the run trains "
            "on all but the held-out lines), not what the model learnt in general; write sentences it "
            "never saw for that.")


def _live_status(steps: list, evals: list = ()) -> str:
    if not steps:
        return "Evaluating the base model…"
    last = steps[-1]
    line = (f"Step {last.step}/{last.steps} — loss {last.loss:.3f}, "
            f"lr {last.learning_rate:.2e}, {last.tokens_per_s:,.0f} tokens/s")
    warning = overfitting_warning(list(evals))
    return f"{line}\n\n{warning}" if warning else line


def overfitting_warning(evals: list) -> str | None:
    """What the page says once held-out loss has risen for two evaluations past its lowest."""
    best = overfitting(evals)
    if best is None:
        return None
    rises = len(evals) - 1 - evals.index(best)
    return (f"⚠️ **Overfitting**: held-out loss has risen for {rises} evaluations since its lowest, "
            f"{best.loss:.3f} at **step {best.step}** (now {evals[-1].loss:.3f}). The model is learning "
            "its training lines by heart.")


def _final_status(history: MLMHistory, note: str, saved: bool = True) -> str:
    done = len(history.steps)
    where = ("⚠️ Evaluated on the **training lines** (fewer than 4 lines: nothing held out), so "
             "this measures memorising." if history.eval_on_train
             else f"Evaluated on {history.eval_lines} held-out line(s).")
    head = (f"**Done**: {done} steps in {history.seconds:.1f} s ({history.tokens_per_s:,.0f} "
            f"tokens/s) on {history.train_lines} training line(s) packed into "
            f"{history.train_blocks} block(s)." if history.completed
            else f"**Ended early** after {done} steps ({history.seconds:.1f} s).")
    return f"{head} {where}\n\n" + "".join(f"{part}\n\n" for part in _kept_lines(history, saved)) + note


def _kept_lines(history: MLMHistory, saved: bool = True) -> list[str]:
    """The overfitting warning, and which step's weights the run returned (`saved`: and the
    session kept them)."""
    warning = overfitting_warning(history.evals)
    if history.kept is not None:
        took = (f"**Kept the weights of step {history.kept.step}**" if saved
                else f"The run returned the weights of step {history.kept.step}")
        gone = "" if saved else " (not kept: see below)"
        return [line for line in (warning, f"{took}, its best evaluation (held-out loss "
                f"{history.kept.loss:.3f}; the last step's: {history.after.loss:.3f}): the “after” "
                f"columns below are that model{gone}.") if line]
    if warning and not history.settings.get("keep_best", False):
        return [warning + " This run kept the last step's weights (tick “Keep the weights of the best "
                "evaluation” to keep the best)."]
    return [warning] if warning else []


METRIC_COLUMNS = ("metric", "before", "after")
PROBE_COLUMNS = ("probe", "before (base model)", "after (this run's model)")


def _after_header(history: MLMHistory, header: str, saved: bool = True) -> str:
    """The "after" columns' header: the model the run returned, and whether the session kept it (a
    stopped run's model, not kept, is shown once, said to be gone: no tab can use it)."""
    if not saved:
        step = history.kept.step if history.kept is not None else len(history.steps)
        return f"after (step {step}, not kept)"
    return f"after (kept: step {history.kept.step})" if history.kept is not None else header


def _metrics_frame(history: MLMHistory, saved: bool = True) -> pd.DataFrame:
    """Before training, and the model the run returned (the kept best evaluation, else the last);
    `saved`: whether the session kept it (the header says which)."""
    def column(scores) -> list:
        return [round(scores.loss, 4), f"{scores.accuracy:.1%}", round(scores.perplexity, 2), scores.masked]
    metric, before, after = METRIC_COLUMNS
    return pd.DataFrame({metric: ["masked-token loss", "masked-token accuracy", "perplexity exp(loss)",
                                  "masked tokens scored"],
                         before: column(history.before),
                         _after_header(history, after, saved): column(history.returned)})


def _probe_frame(rows: list[dict], history: MLMHistory | None = None, saved: bool = True) -> pd.DataFrame:
    def cell(predictions: list[list[dict]]) -> str:
        return " | ".join(", ".join(f"{p['token'].strip()} {p['score']:.0%}" for p in mask)
                          for mask in predictions)
    probe, before, after = PROBE_COLUMNS
    return pd.DataFrame({probe: [r["probe"] for r in rows],
                         before: [cell(r["before"]) for r in rows],
                         (_after_header(history, after, saved) if history else after): [cell(r["after"]) for r in rows]})


def _compare_status(histories: dict, limits: Limits) -> str:
    lines = ["| masking | steps | eval loss before → after | eval accuracy before → after |",
             "| --- | --- | --- | --- |"]
    for name, h in histories.items():
        lines.append(f"| {name} | {len(h.steps)} | {h.before.loss:.3f} → {h.after.loss:.3f} "
                     f"| {h.before.accuracy:.1%} → {h.after.accuracy:.1%} |")
    ended = [f"{name}: {live_run.ended_because(h.stopped, limits)}" for name, h in histories.items() if h.stopped]
    if ended:
        lines.append("\nEnded early — " + "; ".join(ended) + ".")
    if len(histories) < 2:
        lines.append("\nOnly one run finished: the comparison is incomplete.")
    return "\n".join(lines)
