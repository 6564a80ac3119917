"""The Features tab's handlers called as plain functions, with no server: a Visitor whose app has
its own feature store (a temp folder) holding a dictionary of the tiny BERT's layer 1, trained here
in well under a second; each handler's answer compared with the service's."""
import itertools
import math
import json
import pathlib

import pytest

import bertdemo
from bertdemo.config import Settings
from bertdemo.features.making import train_features
from bertdemo.features.run import FeaturesRequest
from bertdemo.features.store import FeatureStore
from bertdemo.features.training import FeatureSettings
from bertdemo.sessions import SessionStore
from bertdemo.ui.parts import live_run
from bertdemo.ui.parts.common import escape_markdown
from bertdemo.ui.parts.context import AppContext, Visitor, handler
from bertdemo.ui.tabs import features_results as results, features_tab as tab

NOUNS = ["cat", "dog", "man", "woman", "car", "house", "book", "river", "city", "tower"]
VERBS = ["made", "said", "went", "like", "know", "see"]
ADJECTIVES = ["big", "small", "new", "old", "red", "blue", "green", "good"]
PLACES = ["paris", "london", "berlin", "rome", "france"]
# 300 lines of the tiny vocabulary's words, about 3,000 tokens: enough to learn from, fast to read
CORPUS = [f"the {a} {n} {v} a {b} {m} in {p} ." for (n, v, a, p), m, b in zip(
    itertools.product(NOUNS, VERBS, ADJECTIVES, PLACES), itertools.cycle(NOUNS[3:]),
    itertools.cycle(ADJECTIVES[2:]))][:300]
SENTENCE = "the big cat went to paris ."
MASKED = "the [MASK] went to paris ."


@pytest.fixture(scope="module")
def features(tiny_bert, tmp_path_factory):
    """A store with the tiny BERT's dictionary of layer 1 (and of no other layer)."""
    store = FeatureStore(tmp_path_factory.mktemp("features"), shipped=None)
    train_features(tiny_bert, 1, CORPUS, FeatureSettings(max_tokens=3000, batch_tokens=512), store=store)
    return store


@pytest.fixture
def visitor(tiny_bert, features):
    settings = Settings(model=tiny_bert.name, device="cpu", features_max_tokens=3000)
    return Visitor(SessionStore(tiny_bert), settings, "s1", bertdemo.Engine(), features=features)


def test_a_sentences_features_are_the_services_in_a_table_and_a_heatmap(visitor, tiny_bert, features):
    heatmap, table, raw = tab.on_sentence_features(visitor, SENTENCE, 1, 3)
    assert raw == bertdemo.sentence_features(tiny_bert, SENTENCE, 1, 3, features)
    expected = [(f["feature"], t["token"]) for t in raw["per_token"] for f in t["features"]]
    assert sorted(zip(table["feature"], table["token"])) == sorted(expected)
    assert list(table["activation"]) == sorted(table["activation"], reverse=True)  # the strongest first
    assert list(table.columns[:2]) == ["feature", "token"]  # a row's first cell is its feature (a click opens it)
    assert list(heatmap.data[0].x) == [f"#{f}" for f in raw["heatmap"]["features"]]
    assert list(heatmap.data[0].y) == [t["token"] for t in raw["per_token"]]


def test_a_card_shows_the_feature_and_its_contexts_as_text(visitor, tiny_bert, features):
    feature = tab.on_sentence_features(visitor, SENTENCE, 1, 1)[2]["per_token"][0]["features"][0]["feature"]
    summary, histogram, contexts, effects, cofiring, card = tab.on_feature_card(visitor, 1, feature)
    assert card == bertdemo.feature_card(tiny_bert, 1, feature, features)
    assert f"**Feature {feature}** of layer 1" in summary and f"{card['density']:.2%}" in summary
    assert list(histogram.data[0].y) == pytest.approx(card["histogram"]["shares"])
    assert [d.x[-1] for d in effects.data] == pytest.approx([card["promoted"][0]["logit_change"],
                                                              card["suppressed"][0]["logit_change"]])
    assert len(card["contexts"]) > 0  # a highlighted token per context, band example, random firing and [MASK] word
    assert contexts.count("<mark") == (len(card["contexts"]) + sum(len(b["examples"]) for b in card["bands"])
                                       + len(card["random_firings"]) + len(card["at_mask"]["words"]))
    assert list(cofiring["feature"]) == [c["feature"] for c in card["cofiring"]]


