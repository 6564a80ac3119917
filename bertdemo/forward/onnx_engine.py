"""The fill-mask forward through ONNX Runtime: a served model exported once, fused by ONNX
Runtime's transformer optimizer, and run with the MLM head at the asked positions only.

Why: on a CPU in float32 a short sentence's forward is bound by reading the weights, and ONNX
Runtime's matrix kernels (MLAS) read them faster than oneDNN's: measured on an AMD EPYC (2 vCPUs),
24 bert-base-sized products at 9 rows 10.4 ms vs 16.1 ms packed for oneDNN, at 128 rows 83 vs
103 ms. The graph is the model's own, exported by `torch.onnx.export`, with its eager attention
(which the optimizer fuses into one Attention op per layer), LayerNorms, GELUs and embeddings
fused, and one change: a gather of the N asked positions (rows[i], cols[i]) before the head, so
the head's (H x V) product runs on N rows, not on B x T.

    path = export_path(lm.model, model_digest(lm))   # named by its weights, config and tokenizer
    encoder = OnnxMaskedLM.build(lm.model, path)     # seconds to a minute: export, fuse, load
    logits = encoder.logits(inputs, rows, cols)      # (N, V) float32, as logits.mlm_logits

It serves what people type one at a time, sentences of a few dozen tokens at most (`suits`):
there a product is bound by reading the weights. Longer sentences and crowds go to the lean torch
forward (`lean_forward`), faster once arithmetic bounds it. Where the two cross depends on the CPU
(an Intel Xeon: 80 token slots; on an AMD EPYC a crowd of 16 short sentences was slower through it),
so a served model's crossover is measured (`measure`, `Crossover`): both forwards timed on one
sentence of a few lengths and on small crowds of short sentences padded as served, a second or two
in the background, and each batch served by the faster for its shape. Unmeasured (`--onnx`), `MOST_TOKENS` decides.

    encoder.measure(torch_forward)               # times both, keeps the `Crossover`, logs its table

Exports are kept on disk (`cache_dir()`) under a key of the config and the weights digest, so a model
is exported once per machine, and a changed weight can never be served from an old export: the
session is tied to the model object and to its parameters' versions (`matches`); a model trained
in place, or a tuned copy, takes the torch path. Only BERT-layout masked LMs (`anatomy`
`lean` families) on a CPU in float32; `build` raises ValueError for anything else.
"""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from .. import disk
from . import anatomy
from .lean_forward import stamp

log = logging.getLogger(__name__)
INPUTS = ("input_ids", "attention_mask", "token_type_ids", "rows", "cols")
MOST_TOKENS = 80  # unmeasured: a batch of this many token slots (padding included) or more takes torch (`suits`)
SINGLE_LENGTHS = (12, 32, 64)  # measured: one sentence of this many tokens ([CLS] and [SEP] included)
# Longer sentences and larger crowds are torch's, untimed (`Crossover`: beyond the table, torch):
# ONNX Runtime never won there (Intel Xeon: 128 tokens a tie, 16 x 12 158 vs 132 ms; AMD EPYC lost
# both), and timing them took half of each round
CROWD_SIZES = (4, 8)  # measured: this many sentences at once (the micro-batcher's crowds) ...
CROWD_LENGTH = 12  # ... padded to this many tokens, short sentences of 9 to 12 (`example_batch`)
MEASURE_S = 2.0  # timing both forwards takes about this long: a round to warm up, at least two timed
MARGIN = 0.03  # ONNX Runtime serves a shape only if measured this much faster than torch there


def available() -> bool:
    """Whether onnxruntime (and onnx, for the export) are installed."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def cache_dir() -> Path:
    """Where exports are kept: $BERTDEMO_ONNX_CACHE, else <the disk cache>/onnx (`disk.folder_of`)."""
    return disk.folder_of("onnx")


def export_path(model: torch.nn.Module, digest: str, folder: Path | None = None) -> Path:
    """Where `model`'s export is kept (in `folder`, default `cache_dir()`), named by `digest`, the
    model's (`bertdemo.model.digest.model_digest`: its weights, config and tokenizer)."""
    return (folder or cache_dir()) / f"{model.config.model_type}-{digest}.onnx"


