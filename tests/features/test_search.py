"""Finding a feature (`features/search.py`) and a layer's map (`features/feature_map.py`), on a tiny
dictionary built here: one feature is made to fire on "river" alone (its encoder row points at river's
hidden state, its bias cuts off every other token), the rest are random. Search by word must find it
first, by its label too; its nearest directions are the ones made near it; the map has a
point per feature, kept on disk and read back the same."""
from __future__ import annotations

import itertools
import subprocess
import sys

import numpy as np
import pytest
import torch

import bertdemo
from bertdemo import feature_plots
from bertdemo.features import dictionary as files  # first: sparsify's decoder switch
from bertdemo.features import feature_map, search
from bertdemo.features.data import Lines, hidden_at
from bertdemo.features.dictionary import Dictionary
from bertdemo.features.stats import corpus_codes, from_codes
from bertdemo.features.store import FeatureStore

LAYER = 1
WORD = "river"
NOUNS = ["cat", "dog", "man", "woman", "car", "house", "book", "river", "city", "tower"]
ADJECTIVES = ["big", "small", "new", "old", "red", "blue", "green", "good"]
LINES = [f"the {a} {n} went to {p} ." for n, a, p in itertools.product(NOUNS, ADJECTIVES, ["paris", "rome", "london"])]


# The search reads the statistics' lines and the default corpus: here a default corpus of the test's own
DEFAULT = [f"{a} {n} {v} the {m} ." for a, n, v, m in itertools.product(ADJECTIVES[:4], NOUNS, ["made", "said"],
                                                                            ["water", "book", "day"])]


@pytest.fixture(scope="module")
def default_corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "everyday.txt"
    path.write_text("\n".join(DEFAULT) + "\n", encoding="utf-8")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(search, "DEFAULT_CORPUS", path)
        yield path


@pytest.fixture(scope="module")
def made(tiny_bert, tmp_path_factory, default_corpus):
    """(store, the feature that fires on WORD, a feature made 0.9-cosine near it): a tiny dictionary
    of layer 1 with its statistics over LINES (the search reads those and the default corpus)."""
    torch.manual_seed(0)
    lm = tiny_bert
    coder = files.new_coder(lm.model.config.hidden_size, latents=64, k=4)
    lines = Lines(lm, LINES)
    searched = Lines(lm, LINES + DEFAULT)
    states, ids = [], []
    for batch in searched.batches(lm, batch_tokens=2048, masked_share=0.0, order=np.arange(len(searched)),
                                  endless=False):
        states.append(hidden_at(lm, batch, [LAYER])[LAYER])
        ids.append(batch.inputs["input_ids"][batch.keep])
    states, ids = torch.cat(states), torch.cat(ids)
    word_id = lm.tokenizer.convert_tokens_to_ids(WORD)
    on = ids == word_id
    assert on.any()
    direction = states[on].mean(0) - states[~on].mean(0)
    direction /= direction.norm()
    score = states @ direction
    low, high = score[~on].max(), score[on].min()
    assert high > low  # river's states stand apart along it
    chosen, near = 17, 18
    with torch.no_grad():
        coder.b_dec.zero_()
        coder.encoder.weight.mul_(0.01)  # the random features fire weakly: the made one is always in the top k
        coder.encoder.weight[chosen] = direction / (high - low)  # 1 or more at every river, 0 or less elsewhere
        coder.encoder.bias[chosen] = -low / (high - low)
        coder.W_dec[chosen] = direction
        other = torch.randn_like(direction)
        other -= (other @ direction) * direction
        coder.W_dec[near] = 0.9 * direction + (1 - 0.81) ** 0.5 * other / other.norm()
    coder.eval().requires_grad_(False)
    dictionary = Dictionary(coder, LAYER)
    codes = corpus_codes(lm, {LAYER: dictionary}, lines)[LAYER]
    dictionary = Dictionary(coder, LAYER, None, {"weights": lm.weights_digest},
                            from_codes(codes, lines.texts, dictionary.latents))
    store = FeatureStore(tmp_path_factory.mktemp("search"), shipped=None)
    store.put(lm, dictionary)
    return store, chosen, near