def test_the_card_opens_on_the_examples_strongest_feature_and_a_row_picks_another(visitor, features):
    ctx = AppContext(visitor.store, visitor.settings, visitor.engine, features=features)
    raw = bertdemo.sentence_features(visitor.lm, tab.sections.SENTENCE, 1, 1, features)
    assert tab.default_feature(ctx, 1) == max((f["activation"], f["feature"])
                                              for t in raw["per_token"] for f in t["features"])[1]
    assert tab.default_feature(ctx, 2) == 0  # no dictionary there
    assert tab.feature_of_row([12, "cat", 1, 0.5, "cat"]) == 12
    assert tab.feature_of_row(["", "x"]) != 12 and tab.feature_of_row(None) is not None


def test_contexts_and_labels_stay_text(monkeypatch):
    card = {"contexts": [{"text": "a <b>bold</b> <script>x</script> word", "start": 2, "end": 13,
                          "token": "<b>", "activation": 1.5}]}
    shown = results.contexts_html(card)
    assert "<b>bold" not in shown and "<script>" not in shown and "&lt;b&gt;bold&lt;/b&gt;" in shown
    assert escape_markdown("*x* [a](b) <i>") == r"\*x\* \[a\]\(b\) \<i\>"


def test_steering_at_scale_one_changes_nothing_and_off_changes_the_prediction(visitor, tiny_bert, features):
    feature = tab.on_sentence_features(visitor, MASKED, 1, 1)[2]["per_token"][0]["features"][0]["feature"]
    note, bars, same = tab.on_steer(visitor, MASKED, 1, feature, 1, 0, 5)
    assert all(t["before"] == t["after"] for t in same["masks"][0]["tokens"])
    note, bars, off = tab.on_steer(visitor, MASKED, 1, feature, 0, 0, 5)
    assert off == bertdemo.steer(tiny_bert, MASKED, 1, feature, 0, 0, 5, features)
    assert f"feature {feature} of layer 1" in note and "**switched off** (scale 0: 0 switches it off, 1 leaves " \
        "it unchanged" in note
    line, button = tab.on_steer_target(1, feature)  # the form names the feature it steers
    assert f"feature {feature} of layer 1" in line and button["value"].startswith(f"Steer feature {feature}:")
    assert [d.name for d in bars.data] == ["before", "after steering"]
    for scale in (-1, 11, float("nan"), "2"):
        with pytest.raises(ValueError, match="scale"):
            tab.on_steer(visitor, MASKED, 1, feature, scale, 0, 5)
    with pytest.raises(ValueError, match="amount added"):
        tab.on_steer(visitor, MASKED, 1, feature, 1, 11, 5)


def test_the_features_behind_a_prediction_are_ranked_per_mask(visitor, tiny_bert, features):
    table, raw = tab.on_prediction_features(visitor, MASKED, 1, 4)
    assert raw == bertdemo.prediction_features(tiny_bert, MASKED, 1, 4, 20, features)
    assert list(table["feature"]) == [f["feature"] for f in raw["masks"][0]["features"]]
    assert list(table["rank"]) == list(range(1, len(table) + 1))
    changes = list(table["change (points)"])  # the drops in log p as the probability's change, in points
    assert changes == sorted(changes)
    first, p = raw["masks"][0]["features"][0], math.exp(raw["masks"][0]["log_prob"])
    assert changes[0] == pytest.approx(100 * (p * math.exp(-first["drop"]) - p), abs=0.01)
    assert table["p(word): with it → switched off"][0] == f"{p:.1%} → {p * math.exp(-first['drop']):.1%}"
    assert table["estimated change (points)"][0] == pytest.approx(100 * (p * math.exp(-first["estimate"]) - p),
                                                                  abs=0.01)


def test_two_uses_of_a_word_give_two_tables(visitor, tiny_bert, features):
    a, b = ["the river is big .", "the river in rome ."], ["the city is new .", "he went to the city ."]
    note, table_a, table_b = tab.on_contrast(visitor, "\n".join(a), "\n".join(b), "the", 1, 5)
    expected = bertdemo.contrast_features(tiny_bert, a, b, "the", 1, 5, features)
    assert list(table_a["feature"]) == [r["feature"] for r in expected["a"]]
    assert list(table_b["feature"]) == [r["feature"] for r in expected["b"]]
    assert "2 occurrence(s) in list A, 2 in list B" in note
    with pytest.raises(ValueError, match="uses the word 'river'"):
        tab.on_contrast(visitor, "\n".join(a), "the city is new .", "river", 1, 5)


