"""Embeddings and per-layer probes: the map is the PCA of the model's own hidden states (checked
against scikit-learn's PCA on `output_hidden_states`), a word's senses separate in the upper layers
of a real model, and the probes read a labelling off the layers that know it."""
import numpy as np
import pytest
import torch
from sklearn.decomposition import PCA

import bertdemo
from bertdemo.views import embeddings
from bertdemo.labelled import parse_examples, stratified_split
from bertdemo.config import Settings
from bertdemo.sessions import SessionStore
from bertdemo.ui.parts.context import Visitor
from bertdemo.ui.tabs import classify_tab, embeddings_tab

BANK = embeddings_tab.EXAMPLES["bank"]  # three river banks, then three money banks
RIVER = {0, 1, 2}


@pytest.fixture(scope="module")
def minilm(engine):
    return engine.load_minilm("cpu")


def reference_states(lm, text: str) -> tuple[list[str], torch.Tensor]:
    """The tokens and (layers + 1, T, H) hidden states straight from the model."""
    enc = lm.tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        hidden = lm.model.base_model(**enc, output_hidden_states=True).hidden_states
    return lm.tokenizer.convert_ids_to_tokens(enc["input_ids"][0]), torch.stack(hidden)[:, 0]


def assert_same_pca(result: dict, vectors: np.ndarray) -> None:
    """The map's coordinates are PCA's (each axis up to its sign) and so is the explained share."""
    pca = PCA(n_components=2, svd_solver="full").fit(vectors)
    expected = pca.transform(vectors)
    got = np.array([[p["x"], p["y"]] for p in result["points"]])
    for axis in range(2):
        sign = np.sign(got[:, axis] @ expected[:, axis]) or 1.0
        np.testing.assert_allclose(got[:, axis], sign * expected[:, axis], atol=1e-3, rtol=1e-3)
    np.testing.assert_allclose(result["explained"], pca.explained_variance_ratio_, atol=1e-5)


# ---------------------------------------------------------------- the map

@pytest.mark.parametrize("layer", [0, 1, 2])
def test_every_token_map_is_the_pca_of_output_hidden_states(tiny_bert, layer):
    texts = ["the cat sat on the mat", "a dog ran in the park", "paris is in france"]
    result = bertdemo.embedding_map(tiny_bert, texts, layer=layer)
    vectors = []
    for text in texts:
        tokens, states = reference_states(tiny_bert, text)
        vectors += [states[layer, i].numpy() for i, t in enumerate(tokens) if t not in ("[CLS]", "[SEP]")]
    assert len(result["points"]) == len(vectors) and result["layer"] == layer
    assert_same_pca(result, np.array(vectors))


def test_a_word_split_into_pieces_is_the_mean_of_its_pieces(minilm):
    texts = ["The snowman melted in the sun.", "We built a snowman in the yard.", "A snowman has a carrot nose."]
    result = bertdemo.embedding_map(minilm, texts, layer=3, word="Snowman")
    vectors = []
    for text, point in zip(texts, result["points"]):
        tokens, states = reference_states(minilm, text)
        pieces = [i for i, t in enumerate(tokens) if t in ("snow", "##man")]
        assert point["pieces"] == ["snow", "##man"] and point["position"] == pieces[0]
        vectors.append(states[3, pieces].mean(0).numpy())
    assert_same_pca(result, np.array(vectors))


def test_neighbours_are_the_nearest_points_by_cosine(minilm):
    result = bertdemo.embedding_map(minilm, BANK, layer=6, word="bank")
    vectors = []
    for text in BANK:
        tokens, states = reference_states(minilm, text)
        vectors.append(states[6, tokens.index("bank")].numpy())
    unit = np.array(vectors) / np.linalg.norm(vectors, axis=1, keepdims=True)
    similarity = unit @ unit.T
    for i, point in enumerate(result["points"]):
        others = [j for j in np.argsort(-similarity[i]) if j != i][:embeddings.NEIGHBOURS]
        assert [n["point"] for n in point["neighbours"]] == others
        assert point["neighbours"][0]["similarity"] == pytest.approx(similarity[i, others[0]], abs=1e-5)


