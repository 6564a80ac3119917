"""Fine-tune throughput: bertdemo.finetune vs transformers.Trainer, same model, data, batch,
sequence length, collator and steps. Each run is its own process, so peak RSS is its own.

Goal: our tokens/s at least 1.0x Trainer's. Needs `pip install accelerate` (Trainer's dependency).
Run: python bench/bench_finetune.py [--steps 6] [--batch-size 8] [--max-length 128]
"""
import argparse
import json
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
from bertdemo.fine_tuning import mlm_collator, prepare_text  # noqa: E402
from bertdemo.training import Step  # noqa: E402
from common import bert_base_folder  # noqa: E402

WORDS = ("the river flows past the old city where people walk along the bridge every day and "
         "the museum opens its doors to visitors who come from many countries to see the art").split()


def corpus(lines: int = 200) -> str:
    """Varied sentences, deterministic, under the default 20,000-character cap, ~25 blocks of 128 tokens."""
    return "\n".join(" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(12 + i % 9)) + "."
                     for i in range(lines))


def run_ours(lm, args) -> dict:
    stamps = []
    _, history = bertdemo.finetune(lm, corpus(), steps=args.steps, batch_size=args.batch_size,
                                   max_length=args.max_length, eval_every=0, seed=0,
                                   on_event=lambda e: isinstance(e, Step) and stamps.append(
                                       (time.perf_counter(), e.tokens)))
    return _rate(stamps)


def run_trainer(lm, args) -> dict:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    data = prepare_text(lm, corpus(), max_length=args.max_length)
    model = _trainable(lm)
    stamps = []

    class Clock(TrainerCallback):
        def on_step_end(self, targs, state, control, **kw):
            stamps.append((time.perf_counter(), None))

    with tempfile.TemporaryDirectory() as out:
        targs = TrainingArguments(output_dir=out, max_steps=args.steps,
                                  per_device_train_batch_size=args.batch_size, learning_rate=5e-5,
                                  weight_decay=0.01, warmup_steps=max(1, args.steps // 10), logging_strategy="no",
                                  save_strategy="no", report_to="none", use_cpu=True,
                                  dataloader_num_workers=0, disable_tqdm=True,
                                  remove_unused_columns=False, seed=0)
        trainer = Trainer(model=model, args=targs, train_dataset=data.train,
                          data_collator=mlm_collator(lm, seed=0), callbacks=[Clock()])
        tokens_per_batch = _tokens_per_batch(trainer)
        trainer.train()
    return _rate([(t, tokens_per_batch) for t, _ in stamps])


def _trainable(lm):
    import copy

    model = copy.deepcopy(lm.model)
    model.requires_grad_(True).train()
    return model


def _tokens_per_batch(trainer) -> float:
    """Mean non-padding tokens per batch of the Trainer's own loader (same data as ours)."""
    batches = list(trainer.get_train_dataloader())
    return sum(int(b["attention_mask"].sum()) for b in batches) / len(batches)


def _rate(stamps: list[tuple[float, float]]) -> dict:
    """Tokens/s over steps 2..N (step 1 pays one-off warm-up in both)."""
    (t0, _), rest = stamps[0], stamps[1:]
    tokens = sum(n for _, n in rest)
    return {"tokens_per_s": tokens / (rest[-1][0] - t0), "steps_timed": len(rest),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def one(kind: str, args) -> None:
    torch.manual_seed(0)
    lm = bertdemo.load(str(bert_base_folder(args.folder)), device="cpu")
    print(json.dumps((run_ours if kind == "ours" else run_trainer)(lm, args)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--one", choices=["ours", "trainer"])
    parser.add_argument("--folder")
    args = parser.parse_args()
    if args.one:
        return one(args.one, args)
    folder = str(bert_base_folder(args.folder))
    results = {"ours": [], "trainer": []}
    for _ in range(args.rounds):  # alternate, so machine noise hits both alike
        for kind in results:
            cmd = [sys.executable, __file__, "--one", kind, "--folder", folder, "--steps",
                   str(args.steps), "--batch-size", str(args.batch_size), "--max-length",
                   str(args.max_length)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            results[kind].append(json.loads(out.strip().splitlines()[-1]))
    best = {k: max(r["tokens_per_s"] for r in v) for k, v in results.items()}
    rss = {k: max(r["peak_rss_mb"] for r in v) for k, v in results.items()}
    print(f"bert-base-sized model, batch {args.batch_size} x {args.max_length} tokens, "
          f"{args.steps} steps, {torch.get_num_threads()} threads, CPU")
    for kind in results:
        print(f"{kind:>8}: {best[kind]:8.1f} tokens/s, peak RSS {rss[kind]:7.0f} MB")
    print(f"ratio ours/Trainer: {best['ours'] / best['trainer']:.2f}x (goal >= 1.0)")


if __name__ == "__main__":
    main()
