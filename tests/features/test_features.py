"""Feature dictionaries (`bertdemo/features/`) and the splice point they stand on (`forward/splice.py`).

Every number a view shows is recomputed here from references built outside the code under test:
the model's own `output_hidden_states`, forward hooks registered directly on a layer module, and
EleutherAI's `sparsify.SparseCoder` loaded from the dictionary's folder (cast to float32). The
shipped dictionaries are tested where they live (`store.SHIPPED`, assets/bundled/features) and
for the bundled model; training, the store and the shipped file layout on tiny random models.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file

import bertdemo
import tiny_models
from bertdemo import disk
from bertdemo.features import dictionary, making, quality, store, views  # dictionary first: sparsify's decoder switch
from bertdemo.features import drift as views_drift
from bertdemo.features import senses
from bertdemo.features.data import Lines
from bertdemo.features.training import FeatureSettings, train
from bertdemo.forward import splice
from sparsify import SparseCoder

LAYER = 3  # the bundled model's layer most views are checked at (its dictionaries: layers 1..6)
SENTENCE = "Paris is the [MASK] of France."
TWO_MASKS = "The [MASK] sat on the mat and the [MASK] barked at it."
SPLICE_FAMILIES = ["bert", "roberta", "albert", "electra", "modernbert", "deberta-v2", "distilbert"]
TRAIN_FAMILIES = ["bert", "roberta", "albert", "electra", "modernbert", "deberta-v2"]
# Pre-LayerNorm families: transformers' hidden_states[L] is the last layer's output *after* the
# final norm, while the splice point is where a next layer would read it, before that norm.
FINAL_NORM = {"modernbert": "final_norm"}
# Where each family keeps its layer list (the references hook these modules directly).
LAYER_LISTS = {"bert": "encoder.layer", "modernbert": "layers"}
SHIPPED_GOALS = dict(fvu=0.25, dead=0.10, loss_recovered_zero=0.85)
# MB as the store counts them (budget_mb * 1e6): the coders (28.4) and their statistics, which since
# labels are scored and cards show the whole range hold bands, random firings and [MASK] words (1 MB a layer)
SHIPPED_MAX_BYTES = 36 * 10**6
SMALL = FeatureSettings(max_tokens=3000, batch_tokens=512, pause=0.0)


# ---------------------------------------------------------------- references and fixtures

def tiny_corpus(count: int, seed: int = 0, long: int = 0) -> list[str]:
    """`count` distinct lines of 6 to 14 words from the committed vocab (every tiny tokenizer reads
    them), the last `long` of them 70 to 90 words: longer than the statistics' window (MAX_LENGTH)."""
    words = [w for w in tiny_models.VOCAB.read_text(encoding="utf-8").split() if w.isalpha() and len(w) > 1]
    rng = random.Random(seed)
    sizes = [rng.randint(6, 14) for _ in range(count - long)] + [rng.randint(70, 90) for _ in range(long)]
    return [" ".join(rng.choice(words) for _ in range(size)) + "." for size in sizes]


@functools.cache
def reference_coder(folder: Path) -> SparseCoder:
    """sparsify's own coder for a dictionary folder, cast to float32."""
    with contextlib.redirect_stdout(None):
        return SparseCoder.load_from_disk(folder).float().eval().requires_grad_(False)


@torch.no_grad()
def dense_codes(coder: SparseCoder, hidden: torch.Tensor) -> torch.Tensor:
    """(N, H) -> (N, F): every latent's activation under sparsify's encode, zero outside the top k."""
    out = coder.encode(hidden.float())
    return torch.zeros(hidden.shape[0], coder.num_latents).scatter_(1, out.top_indices, out.top_acts)


@torch.no_grad()
def hidden_states(lm, inputs: dict, layer: int) -> torch.Tensor:
    """(B, T, H) at `layer` from transformers' own output_hidden_states (0 = the embeddings)."""
    return lm.model.base_model(**inputs, output_hidden_states=True).hidden_states[layer]


def layer_module(lm, layer: int) -> torch.nn.Module:
    """The module whose output is layer `layer` (1..L), found by the family's own attribute path."""
    stack = lm.model.base_model
    for name in LAYER_LISTS[lm.model.config.model_type].split("."):
        stack = getattr(stack, name)
    return stack[layer - 1]