def test_a_word_finds_the_feature_made_to_fire_on_it_first(tiny_bert, made):
    store, chosen, _ = made
    found = bertdemo.features_for_word(tiny_bert, WORD, LAYER, 5, store)
    first = found["features"][0]
    assert first["feature"] == chosen
    assert first["word_share"] == 1.0 and first["feature_share"] == 1.0  # every river, and only rivers
    assert first["lift"] == pytest.approx(found["corpus"]["tokens"] / found["occurrences"])
    assert [f["lift"] for f in found["features"]] == sorted((f["lift"] for f in found["features"]), reverse=True)
    assert found["occurrences"] >= LINES.count(WORD) and found["token"] == WORD
    elsewhere = bertdemo.features_for_word(tiny_bert, "cat", LAYER, 50, store)
    assert chosen not in [f["feature"] for f in elsewhere["features"]]


def test_lift_is_the_hand_count(tiny_bert, made):
    store, _, _ = made
    dictionary = store.get(tiny_bert, LAYER)
    counts = search.token_counts(tiny_bert, dictionary, store)
    lines = Lines(tiny_bert, search.counted_lines(dictionary))
    codes = corpus_codes(tiny_bert, {LAYER: dictionary}, lines)[LAYER]
    word_id = tiny_bert.tokenizer.convert_tokens_to_ids("city")
    at_word = codes.token == word_id
    found = bertdemo.features_for_word(tiny_bert, "city", LAYER, 50, store)
    for row in found["features"]:
        fires = (codes.indices == row["feature"]) & (codes.acts.float() > 0)
        together = int(fires[torch.from_numpy(at_word)].any(1).sum())
        expected = (together / int(fires.any(1).sum())) / (at_word.sum() / codes.tokens)
        assert row["firings"] == together and row["lift"] == pytest.approx(expected, rel=1e-6)
    assert counts.tokens == codes.tokens


