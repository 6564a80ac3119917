"""A card with the whole range (`features/stats.py`: bands, random firings, the words at a [MASK];
`features/views.py` `feature_card`; the tab's `contexts_html`). Bands are checked on codes written
here; the [MASK] statistics on a tiny dictionary built here, whose feature CHOSEN is made to fire at
every [MASK], against the words those [MASK]s hid read back from the lines themselves."""
from __future__ import annotations

import collections
import itertools

import numpy as np
import pytest
import torch

from bertdemo.features import dictionary as files  # noqa: F401 - first: sparsify's decoder switch
from bertdemo.features import stats as statistics
from bertdemo.features import views
from bertdemo.features.data import Lines
from bertdemo.features.dictionary import Dictionary
from bertdemo.features.stats import Codes, corpus_codes, from_codes, keep_used_lines
from bertdemo.features.store import FeatureStore
from bertdemo.ui.tabs import features_results as results
from test_labels import LAYER, made_coder

CHOSEN = 9
NOUNS = ["cat", "dog", "man", "woman", "car", "house", "book", "river", "city", "tower"]
LINES = [f"the {a} {n} went to {p} ." for n, a, p in itertools.product(NOUNS, ["big", "small", "old"],
                                                                         ["paris", "rome", "london"])]


def test_bands_are_deciles_of_the_non_zero_activations():
    rng = np.random.default_rng(0)
    strengths = rng.permutation(np.arange(1, 101) / 100)  # feature 0: 100 firings, 0.01 .. 1.00
    rows = [(0, s) for s in strengths] + [(1, s) for s in (0.5, 0.1, 0.7, 0.3, 0.2, 0.9, 0.4)]  # feature 1: 7
    n = len(rows)
    acts = torch.zeros(n + 5, 2, dtype=torch.float16)
    indices = torch.zeros(n + 5, 2, dtype=torch.int32)
    for i, (feature, strength) in enumerate(rows):
        indices[i, 0], acts[i, 0] = feature, strength
    indices[:, 1] = 2  # feature 2 is in the top k everywhere, at 0: it never fires
    codes = Codes(acts, indices, np.arange(n + 5, dtype=np.int32) % 40, np.arange(n + 5, dtype=np.int16) % 9,
                  np.full(n + 5, 7, dtype=np.int32))
    texts = [f"line {i}" for i in range(40)]
    stats = from_codes(codes, texts, latents=3)
    kept = np.sort(acts[:100, 0].float().numpy())
    # ten bands of ten firings: each band's lowest is the 10b-th weakest, the last edge its largest
    assert stats["band_edges"][0].float().tolist() == pytest.approx([*kept[::10], kept[-1]], abs=1e-3)
    bands = stats.band_rows(0)
    assert len(bands) == statistics.BANDS
    for low, high, examples in bands:
        assert len(examples) == statistics.BAND_EXAMPLES
        assert all(low <= act <= high for _, _, act in examples)
    # 7 firings: the firing of rank r is in band r * 10 // 7, so 7 bands hold one each, the others none
    assert [round(low, 2) for low, _, _ in stats.band_rows(1)] == [0.1, 0.2, 0.3, 0.4, 0.5, 0.7, 0.9]
    assert stats.band_rows(2) == []
    assert stats.random_rows(2) == []
    drawn = stats.random_rows(0)
    assert len(drawn) == statistics.RANDOM_FIRINGS and len(set(drawn)) == statistics.RANDOM_FIRINGS
    for line, position, activation in drawn:  # each a firing of feature 0 as the codes hold it
        row = next(i for i in range(100) if codes.line[i] == line and codes.position[i] == position
                   and abs(float(acts[i, 0]) - activation) < 1e-3)
        assert indices[row, 0] == 0
    # the lines a band or a random firing points into are kept when the contexts are cut down
    before = {(b, texts[line]) for b, (_, _, examples) in enumerate(bands) for line, _, _ in examples}
    keep_used_lines([stats])
    assert {(b, stats.contexts[line]) for b, (_, _, examples) in enumerate(stats.band_rows(0))
            for line, _, _ in examples} == before


