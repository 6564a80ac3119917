"""The fill-mask forward through ONNX Runtime (bertdemo/forward/onnx_engine.py): the same predictions as
pipeline("fill-mask"), never served from weights that changed since the export, exported once
per weights, and out of the way when a view needs the model's own modules (heads switched off)."""
import copy

import pytest
import torch
from transformers import pipeline

import bertdemo
from bertdemo.views import fillmask
from bertdemo.forward import onnx_engine
from bertdemo.model.digest import model_digest

pytestmark = pytest.mark.skipif(not onnx_engine.available(), reason="onnxruntime is not installed")

TEXTS = ["paris is the [MASK] of france .", "the [MASK] tower is a famous [MASK] in paris ."]


@pytest.fixture(scope="module")
def served(tiny_bert_dir):
    """A tiny BERT served by an engine of its own with the ONNX forward on, once it is ready."""
    engine = bertdemo.Engine(onnx=True)
    lm = engine.load_allowed(str(tiny_bert_dir), [str(tiny_bert_dir)], device="cpu")
    assert engine.onnx_ready(lm, timeout=120), "the ONNX Runtime forward was not built"
    return lm


def assert_same_predictions(ours, reference, atol=1e-5):
    assert [[p["token_id"] for p in mask] for mask in ours] == [[p["token_id"] for p in mask] for mask in reference]
    for mine, theirs in zip(ours, reference):
        torch.testing.assert_close(torch.tensor([p["score"] for p in mine]),
                                   torch.tensor([p["score"] for p in theirs]), atol=atol, rtol=0)


@pytest.mark.parametrize("text", TEXTS)
def test_fill_mask_through_onnx_runtime_equals_the_pipeline(served, text):
    fill = pipeline("fill-mask", model=served.model, tokenizer=served.tokenizer, device="cpu")
    reference = fill(text, top_k=5)
    reference = [reference] if isinstance(reference[0], dict) else reference
    ours = bertdemo.fill_mask(served, text, top_k=5)
    assert_same_predictions(ours, [[{"token_id": r["token"], "score": r["score"]} for r in mask] for mask in reference])


def test_a_padded_crowd_through_onnx_runtime_equals_one_at_a_time(served):
    encs = [fillmask.encode(served, t) for t in TEXTS]
    together = fillmask.fill_encoded(served, encs, [5, 5])
    for enc, alone in zip(encs, together):
        assert_same_predictions(fillmask.fill_encoded(served, [enc], [5])[0], alone)


def test_both_forwards_give_the_same_logits_on_the_padded_crowd_they_are_timed_on(served):
    inputs, rows, cols = onnx_engine.example_batch(4, 12, served.model.config.vocab_size)
    fast = served.caches.onnx_for(served.model)
    torch_forward = bertdemo.Engine(onnx=False).torch_forward(served.model)
    torch.testing.assert_close(fast.logits(inputs, rows, cols), torch_forward(inputs, rows, cols), atol=1e-4, rtol=0)


def test_the_onnx_forward_is_what_serves(served, monkeypatch):
    calls = []
    fast = served.caches.onnx_for(served.model)
    original = type(fast).logits
    monkeypatch.setattr(type(fast), "logits", lambda self, *a: calls.append(1) or original(self, *a))
    bertdemo.fill_mask(served, TEXTS[0])
    assert calls == [1]


