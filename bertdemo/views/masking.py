"""How MLM corrupts its input: selection, the 80/10/10 split, static vs dynamic masking.

Every draw is made by transformers' own `DataCollatorForLanguageModeling`, seeded, so what this
module shows is what a Trainer with that collator feeds the model. The collator returns only the
corrupted ids and the labels; to say *why* a token changed (a `[MASK]`, a random token that may
even be the original one, or kept), `_replay` repeats the collator's random draws with the same
seed, and every call checks that the replay rebuilds the collator's output exactly.

Vocabulary: a token is *chosen* when the loss scores it (label = its id); a chosen token is then
replaced by the mask token ("mask"), by a random token ("random") or left as is ("keep").
Special tokens (`[CLS]`, `[SEP]`, `[PAD]`, `[UNK]`, a typed `[MASK]`: the tokenizer's
`all_special_ids`, as the collator decides by default) are never chosen.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from transformers import DataCollatorForLanguageModeling

from .. import validate
from ..model.loading import USER_MASK_RE

MAX_TEXT_TOKENS = 256  # longest text (special tokens included) the tab shows token by token
MAX_EPOCHS = 50  # most epochs in the static-vs-dynamic grid
MAX_LAW_TOKENS = 100_000  # most token draws for the measured rates
MAX_ARTICLE_LENGTH = 128  # longest padded length for the article's snippet
CURVE_TOKENS = 5_000  # token draws per epoch behind the "ever chosen" curve: smooth to ~1%
_MAX_CELLS = 32_000_000  # batch cells (rows x tokens, x tokens again for whole words): ~32 MB
OUTCOMES = ("mask", "random", "keep")


@dataclass(frozen=True)
class Rates:
    """The collator's knobs, under the Mask sampling form's names (the collator's own keywords are
    mlm_probability, mask_replace_prob, random_replace_prob and whole_word_mask: `collator()`).
    Under whole-word masking transformers replaces every chosen piece by the mask token (no
    random, no keep), so `effective()` says what is really drawn."""

    mask_probability: float = 0.15
    mask_replace_probability: float = 0.8
    random_replace_probability: float = 0.1
    whole_words: bool = False

    def check(self) -> "Rates":
        """Raise InputError (naming the field) saying how to fix a rate the collator would refuse."""
        for name in ("mask_probability", "mask_replace_probability", "random_replace_probability"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:  # NaN fails too
                raise validate.InputError(name, f"{name} is {value!r}; it is a probability: give a number "
                                                "from 0 to 1.")
        if self.mask_replace_probability + self.random_replace_probability > 1:
            raise validate.InputError("random_replace_probability", (
                f"mask_replace_probability + random_replace_probability is "
                f"{self.mask_replace_probability + self.random_replace_probability:g}; they share the chosen "
                "tokens, so their sum must be at most 1 (the rest are kept)."))
        # As floats: an API caller's integer 0 or 1 would make torch draw from a Long tensor and fail.
        return Rates(float(self.mask_probability), float(self.mask_replace_probability),
                     float(self.random_replace_probability), self.whole_words)

    def effective(self) -> "Rates":
        if self.whole_words:
            return Rates(self.mask_probability, 1.0, 0.0, True)
        return self

    @property
    def keep_prob(self) -> float:
        return max(0.0, round(1.0 - self.mask_replace_probability - self.random_replace_probability, 12))

    def collator(self, tokenizer, seed: int) -> DataCollatorForLanguageModeling:
        rates = self.effective()  # set here, so the collator has nothing to override or warn about
        return DataCollatorForLanguageModeling(  # the library's names for the same knobs
            tokenizer, mlm_probability=rates.mask_probability, mask_replace_prob=rates.mask_replace_probability,
            random_replace_prob=rates.random_replace_probability, whole_word_mask=rates.whole_words, seed=seed)


@dataclass
class Corruption:
    """One collator draw over a batch. Every tensor is (B, T)."""

    input_ids: torch.Tensor  # the original ids
    seen: torch.Tensor  # what the model sees (the collator's input_ids)
    labels: torch.Tensor  # -100, or the original id where the loss scores the token
    special: torch.Tensor  # bool: never chosen
    chosen: torch.Tensor  # bool
    to_mask: torch.Tensor  # bool, chosen and replaced by the mask token
    to_random: torch.Tensor  # bool, chosen and replaced by a random id (possibly the same one)
    word_start: torch.Tensor | None = None  # bool, first piece of each word (whole-word only)

    @property
    def kept(self) -> torch.Tensor:
        return self.chosen & ~self.to_mask & ~self.to_random

    def outcome_codes(self) -> torch.Tensor:
        """(B, T) ints: 0 not chosen, 1 mask, 2 random, 3 keep."""
        return self.to_mask * 1 + self.to_random * 2 + self.kept * 3


# ---------------------------------------------------------------- drawing

def check_seed(seed) -> int:
    return validate.whole_number(seed, "Seed", 0, 2**32 - 1, field="seed")


def encode(tokenizer, text: str, whole_words: bool = False) -> dict:
    """Tokenize one text: {"input_ids": (1, T), "special": (1, T) bool, "offsets": (1, T, 2) or None}.

    A typed `[MASK]` (any case) becomes the tokenizer's mask token. Never truncates.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError("The text is empty: type a sentence, e.g. 'Paris is the capital of France.'")
    if whole_words and not getattr(tokenizer, "is_fast", False):
        raise ValueError("Whole-word masking needs a fast tokenizer (for its offsets): untick it.")
    enc = tokenizer(USER_MASK_RE.sub(tokenizer.mask_token, text), return_offsets_mapping=whole_words)
    ids = enc["input_ids"]
    if len(ids) > MAX_TEXT_TOKENS:
        raise ValueError(f"The text is {len(ids)} tokens long; this view takes at most "
                         f"{MAX_TEXT_TOKENS}. Shorten it.")
    # What the collator computes itself when not handed a mask: membership in all_special_ids.
    special = tokenizer.get_special_tokens_mask(ids, already_has_special_tokens=True)
    return {"input_ids": torch.tensor([ids]), "special": torch.tensor([special], dtype=torch.bool),
            "offsets": torch.tensor([enc["offset_mapping"]]) if whole_words else None}