def test_every_table_with_a_label_says_how_well_it_fits_as_the_card_scores_it(visitor, tiny_bert, features):
    """The "label fits" cell beside each label is the card's own score of that feature: its F1 and kind."""
    def scored(feature) -> str:
        score = bertdemo.feature_card(tiny_bert, 1, feature, features)["label_score"]
        return f"{score['f1']:.2f} {score['kind']}" if score["kind"] else "not scored"
    tables = {"sentence": tab.on_sentence_features(visitor, SENTENCE, 1, 5)[1],
              "prediction": tab.on_prediction_features(visitor, MASKED, 1, 5)[0],
              "contrast": tab.on_contrast(visitor, "the river is big .\nthe river in rome .",
                                          "the city is new .\nhe went to the city .", "the", 1, 5)[1],
              "by word": tab.on_find_features(visitor, "river", "word", 1, 5)[1],
              "by label": tab.on_find_features(visitor, "river", "label", 1, 5)[1]}
    first = int(tables["sentence"]["feature"][0])
    tables["similar"] = tab.on_similar_features(visitor, 1, first)
    tables["cofiring"] = tab.on_feature_card(visitor, 1, first)[4]
    shown = []
    for name, table in tables.items():
        assert list(table.columns[-2:]) == ["label fits", "label"], name  # beside the label, in every table
        assert len(table) > 0, name
        for feature, fits in zip(table["feature"], table["label fits"]):
            assert fits == scored(int(feature)), (name, feature)
            shown.append(fits)
    assert any(fits.endswith((" word", " context")) for fits in shown)  # scored features among them
    # the service gives the same two fields, so the API and the endpoints read what the table shows
    row = bertdemo.sentence_features(tiny_bert, SENTENCE, 1, 5, features)["per_token"][0]["features"][0]
    score = bertdemo.feature_card(tiny_bert, 1, row["feature"], features)["label_score"]
    assert (row["label_f1"], row["label_kind"]) == ((score["f1"], score["kind"]) if score["kind"] else (None, None))


def test_the_quality_table_lists_every_layer_with_a_dictionary(visitor, tiny_bert, features):
    table, raw = tab.on_quality(visitor)
    assert list(table["layer"]) == [1] and "folder" not in raw[0]
    assert table["unexplained share (FVU)"][0] == pytest.approx(raw[0]["fvu"], abs=1e-3)
    assert list(table.columns[1:4]) == ["loss added (nats)", "perplexity ×", "KL (nats)"]  # cost first
    cost = raw[0]["splice_cost"]
    assert table["KL (nats)"][0] == pytest.approx(cost["kl"], abs=1e-3)
    assert table["loss added (nats)"][0] == pytest.approx(cost["added_cross_entropy"], abs=1e-3)
    assert table["held-out tokens"][0] == raw[0]["held_out"]["tokens"]
    training = raw[0]["training"]
    assert (f"{training['tokens']:,} tokens, {training['passes']:.1f} passes" in table["how it was made"][0]
            and training["passes"] > 1)
    for heading in table.columns[1:]:  # each column said in a line under the table
        assert f"- **{heading}**: " in tab.sections.QUALITY_HELP
    assert not {"FVU", "k", "L0", "spliced", "zero-ablated", "mean-ablated"} & set(table.columns)  # no jargon
    words = tab.quality_notes(raw)
    assert words.startswith("**Layer 1.** Measured on") and "fewer than the 20,000 wanted" in words
    json.dumps(raw)  # the API sends it as it is
    empty = Visitor(visitor.store, visitor.settings, "s2", visitor.engine,
                    features=FeatureStore(features.folder.parent / "none", shipped=None))
    with pytest.raises(ValueError, match="has no feature dictionary yet"):
        tab.on_quality(empty)


def test_the_layer_line_says_which_layers_have_a_dictionary_and_offers_training(visitor):
    line, button = tab.on_layer(visitor, 1)
    assert "layers 1." in line and "Layer 1: 256 features, 32 active per token; replacing the layer by" in line
    assert line.index("nats") < line.index("FVU")  # the splice's cost first
    line, button = tab.on_layer(visitor, 2)
    assert "**Layer 2 has none**: press **Train features for layer 2**" in line
    assert button["value"] == "Train features for layer 2"


@pytest.mark.parametrize("call, message", [
    (lambda v: tab.on_sentence_features(v, SENTENCE, 3, 3), "layer must be a whole number from 0 to 2"),
    (lambda v: tab.on_sentence_features(v, SENTENCE, 2, 3), "no feature dictionary for layer 2 yet"),
    (lambda v: tab.on_feature_card(v, 1, 256), "feature must be a whole number from 0 to 255"),
    (lambda v: tab.on_feature_card(v, 1, None), "feature must be a whole number"),
    (lambda v: tab.on_sentence_features(v, "", 1, 3), "is empty"),
    (lambda v: tab.on_prediction_features(v, SENTENCE, 1, 3), r"\[MASK\]"),
])
def test_bad_input_is_refused_with_a_message(visitor, call, message):
    with pytest.raises(ValueError, match=message):
        call(visitor)


