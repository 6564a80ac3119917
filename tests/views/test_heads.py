"""Heads, deeper: the neuron view equals the model's own attention, a head switched off equals its
slice of the attention output zeroed (computed here on a copy of the weights), for that view only
and while other visitors are served, and head importance equals one ablation at a time."""
import copy
import math
import threading

import numpy as np
import pytest
import torch
from transformers import AutoModelForMaskedLM

import bertdemo
import bertdemo.model.loading
from bertdemo.forward import anatomy, hooks
from bertdemo.views import heads
from bertdemo.views.fillmask import encode, logits_at
from bertdemo.model.loading import LoadedModel

ARCHS = ["tiny_bert", "tiny_distilbert", "tiny_roberta"]
SENTENCE = "Paris is the [MASK] of France."
TWO_MASKS = "The [MASK] tower is a famous [MASK]."


def output_attentions(lm, *texts) -> np.ndarray:
    """(L, H, T, T) of the same weights loaded afresh with eager attention."""
    model = AutoModelForMaskedLM.from_pretrained(lm.name, attn_implementation="eager").eval()
    inputs = lm.tokenizer(*[lm.to_model_text(t) for t in texts], return_tensors="pt")
    with torch.no_grad():
        return torch.cat(model(**inputs, output_attentions=True).attentions).numpy()


def zeroed_copy(lm, pairs) -> LoadedModel:
    """The reference for heads switched off: a copy of the model whose output projection reads
    nothing from each head, i.e. its weight's columns for that head's slice set to zero."""
    model = copy.deepcopy(lm.model)
    for layer, head in pairs:
        part = anatomy.of(model).attention[layer]
        with torch.no_grad():
            part.output.weight[:, head * part.head_dim:(head + 1) * part.head_dim] = 0.0
    return LoadedModel("zeroed copy", lm.tokenizer, model, lm.device)


def mask_logits(lm, text) -> torch.Tensor:
    enc = encode(lm, text)
    cols = torch.tensor(enc.mask_positions)
    return logits_at(lm, enc.inputs, torch.zeros_like(cols), cols)


# ---------------------------------------------------------------- the neuron view

@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("texts", [(SENTENCE,), (SENTENCE, "Berlin is nice.")], ids=["one", "pair"])
def test_neuron_view_weights_equal_output_attentions(arch, texts, request):
    lm = request.getfixturevalue(arch)
    expected = output_attentions(lm, *texts)
    n_layers, n_heads, n_tokens, _ = expected.shape
    for layer in range(n_layers):
        for head in range(n_heads):
            for token in (0, 4, n_tokens - 1):
                view = bertdemo.neuron_view(lm, texts[0], text_b=texts[1] if len(texts) > 1 else None,
                                            layer=layer, head=head, token=token)
                np.testing.assert_allclose(view["weights"], expected[layer, head, token], atol=1e-5)
                scores = np.array(view["scores"])
                softmax = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
                np.testing.assert_allclose(softmax, view["weights"], atol=1e-6)
    d = view["head_dim"]
    assert np.shape(view["keys"]) == np.shape(view["products"]) == (n_tokens, d) and len(view["query"]) == d
    np.testing.assert_allclose(np.array(view["query"]) * np.array(view["keys"]), view["products"], atol=1e-12)
    np.testing.assert_allclose(np.sum(view["products"], 1) / math.sqrt(d), view["scores"], atol=1e-9)
    assert view["tokens"] == bertdemo.attention(lm, *texts).tokens
    assert (view["sentence_b_start"] is None) == (len(texts) == 1)


@pytest.mark.slow
def test_real_minilm_weights_neuron_view_and_importance(engine, monkeypatch):
    """The neuron view equals output_attentions on real weights; head importance through the
    lean forward equals it through the modules, and one head's delta equals its ablation."""
    lm = engine.load_minilm("cpu")
    fast = bertdemo.head_importance(lm, SENTENCE)
    assert np.shape(fast["delta"]) == (6, 12)
    off = mask_logits(bertdemo.heads_off(lm, [(3, 7)]), SENTENCE)[0].log_softmax(-1)
    expected = float(off[fast["target"]["token_id"]])
    assert fast["delta"][3][7] == pytest.approx(expected - fast["log_prob"], abs=1e-4)
    with monkeypatch.context() as patched:
        patched.setattr(bertdemo.forward.lean_forward, "supports", lambda model: False)
        np.testing.assert_allclose(bertdemo.head_importance(lm, SENTENCE)["delta"], fast["delta"], atol=1e-4)
    path = str(bertdemo.model.loading.minilm_path())
    model = AutoModelForMaskedLM.from_pretrained(path, attn_implementation="eager").eval()
    inputs = lm.tokenizer(SENTENCE.replace("[MASK]", lm.mask_token), return_tensors="pt")
    with torch.no_grad():
        expected = model(**inputs, output_attentions=True).attentions
    for layer, head, token in [(0, 0, 0), (2, 5, 4), (5, 11, 8)]:
        view = bertdemo.neuron_view(lm, SENTENCE, layer=layer, head=head, token=token)
        np.testing.assert_allclose(view["weights"], expected[layer][0, head, token].numpy(), atol=1e-5)