def corrupt(tokenizer, encoded: dict, seed: int, rates: Rates, copies: int = 1) -> Corruption:
    """Run the seeded collator on `copies` rows of one encoded text and explain each token.

    Calls the collator's `torch_mask_tokens` directly (no padding needed: the rows are equal);
    `test_masking.py` checks this equals a plain `collator([encoding])` call.
    """
    rates.check()
    ids = encoded["input_ids"].expand(copies, -1).clone()
    special = encoded["special"].expand(copies, -1)
    offsets = None if encoded["offsets"] is None else encoded["offsets"].expand(copies, -1, -1)
    cells = ids.numel() * (ids.shape[1] if rates.whole_words else 1)
    if cells > _MAX_CELLS:
        raise ValueError("That many samples of this text are too much for the page: ask for fewer "
                         "samples or epochs, or use a shorter text or no whole-word masking.")
    collator = rates.collator(tokenizer, seed)
    collator.generator = collator.get_generator(seed)  # what its __call__ does on first use
    seen, labels = collator.torch_mask_tokens(ids.clone(), special_tokens_mask=special.long(),
                                              offset_mapping=offsets)
    result = _replay(ids, special, offsets, seed, rates.effective(), len(tokenizer),
                     tokenizer.mask_token_id)
    if not (torch.equal(result.seen, seen) and torch.equal(result.labels, labels)):
        raise RuntimeError("transformers' DataCollatorForLanguageModeling changed how it draws; "
                           "update bertdemo.views.masking._replay to match it.")
    return result