@contextlib.contextmanager
def layer_output_replaced(module: torch.nn.Module, change):
    """A forward hook on `module` (a layer) replacing its hidden-state output h (B, T, H) by change(h)."""
    def hook(_, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        new = change(hidden)
        return (new, *output[1:]) if isinstance(output, tuple) else new
    handle = module.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def model_inputs(lm, text: str) -> dict:
    enc = lm.tokenizer(lm.to_model_text(text), return_tensors="pt")
    return {k: v for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """tiny(family, seed=0) -> (folder, LoadedModel): one tiny random model per family and seed, saved once."""
    made = {}

    def get(family: str, seed: int = 0):
        if (family, seed) not in made:
            folder = tiny_models.save_tiny_family(family, tmp_path_factory.mktemp(f"{family}-{seed}"), seed=seed)
            made[family, seed] = folder, bertdemo.load(str(folder), device="cpu")
        return made[family, seed]
    return get


def shipped_layer(layer: int) -> Path:
    return store.SHIPPED / f"layer_{layer}"


# ---------------------------------------------------------------- 1. the splice point

@pytest.mark.parametrize("family", SPLICE_FAMILIES)
def test_splice_reads_every_layer_as_the_models_own_hidden_states(tiny, family):
    """Layer 0 is the embeddings as the first layer reads them (ALBERT's and ELECTRA's projected
    to the hidden size), N the N-th layer's output, in a padded batch. The last layer of a
    pre-LayerNorm family (ModernBERT) is read where a next layer would read it, before the final
    norm that transformers' hidden_states[L] includes: there the model's own final norm of what
    the splice reads is hidden_states[L]."""
    _, lm = tiny(family)
    inputs = lm.tokenizer(["The cat sat on the mat.", "A dog ran in the park today."], return_tensors="pt",
                          padding=True)
    inputs = {k: v for k, v in inputs.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    count = lm.model.config.num_hidden_layers  # DistilBERT maps it to n_layers
    with torch.no_grad():
        theirs = lm.model.base_model(**inputs, output_hidden_states=True).hidden_states
        ours = splice.read(lm.model, inputs, list(range(count + 1)))
    assert len(theirs) == count + 1 and sorted(ours) == list(range(count + 1))
    real = inputs["attention_mask"].bool()
    for layer in range(count + 1):
        if layer == count and family in FINAL_NORM:
            norm = getattr(lm.model.base_model, FINAL_NORM[family])
            assert not torch.allclose(ours[layer][real], theirs[layer][real])
            with torch.no_grad():
                torch.testing.assert_close(norm(ours[layer])[real], theirs[layer][real], atol=1e-6, rtol=0)
            continue
        torch.testing.assert_close(ours[layer][real], theirs[layer][real], atol=1e-6, rtol=0)


@pytest.mark.parametrize("family", SPLICE_FAMILIES)
def test_an_edit_returning_its_input_leaves_the_mlm_logits_as_the_models_own(tiny, family):
    _, lm = tiny(family)
    inputs = model_inputs(lm, "The cat sat on the [MASK] in the park.")
    count = splice.layer_count(lm.model)
    calls = []

    def unchanged(layer):
        def edit(hidden):
            calls.append(layer)
            return hidden.clone()
        return edit
    with torch.no_grad():
        own = lm.model(**inputs).logits
        with splice.spliced(lm.model, {layer: unchanged(layer) for layer in range(count + 1)}):
            edited = lm.model(**inputs).logits
        with splice.spliced(lm.model, {1: lambda hidden: hidden * 2}):
            doubled = lm.model(**inputs).logits
    assert calls == list(range(count + 1))  # every layer's edit ran, once, in order
    torch.testing.assert_close(edited, own, atol=1e-6, rtol=0)
    assert not torch.allclose(doubled, own, atol=1e-3)  # what an edit returns is what the next layer reads


# ---------------------------------------------------------------- 2. the shipped dictionaries

def bundled_layers(bundled) -> list[int]:
    return list(range(1, bundled.model.config.num_hidden_layers + 1))


def test_every_layer_is_shipped_for_the_bundled_models_weights(bundled, shipped_store):
    report = json.loads((store.SHIPPED / "training.json").read_text(encoding="utf-8"))
    digest = bundled.weights_digest
    assert report["weights"] == digest, "the shipped dictionaries were trained for other weights"
    for layer in bundled_layers(bundled):
        record = json.loads((shipped_layer(layer) / dictionary.RECORD).read_text(encoding="utf-8"))
        assert record["layer"] == layer and record["weights"] == digest
    assert set(bundled_layers(bundled)) <= set(shipped_store.layers(bundled))  # the bundled model finds them
    assert shipped_store.folder_for(bundled, LAYER) == shipped_layer(LAYER)


def test_the_shipped_folder_fits_in_36_mb_in_float16(bundled):
    size = folder_bytes(store.SHIPPED)
    assert size <= SHIPPED_MAX_BYTES, f"assets/bundled/features holds {size / 1e6:.1f} MB"
    for layer in bundled_layers(bundled):
        with safe_open(str(shipped_layer(layer) / "sae.safetensors"), framework="pt") as weights:
            assert {weights.get_tensor(name).dtype for name in weights.keys()} == {torch.float16}


def test_each_shipped_dictionary_meets_the_quality_goals(bundled):
    """The figures recorded when each dictionary was made (`quality.measure` on held-out text)."""
    for layer in bundled_layers(bundled):
        q = json.loads((shipped_layer(layer) / dictionary.RECORD).read_text(encoding="utf-8"))["quality"]
        assert q["fvu"] <= SHIPPED_GOALS["fvu"], f"layer {layer}: FVU {q['fvu']:.3f}"
        assert q["dead"] <= SHIPPED_GOALS["dead"], f"layer {layer}: {q['dead']:.1%} dead"
        recovered = q["loss_recovered"]["zero"]
        assert recovered is not None and recovered >= SHIPPED_GOALS["loss_recovered_zero"], \
            f"layer {layer}: loss recovered {recovered} against zero-ablation"


def test_sparsify_reads_each_shipped_folder_as_the_project_does(bundled):
    lines = Lines(bundled, making.default_texts()[:24])
    batch = next(lines.batches(bundled, masked_share=0.5, order=np.arange(len(lines)), endless=False))
    with torch.no_grad():
        states = bundled.model.base_model(**batch.inputs, output_hidden_states=True).hidden_states
    for layer in bundled_layers(bundled):
        x = states[layer][batch.keep]  # (N, H) kept positions
        theirs = reference_coder(shipped_layer(layer))
        ours = dictionary.load(shipped_layer(layer))
        assert ours.layer == layer and ours.latents == theirs.num_latents and ours.k == theirs.cfg.k
        acts, indices = ours.encode(x)
        torch.testing.assert_close(ours.dense(x), dense_codes(theirs, x), atol=0, rtol=0)
        out = theirs.encode(x)
        torch.testing.assert_close(ours.decode(acts, indices), theirs.decode(out.top_acts, out.top_indices),
                                   atol=1e-6, rtol=0)


def test_using_the_shipped_dictionaries_writes_nothing_where_they_are_installed(bundled, tmp_path):
    """The Docker image's /app is root's and the server runs as uid 1000: anything the store
    writes beside the shipped files (even a folder's time stamp) is a PermissionError there, and
    the bundled model's features would fail for every visitor."""
    shipped = tmp_path / "features"
    shutil.copytree(store.SHIPPED, shipped, ignore=shutil.ignore_patterns("layer_[!3]"))
    stamps = {}
    for path in [shipped, *shipped.rglob("*")]:
        os.utime(path, (1_000_000_000, 1_000_000_000))
        stamps[path] = path.stat().st_mtime
    found = store.FeatureStore(tmp_path / "cache", shipped=shipped).get(bundled, LAYER)
    assert found is not None and found.folder == shipped / f"layer_{LAYER}"
    changed = [str(p.relative_to(tmp_path)) for p in stamps if p.stat().st_mtime != stamps[p]]
    assert changed == []


# ---------------------------------------------------------------- 3. steering

def test_steering_by_one_and_adding_nothing_is_the_clean_fill_mask(bundled, shipped_store):
    for text in (SENTENCE, TWO_MASKS):
        clean = bertdemo.fill_mask(bundled, text, top_k=5)
        shown = views.steer(bundled, text, LAYER, 7, scale=1.0, add=0.0, top_k=5, store=shipped_store)
        assert len(shown["masks"]) == len(clean)
        for mask, expected in zip(shown["masks"], clean):
            for side in ("before", "after"):
                assert [p["token_id"] for p in mask[side]] == [p["token_id"] for p in expected]
                assert [p["score"] for p in mask[side]] == pytest.approx([p["score"] for p in expected], abs=1e-5)


def steered_reference(bundled, text: str, layer: int, feature: int, scale: float, add: float) -> torch.Tensor:
    """Probabilities (masks, V) with a hook on the layer module itself: the feature's activation x
    its decoder row, times (scale - 1), added at every position but [CLS] and [SEP] (the first and
    the last: they pass through untouched); `add` x its mean activation x its decoder row added at
    each [MASK] where it does not fire."""
    coder = reference_coder(shipped_layer(layer))
    typical = float(load_file(str(shipped_layer(layer) / dictionary.STATS))["mean"][feature])
    inputs = model_inputs(bundled, text)
    masks = inputs["input_ids"][0] == bundled.mask_token_id
    kept = torch.zeros_like(masks)
    kept[1:-1] = True

    def change(hidden):  # (1, T, H)
        activation = dense_codes(coder, hidden[0])[:, feature] * kept  # (T,)
        amount = (scale - 1) * activation + add * typical * (masks & (activation == 0)).float()
        return hidden + amount[None, :, None] * coder.W_dec[feature]
    with torch.no_grad(), layer_output_replaced(layer_module(bundled, layer), change):
        return bundled.model(**inputs).logits[0, masks].softmax(-1)


def strongest_at_mask(bundled, text: str, layer: int) -> tuple[int, int]:
    """(the feature firing most at the first [MASK], one firing elsewhere in the sentence but not there)."""
    inputs = model_inputs(bundled, text)
    codes = dense_codes(reference_coder(shipped_layer(layer)), hidden_states(bundled, inputs, layer)[0])
    mask = int((inputs["input_ids"][0] == bundled.mask_token_id).nonzero()[0])
    elsewhere = codes.clone()
    elsewhere[:, codes[mask] > 0] = 0
    return int(codes[mask].argmax()), int(elsewhere[1:-1].max(0).values.argmax())


@pytest.mark.parametrize("scale, add", [(0.0, 0.0), (2.5, 3.0)], ids=["off", "doubled-and-added"])
def test_steering_equals_a_hook_on_the_layer_module(bundled, shipped_store, scale, add):
    at_mask, elsewhere = strongest_at_mask(bundled, SENTENCE, LAYER)
    for feature in (at_mask, elsewhere):
        shown = views.steer(bundled, SENTENCE, LAYER, feature, scale=scale, add=add, top_k=5, store=shipped_store)
        expected = steered_reference(bundled, SENTENCE, LAYER, feature, scale, add)
        for m, mask in enumerate(shown["masks"]):
            top = expected[m].topk(5)
            assert [p["token_id"] for p in mask["after"]] == top.indices.tolist()
            assert [p["score"] for p in mask["after"]] == pytest.approx(top.values.tolist(), abs=1e-5)
            for token in mask["tokens"]:
                assert token["after"] == pytest.approx(float(expected[m, token["token_id"]]), abs=1e-5)
            assert max(abs(t["after"] - t["before"]) for t in mask["tokens"]) > 1e-4  # the edit did something


# ---------------------------------------------------------------- 4. a feature's card

def check_context(lm, coder: SparseCoder, layer: int, feature: int, context: dict) -> None:
    """The card's highlighted characters are one token of its text, and the feature's activation
    there, from a forward of that text alone, is the stated one (float16 tolerance)."""
    text, start, end = context["text"], context["start"], context["end"]
    enc = lm.tokenizer(text, return_tensors="pt", return_offsets_mapping=True)
    assert enc["input_ids"].shape[1] <= lm.max_length, f"the card shows more of {text!r} than the model can read"
    offsets = [tuple(span) for span in enc.pop("offset_mapping")[0].tolist()]
    at = [i for i, span in enumerate(offsets) if span == (start, end) and end > start]
    assert at == [context["position"]], f"{text!r}: the span {start}:{end} is not the token at {context['position']}"
    piece = lm.tokenizer.convert_ids_to_tokens(int(enc["input_ids"][0, at[0]]))
    assert piece == context["token"]
    normalize = lm.tokenizer.backend_tokenizer.normalizer.normalize_str
    assert piece == lm.tokenizer.unk_token or normalize(text[start:end]) == piece.removeprefix("##")
    hidden = hidden_states(lm, dict(enc), layer)[0, at[0]]
    activation = float(dense_codes(coder, hidden[None])[0, feature])
    assert activation == pytest.approx(context["activation"], rel=2e-3, abs=2e-3), (text, context["token"])


def densest_features(folder: Path, count: int) -> list[int]:
    return load_file(str(folder / dictionary.STATS))["density"].argsort(descending=True)[:count].tolist()


def on_the_longest_line(lm, folder: Path) -> int:
    """A feature with a top context on the longest line its statistics point to (in word pieces)."""
    stats = load_file(str(folder / dictionary.STATS))
    record = json.loads((folder / dictionary.RECORD).read_text(encoding="utf-8"))
    texts = (folder / record.get("contexts", dictionary.CONTEXTS)).read_text(encoding="utf-8").split("\n")[:-1]
    used = torch.unique(stats["context_line"][stats["context_line"] >= 0]).tolist()
    longest = max(used, key=lambda line: len(lm.tokenizer(texts[line])["input_ids"]) if line < len(texts) else 0)
    return int((stats["context_line"] == longest).any(1).nonzero()[0])


def test_a_cards_contexts_are_where_the_feature_fires(bundled, shipped_store):
    coder = reference_coder(shipped_layer(LAYER))
    for feature in densest_features(shipped_layer(LAYER), 3):
        card = views.feature_card(bundled, LAYER, feature, store=shipped_store)
        assert card["contexts"], f"feature {feature} fires often but shows no context"
        activations = [c["activation"] for c in card["contexts"]]
        assert activations == sorted(activations, reverse=True)
        for context in card["contexts"]:
            check_context(bundled, coder, LAYER, feature, context)


def test_a_cards_context_longer_than_the_statistics_window_is_what_the_model_read(bundled, shipped_store):
    """The statistics' pass cuts a corpus line at MAX_LENGTH word pieces; the card of a feature
    firing on the longest context line must still state what its shown text gives."""
    feature = on_the_longest_line(bundled, shipped_layer(LAYER))
    card = views.feature_card(bundled, LAYER, feature, store=shipped_store)
    coder = reference_coder(shipped_layer(LAYER))
    for context in card["contexts"]:
        check_context(bundled, coder, LAYER, feature, context)


# ---------------------------------------------------------------- 5. quality

def reference_cross_entropies(lm, coder: SparseCoder, layer: int, lines: Lines) -> dict:
    """Mean masked-LM cross-entropy over the held-out masks (quality.SEED, every line masked) with
    the layer's output at kept positions left as it is, replaced by the reconstruction, by zero,
    or by its mean over the measured window (plain and masked lines, as `measure` reads them)."""
    module = layer_module(lm, layer)
    total, count = 0.0, 0
    for batch in lines.batches(lm, seed=quality.SEED, order=np.arange(len(lines)), endless=False):
        seen = []  # the module's own output: for a pre-LayerNorm last layer, hidden_states[L] is after the final norm
        with torch.no_grad(), layer_output_replaced(module, lambda hidden: seen.append(hidden) or hidden):
            lm.model.base_model(**batch.inputs)
        x = seen[0][batch.keep].double()
        total, count = total + x.sum(0), count + x.shape[0]
    mean = (total / count).float()
    sums = dict.fromkeys(quality.VARIANTS, 0.0)
    targets = 0
    for batch in lines.batches(lm, seed=quality.SEED, masked_share=1.0, order=np.arange(len(lines)), endless=False):
        labels, keep = batch.labels, batch.keep
        for variant in quality.VARIANTS:
            def change(hidden, variant=variant):
                hidden = hidden.clone()
                if variant == "spliced":
                    out = coder.encode(hidden[keep])
                    hidden[keep] = coder.decode(out.top_acts, out.top_indices)
                elif variant == "zero":
                    hidden[keep] = 0
                elif variant == "mean":
                    hidden[keep] = mean
                return hidden
            hook = layer_output_replaced(module, change) if variant != "clean" else contextlib.nullcontext()
            with torch.no_grad(), hook:
                logits = lm.model(**batch.inputs).logits
            sums[variant] += float(F.cross_entropy(logits[labels != -100], labels[labels != -100], reduction="sum"))
        targets += int((labels != -100).sum())
    return {variant: value / targets for variant, value in sums.items()}


def check_measure(lm, found: dictionary.Dictionary, coder: SparseCoder, lines: Lines) -> None:
    measured = quality.measure(lm, found, lines)
    expected = reference_cross_entropies(lm, coder, found.layer, lines)
    assert measured["cross_entropy"] == pytest.approx(expected, rel=1e-5)
    for ablation in ("zero", "mean"):
        gap = expected[ablation] - expected["clean"]
        if gap > 0:
            want = (expected[ablation] - expected["spliced"]) / gap
            assert measured["loss_recovered"][ablation] == pytest.approx(want, rel=1e-4)
        else:  # ablating costs nothing: there is no loss to recover
            assert measured["loss_recovered"][ablation] is None


@pytest.mark.slow
def test_the_quality_tables_cross_entropies_equal_a_reference_loop(bundled):
    lines = Lines(bundled, making.default_texts()[200:230])
    check_measure(bundled, dictionary.load(shipped_layer(2)), reference_coder(shipped_layer(2)), lines)


def test_quality_at_the_last_layer_of_a_pre_layernorm_family(tiny, tmp_path):
    """ModernBERT's last layer is replaced before the final norm the model applies after it."""
    _, lm = tiny("modernbert")
    torch.manual_seed(0)
    found = dictionary.save(dictionary.Dictionary(dictionary.new_coder(32), 2), tmp_path / "layer_2")
    lines = Lines(lm, tiny_corpus(24, seed=3))
    check_measure(lm, dictionary.load(found.folder), reference_coder(found.folder), lines)


# ---------------------------------------------------------------- 6. training, stopping, resuming, the store

class StopAfter:
    """A `should_stop` that turns true after `steps` calls (it is asked before each step)."""

    def __init__(self, steps: int):
        self.steps, self.asked = steps, 0

    def __call__(self) -> bool:
        self.asked += 1
        return self.asked > self.steps


def kept_folder(store_folder: Path, lm, layer: int) -> Path:
    return Path(store_folder) / lm.weights_digest / f"layer_{layer}"


@pytest.mark.slow
@pytest.mark.parametrize("family", TRAIN_FAMILIES)
def test_training_learns_and_a_restart_finds_it_for_those_weights_only(tiny, tmp_path, family):
    folder, lm = tiny(family)
    steps = []
    made, history = making.train_features(lm, 2, tiny_corpus(400), SMALL, on_event=steps.append,
                                          store=store.FeatureStore(tmp_path, shipped=None))
    assert history.stopped is None and history.tokens >= SMALL.max_tokens and steps == history.steps
    fvu = [step.fvu[0] for step in history.steps]
    assert len(fvu) >= 3 and fvu[-1] < 0.5 * fvu[0], fvu
    assert made.record["training"]["tokens"] == history.tokens and made.record["quality"]["tokens"] > 0
    assert (kept_folder(tmp_path, lm, 2) / "cfg.json").is_file()
    again = bertdemo.load(str(folder), device="cpu")  # a restart: a fresh store and the model loaded afresh
    found = store.FeatureStore(tmp_path, shipped=None).get(again, 2)
    assert found is not None and found.record["training"] == made.record["training"]
    for name, tensor in made.coder.state_dict().items():
        torch.testing.assert_close(found.coder.state_dict()[name], tensor, atol=0, rtol=0)
    _, other = tiny(family, seed=1)
    assert store.FeatureStore(tmp_path, shipped=None).get(other, 2) is None
    assert store.FeatureStore(tmp_path, shipped=None).layers(other) == []


@pytest.mark.slow
def test_a_dictionary_evicted_while_it_is_read_is_as_if_never_trained(tiny, tmp_path, monkeypatch):
    """The disk budget may evict a layer's dictionary the moment a visitor's request reads it: the
    request is answered as for a layer with none (the page offers to train it), not a crash."""
    _, lm = tiny("bert")
    making.train_features(lm, 2, tiny_corpus(400), SMALL, store=store.FeatureStore(tmp_path, shipped=None))
    load = store.files.load

    def evicted_first(folder):
        shutil.rmtree(folder)
        return load(folder)

    monkeypatch.setattr(store.files, "load", evicted_first)
    fresh = store.FeatureStore(tmp_path, shipped=None)
    assert fresh.get(lm, 2) is None and fresh.layers(lm) == []


@pytest.mark.slow
@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_a_stopped_run_keeps_what_it_learnt_and_resumes_from_it(tiny, tmp_path, family):
    _, lm = tiny(family)
    texts = tiny_corpus(400)
    dropped, history = making.train_features(lm, 1, texts, SMALL, should_stop=StopAfter(2), keep_partial=False,
                                             store=store.FeatureStore(tmp_path / "dropped", shipped=None))
    assert dropped is None and history.stopped == "stopped" and len(history.steps) == 2
    assert not any((tmp_path / "dropped").rglob("cfg.json")) and not any((tmp_path / "dropped").rglob("*.part"))

    kept_store = store.FeatureStore(tmp_path / "kept", shipped=None)
    partial, first = making.train_features(lm, 1, texts, SMALL, should_stop=StopAfter(3), store=kept_store)
    assert first.stopped == "stopped" and len(first.steps) == 3
    assert partial is not None and (kept_folder(tmp_path / "kept", lm, 1) / "cfg.json").is_file()
    assert partial.record["training"]["tokens"] == first.tokens
    assert partial.record["training"]["stopped"] == "stopped"

    resumed, second = making.train_features(lm, 1, texts, SMALL, store=kept_store, resume=True)
    _, scratch = making.train_features(lm, 1, texts, SMALL,
                                       store=store.FeatureStore(tmp_path / "fresh", shipped=None))
    assert second.stopped is None
    assert second.steps[0].fvu[0] < 0.8 * scratch.steps[0].fvu[0]  # it goes on from the kept dictionary
    assert resumed.record["training"]["tokens"] == first.tokens + second.tokens
    assert resumed.record["training"]["steps"] == len(first.steps) + len(second.steps)
    restarted = store.FeatureStore(tmp_path / "kept", shipped=None).get(bertdemo.load(str(tiny(family)[0])), 1)
    assert restarted.record["training"]["tokens"] == first.tokens + second.tokens


# ---------------------------------------------------------------- 7. the features behind a prediction

def test_a_features_drop_is_the_measured_ablation_and_they_come_largest_first(bundled, shipped_store):
    """The drop shown is what switching the feature off does to the word's log-probability: its
    activation x decoder row removed at every position but [CLS] and [SEP], as
    `prediction_features` says and as the steering view (scale 0) switches it off, so both views
    give a person the same number."""
    shown = views.prediction_features(bundled, SENTENCE, LAYER, top=10, candidates=20, store=shipped_store)
    coder = reference_coder(shipped_layer(LAYER))
    inputs = model_inputs(bundled, SENTENCE)
    (mask,) = shown["masks"]
    word, position = mask["token_id"], mask["position"]

    def log_p(feature=None) -> float:
        def off(hidden):  # the feature's activation x decoder row taken out between [CLS] and [SEP]
            activation = dense_codes(coder, hidden[0])[:, feature]
            activation[[0, -1]] = 0
            return hidden - activation[None, :, None] * coder.W_dec[feature]
        hook = (layer_output_replaced(layer_module(bundled, LAYER), off) if feature is not None
                else contextlib.nullcontext())
        with torch.no_grad(), hook:
            return float(bundled.model(**inputs).logits[0, position].log_softmax(-1)[word])
    clean = log_p()
    assert mask["log_prob"] == pytest.approx(clean, abs=1e-5)
    assert word == bertdemo.fill_mask(bundled, SENTENCE, top_k=1)[0][0]["token_id"]
    drops = [f["drop"] for f in mask["features"]]
    assert len(drops) == 10 and drops == sorted(drops, reverse=True)
    for shown_feature in mask["features"]:
        measured = clean - log_p(shown_feature["feature"])
        assert shown_feature["drop"] == pytest.approx(measured, abs=1e-4), f"feature {shown_feature['feature']}"


# ---------------------------------------------------------------- 8. two uses of a word

def fired_on_word(lm, coder: SparseCoder, layer: int, lines: list[str], word: str) -> torch.Tensor:
    """(occurrences, F) bool: whether each feature fires on any piece of each use of `word`."""
    rows = []
    for line in lines:
        enc = lm.tokenizer(line, return_tensors="pt", return_offsets_mapping=True)
        offsets = enc.pop("offset_mapping")[0].tolist()
        codes = dense_codes(coder, hidden_states(lm, dict(enc), layer)[0])
        for use in re.finditer(rf"\b{word}\b", line, re.IGNORECASE):
            pieces = [i for i, (s, e) in enumerate(offsets) if e > s and s < use.end() and e > use.start()]
            rows.append((codes[pieces] > 0).any(0))
    return torch.stack(rows)


def test_contrasting_two_uses_of_bank_counts_each_lists_occurrences(bundled, shipped_store):
    river, money = senses.sense_lists("bank")
    shown = views.contrast_features(bundled, river, money, "bank", LAYER, top=8, store=shipped_store)
    coder = reference_coder(shipped_layer(LAYER))
    fired_a, fired_b = (fired_on_word(bundled, coder, LAYER, lines, "bank") for lines in (river, money))
    assert shown["occurrences"] == {"a": len(fired_a), "b": len(fired_b)}
    share_a, share_b = fired_a.float().mean(0), fired_b.float().mean(0)
    separation = share_a - share_b
    for side, sign in (("a", 1), ("b", -1)):
        listed = shown[side]
        assert listed and len(listed) <= 8
        for row in listed:
            f = row["feature"]
            assert row["share_a"] == pytest.approx(float(share_a[f]), abs=1e-6)
            assert row["share_b"] == pytest.approx(float(share_b[f]), abs=1e-6)
            assert row["separation"] == pytest.approx(row["share_a"] - row["share_b"], abs=1e-6)
            assert sign * row["separation"] > 0
        order = [sign * row["separation"] for row in listed]
        assert order == sorted(order, reverse=True)
        others = torch.ones_like(separation, dtype=torch.bool)
        others[[row["feature"] for row in listed]] = False
        if len(listed) == 8:  # nothing left out separates more
            assert min(order) >= float((sign * separation)[others].max()) - 1e-6


@pytest.mark.parametrize("missing", ["texts_a", "texts_b"])
def test_a_list_without_the_word_is_refused_by_name(bundled, shipped_store, missing):
    river, money = senses.sense_lists("bank")
    lists = {"texts_a": river, "texts_b": money, missing: ["The cat sat on the mat.", "It was a cold day."]}
    with pytest.raises(ValueError) as refused:
        views.contrast_features(bundled, lists["texts_a"], lists["texts_b"], "bank", LAYER, store=shipped_store)
    assert getattr(refused.value, "field", None) == missing
    message = str(refused.value)
    assert "bank" in message
    which = {"texts_a": r"texts_a|list a\b|first list", "texts_b": r"texts_b|list b\b|second list"}[missing]
    assert re.search(which, message, re.IGNORECASE), f"which list? {message!r}"


# ---------------------------------------------------------------- 9. bad input

def test_bad_input_is_refused_saying_how_to_fix_it(bundled, shipped_store, tiny, tmp_path):
    last = bundled.model.config.num_hidden_layers
    for layer in (last + 1, -1):
        with pytest.raises(ValueError, match=rf"from 0 to {last} \(0 = the embeddings, {last} = the last layer\)"):
            views.sentence_features(bundled, "The cat sat on the mat.", layer, store=shipped_store)
    latents = reference_coder(shipped_layer(LAYER)).num_latents
    past = rf"from 0 to {latents - 1:,} \(this dictionary of layer {LAYER} has {latents:,}\)"
    with pytest.raises(ValueError, match=past):
        views.feature_card(bundled, LAYER, latents, store=shipped_store)
    for scale in (-0.5, views.MAX_SCALE + 0.5):
        with pytest.raises(ValueError, match=rf"scale must be at least 0 and at most {views.MAX_SCALE:g}"):
            views.steer(bundled, SENTENCE, LAYER, 0, scale=scale, store=shipped_store)
    _, lm = tiny("bert")
    empty = store.FeatureStore(tmp_path, shipped=None)
    with pytest.raises(ValueError, match=r"has no feature dictionary for layer 1 yet: train one"):
        views.steer(lm, SENTENCE, 1, 0, store=empty)
    with pytest.raises(ValueError, match=r"needs at least 1,000\. Paste more text, or leave it empty"):
        bertdemo.train_features(lm, 1, texts=["The cat sat on the mat.", "A dog ran in the park."], store=empty)
    assert not any(tmp_path.rglob("cfg.json"))


# ---------------------------------------------------------------- 10. the store on disk

def coder_dictionary(layer: int, seed: int) -> dictionary.Dictionary:
    torch.manual_seed(seed)
    return dictionary.Dictionary(dictionary.new_coder(32), layer, None, {"seed": seed})


def test_a_dictionary_a_killed_process_left_half_written_is_removed_at_start(tmp_path):
    digest = tmp_path / "0123456789abcdef01234567"
    killed = subprocess.Popen([sys.executable, "-c", "pass"])
    killed.wait()  # a process of this host that no longer runs
    dead = digest / f"{disk.PART}{killed.pid}@{socket.gethostname()}~layer_1-x"
    alive = digest / f"{disk.PART}{os.getppid()}@{socket.gethostname()}~layer_2-x"  # another replica, writing
    whole = digest / "layer_3"
    for folder in (dead, alive, whole):
        folder.mkdir(parents=True)
        (folder / "cfg.json").write_text("{}", encoding="utf-8")
    store.FeatureStore(tmp_path, shipped=None)
    assert not dead.exists()
    assert alive.exists() and whole.exists()


def budget_for(tmp_path: Path, dictionaries: float) -> float:
    """A budget in MB that holds `dictionaries` tiny dictionaries."""
    probe = dictionary.save(coder_dictionary(0, 0), tmp_path / "probe" / "layer_0")
    return dictionaries * folder_bytes(probe.folder) / 1e6


def test_the_budget_removes_the_least_recently_used_others(tiny, tmp_path):
    _, lm = tiny("bert")
    budget = budget_for(tmp_path, 2.5)
    cache = tmp_path / "cache"
    first = store.FeatureStore(cache, shipped=None, budget_mb=budget)
    a, b = (first.put(lm, coder_dictionary(layer, layer)).folder for layer in (0, 1))
    now = time.time()
    os.utime(a, (now - 300, now - 300))
    os.utime(b, (now - 200, now - 200))
    server = store.FeatureStore(cache, shipped=None, budget_mb=budget)  # after a restart
    assert server.get(lm, 0).record["seed"] == 0  # a visitor uses layer 0: b is now the least recent
    c = server.put(lm, coder_dictionary(2, 2)).folder
    assert a.is_dir() and c.is_dir() and not b.exists()
    assert folder_bytes(cache) <= budget * 1e6
    assert server.get(lm, 1) is None and server.layers(lm) == [0, 2]


def test_a_dictionary_in_use_from_memory_counts_as_recently_used(tiny, tmp_path):
    """A server keeps loaded dictionaries in memory: a visitor who keeps using one must not lose
    it to the budget when someone else trains another layer."""
    _, lm = tiny("bert")
    budget = budget_for(tmp_path, 2.5)
    server = store.FeatureStore(tmp_path / "cache", shipped=None, budget_mb=budget)
    a, b = (server.put(lm, coder_dictionary(layer, layer)).folder for layer in (0, 1))
    now = time.time()
    os.utime(a, (now - 300, now - 300))
    os.utime(b, (now - 200, now - 200))
    assert server.get(lm, 0).record["seed"] == 0  # in use since b was written
    server.put(lm, coder_dictionary(2, 2))
    assert server.get(lm, 0) is not None, "the dictionary a visitor was using was removed"
    assert not b.exists()


# ---------------------------------------------------------------- the shipped layout, made on a tiny model

def check_cards(lm, folder: Path, feature_store: store.FeatureStore, layer: int, features) -> int:
    coder = reference_coder(folder / f"layer_{layer}")
    checked = 0
    for feature in features:
        for context in views.feature_card(lm, layer, feature, store=feature_store)["contexts"]:
            check_context(lm, coder, layer, feature, context)
            checked += 1
    return checked


@pytest.mark.slow
def test_dictionaries_sharing_one_contexts_file_each_point_at_their_own_lines(tiny, tmp_path):
    """The shipped layout: every layer_N/stats.safetensors points into one ../contexts.txt."""
    _, lm = tiny("bert")
    trained, _ = train(lm, [1, 2], Lines(lm, tiny_corpus(300)), SMALL)
    done = making.finish(lm, trained, Lines(lm, tiny_corpus(600, seed=1, long=20)), Lines(lm, tiny_corpus(40, seed=2)))
    out = tmp_path / "features"
    out.mkdir()
    for layer, made in done.items():
        dictionary.save(made, out / f"layer_{layer}", half=True, contexts=f"../{dictionary.CONTEXTS}")
    dictionary.write_json(out / "training.json", {"weights": lm.weights_digest})
    shipped = store.FeatureStore(tmp_path / "cache", shipped=out)
    assert shipped.layers(lm) == [1, 2]
    for layer in (1, 2):
        chosen = densest_features(out / f"layer_{layer}", 4) + [on_the_longest_line(lm, out / f"layer_{layer}")]
        assert check_cards(lm, out, shipped, layer, chosen) > 0


@pytest.mark.slow
def test_make_shipped_writes_what_the_store_and_sparsify_read(tiny, tmp_path):
    folder, lm = tiny("bert")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "train.txt").write_text("\n".join(tiny_corpus(300)), encoding="utf-8")
    (corpus / "heldout.txt").write_text("\n".join(tiny_corpus(600, seed=1, long=20) + tiny_corpus(60, seed=2)),
                                        encoding="utf-8")
    out = tmp_path / "features"
    report = making.make_shipped(lm, corpus, out, SMALL, layers=[1, 2], statistics_lines=600, held_out_lines=60,
                                 echo=lambda line: None)
    assert report["weights"] == lm.weights_digest
    assert json.loads((out / "training.json").read_text(encoding="utf-8")) == json.loads(json.dumps(report))
    shipped = store.FeatureStore(tmp_path / "cache", shipped=out)
    assert shipped.layers(bertdemo.load(str(folder))) == [1, 2]
    for layer in (1, 2):
        assert reference_coder(out / f"layer_{layer}").num_latents == 8 * 32
        chosen = densest_features(out / f"layer_{layer}", 4) + [on_the_longest_line(lm, out / f"layer_{layer}")]
        assert check_cards(lm, out, shipped, layer, chosen) > 0


@pytest.mark.slow
def test_after_a_fine_tune_the_base_dictionary_shows_what_changed(tiny, tmp_path):
    """`tuning_drift`: the base model against itself changes nothing; against a copy whose last
    layer moved, its dictionary explains less (FVU up) and the features it names did change. The
    change of firing share and the change of mean activation (where it fires) are two columns,
    recomputed here from sparsify's coder on each model's own activations, and the table is sorted
    by the one asked for."""
    _, lm = tiny("bert")
    feature_store = store.FeatureStore(tmp_path, shipped=None)
    made, _ = making.train_features(lm, 2, tiny_corpus(400), SMALL, store=feature_store)
    text = tiny_corpus(60, seed=3)
    same = views_drift.tuning_drift(lm, lm, text, 2, store=feature_store)
    assert same["fvu"]["base"] == same["fvu"]["tuned"]
    assert all(row["share_change"] == 0 and row["activation_change"] in (0, None) for row in same["features"])
    tuned_model = copy.deepcopy(lm.model)
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in layer_module(bertdemo.LoadedModel("t", lm.tokenizer, tuned_model, lm.device), 2).parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    tuned = bertdemo.LoadedModel("tuned", lm.tokenizer, tuned_model, lm.device)
    coder = reference_coder(made.folder)
    lines = Lines(lm, text)
    codes = {name: torch.cat([dense_codes(coder, hidden_states(model, b.inputs, 2)[b.keep]) for b in
                              lines.batches(model, order=np.arange(len(lines)), masked_share=0.0, endless=False)])
             for name, model in (("base", lm), ("tuned", tuned))}
    share = {name: (c > 0).float().mean(0) for name, c in codes.items()}
    mean = {name: c.sum(0) / (c > 0).sum(0).clamp(min=1) for name, c in codes.items()}
    both = (share["base"] > 0) & (share["tuned"] > 0)
    for sort_by in ("share", "activation"):
        drift = views_drift.tuning_drift(lm, tuned, text, 2, top=12, store=feature_store, sort_by=sort_by)
        assert drift["fvu"]["tuned"] > drift["fvu"]["base"] and drift["sort_by"] == sort_by
        for row in drift["features"]:
            f = row["feature"]
            for name in ("base", "tuned"):
                assert row[f"density_{name}"] == pytest.approx(float(share[name][f]), abs=1e-6)
            assert row["share_change"] == pytest.approx(float(share["tuned"][f] - share["base"][f]), abs=1e-6)
            if both[f]:
                assert row["activation_change"] == pytest.approx(float(mean["tuned"][f] - mean["base"][f]), abs=1e-4)
            else:
                assert row["activation_change"] is None
        key = "share_change" if sort_by == "share" else "activation_change"
        sizes = [abs(row[key]) if row[key] is not None else -1 for row in drift["features"]]
        assert sizes == sorted(sizes, reverse=True) and sizes[0] > 0
        whole = (share["tuned"] - share["base"]) if sort_by == "share" else \
            torch.where(both, mean["tuned"] - mean["base"], torch.zeros(()))
        assert sizes[0] == pytest.approx(float(whole.abs().max()), abs=1e-4)  # nothing left out changed more
    with pytest.raises(ValueError, match="Sort by one of 'share', 'activation'"):
        views_drift.tuning_drift(lm, tuned, text, 2, store=feature_store, sort_by="change")
