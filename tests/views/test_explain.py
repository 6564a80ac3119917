"""Inside a prediction: logit lens, Captum attributions, two models side by side.

Parity against references wherever one exists: `fill_mask` for the last layer, the model's own
embeddings + head for the first, a direct forward for f(x) and f(baseline), finite differences for
gradient x input, two direct `fill_mask` / `sentence_score` calls for the comparison.
"""
import copy
import dataclasses
import math

import pytest
import torch

import bertdemo
import tiny_models
from bertdemo.views import compare, explain
from bertdemo.validate import InputError

TEXT = "Paris is the [MASK] of France."
TWO = "The [MASK] is the capital of [MASK]."


@pytest.fixture(scope="module")
def three_layer_bert(tmp_path_factory):
    folder = tiny_models.save_tiny_bert(tmp_path_factory.mktemp("bert3"), seed=1, layers=3)
    return bertdemo.load(str(folder), device="cpu")


@pytest.fixture(scope="module")
def double_bert(tiny_bert):
    """The tiny BERT in float64, so finite differences are exact to ~1e-9."""
    return dataclasses.replace(tiny_bert, model=copy.deepcopy(tiny_bert.model).double())


def _close(preds, reference, tol=1e-5):
    assert [p["token_id"] for p in preds] == [p["token_id"] for p in reference]
    assert [p["token"] for p in preds] == [p["token"] for p in reference]
    assert all(abs(p["score"] - r["score"]) < tol for p, r in zip(preds, reference))


# ---------------------------------------------------------------- layer by layer

@pytest.mark.parametrize("model", ["tiny_bert", "tiny_distilbert", "tiny_roberta"])
def test_last_layer_equals_fill_mask(model, request):
    lm = request.getfixturevalue(model)
    text = TWO if model != "tiny_roberta" else "Paris is the [MASK] of [MASK]."
    lens = bertdemo.layer_predictions(lm, text, top_k=7)
    reference = bertdemo.fill_mask(lm, text, top_k=7)
    assert len(lens) == len(reference) == 2
    for entry, ref in zip(lens, reference):
        _close(entry["layers"][-1], ref)
        assert entry["final"]["token_id"] == ref[0]["token_id"]
        assert entry["final_rank"][-1] == 1
        assert abs(entry["final_prob"][-1] - ref[0]["score"]) < 1e-5


@pytest.mark.parametrize("model, layers", [("tiny_bert", 2), ("three_layer_bert", 3), ("tiny_distilbert", 2)])
def test_one_entry_after_the_embeddings_and_after_every_layer(model, layers, request):
    lm = request.getfixturevalue(model)
    config = lm.model.config
    assert getattr(config, "num_hidden_layers", getattr(config, "n_layers", None)) == layers
    entry = bertdemo.layer_predictions(lm, TEXT, top_k=3)[0]
    for key in ("layers", "layer_names", "final_rank", "final_prob"):
        assert len(entry[key]) == layers + 1
    assert entry["layer_names"][0] == "embeddings" and entry["layer_names"][-1] == f"layer {layers}"


def test_first_entry_is_the_head_on_the_embeddings(tiny_bert):
    """Layer 0 against an independent path: the model's embedding module, then its MLM head."""
    entry = bertdemo.layer_predictions(tiny_bert, TEXT, top_k=5)[0]
    inputs = tiny_bert.tokenizer(TEXT.replace("[MASK]", tiny_bert.mask_token), return_tensors="pt")
    position = inputs["input_ids"][0].tolist().index(tiny_bert.mask_token_id)
    with torch.no_grad():
        hidden = tiny_bert.model.bert.embeddings(input_ids=inputs["input_ids"],
                                                 token_type_ids=inputs["token_type_ids"])
        probs = tiny_bert.model.cls(hidden[0, position]).softmax(-1)
    scores, ids = probs.topk(5)
    assert [p["token_id"] for p in entry["layers"][0]] == ids.tolist()
    assert all(abs(p["score"] - s) < 1e-5 for p, s in zip(entry["layers"][0], scores.tolist()))