def test_a_crowd_of_many_tokens_takes_the_lean_torch_forward_with_the_same_results(served, monkeypatch):
    """Short sentences alone run through ONNX Runtime; a crowd of `MOST_TOKENS` token slots or more
    is bound by arithmetic and takes the lean torch forward (padding skipped): same predictions."""
    texts = [f"{t} {w}" for w in ("one", "two", "three", "four") for t in TEXTS]
    encs = [fillmask.encode(served, t) for t in texts]
    assert len(encs) * max(len(e.key) for e in encs) >= onnx_engine.MOST_TOKENS > len(encs[0].key)
    calls = []
    fast = served.caches.onnx_for(served.model)
    original = type(fast).logits
    monkeypatch.setattr(type(fast), "logits", lambda self, *a: calls.append(len(a[0]["input_ids"])) or original(self, *a))
    together = fillmask.fill_encoded(served, encs, [5] * len(encs))
    assert calls == []  # the crowd: torch
    for enc, crowd in zip(encs, together):
        assert_same_predictions(fillmask.fill_encoded(served, [enc], [5])[0], crowd)
    assert calls == [1] * len(encs)  # each alone: ONNX Runtime


def test_a_weight_changed_after_the_export_is_never_served_stale(tiny_bert_dir):
    engine = bertdemo.Engine(onnx=True)
    lm = engine.load(str(tiny_bert_dir), device="cpu")
    lm = dataclass_copy(lm)  # a model of its own: this test changes its weights
    engine.caches.set_onnx(lm.model, onnx_engine.OnnxMaskedLM.build(lm.model, export_path(lm)))
    before = bertdemo.fill_mask(lm, TEXTS[0])
    with torch.no_grad():
        lm.model.base_model.encoder.layer[0].output.dense.weight.mul_(3)  # trained in place, say
    assert engine.caches.onnx_for(lm.model) is None
    after = bertdemo.fill_mask(lm, TEXTS[0])
    fill = pipeline("fill-mask", model=lm.model, tokenizer=lm.tokenizer, device="cpu")
    reference = fill(TEXTS[0], top_k=5)
    assert [p["token_id"] for p in after[0]] == [r["token"] for r in reference]
    assert [p["score"] for p in after[0]] != [p["score"] for p in before[0]]


def dataclass_copy(lm):
    import dataclasses

    return dataclasses.replace(lm, model=copy.deepcopy(lm.model))


def export_path(lm, folder=None):
    return onnx_engine.export_path(lm.model, model_digest(lm), folder)


def test_an_export_is_made_once_per_weights(tiny_bert, tmp_path, monkeypatch):
    lm = dataclass_copy(tiny_bert)
    onnx_engine.OnnxMaskedLM.build(lm.model, export_path(lm, tmp_path))
    assert len(list(tmp_path.glob("*.onnx"))) == 1
    monkeypatch.setattr(onnx_engine, "export", lambda *a: pytest.fail("exported twice"))
    again = dataclass_copy(lm)  # same weights: the kept file
    onnx_engine.OnnxMaskedLM.build(again.model, export_path(again, tmp_path))
    with torch.no_grad():
        lm.model.cls.predictions.bias.add_(1)
    assert export_path(lm, tmp_path) != export_path(tiny_bert, tmp_path)  # changed weights: another export


def test_an_export_a_stop_cuts_short_is_logged_as_stopped_not_as_a_failure(tiny_bert_dir, monkeypatch, caplog):
    """A stop removes the export's temporary folder under it (disk.remove_own), so the export then
    fails to find its files: one line saying the stop ended it, no ERROR and no traceback. The same
    failure with no stop is an error, with its traceback."""
    import logging
    import threading

    def build_until_stopped(model, path, threads=None):
        stopped.wait(10)
        raise FileNotFoundError(f"{path}: removed under the export")
    monkeypatch.setattr(onnx_engine.OnnxMaskedLM, "build", build_until_stopped)
    for stop in (True, False):
        stopped = threading.Event()
        engine = bertdemo.Engine(onnx=True)
        lm = engine.load(str(tiny_bert_dir), device="cpu")
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="bertdemo"):
            engine._build_onnx(lm)
            if stop:
                assert [f"the ONNX export of {lm.model.name_or_path}"] == engine.stop_background()[:1]
            stopped.set()
            assert not engine.onnx_ready(lm, timeout=10)
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        if stop:
            assert not errors and any("ended by the stop" in r.getMessage() for r in caplog.records)
        else:
            assert len(errors) == 1 and errors[0].exc_info and "export failed" in errors[0].getMessage()