def sense_purity(result: dict) -> float:
    """Share of points whose nearest neighbour is a 'bank' of the same sense."""
    return np.mean([(p["sentence"] in RIVER) == (p["neighbours"][0]["point"] in RIVER) for p in result["points"]])


def test_the_senses_of_bank_separate_in_the_upper_layers_not_in_the_embeddings(minilm):
    first = bertdemo.embedding_map(minilm, BANK, layer=0, word="bank")
    last = bertdemo.embedding_map(minilm, BANK, layer=6, word="bank")
    assert sense_purity(last) == 1.0 and sense_purity(first) < 1.0
    xs = [p["x"] for p in last["points"]]  # the first axis splits the two senses
    assert max(xs[:3]) < min(xs[3:]) or min(xs[:3]) > max(xs[3:])


@pytest.mark.parametrize("texts, kwargs, message", [
    (["The river bank.", "The money was safe."], {"word": "bank"}, r"'bank' is not in line 2"),
    (["The cat.", "A dog.", "The bird."], {"word": "bank"}, r"not in lines 1, 2, 3"),
    (["I sat on the bank."], {"word": "bank"}, "at least two points"),
    ("  \n \n", {}, "no sentences"),
    (["a b"] * 51, {}, "51 lines; at most 50"),
    (["word " * 600], {}, "line 1"),
    (["the cat", "the dog"], {"layer": 3}, r"0 to 2 \(0 = the embeddings, 2 = the last layer\)"),
    (["the cat", "the dog"], {"layer": -1}, "layer"),
    (["the cat", "the dog"], {"word": 3}, "word must be text"),
])
def test_bad_input_says_how_to_fix_it(tiny_bert, texts, kwargs, message):
    kwargs = {"layer": 1, **kwargs}
    with pytest.raises(ValueError, match=message):
        bertdemo.embedding_map(tiny_bert, texts, **kwargs)


def test_the_token_limit_counts_every_sentence(tiny_bert):
    with pytest.raises(ValueError, match="tokens; at most 20"):
        bertdemo.embedding_map(tiny_bert, ["the cat sat on the mat"] * 4, layer=1, max_tokens=20)


def test_the_tab_draws_the_map_and_a_neighbour_table(minilm):
    visitor = Visitor(SessionStore(minilm), Settings(device="cpu"), "s1", bertdemo.Engine())
    scatter, table, raw = embeddings_tab.on_map(visitor, "\n".join(BANK), 6, "bank")
    assert raw == bertdemo.embedding_map(minilm, BANK, layer=6, word="bank")
    assert len(scatter.data) == len(BANK)  # one trace (colour) per sentence
    assert "PC1" in scatter.layout.xaxis.title.text and len(table) == len(BANK)
    assert table.iloc[0]["point"].startswith("bank (line 1")
    limited = Visitor(SessionStore(minilm), Settings(device="cpu", embedding_max_lines=3), "s2", bertdemo.Engine())
    with pytest.raises(ValueError, match="at most 3"):
        embeddings_tab.on_map(limited, "\n".join(BANK), 6, "bank")


# ---------------------------------------------------------------- the probes

def topics() -> list[tuple[str, str]]:
    return parse_examples((classify_tab.ASSETS / "topics.csv").read_text("utf-8"))


def test_probes_read_the_topics_off_the_layers_well_above_chance(minilm):
    examples = topics()
    result = bertdemo.probe_layers(minilm, examples, seed=0)
    split = stratified_split(examples, 0)  # the Classify tab's split
    assert [entry["layer"] for entry in result["layers"]] == list(range(7))
    assert all(0 <= entry["accuracy"] <= 1 for entry in result["layers"])
    assert (result["train_size"], result["held_out_size"]) == (len(split.train), len(split.held_out))
    best = result["layers"][result["best_layer"]]["accuracy"]
    assert best == max(entry["accuracy"] for entry in result["layers"])
    assert result["baseline"] < 0.5 and best >= 0.8  # three topics: chance is a third


