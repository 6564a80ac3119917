"""Fine-tune throughput: bertdemo.finetune vs transformers.Trainer, same model, data, batch,
sequence length, collator and steps. Each run is its own process, so peak RSS is its own.

Goal: our tokens/s at least 1.5x Trainer's at 8 x 128 and 32 x 128 on a CPU; on a GPU, model
FLOPs utilisation (MFU) >= 40% for bert-base MLM in bf16 at 128 tokens. Trainer runs as a user
would run it: float32 on a CPU, `bf16=True` on a GPU (ours: bf16 autocast on CUDA, float32 on a
CPU). Ours runs on the allocator the app runs on (jemalloc where installed: bertdemo/memory.py),
Trainer on Python's usual one. Needs `pip install accelerate` (Trainer's dependency).

MFU counts the FLOPs MLM training needs, the same for both: 6 x (encoder and head-transform
weights) per token, attention's 12 x layers x T x hidden per token, and the (hidden x vocab)
decoder at the masked tokens only (Trainer computes it at every token: that extra work is not
counted as useful); against the GPU's dense bf16 peak (`PEAK_BF16`).

Run: python bench/bench_finetune.py [--batch-sizes 8,32] [--max-length 128] [--device cuda]
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import bertdemo  # noqa: E402
from bertdemo import memory  # noqa: E402
from bertdemo.config import Limits  # noqa: E402
from bertdemo.training.mlm_data import mlm_collator, prepare_text  # noqa: E402
from bertdemo.training.loop import Step  # noqa: E402
from common import bert_base_folder, machine  # noqa: E402

WORDS = ("the river flows past the old city where people walk along the bridge every day and "
         "the museum opens its doors to visitors who come from many countries to see the art").split()
PEAK_BF16 = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12}  # dense, datasheet


def corpus(lines: int = 200) -> str:
    """Varied sentences, deterministic; 200 lines are ~25 blocks of 128 tokens (~8 lines a block)."""
    return "\n".join(" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(12 + i % 9)) + "."
                     for i in range(lines))


def lines_for(args) -> int:
    """Enough lines for two full batches of blocks, so no batch is short."""
    return max(200, 2 * 8 * args.batch_size * args.max_length // 128 + 50)


LIMITS = Limits(max_chars=10**8, max_steps=10**6, max_seconds=10**6, max_batch_size=10**6)  # the bench's sizes


def run_ours(lm, args) -> dict:
    stamps = []
    _, history = bertdemo.finetune(lm, corpus(lines_for(args)), training_length=args.steps,
                                   batch_size=args.batch_size, block_length=args.max_length, eval_every=0,
                                   seed=0, limits=LIMITS,
                                   on_event=lambda e: isinstance(e, Step) and stamps.append(
                                       (time.perf_counter(), e.tokens, e.loss)))
    return _rate(stamps, args.warmup)


def run_trainer(lm, args) -> dict:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    data = prepare_text(lm, corpus(lines_for(args)), block_length=args.max_length, limits=LIMITS)
    model = _trainable(lm)
    stamps = []
    cuda = lm.device.type == "cuda"

    class Clock(TrainerCallback):
        def on_step_end(self, targs, state, control, **kw):
            if cuda:
                torch.cuda.synchronize()  # the step's kernels done, as ours (loss.item())
            stamps.append((time.perf_counter(), None, None))

    with tempfile.TemporaryDirectory() as out:
        targs = TrainingArguments(output_dir=out, max_steps=args.steps,
                                  per_device_train_batch_size=args.batch_size, learning_rate=5e-5,
                                  weight_decay=0.01, warmup_steps=max(1, args.steps // 10), logging_strategy="no",
                                  save_strategy="no", report_to="none", use_cpu=not cuda, bf16=cuda,
                                  dataloader_num_workers=0, disable_tqdm=True,
                                  remove_unused_columns=False, seed=0)
        trainer = Trainer(model=model, args=targs, train_dataset=data.train,
                          data_collator=mlm_collator(lm, seed=0), callbacks=[Clock()])
        tokens_per_batch = _tokens_per_batch(trainer)
        trainer.train()
    return _rate([(t, tokens_per_batch, None) for t, _, _ in stamps], args.warmup)


def _trainable(lm):
    import copy

    model = copy.deepcopy(lm.model)
    model.requires_grad_(True).train()
    return model


def _tokens_per_batch(trainer) -> float:
    """Mean non-padding tokens per batch of the Trainer's own loader (same data as ours)."""
    batches = list(trainer.get_train_dataloader())
    return sum(int(b["attention_mask"].sum()) for b in batches) / len(batches)


