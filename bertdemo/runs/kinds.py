"""The kinds of run, each declared once in `RUNS` (see `runs.life` for a run's whole life): its
endpoint, its request, how it is checked into a plan, the job, and what the session keeps."""
from __future__ import annotations

from typing import Callable

from ..circuits.transcoder_run import TranscodersPlan, TranscodersRequest, run_transcoders
from ..circuits.transcoders import store_of
from ..features.run import FeaturesPlan, FeaturesRequest, run_features
from ..training import export
from ..training.classification import ClassifierForm, run_adaptation, run_classifier
from ..training.experiments import LabellingForm, run_labelling
from ..training.fine_tuning import FinetuneForm, TuningPlan, TuningRequest, run_masking_comparison, run_tuning
from ..training.forgetting import SweepForm, run_sweep
from .life import Kept, RunSpec, keep_or_discard


def keep_tuned(caller, plan: TuningPlan, result) -> Kept:
    """The tuned model by `keep_or_discard` (a stopped run's only when the request asked), and the
    run, whatever became of its model, as the session's last one for the Trainer-script export
    (its base named as the export names it: `export.finished_run`)."""
    tuned, history = result
    kept = keep_or_discard(caller, tuned, history, plan.keep_partial)
    export.remember(caller.store, caller.session, export.finished_run(
        history, plan.finetune.lm.name, plan.text, caller.settings.allowed_models))
    return kept


def keep_classifier(caller, plan, result) -> Kept:
    """A classifier is kept even when stopped (its scores are shown where it stopped), never when
    its loss diverged; it replaces the session's earlier one."""
    classifier, history = result
    return keep_or_discard(caller, classifier, history, keep_partial=True, kind="classifier")


def base_model(caller):
    """The caller's base model (the one it picked, else the app's): what fine-tunes start from, so
    that a tuned model is never tuned further."""
    return caller.store.base_for(caller.session)


def session_model(caller):
    """The model the caller's tabs use now (its tuned model when switched on)."""
    return caller.store.for_session(caller.session)


def planned_on(model_of: Callable) -> Callable:
    """A `check` that plans the request on `model_of(caller)`, within the caller's limits."""
    return lambda caller, request: request.plan(model_of(caller), caller.limits)


def check_features(caller, request: FeaturesRequest) -> FeaturesPlan:
    """Planned on the session's model (its tuned model when switched on: a dictionary belongs to
    the weights it was trained on), kept in the app's feature store."""
    return request.plan(session_model(caller), caller.limits, caller.features)


def keep_features(caller, plan: FeaturesPlan, result) -> Kept:
    """Nothing of the session's: the job has already kept the dictionary in the app's store (or
    not, for a stopped run without `keep_partial`). The facts, for the page: kept or not, why the
    run ended early, its steps."""
    dictionary, history = result
    return Kept(kind="features", kept=dictionary is not None, stopped=history.stopped,
                steps_done=len(history.steps))


def transcoder_store(caller):
    """The app's transcoders: the caller's own store where it has one (`caller.transcoders`), else
    the one its engine holds (`transcoders.store_of`: the shipped ones, and those trained here in the
    engine's disk cache, within its one budget)."""
    own = getattr(caller, "transcoders", None)
    return own if own is not None else store_of(caller.engine.caches)


def check_transcoders(caller, request: TranscodersRequest) -> TranscodersPlan:
    """Planned on the session's model (transcoders belong to the weights they were trained on),
    kept in the app's transcoder store."""
    return request.plan(session_model(caller), caller.limits, transcoder_store(caller))


def keep_transcoders(caller, plan: TranscodersPlan, result) -> Kept:
    """Nothing of the session's: the job has kept the transcoders in the app's store (or not). The facts."""
    transcoders, history = result
    return Kept(kind="transcoders", kept=bool(transcoders), stopped=history.stopped, steps_done=len(history.steps))


def check_adaptation(caller, form: ClassifierForm):
    """From the base body and from the session's tuned one (or one tuned on the examples first)."""
    return form.adaptation(base_model(caller), caller.store.tuned(caller.session), caller.limits)


RUNS: dict[str, RunSpec] = {spec.api_name: spec for spec in (
    RunSpec("finetune", TuningRequest, planned_on(base_model), run_tuning, keep_tuned),
    RunSpec("compare_masking", FinetuneForm, planned_on(base_model), run_masking_comparison, trainings=2),
    RunSpec("article_finetune", LabellingForm, planned_on(session_model), run_labelling, trainings=2),
    RunSpec("train_classifier", ClassifierForm, planned_on(session_model), run_classifier, keep_classifier),
    RunSpec("forgetting_sweep", SweepForm, planned_on(session_model), run_sweep, trainings=3),
    RunSpec("adapt_then_classify", ClassifierForm, check_adaptation, run_adaptation, trainings=3),
    RunSpec("train_features", FeaturesRequest, check_features, run_features, keep_features),
    RunSpec("train_transcoders", TranscodersRequest, check_transcoders, run_transcoders, keep_transcoders),
)}