def test_a_probe_is_a_logistic_regression_on_mean_pooled_states(tiny_bert):
    from sklearn.linear_model import LogisticRegression

    examples = [("the cat sat", "a"), ("a cat ran", "a"), ("the cat", "a"), ("paris france", "b"),
                ("rome italy", "b"), ("berlin germany", "b")]
    result = bertdemo.probe_layers(tiny_bert, examples, seed=1)
    split = stratified_split(examples, 1)

    def features(pairs, layer):
        return np.array([reference_states(tiny_bert, text)[1][layer].mean(0).numpy() for text, _ in pairs])

    for layer in range(3):
        probe = LogisticRegression(max_iter=2000, random_state=1).fit(
            features(split.train, layer), [label for _, label in split.train])
        accuracy = np.mean(probe.predict(features(split.held_out, layer)) == [lab for _, lab in split.held_out])
        assert result["layers"][layer]["accuracy"] == pytest.approx(accuracy)


@pytest.mark.parametrize("examples, message", [
    ([("the cat", "a"), ("the dog", "a")], "only the label 'a'"),
    ([("the cat", "a"), ("the dog", "a"), ("paris", "b")], "at least two examples"),
    ("text,label", "list of"),
])
def test_probes_refuse_what_they_cannot_learn(tiny_bert, examples, message):
    with pytest.raises(ValueError, match=message):
        bertdemo.probe_layers(tiny_bert, examples)


def test_the_classify_tab_charts_accuracy_by_layer_with_the_baseline(minilm):
    visitor = Visitor(SessionStore(minilm), Settings(device="cpu"), "s1", bertdemo.Engine())
    rows = [list(pair) for pair in topics()]
    status, chart = classify_tab.on_probe(visitor, rows, 0)
    result = bertdemo.probe_layers(minilm, topics(), seed=0)
    assert [trace.name for trace in chart.data] == ["linear probe (held-out)", "majority class"]
    assert list(chart.data[0].y) == [entry["accuracy"] for entry in result["layers"]]
    assert f"layer {result['best_layer']}" in status


@pytest.mark.parametrize("examples, seed, field", [
    ([["the cat", "a"], ["the dog", "a"]], 0, "examples"),
    ([["the cat", "a"], ["the dog", "a"], ["paris", "b"], ["rome", "b"]], -1, "seed"),
    ([["the cat", "a"], ["the dog", "a"], ["paris", "b"], ["rome", "b"]], "0", "seed"),
])
def test_the_probe_is_checked_once_into_a_plan_its_error_naming_the_field(tiny_bert, examples, seed, field):
    with pytest.raises(ValueError) as refused:
        embeddings.plan_probe(examples, seed)
    assert refused.value.field == field
    visitor = Visitor(SessionStore(tiny_bert), Settings(device="cpu"), "s1", bertdemo.Engine())
    verdicts = classify_tab.check_probe(visitor, examples, seed)  # the validator: the same check's verdicts
    at_fault = ["examples", "seed"].index(field)
    assert [v["is_valid"] for v in verdicts] == [i != at_fault for i in range(2)]
    assert verdicts[at_fault]["message"] == str(refused.value)


def test_a_validated_probe_runs_the_validators_plan_checking_nothing_again(tiny_bert, monkeypatch):
    visitor = Visitor(SessionStore(tiny_bert), Settings(device="cpu"), "s1", bertdemo.Engine())
    rows = [list(pair) for pair in topics()]
    expected = bertdemo.probe_layers(tiny_bert, topics(), seed=3)
    checks = []
    planned = embeddings.plan_probe
    monkeypatch.setattr(embeddings, "plan_probe", lambda *a, **k: checks.append(1) or planned(*a, **k))
    assert all(v["is_valid"] for v in classify_tab.check_probe(visitor, rows, 3))  # when the click is queued
    status, chart = classify_tab.on_probe(visitor, rows, 3)  # when it runs
    assert len(checks) == 1  # one check per click
    assert list(chart.data[0].y) == [entry["accuracy"] for entry in expected["layers"]]
    classify_tab.on_probe(visitor, rows[:-3], 3)  # other inputs than the validator's: checked afresh
    assert len(checks) == 2