def test_heads_switched_off_take_the_models_own_modules(served):
    view = bertdemo.heads_off(served, [(0, 0)])
    expected = bertdemo.heads_off(dataclass_without_onnx(served), [(0, 0)])
    assert_same_predictions(bertdemo.fill_mask(view, TEXTS[0]), bertdemo.fill_mask(expected, TEXTS[0]))
    assert bertdemo.fill_mask(view, TEXTS[0]) != bertdemo.fill_mask(served, TEXTS[0])


def dataclass_without_onnx(lm):
    import dataclasses

    from bertdemo.model.caches import ModelCaches

    return dataclasses.replace(lm, caches=ModelCaches())


def test_models_it_cannot_run_are_refused_with_a_reason(tiny_distilbert):
    with pytest.raises(ValueError, match="BERT-family"):
        onnx_engine.OnnxMaskedLM.build(tiny_distilbert.model, export_path(tiny_distilbert))


@pytest.mark.slow
def test_the_app_serves_fill_mask_through_onnx_runtime(tiny_bert_dir):
    """`python app.py` (here in-process) with its default --onnx: once the export is ready, the
    page's fill-mask comes from ONNX Runtime and equals the pipeline's."""
    from gradio_client import Client

    import app
    from bertdemo.ui.serving import lifecycle

    engine = bertdemo.Engine(onnx=True)
    from test_mcp import free_port

    settings = app.parse_args(["--model", str(tiny_bert_dir), "--device", "cpu", "--onnx", "--port", str(free_port())])
    demo = app.build_demo(settings, engine=engine)
    url, _ = lifecycle.serve(demo, settings, block=False)
    try:
        lm = engine.load(str(tiny_bert_dir), device="cpu")  # the object the app serves
        assert engine.onnx_ready(lm, timeout=120)
        _plot, predictions, _line = Client(url, verbose=False).predict(TEXTS[0], 5, api_name="/fill_mask")
        fill = pipeline("fill-mask", model=lm.model, tokenizer=lm.tokenizer, device="cpu")
        reference = [[{"token_id": r["token"], "score": r["score"]} for r in fill(TEXTS[0], top_k=5)]]
        assert_same_predictions(predictions, reference)
    finally:
        demo.close()


def test_by_default_both_forwards_are_timed_the_table_logged_and_predictions_unchanged(tiny_bert_dir, monkeypatch,
                                                                                      caplog):
    """The app's default (neither --onnx nor --no-onnx): before the ONNX Runtime forward serves,
    both forwards are timed on the shapes that matter and the table is logged; whichever serves a
    batch, the predictions are the pipeline's."""
    import logging

    monkeypatch.setattr(onnx_engine, "MEASURE_S", 0.2)  # the decision is tested in test_onnx_crossover.py
    caplog.set_level(logging.INFO, logger="bertdemo")
    engine = bertdemo.Engine(onnx=None)
    lm = engine.load_allowed(str(tiny_bert_dir), [str(tiny_bert_dir)], device="cpu")
    assert engine.onnx_ready(lm, timeout=120)
    crossover = lm.caches.onnx_for(lm.model).crossover
    assert crossover is not None and crossover.threads == torch.get_num_threads()
    assert set(crossover.timings) == set(onnx_engine.shapes_to_time(lm.model.config.max_position_embeddings))
    assert "ONNX Runtime or torch for" in caplog.text and "token slots" in caplog.text
    fill = pipeline("fill-mask", model=lm.model, tokenizer=lm.tokenizer, device="cpu")
    for text in TEXTS:
        reference = fill(text, top_k=5)
        reference = [reference] if isinstance(reference[0], dict) else reference
        assert_same_predictions(bertdemo.fill_mask(lm, text, top_k=5),
                                [[{"token_id": r["token"], "score": r["score"]} for r in mask] for mask in reference])
