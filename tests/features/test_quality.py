"""Quality a reader can take at its word (`bertdemo/features/quality.py`, `quality_views.py`): the
splice's cost (cross-entropy added, perplexity ratio, KL) recomputed here with a forward hook and
sparsify's own coder, independent of the code's splice; the bootstrap's intervals; the held-out
split; the figures and words of a dictionary trained from the page; the shipped records; the
model card's lines."""
from __future__ import annotations

import contextlib
import json
import math
import random

import numpy as np
import pytest
import torch

import bertdemo
import tiny_models
from bertdemo.features import dictionary, drift, making, quality, quality_views, store  # dictionary first: sparsify's switch
from bertdemo.features.data import Lines
from bertdemo.features.training import FeatureSettings
from sparsify import SparseCoder

SMALL = FeatureSettings(max_tokens=3000, batch_tokens=512, pause=0.0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tiny_models.save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))
    return bertdemo.load(str(folder), device="cpu")


def corpus(count: int, seed: int = 0) -> list[str]:
    """`count` distinct lines of 6 to 14 words of the committed vocab."""
    words = [w for w in tiny_models.VOCAB.read_text(encoding="utf-8").split() if w.isalpha() and len(w) > 1]
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(6, 14))) + "." for _ in range(count)]


@torch.no_grad()
def hooked_splice_cost(lm, coder: SparseCoder, layer: int, lines: Lines) -> dict:
    """Cross-entropy clean and spliced, and KL(clean || spliced), averaged over the held-out masks
    (every line masked, quality.SEED), the layer's output replaced by sparsify's reconstruction at
    every position but [CLS], [SEP] and padding by a forward hook on the layer module."""
    module = lm.model.bert.encoder.layer[layer - 1]
    framing = torch.tensor([lm.tokenizer.cls_token_id, lm.tokenizer.sep_token_id])
    sums = {"clean": 0.0, "spliced": 0.0, "kl": 0.0}
    targets = 0
    for batch in lines.batches(lm, seed=quality.SEED, masked_share=1.0, order=np.arange(len(lines)), endless=False):
        ids, labels = batch.inputs["input_ids"], batch.labels
        keep = batch.inputs["attention_mask"].bool() & ~torch.isin(ids, framing)

        def splice(_, args, output):
            hidden = (output[0] if isinstance(output, tuple) else output).clone()
            out = coder.encode(hidden[keep])
            hidden[keep] = coder.decode(out.top_acts, out.top_indices)
            return (hidden, *output[1:]) if isinstance(output, tuple) else hidden
        clean = lm.model(**batch.inputs).logits[labels != -100].log_softmax(-1)
        handle = module.register_forward_hook(splice)
        try:
            spliced = lm.model(**batch.inputs).logits[labels != -100].log_softmax(-1)
        finally:
            handle.remove()
        words = labels[labels != -100]
        sums["clean"] -= float(clean.gather(1, words[:, None]).sum())
        sums["spliced"] -= float(spliced.gather(1, words[:, None]).sum())
        sums["kl"] += float((clean.exp() * (clean - spliced)).sum())
        targets += len(words)
    return {name: value / targets for name, value in sums.items()}


def test_the_splices_cost_is_the_added_cross_entropy_and_kl_a_hook_measures(bundled):
    """Layer 2 of the bundled model, its shipped dictionary, 40 lines of the default corpus."""
    layer = 2
    lines = Lines(bundled, making.default_texts()[200:240])
    measured = quality.measure(bundled, dictionary.load(store.SHIPPED / f"layer_{layer}"), lines)
    with contextlib.redirect_stdout(None):
        coder = SparseCoder.load_from_disk(store.SHIPPED / f"layer_{layer}").float().eval()
    expected = hooked_splice_cost(bundled, coder, layer, lines)
    cost = measured["splice_cost"]
    assert cost["added_cross_entropy"] == pytest.approx(expected["spliced"] - expected["clean"], rel=1e-4, abs=1e-6)
    assert cost["perplexity_ratio"] == pytest.approx(math.exp(expected["spliced"] - expected["clean"]), rel=1e-4)
    assert cost["kl"] == pytest.approx(expected["kl"], rel=1e-4) and cost["kl"] > 0
    assert measured["cross_entropy"]["clean"] == pytest.approx(expected["clean"], rel=1e-5)
    assert measured["held_out"] == {"lines": len(lines), "tokens": measured["tokens"],
                                    "targets": measured["held_out"]["targets"]} and measured["tokens"] == lines.tokens


