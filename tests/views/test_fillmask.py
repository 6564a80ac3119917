"""Fill-mask service: parity with transformers' pipeline, and what the pipeline can't do."""
import math

import pytest
import torch
from transformers import pipeline

import bertdemo
from bertdemo.views import fillmask

SENTENCES = ["Paris is the [MASK] of France.",
             "The [mask] tower is a famous [MASK].",
             "[MASK] is the capital of [MASK] , la tour [MASK] est situee a paris ."]


def _pipeline_rows(lm, text, top_k):
    fill = pipeline("fill-mask", model=lm.model, tokenizer=lm.tokenizer, device=lm.device)
    rows = fill(lm.to_model_text(text), top_k=top_k)
    return [rows] if isinstance(rows[0], dict) else rows


@pytest.mark.parametrize("arch", ["tiny_bert", "tiny_distilbert", "tiny_roberta"])
@pytest.mark.parametrize("text", SENTENCES)
def test_fill_mask_equals_pipeline(arch, text, request):
    lm = request.getfixturevalue(arch)
    ours = bertdemo.fill_mask(lm, text, top_k=7)
    reference = _pipeline_rows(lm, text, 7)
    assert len(ours) == len(reference) == text.lower().count("[mask]")
    for our_row, ref_row in zip(ours, reference):
        assert [p["token_id"] for p in our_row] == [r["token"] for r in ref_row]
        assert [p["token"] for p in our_row] == [r["token_str"] for r in ref_row]
        for p, r in zip(our_row, ref_row):
            assert p["score"] == pytest.approx(r["score"], abs=1e-5)


def test_an_engine_loads_once_per_name_and_device(engine, tiny_bert_dir, tiny_bert):
    assert engine.load(str(tiny_bert_dir), device="cpu") is tiny_bert
    assert not any(p.requires_grad for p in tiny_bert.model.parameters())


def test_load_takes_a_path_as_transformers_does(engine, tiny_bert_dir, tiny_bert):
    """`pathlib.Path` (any os.PathLike) is a folder like its string: the same cached model."""
    assert engine.load(tiny_bert_dir, device="cpu") is tiny_bert
    with pytest.raises(ValueError, match="No model given"):
        bertdemo.load(" ", device="cpu")


def test_load_unknown_model_says_how_to_fix(tmp_path):
    with pytest.raises(ValueError, match="--model /path/to/folder"):
        bertdemo.load(str(tmp_path / "no-such-model"))


def test_load_refuses_pickle_only_checkpoint(tiny_bert, tmp_path):
    tiny_bert.model.config.save_pretrained(tmp_path)
    tiny_bert.tokenizer.save_pretrained(tmp_path)
    torch.save(tiny_bert.model.state_dict(), tmp_path / "pytorch_model.bin")  # pickle only
    with pytest.raises(ValueError, match="--allow-pickle"):
        bertdemo.load(str(tmp_path))
    allowed = bertdemo.load(str(tmp_path), allow_pickle=True)
    assert allowed.model is not tiny_bert.model
    ours, base = (bertdemo.fill_mask(m, "a [MASK]")[0] for m in (allowed, tiny_bert))
    assert [p["token_id"] for p in ours] == [p["token_id"] for p in base]
    assert [p["score"] for p in ours] == pytest.approx([p["score"] for p in base], abs=1e-6)


def test_head_runs_only_at_masked_positions(tiny_bert, monkeypatch):
    seen = []
    head = tiny_bert.model.cls.predictions.transform  # the head's first step
    handle = head.register_forward_hook(lambda m, i, o: seen.append(i[0].shape))
    try:
        bertdemo.fill_mask(tiny_bert, "the [MASK] is a famous [MASK] of paris .")
    finally:
        handle.remove()
    assert seen == [torch.Size([2, 32])]


@pytest.mark.parametrize("text, message", [
    ("", "empty"), ("   \n\t", "empty"), ("Paris is the capital of France.", "No \\[MASK\\]"),
    ("[MASK] " * 11, "at most 10"), ("paris [MASK] " + "word " * 80, "at most 64 tokens"),
])
def test_bad_input_raises_clear_value_error(tiny_bert, text, message):
    with pytest.raises(ValueError, match=message):
        bertdemo.fill_mask(tiny_bert, text)


