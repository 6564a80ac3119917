"""The tabs' handlers called as plain functions, with no server: a Visitor and the values a
person types, as the page (or an API script) would send them."""
import json
import pathlib

import pytest

import bertdemo
from bertdemo import plots
from bertdemo.config import Settings
from bertdemo.sessions import SessionStore
from bertdemo.ui.parts import model_picker
from bertdemo.ui.parts.context import AppContext, Visitor
from bertdemo.ui.parts.model_line import model_line
from bertdemo.ui.tabs import about_tab, fillmask_tab
from conftest import awaited

SENTENCE = "Paris is the [MASK] of France."


@pytest.fixture
def store(tiny_bert):
    return SessionStore(tiny_bert, max_tuned=1)


@pytest.fixture
def visitor(store):
    return Visitor(store, Settings(model=store.base.name, device="cpu"), "s1", bertdemo.Engine())


def ids(predictions):
    return [[p["token_id"] for p in mask] for mask in predictions]


# --- fill mask ----------------------------------------------------------------------------------

def test_predict_gives_the_services_predictions_bars_and_the_model_line(visitor, tiny_bert):
    chart, raw, line = awaited(fillmask_tab.on_predict(visitor, "The [MASK] sat on the [MASK].", 4))
    assert ids(raw) == ids(bertdemo.fill_mask(tiny_bert, "The [MASK] sat on the [MASK].", top_k=4))
    assert chart.type == "plotly"
    assert json.loads(chart.plot) == json.loads(plots.prediction_bars(raw).to_json())
    assert line == f"Model: **{tiny_bert.name}** on `cpu`"


@pytest.mark.parametrize("top_k", [0, 2.5, "5", None, float("nan"), 51])
def test_predict_refuses_a_top_k_that_is_not_a_whole_number_in_range(visitor, top_k):
    with pytest.raises(ValueError, match="top-k must be a whole number from 1 to 50"):
        awaited(fillmask_tab.on_predict(visitor, SENTENCE, top_k=top_k))


@pytest.mark.parametrize("press", ["predict", "compare"])
def test_a_click_checks_top_k_once(visitor, monkeypatch, press):
    """Predict and Compare check top-k in one place (the service, with the server's limit)."""
    from bertdemo import validate
    checked, real = [], validate.whole_number
    monkeypatch.setattr(validate, "whole_number",
                        lambda value, name, *a, **k: (checked.append(name), real(value, name, *a, **k))[1])
    if press == "predict":
        awaited(fillmask_tab.on_predict(visitor, SENTENCE, 3))
    else:
        visitor.store.put_model(visitor.session, "tuned", visitor.lm)
        fillmask_tab.on_compare(visitor, SENTENCE, fillmask_tab.TUNED_CHOICE, 3)
    assert checked.count("top-k") == 1 and "top_k" not in checked


def test_joint_completions_match_the_service(visitor, tiny_bert):
    table = fillmask_tab.on_joint(visitor, "The [MASK] sat on the [MASK].", 2.0)  # JSON sends 2.0
    expected = bertdemo.fill_jointly(tiny_bert, "The [MASK] sat on the [MASK].", 2)
    assert list(table["sentence"]) == [r["text"] for r in expected]
    with pytest.raises(ValueError, match="beam size must be a whole number from 1 to 5"):
        fillmask_tab.on_joint(visitor, SENTENCE, 6)


def test_candidates_count_masks_from_one(visitor, tiny_bert):
    table = fillmask_tab.on_candidates(visitor, "The [MASK] sat on the [MASK].", "cat, mat", 2)
    expected = bertdemo.score_candidates(tiny_bert, "The [MASK] sat on the [MASK].", ["cat", "mat"], 1)
    assert list(table["word"]) == [r["word"] for r in expected]
    for mask_number in [0, -3, 1.5, "1", 11]:
        with pytest.raises(ValueError, match="mask number must be a whole number .*1 for the first"):
            fillmask_tab.on_candidates(visitor, SENTENCE, candidates="city", mask_number=mask_number)


def test_sentence_score_of_a_masked_sentence_scores_its_best_completion(visitor, tiny_bert):
    summary, _ = fillmask_tab.on_sentence_score(visitor, SENTENCE)
    completed = bertdemo.fill_jointly(tiny_bert, SENTENCE, 1)[0]["text"]
    expected = bertdemo.sentence_score(tiny_bert, completed)
    assert completed in summary and f"{expected['pseudo_perplexity']:.2f}" in summary