class _AtPositions(torch.nn.Module):
    """The masked LM with its head at the asked positions only: what gets exported."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.head = anatomy.head_module(model)

    def forward(self, input_ids, attention_mask, token_type_ids, rows, cols):
        hidden = self.model.base_model(input_ids=input_ids, attention_mask=attention_mask,
                                       token_type_ids=token_type_ids).last_hidden_state
        return self.head(hidden[rows, cols])  # (N, V)


def _eager_copy(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with eager attention, sharing its tensors (the optimizer fuses eager attention)."""
    import copy

    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    twin = copy.deepcopy(model, memo=shared)
    twin.set_attn_implementation("eager")
    return twin.eval()


def export(model: torch.nn.Module, path: Path) -> Path:
    """Export `model` (masked LM, eval) with the head at given positions, fuse it with ONNX
    Runtime's BERT optimizer and write it to `path` (written whole, then renamed into place)."""
    from onnxruntime.transformers.optimizer import optimize_model

    path.parent.mkdir(parents=True, exist_ok=True)
    # a temporary name that says whose it is: a start removes it if its writer was killed
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f"{disk.temporary_prefix()}{path.stem}-") as work, \
            _quiet_export():
        raw = Path(work) / "model.onnx"
        # a padded row in the example: the attention mask must be traced as used (with a mask of
        # ones transformers may skip it, and the export would then ignore padding)
        mask = torch.ones(2, 8, dtype=torch.long)
        mask[1, 5:] = 0
        example = {"input_ids": torch.ones(2, 8, dtype=torch.long), "attention_mask": mask,
                   "token_type_ids": torch.zeros(2, 8, dtype=torch.long),
                   "rows": torch.tensor([0, 1, 1]), "cols": torch.tensor([1, 2, 3])}
        axes = {name: {0: "batch", 1: "sequence"} for name in INPUTS[:3]}
        axes.update(rows={0: "asked"}, cols={0: "asked"}, logits={0: "asked"})
        with torch.no_grad():
            torch.onnx.export(_AtPositions(_eager_copy(model)), (), str(raw), kwargs=example,
                              input_names=list(INPUTS), output_names=["logits"], dynamic_axes=axes,
                              opset_version=17, dynamo=False)
        config = model.config
        fused = optimize_model(str(raw), model_type="bert", num_heads=config.num_attention_heads,
                               hidden_size=config.hidden_size, opt_level=1)
        out = Path(work) / "model.opt.onnx"
        fused.save_model_to_file(str(out))
        os.replace(out, path)
        fusions = {op: n for op, n in fused.get_fused_operator_statistics().items() if n}
    log.info("ONNX export %s: %s", path.name, fusions)
    return path


# ONNX Runtime's transformer optimizer logs each fusion at INFO under its modules' bare names
_OPTIMIZER_LOGS = ("fusion_base", "fusion_utils", "onnx_model", "onnx_model_bert", "optimizer")


@contextlib.contextmanager
def _quiet_export():
    """Silence what tracing and fusing a BERT always says, and says to no one who can act on it:
    torch's TracerWarning (transformers' Python branches on shapes, constant for this graph), the
    exporter's note on advanced indexing (our positions are never negative) and the optimizer's
    INFO lines per fusion. Only around the export: anything else still warns."""
    loggers = [logging.getLogger(name) for name in _OPTIMIZER_LOGS]
    levels = [logger.level for logger in loggers]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.onnx")
        for logger in loggers:
            logger.setLevel(logging.WARNING)
        try:
            yield
        finally:
            for logger, level in zip(loggers, levels):
                logger.setLevel(level)


# ---------------------------------------------------------------- which forward, by measurement

Timings = dict  # (batch, length) -> {"onnx": best seconds, "torch": best seconds}