def test_bad_input_through_the_page_is_one_log_line_and_a_message(visitor, caplog):
    import gradio as gr

    ctx = AppContext(visitor.store, visitor.settings, visitor.engine, features=visitor.features)
    with caplog.at_level("INFO", logger="bertdemo"), pytest.raises(gr.Error, match="from 0 to 2"):
        handler(ctx, tab.on_sentence_features)(SENTENCE, 7, 3, request=None)
    assert [r.levelname for r in caplog.records] == ["INFO"]


# ---------------------------------------------------------------- the run

def test_the_run_is_planned_on_the_session_model_and_checked_field_by_field(visitor, features, tmp_path):
    plan = FeaturesRequest(layer=2, texts="\n".join(CORPUS), keep_partial=False).plan(
        visitor.lm, visitor.limits, features)
    assert plan.layer == 2 and plan.settings.max_tokens == 3000 and plan.keep_partial is False
    settings = visitor.settings
    assert plan.settings.max_seconds == min(settings.features_max_seconds, settings.finetune_max_seconds)
    again = FeaturesRequest(layer=1, keep_partial=False).plan(visitor.lm, visitor.limits, features)
    assert again.layer == 1  # a dictionary trained here may be trained again: the latest wins
    shipped = shipped_store(visitor.lm, features, tmp_path)
    with pytest.raises(ValueError, match="the one shipped with it") as refused:
        FeaturesRequest(layer=1).plan(visitor.lm, visitor.limits, shipped)
    assert refused.value.field == "layer"
    for request, field, message in [
            (FeaturesRequest(layer=5), "layer", "from 0 to 2"),
            (FeaturesRequest(layer=2, texts="the cat ."), "texts", "needs at least 1,000"),
            (FeaturesRequest(layer=2, texts="x" * 20_001), "texts", "at most 20,000")]:
        with pytest.raises(ValueError, match=message) as refused:
            request.plan(visitor.lm, visitor.limits, features)
        assert refused.value.field == field

    ctx = AppContext(visitor.store, visitor.settings, visitor.engine, features=shipped)
    check = handler(ctx, live_run.validator("train_features"))
    request = type("Request", (), {"session_hash": "s9"})()
    verdicts = check(1, "", True, request=request)
    assert [v["is_valid"] for v in verdicts] == [False, True, True] and "already has" in verdicts[0]["message"]


def shipped_store(lm, trained: FeatureStore, tmp_path) -> FeatureStore:
    """A store that ships `trained`'s dictionary of layer 1 for `lm`, as assets/bundled/features does."""
    import json
    import shutil

    shipped = tmp_path / "shipped"
    shutil.copytree(trained.folder_for(lm, 1), shipped / "layer_1")
    (shipped / "training.json").write_text(json.dumps({"weights": lm.weights_digest}))
    return FeatureStore(tmp_path / "cache", shipped=shipped)


def run_to_the_end(visitor, request, stop_after_first: bool = False) -> list:
    shown = []
    for outputs in tab.on_train_features(visitor, request, progress=lambda *a, **k: None):
        shown.append(outputs)
        if stop_after_first and len(shown) == 2:  # after the cleared outputs, the first live step
            assert tab.on_stop(visitor) == "Stop asked: the run ends after its current step."
    return shown


def test_a_finished_run_keeps_its_dictionary_for_every_visitor(visitor, tiny_bert, tmp_path):
    store = FeatureStore(tmp_path, shipped=None)
    mine = Visitor(visitor.store, visitor.settings, "s3", visitor.engine, features=store)
    shown = run_to_the_end(mine, FeaturesRequest(layer=0, texts="\n".join(CORPUS), keep_partial=False))
    status, curve, quality, line, _ = shown[-1]
    assert status.startswith("**Done**") and "Its dictionary is **kept** as the one of layer 0" in status
    assert store.layers(tiny_bert) == [0] and list(quality["layer"]) == [0]
    assert "layers 0." in line
    assert [t.name for t in curve.data] == ["FVU (lower is better)", "dead latents"]
    assert tab.on_stop(mine).startswith("Nothing is running")