def test_sentence_score_says_it_filled_the_mask_with_the_models_guess(visitor, tiny_bert):
    summary, _ = fillmask_tab.on_sentence_score(visitor, SENTENCE)
    word = bertdemo.fill_jointly(tiny_bert, SENTENCE, 1)[0]["fills"][0]["token"].strip()
    assert summary.startswith(f"The [MASK] was filled with the model's own top guess ({word}: ")
    plain, _ = fillmask_tab.on_sentence_score(visitor, "Paris is the capital of France.")
    assert "filled" not in plain  # nothing to fill: nothing said


def test_a_too_long_sentence_says_how_long_and_the_limit(visitor):
    with pytest.raises(ValueError, match=r"is \d+ tokens long; .* at most 64 tokens"):
        awaited(fillmask_tab.on_predict(visitor, "[MASK] " + "paris " * 100, 5))


# --- model picker and the model line ------------------------------------------------------------

def test_picking_a_model_changes_that_session_only(engine, tiny_bert_dir, tiny_bert, tiny_distilbert):
    store = SessionStore(tiny_bert)
    settings = Settings(model=str(tiny_bert_dir), models=tiny_distilbert.name, device="cpu")
    ann, bob = Visitor(store, settings, "ann", engine), Visitor(store, settings, "bob", engine)
    distil = pathlib.Path(tiny_distilbert.name).name
    assert model_picker.on_pick(ann, distil) == f"Your tabs use **{distil}** (DistilBERT)."
    assert ann.lm.model is tiny_distilbert.model and bob.lm is tiny_bert
    assert fillmask_tab.on_show(ann) == f"Model: **{distil}** on `cpu`"
    with pytest.raises(ValueError, match="not in the list this server offers"):
        model_picker.on_pick(ann, "/etc")


def test_compare_shows_both_models_predictions_as_two_fill_mask_calls_give_them(tiny_bert_dir, tiny_bert,
                                                                               tiny_distilbert):
    settings = Settings(model=str(tiny_bert_dir), models=tiny_distilbert.name, device="cpu")
    visitor = Visitor(SessionStore(tiny_bert), settings, "ann", bertdemo.Engine())
    distil = pathlib.Path(tiny_distilbert.name).name
    note, bars, table, score_changes = fillmask_tab.on_compare(visitor, SENTENCE, distil, 4)
    a, b = bertdemo.fill_mask(tiny_bert, SENTENCE, 4)[0], bertdemo.fill_mask(tiny_distilbert, SENTENCE, 4)[0]
    shown = {row["token"]: row for row in table.to_dict("records")}
    for p in a:
        assert shown[p["token"]]["p (A)"] == pytest.approx(p["score"], abs=1e-5)
    for p in b:
        assert shown[p["token"]]["p (B)"] == pytest.approx(p["score"], abs=1e-5)
        assert shown[p["token"]]["change (B - A)"] == pytest.approx(p["score"] - shown[p["token"]]["p (A)"], abs=1e-5)
    pll_a = bertdemo.sentence_score(tiny_bert, _best_completion(tiny_bert))["pll"]
    assert f"{pll_a:.2f} (A)" in note and f"**B** = {distil}" in note and "/" not in note.split("*")[4]
    assert [trace["name"] for trace in bars.data[:2]] == [pathlib.Path(tiny_bert.name).name, distil]
    assert score_changes is not None  # BERT and DistilBERT share a vocabulary: same cut


def _best_completion(lm) -> str:
    return bertdemo.fill_jointly(lm, SENTENCE, 1)[0]["text"]


def test_compare_across_tokenizers_explains_blank_cells_and_the_missing_token_changes(tiny_bert_dir, tiny_bert,
                                                                                     tiny_roberta):
    settings = Settings(model=str(tiny_bert_dir), models=tiny_roberta.name, device="cpu")
    visitor = Visitor(SessionStore(tiny_bert), settings, "ann", bertdemo.Engine())
    note, _, table, score_changes = fillmask_tab.on_compare(visitor, SENTENCE,
                                                            pathlib.Path(tiny_roberta.name).name, 5)
    blanks = table.isna().any(axis=1).any()
    assert blanks  # the tiny RoBERTa lacks some of BERT's top tokens (e.g. word pieces)
    assert ("A blank cell: that model's vocabulary has no such token." in note) == bool(blanks)
    assert score_changes is None and "cut it differently" in note  # WordPiece vs byte-level BPE