@pytest.mark.slow
def test_the_counts_are_kept_on_disk_and_read_back(tiny_bert, made, monkeypatch):
    store, _, _ = made
    first = bertdemo.features_for_word(tiny_bert, WORD, LAYER, 5, store)
    entry = search.kept_entry(store, tiny_bert, store.get(tiny_bert, LAYER), "counts")
    named = subprocess.run([sys.executable, "-c", KEPT_BY_ANOTHER_PROCESS, str(store.folder), tiny_bert.name],
                           capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    assert named == str(entry)  # another process (a restarted server) finds the same entry
    assert (entry / search.COUNTS).is_file()
    assert not [p for p in entry.parent.iterdir() if p.name.startswith(".part-")]  # written whole, renamed
    monkeypatch.setattr(search, "count_tokens", lambda *a: pytest.fail("counted again"))
    assert bertdemo.features_for_word(tiny_bert, WORD, LAYER, 5, store) == first


KEPT_BY_ANOTHER_PROCESS = """
import sys
import bertdemo
from bertdemo.features import search
from bertdemo.features.store import FeatureStore
store, lm = FeatureStore(sys.argv[1], shipped=None), bertdemo.load(sys.argv[2], device="cpu")
print(search.kept_entry(store, lm, store.get(lm, 1), "counts"))
"""


def test_a_word_outside_the_vocabulary_names_its_pieces(tiny_bert, made):
    store, _, _ = made
    with pytest.raises(ValueError, match=r"splits into .*'un'.*'##believ'.*'##able'"):
        bertdemo.features_for_word(tiny_bert, "unbelievable", LAYER, 5, store)
    with pytest.raises(ValueError, match="one word"):
        bertdemo.features_for_word(tiny_bert, "river bank", LAYER, 5, store)
    with pytest.raises(ValueError, match="empty"):
        bertdemo.features_for_word(tiny_bert, "  ", LAYER, 5, store)
    with pytest.raises(ValueError, match="never occurs"):
        bertdemo.features_for_word(tiny_bert, "seine", LAYER, 5, store)  # in the vocabulary, in no line


def test_a_layer_without_a_dictionary_offers_to_train(tiny_bert, made):
    store, _, _ = made
    for call in (lambda: bertdemo.features_for_word(tiny_bert, WORD, 2, 5, store),
                 lambda: bertdemo.feature_map(tiny_bert, 2, store, method="pca")):
        with pytest.raises(ValueError, match="Train features for layer 2"):
            call()


def test_a_label_search_finds_the_feature_and_says_when_nothing_matches(tiny_bert, made):
    store, chosen, _ = made
    found = bertdemo.features_by_label(tiny_bert, WORD, LAYER, 10, store)
    assert found["matched"] and chosen in [f["feature"] for f in found["features"]]
    assert all(WORD in f["label"] for f in found["features"])
    near = bertdemo.features_by_label(tiny_bert, "rivr", LAYER, 10, store)  # a typo: the nearest labels
    assert not near["matched"] and chosen in [f["feature"] for f in near["features"]]


def test_similar_features_are_the_nearest_directions(tiny_bert, made):
    store, chosen, near = made
    found = bertdemo.similar_features(tiny_bert, LAYER, chosen, 5, store)
    assert found["features"][0]["feature"] == near
    assert found["features"][0]["cosine"] == pytest.approx(0.9, abs=1e-5)
    assert chosen not in [f["feature"] for f in found["features"]]


@pytest.mark.parametrize("method", ["pca", pytest.param("umap", marks=pytest.mark.slow)])
def test_the_map_has_a_point_per_feature_kept_on_disk(tiny_bert, made, method):
    store = made[0]
    drawn = bertdemo.feature_map(tiny_bert, LAYER, store, method=method)
    again = bertdemo.feature_map(tiny_bert, LAYER, store, method=method)
    assert len(drawn["x"]) == len(drawn["y"]) == len(drawn["labels"]) == 64
    assert not drawn["cached"] and again["cached"] and (again["x"], again["y"]) == (drawn["x"], drawn["y"])
    assert np.isfinite(np.stack([drawn["x"], drawn["y"]], 1)).all() and np.ptp(drawn["x"]) > 0
    assert drawn["colour"]["name"] == "density (log10)" and len(drawn["colour"]["values"]) == 64
    # each point named as its card names it (the map labels every feature at once)
    assert drawn["labels"] == [bertdemo.feature_card(tiny_bert, LAYER, f, store)["label"] for f in range(64)]
    figure = feature_plots.feature_map(drawn)
    assert list(figure.data[0].customdata) == list(range(64))  # a click names its feature
    assert list(figure.data[0].text) == [f"{name}<br>{count:,} firings" for name, count in
                                         zip(drawn["labels"], drawn["firings"])]  # hover: its label and firings
    assert figure.data[0].x.tolist() == pytest.approx(drawn["x"], abs=1e-5)
    assert figure.data[0].x.dtype == np.float32 and '"bdata"' in figure.to_json()  # typed arrays, not decimals





@pytest.mark.slow
def test_a_umap_layout_leaves_torchs_thread_count_as_it_was(tiny_bert, made):
    """UMAP's numba sets OpenMP's thread count, which torch shares, to the machine's on its way out."""
    before = torch.get_num_threads()
    wanted = 1 if before != 1 else 2
    torch.set_num_threads(wanted)
    try:
        feature_map.layout(made[0].get(tiny_bert, LAYER), "umap")
        assert torch.get_num_threads() == wanted
    finally:
        torch.set_num_threads(before)


def test_the_tabs_search_and_map_show_the_services_results(tiny_bert, made):
    from bertdemo.config import Settings
    from bertdemo.sessions import SessionStore
    from bertdemo.ui.parts.context import Visitor
    from bertdemo.ui.tabs import features_tab as tab

    store, chosen, near = made
    visitor = Visitor(SessionStore(tiny_bert), Settings(model=tiny_bert.name, device="cpu"), "s1", bertdemo.Engine(),
                      features=store)
    note, table, raw = tab.on_find_features(visitor, WORD, "word", LAYER, 5)
    assert raw == bertdemo.features_for_word(tiny_bert, WORD, LAYER, 5, store)
    assert table["feature"].tolist()[0] == chosen and "lift" in note
    note, table, raw = tab.on_find_features(visitor, "rivr", "label", LAYER, 5)
    assert "No label of layer 1 holds 'rivr'" in note and chosen in table["feature"].tolist()
    assert tab.on_linked_search(visitor, "", "word", LAYER, 5) == (tab.gr.skip(),) * 3  # a link without a search
    with pytest.raises(ValueError, match="'word' or 'label'"):
        tab.on_find_features(visitor, WORD, "colour", LAYER, 5)
    assert tab.on_similar_features(visitor, LAYER, chosen)["feature"].tolist()[0] == near
    figure, note = tab.on_feature_map(visitor, LAYER)
    assert sorted(figure.data[0].customdata) == list(range(64)) and "Click a point" in note