def test_unicode_emoji_and_html_are_just_text(tiny_bert):
    for text in ["<script>alert(1)</script> [MASK] 😀", "Zürich ist die [MASK] — ☃", "שלום [MASK]"]:
        assert len(bertdemo.fill_mask(tiny_bert, text, top_k=3)) == 1


@pytest.mark.parametrize("top_k", [0, -1, 2.5, "5", None])
def test_bad_top_k(tiny_bert, top_k):
    with pytest.raises(ValueError, match="top_k"):
        bertdemo.fill_mask(tiny_bert, "Paris is the [MASK].", top_k=top_k)


def test_user_mask_maps_to_roberta_mask(tiny_roberta):
    assert tiny_roberta.mask_token == "<mask>"
    assert tiny_roberta.to_model_text("a [Mask] b [MASK]") == "a <mask> b <mask>"


# ------------------------------------------------------------------ joint filling

def test_joint_fill_greedy_matches_step_by_step(tiny_bert):
    text = "[MASK] is the capital of [MASK] ."
    greedy = bertdemo.fill_jointly(tiny_bert, text, beam_size=1)[0]
    # Redo it by hand: the mask with the highest top probability first, then re-run.
    first_step = bertdemo.fill_mask(tiny_bert, text, top_k=1)
    best_mask = max(range(2), key=lambda i: first_step[i][0]["score"])
    token = first_step[best_mask][0]["token"]
    parts = text.split("[MASK]")
    partial = parts[0] + (token if best_mask == 0 else "[MASK]") + parts[1] + (
        token if best_mask == 1 else "[MASK]") + parts[2]
    second = bertdemo.fill_mask(tiny_bert, partial, top_k=1)[0][0]
    expected_lp = math.log(first_step[best_mask][0]["score"]) + math.log(second["score"])
    assert greedy["log_prob"] == pytest.approx(expected_lp, abs=1e-4)
    assert [f["step"] for f in greedy["fills"] if f["mask"] == best_mask] == [0]
    assert "[MASK]" not in greedy["text"]


def test_wider_beam_never_worse(tiny_bert):
    text = "the [MASK] [MASK] is a famous [MASK] ."
    widths = [bertdemo.fill_jointly(tiny_bert, text, beam_size=b)[0]["log_prob"] for b in (1, 3, 5)]
    # 1e-4: beams run as one batch, whose float sums differ from a batch of one in the 6th digit.
    assert widths[0] <= widths[1] + 1e-4 and widths[1] <= widths[2] + 1e-4
    results = bertdemo.fill_jointly(tiny_bert, text, beam_size=5)
    assert len({r["text"] for r in results}) == len(results)


def _joint(results):
    return [(r["text"], [f["token_id"] for f in r["fills"]]) for r in results], [r["log_prob"] for r in results]


@pytest.mark.parametrize("text", ["the [MASK] [MASK] is a famous [MASK] .", "[MASK] is the capital of france ."])
def test_joint_fill_is_the_same_whether_or_not_a_prediction_ran_first(tiny_bert_dir, text):
    """The first step fill_mask remembers is only a shortcut: each model below is loaded afresh
    (its own, empty memo), one filled jointly at once, the other after a prediction."""
    cold = bertdemo.Engine().load(str(tiny_bert_dir), device="cpu")
    warm = bertdemo.Engine().load(str(tiny_bert_dir), device="cpu")
    alone = bertdemo.fill_jointly(cold, text, beam_size=3)
    bertdemo.fill_mask(warm, text, top_k=5)
    after = bertdemo.fill_jointly(warm, text, beam_size=3)
    assert _joint(after)[0] == _joint(alone)[0]
    assert _joint(after)[1] == pytest.approx(_joint(alone)[1], abs=1e-5)


# ------------------------------------------------------------------ candidate words

def test_candidate_single_piece_equals_fill_mask_probability(tiny_bert):
    text = "Paris is the [MASK] of France."
    probs = {p["token"]: p["score"] for p in bertdemo.fill_mask(tiny_bert, text, top_k=210)[0]}
    result = bertdemo.score_candidates(tiny_bert, text, ["capital", "city"])
    for r in result:
        assert r["pieces"] == [r["word"]]
        assert math.exp(r["log_prob"]) == pytest.approx(probs[r["word"]], rel=1e-4)
        assert r["first_piece_prob"] == pytest.approx(probs[r["word"]], rel=1e-4)