def _replay(ids, special, offsets, seed, rates: Rates, vocab_size: int, mask_id: int) -> Corruption:
    """The collator's torch draws, in its order, keeping the masks it throws away.

    Written out (about ten lines of transformers 5.23's `torch_mask_tokens`) because the collator
    returns only the results; `corrupt` checks they agree on every call.
    """
    generator = torch.Generator().manual_seed(seed)
    probability = torch.full(ids.shape, rates.mask_probability)
    word_start = None
    if rates.whole_words:  # only a word's first piece is drawn; the rest follow it
        word_ids, no_draw = DataCollatorForLanguageModeling._calc_word_ids_and_prob_mask(
            offsets.numpy(), special.long().numpy())
        no_draw = torch.tensor(no_draw, dtype=torch.bool)
        word_start = ~no_draw & ~special
    else:
        no_draw = special
    chosen = torch.bernoulli(probability.masked_fill(no_draw, 0.0), generator=generator).bool()
    if rates.whole_words:
        chosen = torch.tensor(DataCollatorForLanguageModeling._whole_word_mask(word_ids, chosen))
    to_mask = torch.bernoulli(torch.full(ids.shape, rates.mask_replace_probability),
                              generator=generator).bool() & chosen
    to_random = torch.zeros_like(chosen)
    seen = ids.masked_fill(to_mask, mask_id)
    if rates.mask_replace_probability < 1 and rates.random_replace_probability > 0:
        scaled = rates.random_replace_probability / (1 - rates.mask_replace_probability)
        to_random = torch.bernoulli(torch.full(ids.shape, scaled), generator=generator).bool()
        to_random &= chosen & ~to_mask
        random_ids = torch.randint(vocab_size, ids.shape, dtype=torch.long, generator=generator)
        seen = torch.where(to_random, random_ids, seen)
    labels = ids.masked_fill(~chosen, -100)
    return Corruption(ids, seen, labels, special, chosen, to_mask, to_random, word_start)


# ---------------------------------------------------------------- one sample

def mask_sample(tokenizer, text: str, seed: int = 0, mask_probability: float = 0.15,
                mask_replace_probability: float = 0.8, random_replace_probability: float = 0.1,
                whole_words: bool = False) -> list[dict]:
    """One seeded draw of MLM corruption over `text`, as one row per token (specials included).

    Each row: {"position", "token", "token_id", "special", "chosen", "outcome" ("mask", "random",
    "keep" or None), "seen" (token the model sees), "seen_id", "label" (-100 or the original id)}.
    Same ids and labels as `DataCollatorForLanguageModeling(tokenizer, mlm_probability=mask_probability,
    mask_replace_prob=mask_replace_probability, random_replace_prob=random_replace_probability,
    whole_word_mask=whole_words, seed=seed)` called on the tokenized text (the collator's keywords are
    transformers' names; these are the Mask sampling form's). A "random" replacement draws from the whole vocabulary, so it can draw
    the original token (or a special one): it is still reported as "random", since that is the
    draw that was made. Under whole-word masking transformers turns every chosen piece into the
    mask token, whatever the two replace probabilities say.
    """
    rates = Rates(mask_probability, mask_replace_probability, random_replace_probability, whole_words).check()
    encoded = encode(tokenizer, text, whole_words)
    return sample_rows(tokenizer, corrupt(tokenizer, encoded, check_seed(seed), rates))


def sample_rows(tokenizer, corruption: Corruption, row: int = 0) -> list[dict]:
    """The rows of `mask_sample` for one row of a batch."""
    ids = corruption.input_ids[row].tolist()
    seen = corruption.seen[row].tolist()
    codes = corruption.outcome_codes()[row].tolist()
    tokens = tokenizer.convert_ids_to_tokens(ids)
    seen_tokens = tokenizer.convert_ids_to_tokens(seen)
    return [{"position": i, "token": tokens[i], "token_id": ids[i],
             "special": bool(corruption.special[row, i]), "chosen": codes[i] > 0,
             "outcome": (None, *OUTCOMES)[codes[i]], "seen": seen_tokens[i], "seen_id": seen[i],
             "label": int(corruption.labels[row, i])} for i in range(len(ids))]


def outcome_counts(rows: list[dict], mask_probability: float = 0.15, mask_replace_probability: float = 0.8,
                   random_replace_probability: float = 0.1, whole_words: bool = False) -> list[dict]:
    """Counts in one sample next to their expected values: [{"what", "count", "expected"}, ...]."""
    rates = Rates(mask_probability, mask_replace_probability, random_replace_probability,
                  whole_words).check().effective()
    eligible = sum(not r["special"] for r in rows)
    chosen = rates.mask_probability * eligible
    counts = {name: sum(r["outcome"] == name for r in rows) for name in OUTCOMES}
    expected = {"mask": chosen * rates.mask_replace_probability,
                "random": chosen * rates.random_replace_probability, "keep": chosen * rates.keep_prob}
    return ([{"what": "tokens that can be chosen", "count": eligible, "expected": eligible},
             {"what": "chosen (scored by the loss)", "count": sum(r["chosen"] for r in rows),
              "expected": chosen}]
            + [{"what": f"chosen -> {name}", "count": counts[name], "expected": expected[name]}
               for name in OUTCOMES])