def test_rank_of_the_final_answer_agrees_with_each_layers_top_k(three_layer_bert):
    for entry in bertdemo.layer_predictions(three_layer_bert, TWO, top_k=10):
        final = entry["final"]["token_id"]
        for layer, rank, prob in zip(entry["layers"], entry["final_rank"], entry["final_prob"]):
            ids = [p["token_id"] for p in layer]
            if rank <= 10:
                assert ids[rank - 1] == final and abs(layer[rank - 1]["score"] - prob) < 1e-6
            else:
                assert final not in ids and prob <= layer[-1]["score"]


# ---------------------------------------------------------------- saliency

def _direct_log_prob(lm, input_ids, position, token_id):
    """log p(token at position) from a plain full forward on ids: no Captum, no head shortcut."""
    with torch.no_grad():
        return float(lm.model(input_ids=input_ids).logits[0, position].double().log_softmax(-1)[token_id])


def test_integrated_gradients_are_complete_at_64_steps(tiny_bert):
    result = bertdemo.saliency(tiny_bert, TWO, mask=2, steps=64)
    ids = tiny_bert.tokenizer(tiny_bert.to_model_text(TWO), return_tensors="pt")["input_ids"]
    target = result["target"]["token_id"]
    f_x = _direct_log_prob(tiny_bert, ids, result["position"], target)
    f_base = _direct_log_prob(tiny_bert, explain.pad_baseline(tiny_bert, ids), result["position"], target)
    assert abs(result["log_prob"] - f_x) < 1e-5 and abs(result["baseline_log_prob"] - f_base) < 1e-5
    assert abs(f_x - f_base) > 0.05  # a sentence where the context matters, or the check is empty
    assert abs(sum(result["attributions"]) - (f_x - f_base)) < 1e-3
    assert abs(result["delta"]) < 1e-3
    assert result["delta"] == pytest.approx(sum(result["attributions"]) - (f_x - f_base), abs=1e-5)
    # [CLS], [SEP] and both masks are in the baseline too: nothing to attribute to them
    special = [i for i, t in enumerate(result["tokens"]) if t in {"[CLS]", "[SEP]", "[MASK]"}]
    assert len(special) == 4 and all(result["attributions"][i] == 0 for i in special)
    assert len(result["attributions"]) == len(result["tokens"]) == ids.shape[1]


@pytest.mark.parametrize("model", ["tiny_bert", "tiny_distilbert", "tiny_roberta"])
def test_default_target_is_the_top_prediction(model, request):
    """Also: the inputs_embeds path gives fill_mask's probability for every architecture."""
    lm = request.getfixturevalue(model)
    result = bertdemo.saliency(lm, TEXT, steps=8)
    top = bertdemo.fill_mask(lm, TEXT, top_k=1)[0][0]
    assert result["target"]["token_id"] == top["token_id"] and result["note"] == ""
    assert abs(math.exp(result["log_prob"]) - top["score"]) < 1e-5
    assert abs(result["delta"]) < 1e-2


def test_gradient_x_input_matches_finite_differences(double_bert):
    """d f / d(scale of token t's embedding) at scale 1 is gradient . embedding: central
    differences of the full model's output, in float64."""
    result = bertdemo.saliency(double_bert, TEXT, target="capital", method="gradient_x_input")
    assert result["delta"] is None and result["baseline_log_prob"] is None
    ids = double_bert.tokenizer(double_bert.to_model_text(TEXT), return_tensors="pt")["input_ids"]
    position, target = result["position"], result["target"]["token_id"]
    with torch.no_grad():
        embeds = double_bert.model.get_input_embeddings()(ids)  # (1, T, H)

        def f(scaled_token: int, scale: float) -> float:
            e = embeds.clone()
            e[0, scaled_token] *= scale
            return float(double_bert.model(inputs_embeds=e).logits[0, position].log_softmax(-1)[target])

        eps = 1e-5
        numeric = [(f(t, 1 + eps) - f(t, 1 - eps)) / (2 * eps) for t in range(ids.shape[1])]
    assert max(abs(n) for n in numeric) > 1e-2  # not all zero
    assert all(abs(a - n) < 1e-6 for a, n in zip(result["attributions"], numeric)), \
        list(zip(result["attributions"], numeric))


