"""Positions a dictionary was trained on, and only those (`features.data.kept_positions`): no view
reads a feature at [CLS], [SEP] or padding, and no edit touches the hidden state there.

The shipped dictionary of the bundled model's layer 3 has features that fire, on "Paris is the
[MASK] of France.", at [SEP] (or [CLS]) and nowhere else; they are found here with sparsify's own
coder on transformers' own hidden states, not with the code under test.
"""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

import bertdemo
from bertdemo.circuits import attribution
from bertdemo.features import dictionary, store, views  # dictionary first: sparsify's decoder switch
from bertdemo.features.data import Lines, kept_positions
from sparsify import SparseCoder

LAYER = 3
SENTENCE = "Paris is the [MASK] of France."


@pytest.fixture(scope="module")
def coder() -> SparseCoder:
    with contextlib.redirect_stdout(None):
        return SparseCoder.load_from_disk(store.SHIPPED / f"layer_{LAYER}").float().eval().requires_grad_(False)


def inputs_of(lm, text: str) -> dict:
    enc = lm.tokenizer(lm.to_model_text(text), return_tensors="pt")
    return {k: v for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}


@torch.no_grad()
def codes(lm, coder: SparseCoder, text: str) -> torch.Tensor:
    """(T, F): every latent's activation at every position, [CLS] and [SEP] included."""
    hidden = lm.model.base_model(**inputs_of(lm, text), output_hidden_states=True).hidden_states[LAYER][0]
    out = coder.encode(hidden)
    return torch.zeros(hidden.shape[0], coder.num_latents).scatter_(1, out.top_indices, out.top_acts)


def only_at(dense: torch.Tensor, position: int) -> list[int]:
    """Features firing at `position` and at no other position, strongest there first."""
    elsewhere = torch.cat([dense[:position], dense[position + 1:]]).gt(0).any(0)
    found = (dense[position].gt(0) & ~elsewhere).nonzero().flatten()
    return found[dense[position, found].argsort(descending=True)].tolist()


@pytest.fixture(scope="module")
def framing_features(bundled, coder) -> dict[str, int]:
    """{"[CLS]": a feature firing only at [CLS], "[SEP]": one firing only at [SEP]} on SENTENCE."""
    dense = codes(bundled, coder, SENTENCE)
    found = {"[CLS]": only_at(dense, 0), "[SEP]": only_at(dense, dense.shape[0] - 1)}
    assert all(found.values()), "the shipped dictionary has no feature firing only at [CLS] / [SEP] here"
    return {name: features[0] for name, features in found.items()}


@torch.no_grad()
def probabilities_with_edit_at(lm, coder: SparseCoder, feature: int, position: int, scale: float) -> torch.Tensor:
    """(V,) at the [MASK] with `feature`'s contribution scaled by `scale` at `position` alone, by a
    hook on the layer module: what a view that read the framing tokens would have shown."""
    inputs = inputs_of(lm, SENTENCE)
    mask = int((inputs["input_ids"][0] == lm.mask_token_id).nonzero()[0])

    def hook(_, args, output):
        hidden = (output[0] if isinstance(output, tuple) else output).clone()
        out = coder.encode(hidden[0, position:position + 1])
        activation = torch.zeros(coder.num_latents).scatter_(0, out.top_indices[0], out.top_acts[0])[feature]
        hidden[0, position] += (scale - 1) * activation * coder.W_dec[feature]
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden
    handle = lm.model.bert.encoder.layer[LAYER - 1].register_forward_hook(hook)
    try:
        return lm.model(**inputs).logits[0, mask].softmax(-1)
    finally:
        handle.remove()