# ---------------------------------------------------------------- static vs dynamic

def static_vs_dynamic(tokenizer, text: str, epochs: int = 10, seed: int = 0,
                      mask_probability: float = 0.15, mask_replace_probability: float = 0.8,
                      random_replace_probability: float = 0.1, whole_words: bool = False,
                      static_copies: int = 1) -> dict:
    """What the model sees of `text` over `epochs` epochs, static vs dynamic masking.

    Static (original BERT): the masks are drawn once, `static_copies` of them (BERT made 10 copies
    of its data for 40 epochs); epoch e uses mask `e % static_copies`, i.e. `mask_sample` with
    seed + e % static_copies. Dynamic (RoBERTa): epoch e uses seed + e, a fresh mask every time.
    Returns {"tokens": [T], "static"/"dynamic": {"outcome": E x T, "seen": E x T},
    "curve": {"epochs", "static", "dynamic", "static_theory", "dynamic_theory", "tokens"}}:
    the share of tokens chosen at least once after n epochs, measured over many copies of the
    text (`tokens` of them per epoch), against 1 - (1 - p)^min(n, copies) and 1 - (1 - p)^n.
    """
    rates = Rates(mask_probability, mask_replace_probability, random_replace_probability, whole_words).check()
    epochs = validate.whole_number(epochs, "Epochs", 1, MAX_EPOCHS, field="epochs")
    copies = validate.whole_number(static_copies, "Static copies", 1, MAX_EPOCHS,
                                   " (1 = one mask for every epoch; BERT used 10)", field="static_copies")
    seed = check_seed(seed)
    if seed + epochs >= 2**32:
        raise ValueError(f"Seed + epochs must stay below {2**32}: give a smaller seed.")
    encoded = encode(tokenizer, text, whole_words)
    grid_seeds = {"static": [seed + e % copies for e in range(epochs)],
                  "dynamic": [seed + e for e in range(epochs)]}
    samples = {s: sample_rows(tokenizer, corrupt(tokenizer, encoded, s, rates))
               for s in set(grid_seeds["static"] + grid_seeds["dynamic"])}
    grids = {mode: {"outcome": [[r["outcome"] for r in samples[s]] for s in seeds],
                    "seen": [[r["seen"] for r in samples[s]] for s in seeds]}
             for mode, seeds in grid_seeds.items()}
    return {"tokens": [r["token"] for r in samples[seed]], **grids,
            "curve": _ever_chosen_curve(tokenizer, encoded, seed, rates, epochs, copies)}


def _ever_chosen_curve(tokenizer, encoded, seed, rates, epochs, copies) -> dict:
    """Share of token draws chosen at least once after 1..epochs epochs, static vs dynamic."""
    eligible = int((~encoded["special"]).sum())
    if eligible == 0:
        raise ValueError("The text has no token that can be chosen (only special tokens): add words.")
    rows = math.ceil(CURVE_TOKENS / eligible)
    draws = {}  # seed -> chosen (rows, T); static reuses dynamic's first `copies` draws

    def chosen(s):
        if s not in draws:
            draws[s] = corrupt(tokenizer, encoded, s, rates, copies=rows).chosen
        return draws[s]

    eligible_mask = ~encoded["special"].expand(rows, -1)
    curve = {"epochs": list(range(1, epochs + 1)), "static": [], "dynamic": [],
             "tokens": rows * eligible}
    ever = {"static": torch.zeros_like(eligible_mask), "dynamic": torch.zeros_like(eligible_mask)}
    for e in range(epochs):
        ever["static"] |= chosen(seed + e % copies)
        ever["dynamic"] |= chosen(seed + e)
        for mode in ("static", "dynamic"):
            curve[mode].append(float(ever[mode][eligible_mask].float().mean()))
    p = rates.mask_probability
    curve["static_theory"] = [1 - (1 - p) ** min(n, copies) for n in curve["epochs"]]
    curve["dynamic_theory"] = [1 - (1 - p) ** n for n in curve["epochs"]]
    return curve


