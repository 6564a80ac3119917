"""`--dtype auto` (`bertdemo/model/precision.py`): the precision is picked by timing both on the
model, bfloat16 only where it clearly wins a crowd and loses nothing on one sentence, and the page
says what was picked and why; bfloat16 weights go through oneDNN's packed kernels where the CPU
multiplies bfloat16 natively, with the model's own answers."""
from __future__ import annotations

import pytest
import torch

import bertdemo
from bertdemo.forward import lean_forward
from bertdemo.model import precision
from bertdemo.model.loading import pick_dtype


def test_auto_is_a_dtype_choice_and_the_refusal_names_it(tiny_bert_dir):
    assert pick_dtype(" Auto ") == precision.AUTO
    with pytest.raises(ValueError, match="float32, bfloat16 or auto"):
        bertdemo.load(str(tiny_bert_dir), device="cpu", dtype="float16")


@pytest.mark.parametrize("gains, expected", [((2.0, 1.0), torch.bfloat16), ((1.1, 1.3), torch.float32),
                                             ((3.0, 0.8), torch.float32), ((1.25, 0.95), torch.bfloat16)])
def test_bfloat16_only_where_it_wins_the_crowd_and_loses_nothing_alone(gains, expected, tiny_bert, monkeypatch):
    monkeypatch.setattr(precision, "native_bf16", lambda: True)
    monkeypatch.setattr(precision, "timed", lambda model, seconds: gains)
    picked = precision.pick(tiny_bert.model, torch.device("cpu"))
    assert picked.dtype == expected
    assert f"{gains[0]:.2f}x" in picked.why and f"{gains[1]:.2f}x" in picked.why


def test_without_native_bfloat16_nothing_is_timed(tiny_bert, monkeypatch):
    monkeypatch.setattr(precision, "native_bf16", lambda: False)
    monkeypatch.setattr(precision, "timed", lambda *a: pytest.fail("timed on a CPU without bfloat16 products"))
    picked = precision.pick(tiny_bert.model, torch.device("cpu"))
    assert picked.dtype == torch.float32 and "no native bfloat16" in picked.why


def test_timing_leaves_the_model_as_it_was(tiny_bert):
    before = {name: p.clone() for name, p in tiny_bert.model.state_dict().items()}
    crowd, one = precision.timed(tiny_bert.model, seconds=0.05)
    assert crowd > 0 and one > 0
    after = tiny_bert.model.state_dict()
    assert all(after[name].dtype == torch.float32 and torch.equal(after[name], value) for name, value in before.items())


def test_a_model_loaded_with_auto_says_what_it_picked(tiny_bert_dir):
    from bertdemo.ui.parts.model_line import _precision

    lm = bertdemo.load(str(tiny_bert_dir), device="cpu", dtype="auto")
    weights = {p.dtype for p in lm.model.parameters()}
    assert weights == {getattr(torch, lm.card.dtype)}
    assert lm.card.precision.startswith(lm.card.dtype)
    rows = bertdemo.fill_mask(lm, "Paris is the [MASK] of France.", top_k=3)
    assert len(rows[0]) == 3 and 0 < sum(p["score"] for p in rows[0]) <= 1 + 1e-6
    assert _precision(lm) == ("" if lm.card.dtype == "float32" else ", in bfloat16 (faster on this CPU; see the model card)")


@pytest.mark.skipif(not lean_forward.packs_bf16(), reason="this CPU has no native bfloat16 products")
def test_packed_bfloat16_gives_the_models_own_bfloat16_answers(engine, tiny_bert_dir):
    bf16 = engine.load(str(tiny_bert_dir), device="cpu", dtype="bfloat16")
    inputs = bf16.tokenizer(["Paris is the [MASK] of France.", "The [MASK] sat on the mat ."],
                            return_tensors="pt", padding=True)
    rows = torch.tensor([0, 1])
    cols = (inputs["input_ids"] == bf16.tokenizer.mask_token_id).nonzero()[:, 1]
    packed = lean_forward.PackedWeights()
    with torch.inference_mode():
        hidden = lean_forward.hidden_at(bf16.model, dict(inputs), rows, cols, packed)
        own = bf16.model.base_model(**inputs).last_hidden_state[rows, cols]
    assert len(packed) > 0, "bfloat16 weights were not packed"
    scale = own.float().abs().max()
    # bfloat16 rounds each product's inputs to 8 significant bits, in another order per kernel
    assert float((hidden.float() - own.float()).abs().max()) <= 0.05 * float(scale)
