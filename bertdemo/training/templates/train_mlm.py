"""Masked-LM fine-tune exported from bertdemo: the demo's run, on transformers' Trainer.

    python train_mlm.py                          # one machine (CPU, or the GPU if there is one)
    accelerate launch train_mlm.py               # several GPUs or machines (`accelerate config` first)
    torchrun --nproc_per_node 4 train_mlm.py     # the same with torchrun

Every setting is in run.json beside this file (model, data file, masking, collator, learning rate,
schedule, batch, block length, seed, keep_best), under the names of the demo's Fine-tune form
(training_length counted in length_unit, "steps" or "epochs"; mask_probability is the collator's
mlm_probability): edit it, or point --config at another. To train on your own data, replace the
data file (one sentence or paragraph per line). The tuned model is saved with `save_pretrained` to
run.json's `output_dir`; `bertdemo.load(that folder)` or any transformers code loads it. Needs
torch, transformers and accelerate (pip install "transformers[torch]").

The data goes through the demo's own steps: lines cut into sentences, about one line in ten held
out for evaluation, sentences packed into blocks of `block_length` tokens, masks drawn by
`DataCollatorForLanguageModeling` (80% [MASK], 10% random token, 10% unchanged; loss only on the
chosen tokens): fresh for every batch ("dynamic") or once per block ("static", as BERT did).
With several processes, each draws masks from its own stream (seed + rank).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
from pathlib import Path

import torch
from torch.nn.utils.rnn import pad_sequence
from transformers import (AutoModelForMaskedLM, AutoTokenizer, DataCollatorForLanguageModeling, Trainer,
                          TrainingArguments)

SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")
EVAL_SEED_OFFSET = 1_000_003  # eval masks come from their own stream, never the training one


def split_units(text: str) -> list[str]:
    """Lines, each cut into sentences; blank ones dropped."""
    return [s.strip() for line in text.splitlines() for s in SENTENCE_END.split(line) if s.strip()]


def hold_out(units: list[str]) -> tuple[list[str], list[str]]:
    """Every k-th line goes to eval (about 1 in 10); under 4 lines, eval uses the training lines."""
    if len(units) < 4:
        return units, units
    n_eval = max(1, len(units) // 10)
    k = len(units) // n_eval
    held = set(range(k - 1, len(units), k)[:n_eval])
    return ([u for i, u in enumerate(units) if i not in held], [u for i, u in enumerate(units) if i in held])


def pack(tokenizer, units: list[str], block: int) -> list[dict]:
    """Whole sentences packed greedily into blocks of at most `block` tokens (longer ones cut),
    each wrapped in the model's special tokens ([CLS] ... [SEP]).

    A copy of `bertdemo.training.mlm_data.pack`, on purpose: this script runs where bertdemo is not
    installed. tests/training/test_export.py checks that both give the demo's first batch the same loss."""
    blocks, current = [], []
    for ids in tokenizer(units, add_special_tokens=False)["input_ids"]:
        if len(current) + len(ids) > block and current:
            blocks.append(current)
            current = []
        while len(ids) > block:
            blocks.append(ids[:block])
            ids = ids[block:]
        current = current + ids
    if current:
        blocks.append(current)
    core, full = tokenizer("a", add_special_tokens=False)["input_ids"], tokenizer("a")["input_ids"]
    start = next(i for i in range(len(full)) if full[i:i + len(core)] == core)
    prefix, suffix = full[:start], full[start + len(core):]
    return [{"input_ids": prefix + b + suffix,
             "special_tokens_mask": [1] * len(prefix) + [0] * len(b) + [1] * len(suffix)} for b in blocks]


def planned_steps(run: dict, n_blocks: int) -> int:
    """The training length in steps: `training_length` itself, or that many epochs over the packed
    training blocks, counted as the demo counts them (ceil(blocks / batch_size) steps an epoch)."""
    if run["length_unit"] == "steps":
        return int(run["training_length"])
    return max(1, math.ceil(run["training_length"] * math.ceil(n_blocks / run["batch_size"])))


def with_labels(collate, examples: list[dict], tries: int = 100) -> dict:
    """Draw masks until at least one token is chosen (a batch without targets has no loss)."""
    for _ in range(tries):
        batch = collate(examples)
        if (batch["labels"] != -100).any():
            return batch
    raise ValueError("No token was chosen for masking in 100 draws: raise mask_probability.")


def fixed_masks(collate, examples: list[dict]) -> list[dict]:
    """Masks drawn once per block, kept as 1-D tensors: static masking and the eval set."""
    rows = []
    for example in examples:
        batch = with_labels(collate, [example])
        rows.append({k: batch[k][0] for k in ("input_ids", "attention_mask", "labels")})
    return rows


def eval_copies(examples: list[dict], mask_probability: float, target: int = 200, most: int = 32) -> list[dict]:
    """The eval blocks repeated (each copy with its own masks) so about `target` tokens are scored."""
    tokens = sum(len(e["input_ids"]) - sum(e["special_tokens_mask"]) for e in examples)
    return examples * min(most, max(1, math.ceil(target / (mask_probability * max(tokens, 1)))))


class PadRows:
    """Collate pre-masked 1-D rows into a (B, T) batch: labels padded with -100, attention with 0."""

    def __init__(self, pad_id: int):
        self.pads = {"input_ids": pad_id, "attention_mask": 0, "labels": -100}

    def __call__(self, rows: list[dict]) -> dict:
        return {k: pad_sequence([r[k] for r in rows], batch_first=True, padding_value=v)
                for k, v in self.pads.items()}


