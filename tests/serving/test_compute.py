"""The engine's compute thread (bertdemo/serving/compute.py): every forward the engine runs (a
model's warm-up, the micro-batcher's batches, torch's side of the ONNX Runtime timing) runs on one
thread, whichever of the web server's threads asked, so torch's OpenMP keeps one team of workers;
what a forward raises still reaches the request that caused it."""
import threading

import pytest
import torch

import bertdemo
from bertdemo.forward import onnx_engine
from bertdemo.model import logits
from bertdemo.serving.compute import ComputeThread
from bertdemo.views import fillmask

from test_batching import TEXTS, _poison_on, _run_together


@pytest.fixture
def forward_threads(monkeypatch):
    """`threads(model)`: the thread of every forward of `model` (`logits.mlm_logits`, the one door), as
    it runs. By model: another module's server in the same process may still be finishing its own."""
    seen, real = [], logits.mlm_logits

    def mlm_logits(model, *args, **kwargs):
        seen.append((threading.get_ident(), id(model)))
        return real(model, *args, **kwargs)

    monkeypatch.setattr(logits, "mlm_logits", mlm_logits)
    monkeypatch.setattr(fillmask, "mlm_logits", mlm_logits)
    from bertdemo.model import loading
    monkeypatch.setattr(loading, "mlm_logits", mlm_logits)
    return lambda model: [thread for thread, seen_model in seen if seen_model == id(model)]


def test_the_warm_up_and_every_batch_run_on_one_thread_not_the_callers(tiny_bert_dir, forward_threads):
    engine = bertdemo.Engine(onnx=False)
    lm = engine.load_allowed(str(tiny_bert_dir), [str(tiny_bert_dir)], device="cpu")  # warms up
    callers = set()

    class Batcher:  # the engine's batcher, noting which threads called it
        def fill_mask(self, *args):
            callers.add(threading.get_ident())
            return engine.batcher.fill_mask(*args)

    for _ in range(3):  # several crowds, each request from a thread of its own
        results, errors = _run_together(Batcher(), lm, TEXTS * 2)
        assert errors == [None] * len(results)
    threads = forward_threads(lm.model)
    assert len(threads) >= 4  # the warm-up and at least one forward per crowd
    assert len(set(threads)) == 1
    assert not set(threads) & (callers | {threading.get_ident()})
    for text, result in zip(TEXTS * 2, results):
        assert [[p["token_id"] for p in row] for row in result] == \
               [[p["token_id"] for p in row] for row in bertdemo.fill_mask(lm, text)]


def test_torchs_side_of_the_onnx_runtime_timing_runs_on_the_same_thread(tiny_bert_dir, forward_threads):
    engine = bertdemo.Engine(onnx=False)
    lm = engine.load_allowed(str(tiny_bert_dir), [str(tiny_bert_dir)], device="cpu")
    torch_forward = engine.torch_forward(lm.model)
    engine.batcher.fill_mask(lm, TEXTS[0])
    torch_forward(*onnx_engine.example_batch(4, 12, lm.model.config.vocab_size))
    threads = forward_threads(lm.model)
    assert len(set(threads)) == 1 and len(threads) == 3


def test_a_failing_sentence_still_fails_only_its_caller(tiny_bert_dir, monkeypatch):
    engine = bertdemo.Engine(onnx=False)
    lm = engine.load_allowed(str(tiny_bert_dir), [str(tiny_bert_dir)], device="cpu")
    _poison_on(monkeypatch, lm, "berlin")
    texts = TEXTS[:2] + ["berlin is a [MASK] ."]
    results, errors = _run_together(engine.batcher, lm, texts)
    assert "poisoned" in str(errors[2]) and results[2] is None
    assert errors[:2] == [None, None] and all(results[:2])


def test_a_call_from_the_compute_thread_runs_at_once_and_errors_reach_the_caller():
    compute = ComputeThread()
    inner = compute.run(lambda: compute.run(threading.get_ident))  # would wait on itself if queued
    assert inner == compute.run(threading.get_ident) != threading.get_ident()
    with pytest.raises(ValueError, match="bad input"):
        compute.run(lambda: (_ for _ in ()).throw(ValueError("bad input")))
    assert compute.run(torch.ones(3).sum).item() == 3  # and it serves on after an error
    compute.close()


def test_the_export_runs_on_a_thread_that_has_ended_before_torch_is_timed(tiny_bert_dir, monkeypatch):
    """The export runs the model, which gives its thread an OpenMP team: it must be gone by the
    time torch's forward is timed, or the timing sees torch slower than it serves."""
    seen = {}

    class Encoder:  # stands in for the export's session: only where things ran is tested
        @classmethod
        def build(cls, model, **where):
            seen["export"] = threading.current_thread()
            return cls()

        def measure(self, torch_forward):
            seen["export alive when timed"] = seen["export"].is_alive()

        def matches(self, model):
            return True

    monkeypatch.setattr(onnx_engine, "OnnxMaskedLM", Encoder)
    monkeypatch.setattr(onnx_engine, "available", lambda: True)
    engine = bertdemo.Engine(onnx=None)
    lm = engine.load_allowed(str(tiny_bert_dir), [str(tiny_bert_dir)], device="cpu")
    assert engine.onnx_ready(lm, timeout=30)
    assert seen["export alive when timed"] is False