@dataclass(frozen=True)
class Crossover:
    """Which forward serves a batch of (batch, length) on this machine, from timings of both:
    one sentence runs through ONNX Runtime up to `single_tokens` tokens, several at once up to
    `crowd_slots` token slots (batch x padded length); torch beyond. Each limit is the largest
    measured shape up to which every shape went to ONNX Runtime, never more than measured: beyond
    the table, torch, the forward without ONNX Runtime. Where the two are within `MARGIN` of each
    other (the timings' noise), each kind goes to its own default: one sentence to ONNX Runtime
    (bound by reading the weights, which its kernels read faster; measured medians on an AMD EPYC,
    bert-base: 12 tokens 20.0 vs 26.3 ms, 32 tokens 39.9 vs 43.6, yet best-of timings called 32
    tokens a tie at one start in two), a crowd to torch (it skips the padding)."""

    single_tokens: int
    crowd_slots: int
    threads: int  # torch's intra-op threads when measured: another count needs new timings
    timings: Timings = field(default_factory=dict, compare=False)

    @classmethod
    def decide(cls, timings: Timings, threads: int, margin: float = MARGIN) -> "Crossover":
        def onnx_serves(shape, by_default: bool) -> bool:
            onnx, torch_ = timings[shape]["onnx"], timings[shape]["torch"]
            return torch_ >= onnx * (1 - margin) if by_default else onnx < torch_ * (1 - margin)

        def limit(shapes, size, by_default: bool) -> int:
            best = 0
            for shape in sorted(shapes, key=size):
                if not onnx_serves(shape, by_default):
                    break
                best = size(shape)
            return best

        singles = [shape for shape in timings if shape[0] == 1]
        crowds = [shape for shape in timings if shape[0] > 1]
        return cls(limit(singles, lambda shape: shape[1], by_default=True),
                   limit(crowds, lambda shape: shape[0] * shape[1], by_default=False), threads, timings)

    def suits(self, batch: int, length: int) -> bool:
        """Whether ONNX Runtime serves a batch of `batch` sentences padded to `length` tokens."""
        return length <= self.single_tokens if batch == 1 else batch * length <= self.crowd_slots

    def table(self) -> str:
        """The timings and the decision, for the log."""
        rows = [f"{b} x {t}: ONNX Runtime {ms['onnx'] * 1e3:.1f} ms, torch {ms['torch'] * 1e3:.1f} ms -> "
                f"{'ONNX Runtime' if self.suits(b, t) else 'torch'}" for (b, t), ms in sorted(self.timings.items())]
        return (f"one sentence through ONNX Runtime up to {self.single_tokens} tokens, several at once up "
                f"to {self.crowd_slots} token slots, torch beyond ({self.threads} threads); " + "; ".join(rows))


def shapes_to_time(max_length: int) -> list[tuple[int, int]]:
    """(batch, length) of the batches timed: one sentence of `SINGLE_LENGTHS` tokens (within the
    model's `max_length`), and crowds of `CROWD_SIZES` short sentences padded to `CROWD_LENGTH`
    (`example_batch`)."""
    singles = [(1, n) for n in SINGLE_LENGTHS if n <= max_length]
    return singles + [(b, CROWD_LENGTH) for b in CROWD_SIZES if CROWD_LENGTH <= max_length]


def time_forwards(forwards: dict[str, Callable[[int, int], Any]], shapes: list[tuple[int, int]],
                  budget_s: float = MEASURE_S, clock: Callable[[], float] = time.perf_counter,
                  least_rounds: int = 2, most_rounds: int = 6) -> Timings:
    """The best seconds of each of `forwards` (name -> run(batch, length)) on each shape. A first
    round untimed, then timed rounds of every shape, each shape's forwards back to back (in turn
    first, so that neither always runs in the other's wake), until `budget_s` has passed and at
    least `least_rounds` timed rounds ran; the best of them leaves out the calls slowed by
    requests served meanwhile. The untimed round because the first calls after an export are
    slow for several calls, not one (measured on an AMD EPYC, bert-base, one sentence of 12
    tokens: ONNX Runtime's best of two rounds 28.6 ms, then 20.8 once warm; torch 31.4, then 26.8),
    and by unequal amounts: the decision went either way from one start to the next."""
    best = {shape: {name: float("inf") for name in forwards} for shape in shapes}
    started, names = clock(), list(forwards)
    for round_ in range(most_rounds + 1):  # round 0 warms up
        for shape in shapes:
            for name in names if round_ % 2 == 0 else names[::-1]:
                tick = clock()
                forwards[name](*shape)
                if round_:
                    best[shape][name] = min(best[shape][name], clock() - tick)
        if round_ >= least_rounds and clock() - started >= budget_s:
            break
    return best


