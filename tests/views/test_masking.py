"""MLM corruption: parity with transformers' collator, the 15% / 80-10-10 law, static vs dynamic,
whole words, the article's buggy snippet, and the tab's endpoints."""
import json
import math

import pytest
import torch
from gradio_client.exceptions import AppError, ValidationError
from transformers import DataCollatorForLanguageModeling

import bertdemo
from bertdemo.training import experiments
from bertdemo.views import masking

TEXT = "Paris is the capital of France, unbelievably sleeping at the famous Eiffel tower."
SETTINGS = [(0.15, 0.8, 0.1), (0.4, 0.5, 0.3)]


def collator_reference(tokenizer, text, seed, p, p_mask, p_random, whole_word=False):
    """What transformers' collator, called the plain way, makes of `text`: (seen ids, labels)."""
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=p, mask_replace_prob=p_mask,
                                               random_replace_prob=p_random,
                                               whole_word_mask=whole_word, seed=seed)
    batch = collator([tokenizer(text, return_offsets_mapping=whole_word)])
    return batch["input_ids"][0].tolist(), batch["labels"][0].tolist()


@pytest.mark.parametrize("arch", ["tiny_bert", "tiny_roberta"])
@pytest.mark.parametrize("rates", SETTINGS + [(0.5, 1.0, 0.0), (0.5, 0.0, 1.0), (0.5, 0.2, 0.0)])
def test_equals_the_collator(arch, rates, request):
    tok = request.getfixturevalue(arch).tokenizer
    for seed in range(10):
        rows = bertdemo.mask_sample(tok, TEXT, seed, *rates)
        seen, labels = collator_reference(tok, TEXT, seed, *rates)
        assert [r["seen_id"] for r in rows] == seen
        assert [r["label"] for r in rows] == labels


@pytest.mark.parametrize("arch", ["tiny_bert", "tiny_roberta"])
def test_whole_word_equals_the_collator_and_keeps_words_whole(arch, request):
    tok = request.getfixturevalue(arch).tokenizer
    enc = tok(TEXT, return_offsets_mapping=True)
    words = [TEXT[:end].count(" ") for _, end in enc["offset_mapping"]]  # word index by spaces
    for seed in range(40):
        with pytest.warns(UserWarning, match="Random token replacement is not supported"):
            seen, labels = collator_reference(tok, TEXT, seed, 0.3, 0.8, 0.1, whole_word=True)
        rows = bertdemo.mask_sample(tok, TEXT, seed, 0.3, 0.8, 0.1, whole_words=True)
        assert [r["seen_id"] for r in rows] == seen and [r["label"] for r in rows] == labels
        assert all(len(chosen) == 1 for chosen in _piece_groups(rows, words)), f"seed {seed}: word split"
        assert all(r["outcome"] in (None, "mask") for r in rows)  # transformers: no random/keep here
    # The same draws without whole words do split multi-piece words: the test can tell.
    assert any(len(chosen) > 1 for seed in range(40)
               for chosen in _piece_groups(bertdemo.mask_sample(tok, TEXT, seed, 0.3), words))


def _piece_groups(rows, words):
    """For each word, the set of `chosen` values of its non-special pieces."""
    groups = {}
    for row, word in zip(rows, words):
        if not row["special"]:
            groups.setdefault(word, set()).add(row["chosen"])
    return groups.values()


def test_outcomes_explain_what_the_model_sees(tiny_bert):
    tok = tiny_bert.tokenizer
    encoded = masking.encode(tok, TEXT)
    result = masking.corrupt(tok, encoded, 7, masking.Rates(0.5, 0.4, 0.4), copies=500)
    ids, seen = result.input_ids, result.seen
    assert torch.equal(seen[result.to_mask], torch.full_like(seen[result.to_mask], tok.mask_token_id))
    assert torch.equal(seen[result.kept], ids[result.kept])
    assert torch.equal(seen[~result.chosen], ids[~result.chosen])
    changed_not_mask = (seen != ids) & (seen != tok.mask_token_id)
    assert result.to_random[changed_not_mask].all()
    # A random draw can pick the original token: reported as random, about 1 in len(vocab).
    same = (result.to_random & (seen == ids)).sum().item()
    n_random = result.to_random.sum().item()
    expected = n_random / len(tok)
    assert abs(same - expected) < 4 * math.sqrt(expected) + 1


