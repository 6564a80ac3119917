"""Where a model's feature dictionaries are found (`bertdemo/features/store.py`): the store is held
by the engine like every other shared cache (`shared_store(engine.caches)`), so every model it
loads and every tuned copy of one is offered the same dictionaries, one trained with no store named
lands there and a restart finds it on disk, a test's engine has a store of its own, and a model
loaded in code keeps its own (the default disk cache), its dictionaries loaded once."""
from __future__ import annotations

import copy
import dataclasses
import random

import bertdemo
import tiny_models
from bertdemo.disk import DiskCache
from bertdemo.features import dictionary, making  # noqa: F401 - dictionary first: sparsify's decoder switch
from bertdemo.features.store import shared_store
from bertdemo.features.training import FeatureSettings

SMALL = FeatureSettings(max_tokens=600, batch_tokens=256, pause=0.0)


def texts(count: int = 200) -> list[str]:
    words = [w for w in tiny_models.VOCAB.read_text(encoding="utf-8").split() if w.isalpha() and len(w) > 1]
    rng = random.Random(0)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(6, 14))) + "." for _ in range(count)]


def test_every_model_an_engine_loads_and_its_tuned_copies_share_the_engines_store(tmp_path, tiny_bert_dir):
    engine = bertdemo.Engine(disk=DiskCache(tmp_path))
    lm = engine.load(str(tiny_bert_dir), device="cpu")
    store = shared_store(engine.caches)
    assert shared_store(lm.caches) is store and store.cache is engine.disk
    tuned = dataclasses.replace(lm, model=copy.deepcopy(lm.model))  # a session's tuned copy
    assert shared_store(tuned.caches) is store
    assert shared_store(bertdemo.Engine(disk=DiskCache(tmp_path)).caches) is not store  # nothing leaks between engines


def test_a_dictionary_trained_with_no_store_named_is_the_engines_and_a_restart_finds_it(tmp_path, tiny_bert_dir):
    lm = bertdemo.Engine(disk=DiskCache(tmp_path)).load(str(tiny_bert_dir), device="cpu")
    made, _ = bertdemo.train_features(lm, 1, texts(), SMALL)
    assert made is not None and made.folder.is_relative_to(tmp_path)  # in the engine's disk cache
    assert bertdemo.load_features(lm, 1) is made  # the engine's store keeps it loaded
    again = bertdemo.Engine(disk=DiskCache(tmp_path)).load(str(tiny_bert_dir), device="cpu")  # a restart
    found = bertdemo.load_features(again, 1)
    assert found is not made and found.folder == made.folder and found.latents == made.latents


def test_a_model_loaded_in_code_finds_the_shipped_dictionaries_and_keeps_them_loaded(bundled):
    store = shared_store(bundled.caches)
    assert store.cache.root == DiskCache().root  # the default disk cache, as every script's
    assert bertdemo.load_features(bundled, 2) is bertdemo.load_features(bundled, 2)
    assert store.is_shipped(bundled, 2)
