"""Transcoders (`bertdemo/circuits/transcoders.py`): the features' pipeline at the feed-forward block.

Each figure is checked against references built outside the code under test: forward hooks
registered directly on BERT's own modules (the block's input is the attention output's LayerNorm
output, its output `output.dense`'s output) and EleutherAI's `sparsify.SparseCoder` loaded from a
transcoder's folder. Training, the store and the run on tiny random models; the shipped
transcoders where they live, for the bundled model.
"""
from __future__ import annotations

import contextlib
import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import bertdemo
import tiny_models
from bertdemo.circuits import transcoders
from bertdemo.circuits.transcoder_run import TranscodersRequest
from bertdemo.config import Limits
from bertdemo.features import dictionary, quality, store  # dictionary first: sparsify's decoder switch
from bertdemo.features.data import FEED_FORWARD, Lines, pairs_at
from bertdemo.features.training import FeatureSettings
from bertdemo.runs import kinds, life
from bertdemo.sessions import SessionStore
from sparsify import SparseCoder
from test_features import StopAfter, folder_bytes, tiny_corpus

SMALL = FeatureSettings(max_tokens=3000, batch_tokens=512, pause=0.0, skip_connection=True)
SHIPPED_MAX_BYTES = 40 * 10**6


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(folder, LoadedModel): a tiny random BERT (2 layers, hidden 32), saved once."""
    folder = tiny_models.save_tiny_family("bert", tmp_path_factory.mktemp("bert"))
    return folder, bertdemo.load(str(folder), device="cpu")


@pytest.fixture(scope="module")
def trained(tiny, tmp_path_factory):
    """Both layers' transcoders of the tiny BERT, kept in a store of their own: (store folder, result, history)."""
    _, lm = tiny
    folder = tmp_path_factory.mktemp("transcoders")
    made, history = transcoders.train_transcoders(lm, None, tiny_corpus(400), SMALL, store=transcoder_store(folder))
    return folder, made, history


def transcoder_store(folder: Path, shipped=None) -> store.FeatureStore:
    return store.FeatureStore(folder, shipped=shipped, kind="transcoders")


def reference_coder(folder: Path) -> SparseCoder:
    with contextlib.redirect_stdout(None):
        return SparseCoder.load_from_disk(folder).float().eval().requires_grad_(False)


@contextlib.contextmanager
def block_hooks(lm, layer: int, replace=None):
    """BERT's own modules of `layer` (1..L), hooked: yields {"x": block input, "y": block output}
    as the model computed them; `replace(y, x)` (B, T, H) replaces the output when given."""
    module = lm.model.bert.encoder.layer[layer - 1]
    seen = {}

    def norm_out(mod, args, output):
        seen["x"] = output

    def dense_out(mod, args, output):
        seen["y"] = output
        return None if replace is None else replace(output, seen["x"])
    handles = [module.attention.output.LayerNorm.register_forward_hook(norm_out),
               module.output.dense.register_forward_hook(dense_out)]
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


# ---------------------------------------------------------------- the points a transcoder reads and writes

def test_pairs_are_the_blocks_input_and_output_at_the_kept_positions(tiny):
    _, lm = tiny
    lines = Lines(lm, tiny_corpus(40))
    batch = next(lines.batches(lm, batch_tokens=512, seed=0))
    pairs = pairs_at(lm, batch, [1, 2], FEED_FORWARD)
    for layer in (1, 2):
        with block_hooks(lm, layer) as seen, torch.no_grad():
            lm.model(**batch.inputs)
        x, y = pairs[layer]
        torch.testing.assert_close(x, seen["x"][batch.keep], atol=0, rtol=0)
        torch.testing.assert_close(y, seen["y"][batch.keep], atol=0, rtol=0)
        assert x.shape[0] == batch.tokens  # [CLS], [SEP] and padding left out


def test_a_layer_without_a_feed_forward_block_is_refused_by_its_range(tiny, tmp_path):
    _, lm = tiny
    for layer in (0, 3, 1.5):
        with pytest.raises(ValueError, match="from 1 to 2"):
            transcoders.train_transcoders(lm, [layer], tiny_corpus(400), SMALL, store=transcoder_store(tmp_path))


# ---------------------------------------------------------------- training, quality, the store

