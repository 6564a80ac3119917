"""A model's transcoders trained live, from the page: "Train transcoders" as a run (`runs.kinds`).

    request = TranscodersRequest(texts="", keep_partial=True)   # the endpoint's parameters
    plan = request.plan(lm, limits, store)        # checked once, when the request is queued
    transcoders, history = run_transcoders(plan, on_event=..., should_stop=...)

As "Train features" (`features/run.py`), with the same limits (the operator's token and time caps
for features), Stop, the disk budget, and the same events (`FeatureProgress`): the job is
`transcoders.train_transcoders` on every layer at once (a circuit needs all of them; one forward per
batch feeds every layer's coder), and what it keeps goes into the app's transcoder store, under
the model's weights, for every visitor of that model. A model with shipped transcoders is never
trained again from the page (the Python API can).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .. import validate
from ..config import Limits
from ..features.run import FeatureProgress, checked_texts, live_settings
from ..features.store import FeatureStore
from ..features.training import FeatureSettings
from ..forward import mlp_points
from ..model.loading import LoadedModel
from .transcoders import SETTINGS, train_transcoders


@dataclass(frozen=True)
class TranscodersRequest:
    """The "Train transcoders" button's request: its fields are the endpoint's parameters."""

    texts: str = ""  # one sentence or paragraph per line; empty: the default corpus
    keep_partial: bool = True  # keep the transcoders of a run stopped early (Stop, time limit)

    def plan(self, lm: LoadedModel, limits: Limits, store: FeatureStore) -> "TranscodersPlan":
        """The run's plan on `lm` within `limits`; ValueError for a family whose feed-forward blocks
        the anatomy cannot find, InputError naming the field at fault (too much text or too little)."""
        layers = list(range(1, mlp_points.check(lm.model, "Transcoders") + 1))
        if all(store.is_shipped(lm, layer) for layer in layers):
            raise validate.InputError("texts", f"{lm.name} already has transcoders for every layer, the ones "
                                               "shipped with it, which every visitor reads "
                                               "(bertdemo.train_transcoders can train others in Python).")
        return TranscodersPlan(lm, layers, checked_texts(lm, self.texts, limits), live_settings(limits, SETTINGS),
                               store, bool(self.keep_partial))


@dataclass(frozen=True)
class TranscodersPlan:
    """What the job runs: the model, its layers (all), the corpus lines (None: the default corpus),
    the training's limits, the store kept transcoders go into, and whether a stopped run's are kept."""

    lm: LoadedModel
    layers: list[int]
    texts: list[str] | None
    settings: FeatureSettings
    store: FeatureStore
    keep_partial: bool


def run_transcoders(plan: TranscodersPlan, *, on_event: Callable | None = None,
                    should_stop: Callable[[], bool] | None = None):
    """The plan's `train_transcoders`: ({layer: transcoder} kept in the plan's store, empty when a
    stopped run is not kept; its `FeatureHistory`). Each step is reported as a `FeatureProgress`
    (FVU and dead share per layer, in the plan's layer order)."""
    limits = plan.settings.max_tokens, plan.settings.max_seconds
    report = None if on_event is None else (lambda step: on_event(FeatureProgress(step, *limits)))
    return train_transcoders(plan.lm, plan.layers, plan.texts, plan.settings, store=plan.store, on_event=report,
                             should_stop=should_stop, keep_partial=plan.keep_partial)