def test_neuron_view_of_a_view_reads_its_heads_off(tiny_bert):
    """Layer 1's queries and keys come from layer 0's output, which a head switched off changes."""
    off = bertdemo.heads_off(tiny_bert, [(0, 1)])
    ours = bertdemo.neuron_view(off, SENTENCE, layer=1, head=0, token=2)
    reference = bertdemo.attention(zeroed_copy(tiny_bert, [(0, 1)]), SENTENCE).weights[1, 0, 2]
    np.testing.assert_allclose(ours["weights"], reference, atol=1e-5)
    assert not np.allclose(ours["weights"], bertdemo.attention(tiny_bert, SENTENCE).weights[1, 0, 2], atol=1e-4)


# ---------------------------------------------------------------- heads switched off

@pytest.mark.parametrize("arch", ARCHS)
def test_heads_off_equals_the_zeroed_slice_reference_in_every_service(arch, request):
    lm = request.getfixturevalue(arch)
    pairs = [(0, 1), (1, 0)]
    view, reference = bertdemo.heads_off(lm, pairs), zeroed_copy(lm, pairs)
    assert view.model is lm.model and view.heads_off == frozenset(pairs)
    torch.testing.assert_close(mask_logits(view, TWO_MASKS), mask_logits(reference, TWO_MASKS), atol=1e-5, rtol=0)
    assert not torch.allclose(mask_logits(view, TWO_MASKS), mask_logits(lm, TWO_MASKS), atol=1e-3)
    for ours, theirs in zip(bertdemo.fill_mask(view, TWO_MASKS, 5), bertdemo.fill_mask(reference, TWO_MASKS, 5)):
        assert [p["token_id"] for p in ours] == [p["token_id"] for p in theirs]
    assert [c["text"] for c in bertdemo.fill_jointly(view, TWO_MASKS, 3)] == \
        [c["text"] for c in bertdemo.fill_jointly(reference, TWO_MASKS, 3)]
    text = "Paris is the capital of France."
    pll = bertdemo.sentence_score(reference, text)["pll"]
    assert bertdemo.sentence_score(view, text)["pll"] == pytest.approx(pll, abs=1e-4)
    np.testing.assert_allclose(bertdemo.attention(view, SENTENCE).weights,
                               bertdemo.attention(reference, SENTENCE).weights, atol=1e-5)
    ours, theirs = bertdemo.layer_predictions(view, SENTENCE, 3), bertdemo.layer_predictions(reference, SENTENCE, 3)
    assert ours[0]["final_prob"] == pytest.approx(theirs[0]["final_prob"], abs=1e-5)


def test_heads_off_leaves_the_shared_model_and_its_caches_unchanged(tiny_bert):
    before = mask_logits(tiny_bert, TWO_MASKS)
    weights = {k: v.clone() for k, v in tiny_bert.model.state_dict().items()}
    view = bertdemo.heads_off(tiny_bert, [(0, 0), (1, 1)])
    bertdemo.fill_mask(view, TWO_MASKS)  # leaves its joint fill's first step in the shared caches
    assert torch.equal(mask_logits(tiny_bert, TWO_MASKS), before)
    assert all(torch.equal(v, weights[k]) for k, v in tiny_bert.model.state_dict().items())
    assert not tiny_bert.heads_off and not hooks.active()
    assert bertdemo.fill_jointly(tiny_bert, TWO_MASKS) == bertdemo.fill_jointly(
        LoadedModel("own caches", tiny_bert.tokenizer, tiny_bert.model, tiny_bert.device), TWO_MASKS)
    twice = bertdemo.heads_off(view, [(0, 1)])
    assert twice.heads_off == {(0, 0), (1, 1), (0, 1)} and view.heads_off == {(0, 0), (1, 1)}