def test_training_lowers_fvu_and_writes_what_sparsify_reads(tiny, trained):
    _, lm = tiny
    folder, made, history = trained
    assert sorted(made) == [1, 2] and history.stopped is None and history.tokens >= SMALL.max_tokens
    for index, layer in enumerate((1, 2)):
        fvu = [step.fvu[index] for step in history.steps]
        assert fvu[0] == pytest.approx(1.0) and fvu[-1] < 0.6 * fvu[0], fvu  # the decoder starts at zeros
        saved = made[layer]
        assert saved.transcodes and saved.record["point"] == "feed-forward block"
        coder = reference_coder(saved.folder)
        assert coder.cfg.transcode and coder.W_skip is not None and coder.num_latents == 8 * 32
        x = torch.randn(20, 32)
        torch.testing.assert_close(saved.output(x), coder(x, torch.zeros(20, 32)).sae_out, atol=1e-5, rtol=1e-5)


def test_each_records_quality_is_the_reference_computed_with_the_models_own_modules(tiny, trained):
    """FVU of the block output and the cross-entropy with it replaced at the kept positions, from
    hooks on BERT's modules and sparsify's coder; the held-out lines are the corpus' (one in twenty)."""
    _, lm = tiny
    _, made, _ = trained
    from bertdemo.features.making import split_corpus

    held_out = Lines(lm, split_corpus(tiny_corpus(400))[1])
    for layer, saved in made.items():
        q = saved.record["quality"]
        coder = reference_coder(saved.folder)
        error = total = count = 0.0
        ys = []
        for batch in held_out.batches(lm, batch_tokens=4096, seed=quality.SEED, order=np.arange(len(held_out)),
                                      endless=False):
            with block_hooks(lm, layer) as seen, torch.no_grad():
                lm.model(**batch.inputs)
            x, y = seen["x"][batch.keep], seen["y"][batch.keep]
            error += float((coder(x, y).sae_out - y).pow(2).sum())
            ys.append(y)
        y = torch.cat(ys).double()
        assert q["fvu"] == pytest.approx(error / float((y - y.mean(0)).pow(2).sum()), rel=1e-4)
        sums = {"clean": 0.0, "spliced": 0.0}
        targets = 0
        for batch in quality.masked_batches(lm, held_out):
            keep = batch.keep

            def swapped(out, x):
                out = out.clone()
                out[keep] = coder(x[keep], out[keep]).sae_out
                return out
            for variant, replace in (("clean", None), ("spliced", swapped)):
                with block_hooks(lm, layer, replace), torch.no_grad():
                    logits = lm.model(**batch.inputs).logits
                sums[variant] += float(F.cross_entropy(logits[batch.labels != -100], batch.labels[batch.labels != -100],
                                                       reduction="sum"))
            targets += int((batch.labels != -100).sum())
        for variant, total in sums.items():
            assert q["cross_entropy"][variant] == pytest.approx(total / targets, rel=1e-4), variant
        together = q["all_layers"]
        assert together["layers"] == [1, 2] and together["cross_entropy"]["clean"] == pytest.approx(sums["clean"] / targets, rel=1e-4)
        assert together["kl"] >= 0


def test_a_restart_finds_them_under_the_weights_digest_and_another_model_none(tiny, trained, tmp_path):
    folder, lm = tiny
    store_folder, made, _ = trained
    for layer in (1, 2):
        assert (store_folder / lm.weights_digest / f"layer_{layer}" / "cfg.json").is_file()
    again = bertdemo.load(str(folder), device="cpu")  # a restart: a fresh store and the model loaded afresh
    found = transcoders.transcoders_for(again, transcoder_store(store_folder))
    assert sorted(found) == [1, 2]
    for layer, transcoder in found.items():
        assert transcoder.record == made[layer].record and transcoder.stats is not None
        for name, tensor in made[layer].coder.state_dict().items():
            torch.testing.assert_close(transcoder.coder.state_dict()[name], tensor, atol=0, rtol=0)
    other = bertdemo.load(str(tiny_models.save_tiny_family("bert", tmp_path / "other", seed=1)), device="cpu")
    assert transcoders.transcoders_for(other, transcoder_store(store_folder)) == {}
    assert not any((tmp_path / "features").rglob("cfg.json"))  # a store of another kind sees none


def test_a_transcoder_features_card_shows_where_it_fires_on_the_blocks_input(tiny, trained):
    _, lm = tiny
    store_folder, made, _ = trained
    coder = reference_coder(made[2].folder)
    densest = made[2].stats["density"].argsort(descending=True)[:3].tolist()
    for feature in densest:
        card = bertdemo.feature_card(lm, 2, feature, store=transcoder_store(store_folder))
        assert card["contexts"] and card["density"] > 0
        for context in card["contexts"]:
            inputs = {k: v for k, v in lm.tokenizer(context["text"], return_tensors="pt").items()
                      if k in ("input_ids", "attention_mask", "token_type_ids")}
            with block_hooks(lm, 2) as seen, torch.no_grad():
                lm.model(**inputs)
            out = coder.encode(seen["x"][0, context["position"]][None])
            acts = torch.zeros(coder.num_latents).scatter_(0, out.top_indices[0], out.top_acts[0])
            assert float(acts[feature]) == pytest.approx(context["activation"], rel=2e-3, abs=2e-3)


