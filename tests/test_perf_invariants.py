"""Cheap guards for the speed levers the benchmarks rely on (bench/ measures the speed itself)."""
import copy

import pytest
import torch
import transformers

import bertdemo
from bertdemo.models import RowsLinear, mlm_head, mlm_logits


def test_requests_never_load_models_or_tokenizers(client, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model or tokenizer was loaded on the request path")

    for cls in (transformers.AutoModelForMaskedLM, transformers.AutoTokenizer):
        monkeypatch.setattr(cls, "from_pretrained", refuse)
    text = "Paris is the [MASK] of France."
    for _ in range(2):
        assert client.predict(text, 3, api_name="/fill_mask")[1]
        client.predict(text, 2, api_name="/fill_jointly")


def test_attention_reuses_one_eager_twin_per_model(tiny_bert):
    from bertdemo.attention_views import eager_twin

    assert eager_twin(tiny_bert.model) is eager_twin(tiny_bert.model)


def test_prediction_path_stays_on_sdpa(tiny_bert):
    bertdemo.attention(tiny_bert, "Paris is the [MASK] of France.")
    assert tiny_bert.model.config._attn_implementation == "sdpa"


# ---------------------------------------------------------------- the LM head at a few rows

@pytest.mark.parametrize("arch", ["tiny_bert", "tiny_roberta", "tiny_distilbert"])
def test_head_at_rows_equals_the_models_own_forward(arch, request):
    lm = request.getfixturevalue(arch)
    texts = [f"Paris is the {lm.mask_token} of France.", f"The {lm.mask_token} tower is a {lm.mask_token}."]
    inputs = lm.tokenizer(texts, return_tensors="pt", padding=True)
    with torch.inference_mode():
        full = lm.model(**inputs).logits  # (B, T, V): the (B, T, H) path, F.linear as transformers runs it
        for n in (1, 2, 3, 16):
            rows = torch.arange(n) % len(texts)
            cols = torch.arange(n) % inputs["input_ids"].shape[1]
            logits, _ = mlm_logits(lm.model, inputs, rows, cols)
            assert type(lm.model.get_output_embeddings()) is RowsLinear
            assert logits.is_contiguous() and logits.shape == (n, lm.model.config.vocab_size)
            torch.testing.assert_close(logits, full[rows, cols], atol=1e-5, rtol=0)


@pytest.mark.parametrize("bias", [True, False])
def test_rows_linear_values_and_gradients_equal_linear(bias):
    torch.manual_seed(0)
    plain = torch.nn.Linear(48, 700, bias=bias)
    fast = copy.deepcopy(plain)
    fast.__class__ = RowsLinear
    for n in (1, 3, 40):
        x = torch.randn(n, 48, requires_grad=True)
        x_ref = x.detach().clone().requires_grad_()
        out, ref = fast(x), plain(x_ref)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        grad = torch.randn_like(ref)
        out.backward(grad)
        ref.backward(grad)
        torch.testing.assert_close(x.grad, x_ref.grad, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(fast.weight.grad, plain.weight.grad, atol=1e-5, rtol=1e-5)
        if bias:
            torch.testing.assert_close(fast.bias.grad, plain.bias.grad, atol=1e-5, rtol=1e-5)


def test_fast_decoder_keeps_weights_tied_and_state_dict(tiny_bert):
    mlm_head(tiny_bert.model)
    decoder = tiny_bert.model.get_output_embeddings()
    assert type(decoder) is RowsLinear
    assert decoder.weight is tiny_bert.model.get_input_embeddings().weight  # still tied
    fresh = type(tiny_bert.model)(tiny_bert.model.config)  # what save_pretrained writes is unchanged
    assert list(tiny_bert.model.state_dict()) == list(fresh.state_dict())


# ---------------------------------------------------------------- Predict = fill_mask + fill_jointly

def _count_forwards(lm):
    calls = []
    return calls, lm.model.base_model.register_forward_hook(lambda m, i, o: calls.append(1))


@pytest.mark.parametrize("text, steps", [("the [MASK] of paris is a tower in france .", 1),
                                         ("a [MASK] tower is in the [MASK] of berlin .", 2)])
def test_joint_fill_reuses_the_fill_mask_forward(tiny_bert, text, steps):
    # Sentences no other test predicts, so nothing is remembered for them yet.
    calls, hook = _count_forwards(tiny_bert)
    try:
        alone = bertdemo.fill_jointly(tiny_bert, text, 3)
        assert len(calls) == steps
        bertdemo.fill_mask(tiny_bert, text, 5)  # what the page runs first on Predict
        calls.clear()
        after = bertdemo.fill_jointly(tiny_bert, text, 3)
        assert len(calls) == steps - 1  # the first step came from fill_mask's forward
        calls.clear()
        bertdemo.fill_jointly(tiny_bert, text.replace("tower", "city"), 3)
        assert len(calls) == steps  # another sentence: computed
    finally:
        hook.remove()
    assert [r["text"] for r in after] == [r["text"] for r in alone]
    assert [[f["token_id"] for f in r["fills"]] for r in after] == [[f["token_id"] for f in r["fills"]] for r in alone]
    assert [r["log_prob"] for r in after] == pytest.approx([r["log_prob"] for r in alone], abs=1e-5)