@pytest.mark.parametrize("framing", ["[SEP]", "[CLS]"])
@pytest.mark.parametrize("scale, add", [(0.0, 0.0), (10.0, 0.0)], ids=["off", "times-ten"])
def test_a_steer_at_a_feature_that_fires_only_on_a_framing_token_changes_nothing(
        bundled, shipped_store, coder, framing_features, framing, scale, add):
    feature = framing_features[framing]
    shown = views.steer(bundled, SENTENCE, LAYER, feature, scale=scale, add=add, top_k=10, store=shipped_store)
    assert shown["fired"] == []  # it fires on no token the dictionary reads
    (mask,) = shown["masks"]
    assert [p["token_id"] for p in mask["after"]] == [p["token_id"] for p in mask["before"]]
    for token in mask["tokens"]:
        assert token["after"] == pytest.approx(token["before"], abs=1e-6)
    # the edit, had it been made at the framing token, would have shown: the test can see a change
    position = 0 if framing == "[CLS]" else len(inputs_of(bundled, SENTENCE)["input_ids"][0]) - 1
    clean = probabilities_with_edit_at(bundled, coder, feature, position, 1.0)
    edited = probabilities_with_edit_at(bundled, coder, feature, position, scale if scale != 1 else 0.0)
    assert float((edited - clean).abs().max()) > 1e-4


def test_every_views_features_at_cls_and_sep_are_none(bundled, shipped_store, coder, framing_features):
    ids = inputs_of(bundled, SENTENCE)["input_ids"][0]
    framing = {0, len(ids) - 1}
    sentence = views.sentence_features(bundled, SENTENCE, LAYER, top=50, store=shipped_store)
    assert {t["position"] for t in sentence["per_token"]} == set(range(1, len(ids) - 1))
    shown = {f["feature"] for t in sentence["per_token"] for f in t["features"]}
    assert not shown & set(framing_features.values())
    assert not set(sentence["heatmap"]["features"]) & set(framing_features.values())

    dense = codes(bundled, coder, SENTENCE)
    for feature in range(0, 3072, 97):  # steer's "fired": kept positions only, at the reference's activations
        fired = views.steer(bundled, SENTENCE, LAYER, feature, scale=1.0, store=shipped_store)["fired"]
        assert {f["position"] for f in fired} == set(dense[1:-1, feature].gt(0).nonzero().flatten().add(1).tolist())
        assert not {f["position"] for f in fired} & framing

    behind = views.prediction_features(bundled, SENTENCE, LAYER, top=50, candidates=64, store=shipped_store)
    for mask in behind["masks"]:
        listed = {f["feature"] for f in mask["features"]}
        assert listed and not listed & set(framing_features.values())
        for row in mask["features"]:  # its activation summed over the kept positions alone
            assert row["activation"] == pytest.approx(float(dense[1:-1, row["feature"]].sum()), rel=1e-4, abs=1e-4)

    contrast = views.contrast_features(bundled, ["I sat on the river bank."], ["The bank lent me money."], "bank",
                                       LAYER, top=50, store=shipped_store)
    assert contrast["occurrences"] == {"a": 1, "b": 1}

    for feature in set(framing_features.values()) | set(range(0, 3072, 311)):
        for context in views.feature_card(bundled, LAYER, feature, store=shipped_store)["contexts"]:
            assert context["token"] not in (bundled.tokenizer.cls_token, bundled.tokenizer.sep_token)
            assert context["position"] > 0


def test_the_views_the_training_and_the_circuits_share_one_rule(bundled):
    """`kept_positions` is the one rule: the training batches' positions, the circuits' coded
    positions and the views' are its answer (a literal [SEP] typed in a line too)."""
    text = "Paris is the [MASK] of France [SEP] and more."
    inputs = inputs_of(bundled, text)
    keep = kept_positions(bundled, inputs["input_ids"], inputs["attention_mask"])[0]
    tokens = bundled.tokenizer.convert_ids_to_tokens(inputs["input_ids"][0].tolist())
    assert [t for t, k in zip(tokens, keep.tolist()) if not k] == ["[CLS]", "[SEP]", "[SEP]"]
    assert torch.equal(attribution.coded_positions(bundled, inputs["input_ids"][0]), keep)
    lines = Lines(bundled, ["Paris is the capital of France.", "A cat.", "The river bank was muddy after the rain."])
    for batch in lines.batches(bundled, masked_share=0.5, order=np.arange(len(lines)), endless=False):
        real = batch.inputs["attention_mask"].bool()
        framing = torch.isin(batch.inputs["input_ids"], torch.tensor([bundled.tokenizer.cls_token_id,
                                                                       bundled.tokenizer.sep_token_id]))
        assert torch.equal(batch.keep, real & ~framing)
