"""A dictionary trained live, from the page: "Train features for layer N" as a run (`runs.kinds`).

    request = FeaturesRequest(layer=3, texts="", keep_partial=True)   # the endpoint's parameters
    plan = request.plan(lm, limits, store)         # checked once, when the request is queued
    dictionary, history = run_features(plan, on_event=..., should_stop=...)

The job is `making.train_features` on the plan; a dictionary it keeps goes into the app's
`FeatureStore`, so every visitor of that model (its weights) is offered it from then on; a later
run of the same layer replaces it (the latest wins, as with any shared cache). A shipped dictionary
is never trained again from the page: one visitor's short run never replaces what the demo ships
(the Python API can, `train_features`).
A stopped run's dictionary is kept when the request says `keep_partial` (the default: most runs
end at their time limit, and one minute of training already gives usable features).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from .. import validate
from ..config import Limits
from ..forward import splice
from ..model.loading import LoadedModel
from .making import corpus_lines, train_features
from .store import FeatureStore
from .training import FeatureSettings, FeatureStep


@dataclass(frozen=True)
class FeaturesRequest:
    """The "Train features" button's request: its fields are the endpoint's parameters."""

    layer: int = 1  # 0 = the embeddings, N = the N-th layer's output
    texts: str = ""  # one sentence or paragraph per line; empty: the default corpus
    keep_partial: bool = True  # keep the dictionary of a run stopped early (Stop, time limit)

    def plan(self, lm: LoadedModel, limits: Limits, store: FeatureStore) -> "FeaturesPlan":
        """The run's plan on `lm` within `limits`; InputError naming the field at fault (a layer
        out of range or that already has a dictionary, too much text or too little)."""
        layer = splice.check_layer(lm.model, self.layer)
        if store.is_shipped(lm, layer):
            raise validate.InputError("layer", f"Layer {layer} of {lm.name} already has a feature dictionary, "
                                               "the one shipped with it, which every visitor reads: pick a layer "
                                               "without one (bertdemo.train_features can train it in Python).")
        return FeaturesPlan(lm, layer, checked_texts(lm, self.texts, limits), live_settings(limits), store,
                            bool(self.keep_partial))


def checked_texts(lm: LoadedModel, texts, limits: Limits) -> list[str] | None:
    """A live run's corpus: the visitor's lines (None: the default corpus); InputError naming
    "texts" for what is not text, too much of it, or too little to learn from."""
    texts = texts or ""
    if not isinstance(texts, str):
        raise validate.InputError("texts", "The text must be text, one sentence per line, got "
                                           f"{validate.shown(texts)}.")
    validate.length_at_most(len(texts), limits.max_chars, "text", fix="Paste less, or leave it empty for "
                            "the default corpus.", field="texts")
    lines = [line for line in texts.splitlines() if line.strip()] or None
    if lines is not None:
        corpus_lines(lm, lines)  # too little text to learn from: refused now, beside the box
    return lines


def live_settings(limits: Limits, settings: FeatureSettings = FeatureSettings()) -> FeatureSettings:
    """`settings` within a live run's limits: the operator's token and time caps for features."""
    return replace(settings, max_tokens=limits.features_max_tokens,
                   max_seconds=min(limits.features_max_seconds, limits.max_seconds))


@dataclass(frozen=True)
class FeaturesPlan:
    """What the job runs: the model, its layer, the corpus lines (None: the default corpus), the
    training's limits, the store a kept dictionary goes into, and whether a stopped run's is kept."""

    lm: LoadedModel
    layer: int
    texts: list[str] | None
    settings: FeatureSettings
    store: FeatureStore
    keep_partial: bool


@dataclass(frozen=True)
class FeatureProgress:
    """One training step as a live run reports it: the step and the run's limits. `run` is the
    label `training.loop.EventLog` files events under (one training run: None)."""

    step: FeatureStep
    max_tokens: int
    max_seconds: float
    run: str | None = None

    @property
    def done(self) -> float:
        """How far the run is, 0 to 1: by tokens or by time, whichever is further."""
        by_tokens = self.step.tokens / max(1, self.max_tokens)
        return min(1.0, max(by_tokens, self.step.elapsed / max(1e-9, self.max_seconds)))


def run_features(plan: FeaturesPlan, *, on_event: Callable | None = None,
                 should_stop: Callable[[], bool] | None = None):
    """The plan's `making.train_features`: (the dictionary, kept in the plan's store, or None when
    a stopped run is not kept; its `FeatureHistory`). Each step is reported as a `FeatureProgress`."""
    limits = plan.settings.max_tokens, plan.settings.max_seconds
    report = None if on_event is None else (lambda step: on_event(FeatureProgress(step, *limits)))
    return train_features(plan.lm, plan.layer, plan.texts, plan.settings, store=plan.store, on_event=report,
                          should_stop=should_stop, keep_partial=plan.keep_partial)
