"""Labels with a score (`features/stats.py`: top tokens by lift, the detection score; `features/labels.py`:
`label`, `label_score`). Lift is checked against a count made by hand on codes written here; the
detection score is recomputed line by line, on held-out lines written here, from a tiny dictionary
whose feature CHOSEN is made to fire on "river" and nothing else (as tests/features/test_search.py
makes it)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from bertdemo.features import dictionary as files  # first: sparsify's decoder switch
from bertdemo.features import stats as statistics
from bertdemo.features import labels
from bertdemo.features.data import Lines, hidden_at, kept_positions
from bertdemo.features.dictionary import Dictionary
from bertdemo.features.stats import Codes, corpus_codes, from_codes
from bertdemo.forward import splice

LAYER = 1
WORD = "river"
CHOSEN = 17
NOUNS = ["cat", "dog", "man", "woman", "car", "house", "book", "river", "city", "tower"]
ADJECTIVES = ["big", "small", "new", "old", "red", "blue"]
LINES = [f"the {a} {n} went to {p} ." for n, a, p in itertools.product(NOUNS, ADJECTIVES, ["paris", "rome"])]
HELD_OUT = ["the river is big .", "a dog and a cat went to the river .", "paris is a city .",
            "the old man saw the red car .", "river , river , city .", "the woman went to rome ."]


def codes_of(rows: list[tuple[int, dict[int, float]]], line: int = 0) -> Codes:
    """Codes written by hand: per token (its id, {feature: activation}), k = 2 slots (0 where empty)."""
    acts = torch.zeros(len(rows), 2, dtype=torch.float16)
    indices = torch.zeros(len(rows), 2, dtype=torch.int32)
    for i, (_, fired) in enumerate(rows):
        for slot, (feature, activation) in enumerate(fired.items()):
            indices[i, slot], acts[i, slot] = feature, activation
    n = len(rows)
    return Codes(acts, indices, np.full(n, line, dtype=np.int32), np.arange(n, dtype=np.int16),
                 np.array([t for t, _ in rows], dtype=np.int32))


def test_top_tokens_are_ranked_by_lift_against_a_hand_count():
    # 21 tokens: token 5 occurs 4 times, token 6 10 times, token 7 6 times, token 8 once.
    # Feature 0 fires on every 5, on 5 of the 6s, on 2 of the 7s and on the one 8: 12 firings.
    rows = ([(5, {0: 1.0})] * 4 + [(6, {0: 1.0})] * 5 + [(6, {})] * 5 + [(7, {0: 1.0})] * 2 + [(7, {1: 1.0})] * 4
            + [(8, {0: 1.0})])
    stats = from_codes(codes_of(rows), ["a line"], latents=2)
    # lift = (firings on the token / its firings) / (the token's occurrences / tokens):
    # 5: (4/12) / (4/21) = 1.75; 6: (5/12) / (10/21) = 0.875; 8: (1/12) / (1/21) = 1.75 but one firing,
    # and 7: two firings: below the floor of 3 (statistics.min_firings(12)), so neither is listed.
    assert statistics.min_firings(12) == 3
    assert stats["top_tokens"][0].tolist() == [5, 6, -1, -1, -1]
    assert stats["top_token_lift"][0, :2].tolist() == pytest.approx([1.75, 0.875])
    assert stats["top_token_share"][0, :2].float().tolist() == pytest.approx([4 / 12, 5 / 12], abs=1e-3)
    # feature 1 fires 4 times, all on 7: lift (4/4) / (6/21) = 3.5
    assert stats["top_tokens"][1, 0] == 7 and float(stats["top_token_lift"][1, 0]) == pytest.approx(3.5)


def test_a_frequent_token_that_is_a_sliver_of_its_firings_does_not_lead():
    # feature 0 fires 200 times: 150 on token 5 (of its 150), 50 spread over 10 rare tokens (5 each,
    # each occurring 5 times: lift 200/... larger than 5's), and the floor (5% of 200 = 10) keeps them out
    rows = [(5, {0: 1.0})] * 150 + [(t, {0: 1.0}) for t in range(10, 20) for _ in range(5)] + [(6, {})] * 300
    stats = from_codes(codes_of(rows), ["a line"], latents=1)
    assert statistics.min_firings(200) == 10
    assert stats["top_tokens"][0].tolist() == [5, -1, -1, -1, -1]


@pytest.fixture(scope="module")
def made(tiny_bert):
    """A tiny dictionary of layer 1 (64 features, k 4) whose feature CHOSEN fires on WORD alone, with
    its statistics over LINES and its labels scored on HELD_OUT."""
    torch.manual_seed(0)
    lm = tiny_bert
    lines = Lines(lm, LINES)
    coder = made_coder(lm, Lines(lm, LINES + HELD_OUT), lm.tokenizer.convert_tokens_to_ids(WORD))
    dictionary = Dictionary(coder, LAYER)
    codes = corpus_codes(lm, {LAYER: dictionary}, lines)[LAYER]
    held_out = corpus_codes(lm, {LAYER: dictionary}, Lines(lm, HELD_OUT))[LAYER]
    return Dictionary(coder, LAYER, None, {}, from_codes(codes, lines.texts, coder.num_latents, held_out=held_out))


def made_coder(lm, lines: Lines, word_id: int, chosen: int = CHOSEN, masked_share: float = 0.0):
    """A 64-feature coder whose feature `chosen` fires where the token read is `word_id` and nowhere
    else (its encoder row points at those tokens' states, its bias cuts off the rest); the others are
    random and weak. Over a plain pass of `lines` (masked when `masked_share`: the [MASK] tokens)."""
    coder = files.new_coder(lm.model.config.hidden_size, latents=64, k=4)
    states, ids = [], []
    for batch in lines.batches(lm, batch_tokens=2048, masked_share=masked_share, order=np.arange(len(lines)),
                               endless=False):
        states.append(hidden_at(lm, batch, [LAYER])[LAYER])
        ids.append(batch.inputs["input_ids"][batch.keep])
    states, ids = torch.cat(states), torch.cat(ids)
    on = ids == word_id
    assert on.any()
    centred = states - states.mean(0)  # least squares: the direction along which the word's states stand apart
    direction = torch.linalg.lstsq(centred, on.float() * 2 - 1).solution
    direction /= direction.norm()
    score = centred @ direction
    low, high = score[~on].max(), score[on].min()
    assert high > low  # the word's states stand apart along it
    with torch.no_grad():
        coder.b_dec.copy_(states.mean(0))  # the coder reads h - b_dec: the centred states
        coder.encoder.weight.mul_(0.01)
        coder.encoder.weight[chosen] = direction / (high - low)
        coder.encoder.bias[chosen] = -low / (high - low)
        coder.W_dec[chosen] = direction
    return coder.eval().requires_grad_(False)


def test_the_detection_score_is_recomputed_line_by_line(tiny_bert, made):
    """Each feature's precision, recall and F1 as a detector: its label's tokens predict it fires; counted
    here line by line from the dictionary's own codes of each written line."""
    lm, dictionary, stats = tiny_bert, made, made.stats
    labels = [set(t for t in row if t >= 0) for row in stats["top_tokens"][:, :statistics.LABEL_TOKENS].tolist()]
    true = np.zeros(dictionary.latents)
    fires = np.zeros(dictionary.latents)
    predicted = np.zeros(dictionary.latents)
    for line in HELD_OUT:
        inputs = lm.tokenizer(line, return_tensors="pt")
        keep = kept_positions(lm, inputs["input_ids"], inputs["attention_mask"])[0]
        hidden = splice.read(lm.model, dict(inputs), [LAYER])[LAYER][0][keep]
        fired = (dictionary.dense(hidden.float()) > 0).numpy()
        for token, row in zip(inputs["input_ids"][0][keep].tolist(), fired):
            for feature in range(dictionary.latents):
                on_label = token in labels[feature]
                fires[feature] += row[feature]
                predicted[feature] += on_label
                true[feature] += row[feature] and on_label
    precision = true / np.maximum(1, predicted)
    recall = true / np.maximum(1, fires)
    f1 = np.where(precision + recall > 0, 2 * precision * recall / np.maximum(precision + recall, 1e-12), 0)
    assert stats["label_fires"].tolist() == fires.astype(int).tolist()
    for name, expected in (("label_precision", precision), ("label_recall", recall), ("label_f1", f1)):
        assert stats[name].float().tolist() == pytest.approx(expected.tolist(), abs=1e-3)  # kept in float16
    assert int(stats["detection_tokens"][0]) == sum(len(lm.tokenizer.tokenize(line)) for line in HELD_OUT)


def test_the_made_feature_is_a_word_feature_and_says_so(tiny_bert, made):
    score = labels.label_score(tiny_bert, made, CHOSEN)
    assert labels.label(tiny_bert, made, CHOSEN) == WORD  # no promoted words measured: no arrow
    assert (score["precision"], score["recall"], score["f1"]) == (1.0, 1.0, 1.0)
    assert score["kind"] == "word" and score["held_out_firings"] == 4  # the four rivers of HELD_OUT
    assert score["summary"].startswith("a word feature: it fires on river, whatever the sense")
    assert "explain 100% of its 4 firings" in score["summary"]
    context = [f for f in range(made.latents) if made.stats["label_fires"][f] > 0
               and made.stats["label_f1"][f] < statistics.WORD_F1]
    assert context, "some random feature's label explains it badly"
    other = labels.label_score(tiny_bert, made, context[0])
    assert other["kind"] == "context" and other["summary"].startswith("a context feature: its tokens")


def test_statistics_made_before_scores_still_label_and_say_so(tiny_bert, made):
    old = {k: v for k, v in made.stats.tensors.items()
           if not k.startswith("label_") and k not in ("detection_tokens", "top_token_lift")}
    dictionary = Dictionary(made.coder, LAYER, None, {}, statistics.FeatureStats(old, made.stats.contexts))
    assert labels.label(tiny_bert, dictionary, CHOSEN) == WORD
    score = labels.label_score(tiny_bert, dictionary, CHOSEN)
    assert score["kind"] is None and "made before labels were scored" in score["summary"]


def test_a_label_says_no_clear_output_where_no_promoted_word_clears_the_noise(tiny_bert, made):
    tensors = dict(made.stats.tensors)
    tensors["promoted"] = torch.full((made.latents, 3), -1, dtype=torch.int16)
    tensors["promoted"][CHOSEN + 1, 0] = tiny_bert.tokenizer.convert_tokens_to_ids("city")
    tensors["noise_per_unit"] = torch.tensor([0.1])
    dictionary = Dictionary(made.coder, LAYER, None, {}, statistics.FeatureStats(tensors, made.stats.contexts))
    assert labels.label(tiny_bert, dictionary, CHOSEN) == f"{WORD} → {labels.NO_CLEAR_OUTPUT}"
    assert labels.label(tiny_bert, dictionary, CHOSEN + 1).endswith("→ city")