@pytest.mark.parametrize("rates", SETTINGS)
def test_rates_match_the_configured_ones_within_4_standard_errors(tiny_bert, rates):
    rows = bertdemo.masking_law(tiny_bert.tokenizer, TEXT, token_draws=40_000, seed=1, mask_probability=rates[0],
                                mask_replace_probability=rates[1], random_replace_probability=rates[2])
    by_name = {r["rate"]: r for r in rows}
    assert by_name["chosen"]["n"] >= 40_000 and by_name["mask"]["n"] >= 0.1 * 40_000
    configured = {"chosen": rates[0], "mask": rates[1], "random": rates[2], "keep": 1 - rates[1] - rates[2]}
    for name, value in configured.items():
        row = by_name[name]
        assert row["configured"] == pytest.approx(value)
        assert abs(row["measured"] - value) < 4 * row["se"], row
        assert row["low"] <= row["measured"] <= row["high"]


def test_collator_labels_alone_show_the_15_percent(tiny_bert):
    """The same law read off the collator's own labels, with no help from this module."""
    tok = tiny_bert.tokenizer
    collator = DataCollatorForLanguageModeling(tok, seed=3)
    enc = tok(TEXT)
    batch = collator([enc] * 2000)
    eligible = torch.tensor([0 if s else 1 for s in tok.get_special_tokens_mask(
        enc["input_ids"], already_has_special_tokens=True)]).bool().expand(2000, -1)
    n = int(eligible.sum())
    rate = (batch["labels"] != -100)[eligible].float().mean().item()
    assert n >= 20_000 and abs(rate - 0.15) < 4 * math.sqrt(0.15 * 0.85 / n)


def test_specials_and_padding_never_chosen(tiny_bert, tiny_roberta):
    for tok in (tiny_bert.tokenizer, tiny_roberta.tokenizer):
        rows = bertdemo.mask_sample(tok, "Paris is the [MASK] of France.", 0, mask_probability=1.0)
        assert {r["token"] for r in rows if r["special"]} >= {tok.cls_token, tok.sep_token, tok.mask_token}
        assert all(r["chosen"] != r["special"] for r in rows)  # p = 1: every other token is chosen
        assert all(r["label"] == -100 for r in rows if r["special"])
    padded = bertdemo.article_comparison(tiny_bert.tokenizer, "Paris is nice.", max_length=30,
                                         mask_probability=1.0)
    pads = [i for i, t in enumerate(padded["tokens"]) if t == "[PAD]"]
    assert len(pads) > 10
    assert all(padded["collator"]["labels"][i] == -100 and padded["collator"]["outcome"][i] is None
               for i in pads)


def test_same_seed_same_result_other_seed_other_result(tiny_bert):
    tok = tiny_bert.tokenizer
    assert bertdemo.mask_sample(tok, TEXT, seed=5) == bertdemo.mask_sample(tok, TEXT, seed=5)
    assert bertdemo.masking_law(tok, TEXT, 5000, seed=5) == bertdemo.masking_law(tok, TEXT, 5000, seed=5)
    samples = {tuple(r["label"] for r in bertdemo.mask_sample(tok, TEXT, seed=s)) for s in range(10)}
    assert len(samples) > 5


def test_counts_against_expected(tiny_bert):
    rows = bertdemo.mask_sample(tiny_bert.tokenizer, TEXT, seed=2, mask_probability=0.5)
    counts = {c["what"]: c for c in bertdemo.outcome_counts(rows, 0.5)}
    eligible = sum(not r["special"] for r in rows)
    assert counts["tokens that can be chosen"]["count"] == eligible
    assert counts["chosen (scored by the loss)"]["count"] == sum(r["label"] != -100 for r in rows)
    assert counts["chosen (scored by the loss)"]["expected"] == pytest.approx(0.5 * eligible)
    assert counts["chosen -> mask"]["expected"] == pytest.approx(0.5 * eligible * 0.8)
    assert sum(counts[f"chosen -> {o}"]["count"] for o in masking.OUTCOMES) == \
        counts["chosen (scored by the loss)"]["count"]


