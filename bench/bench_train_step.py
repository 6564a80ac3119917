"""The ceiling for fine-tune MFU: one bare bert-base MLM training step (fixed batch, head at the
masked tokens, fused AdamW, gradients clipped; on CUDA bf16 autocast), eager and compiled, with no
data loading, events or evaluation: what `bench_finetune.py`'s MFU can be read against.

Run: python bench/bench_train_step.py --device cuda [--batch-sizes 64,256,512] [--compile] [--profile]
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from transformers import BertConfig, BertForMaskedLM  # noqa: E402

from bench_finetune import flops_per_token, peak_flops  # noqa: E402
from common import machine  # noqa: E402


def make_step(batch_size: int, device: str, compiled: bool, length: int = 128):
    """A training step of a bert-base-sized BertForMaskedLM on one random batch (B, length), a
    quarter of the rows padded from token 100; returns (step, real tokens per step, config)."""
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig()).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, fused=True)
    ids = torch.randint(1000, 30000, (batch_size, length), device=device)
    mask = torch.ones_like(ids)
    mask[::4, 100:] = 0
    labels = torch.where((torch.rand(batch_size, length, device=device) < 0.15) & (mask == 1), ids, -100)
    rows, cols = (labels != -100).nonzero(as_tuple=True)
    targets = labels[rows, cols]

    def loss_of(ids, mask, rows, cols, targets):
        with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=device.startswith("cuda")):
            hidden = model.bert(input_ids=ids, attention_mask=mask).last_hidden_state
            logits = model.cls(hidden[rows, cols]).float()
        return torch.nn.functional.cross_entropy(logits, targets)

    loss_fn = torch.compile(loss_of, dynamic=False) if compiled else loss_of

    def step() -> float:
        loss = loss_fn(ids, mask, rows, cols, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    return step, int(mask.sum()), model.config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch-sizes", default="64,256,512")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--compile", action="store_true", help="also torch.compile the forward and loss")
    parser.add_argument("--profile", action="store_true", help="print the top kernels of the first size")
    args = parser.parse_args()
    print(f"machine: {machine()}")
    peak = peak_flops() if args.device.startswith("cuda") else None
    for compiled in (False, True) if args.compile else (False,):
        for i, batch_size in enumerate(int(b) for b in args.batch_sizes.split(",")):
            step, tokens, config = make_step(batch_size, args.device, compiled)
            started = time.perf_counter()
            for _ in range(args.warmup):
                step()
            warmup = time.perf_counter() - started
            started = time.perf_counter()
            for _ in range(args.steps):
                step()
            seconds = (time.perf_counter() - started) / args.steps
            rate = tokens / seconds
            mfu = f", MFU {rate * flops_per_token(config, 128) / peak:.1%}" if peak else ""
            print(f"{'compiled' if compiled else 'eager':>8} B={batch_size:4d}: {seconds * 1e3:7.1f} ms/step, "
                  f"{rate:10.0f} tokens/s{mfu} (warm-up {warmup:.1f} s)", flush=True)
            if args.profile and i == 0 and not compiled:
                from torch.profiler import ProfilerActivity, profile

                activities = [ProfilerActivity.CUDA if args.device.startswith("cuda") else ProfilerActivity.CPU]
                with profile(activities=activities) as prof:
                    for _ in range(3):
                        step()
                print(prof.key_averages().table(sort_by="self_device_time_total" if peak else "self_cpu_time_total",
                                                row_limit=15, max_name_column_width=60))


if __name__ == "__main__":
    main()