@torch.no_grad()
def test_the_drifts_fvu_is_the_variance_sparsifys_coder_leaves_unexplained(bundled, shipped_store):
    """The Features tab's "after a fine-tune" line (`drift.tuning_drift`) and the quality figures
    share one FVU (`quality.fvu`): here recomputed from the hidden states of 40 lines, one at a
    time, at every position but [CLS] and [SEP], and sparsify's own coder of the shipped layer 2."""
    layer, texts = 2, making.default_texts()[200:240]
    with contextlib.redirect_stdout(None):
        coder = SparseCoder.load_from_disk(store.SHIPPED / f"layer_{layer}").float().eval()
    states = torch.cat([bundled.model(**bundled.tokenizer(t, return_tensors="pt"), output_hidden_states=True)
                        .hidden_states[layer][0, 1:-1] for t in texts]).double()  # (N, H)
    out = coder.encode(states.float())
    error = (states - coder.decode(out.top_acts, out.top_indices).double()).pow(2).sum()
    expected = float(error / (states - states.mean(0)).pow(2).sum())
    same = drift.tuning_drift(bundled, bundled, texts, layer, store=shipped_store)
    assert same["fvu"]["base"] == pytest.approx(expected, rel=1e-4) and same["tokens"] == len(states)


def test_the_interval_contains_the_point_estimate_and_narrows_with_more_data(tiny):
    torch.manual_seed(0)
    made = dictionary.Dictionary(dictionary.new_coder(32, latents=64, k=8), 1)
    few, many = (quality.measure(tiny, made, Lines(tiny, corpus(count, seed=1))) for count in (40, 640))
    points = {"fvu": lambda q: q["fvu"], "spliced_cross_entropy": lambda q: q["cross_entropy"]["spliced"],
              "added_cross_entropy": lambda q: q["splice_cost"]["added_cross_entropy"],
              "kl": lambda q: q["splice_cost"]["kl"]}
    for name, point in points.items():
        for q in (few, many):
            low, high = q["interval"][name]
            assert low <= point(q) <= high, (name, low, point(q), high)
        width = {id(q): q["interval"][name][1] - q["interval"][name][0] for q in (few, many)}
        assert width[id(many)] < 0.6 * width[id(few)], name  # 16 times the lines: about a quarter as wide
    assert few["interval"]["level"] == 0.95 and few["interval"]["resamples"] == quality.RESAMPLES
    draws = quality.resampled(7, 50)
    assert draws.shape == (50, 7) and (draws.sum(1) == 7).all()


def test_the_held_out_set_is_20000_tokens_where_the_corpus_allows_else_a_fifth(tiny):
    big = corpus(30_000)
    sizes = [len(t.split()) for t in big]
    train, held = making.split_corpus(big, sizes)
    held_tokens = sum(len(t.split()) for t in held)
    assert making.HELD_OUT_TOKENS <= held_tokens < making.HELD_OUT_TOKENS + max(sizes)
    assert not set(held) & set(train) and len(train) + len(held) == len(big)
    shuffled = big[::-1]
    assert set(making.split_corpus(shuffled)[1]) == set(held)  # chosen by a hash: not by where a line is
    small = corpus(1000)
    train, held = making.split_corpus(small)
    share = sum(len(t.split()) for t in held) / sum(len(t.split()) for t in small)
    assert 0.2 <= share < 0.2 + 15 / sum(len(t.split()) for t in small)
    lines, held_out = making.corpus_lines(tiny, corpus(600))
    assert held_out.tokens < making.HELD_OUT_TOKENS
    assert held_out.tokens == pytest.approx(0.2 * (lines.tokens + held_out.tokens), abs=20)


