"""The features' training loop ends as every training loop does (`bertdemo/training/loop.py`
`stop_reason`, the one stop rule): the reason a run's stop check gives (Stop, the time limit, the
server's shut-down, the page closed) is what its history says, past its time limit it ends saying
so, and a run that saw every planned token ended of itself. The MLM loop beside it, on the same
checks, says the same."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

import bertdemo
import tiny_models
from bertdemo.features import dictionary  # noqa: F401 - first: sparsify's decoder switch
from bertdemo.features.data import Lines
from bertdemo.features.training import FeatureSettings, train
from bertdemo.training import loop

TEXTS = ["the cat sat on the mat.", "a dog ran in the park.", "she reads a book at home."] * 20


class StopCheck:
    """A `should_stop` as `runs.slots.StopCheck` is: true after `steps` calls, with its reason."""

    def __init__(self, steps: int, reason: str | None):
        self.steps, self.asked, self.reason = steps, 0, None
        self._reason = reason

    def __call__(self) -> bool:
        self.asked += 1
        if self.asked > self.steps:
            self.reason = self._reason
            return True
        return False


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return bertdemo.load(str(tiny_models.save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))), device="cpu")


def features_run(lm, should_stop=None, max_seconds=math.inf, max_tokens=10**9):
    settings = FeatureSettings(max_tokens=max_tokens, max_seconds=max_seconds, batch_tokens=64, pause=0.0)
    _, history = train(lm, [1], Lines(lm, TEXTS), settings, should_stop=should_stop)
    return history.stopped, len(history.steps)


def mlm_loop_run(lm, should_stop=None, max_seconds=math.inf):
    model = torch.nn.Linear(4, 1)
    history = loop.RunHistory(planned_steps=50)
    loop.train(model, itertools.repeat({"x": torch.ones(2, 4)}), lambda b: model(b["x"]).pow(2).mean(),
               lambda step: loop.Evaluation(step, 0.0, 0.0), history, learning_rate=1e-3,
               max_seconds=max_seconds, should_stop=should_stop)
    return history.stopped, len(history.steps)


@pytest.mark.parametrize("reason", [None, "time limit", "shutdown", "closed"])
def test_a_stop_checks_reason_is_the_runs_in_both_loops(lm, reason):
    expected = (reason or "stopped", 2)
    assert features_run(lm, StopCheck(2, reason)) == expected
    assert mlm_loop_run(lm, StopCheck(2, reason)) == expected


def test_past_its_time_limit_a_run_ends_saying_so_before_any_step(lm):
    assert features_run(lm, max_seconds=0) == ("time limit", 0)
    assert mlm_loop_run(lm, max_seconds=0) == ("time limit", 0)


def test_a_run_that_saw_every_planned_token_ended_of_itself(lm):
    stopped, steps = features_run(lm, StopCheck(10**6, "time limit"), max_tokens=100)
    assert stopped is None and steps >= 1