# ---------------------------------------------------------------- the live run

def test_the_run_stops_on_request_and_keeps_what_it_learnt(tiny, tmp_path):
    _, lm = tiny
    kept = transcoder_store(tmp_path / "cache")
    who = SimpleNamespace(store=SessionStore(lm), session="a", transcoders=kept,
                          limits=Limits(features_max_tokens=10**8, features_max_seconds=100.0, max_seconds=100.0))
    request = TranscodersRequest("\n".join(tiny_corpus(250)), keep_partial=True)
    with life.start(who, kinds.RUNS["train_transcoders"], request) as run:
        for _ in run.updates(every=0.01):
            life.stop(who)
        outcome = run.finish()
    made, history = outcome.result
    assert history.stopped == "stopped" and 0 < len(history.steps) < 100 and outcome.ended == "stopped"
    assert outcome.kept.kind == "transcoders" and outcome.kept.kept and sorted(made) == [1, 2]
    assert sorted(transcoders.transcoders_for(lm, kept)) == [1, 2]
    assert made[1].record["training"]["stopped"] == "stopped"


def test_a_stopped_run_not_kept_leaves_nothing(tiny, tmp_path):
    _, lm = tiny
    made, history = transcoders.train_transcoders(lm, [1], tiny_corpus(400), SMALL, should_stop=StopAfter(2),
                                                  keep_partial=False, store=transcoder_store(tmp_path))
    assert made == {} and history.stopped == "stopped" and len(history.steps) == 2
    assert not any(tmp_path.rglob("cfg.json"))


def test_a_model_with_shipped_transcoders_is_not_trained_again_from_the_page(tiny, trained, tmp_path):
    _, lm = tiny
    store_folder, _, _ = trained
    shipped = store_folder / lm.weights_digest  # as a shipped folder: layer_N + training.json
    dictionary.write_json(shipped / "training.json", {"weights": lm.weights_digest})
    with pytest.raises(ValueError, match="already has transcoders") as refused:
        TranscodersRequest().plan(lm, Limits(), transcoder_store(tmp_path, shipped=shipped))
    assert refused.value.field == "texts"
    (shipped / "training.json").unlink()


@pytest.mark.slow
def test_one_shipped_layer_trained_again_with_its_own_settings_leaves_the_others_as_they_were(tiny, tmp_path):
    """`retrain_shipped`: layer 2 of a shipped set made again with fewer latents, layer 1 going on
    from its coder at another k: the other layer's files byte for byte as they were (its record
    but for the figures of every layer replaced at once), each layer's settings in training.json,
    and the new statistics' contexts lines of the statistics' corpus in the shared contexts.txt."""
    _, lm = tiny
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "train.txt").write_text("\n".join(tiny_corpus(300)), encoding="utf-8")
    (corpus / "heldout.txt").write_text("\n".join(tiny_corpus(300, seed=1) + tiny_corpus(60, seed=2)), encoding="utf-8")
    out, quiet = tmp_path / "transcoders", (lambda line: None)
    lines = dict(statistics_lines=300, held_out_lines=60, echo=quiet)
    transcoders.make_shipped(lm, corpus, out, SMALL, layers=[1, 2], **lines)
    before = {p.relative_to(out): p.read_bytes() for p in (out / "layer_1").iterdir()}
    contexts_before = (out / "contexts.txt").read_bytes()
    report = transcoders.retrain_shipped(lm, corpus, out, {2: replace(SMALL, latents=64)}, **lines)
    assert {p.relative_to(out): p.read_bytes() for p in (out / "layer_1").iterdir() if p.name != "record.json"} \
        == {name: data for name, data in before.items() if name.name != "record.json"}
    assert (out / "contexts.txt").read_bytes().startswith(contexts_before)
    assert report["per_layer"]["2"]["settings"]["latents"] == 64
    assert report["per_layer"]["1"]["settings"]["latents"] is None
    assert report["quality"]["all_layers"]["layers"] == [1, 2] and report["quality"]["2"]["fvu"] < 1
    again = dictionary.load(out / "layer_2")
    assert again.coder.num_latents == 64 and again.record["quality"]["all_layers"] == report["quality"]["all_layers"]
    texts = (corpus / "heldout.txt").read_text(encoding="utf-8").splitlines()[:300]
    line = again.stats["context_line"]
    assert (line >= 0).any() and all(again.stats.contexts[i] in texts for i in line[line >= 0].tolist())
    report = transcoders.retrain_shipped(lm, corpus, out, {1: replace(SMALL, k=8)}, resume=(1,), **lines)
    assert report["per_layer"]["1"]["settings"]["k"] == 8 and report["per_layer"]["1"]["resumed_from"]["tokens"] > 0
    assert report["per_layer"]["1"]["tokens"] >= report["per_layer"]["1"]["resumed_from"]["tokens"] + SMALL.max_tokens
    assert report["per_layer"]["2"]["settings"]["latents"] == 64
    assert transcoders.transcoders_for(lm, transcoder_store(tmp_path / "cache", shipped=out))[1].coder.cfg.k == 8


