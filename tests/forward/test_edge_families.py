"""The edge families: Funnel (pools its sequence), ConvBERT and FNet (their output depends on the
padding after a sentence), Nystromformer with full attention (a convolution over its values sees
the padding) and with fewer landmarks than positions (its forward takes one length only). Every
answer in a batch equals the answer alone, the reference being the model's own forward, loaded
afresh by transformers, on that one sentence."""
import functools

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForMaskedLM

import bertdemo
import tiny_models
from bertdemo.forward import anatomy
from bertdemo.views import corpus_search, embeddings
from bertdemo.views.fillmask import encode, fill_encoded

SHORT = "The cat sat on the [MASK]."
LONGER = "We went to the river bank and the [MASK] sat on a very old and very green bench."
TEXTS = ["The cat sat.", "A cat ran in the park today.", "The dog sat on the mat."]
_COMMON = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
               max_position_embeddings=64, initializer_range=0.2)
EDGE = {  # name: (model type, what its tiny config needs beyond the common one; None: unset)
    "funnel": ("funnel", dict(block_sizes=[1, 1], d_model=32, n_head=2, d_head=16, d_inner=64,
                              num_hidden_layers=None)),
    "convbert": ("convbert", {}),
    "fnet": ("fnet", {}),
    "nystromformer": ("nystromformer", {}),  # as many landmarks as positions: full attention
    "nystromformer-landmarks": ("nystromformer", dict(num_landmarks=8)),  # 8 for 64: takes 64 tokens
}


@functools.cache
def _folder(name: str, root: str) -> str:
    model_type, extra = EDGE[name]
    tok = tiny_models.bert_tokenizer()
    settings = {k: v for k, v in (_COMMON | extra).items() if v is not None}
    config = AutoConfig.for_model(model_type, vocab_size=len(tok), pad_token_id=tok.pad_token_id, **settings)
    torch.manual_seed(0)
    return str(tiny_models._save(AutoModelForMaskedLM.from_config(config), tok, f"{root}/{name}"))


@pytest.fixture(scope="module", params=list(EDGE))
def edge(request, tmp_path_factory):
    """(name, folder, the model as bertdemo loads it, the reference: transformers' own, no hooks)."""
    folder = _folder(request.param, str(tmp_path_factory.getbasetemp()))
    return request.param, folder, bertdemo.load(folder), AutoModelForMaskedLM.from_pretrained(folder).eval()


def alone(lm, reference, ids: list[int], **kwargs):
    """The reference's forward on one sentence; for a model whose forward takes one length, padded
    to it by hand (padding tokens, an additive mask (1, 1, 1, length) on them, as transformers 4
    extended it) and cut back."""
    fixed = anatomy.of(reference).fixed_length
    length = len(ids)
    inputs = {"input_ids": torch.tensor([ids + [lm.tokenizer.pad_token_id] * ((fixed or length) - length)])}
    if fixed:
        keep = (torch.arange(fixed) < length).float()[None, None, None, :]
        inputs["attention_mask"] = (1.0 - keep) * torch.finfo(torch.float32).min
    with torch.no_grad():
        return reference(**inputs, **kwargs), length


def test_fill_mask_in_a_padded_batch_equals_the_sentence_alone(edge):
    """What the micro-batcher runs (`fill_encoded` on the requests together) equals the model's own
    forward on each sentence alone."""
    _, _, lm, reference = edge
    together = fill_encoded(lm, [encode(lm, SHORT), encode(lm, LONGER), encode(lm, SHORT + " Yes.")], [5] * 3)
    for text, answer in zip([SHORT, LONGER, SHORT + " Yes."], together):
        enc = encode(lm, text)
        out, _ = alone(lm, reference, enc.input_ids[0].tolist())
        theirs = out.logits[0, enc.mask_positions[0]].softmax(-1).topk(5)
        assert [p["token_id"] for p in answer[0]] == theirs.indices.tolist()
        assert [p["score"] for p in answer[0]] == pytest.approx(theirs.values.tolist(), abs=1e-6)


def test_candidates_scored_together_equal_each_alone(edge):
    _, _, lm, _ = edge
    together = {c["word"]: c["log_prob"] for c in bertdemo.score_candidates(lm, SHORT, ["mat", "old bench", "dog"])}
    for word, log_prob in together.items():
        assert bertdemo.score_candidates(lm, SHORT, [word])[0]["log_prob"] == pytest.approx(log_prob, abs=1e-5)


def _per_token_layers(lm, reference) -> list[int]:
    out, length = alone(lm, reference, lm.tokenizer(TEXTS[0])["input_ids"], output_hidden_states=True)
    states = out.hidden_states[:embeddings.layer_count(lm) + 1]
    return [layer for layer, h in enumerate(states) if h.shape[1] >= length]