class MaskOrPad:
    """The Trainer's collator: raw blocks get fresh masks from the MLM collator; rows whose masks
    were drawn once (static training rows, the eval set) are only padded."""

    def __init__(self, mask: DataCollatorForLanguageModeling, pad: PadRows):
        self.mask, self.pad = mask, pad

    def __call__(self, examples: list[dict]) -> dict:
        return self.pad(examples) if "labels" in examples[0] else self.mask(examples)


def first_batch(run: dict, tokenizer, train: list[dict]) -> dict:
    """The batch the demo's own loop trains on first (same shuffle, same seeded masks), to check
    that this script computes the same loss on it."""
    seed, size = run["seed"], run["batch_size"]
    collate = DataCollatorForLanguageModeling(tokenizer, mlm_probability=run["mask_probability"], seed=seed)
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed)).tolist()[:size]
    if run["masking"] == "static":
        rows = fixed_masks(collate, train)
        return PadRows(tokenizer.pad_token_id or 0)([rows[i] for i in order])
    return with_labels(collate, [train[i] for i in order])


def main(argv: list[str] | None = None) -> None:
    here = Path(__file__).resolve().parent
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(here / "run.json"), help="the run's settings (run.json)")
    parser.add_argument("--max-steps", type=int, help="train this many steps instead of run.json's")
    parser.add_argument("--output-dir", help="save the tuned model here instead of run.json's output_dir")
    parser.add_argument("--first-batch-loss", action="store_true",
                        help="print the loss on the demo's first training batch as JSON, then exit")
    args = parser.parse_args(argv)
    run = json.loads(Path(args.config).read_text())
    base = Path(args.config).resolve().parent
    text = (base / run["data_file"]).read_text(encoding="utf-8")

    tokenizer = AutoTokenizer.from_pretrained(run["model"])
    model = AutoModelForMaskedLM.from_pretrained(run["model"], use_safetensors=True)
    block = min(run["block_length"], tokenizer.model_max_length, model.config.max_position_embeddings)
    block -= tokenizer.num_special_tokens_to_add(pair=False)
    train_units, eval_units = hold_out(split_units(text))
    train, evals = pack(tokenizer, train_units, block), pack(tokenizer, eval_units, block)

    seed, p = run["seed"], run["mask_probability"]
    steps = args.max_steps or planned_steps(run, len(train))
    training = TrainingArguments(
        output_dir=args.output_dir or str(base / run["output_dir"]), max_steps=steps,
        per_device_train_batch_size=run["batch_size"], per_device_eval_batch_size=64,
        learning_rate=run["learning_rate"], weight_decay=run["weight_decay"],
        lr_scheduler_type=run["lr_schedule"], warmup_steps=round(run["warmup_ratio"] * steps),
        max_grad_norm=run["max_grad_norm"], seed=seed, data_seed=seed,
        eval_strategy="steps", eval_steps=max(1, steps // 10), logging_steps=max(1, steps // 20),
        # keep_best: the weights of the evaluation with the lowest held-out loss, not the last step's
        **(dict(save_strategy="steps", save_steps=max(1, steps // 10), save_only_model=True, save_total_limit=2,
                load_best_model_at_end=True, metric_for_best_model="eval_loss", greater_is_better=False)
           if run.get("keep_best") else dict(save_strategy="no")),
        report_to="none", bf16=torch.cuda.is_available() and torch.cuda.is_bf16_supported(),
        use_cpu=not has_accelerator(),  # on CPU-only machines, torchrun then trains one model across processes
        # Each process's loss is its own batch's mean, averaged by DDP. (With True, transformers
        # 5.23 reports an eval loss multiplied by the number of processes.)
        average_tokens_across_devices=False)
    rank = int(os.environ.get("RANK", 0))
    collate = DataCollatorForLanguageModeling(tokenizer, mlm_probability=p, seed=seed + rank)
    eval_collate = DataCollatorForLanguageModeling(tokenizer, mlm_probability=p, seed=seed + EVAL_SEED_OFFSET)
    trainer = Trainer(model=model, args=training, eval_dataset=fixed_masks(eval_collate, eval_copies(evals, p)),
                      train_dataset=fixed_masks(collate, train) if run["masking"] == "static" else train,
                      data_collator=MaskOrPad(collate, PadRows(tokenizer.pad_token_id or 0)))

    if args.first_batch_loss:
        torch.manual_seed(seed)  # dropout, as the demo seeds it
        model.train()
        batch = {k: v.to(trainer.args.device) for k, v in first_batch(run, tokenizer, train).items()}
        print(json.dumps({"loss": trainer.compute_loss(trainer.model.to(trainer.args.device), batch).item()}))
        return
    before = trainer.evaluate()
    trainer.train()
    after = trainer.evaluate()
    trainer.save_model()  # by the main process only, as is what follows
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(training.output_dir)
        for name, result in (("before", before), ("after", after)):
            loss = result["eval_loss"]
            print(f"{name}: held-out masked-token loss {loss:.3f}, perplexity {math.exp(min(loss, 50)):.2f}")
        if trainer.state.best_model_checkpoint:
            print(f"kept the weights of {Path(trainer.state.best_model_checkpoint).name} (lowest held-out loss)")
        print(f"saved to {training.output_dir}")
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        # under torchrun: the process group's threads end before the interpreter does (else an
        # occasional "terminate called without an active exception" abort after the save)
        torch.distributed.destroy_process_group()


def has_accelerator() -> bool:
    """A GPU (or other torch accelerator) to train on; without one, the CPU."""
    accelerator = getattr(torch, "accelerator", None)
    return accelerator.is_available() if accelerator is not None else torch.cuda.is_available()


if __name__ == "__main__":
    main()