# ---------------------------------------------------------------- the law behind it

def masking_law(tokenizer, text: str, token_draws: int = 20_000, seed: int = 0,
                mask_probability: float = 0.15, mask_replace_probability: float = 0.8,
                random_replace_probability: float = 0.1, whole_words: bool = False) -> list[dict]:
    """Measured rates over many seeded draws of `text` (one collator call), against the configured.

    `token_draws` token draws (rounded up to whole copies of the text). Rows: "chosen" per token
    (per word under whole-word masking, where a word is drawn once), then "mask", "random",
    "keep" per chosen token. Each row: {"rate", "configured", "measured", "count", "n", "se"
    (standard error at the configured rate), "low", "high" (95% Wilson interval)}.
    """
    rates = Rates(mask_probability, mask_replace_probability, random_replace_probability, whole_words).check()
    token_draws = validate.whole_number(token_draws, "Token draws", 1, MAX_LAW_TOKENS, field="token_draws")
    encoded = encode(tokenizer, text, whole_words)
    eligible = int((~encoded["special"]).sum())
    if eligible == 0:
        raise ValueError("The text has no token that can be chosen (only special tokens): add words.")
    result = corrupt(tokenizer, encoded, check_seed(seed), rates, copies=math.ceil(token_draws / eligible))
    drawn = result.word_start if whole_words else ~result.special
    effective = rates.effective()
    n_chosen = int(result.chosen.sum())
    return [_rate_row("chosen per word" if whole_words else "chosen", effective.mask_probability,
                      int((result.chosen & drawn).sum()), int(drawn.sum())),
            _rate_row("mask", effective.mask_replace_probability, int(result.to_mask.sum()), n_chosen),
            _rate_row("random", effective.random_replace_probability, int(result.to_random.sum()), n_chosen),
            _rate_row("keep", effective.keep_prob, int(result.kept.sum()), n_chosen)]


def _rate_row(name: str, configured: float, count: int, n: int) -> dict:
    measured = count / n if n else float("nan")
    low, high = _wilson(count, n)
    se = math.sqrt(configured * (1 - configured) / n) if n else float("nan")
    return {"rate": name, "configured": configured, "measured": measured, "count": count, "n": n,
            "se": se, "low": low, "high": high}