def test_compare_with_the_tuned_model_sets_it_against_its_base(store, tiny_bert, tiny_distilbert):
    visitor = Visitor(store, Settings(model=tiny_bert.name, device="cpu"), "s1", bertdemo.Engine())
    with pytest.raises(ValueError, match="No fine-tuned model in this session yet"):
        fillmask_tab.on_compare(visitor, SENTENCE, fillmask_tab.TUNED_CHOICE, 3)
    store.put_model("s1", "tuned", tiny_distilbert)  # stands in for a tuned model: any other model will do
    store.use_tuned("s1")
    note, _, table, _ = fillmask_tab.on_compare(visitor, SENTENCE, fillmask_tab.TUNED_CHOICE, 3)
    top_b = bertdemo.fill_mask(tiny_distilbert, SENTENCE, 3)[0][0]
    assert next(r for r in table.to_dict("records") if r["token"] == top_b["token"])["p (B)"] == \
        pytest.approx(top_b["score"], abs=1e-5)
    assert note.startswith(f"**A** = {pathlib.Path(tiny_bert.name).name}, ")


def test_the_model_line_tells_each_state_of_the_tuned_model(store, tiny_bert, tiny_distilbert):
    base = tiny_bert.name
    assert model_line(store, "s1", "finetune") == f"The other tabs use **{base}**."
    store.put_model("s1", "tuned", tiny_distilbert)
    assert "your tuned model is ready" in model_line(store, "s1", "finetune")
    assert model_line(store, "s1") == f"Model: **{base}** on `cpu`"  # not in use yet
    store.use_tuned("s1")
    assert model_line(store, "s1", "finetune").startswith(
        f"The other tabs use **your tuned model** ({tiny_distilbert.name})")
    assert model_line(store, "s1", "picker").startswith("Your tabs use **your tuned model**")
    assert model_line(store, "s1") == f"Model: **{tiny_distilbert.name}** on `cpu`"
    assert model_line(store, "s2") == f"Model: **{base}** on `cpu`"  # another session: the base
    store.put_model("s2", "tuned", tiny_distilbert)  # max_tuned=1: s1's is evicted
    assert "freed to make room" in model_line(store, "s1", "finetune")
    assert model_line(store, "s1") == f"Model: **{base}** on `cpu`"


def test_without_a_model_every_line_says_why_and_how_to_fix():
    store = SessionStore(None, load_error="Could not load 'x': pass --model /path/to/folder.")
    assert model_line(store, "s1") == "⚠️ Could not load 'x': pass --model /path/to/folder."
    assert model_line(store, None, "picker").startswith("⚠️ Could not load")
    assert model_line(store, None, "banner").startswith("### ⚠️ No model is loaded\nCould not load")


def test_the_about_tab_builds_without_a_model():
    assert about_tab.create_demo().blocks


def test_the_about_tabs_citations_are_numbered_in_the_order_the_page_shows_them():
    import re
    page = about_tab.glue_figure().layout.title.text + " ".join(about_tab.GLUE_SCORES) + about_tab.GLUE_SOURCES
    first_seen = list(dict.fromkeys(int(n) for n in re.findall(r"\[(\d+)\]", page)))
    listed = [int(n) for n in re.findall(r"^- \[(\d+)\]", about_tab.GLUE_SOURCES, re.M)]
    assert first_seen == listed == [1, 2, 3, 4]


def test_predict_then_joint_reuses_the_predictions_forward_and_shows_what_joint_alone_shows(tiny_bert_dir):
    """The page's chain (Predict, then the joint completions) takes the joint fill's first step from
    the prediction's forward; a visitor asking for the joint completions alone (a script, or an
    engine whose memo is empty) sees the same table."""
    text = "a [MASK] bridge is in the [MASK] of rome ."  # two masks: two steps
    settings = Settings(device="cpu")
    tables, forwards = [], []
    for predict_first in (True, False):
        engine = bertdemo.Engine()
        lm = engine.load(str(tiny_bert_dir), device="cpu")
        visitor = Visitor(SessionStore(lm), settings, "s1", engine)
        calls = []
        hook = lm.model.base_model.embeddings.register_forward_hook(lambda m, i, o: calls.append(1))
        try:
            if predict_first:
                awaited(fillmask_tab.on_predict(visitor, text, 5))
                calls.clear()
            tables.append(fillmask_tab.on_joint(visitor, text, 3))
        finally:
            hook.remove()
        forwards.append(len(calls))
    assert forwards == [1, 2]  # after Predict, only the second step needs a forward
    assert tables[0].drop(columns="joint log-prob").equals(tables[1].drop(columns="joint log-prob"))
    assert list(tables[0]["joint log-prob"]) == pytest.approx(list(tables[1]["joint log-prob"]), abs=1e-4)


def test_a_visitor_and_the_app_context_are_given_their_engine_never_build_one():
    store, settings = SessionStore(None), Settings(device="cpu")
    with pytest.raises(TypeError):
        Visitor(store, settings, "s1")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        AppContext(store, settings)  # type: ignore[call-arg]
    engine = bertdemo.Engine()
    ctx = AppContext(store, settings, engine)
    assert ctx.engine is engine and ctx.visitor(None).engine is engine