def test_a_word_of_several_pieces_is_explained_for_its_first(tiny_bert):
    assert tiny_bert.tokenizer.tokenize("capitals") == ["capital", "##s"]
    result = bertdemo.saliency(tiny_bert, TEXT, target="capitals", steps=4)
    assert result["target"]["token"] == "capital" and result["target"]["pieces"] == ["capital", "##s"]
    assert "first piece" in result["note"] and "capital ##s" in result["note"]
    single = bertdemo.saliency(tiny_bert, TEXT, target="capital", steps=4)
    assert single["log_prob"] == pytest.approx(result["log_prob"]) and single["note"] == ""


def test_roberta_target_is_the_word_start_piece(tiny_roberta):
    result = bertdemo.saliency(tiny_roberta, TEXT, target="capital", steps=4)
    assert result["target"]["pieces"][0].startswith("Ġ")  # the piece running text has after a space


def _hooks(model):
    return [(len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks))
            for m in model.modules()]


def test_saliency_leaves_the_shared_model_as_it_was(tiny_bert, monkeypatch):
    """No hook is ever put on the shared model (another visitor's forward would run through it)."""
    before, hooks, registered = bertdemo.fill_mask(tiny_bert, TEXT), _hooks(tiny_bert.model), []
    for name in ("register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook"):
        original = getattr(torch.nn.Module, name)
        monkeypatch.setattr(torch.nn.Module, name, lambda self, *a, _o=original, _n=name, **k:
                            registered.append(_n) or _o(self, *a, **k))
    bertdemo.saliency(tiny_bert, TEXT, steps=4)
    bertdemo.saliency(tiny_bert, TEXT, method="gradient_x_input")
    monkeypatch.undo()
    assert registered == [] and _hooks(tiny_bert.model) == hooks
    assert all(p.grad is None and not p.requires_grad for p in tiny_bert.model.parameters())
    assert bertdemo.fill_mask(tiny_bert, TEXT) == before


# ---------------------------------------------------------------- two models

def test_compare_predictions_matches_two_fill_mask_calls(tiny_bert, tiny_distilbert):
    result = bertdemo.compare_predictions(tiny_bert, tiny_distilbert, TWO, top_k=4)
    ref_a, ref_b = bertdemo.fill_mask(tiny_bert, TWO, 4), bertdemo.fill_mask(tiny_distilbert, TWO, 4)
    assert result["models"] == [tiny_bert.name, tiny_distilbert.name]
    for mask, a, b in zip(result["masks"], ref_a, ref_b):
        _close(mask["a"], a)
        _close(mask["b"], b)
        rows = {row["token"]: row for row in mask["changes"]}
        assert len(rows) == len(mask["changes"]) == len({p["token"] for p in a + b})
        for p in a:
            assert abs(rows[p["token"]]["a"] - p["score"]) < 1e-5
        for p in b:
            assert abs(rows[p["token"]]["b"] - p["score"]) < 1e-5
        for row in mask["changes"]:  # same vocabulary: every token has both
            assert row["change"] == pytest.approx(row["b"] - row["a"])
        shared = {p["token"] for p in a} & {p["token"] for p in b}
        for token in shared:
            pa = next(p["score"] for p in a if p["token"] == token)
            pb = next(p["score"] for p in b if p["token"] == token)
            assert abs(rows[token]["change"] - (pb - pa)) < 1e-5


def test_a_model_compared_with_itself_changes_nothing(tiny_bert):
    result = bertdemo.compare_predictions(tiny_bert, tiny_bert, TEXT, top_k=3)
    assert all(row["change"] == 0 for row in result["masks"][0]["changes"])
    assert len(result["masks"][0]["changes"]) == 3


def test_compare_across_vocabularies_matches_word_starts(tiny_bert, tiny_roberta):
    result = bertdemo.compare_predictions(tiny_bert, tiny_roberta, "Paris is the [MASK] of France.", top_k=5)
    reference = bertdemo.fill_mask(tiny_roberta, "Paris is the [MASK] of France.", 5)[0]
    _close(result["masks"][0]["b"], reference)
    for row in result["masks"][0]["changes"]:
        assert (row["change"] is None) == (row["a"] is None or row["b"] is None)
    bert_id = tiny_bert.tokenizer.convert_tokens_to_ids("capital")
    roberta_id = tiny_roberta.tokenizer.convert_tokens_to_ids("Ġcapital")
    assert roberta_id != tiny_roberta.tokenizer.unk_token_id
    assert compare.same_token(tiny_roberta, roberta_id, tiny_bert) == bert_id
    assert compare.same_token(tiny_bert, bert_id, tiny_roberta) == roberta_id