def test_one_visitors_heads_off_never_reach_another_at_the_same_time(tiny_bert):
    """Two visitors in two threads, at once, many times: one with heads off, one with none; each
    always gets its own answer, directly and through the micro-batcher that mixes requests."""
    view = bertdemo.heads_off(tiny_bert, [(0, 0), (1, 1)])
    expected = {id(tiny_bert): mask_logits(tiny_bert, TWO_MASKS),
                id(view): mask_logits(zeroed_copy(tiny_bert, [(0, 0), (1, 1)]), TWO_MASKS)}
    top = {key: logits.softmax(-1).topk(3).indices.tolist() for key, logits in expected.items()}
    batcher = bertdemo.Engine().batcher
    start, failures = threading.Barrier(4), []

    def visit(lm, batched):
        start.wait()
        for _ in range(30):
            if batched:
                got = [[p["token_id"] for p in mask] for mask in batcher.fill_mask(lm, TWO_MASKS, 3)]
                ok = got == top[id(lm)]
            else:
                ok = torch.allclose(mask_logits(lm, TWO_MASKS), expected[id(lm)], atol=1e-5)
            if not ok:
                failures.append((lm.heads_off, batched))

    threads = [threading.Thread(target=visit, args=(lm, batched))
               for lm in (tiny_bert, view) for batched in (False, True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []


def test_every_head_off_still_answers(tiny_bert, tiny_distilbert):
    for lm in (tiny_bert, tiny_distilbert):
        n_layers, n_heads = heads.shape(lm)
        none_left = bertdemo.heads_off(lm, [(x, y) for x in range(n_layers) for y in range(n_heads)])
        predictions = bertdemo.fill_mask(none_left, SENTENCE, 3)[0]
        assert len(predictions) == 3 and all(math.isfinite(p["score"]) for p in predictions)
        assert np.isfinite(bertdemo.attention(none_left, SENTENCE).weights).all()
        result = bertdemo.head_importance(none_left, SENTENCE)
        assert all(d == pytest.approx(0, abs=1e-5) for row in result["delta"] for d in row)


@pytest.mark.parametrize("heads_given, message", [
    ([], r"No heads to switch off: list \(layer, head\) pairs, layers 0 to 1 and heads 0 to 1"),
    ([(2, 0)], "layer must be a whole number from 0 to 1, got 2"),
    ([(0, -1)], "head must be a whole number from 0 to 1, got -1"),
    ([(0,)], r"is not a \(layer, head\) pair"),
    ("0:1", r"\(layer, head\) pairs"),
])
def test_heads_off_refuses_bad_lists_naming_the_ranges(tiny_bert, heads_given, message):
    with pytest.raises(ValueError, match=message):
        bertdemo.heads_off(tiny_bert, heads_given)


def test_heads_written_as_text():
    assert heads.parse_heads("0:1, 11:3", 12, 12) == {(0, 1), (11, 3)}
    assert heads.parse_heads(" 3:* ", 12, 4) == {(3, 0), (3, 1), (3, 2), (3, 3)}
    assert len(heads.parse_heads("*:*", 12, 12)) == 144 and heads.parse_heads("  ", 2, 2) == frozenset()
    assert heads.format_heads({(11, 3), (0, 1)}) == "0:1, 11:3"
    # the page's numbers: layers and heads from 1, the pairs still from 0
    assert heads.parse_heads("1:1, 12:4", 12, 12, first_layer=1, first_head=1) == {(0, 0), (11, 3)}
    assert heads.format_heads({(11, 3), (0, 0)}, first_layer=1, first_head=1) == "1:1, 12:4"
    with pytest.raises(ValueError, match=r"head must be a whole number from 1 to 12 \(counted from 1\), got 0"):
        heads.parse_heads("1:0", 12, 12, first_layer=1, first_head=1)
    with pytest.raises(ValueError, match=r"head must be a whole number from 0 to 11 \(counted from 0\), got 12"):
        heads.parse_heads("0:12", 12, 12)
    with pytest.raises(ValueError, match="Could not read 'paris' as layer:head"):
        heads.parse_heads("0:1 paris", 12, 12)
    with pytest.raises(ValueError, match="Could not read"):
        heads.parse_heads("9" * 100_000 + ":1", 12, 12)


@pytest.mark.parametrize("kwargs, message", [
    ({"layer": 2, "head": 0, "token": 0}, r"layer must be a whole number from 0 to 1 \(counted from 0\), got 2"),
    ({"layer": 0, "head": 5, "token": 0}, r"head must be a whole number from 0 to 1 \(counted from 0\), got 5"),
    ({"layer": 0, "head": 0, "token": 9}, r"token must be a whole number from 0 to 8 \(its index among the 9 tokens"),
    ({"layer": 0, "head": 0, "token": 1.5}, "token must be a whole number"),
])
def test_neuron_view_refuses_indices_out_of_range(tiny_bert, kwargs, message):
    with pytest.raises(ValueError, match=message):
        bertdemo.neuron_view(tiny_bert, SENTENCE, **kwargs)


def test_over_long_text_gets_the_models_limit(tiny_bert):
    text = "[MASK] " + "paris " * 100
    for call in (lambda: bertdemo.neuron_view(tiny_bert, text, layer=0, head=0, token=0),
                 lambda: bertdemo.head_importance(tiny_bert, text)):
        with pytest.raises(ValueError, match="takes at most 64 tokens"):
            call()


# ---------------------------------------------------------------- head importance

def one_at_a_time(lm, text, mask, token_id) -> np.ndarray:
    """log p(token) at the mask with each head off alone, one forward each, minus with all on."""
    def log_p(model):
        return float(mask_logits(model, text)[mask].log_softmax(-1)[token_id])
    n_layers, n_heads = heads.shape(lm)
    return np.array([[log_p(bertdemo.heads_off(lm, [(x, y)])) - log_p(lm) for y in range(n_heads)]
                     for x in range(n_layers)])


@pytest.mark.parametrize("arch", ARCHS)
def test_importance_equals_one_ablation_at_a_time(arch, request):
    lm = request.getfixturevalue(arch)
    result = bertdemo.head_importance(lm, TWO_MASKS, mask=1)
    top = bertdemo.fill_mask(lm, TWO_MASKS, 1)[1][0]
    assert result["target"]["token_id"] == top["token_id"] and result["mask"] == 1
    assert result["log_prob"] == pytest.approx(math.log(top["score"]), abs=1e-5)
    expected = one_at_a_time(lm, TWO_MASKS, 1, top["token_id"])
    assert np.shape(result["delta"]) == expected.shape == (result["layers"], result["heads"])
    np.testing.assert_allclose(result["delta"], expected, atol=1e-4)
    assert np.abs(expected).max() > 1e-3  # the heads do matter: the comparison means something


def test_importance_of_a_word_in_small_batches_and_of_a_view(tiny_bert, monkeypatch):
    word = bertdemo.fill_mask(tiny_bert, SENTENCE, 3)[0][2]["token"]
    whole = bertdemo.head_importance(tiny_bert, SENTENCE, target=word)
    monkeypatch.setattr(heads, "TOKENS_PER_BATCH", 1)  # one copy per forward
    assert whole["target"]["token"] == word
    np.testing.assert_allclose(bertdemo.head_importance(tiny_bert, SENTENCE, target=word)["delta"],
                               whole["delta"], atol=1e-5)
    view = bertdemo.heads_off(tiny_bert, [(0, 1)])
    of_view = bertdemo.head_importance(view, SENTENCE, target=word)
    expected = one_at_a_time(view, SENTENCE, 0, whole["target"]["token_id"])
    np.testing.assert_allclose(of_view["delta"], expected, atol=1e-4)
    assert of_view["delta"][0][1] == pytest.approx(0, abs=1e-6) and of_view["heads_off"] == [(0, 1)]


def test_importance_through_the_lean_forward_equals_the_layer_modules(tiny_bert, tiny_roberta, monkeypatch):
    """BERT-family models run the copies through the lean forward; the modules with hooks agree."""
    lean = [bertdemo.head_importance(lm, TWO_MASKS, mask=1)["delta"] for lm in (tiny_bert, tiny_roberta)]
    monkeypatch.setattr(bertdemo.forward.lean_forward, "supports", lambda model: False)
    for lm, fast in zip((tiny_bert, tiny_roberta), lean):
        np.testing.assert_allclose(fast, bertdemo.head_importance(lm, TWO_MASKS, mask=1)["delta"], atol=1e-5)


def test_importance_refuses_a_mask_out_of_range_and_unknown_words(tiny_bert):
    with pytest.raises(ValueError, match=r"mask must be a whole number from 0 to 1 \(0 = the first \[MASK\]\)"):
        bertdemo.head_importance(tiny_bert, TWO_MASKS, mask=2)
    with pytest.raises(ValueError, match="No \\[MASK\\]"):
        bertdemo.head_importance(tiny_bert, "Paris is nice.")
    with pytest.raises(ValueError, match="not in .* vocabulary"):
        bertdemo.head_importance(tiny_bert, SENTENCE, target="☃")