@pytest.mark.slow
@pytest.mark.parametrize("keep_partial", [False, True])
def test_a_stopped_run_is_kept_only_when_asked(visitor, tiny_bert, tmp_path, keep_partial):
    store = FeatureStore(tmp_path, shipped=None)
    settings = Settings(model=tiny_bert.name, device="cpu")  # 2M tokens: it runs until Stop
    mine = Visitor(visitor.store, settings, f"stop-{keep_partial}", visitor.engine, features=store)
    shown = run_to_the_end(mine, FeaturesRequest(layer=2, texts="", keep_partial=keep_partial), stop_after_first=True)
    assert shown[1][0].startswith("Step ") and "FVU" in shown[1][0]  # the live line
    status = shown[-1][0]
    assert "**Ended early** because you pressed Stop" in status
    if keep_partial:
        assert "**kept**" in status and "was ticked" in status and store.layers(tiny_bert) == [2]
    else:
        assert "**not kept**" in status and store.layers(tiny_bert) == []


def test_a_card_exports_as_json_csv_png_and_svg(visitor, tiny_bert, features):
    update = tab.on_export_card(visitor, 1, 3)
    paths = {pathlib.Path(p).suffix: pathlib.Path(p) for p in update["value"]}
    assert set(paths) == {".json", ".csv", ".png", ".svg"} and update["visible"] is True
    assert json.loads(paths[".json"].read_text()) == json.loads(json.dumps(
        bertdemo.feature_card(tiny_bert, 1, 3, features)))
    assert paths[".png"].read_bytes()[:4] == b"\x89PNG"
    assert paths[".csv"].read_text().splitlines()[0] == "part,rank,text,token,value"


def test_a_link_to_the_features_tab_sets_the_sentence_the_layer_and_the_cards_feature(tiny_bert_dir, features):
    import app
    from bertdemo.ui.parts import links

    demo = app.build_demo(Settings(model=str(tiny_bert_dir), device="cpu", onnx=False), features=features)
    endpoints = {fn.api_name: fn for fn in demo.fns.values() if getattr(fn, "api_name", None)}
    pairs = links._unique([links.Links._inputs(endpoints[name])
                           for name in ("sentence_features", *links.ALSO["features"])])
    assert [name for name, _ in pairs] == ["sentence", "layer", "top_features", "feature", "query", "by"]
    controls = {"features": [links.control_of(name, component) for name, component in pairs]}
    link = links.parse_link({"tab": "features", "sentence": "a <b>cat</b>", "layer": "1", "feature": "7"},
                            controls, ["a"])
    assert link.values == {"sentence": "a <b>cat</b>", "layer": 1, "feature": 7} and link.notices == []
    assert "feature: give a whole number" in links.parse_link({"tab": "features", "feature": "-1"},
                                                              controls, ["a"]).notices[0]


def test_after_a_fine_tune_the_table_is_the_services_drift(visitor, tiny_bert, features):
    import copy

    import torch

    with pytest.raises(ValueError, match="no fine-tuned model yet"):
        tab.on_tuning_drift(visitor, "", 1, 5, "share")
    assert tab.on_drift_sort(visitor, "", 1, 5, "activation") == (tab.gr.skip(), tab.gr.skip())  # quietly nothing
    model = copy.deepcopy(tiny_bert.model)
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.02 * torch.randn_like(parameter))
    tuned = bertdemo.LoadedModel("tuned", tiny_bert.tokenizer, model, tiny_bert.device)
    visitor.store.put_model(visitor.session, "tuned", tuned)
    for sort_by, column in (("share", "change of firing share (points)"), ("activation", "change of mean activation")):
        note, table = tab.on_tuning_drift(visitor, "\n".join(CORPUS[:40]), 1, 5, sort_by)
        expected = bertdemo.tuning_drift(tiny_bert, tuned, "\n".join(CORPUS[:40]), 1, 5, features, sort_by)
        assert list(table["feature"]) == [row["feature"] for row in expected["features"]]
        assert f"{expected['fvu']['tuned']:.1%}" in note and f"{expected['fvu']['base']:.1%}" in note
        assert "change of firing share (points)" in table.columns and "change of mean activation" in table.columns
        assert "change" not in table.columns  # a share and an activation are never added
        assert list(table["change of firing share (points)"]) == [
            f"{100 * row['share_change']:+.2f}" for row in expected["features"]]
        assert list(table["change of mean activation"]) == [
            None if row["activation_change"] is None else f"{row['activation_change']:+.3f}"
            for row in expected["features"]]
        assert sorted_by(table, column)
        assert sorted_by(tab.on_drift_sort(visitor, "\n".join(CORPUS[:40]), 1, 5, sort_by)[1], column)


def sorted_by(table, column: str) -> bool:
    """Whether `table` lists its rows by the size of `column`'s change, largest first (blank last)."""
    sizes = [abs(float(v)) if v is not None else -1 for v in table[column]]
    return sizes == sorted(sizes, reverse=True)