def test_candidate_multi_piece_uses_every_piece(tiny_bert):
    text = "Paris is the [MASK] of France."
    (r,) = bertdemo.score_candidates(tiny_bert, text, ["unbelievably"])
    assert r["pieces"] == ["un", "##believ", "##a", "##b", "##ly"]
    # The chain rule by hand, one full-model forward per piece, pieces filled left to right.
    tok = tiny_bert.tokenizer
    before, after = tok("Paris is the")["input_ids"][:-1], tok("of France.")["input_ids"][1:]
    pieces = tok.convert_tokens_to_ids(r["pieces"])
    expected = 0.0
    for j in range(len(pieces)):
        ids = torch.tensor([before + pieces[:j] + [tok.mask_token_id] * (5 - j) + after])
        with torch.no_grad():
            logits = tiny_bert.model(input_ids=ids).logits[0, len(before) + j]
        expected += logits.log_softmax(-1)[pieces[j]].item()
    assert r["log_prob"] == pytest.approx(expected, abs=1e-3)
    # The pipeline keeps only the first piece: "targets" scores "un" at the single mask.
    fill = pipeline("fill-mask", model=tiny_bert.model, tokenizer=tiny_bert.tokenizer)
    ref = fill(text, targets=["unbelievably"], top_k=1)[0]
    assert ref["token_str"] == "un"
    assert r["first_piece_prob"] == pytest.approx(ref["score"], abs=1e-5)


def test_candidate_bad_input(tiny_bert):
    with pytest.raises(ValueError, match="No candidate"):
        bertdemo.score_candidates(tiny_bert, "a [MASK]", " , ")
    with pytest.raises(ValueError, match="out of range"):
        bertdemo.score_candidates(tiny_bert, "a [MASK]", ["x"], mask_index=3)
    with pytest.raises(ValueError, match="at most 10"):
        bertdemo.score_candidates(tiny_bert, "a [MASK]", [f"w{i}" for i in range(11)])


# ------------------------------------------------------------------ sentence score

def test_pll_matches_one_forward_per_token(tiny_bert):
    text = "paris is the capital of france ."
    result = bertdemo.sentence_score(tiny_bert, text, batch_size=3)  # several chunks
    ids = tiny_bert.tokenizer(text, return_tensors="pt")["input_ids"]
    expected = []
    for pos in range(1, ids.shape[1] - 1):
        masked = ids.clone()
        masked[0, pos] = tiny_bert.mask_token_id
        with torch.no_grad():
            logits = tiny_bert.model(input_ids=masked).logits[0, pos]
        expected.append(logits.log_softmax(-1)[ids[0, pos]].item())
    assert result["log_probs"] == pytest.approx(expected, abs=1e-4)
    assert result["pseudo_perplexity"] == pytest.approx(math.exp(-sum(expected) / len(expected)), rel=1e-4)


def test_pll_needs_complete_sentence(tiny_bert):
    with pytest.raises(ValueError, match="fill or remove"):
        bertdemo.sentence_score(tiny_bert, "Paris is the [MASK].")


def test_mask_word():
    assert fillmask.mask_word("Paris is the capital.", 3) == "Paris is the [MASK]."
    assert [w for w, _, _ in fillmask.split_words("It's [mask]!")] == ["It's", "[mask]", "!"]
    with pytest.raises(ValueError):
        fillmask.mask_word("one", 5)


def test_joint_filling_fills_every_mask_even_when_the_model_predicts_its_mask_token(tiny_bert):
    """A model (a random one, an odd checkpoint) may rank its own [MASK] first: the joint fill
    still fills each mask once and writes every one into the sentence."""
    import copy

    from bertdemo.model.loading import LoadedModel

    model = copy.deepcopy(tiny_bert.model)
    with torch.no_grad():
        model.cls.predictions.decoder.bias[tiny_bert.mask_token_id] = 100.0
    odd = LoadedModel("mask-first", tiny_bert.tokenizer, model, tiny_bert.device)
    completions = bertdemo.fill_jointly(odd, "the [MASK] sat on the [MASK] .", beam_size=2)
    for completion in completions:
        assert sorted(f["mask"] for f in completion["fills"]) == [0, 1]
