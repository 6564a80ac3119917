"""Which precision serves a model on this CPU, picked by timing both (`--dtype auto`).

A crowd of short sentences is bound by arithmetic (measured on an Intel Xeon with AMX, 2 vCPUs,
bert-base, 16 sentences of 9-12 tokens: float32 200-227 ms, bfloat16 94-100 ms; one sentence 38 ms
either way, bound by reading the weights), so where the CPU multiplies bfloat16 natively (AVX512-BF16,
AMX) bfloat16 weights serve a crowd about twice as fast; where it does not, bfloat16 is slower (an
AVX2 EPYC: 1.2-1.7x). Fidelity (bench/bench_bf16.py): on the bundled model top-1 agrees with
float32 on 24 of 24 sentences and no probability moves by more than 0.0064. So `auto` times the
model's own forward in both precisions, on a crowd and on one sentence, and takes bfloat16 only
where it wins the crowd clearly and loses nothing on one sentence. Measured, not read from the
CPU's flags: the same flags give different ratios on different machines and models (a tiny model
is bound by Python's overhead, not by the products).
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch

from ..forward import anatomy, lean_forward
from .logits import mlm_logits

AUTO = "auto"
CROWD_GAIN = 1.25  # bfloat16 must serve the crowd at least this much faster (timings' noise ~5-10%)
ONE_LOSS = 0.95  # and one sentence at no less than this share of float32's speed (a tie, within noise)


@dataclass(frozen=True)
class Precision:
    """The precision picked and why: the two speed-ups measured (float32 time / bfloat16 time;
    0 when not measured) and a sentence for the model card."""

    dtype: torch.dtype
    crowd_gain: float = 0.0
    one_gain: float = 0.0
    why: str = ""


def native_bf16() -> bool:
    """Whether this CPU's oneDNN multiplies bfloat16 natively (AVX512-BF16 or AMX)."""
    return lean_forward.packs_bf16()


def pick(model, device: torch.device, seconds: float = 1.5) -> Precision:
    """float32 or bfloat16 for serving `model` (a float32 *ForMaskedLM, eval, on `device`):
    bfloat16 only on a CPU with native bfloat16, for a family the lean forward serves, when
    `timed` says it wins. Costs a bfloat16 copy while timing and ~`seconds`."""
    if device.type != "cpu":
        return Precision(torch.float32, why="float32: on a GPU the app keeps float32 weights")
    if not native_bf16():
        return Precision(torch.float32, why="float32: this CPU has no native bfloat16 products")
    if not anatomy.of(model).lean:
        return Precision(torch.float32, why="float32: this family's forward is not timed in bfloat16")
    crowd_gain, one_gain = timed(model, seconds)
    chosen = torch.bfloat16 if crowd_gain >= CROWD_GAIN and one_gain >= ONE_LOSS else torch.float32
    name = str(chosen).removeprefix("torch.")
    return Precision(chosen, crowd_gain, one_gain,
                     f"{name}, picked on this CPU by timing both: bfloat16 served 8 short sentences "
                     f"{crowd_gain:.2f}x and one {one_gain:.2f}x as fast as float32")


def timed(model, seconds: float) -> tuple[float, float]:
    """(float32 time / bfloat16 time) of `model`'s masked-LM forward for a crowd of 8 sentences
    of 12 tokens (B=8, T=12, a mask each) and for one of them: rounds taking turns until
    `seconds` have passed (at least 3), the fastest call of each kept."""
    half = copy.deepcopy(model).to(torch.bfloat16)
    vocab = model.config.vocab_size
    ids = torch.randint(min(1000, vocab - 1), vocab, (8, 12), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": ids.to(model.device), "attention_mask": torch.ones_like(ids).to(model.device)}
    one = {name: value[:1] for name, value in inputs.items()}
    rows, cols = torch.arange(8, device=model.device), torch.full((8,), 5, device=model.device)
    calls = {(m, shape): _call(m, x, r, c) for m in (model, half)
             for shape, x, r, c in (("crowd", inputs, rows, cols), ("one", one, rows[:1], cols[:1]))}
    best = {key: float("inf") for key in calls}
    for call in calls.values():
        call()  # warm up: packs the weights, builds oneDNN's kernels
    end, rounds = time.perf_counter() + seconds, 0
    while rounds < 3 or time.perf_counter() < end:
        for key, call in calls.items():
            start = time.perf_counter()
            call()
            best[key] = min(best[key], time.perf_counter() - start)
        rounds += 1
    return best[model, "crowd"] / best[half, "crowd"], best[model, "one"] / best[half, "one"]


def _call(model, inputs: dict, rows: torch.Tensor, cols: torch.Tensor):
    packed = lean_forward.PackedWeights()  # its own: a served model's caches stay untouched

    @torch.inference_mode()
    def call():
        return mlm_logits(model, inputs, rows, cols, packed=packed)[0]
    return call
