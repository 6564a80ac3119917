"""The sentence's own features (`features/cls_features.py`): a [CLS] dictionary made here for the tiny
model and a classifier built on it. The ablation's before -> after is recomputed with a hook of the
test's own on the last layer; a feature that never fires at [CLS] changes nothing; the FVU is
recomputed by hand; the files read back; the Classify tab's handler shows the table."""
from __future__ import annotations

import itertools

import pytest
import torch

from bertdemo.features import dictionary as files  # first: sparsify's decoder switch
from bertdemo.features import cls_features
from bertdemo.features.cls_features import ClsFeatures, classifier_features
from bertdemo.features.store import FeatureStore
from bertdemo.features.training import FeatureSettings
from bertdemo.training.classification import build_classifier

NOUNS = ["cat", "dog", "man", "woman", "car", "house", "book", "river", "city", "tower"]
ADJECTIVES = ["big", "small", "new", "old", "red", "blue"]
LINES = [f"the {a} {n} went to {p} ." for n, a, p in itertools.product(NOUNS, ADJECTIVES, ["paris", "rome"])]
SENTENCE = "the big dog went to rome ."
SMALL = FeatureSettings(latents=32, k=4, max_tokens=6_000, max_seconds=30, batch_tokens=32, dead_tokens=500,
                        pause=0.0)


@pytest.fixture(scope="module")
def made(tiny_bert):
    """(the [CLS] features of the tiny model, a classifier of two labels built on it, random head)."""
    torch.manual_seed(0)
    coded = cls_features.make_cls_features(tiny_bert, LINES[::2], LINES[1::2], settings=SMALL, corpus="test lines")
    classifier = build_classifier(tiny_bert, ["animal", "place"])
    return coded, classifier


def last_layer(classifier):
    return classifier.model.bert.encoder.layer[-1]