def test_static_repeats_the_first_mask_and_dynamic_resamples(tiny_bert):
    tok = tiny_bert.tokenizer
    result = bertdemo.static_vs_dynamic(tok, TEXT, epochs=6, seed=10)
    outcomes = [[r["outcome"] for r in bertdemo.mask_sample(tok, TEXT, seed=10 + e)] for e in range(6)]
    assert result["static"]["outcome"] == [outcomes[0]] * 6
    assert result["dynamic"]["outcome"] == outcomes
    assert len(set(map(tuple, result["dynamic"]["outcome"]))) > 1


@pytest.mark.parametrize("copies", [1, 3])
def test_ever_chosen_curve_follows_theory(tiny_bert, copies):
    p = 0.15
    curve = bertdemo.static_vs_dynamic(tiny_bert.tokenizer, TEXT, epochs=12, seed=0,
                                       static_copies=copies)["curve"]
    n = curve["tokens"]
    assert n >= masking.CURVE_TOKENS
    for epoch, static, dynamic in zip(curve["epochs"], curve["static"], curve["dynamic"]):
        theories = (1 - (1 - p) ** min(epoch, copies), 1 - (1 - p) ** epoch)
        for measured, theory in zip((static, dynamic), theories):
            # Every token draw is independent (no whole words here): binomial standard errors.
            assert abs(measured - theory) < 4 * math.sqrt(theory * (1 - theory) / n) + 1e-9
    assert curve["static_theory"][-1] == pytest.approx(1 - (1 - p) ** copies)


def test_article_snippet_gets_labels_specials_and_split_wrong(tiny_bert):
    tok = tiny_bert.tokenizer
    text = "Paris is the [MASK] of France."
    specials_masked = 0
    for seed in range(30):
        inputs = tok(text, max_length=20, padding="max_length", truncation=True, return_tensors="pt")
        original = inputs["input_ids"].clone()
        masked_inputs, labels = bertdemo.article_mask_tokens(inputs, tok, torch.Generator().manual_seed(seed))
        hidden = masked_inputs["input_ids"] != original
        # The loss scores what is visible, ignores what is hidden: the opposite of MLM.
        assert torch.equal(labels[labels != -100], original[labels != -100])
        assert (labels[hidden] == -100).all()
        assert (masked_inputs["input_ids"][hidden] == tok.mask_token_id).all()  # no 80/10/10
        special = tok.get_special_tokens_mask(original[0].tolist(), already_has_special_tokens=True)
        specials_masked += int((hidden[0] & torch.tensor(special).bool()).sum())
    assert specials_masked > 0  # [CLS]/[SEP]/[PAD] get masked too


def test_article_comparison_counts_and_loss_hook(tiny_bert):
    tok = tiny_bert.tokenizer
    seen_batches = []

    def fake_loss(batch):
        seen_batches.append(batch)
        return float((batch["labels"] != -100).sum())

    result = bertdemo.article_comparison(tok, TEXT, seed=4, max_length=40, loss_fn=fake_loss)
    counts = {c["what"]: c for c in result["counts"]}
    art, col = result["article"], result["collator"]
    assert counts["positions scored by the loss"]["article"] == sum(lab != -100 for lab in art["labels"])
    assert counts["positions scored by the loss"]["article"] == \
        counts["scored and visible unchanged (copying suffices)"]["article"]
    assert counts["scored and hidden or replaced"]["article"] == 0
    assert counts["positions scored by the loss"]["collator"] == sum(lab != -100 for lab in col["labels"])
    assert counts["special/padding tokens scored"]["collator"] == 0
    assert counts["special/padding tokens scored"]["article"] >= 2  # [CLS] and [SEP] at least
    assert result["truncated"] is False
    # The hook gets each labelling as a batch a masked LM accepts.
    assert [b["labels"][0].tolist() for b in seen_batches] == [art["labels"], col["labels"]]
    assert result["losses"] == {"article": counts["positions scored by the loss"]["article"],
                                "collator": counts["positions scored by the loss"]["collator"]}
    for batch in seen_batches:
        assert set(batch) == {"input_ids", "attention_mask", "labels"}
        assert batch["input_ids"].shape == batch["attention_mask"].shape == (1, 40)
    assert bertdemo.article_comparison(tok, TEXT, max_length=8)["truncated"] is True