def test_a_heads_off_view_maps_without_its_heads_and_the_shared_model_is_untouched(tiny_bert):
    texts = ["the cat sat on the mat", "a dog ran in the park"]
    whole = bertdemo.embedding_map(tiny_bert, texts, layer=2)
    view = bertdemo.heads_off(tiny_bert, [(0, 0), (1, 1)])
    without = bertdemo.embedding_map(view, texts, layer=2)
    assert [p["x"] for p in without["points"]] != pytest.approx([p["x"] for p in whole["points"]], abs=1e-4)
    assert bertdemo.embedding_map(tiny_bert, texts, layer=2) == whole
    assert bertdemo.embedding_map(view, texts, layer=0) == bertdemo.embedding_map(tiny_bert, texts, layer=0)


@pytest.fixture(scope="module")
def bundled_model():
    from bertdemo.model import bundled
    if not bundled.available():
        pytest.skip("the bundled model's files are not there")
    return bertdemo.load(str(bundled.FOLDER), device="cpu")


def test_the_word_order_set_shows_depth_where_topics_do_not(bundled_model):
    """Topics are in their words: every layer reads them, the embeddings too. The word-order set's
    two labels use the same words: the embeddings fall well below the best layer (on the bundled
    model, seed 0: 25% at layer 0, 90% at layer 2, always-one-label 50%)."""
    topics_result = bertdemo.probe_layers(bundled_model, classify_tab.example_rows(classify_tab.FIRST_EXAMPLE))
    assert min(entry["accuracy"] for entry in topics_result["layers"]) == 1.0
    rows = classify_tab.example_rows(classify_tab.WORD_ORDER)
    assert len(rows) == 96 and sorted(set(t.split()[1] for t, _ in rows[:2])) == ["dog", "farmer"]
    for seed in (0, 1):
        result = bertdemo.probe_layers(bundled_model, rows, seed=seed)
        layers = [entry["accuracy"] for entry in result["layers"]]
        assert layers[0] <= result["baseline"] and max(layers) >= 0.9 and max(layers) - layers[0] >= 0.5, layers


def test_the_probe_says_when_every_layer_reads_the_labels(bundled_model):
    visitor = Visitor(SessionStore(bundled_model), Settings(device="cpu"), "s1", bertdemo.Engine())
    status, _ = classify_tab.on_probe(visitor, classify_tab.example_rows(classify_tab.FIRST_EXAMPLE), 0)
    assert "Every layer reads these labels" in status and "word-order" in status
    status, _ = classify_tab.on_probe(visitor, classify_tab.example_rows(classify_tab.WORD_ORDER), 0)
    assert "Every layer" not in status and status.startswith("Best: layer 2, 90%")
    assert classify_tab.on_word_order() == (classify_tab.WORD_ORDER, classify_tab.example_rows(classify_tab.WORD_ORDER))


def test_lines_without_the_word_are_left_out_and_listed(tiny_bert):
    lines = ["I sat on the river bank.", "The weather was lovely.", "The bank lent me money.", "Banks and a bank."]
    result = bertdemo.embedding_map(tiny_bert, lines, layer=1, word="bank")
    assert [p["sentence"] for p in result["points"]] == [0, 2, 3]  # whole words only: "Banks" is not "bank"
    assert result["missing"] == [{"line": 2, "text": "The weather was lovely."}]
    visitor = Visitor(SessionStore(tiny_bert), Settings(device="cpu"), "s1", bertdemo.Engine())
    scatter, table, raw = embeddings_tab.on_map(visitor, "\n".join(lines), 1, "bank")
    assert "Left out, without 'bank': line 2 (The weather was lovely.)" in scatter.layout.title.text
    assert len(table) == 3 and list(table.columns) == ["point", "nearest 1", "nearest 2", "nearest 3"]
    first = raw["points"][0]["neighbours"]
    assert len(first) == 2  # two other points: two neighbours, never the point itself
    assert list(table.iloc[0])[1:] == [f"bank (line {raw['points'][n['point']]['sentence'] + 1}) "
                                       f"{n['similarity']:.2f}" for n in first] + [""]
    everything = bertdemo.embedding_map(tiny_bert, lines, layer=1)  # no word: nothing is left out
    assert everything["missing"] == []