@pytest.mark.slow
def test_pruning_removes_only_latents_that_never_fired_and_the_coder_writes_the_same(tiny, tmp_path):
    """`prune_shipped`: layer 2's coder loses exactly the latents that never fired over its training
    lines (plain or masked, counted here with the model's own feed-forward input), writes the same
    output for those lines with fewer latents, has its statistics and quality made again and says
    what was removed; layer 1's files stay byte for byte."""
    _, lm = tiny
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "train.txt").write_text("\n".join(tiny_corpus(200)), encoding="utf-8")
    (corpus / "heldout.txt").write_text("\n".join(tiny_corpus(200, seed=1) + tiny_corpus(40, seed=2)), encoding="utf-8")
    out, lines = tmp_path / "transcoders", dict(statistics_lines=200, held_out_lines=40, echo=lambda line: None)
    transcoders.make_shipped(lm, corpus, out, replace(SMALL, latents=512, max_tokens=800), layers=[1, 2], **lines)
    layer_1 = {p.name: p.read_bytes() for p in (out / "layer_1").iterdir() if p.name != "record.json"}
    before = dictionary.load(out / "layer_2")
    probe = Lines(lm, (corpus / "train.txt").read_text(encoding="utf-8").splitlines())
    fired = torch.zeros(before.latents, dtype=torch.bool)
    inputs = []
    for share in (0.0, 1.0):
        for batch in probe.batches(lm, masked_share=share, order=np.arange(len(probe)), endless=False):  # as pruning reads them
            x = pairs_at(lm, batch, [2], FEED_FORWARD)[2][0]
            acts, indices = before.encode(x)
            fired[indices[acts > 0]] = True
            inputs.append(x)
    assert not fired.all(), "a tiny run this short leaves latents that never fire: the test needs some"

    report = transcoders.prune_shipped(lm, corpus, out, [2], **lines)
    after = dictionary.load(out / "layer_2")
    assert after.latents == int(fired.sum())
    assert report["per_layer"]["2"]["pruned"]["removed"] == before.latents - after.latents
    assert after.record["training"]["pruned"]["latents_before"] == before.latents
    x = torch.cat(inputs)
    assert torch.allclose(after.output(x), before.output(x), rtol=1e-4, atol=1e-5)
    assert torch.equal(after.direction(0), before.direction(int(fired.nonzero()[0])))
    assert after.stats["density"].shape[0] == after.latents and after.record["quality"]["dead"] < 1
    assert {p.name: p.read_bytes() for p in (out / "layer_1").iterdir() if p.name != "record.json"} == layer_1
    assert report["quality"]["all_layers"]["layers"] == [1, 2]


# ---------------------------------------------------------------- the shipped transcoders

SHIPPED_LAYERS = [1, 2, 3, 4, 5, 6]


def shipped_present() -> bool:
    return (transcoders.SHIPPED / "training.json").is_file()


@pytest.mark.skipif(not shipped_present(), reason="no shipped transcoders yet (python -m bertdemo train-transcoders)")
def test_every_layer_is_shipped_for_the_bundled_models_weights_within_40_mb(tmp_path):
    lm = bertdemo.load_bundled("cpu")
    found = transcoders.transcoders_for(lm, transcoder_store(tmp_path, shipped=transcoders.SHIPPED))
    assert sorted(found) == SHIPPED_LAYERS
    assert folder_bytes(transcoders.SHIPPED) <= SHIPPED_MAX_BYTES
    record = json.loads((transcoders.SHIPPED / "training.json").read_text(encoding="utf-8"))
    assert record["weights"] == lm.weights_digest and record["quality"]["all_layers"]["layers"] == SHIPPED_LAYERS
    for layer, transcoder in found.items():
        with contextlib.redirect_stdout(None):
            stored = SparseCoder.load_from_disk(transcoders.SHIPPED / f"layer_{layer}")
        assert stored.cfg.transcode and stored.dtype == torch.float16 and transcoder.stats is not None
        q = transcoder.record["quality"]
        assert {"fvu", "dead", "l0", "cross_entropy", "loss_recovered", "all_layers"} <= set(q)