def test_model_loss_hook_matches_the_model(tiny_bert):
    result = bertdemo.article_comparison(tiny_bert.tokenizer, TEXT, seed=1,
                                         loss_fn=experiments.model_loss(tiny_bert))
    inputs = tiny_bert.tokenizer(TEXT, max_length=20, padding="max_length", truncation=True,
                                 return_tensors="pt")
    labels = torch.tensor([result["article"]["labels"]])
    masked = labels == -100
    ids = inputs["input_ids"].masked_fill(masked, tiny_bert.mask_token_id)
    with torch.no_grad():
        expected = tiny_bert.model(input_ids=ids, attention_mask=inputs["attention_mask"], labels=labels).loss
    assert result["losses"]["article"] == pytest.approx(float(expected), rel=1e-5)


@pytest.mark.parametrize("call, message", [
    (lambda tok: bertdemo.mask_sample(tok, ""), "empty"),
    (lambda tok: bertdemo.mask_sample(tok, "   "), "empty"),
    (lambda tok: bertdemo.mask_sample(tok, TEXT, mask_probability=1.5), "from 0 to 1"),
    (lambda tok: bertdemo.mask_sample(tok, TEXT, mask_replace_probability=-0.1), "from 0 to 1"),
    (lambda tok: bertdemo.mask_sample(tok, TEXT, random_replace_probability=float("nan")), "from 0 to 1"),
    (lambda tok: bertdemo.mask_sample(tok, TEXT, mask_replace_probability=0.8, random_replace_probability=0.5),
     "at most 1"),
    (lambda tok: bertdemo.mask_sample(tok, TEXT, seed=-1), "Seed"),
    (lambda tok: bertdemo.mask_sample(tok, TEXT, seed=1.5), "Seed"),
    (lambda tok: bertdemo.mask_sample(tok, "paris " * 300), "at most 256"),
    (lambda tok: bertdemo.static_vs_dynamic(tok, TEXT, epochs=51), "Epochs"),
    (lambda tok: bertdemo.static_vs_dynamic(tok, TEXT, epochs=0), "Epochs"),
    (lambda tok: bertdemo.static_vs_dynamic(tok, TEXT, static_copies=0), "Static copies"),
    (lambda tok: bertdemo.masking_law(tok, TEXT, token_draws=100_001), "Token draws"),
    (lambda tok: bertdemo.masking_law(tok, TEXT, token_draws=float("inf")), "Token draws"),
    (lambda tok: bertdemo.masking_law(tok, "[MASK]"), "no token that can be chosen"),
    (lambda tok: bertdemo.article_comparison(tok, TEXT, max_length=1000), "max_length"),
])
def test_bad_input_says_how_to_fix(tiny_bert, call, message):
    with pytest.raises(ValueError, match=message):
        call(tiny_bert.tokenizer)


# ---------------------------------------------------------------- the tab, through its public API

@pytest.mark.slow
def test_mask_sample_endpoint_matches_service(client, tiny_bert):
    strip, table, counts, rows = client.predict(TEXT, 3, 0.3, 0.5, 0.3, False, api_name="/mask_sample")
    assert rows == bertdemo.mask_sample(tiny_bert.tokenizer, TEXT, 3, 0.3, 0.5, 0.3)
    assert "-100" in table and "model sees" in table
    chosen = sum(r["chosen"] for r in rows)
    assert [str(chosen)] == [str(row[1]) for row in counts["data"] if row[0].startswith("chosen (")]


def test_tables_escape_user_text(tiny_roberta):
    from bertdemo.ui.tabs import masking_tab

    rows = bertdemo.mask_sample(tiny_roberta.tokenizer, "<b>Paris</b> & co", mask_probability=0.0)
    assert any("<" in r["token"] for r in rows)  # byte-level BPE keeps the characters
    for table in (masking_tab._sample_table(rows), masking_tab._article_table(
            bertdemo.article_comparison(tiny_roberta.tokenizer, "<b>Paris</b> & co"))):
        assert "<b>" not in table and "&lt;" in table and "&amp;" in table