def test_a_dictionary_trained_from_the_page_states_its_held_out_text_passes_and_interval(tiny, tmp_path):
    feature_store = store.FeatureStore(tmp_path, shipped=None)
    texts = corpus(400)
    made, history = making.train_features(tiny, 1, texts, SMALL, store=feature_store)
    training, q = made.record["training"], made.record["quality"]
    lines, held_out = making.corpus_lines(tiny, texts)
    assert training["text"] == {"lines": len(lines), "tokens": lines.tokens}
    assert training["passes"] == pytest.approx(history.tokens / lines.tokens)
    assert q["held_out"]["tokens"] == held_out.tokens == q["tokens"] and q["held_out"]["lines"] == len(held_out)
    assert q["dead_window"] == held_out.tokens + made.stats.tokens
    assert q["training_fvu"]["tokens"] >= held_out.tokens and q["training_fvu"]["fvu"] > 0
    low, high = q["interval"]["fvu"]
    assert low <= q["fvu"] <= high
    figures = bertdemo.feature_quality(tiny, 1, feature_store)
    notes = " ".join(figures["notes"])
    assert f"Measured on {held_out.tokens:,} held-out tokens ({len(held_out):,} lines)" in notes
    assert "fewer than the 20,000 wanted" in notes
    assert f"{training['passes']:.1f} passes over its {lines.tokens:,}-token training text" in notes
    assert f"never fired in {q['dead_window']:,} tokens" in notes and "95% intervals" in notes
    json.dumps(figures)  # the API sends it as it is


def test_overfitting_is_said_in_words_when_training_and_held_out_fvu_part():
    figures = {"layer": 3, "latents": 3072, "k": 32, "fvu": 0.192, "interval": {"fvu": [0.181, 0.203]},
               "training_fvu": {"fvu": 0.097, "tokens": 876}, "training": {"passes": 37.2}}
    assert quality.overfitting(figures)
    warning = quality_views.overfitting_warning(figures)
    assert "**Overfitting**" in warning and "0.097" in warning and "0.192" in warning and "37 passes" in warning
    assert warning in quality_views.quality_notes(figures)
    close = {**figures, "training_fvu": {"fvu": 0.185, "tokens": 876}}  # inside the held-out interval
    assert not quality.overfitting(close) and quality_views.overfitting_warning(close) is None
    assert any("no sign of learning the training text by heart" in note for note in quality_views.quality_notes(close))
    assert not quality.overfitting({"fvu": 0.2})  # a shipped record made before: nothing to compare


def test_each_shipped_records_splice_cost_leads_and_adds_up(bundled, shipped_store):
    """The shipped records, measured again with the quality's definitions of now on the same
    held-out lines (`making.measure_shipped`): their cost, intervals and windows agree."""
    summary = quality_views.quality_summary(bundled, shipped_store)
    for layer in range(1, bundled.model.config.num_hidden_layers + 1):
        q = json.loads((store.SHIPPED / f"layer_{layer}" / dictionary.RECORD).read_text(encoding="utf-8"))["quality"]
        cost, ce = q["splice_cost"], q["cross_entropy"]
        assert cost["added_cross_entropy"] == pytest.approx(ce["spliced"] - ce["clean"], rel=1e-9)
        assert cost["perplexity_ratio"] == pytest.approx(math.exp(cost["added_cross_entropy"]), rel=1e-9)
        assert 0 < cost["kl"] < cost["added_cross_entropy"] * 3
        points = {"fvu": q["fvu"], "kl": cost["kl"], "added_cross_entropy": cost["added_cross_entropy"]}
        for name, point in points.items():
            assert q["interval"][name][0] <= point <= q["interval"][name][1]
        assert q["held_out"]["tokens"] >= making.HELD_OUT_TOKENS and q["dead_window"] > q["held_out"]["tokens"]
        line = quality_views.quality_line(bertdemo.feature_quality(bundled, layer, shipped_store))
        assert f"adds {cost['added_cross_entropy']:.3f} nats" in line and f"KL {cost['kl']:.3f}" in line
        assert line.index("nats") < line.index("FVU") < line.index("loss recovered")
        assert f"- {line}" in summary  # the model card: a line per layer
