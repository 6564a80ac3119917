"""Which forward serves a fill-mask batch, ONNX Runtime or the lean torch forward, decided from
timings of both on this machine (bertdemo/forward/onnx_engine.py `Crossover`): fake timings here, so
what is tested is the decision, never the machine's speed."""
import threading

import pytest
import torch

from bertdemo.forward import onnx_engine
from bertdemo.forward.onnx_engine import Crossover, OnnxMaskedLM

THREADS = torch.get_num_threads()


def timings(onnx_ms: dict, torch_ms: dict) -> dict:
    return {shape: {"onnx": onnx_ms[shape] / 1e3, "torch": torch_ms[shape] / 1e3} for shape in onnx_ms}


# an Intel Xeon (2 vCPUs, bert-base): ONNX Runtime faster for short sentences and small crowds
XEON = timings({(1, 12): 30, (1, 32): 45, (1, 64): 65, (1, 128): 106, (4, 12): 55, (8, 12): 90, (16, 12): 158},
               {(1, 12): 38, (1, 32): 52, (1, 64): 73, (1, 128): 106, (4, 12): 59, (8, 12): 86, (16, 12): 132})
# an AMD EPYC: one sentence no faster through ONNX Runtime, a crowd slower
EPYC = timings({(1, 12): 33, (1, 32): 47, (1, 64): 70, (1, 128): 110, (4, 12): 70, (8, 12): 120, (16, 12): 200},
               {(1, 12): 33, (1, 32): 46, (1, 64): 66, (1, 128): 100, (4, 12): 55, (8, 12): 85, (16, 12): 140})


def test_each_shape_goes_to_the_forward_measured_faster_for_it():
    xeon = Crossover.decide(XEON, THREADS)
    assert (xeon.single_tokens, xeon.crowd_slots) == (128, 48)  # 128 tokens: a tie, one sentence's default
    assert xeon.suits(1, 9) and xeon.suits(1, 64) and xeon.suits(1, 100) and not xeon.suits(1, 129)
    assert xeon.suits(4, 12) and xeon.suits(2, 20) and not xeon.suits(8, 12) and not xeon.suits(16, 12)


def test_a_crowd_never_goes_where_onnx_runtime_was_slower():
    epyc = Crossover.decide(EPYC, THREADS)
    assert epyc.crowd_slots == 0
    assert not any(epyc.suits(b, t) for b in (2, 4, 8, 16) for t in (5, 12, 40, 128))
    # one sentence: ties (12 tokens, 32 tokens within the margin) go to ONNX Runtime, 64 tokens
    # where torch was faster by more than the noise does not, nor anything longer
    assert epyc.single_tokens == 32 and not epyc.suits(1, 33) and not epyc.suits(1, 128)


def test_within_the_noise_each_kind_keeps_its_default_and_nothing_follows_a_loss():
    close = timings({(1, 12): 30.5, (1, 32): 40, (1, 64): 70, (1, 128): 100, (4, 12): 59, (8, 12): 60},
                    {(1, 12): 30.0, (1, 32): 50, (1, 64): 60, (1, 128): 150, (4, 12): 60, (8, 12): 70})
    decided = Crossover.decide(close, THREADS)
    # one sentence: 12 tokens 1.7% slower through ONNX Runtime, within the margin: its default;
    # 64 tokens torch clearly faster, so 128 after it is not taken either
    assert decided.single_tokens == 32 and not decided.suits(1, 64)
    # a crowd: 4 x 12 1.7% faster through ONNX Runtime, within the margin: torch, its default
    assert decided.crowd_slots == 0
    bumpy = timings({(4, 12): 50, (8, 12): 80, (16, 12): 100}, {(4, 12): 60, (8, 12): 70, (16, 12): 140})
    assert Crossover.decide(bumpy, THREADS).crowd_slots == 48  # the 16 x 12 win is past a loss


def test_beyond_the_largest_shape_timed_torch_serves():
    always = timings({(1, 12): 10, (1, 32): 10, (4, 12): 10}, {(1, 12): 50, (1, 32): 50, (4, 12): 50})
    decided = Crossover.decide(always, THREADS)
    assert decided.suits(1, 32) and not decided.suits(1, 33)
    assert decided.suits(4, 12) and not decided.suits(4, 13) and not decided.suits(16, 12)


def test_the_table_for_the_log_says_each_shape_and_its_forward():
    table = Crossover.decide(XEON, THREADS).table()
    assert "up to 128 tokens" in table and "up to 48 token slots" in table
    assert "4 x 12: ONNX Runtime 55.0 ms, torch 59.0 ms -> ONNX Runtime" in table
    assert "16 x 12: ONNX Runtime 158.0 ms, torch 132.0 ms -> torch" in table