@pytest.mark.slow
def test_epochs_law_and_article_endpoints(client, tiny_bert):
    tok = tiny_bert.tokenizer
    summary, grid, curve = client.predict(TEXT, 0, 0.15, 0.8, 0.1, False, 8, 1, api_name="/static_vs_dynamic")
    expected = bertdemo.static_vs_dynamic(tok, TEXT, 8, 0)["curve"]
    assert f"{expected['dynamic'][-1]:.1%}" in summary and grid is not None and curve is not None
    _, table = client.predict(TEXT, 0, 0.15, 0.8, 0.1, True, 5000, api_name="/masking_law")
    law = bertdemo.masking_law(tok, TEXT, 5000, 0, whole_words=True)
    assert [row[4] for row in table["data"]] == [r["n"] for r in law]
    html_table, counts, notes = client.predict("Paris is the [MASK] of France.", 0, 0.15, 0.8, 0.1, False,
                                               20, api_name="/article_snippet")
    assert "article: label" in html_table
    assert "Loss of" in notes
    result = bertdemo.article_comparison(tok, "Paris is the [MASK] of France.")
    assert [row[1:] for row in counts["data"]] == [[c["article"], c["collator"]] for c in result["counts"]]


@pytest.mark.parametrize("args, message", [
    (("", 0, 0.15, 0.8, 0.1, False), "empty"),
    ((TEXT, 0, 0.15, 0.8, 0.5, False), "at most 1"),
    ((TEXT, 0, 0.15, 0.8, 0.1, False, 51, 1), "Epochs|maximum"),
])
def test_bad_input_shows_message_and_server_stays_up(client, args, message):
    api_name = "/mask_sample" if len(args) == 6 else "/static_vs_dynamic"
    with pytest.raises(AppError, match=message):
        client.predict(*args, api_name=api_name)
    *_, rows = client.predict(TEXT, 0, 0.15, 0.8, 0.1, False, api_name="/mask_sample")
    assert len(rows) > 5


# ---------------------------------------------------------------- the article's labelling, trained

REPEATED = "\n".join(["Paris is the capital of France.", "The Eiffel tower is a famous landmark.",
                      "La Tour Eiffel est située à Paris.", "Berlin is the capital of Germany."] * 3)


def test_article_collator_scores_exactly_the_visible_tokens(tiny_bert):
    from bertdemo.training.mlm_data import prepare_text

    tok = tiny_bert.tokenizer
    blocks = prepare_text(tiny_bert, REPEATED, block_length=12).train  # short blocks: ragged, padded
    assert len({len(b["input_ids"]) for b in blocks}) > 1
    padded = DataCollatorForLanguageModeling(tok, mlm=False)(blocks)  # the collator's padding, no masks
    special = torch.tensor([tok.get_special_tokens_mask(row, already_has_special_tokens=True)
                            for row in padded["input_ids"].tolist()]).bool()  # [CLS], [SEP], [PAD]
    collate = experiments.article_collator(tok, seed=0)
    specials_masked = 0
    for _ in range(10):
        batch = collate(blocks)
        hidden = batch["input_ids"] == tok.mask_token_id
        assert hidden.any()
        # The loss skips exactly the masked tokens and scores every visible one, padding included.
        assert torch.equal(batch["labels"] == -100, hidden)
        assert torch.equal(batch["labels"][~hidden], padded["input_ids"][~hidden])
        assert torch.equal(batch["input_ids"][~hidden], padded["input_ids"][~hidden])
        assert torch.equal(batch["attention_mask"], padded["attention_mask"])
        specials_masked += int((hidden & special).sum())
    assert specials_masked > 0


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_collator_labelling_learns_to_fill_masks_the_article_labelling_does_not(tiny_bert, seed):
    result = bertdemo.labelling_consequence(tiny_bert, REPEATED, steps=40, seed=seed, learning_rate=1e-2)
    article, collator = result.runs["article"], result.runs["collator"]
    assert len(article.steps) == len(collator.steps) == 40
    assert article.before == collator.before  # same base model, same fixed eval masks
    # Copying the visible tokens is easy: the article's own loss ends far below the collator's ...
    assert article.steps[-1].loss < collator.steps[-1].loss - 1
    # ... yet on properly masked tokens the collator-trained model is the better one.
    assert collator.after.loss < article.after.loss - 0.5
    assert result.hidden["collator"].loss < result.hidden["article"].loss - 0.5
    assert result.hidden["before"].loss > result.hidden["collator"].loss


