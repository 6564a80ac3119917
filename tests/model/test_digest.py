"""The one weights digest (`bertdemo/model/digest.py`): the shipped dictionaries and transcoders
are found by the bundled model's digest, a changed weight is another digest (a tuned model never
sees its base's dictionaries, exports or indexes), and a model's device or precision never stops
it being computed."""
from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
import torch

from bertdemo.model.digest import model_digest, weights_digest

BUNDLED = Path(__file__).resolve().parents[2] / "assets" / "bundled"


def shipped_records() -> list[Path]:
    return [p for kind in ("features", "transcoders")
            for p in (BUNDLED / kind / "training.json", *sorted((BUNDLED / kind).glob("layer_*/record.json")))]


def test_the_bundled_models_digest_is_the_one_every_shipped_record_names(bundled):
    records = shipped_records()
    assert len(records) >= 2 * 7, "the shipped features and transcoders: a training.json and one record per layer"
    named = {str(p.relative_to(BUNDLED)): json.loads(p.read_text(encoding="utf-8"))["weights"] for p in records}
    assert named == {path: bundled.weights_digest for path in named}
    assert weights_digest(bundled.model) == bundled.weights_digest  # remembered, not another formula


def test_a_copy_has_its_models_digest_and_a_changed_weight_another(bundled):
    lm = dataclasses.replace(bundled, model=copy.deepcopy(bundled.model))
    assert lm.weights_digest == bundled.weights_digest and model_digest(lm) == model_digest(bundled)
    with torch.no_grad():
        next(lm.model.parameters()).view(-1)[0].add_(1e-3)  # in place: an optimizer step's way
    assert lm.weights_digest != bundled.weights_digest  # not the remembered one
    assert lm.weights_digest == weights_digest(lm.model)
    assert model_digest(lm) != model_digest(bundled)


def test_another_config_over_the_same_weights_is_another_model_digest(bundled):
    other = copy.deepcopy(bundled.model)
    other.config.layer_norm_eps = 1e-5
    lm = dataclasses.replace(bundled, model=other)
    assert lm.weights_digest == bundled.weights_digest and model_digest(lm) != model_digest(bundled)


def test_a_bfloat16_model_has_a_digest_of_its_own(bundled):
    half = copy.deepcopy(bundled.model).to(torch.bfloat16)  # numpy has no bfloat16: read as bytes
    assert weights_digest(half) != bundled.weights_digest


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_a_model_on_a_gpu_has_the_digest_it_has_on_the_cpu(bundled):
    assert weights_digest(copy.deepcopy(bundled.model).to("cuda")) == bundled.weights_digest