def example_batch(batch: int, length: int, vocab_size: int) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """A batch as the fill-mask serves it: `batch` sentences padded to `length` tokens, one mask in
    the middle of each. Several sentences are of different lengths, as a crowd's are (sentence i
    has `length - i % 4` real tokens, the rest padding): ONNX Runtime computes the padding and the
    lean torch forward does not, so timing both on full rows would favour ONNX Runtime (measured
    on an AMD EPYC, 2 vCPUs: 4 short sentences of 9-12 tokens, 40 real of 48 slots, 56.5 ms
    through ONNX Runtime against 45.4 ms through torch; at 48 real tokens 56.2 against 49.5)."""
    generator = torch.Generator().manual_seed(batch * 1000 + length)
    ids = torch.randint(1000 if vocab_size > 2000 else 0, vocab_size, (batch, length), generator=generator)
    real = torch.tensor([length - (i % 4 if batch > 1 else 0) for i in range(batch)]).clamp(min=1)
    mask = (torch.arange(length)[None, :] < real[:, None]).long()  # (batch, length)
    ids = ids * mask  # padding is token 0, as `fillmask.pad_inputs` pads BERT's vocabulary
    inputs = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    return inputs, torch.arange(batch), real // 2


class OnnxMaskedLM:
    """An ONNX Runtime session over one model's export (see the module doc)."""

    def __init__(self, model: torch.nn.Module, session, threads: int):
        self.model, self.session, self.threads = model, session, threads
        # listed once: walking the modules on every request costs ~2 ms on bert-base
        self.parameters = list(model.parameters())
        self.stamp = stamp(self.parameters)
        self._lock = threading.Lock()
        self.crossover: Crossover | None = None  # measured (`measure`); None: `MOST_TOKENS` decides
        self._torch_forward = None  # what `measure` timed against: kept to measure again
        self._measuring = False

    @classmethod
    def build(cls, model: torch.nn.Module, path: Path, threads: int | None = None) -> "OnnxMaskedLM":
        """Export (or find the export of) `model` at `path` (`export_path`) and open a session with
        `threads` intra-op threads (torch's count by default). ValueError if the model cannot take
        this path."""
        import onnxruntime as ort

        if not anatomy.of(model).lean or next(model.parameters()).device.type != "cpu" \
                or next(model.parameters()).dtype != torch.float32:
            raise ValueError("Only BERT-family masked LMs on a CPU in float32 run through ONNX Runtime.")
        if not path.exists():
            export(model, path)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = threads or torch.get_num_threads()
        options.inter_op_num_threads = 1
        _never_spin(options)
        return cls(model, ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]),
                   options.intra_op_num_threads)

    def suits(self, inputs: dict) -> bool:
        """Whether this batch is better run here than by the lean torch forward. Measured
        (`measure`): as its `Crossover` says for the batch's shape, while torch's thread count is
        the one measured with (another count: torch serves while both are timed again, in the
        background). Unmeasured: fewer than `MOST_TOKENS` token slots (B x T: ONNX Runtime
        computes the padding too), from bert-base on an Intel Xeon (2 vCPUs), ONNX Runtime vs
        torch: one sentence of 24 tokens 36 vs 46 ms, 64 tokens 65 vs 73, 96 tokens 84 vs 87, 128
        tokens 106 vs 106; crowds of short sentences (~10 tokens) 4 x 12 slots 55 vs 59, 6 x 12 73
        vs 72, 8 x 12 90 vs 86, 16 x 12 158 vs 132. The lean forward skips the padding and runs its
        last layer at the masks only."""
        batch, length = inputs["input_ids"].shape
        if self._torch_forward is None:
            return batch * length < MOST_TOKENS
        crossover = self.crossover
        if crossover is None or crossover.threads != torch.get_num_threads():
            self._measure_again()
            return False
        return crossover.suits(batch, length)

    def measure(self, torch_forward: Callable, budget_s: float | None = None) -> Crossover:
        """Time this session and `torch_forward(inputs, rows, cols)` (the lean torch forward, as
        `logits.mlm_logits` runs it without ONNX Runtime) on the shapes that matter
        (`shapes_to_time`), keep the `Crossover` they give and log its table."""
        config = self.model.config
        batches = {shape: example_batch(*shape, config.vocab_size)
                   for shape in shapes_to_time(config.max_position_embeddings)}
        threads, started = torch.get_num_threads(), time.perf_counter()
        with torch.inference_mode():
            timings = time_forwards({"onnx": lambda b, t: self.logits(*batches[b, t]),
                                     "torch": lambda b, t: torch_forward(*batches[b, t])}, list(batches),
                                    MEASURE_S if budget_s is None else budget_s)
        self._torch_forward, self.crossover = torch_forward, Crossover.decide(timings, threads)
        log.info("ONNX Runtime or torch for %s, measured in %.1f s: %s", config.name_or_path,
                 time.perf_counter() - started, self.crossover.table())
        return self.crossover

    def _measure_again(self) -> None:
        """Measure again in the background (once at a time): torch's thread count changed."""
        with self._lock:
            if self._measuring:
                return
            self._measuring = True

        def work():
            try:
                self.measure(self._torch_forward)
            except Exception:  # noqa: BLE001 - torch serves on; the log says why
                log.exception("measuring ONNX Runtime against torch failed: torch serves")
                self.crossover = Crossover(0, 0, torch.get_num_threads())
            finally:
                self._measuring = False

        threading.Thread(target=work, daemon=True, name="onnx-measure").start()

    def matches(self, model: torch.nn.Module) -> bool:
        """Whether this session computes `model` as it is now: the same object, no weight changed in
        place. (A parameter swapped for a new one by assignment is not seen: nothing here does
        that to a served model; trainers train copies, which are other objects.)"""
        return model is self.model and stamp(self.parameters) == self.stamp

    def logits(self, inputs: dict, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """Logits (N, V) at positions (rows[i], cols[i]) of a (B, T) batch; float32."""
        ids = inputs["input_ids"]
        feeds = {"input_ids": ids, "attention_mask": inputs.get("attention_mask"),
                 "token_type_ids": inputs.get("token_type_ids"), "rows": rows, "cols": cols}
        if feeds["attention_mask"] is None:
            feeds["attention_mask"] = torch.ones_like(ids)
        if feeds["token_type_ids"] is None:
            feeds["token_type_ids"] = torch.zeros_like(ids)
        arrays = {name: np.ascontiguousarray(value.cpu().numpy(), dtype=np.int64) for name, value in feeds.items()}
        return torch.from_numpy(self.session.run(["logits"], arrays)[0])


def _never_spin(options) -> None:
    """Threads that sleep when they wait, never busy-wait. A served model's forward always shares
    the CPU: with the web stack answering the crowd, other visitors' views, clients on the same
    machine. A thread busy-waiting at an operator's barrier then holds a core while the thread it
    waits for is descheduled. Measured on bert-base (AMD EPYC, 2 vCPUs, both settings in one
    process, interleaved): alone, one sentence of 12 tokens 19.9-20.1 ms sleeping against
    25.1-25.9 spinning within runs (`allow_spinning` with `force_spinning_stop`), 4 sentences
    56.8 against 56.0; beside a process using one core, 24.7-28.0 against 34.7-35.6 ms, and
    62.8-71.3 against 73.0-79.5. (On an Intel Xeon a quiet machine once favoured spinning, 24.5
    against 28.0 ms at 9 tokens, with nothing else running.) ORT's default, which also spins
    after each run, takes the CPU from whatever the server does next."""
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")


def clear_cache(folder: Path | None = None) -> None:
    """Delete every kept export."""
    shutil.rmtree(folder or cache_dir(), ignore_errors=True)