def test_hidden_eval_hides_every_chosen_token(tiny_bert):
    from bertdemo.training.mlm_data import prepare_text

    rows = experiments.hidden_eval_rows(tiny_bert, prepare_text(tiny_bert, REPEATED).eval, seed=0)
    labels, ids = torch.cat([r["labels"] for r in rows]), torch.cat([r["input_ids"] for r in rows])
    assert (labels != -100).sum() >= 20
    assert torch.equal(labels != -100, ids == tiny_bert.mask_token_id)


@pytest.mark.parametrize("kwargs, message", [
    (dict(steps=61), "Steps"), (dict(steps=0), "Steps"), (dict(learning_rate=1.0), "learning rate"),
    (dict(texts=" "), "empty"),
])
def test_labelling_consequence_bad_input(tiny_bert, kwargs, message):
    with pytest.raises(ValueError, match=message):
        bertdemo.labelling_consequence(tiny_bert, **{"texts": REPEATED, **kwargs})


@pytest.mark.parametrize("call, field, endpoint", [
    (lambda tok: bertdemo.mask_sample(tok, TEXT, mask_probability=1.5), "mask_probability", "/mask_sample"),
    (lambda tok: bertdemo.mask_sample(tok, TEXT, mask_replace_probability=-0.1), "mask_replace_probability",
     "/mask_sample"),
    (lambda tok: bertdemo.mask_sample(tok, TEXT, mask_replace_probability=0.8, random_replace_probability=0.5),
     "random_replace_probability", "/mask_sample"),
    (lambda tok: bertdemo.masking_law(tok, TEXT, token_draws=100_001), "token_draws", "/masking_law"),
    (lambda tok: bertdemo.static_vs_dynamic(tok, TEXT, static_copies=0), "static_copies", "/static_vs_dynamic"),
])
def test_a_masking_setting_has_the_endpoints_name_in_the_service_and_its_errors(tiny_bert, call, field, endpoint):
    """One name per setting: the keyword, the error's field and the endpoint's parameter."""
    from pathlib import Path

    with pytest.raises(ValueError) as err:
        call(tiny_bert.tokenizer)
    assert err.value.field == field
    endpoints = json.loads(Path(__file__).resolve().parents[1].joinpath("endpoints.json").read_text())
    assert field in [p.split(":")[0] for p in endpoints[endpoint]["parameters"]]


def test_labelling_steps_past_the_servers_cap_are_refused_beside_the_steps_field(tiny_bert):
    """The form's `steps` is checked under its own name against the server's cap too."""
    from bertdemo.config import Limits

    with pytest.raises(ValueError, match="Steps.*from 1 to 20") as err:
        experiments.LabellingForm(REPEATED, 0, 30, 1e-2).plan(tiny_bert, Limits(max_steps=20))
    assert err.value.field == "steps"


@pytest.mark.slow
def test_article_finetune_endpoint(client, tiny_bert):
    from bertdemo.ui.tabs import masking_tab

    plot, table, note = client.predict(REPEATED, 0, 8, 1e-2, api_name="/article_finetune")
    expected = masking_tab._consequence_frame(
        bertdemo.labelling_consequence(tiny_bert, REPEATED, steps=8, seed=0, learning_rate=1e-2))
    assert table["headers"] == list(expected.columns)
    assert table["data"] == expected.values.tolist()
    assert "training loss fell to" in note
    traces = {t["name"]: t for t in json.loads(plot["plot"])["data"]}
    assert len(traces["article's labelling: training loss"]["y"]) == 8
    assert len(traces["collator's labelling: training loss"]["y"]) == 8
    with pytest.raises(ValidationError, match="- learning_rate: .*learning rate"):  # beside its field
        client.predict(REPEATED, 0, 8, 1.0, api_name="/article_finetune")


# ---------------------------------------------------------------- the tab's handlers, no server

def _visitor(lm, session="s1"):
    from bertdemo.config import Settings
    from bertdemo.sessions import SessionStore
    from bertdemo.ui.parts.context import Visitor

    return Visitor(SessionStore(lm), Settings(device="cpu"), session, bertdemo.Engine())


