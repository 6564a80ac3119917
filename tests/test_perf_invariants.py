"""Cheap guards for the speed levers the benchmarks rely on (bench/ measures the speed itself)."""
import transformers

import bertdemo


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