def test_timing_takes_each_forwards_best_call_within_the_budget():
    now, order = [0.0], []
    # a first round to warm up (0.001 s: would be the best if it counted), then rounds timed
    costs = {"onnx": iter([0.001, 5.0, 0.030, 0.020, 0.001]), "torch": iter([0.001, 5.0, 0.040, 0.050, 0.001])}

    def run(name):
        return lambda batch, length: (order.append(name), now.__setitem__(0, now[0] + next(costs[name])))

    got = onnx_engine.time_forwards({"onnx": run("onnx"), "torch": run("torch")}, [(1, 12)], budget_s=10.082,
                                    clock=lambda: now[0])
    # the warm-up round does not count; of the timed ones the first calls (5 s each: still cold)
    # are not the best; the budget is spent after the third timed round
    assert got == {(1, 12): {"onnx": pytest.approx(0.020), "torch": pytest.approx(0.040)}}
    assert order == ["onnx", "torch", "torch", "onnx", "onnx", "torch", "torch", "onnx"]  # each in turn first


def test_timing_runs_a_round_to_warm_up_and_two_timed_rounds_even_past_the_budget():
    now = [0.0]
    calls = []

    def run(batch, length):
        calls.append((batch, length))
        now[0] += 1.0

    onnx_engine.time_forwards({"onnx": run, "torch": run}, [(1, 12), (4, 12)], budget_s=0.5, clock=lambda: now[0])
    assert len(calls) == 3 * 2 * 2  # warm-up + 2 timed rounds of 2 shapes x 2 forwards


def test_the_shapes_timed_stay_within_the_models_length():
    assert onnx_engine.shapes_to_time(512) == [(1, 12), (1, 32), (1, 64), (4, 12), (8, 12)]
    assert onnx_engine.shapes_to_time(40) == [(1, 12), (1, 32), (4, 12), (8, 12)]


def test_the_crowds_timed_are_short_sentences_of_different_lengths_padded_as_served():
    """ONNX Runtime computes the padding, the lean torch forward skips it: a crowd timed without
    padding would send real crowds to the slower forward."""
    inputs, rows, cols = onnx_engine.example_batch(4, 12, 30522)
    real = inputs["attention_mask"].sum(1)
    assert real.tolist() == [12, 11, 10, 9]
    assert (inputs["input_ids"][inputs["attention_mask"] == 0] == 0).all()  # padding is padding
    assert rows.tolist() == [0, 1, 2, 3] and (cols < real).all()  # each mask on a real token
    alone, _, at = onnx_engine.example_batch(1, 12, 30522)
    assert alone["attention_mask"].sum() == 12 and at.tolist() == [6]  # one sentence: no padding


def encoder_measured(crossover: Crossover | None) -> OnnxMaskedLM:
    """An ONNX forward whose session is never run here: only its choice is."""
    encoder = OnnxMaskedLM(torch.nn.Linear(2, 2), session=None, threads=THREADS)
    encoder.crossover = crossover
    encoder._torch_forward = (lambda *a: None) if crossover is not None else None
    return encoder


def batch(b: int, t: int) -> dict:
    return {"input_ids": torch.zeros(b, t, dtype=torch.long)}


def test_unmeasured_the_fixed_number_of_token_slots_decides():
    encoder = encoder_measured(None)  # --onnx: not measured
    assert encoder.suits(batch(1, 40)) and encoder.suits(batch(4, 12))
    assert not encoder.suits(batch(8, 12)) and not encoder.suits(batch(1, onnx_engine.MOST_TOKENS))


def test_measured_the_crossover_decides(monkeypatch):
    encoder = encoder_measured(Crossover.decide(EPYC, THREADS))
    monkeypatch.setattr(encoder, "_measure_again", lambda: (_ for _ in ()).throw(AssertionError("measured again")))
    assert encoder.suits(batch(1, 12)) and not encoder.suits(batch(1, 64)) and not encoder.suits(batch(4, 12))
    encoder.crossover = Crossover.decide(XEON, THREADS)
    assert encoder.suits(batch(1, 12)) and encoder.suits(batch(4, 12)) and not encoder.suits(batch(16, 12))


def test_another_thread_count_is_measured_again_and_torch_serves_meanwhile(monkeypatch):
    encoder = encoder_measured(Crossover.decide(XEON, THREADS))
    started, release = threading.Event(), threading.Event()
    calls = []

    def measure(torch_forward, budget_s=None):
        calls.append(torch_forward)
        started.set()
        release.wait(10)
        encoder.crossover = Crossover.decide(XEON, THREADS + 1)

    monkeypatch.setattr(encoder, "measure", measure)
    monkeypatch.setattr(torch, "get_num_threads", lambda: THREADS + 1)
    assert not encoder.suits(batch(1, 12))  # torch, while both are timed again
    assert started.wait(10)
    assert not encoder.suits(batch(1, 12)) and len(calls) == 1  # once at a time
    release.set()
    deadline = threading.Event()
    while encoder._measuring and not deadline.wait(0.01):
        pass
    assert encoder.suits(batch(1, 12)) and len(calls) == 1