def test_compare_scores_matches_two_sentence_scores(tiny_bert, tiny_distilbert):
    result = bertdemo.compare_scores(tiny_bert, tiny_distilbert, TEXT)
    filled = bertdemo.fill_jointly(tiny_bert, TEXT, 1)[0]["text"]
    a, b = bertdemo.sentence_score(tiny_bert, filled), bertdemo.sentence_score(tiny_distilbert, filled)
    assert result["sentence"] == filled and result["a"] == a and result["b"] == b
    assert result["change"] == pytest.approx(b["pll"] - a["pll"])
    assert result["token_changes"] == pytest.approx([y - x for x, y in zip(a["log_probs"], b["log_probs"])])


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("call, field, words", [
    (lambda lm: bertdemo.layer_predictions(lm, "No mask here."), None, "No [MASK]"),
    (lambda lm: bertdemo.saliency(lm, "No mask here."), None, "No [MASK]"),
    (lambda lm: bertdemo.saliency(lm, TEXT, mask=2), "mask", "from 1 to 1"),
    (lambda lm: bertdemo.saliency(lm, TWO, mask=0), "mask", "from 1 to 2"),
    (lambda lm: bertdemo.saliency(lm, TWO, mask=1.5), "mask", "whole number"),
    (lambda lm: bertdemo.saliency(lm, TEXT, target="🙂"), "target", "[UNK]"),
    (lambda lm: bertdemo.saliency(lm, TEXT, target="[MASK]"), "target", "one word"),
    (lambda lm: bertdemo.saliency(lm, TEXT, target=3), "target", "one word"),
    (lambda lm: bertdemo.saliency(lm, TEXT, steps=0), "steps", "from 1 to 256"),
    (lambda lm: bertdemo.saliency(lm, TEXT, steps=257), "steps", "from 1 to 256"),
    (lambda lm: bertdemo.saliency(lm, TEXT, steps=float("nan")), "steps", "whole number"),
    (lambda lm: bertdemo.saliency(lm, TEXT, method="lime"), "method", "integrated_gradients"),
    (lambda lm: bertdemo.saliency(lm, "paris " * 70 + "[MASK]"), None, "Shorten it"),
    (lambda lm: bertdemo.layer_predictions(lm, "paris " * 70 + "[MASK]"), None, "Shorten it"),
    (lambda lm: bertdemo.layer_predictions(lm, TEXT, top_k=0), None, "top_k"),
    (lambda lm: bertdemo.compare_predictions(lm, lm, ""), None, "empty"),
    (lambda lm: bertdemo.compare_scores(lm, lm, "   "), None, "empty"),
])
def test_bad_input_says_how_to_fix_it(tiny_bert, call, field, words):
    with pytest.raises(ValueError) as err:
        call(tiny_bert)
    assert words in str(err.value)
    if field is not None:
        assert isinstance(err.value, InputError) and err.value.field == field


def test_unknown_word_names_its_pieces(tiny_bert):
    with pytest.raises(ValueError, match=r"tokenizes to \['\[UNK\]'\]"):
        bertdemo.saliency(tiny_bert, TEXT, target="🙂")


def test_work_cap_stops_long_texts_with_many_steps(tiny_bert, monkeypatch):
    monkeypatch.setattr(explain, "MAX_TOKEN_STEPS", 100)
    with pytest.raises(InputError, match="fewer steps or a shorter text") as err:
        bertdemo.saliency(tiny_bert, TEXT, steps=20)  # 9 tokens x 20 steps
    assert err.value.field == "steps"
    assert bertdemo.saliency(tiny_bert, TEXT, steps=10)["steps"] == 10  # 90 token-steps: fine


# ---------------------------------------------------------------- the tab's handlers, no server