def _wilson(count: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval: sane at rates of 0 or 1, unlike measured +- 1.96 SE."""
    if n == 0:
        return float("nan"), float("nan")
    q = count / n
    centre = (q + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(q * (1 - q) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


# ---------------------------------------------------------------- the article's snippet

def article_mask_tokens(inputs, tokenizer, generator: torch.Generator | None = None):
    """The `mask_tokens` of the article *Fine-Tuning BERT with Masked Language Modeling: A
    Comprehensive Guide*, kept verbatim (BUGGY, for comparison only).

    Its bugs: the labels of the *masked* tokens are set to -100, so the loss scores the visible
    tokens (the model learns to copy); [CLS]/[SEP]/[PAD] can be masked; no 80/10/10. The only
    change is the `generator` argument, so that a seed reproduces it.
    """
    # Create labels - use input ids as labels b/c we predict original tokens
    labels = inputs["input_ids"].detach().clone()

    # Mask 15% of tokens in each sequence at random
    mask = torch.rand(labels.shape, generator=generator) < 0.15
    labels[mask] = -100  # set labels of masked tokens to -100
    inputs["input_ids"][mask] = tokenizer.mask_token_id

    return inputs, labels


LossFn = Callable[[dict], float]


def article_comparison(tokenizer, text: str, seed: int = 0, max_length: int = 20,
                       mask_probability: float = 0.15, mask_replace_probability: float = 0.8,
                       random_replace_probability: float = 0.1, whole_words: bool = False,
                       loss_fn: LossFn | None = None) -> dict:
    """The article's `mask_tokens` next to the collator, on the same text tokenized the article's
    way (`padding="max_length", max_length=20, truncation=True`).

    Returns {"tokens", "truncated", "article": {"seen", "labels", "masked"}, "collator":
    {"seen", "labels", "outcome"}, "counts": [{"what", "article", "collator"}], "losses"}.
    `loss_fn(batch) -> float` (the hook for a loss, e.g. a short fine-tune's final loss) gets
    each labelling as {"input_ids", "attention_mask", "labels"}, (1, T) tensors; "losses" is
    {"article": ..., "collator": ...}, or None without `loss_fn`.
    """
    rates = Rates(mask_probability, mask_replace_probability, random_replace_probability, whole_words).check()
    seed = check_seed(seed)
    max_length = validate.whole_number(max_length, "max_length", 4, MAX_ARTICLE_LENGTH)
    batch, truncated = _article_batch(tokenizer, text, max_length, whole_words)
    article_inputs, article_labels = article_mask_tokens(
        {"input_ids": batch["input_ids"].clone()}, tokenizer, torch.Generator().manual_seed(seed))
    ours = corrupt(tokenizer, batch, seed, rates)
    article = {"input_ids": article_inputs["input_ids"], "labels": article_labels}
    result = {"tokens": tokenizer.convert_ids_to_tokens(batch["input_ids"][0].tolist()),
              "truncated": truncated,
              "article": {"seen": tokenizer.convert_ids_to_tokens(article["input_ids"][0].tolist()),
                          "labels": article_labels[0].tolist(),
                          "masked": (article_labels[0] == -100).tolist()},
              "collator": {"seen": tokenizer.convert_ids_to_tokens(ours.seen[0].tolist()),
                           "labels": ours.labels[0].tolist(),
                           "outcome": [(None, *OUTCOMES)[c] for c in ours.outcome_codes()[0].tolist()]},
              "counts": _comparison_counts(batch, article, ours, tokenizer.mask_token_id),
              "losses": None}
    if loss_fn is not None:
        result["losses"] = {
            "article": loss_fn({"input_ids": article["input_ids"],
                                "attention_mask": batch["attention_mask"], "labels": article_labels}),
            "collator": loss_fn({"input_ids": ours.seen, "attention_mask": batch["attention_mask"],
                                 "labels": ours.labels})}
    return result


def _article_batch(tokenizer, text: str, max_length: int, whole_words: bool) -> tuple[dict, bool]:
    """The text as the article tokenizes it, padded/truncated to `max_length`, plus whether it
    was cut (said in the page: the article cuts silently)."""
    full = encode(tokenizer, text, whole_words)
    enc = tokenizer(USER_MASK_RE.sub(tokenizer.mask_token, text), max_length=max_length,
                    padding="max_length", truncation=True, return_offsets_mapping=whole_words)
    ids = enc["input_ids"]
    special = tokenizer.get_special_tokens_mask(ids, already_has_special_tokens=True)
    return ({"input_ids": torch.tensor([ids]), "special": torch.tensor([special], dtype=torch.bool),
             "attention_mask": torch.tensor([enc["attention_mask"]]),
             "offsets": torch.tensor([enc["offset_mapping"]]) if whole_words else None},
            full["input_ids"].shape[1] > max_length)


def _comparison_counts(batch: dict, article: dict, ours: Corruption, mask_id: int) -> list[dict]:
    """The differences in numbers: what each labelling scores, and what it corrupts."""
    ids, special = batch["input_ids"], batch["special"]

    def numbers(seen, labels):
        scored, changed = labels != -100, seen != ids
        return {"positions scored by the loss": scored,
                "scored and visible unchanged (copying suffices)": scored & ~changed,
                "scored and hidden or replaced": scored & changed,
                "special/padding tokens corrupted": special & changed,
                "special/padding tokens scored": special & scored,
                "replaced by the mask token": changed & (seen == mask_id),
                "replaced by another token": changed & (seen != mask_id)}

    left = numbers(article["input_ids"], article["labels"])
    right = numbers(ours.seen, ours.labels)
    return [{"what": what, "article": int(left[what].sum()), "collator": int(right[what].sum())}
            for what in left]