def test_the_embedding_maps_states_equal_each_sentence_alone(edge):
    name, _, lm, reference = edge
    for layer in _per_token_layers(lm, reference):
        encoded = embeddings.encode(lm, TEXTS, layer)
        for text, states in zip(TEXTS, encoded.states):
            out, length = alone(lm, reference, lm.tokenizer(text)["input_ids"], output_hidden_states=True)
            np.testing.assert_allclose(states, out.hidden_states[layer][0, :length].numpy(), atol=1e-5, rtol=0)
    assert bertdemo.embedding_map(lm, TEXTS, layer=1, word="cat")["points"]


def test_funnels_pooled_layer_is_refused_in_words_and_its_probes_answer(edge):
    name, _, lm, reference = edge
    if name != "funnel":
        pytest.skip("Funnel only")
    with pytest.raises(ValueError, match="pooled sequence .* choose layer 0 or 1"):
        bertdemo.embedding_map(lm, TEXTS, layer=2)
    for view in (lambda: bertdemo.layer_predictions(lm, SHORT), lambda: corpus_search._hidden_states(lm, [[2, 3]])):
        with pytest.raises(ValueError, match="pools the sequence"):
            view()


def test_the_probes_pool_each_text_as_it_is_alone(edge):
    """Every hidden state's mean over the text's tokens (Funnel's pooled layer and its decoder's
    layers too), as the model gives them for the text alone; the probes answer on every family,
    one per hidden state."""
    _, _, lm, reference = edge
    ours = embeddings.pooled(lm, TEXTS)  # (N, S, H)
    for text, row in zip(TEXTS, ours):
        out, length = alone(lm, reference, lm.tokenizer(text)["input_ids"], output_hidden_states=True)
        states = out.hidden_states
        assert ours.shape[1] == len(states) >= embeddings.layer_count(lm) + 1
        means = [h[0, :length].mean(0) if h.shape[1] >= length else h[0].mean(0) for h in states]
        np.testing.assert_allclose(row, torch.stack(means).numpy(), atol=1e-5, rtol=0)
    examples = [(f"{w} is here today.", "animal" if w in ("cat", "dog") else "place")
                for w in ("cat", "dog", "park", "river") for _ in range(3)]
    assert len(bertdemo.probe_layers(lm, examples)["layers"]) == ours.shape[1]


def test_the_search_index_states_equal_each_line_alone(edge):
    name, _, lm, reference = edge
    if name == "funnel":
        pytest.skip("refused in words (test above)")
    ids = [lm.tokenizer(text)["input_ids"] for text in TEXTS]
    together = corpus_search._hidden_states(lm, ids)  # (L+1, B, T, H)
    for row, line in enumerate(ids):
        out, length = alone(lm, reference, line, output_hidden_states=True)
        torch.testing.assert_close(together[:, row, :length], torch.stack(out.hidden_states)[:, 0, :length],
                                   atol=1e-5, rtol=0)


def test_the_features_batches_never_pad_a_padding_sensitive_family(edge):
    from bertdemo.features.data import Lines

    _, _, lm, _ = edge
    lines = Lines(lm, TEXTS * 4)
    for batch in lines.batches(lm, batch_tokens=256, endless=False):
        assert bool(batch.inputs["attention_mask"].all())  # one length per batch: no padding


def test_nystromformers_landmarks_pad_every_input_and_say_what_they_cannot_do(edge):
    name, _, lm, _ = edge
    if name != "nystromformer-landmarks":
        pytest.skip("Nystromformer with fewer landmarks than positions only")
    assert anatomy.of(lm.model).fixed_length == 64 and lm.max_length == 64
    assert bertdemo.fill_mask(lm, SHORT) and bertdemo.fill_jointly(lm, "The [MASK] sat on the [MASK].")
    with pytest.raises(ValueError, match="at most 64"):
        bertdemo.fill_mask(lm, " ".join(["cat"] * 70) + " [MASK].")
    with pytest.raises(ValueError, match="Nystrom approximation"):
        bertdemo.attention(lm, SHORT)
    with pytest.raises(ValueError, match="padded to 64 positions"):
        from bertdemo.forward import splice
        splice.layer_count(lm.model)
    assert "no attention weights" in anatomy.views_line(lm.model)


def test_the_app_loads_each_edge_family_as_its_model(edge):
    """What `python app.py --model FOLDER` does before it serves: load and warm up the model."""
    import app
    from bertdemo.config import Settings

    _, folder, _, _ = edge
    engine = bertdemo.Engine()
    store = app.load_store(Settings(model=folder, device="cpu"), engine)
    assert store.load_error is None and store.base is not None
    assert bertdemo.fill_mask(store.base, SHORT)


@pytest.mark.slow
def test_python_app_py_starts_on_a_nystromformer_with_landmarks(tmp_path):
    import os

    from gradio_client import Client

    from test_hub import start_app, stop

    folder = _folder("nystromformer-landmarks", str(tmp_path))
    proc, url = start_app(["--model", folder, "--device", "cpu"], dict(os.environ))
    try:
        _, raw, _ = Client(url, verbose=False).predict(SHORT, 5, api_name="/fill_mask")
    finally:
        stop(proc)
    assert raw == bertdemo.fill_mask(bertdemo.load(folder), SHORT, 5)