@pytest.fixture
def visitor(tiny_bert):
    from bertdemo.config import Settings
    from bertdemo.sessions import SessionStore
    from bertdemo.ui.parts.context import Visitor

    return Visitor(SessionStore(tiny_bert), Settings(model=tiny_bert.name, device="cpu"), "s1", bertdemo.Engine())


def test_layers_handler_plots_the_chosen_mask(visitor):
    from bertdemo.ui.tabs.explain_tab import on_layers

    heatmap, ranks, entries = on_layers(visitor, TWO, 2, 4)
    assert entries == bertdemo.layer_predictions(visitor.lm, TWO, 4)
    cells = heatmap.data[0].text  # layers x k token names, the final answer in bold
    assert [c.replace("<b>", "").replace("</b>", "") for c in cells[-1]] == \
        [p["token"] for p in entries[1]["layers"][-1]]
    assert cells[-1][0] == f"<b>{entries[1]['final']['token']}</b>"
    assert [list(t.y) for t in ranks.data] == [e["final_rank"] for e in entries]
    assert ranks.layout.yaxis.type == "log"


def test_saliency_handler_shows_attribution_beside_attention(visitor):
    from bertdemo.views.attention_views import attention, mask_rows
    from bertdemo.ui.tabs.explain_tab import on_saliency

    note, coloured, result = on_saliency(visitor, TWO, "", 1, "integrated_gradients", 16, 1)  # layer 1: the first
    assert "Attention of the [MASK], layer 1, mean over heads" in coloured
    assert "convergence delta" in note
    assert coloured.count('class="explain-token"') == 2 * len(result["tokens"])
    att = mask_rows(attention(visitor.lm, TWO), 0)[0].mean(0)
    for token, weight, value in zip(result["tokens"], att.tolist(), result["attributions"]):
        assert f'title="{token}: {value:+.4f}"' in coloured and f'title="{token}: {weight:.4f}"' in coloured


@pytest.mark.parametrize("args, words", [
    ((TWO, 3, 5), "from 1 to 2"), ((TWO, 1, 51), "from 1 to 50"), (("No mask.", 1, 5), "No [MASK]")])
def test_layers_handler_refuses_bad_input(visitor, args, words):
    from bertdemo.ui.tabs.explain_tab import on_layers

    with pytest.raises(ValueError, match=words.replace("[", r"\[")):
        on_layers(visitor, *args)


def test_saliency_handler_refuses_a_layer_the_model_lacks(visitor):
    from bertdemo.ui.tabs.explain_tab import on_saliency

    with pytest.raises(InputError, match="from 1 to 2") as err:  # the tiny model's 2 layers, as the page counts
        on_saliency(visitor, TEXT, "", 1, "gradient_x_input", 1, 3)
    assert err.value.field == "layer"


def test_tokens_are_escaped_in_the_page(real_vocab_bert):
    from bertdemo.ui.tabs.explain_tab import token_rows

    result = bertdemo.saliency(real_vocab_bert, "<script>alert(1)</script> is the [MASK].", steps=2)
    page = token_rows(result, [0.1] * len(result["tokens"]), 0)
    assert "<script>" not in page and ">&lt;</span>" in page and ">&gt;</span>" in page


def test_named_endpoints_answer_as_the_python_api(client, tiny_bert):
    _, _, raw = client.predict(TWO, 2, 3, api_name="/layer_predictions")
    direct_layers = bertdemo.layer_predictions(tiny_bert, TWO, 3)
    assert [e["final_rank"] for e in raw] == [e["final_rank"] for e in direct_layers]
    for served, direct in zip(raw, direct_layers):
        for served_layer, direct_layer in zip(served["layers"], direct["layers"]):
            _close(served_layer, direct_layer)
    note, coloured, result = client.predict(TEXT, "capital", 1, "gradient_x_input", 1, 1, api_name="/saliency")  # layer 1: the first
    direct = bertdemo.saliency(tiny_bert, TEXT, "capital", method="gradient_x_input")
    assert result["tokens"] == direct["tokens"] and "capital" in note
    assert result["attributions"] == pytest.approx(direct["attributions"], abs=1e-5)