def test_sample_handler_matches_the_service(tiny_bert):
    from bertdemo.ui.tabs import masking_tab

    strip, table, counts, rows = masking_tab.on_sample(_visitor(tiny_bert), TEXT, 3, 0.3, 0.5, 0.3, False)
    assert rows == bertdemo.mask_sample(tiny_bert.tokenizer, TEXT, 3, 0.3, 0.5, 0.3)
    assert [t for t, _ in strip[::2]] == [r["token"] for r in rows] and "-100" in table


def test_article_labelling_run_can_be_stopped_and_holds_one_slot(tiny_bert, monkeypatch):
    """The article-labelling comparison runs through bertdemo.runs: Stop ends it within one step."""
    from bertdemo.ui.tabs import masking_tab

    import dataclasses

    from bertdemo.runs import kinds
    from bertdemo.training.experiments import LabellingForm
    from bertdemo.training.loop import Step
    from bertdemo.ui.parts import live_run

    visitor, form = _visitor(tiny_bert), LabellingForm(REPEATED, 0, 60, 1e-2)
    reserve = live_run.validator("article_finetune")
    assert reserve(visitor, form)[0]["is_valid"]
    refused = reserve(visitor, form)[0]
    assert not refused["is_valid"] and "already running" in refused["message"]
    # Stop as a visitor would during the article's run. Pressed from the handler's progress, it
    # could land in the collator's run: the handler reads events every 0.5 s, and the tiny
    # model's 60 steps may all fit in that first half second.
    spec, stops = kinds.RUNS["article_finetune"], []

    def stopped_at_first_step(plan, on_event, should_stop):
        def step(event):
            on_event(event)
            if isinstance(event, Step) and not stops:
                stops.append(event.run)
                masking_tab.on_stop(visitor)
        return spec.job(plan, on_event=step, should_stop=should_stop)

    monkeypatch.setitem(kinds.RUNS, "article_finetune", dataclasses.replace(spec, job=stopped_at_first_step))
    _, table, note = list(masking_tab.on_consequence(visitor, form, progress=lambda *a, **k: None))[-1]
    assert stops == ["article"]
    assert "stopped early: article's labelling: stopped" in note or "did not both train" in note
    assert visitor.store.runs.status("s1") is None  # released
    assert reserve(visitor, form)[0]["is_valid"]


def test_the_epoch_grids_text_stays_readable_on_a_long_text(tiny_bert):
    """Static above dynamic, each the page's width, the cells' text at a fixed size (plotly's own
    shrinks it to fit: unreadable past about 15 tokens side by side)."""
    from bertdemo import plots

    text = " ".join(["paris is the capital of france ."] * 4)  # 28 words
    result = masking.static_vs_dynamic(tiny_bert.tokenizer, text, 3, 0, 0.15)
    fig = plots.outcome_grid(result["tokens"], {mode: result[mode] for mode in ("static", "dynamic")})
    assert [trace.textfont.size for trace in fig.data] == [11, 11]  # 30 tokens with [CLS] and [SEP]
    static, dynamic = fig.layout.yaxis.domain, fig.layout.yaxis2.domain
    assert static[0] > dynamic[1]  # one above the other
    assert fig.layout.xaxis.domain[1] - fig.layout.xaxis.domain[0] == pytest.approx(1.0)


def test_every_random_stream_of_a_run_has_a_seed_of_its_own():
    """The training stream (seed, and seed + rank in the exported script), the fine-tune's eval
    masks, the forgetting measure and the labelling experiment's hidden masks never share a seed."""
    from bertdemo.training import loop
    from bertdemo.training.templates import train_mlm

    streams = list(loop._STREAM_OFFSETS)  # noqa: SLF001 - every stream declared
    for seed in (0, 1, 12_345):
        seeds = [loop.stream_seed(seed, s) for s in streams]
        assert len(set(seeds)) == len(streams) and seed not in seeds
        assert min(abs(a - b) for a in seeds + [seed] for b in seeds + [seed] if a != b) >= 1_000_000
    assert train_mlm.EVAL_SEED_OFFSET == loop.stream_seed(0, "eval")  # the exported script's eval masks