def _rate(stamps: list[tuple], warmup: int) -> dict:
    """Tokens/s over steps warmup+1..N (the first steps pay one-off warm-up in both)."""
    (t0, _, _), rest = stamps[warmup - 1], stamps[warmup:]
    tokens = sum(n for _, n, _ in rest)
    return {"tokens_per_s": tokens / (rest[-1][0] - t0), "steps_timed": len(rest),
            "losses": [loss for _, _, loss in stamps if loss is not None],
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "allocator": memory.allocator()}


def flops_per_token(config, max_length: int, mlm_probability: float = 0.15) -> float:
    """Training FLOPs per token of a BERT masked LM (see the module doc)."""
    h, layers = config.hidden_size, config.num_hidden_layers
    weights = layers * (4 * h * h + 2 * h * config.intermediate_size) + h * h  # + the head's transform
    attention = 2 * 2 * max_length * h * layers  # QK^T and AV, forward
    decoder = 2 * h * config.vocab_size * mlm_probability
    return 3 * (2 * weights + attention + decoder)


def peak_flops() -> float | None:
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
    return next((peak for key, peak in PEAK_BF16.items() if key in name), None)


def one(kind: str, args) -> None:
    torch.manual_seed(0)
    lm = bertdemo.load(str(bert_base_folder(args.folder)), device=args.device)
    print(json.dumps((run_ours if kind == "ours" else run_trainer)(lm, args)))


def compare(args, batch_size: int, folder: str) -> float:
    """Alternate ours and Trainer's runs at one batch size; print a row each; returns the ratio."""
    results = {"ours": [], "trainer": []}
    for _ in range(args.rounds):  # alternate, so machine noise hits both alike
        for kind in results:
            cmd = [sys.executable, __file__, "--one", kind, "--folder", folder, "--steps", str(args.steps),
                   "--batch-size", str(batch_size), "--max-length", str(args.max_length),
                   "--device", args.device, "--warmup", str(args.warmup)]
            app_like = memory.jemalloc_environ(dict(os.environ), memory.jemalloc_library()) if kind == "ours" else None
            out = subprocess.run(cmd, capture_output=True, text=True, env=app_like or dict(os.environ))
            if out.returncode:
                sys.exit(f"{kind} failed:\n{out.stderr[-3000:]}")
            results[kind].append(json.loads(out.stdout.strip().splitlines()[-1]))
    best = {k: max(r["tokens_per_s"] for r in v) for k, v in results.items()}
    rss = {k: max(r["peak_rss_mb"] for r in v) for k, v in results.items()}
    config = bertdemo.load(folder, device="cpu").model.config
    peak = peak_flops() if args.device.startswith("cuda") else None
    print(f"batch {batch_size} x {args.max_length} tokens, {args.steps} steps ({args.warmup} warm-up)")
    for kind in results:
        mfu = f", MFU {best[kind] * flops_per_token(config, args.max_length) / peak:.1%}" if peak else ""
        print(f"{kind:>10}: {best[kind]:10.1f} tokens/s, peak RSS {rss[kind]:7.0f} MB{mfu}, "
              f"{results[kind][0]['allocator']}")
    losses = results["ours"][0]["losses"]
    print(f"{'':>10}  ours' losses: first {losses[0]:.3f}, last {losses[-1]:.3f}")
    ratio = best["ours"] / best["trainer"]
    print(f"{'':>10}  ratio ours/Trainer: {ratio:.2f}x (goal >= 1.5)")
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=1, help="first steps left out of the timing")
    parser.add_argument("--batch-sizes", default="8,32", help="comma-separated, each compared in turn")
    parser.add_argument("--batch-size", type=int, help=argparse.SUPPRESS)  # one run's
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--one", choices=["ours", "trainer"])
    parser.add_argument("--folder")
    args = parser.parse_args()
    if args.one:
        return one(args.one, args)
    folder = str(bert_base_folder(args.folder))
    print(f"machine: {machine()}")
    print(f"bert-base-sized model, {args.device}")
    ratios = [compare(args, int(b), folder) for b in args.batch_sizes.split(",")]
    print(f"worst ratio ours/Trainer: {min(ratios):.2f}x (goal >= 1.5)")


if __name__ == "__main__":
    main()