def probabilities_with_hook(classifier, removed: torch.Tensor) -> torch.Tensor:
    """The classifier's probabilities on SENTENCE with `removed` (H,) taken from [CLS] after the last
    layer, by a forward hook of the test's own (no splice)."""
    def hook(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        hidden = hidden.clone()
        hidden[:, 0] -= removed
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden
    handle = last_layer(classifier).register_forward_hook(hook)
    try:
        classifier.model.eval()
        with torch.no_grad():
            inputs = classifier.tokenizer(SENTENCE, return_tensors="pt")
            return classifier.model(**inputs).logits.softmax(-1)[0]
    finally:
        handle.remove()


def test_the_vectors_are_the_last_layer_at_cls(tiny_bert, made):
    _, classifier = made
    vectors = cls_features.cls_vectors(tiny_bert.model, tiny_bert.tokenizer, [SENTENCE, LINES[0]])
    with torch.no_grad():
        for text, vector in zip([SENTENCE, LINES[0]], vectors):
            states = tiny_bert.model.base_model(**tiny_bert.tokenizer(text, return_tensors="pt")).last_hidden_state
            assert torch.allclose(vector, states[0, 0], atol=1e-5)
    lean = cls_features.cls_vectors(tiny_bert.model, tiny_bert.tokenizer, [SENTENCE, LINES[0]],
                                    packed=tiny_bert.caches.packed)
    assert torch.allclose(lean, vectors, atol=1e-4)


def test_the_ablation_is_what_a_hook_measures(made):
    coded, classifier = made
    result = classifier_features(classifier, SENTENCE, top=32, features=coded)
    clean = probabilities_with_hook(classifier, torch.zeros(classifier.model.config.hidden_size))
    decided = int(clean.argmax())
    assert result["label"] == ["animal", "place"][decided]
    assert result["probability"] == pytest.approx(float(clean[decided]), abs=1e-5)
    assert result["features"], "no feature fires at [CLS]"
    assert len(result["features"]) == result["active"] <= coded.dictionary.k
    for row in result["features"]:
        direction = coded.dictionary.direction(row["feature"])
        after = probabilities_with_hook(classifier, row["activation"] * direction)
        assert row["after"] == pytest.approx(float(after[decided]), abs=1e-5)
        assert row["change"] == pytest.approx(100 * (row["after"] - row["before"]), abs=1e-6)
    changes = [row["change"] for row in result["features"]]
    assert changes == sorted(changes)  # the largest fall first
    # every active feature off at once: the reconstruction's part above the bias removed
    vector = cls_features.cls_vectors(classifier.model, classifier.tokenizer, [SENTENCE])
    acts, indices = coded.dictionary.encode(vector)
    together = coded.dictionary.decode(acts, indices)[0] - coded.dictionary.coder.b_dec
    assert result["together"] == pytest.approx(float(probabilities_with_hook(classifier, together)[decided]),
                                               abs=1e-5)


def test_a_feature_that_never_fires_at_cls_changes_nothing(made):
    coded, classifier = made
    coder = files.new_coder(coded.dictionary.width, 32, 4)
    coder.load_state_dict(coded.dictionary.coder.state_dict())
    with torch.no_grad():
        coder.encoder.bias[5] = -1e6  # feature 5 can never pass the ReLU
    coder.eval().requires_grad_(False)
    silenced = ClsFeatures(files.Dictionary(coder, coded.dictionary.layer, None, coded.dictionary.record),
                           coded.stats)
    result = classifier_features(classifier, SENTENCE, top=32, features=silenced)
    assert 5 not in [row["feature"] for row in result["features"]]
    vector = cls_features.cls_vectors(classifier.model, classifier.tokenizer, [SENTENCE])
    assert silenced.dictionary.dense(vector)[0, 5] == 0
    layer = coded.dictionary.layer
    removed = torch.stack([torch.zeros(coder.d_in), 0.0 * silenced.dictionary.direction(5)])
    inputs = dict(classifier.tokenizer(SENTENCE, return_tensors="pt"))
    probs = cls_features.switched_off(classifier.model, inputs, layer, removed)
    assert torch.equal(probs[0], probs[1])


def test_fvu_and_record(tiny_bert, made):
    coded, _ = made
    quality, training = coded.dictionary.record["quality"], coded.dictionary.record["training"]
    held = cls_features.cls_vectors(tiny_bert.model, tiny_bert.tokenizer, LINES[1::2])
    error = (coded.dictionary.output(held) - held).pow(2).sum()
    by_hand = float(error / (held - held.mean(0)).pow(2).sum())
    assert quality["fvu"] == pytest.approx(by_hand, rel=1e-3)
    assert quality["interval"][0] <= quality["fvu"] <= quality["interval"][1]
    assert quality["held_out_lines"] == len(LINES[1::2]) and training["lines"] == len(LINES[::2])
    assert training["corpus"] == "test lines" and training["seconds"] > 0 and training["vectors_seen"] > 0
    assert 0 < quality["l0"] <= 4
    assert coded.stats["lines"] == len(LINES[1::2]) and len(coded.stats["fired"]) == 32


def test_saved_found_by_the_classifiers_base_and_read_back(tiny_bert, made, tmp_path):
    coded, classifier = made
    store = FeatureStore(tmp_path / "features", shipped=None)
    assert classifier.base_weights == tiny_bert.weights_digest
    with pytest.raises(ValueError, match="no \\[CLS\\] dictionary"):
        classifier_features(classifier, SENTENCE, store=store)
    cls_features.put_cls(store, coded)
    assert store.layers(tiny_bert) == []  # never one of the per-layer dictionaries
    found = classifier_features(classifier, SENTENCE, top=32, store=store)
    direct = classifier_features(classifier, SENTENCE, top=32, features=coded)
    assert [r["feature"] for r in found["features"]] == [r["feature"] for r in direct["features"]]
    assert found["features"][0]["after"] == pytest.approx(direct["features"][0]["after"], abs=1e-5)


def test_the_dictionary_is_read_from_disk_once_per_store(tiny_bert, made, tmp_path, monkeypatch):
    coded, classifier = made
    store = FeatureStore(tmp_path / "features", shipped=None)
    folder = store.folder / tiny_bert.weights_digest / cls_features.FOLDER
    cls_features.save_cls(coded, folder, half=False)  # on disk, as a restarted server finds it
    reads = []
    load = cls_features.load_cls
    monkeypatch.setattr(cls_features, "load_cls", lambda f: reads.append(f) or load(f))
    first = cls_features.found_cls(tiny_bert.weights_digest, store)
    for _ in range(3):
        classifier_features(classifier, SENTENCE, top=3, store=store)
    assert reads == [folder] and cls_features.found_cls(tiny_bert.weights_digest, store) is first
    assert cls_features.found_cls("no-such-weights", store) is None
    store._forget(folder)  # the disk cache evicted it: read again when asked
    classifier_features(classifier, SENTENCE, top=3, store=store)
    assert reads == [folder, folder]
    again = cls_features.put_cls(store, coded)  # one made here replaces what is kept
    assert cls_features.found_cls(tiny_bert.weights_digest, store) is again and len(reads) == 2


def test_bad_input_says_how_to_fix_it(made):
    coded, classifier = made
    with pytest.raises(ValueError, match="train one first"):
        classifier_features(None, SENTENCE, features=coded)
    with pytest.raises(ValueError, match="empty"):
        classifier_features(classifier, "  ", features=coded)
    with pytest.raises(ValueError, match="number of features"):
        classifier_features(classifier, SENTENCE, top=0, features=coded)


def test_the_classify_tab_shows_the_table(tiny_bert, made, tmp_path):
    import bertdemo
    from bertdemo.config import Settings
    from bertdemo.sessions import SessionStore
    from bertdemo.ui.parts.context import Visitor
    from bertdemo.ui.tabs import classify_tab as tab

    coded, classifier = made
    store = FeatureStore(tmp_path / "features", shipped=None)
    cls_features.put_cls(store, coded)
    visitor = Visitor(SessionStore(tiny_bert), Settings(model="tiny", device="cpu"), "s1", bertdemo.Engine(),
                      features=store)
    with pytest.raises(ValueError, match="train one first"):
        tab.on_classifier_features(visitor, SENTENCE, 5)
    visitor.store.put_model("s1", tab.KIND, classifier)
    note, table = tab.on_classifier_features(visitor, SENTENCE, 3)
    result = classifier_features(classifier, SENTENCE, top=3, features=coded)
    assert f"Decided **{result['label']}**" in note and "held-out FVU" in note and "unexplained" in note
    assert list(table.columns) == list(tab.sections.WHY_COLUMNS)
    assert table["feature"].tolist() == [r["feature"] for r in result["features"]]
    first = result["features"][0]
    assert table["probability: with → without"].tolist()[0] == f"{first['before']:.1%} → {first['after']:.1%}"
    assert "of 60 lines" in table["fires on"].tolist()[0]


def test_the_shipped_cls_dictionary_belongs_to_the_bundled_model(bundled):
    folder = cls_features.cls_folder(bundled.weights_digest)
    assert folder == cls_features.SHIPPED
    assert sum(p.stat().st_size for p in folder.iterdir()) < 3_000_000  # small enough to ship
    coded = cls_features.load_cls(folder)
    quality, training = coded.dictionary.record["quality"], coded.dictionary.record["training"]
    assert quality["fvu"] <= 0.3 and quality["held_out_lines"] >= 4000 and training["lines"] >= 10_000
    assert quality["interval"][0] <= quality["fvu"] <= quality["interval"][1]
    assert coded.stats["lines"] == 2000 and len(coded.stats["fired"]) == coded.dictionary.latents
    classifier = build_classifier(bundled, ["sport", "cooking"])  # its head untrained: the decision is what it is
    result = classifier_features(classifier, "The midfielder scored in the last minute.", top=5)
    assert len(result["features"]) == 5 and result["active"] == coded.dictionary.k
    assert result["unexplained"] < 0.6  # the body is the model's own: the vectors it was trained on
    assert all(row["top"] for row in result["features"])