@pytest.fixture(scope="module")
def at_masks(tiny_bert, tmp_path_factory):
    """(store, dictionary, masked codes): a tiny dictionary of layer 1 whose feature CHOSEN fires at
    every [MASK], with its statistics over LINES and its [MASK] words over LINES masked."""
    lm = tiny_bert
    torch.manual_seed(1)
    lines = Lines(lm, LINES)
    coder = made_coder(lm, lines, lm.tokenizer.mask_token_id, CHOSEN, masked_share=1.0)
    dictionary = Dictionary(coder, LAYER)
    plain = corpus_codes(lm, {LAYER: dictionary}, lines)[LAYER]
    masked = corpus_codes(lm, {LAYER: dictionary}, lines, masked_share=1.0, seed=3)[LAYER]
    stats = from_codes(plain, lines.texts, coder.num_latents, held_out=plain, masked=masked)
    keep_used_lines([stats])
    dictionary = Dictionary(coder, LAYER, None, {"weights": lm.weights_digest}, stats)
    store = FeatureStore(tmp_path_factory.mktemp("card-range"), shipped=None)
    return store, store.put(lm, dictionary), masked, lines


def test_the_words_at_a_mask_are_those_the_masks_hid(tiny_bert, at_masks):
    _, dictionary, masked, lines = at_masks
    stats = dictionary.stats
    mask = tiny_bert.tokenizer.mask_token_id
    at = np.flatnonzero(masked.token == mask)
    # the word each [MASK] hid, read back from the line (the line's tokens start after [CLS])
    hidden = [lines.ids[masked.line[i]][masked.position[i] - len(lines.prefix)] for i in at]
    assert masked.hidden[at].tolist() == hidden
    assert (masked.hidden[masked.token != mask] == -100).all()
    fired = ((masked.indices[at] == CHOSEN) & (masked.acts[at].float() > 0)).any(1).numpy()
    assert fired.all()  # made to fire at every [MASK]
    counts = collections.Counter(hidden)
    assert int(stats["mask_fires"][CHOSEN]) == len(at) == int(stats["mask_positions"][0])
    words = stats["mask_words"][CHOSEN].tolist()
    for word, count, lift in zip(words, stats["mask_word_count"][CHOSEN].tolist(),
                                 stats["mask_word_lift"][CHOSEN].tolist()):
        if word >= 0:
            assert count == counts[word]
            assert lift == pytest.approx(1.0)  # it fires at every [MASK]: no hidden word more than another
    listed = [w for w in words if w >= 0]
    floor = statistics.min_firings(len(at))
    assert listed and all(counts[w] >= min(floor, max(counts.values())) for w in listed)


def test_a_card_shows_the_whole_range(tiny_bert, at_masks):
    """(Its time, goal 300 ms, is measured by bench/bench_labels.py, not here.)"""
    store, dictionary, _, _ = at_masks
    card = views.feature_card(tiny_bert, LAYER, CHOSEN, store)
    assert card["missing"] == "" and card["label_score"]["kind"] is not None
    assert card["at_mask"]["firings"] == card["at_mask"]["masks"] > 0
    assert [w["token"] for w in card["at_mask"]["words"]]
    assert 1 <= len(card["bands"]) <= statistics.BANDS and card["random_firings"]
    for band in card["bands"]:
        for example in band["examples"]:
            assert band["low"] - 1e-3 <= example["activation"] <= band["high"] + 1e-3
            assert example["text"][example["start"]:example["end"]] or example["token"] == "[MASK]"
    shown = results.contexts_html(card)
    for heading in ("Top contexts", "Across its range", "Random firings", "What it fires for at a [MASK]"):
        assert heading in shown
    assert shown.count("class='under'") == 4  # a line under each table
    assert "explains" in results.card_summary(card, "tiny")


def test_statistics_made_before_still_show_a_card_that_says_what_is_missing(tiny_bert, at_masks, tmp_path):
    _, dictionary, _, _ = at_masks
    old_names = ("tokens", "density", "mean", "max", "histogram", "context_line", "context_position",
                 "context_activation", "top_tokens", "top_token_share", "cofiring", "cofiring_share")
    old = statistics.FeatureStats({k: dictionary.stats[k] for k in old_names}, dictionary.stats.contexts)
    store = FeatureStore(tmp_path, shipped=None)
    store.put(tiny_bert, Dictionary(dictionary.coder, LAYER, None, dictionary.record, old))
    card = views.feature_card(tiny_bert, LAYER, CHOSEN, store)
    assert card["bands"] == [] and card["random_firings"] == [] and card["at_mask"]["words"] == []
    assert card["label_score"]["kind"] is None
    for what in ("the label's score", "the activation bands", "the random firings", "the words at a [MASK]"):
        assert what in card["missing"]
    assert all(p["clear"] is None for p in card["promoted"])
    shown = results.contexts_html(card)
    assert "Top contexts" in shown and "Across its range" not in shown
    assert "made before the card showed" in results.card_summary(card, "tiny")
