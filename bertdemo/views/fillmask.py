"""Fill-mask and the scores built on it: top-k per mask, joint filling, candidate words, PLL.

Every function takes a `LoadedModel` and user text with `[MASK]`s (any case). The LM head
runs only at the positions asked for: a bert-base head is a 768x30522 matmul per token,
most of a forward pass at short lengths.
"""
from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

import torch

from .. import validate
from ..forward import anatomy, hooks
from ..model.loading import USER_MASK, USER_MASK_RE, LoadedModel
from ..model.logits import mlm_logits

DEFAULT_MAX_MASKS = 10
_WORD_RE = re.compile(r"\[mask\]|\w+(?:['’]\w+)*|[^\w\s]", re.IGNORECASE)


@dataclass
class Encoded:
    """One tokenized sentence. `inputs` holds (1, T) tensors; `mask_positions` lists indices in T."""

    inputs: dict
    mask_positions: list[int]

    @property
    def input_ids(self) -> torch.Tensor:
        return self.inputs["input_ids"]

    @functools.cached_property
    def key(self) -> tuple[int, ...]:
        """The token ids as a tuple: the sentence as the model sees it (equal keys, equal results)."""
        return tuple(self.input_ids[0].tolist())


def check_text(text: str) -> str:
    """Refuse text that is not a non-empty string; returns it unchanged otherwise."""
    return validate.text(text)


def encode(lm: LoadedModel, text: str, *, min_masks: int = 1,
           max_masks: int = DEFAULT_MAX_MASKS) -> Encoded:
    """Tokenize user text for `lm`, mapping `[MASK]` to the model's mask token.

    Raises ValueError for empty text, too few or too many masks, or text longer than the model
    takes (never truncates silently).
    """
    check_text(text)
    n_masks = len(USER_MASK_RE.findall(text))
    if n_masks < min_masks:
        raise ValueError(f"No {USER_MASK} in the text: put {USER_MASK} where a word should be "
                         "predicted, e.g. 'Paris is the [MASK] of France.'")
    validate.length_at_most(n_masks, max_masks, "text", f"{USER_MASK}s", "Remove some masks.")
    inputs = lm.tokenizer(lm.to_model_text(text), return_tensors="pt")
    validate.tokens_at_most(inputs["input_ids"].shape[1], lm.max_length, lm.name)
    positions = (inputs["input_ids"][0] == lm.mask_token_id).nonzero().flatten().tolist()
    return Encoded(inputs.to(lm.device), positions)


@torch.inference_mode()
def logits_at(lm: LoadedModel, inputs: dict, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """Float32 logits (N, V) at the N positions (rows[i], cols[i]) of a (B, T) batch, with the
    view's heads switched off (`lm.heads_off`) if any: `logits.mlm_logits`, offered the model's
    ONNX Runtime forward when it has one (`onnx_engine`: the app's served models)."""
    with hooks.switched_off(lm):
        return mlm_logits(lm.model, inputs, rows, cols, packed=lm.caches.packed,
                          onnx=lm.caches.onnx_for(lm.model))[0].float()


def fill_mask(lm: LoadedModel, text: str, top_k: int = 5,
              max_masks: int = DEFAULT_MAX_MASKS) -> list[list[dict]]:
    """Top-k predictions per mask, masks in order of appearance.

    Returns one list per mask of {"token": str, "token_id": int, "score": probability},
    the same tokens and scores as `pipeline("fill-mask")`.
    """
    top_k = check_top_k(top_k, lm)
    return fill_encoded(lm, [encode(lm, text, max_masks=max_masks)], [top_k])[0]


@anatomy.guarded("Fill mask")
def fill_encoded(lm: LoadedModel, encs: list[Encoded], top_ks: list[int]) -> list[list[list[dict]]]:
    """`fill_mask` for several already-validated sentences in one padded forward (B, T_max).
    A sentence asked for several times (a crowd pressing Predict on the page's example) is
    computed once: B counts distinct sentences. Side effect, on purpose: each sentence's first
    joint-fill step is remembered in `lm.caches` (`_remember_first_steps`), which `fill_jointly`
    takes instead of a forward; it gives the same completions without it."""
    distinct, which = _distinct(encs)  # encs[i] is distinct[which[i]]
    logits = _mask_logits(lm, distinct)  # (masks of the distinct sentences, V)
    probs = logits.softmax(-1)
    _remember_first_steps(lm, distinct, logits.log_softmax(-1))
    starts = [0]
    for enc in distinct:
        starts.append(starts[-1] + len(enc.mask_positions))
    # one top-k over every mask of the batch (topk's order is sorted: each request's first k of
    # the largest k asked are its top k), read into Python once, rather than a call per request
    scores, ids = (part.tolist() for part in probs.topk(max(top_ks), dim=-1))
    results = []
    for d, k in zip(which, top_ks):
        rows = range(starts[d], starts[d + 1])
        results.append([[prediction(lm, i, s) for i, s in zip(ids[r][:k], scores[r][:k])] for r in rows])
    return results


def _mask_logits(lm: LoadedModel, encs: list[Encoded]) -> torch.Tensor:
    """Logits (masks of all `encs`, V) from one padded forward; for a family whose answer depends
    on the padding after a sentence (`anatomy.batches`: FNet, ConvBERT, Funnel, Nystromformer), one
    forward per length, so every answer equals the answer alone."""
    groups = anatomy.batches(lm.model, [enc.inputs["input_ids"].shape[1] for enc in encs])
    if len(groups) > 1:
        rows: list = [None] * len(encs)  # each sentence's (masks, V), back in the order of `encs`
        for group in groups:
            logits = _mask_logits(lm, [encs[i] for i in group])
            for i, part in zip(group, logits.split([len(encs[i].mask_positions) for i in group])):
                rows[i] = part
        return torch.cat(rows)
    inputs = pad_inputs(lm, [e.inputs for e in encs])
    rows = torch.tensor([b for b, e in enumerate(encs) for _ in e.mask_positions], device=lm.device)
    cols = torch.tensor([p for e in encs for p in e.mask_positions], device=lm.device)
    return logits_at(lm, inputs, rows, cols)


def _distinct(encs: list[Encoded]) -> tuple[list[Encoded], list[int]]:
    """The distinct sentences among `encs` (by token ids: what the forward sees), in order of
    first appearance, and for each of `encs` the index of its sentence among them."""
    index: dict[tuple, int] = {}
    distinct, which = [], []
    for enc in encs:
        if enc.key not in index:
            index[enc.key] = len(distinct)
            distinct.append(enc)
        which.append(index[enc.key])
    return distinct, which


def pad_inputs(lm: LoadedModel, items: list[dict]) -> dict:
    """Right-pad a list of (1, T_i) tokenizer outputs into one (B, T_max) batch."""
    if len(items) == 1:
        return items[0]
    length = max(item["input_ids"].shape[1] for item in items)
    pad_values = {"input_ids": lm.tokenizer.pad_token_id or 0}
    batch = {}
    for key in items[0]:
        rows = [torch.nn.functional.pad(item[key][0], (0, length - item[key].shape[1]),
                                        value=pad_values.get(key, 0)) for item in items]
        batch[key] = torch.stack(rows)
    return batch


def prediction(lm: LoadedModel, token_id: int, score: float) -> dict:
    """One prediction in `fill_mask`'s format: {"token", "token_id", "score"}."""
    return {"token": lm.tokenizer.decode([token_id]), "token_id": token_id, "score": score}


def check_top_k(top_k, lm: LoadedModel, most: int = 10**9, name: str = "top_k") -> int:
    """`top_k` as a whole number from 1 to `most` (a server's limit; ValueError naming `name`
    beyond it), capped at the vocabulary size."""
    return min(validate.whole_number(top_k, name, 1, most), lm.model.config.vocab_size)


# ---------------------------------------------------------------- joint filling

MAX_BEAM_SIZE = 10  # each step scores beam x open masks rows


@anatomy.guarded("Joint filling")
def fill_jointly(lm: LoadedModel, text: str, beam_size: int = 3,
                 max_masks: int = DEFAULT_MAX_MASKS) -> list[dict]:
    """Fill all masks together: most confident mask first, re-run, repeat; a beam of `beam_size`.

    Returns up to `beam_size` completions, best first, each
    {"text": the sentence with masks filled, "log_prob": joint log-probability (chain rule in
    the order filled), "fills": [{"mask": index, "token", "token_id", "log_prob", "step"}]}.
    The same whether or not a prediction ran first: the first step reuses what `fill_mask` just
    computed for the same sentence and model when the model's memo has it (the page asks for both
    on each Predict, so a one-mask sentence needs no forward here), else computes it.
    """
    beam_size = validate.whole_number(beam_size, "beam_size", 1, MAX_BEAM_SIZE)
    enc = encode(lm, text, max_masks=max_masks)
    beams = [(enc.input_ids[0], 0.0, [])]  # (ids (T,), log_prob, fills)
    for step in range(len(enc.mask_positions)):
        known = _first_step(lm, enc) if step == 0 else None
        beams = _extend_beams(lm, enc, beams, beam_size, step, known)
    return [_completion(lm, text, enc, ids, lp, fills) for ids, lp, fills in beams]


def _extend_beams(lm, enc: Encoded, beams, beam_size: int, step: int, known=None):
    """One step of the beam: each beam fills its most confident open mask with its top tokens.
    `known`: the first step's (top log-probs, ids) per mask, (masks, >= beam_size), if computed."""
    # open: not filled yet (by the fills, not the ids: a model may predict its own mask token)
    open_cols = [[p for i, p in enumerate(enc.mask_positions) if i not in {f["mask"] for f in b[2]}]
                 for b in beams]
    tops = [known] if known is not None else _beam_tops(lm, enc, beams, open_cols, beam_size)
    candidates = []
    for (beam_ids, beam_lp, fills), cols_b, (top_lp, top_ids) in zip(beams, open_cols, tops):
        best = int(top_lp[:, 0].argmax())  # the mask the model is surest about
        for lp, tok in zip(top_lp[best, :beam_size].tolist(), top_ids[best, :beam_size].tolist()):
            new_ids = beam_ids.clone()
            new_ids[cols_b[best]] = tok
            fill = {"mask": enc.mask_positions.index(cols_b[best]), "token_id": tok,
                    "token": lm.tokenizer.decode([tok]), "log_prob": lp, "step": step}
            candidates.append((new_ids, beam_lp + lp, fills + [fill]))
    return _best_unique(candidates, beam_size)


def _beam_tops(lm, enc: Encoded, beams, open_cols, beam_size: int) -> list[tuple]:
    """One forward for all beams: per beam, (top log-probs, ids) (open masks, beam_size)."""
    ids = torch.stack([b[0] for b in beams])  # (B, T)
    rows = torch.tensor([r for r, cols in enumerate(open_cols) for _ in cols], device=lm.device)
    cols = torch.tensor([c for cols in open_cols for c in cols], device=lm.device)
    inputs = {k: v.expand(len(beams), -1) for k, v in enc.inputs.items() if k != "input_ids"}
    log_probs = logits_at(lm, {"input_ids": ids, **inputs}, rows, cols).log_softmax(-1)  # (N, V)
    tops, start = [], 0
    for cols_b in open_cols:
        top = log_probs[start:start + len(cols_b)].topk(beam_size, dim=-1)
        start += len(cols_b)
        tops.append((top.values, top.indices))
    return tops


def _remember_first_steps(lm: LoadedModel, encs: list[Encoded], log_probs: torch.Tensor) -> None:
    """Keep, per sentence, the top log-probs and ids at its masks ((masks, MAX_BEAM_SIZE) each):
    the first step of its joint fill (`lm.caches`, the model's recent results, which every view of
    the model shares: keyed by the heads the view has off)."""
    top = log_probs.topk(min(MAX_BEAM_SIZE, log_probs.shape[-1]), dim=-1)  # (sum of masks, k)
    start = 0
    for enc in encs:
        n = len(enc.mask_positions)
        lm.caches.remember(lm.model, ("first step", lm.heads_off, enc.key),
                           (top.values[start:start + n], top.indices[start:start + n]))
        start += n


def _first_step(lm: LoadedModel, enc: Encoded):
    return lm.caches.recall(lm.model, ("first step", lm.heads_off, enc.key))


def _best_unique(candidates, beam_size: int):
    """Keep the `beam_size` best distinct sequences (two orders can reach the same sentence)."""
    kept, seen = [], set()
    for cand in sorted(candidates, key=lambda c: -c[1]):
        key = tuple(cand[0].tolist())
        if key not in seen:
            seen.add(key)
            kept.append(cand)
        if len(kept) == beam_size:
            break
    return kept


def _completion(lm, text: str, enc: Encoded, ids, log_prob: float, fills: list[dict]) -> dict:
    by_mask = {f["mask"]: f["token"].strip() for f in fills}
    parts = USER_MASK_RE.split(text)
    filled = parts[0] + "".join(by_mask[i] + part for i, part in enumerate(parts[1:]))
    return {"text": filled, "log_prob": log_prob, "fills": sorted(fills, key=lambda f: f["mask"])}


# ---------------------------------------------------------------- candidate words

@anatomy.guarded("Scoring candidates")
def score_candidates(lm: LoadedModel, text: str, candidates: list[str], mask_index: int = 0,
                     max_candidates: int = 10, max_masks: int = DEFAULT_MAX_MASKS) -> list[dict]:
    """Score words the user proposes for one mask, whole words even when they split into pieces.

    A word of n pieces replaces the mask by n pieces; its log-probability is the chain rule left
    to right: log p(w1 | all n masked) + log p(w2 | w1, rest masked) + ... All rows of all
    candidates go through one batched forward. Returns, best first, per candidate:
    {"word", "pieces", "piece_log_probs", "log_prob", "mean_log_prob", "first_piece_prob"};
    `first_piece_prob` is what `pipeline("fill-mask", targets=...)` reports (first piece only).
    """
    words = _check_candidates(candidates, max_candidates)
    base = encode(lm, text, max_masks=max_masks)  # validates text and masks
    mask_index = validate.whole_number(mask_index, "mask_index", 0, 10**6, " (0 for the first [MASK])")
    if mask_index >= len(base.mask_positions):
        raise ValueError(f"mask_index {mask_index} is out of range: the text has "
                         f"{len(base.mask_positions)} mask(s), counted from 0.")
    plans = [_candidate_rows(lm, text, mask_index, w) for w in words]
    rows = [r for plan in plans for r in plan["rows"]]
    picked = [0.0] * len(rows)
    for group in anatomy.batches(lm.model, [len(r[0]) for r in rows]):  # one forward, or one per length
        for i, lp in zip(group, _row_log_probs(lm, [rows[i] for i in group])):
            picked[i] = lp
    results, start = [], 0
    for word, plan in zip(words, plans):
        n = len(plan["pieces"])
        piece_lps, first_lp = picked[start:start + n], picked[start + n]
        start += n + 1
        results.append({"word": word, "pieces": plan["pieces"], "piece_log_probs": piece_lps,
                        "log_prob": sum(piece_lps), "mean_log_prob": sum(piece_lps) / n,
                        "first_piece_prob": math.exp(first_lp)})
    return sorted(results, key=lambda r: -r["log_prob"])


def _row_log_probs(lm: LoadedModel, rows: list[tuple]) -> list[float]:
    """log p(target) at each row's position, the rows (ids, position, target) in one padded forward."""
    length = max(len(r[0]) for r in rows)
    ids = torch.full((len(rows), length), lm.tokenizer.pad_token_id or 0, dtype=torch.long)
    attention = torch.zeros_like(ids)
    for i, (row_ids, _, _) in enumerate(rows):
        ids[i, :len(row_ids)] = torch.tensor(row_ids)
        attention[i, :len(row_ids)] = 1
    cols = torch.tensor([r[1] for r in rows])
    inputs = {"input_ids": ids.to(lm.device), "attention_mask": attention.to(lm.device)}
    log_probs = logits_at(lm, inputs, torch.arange(len(rows), device=lm.device),
                          cols.to(lm.device)).log_softmax(-1)
    targets = torch.tensor([r[2] for r in rows], device=lm.device)
    return log_probs.gather(1, targets[:, None])[:, 0].tolist()


def _check_candidates(candidates, max_candidates: int) -> list[str]:
    if isinstance(candidates, str):
        candidates = [c for c in re.split(r"[,\n]", candidates)]
    words = [c.strip() for c in candidates or [] if isinstance(c, str) and c.strip()]
    if not words:
        raise ValueError("No candidate words: type one or more words, separated by commas.")
    if len(words) > max_candidates:
        raise ValueError(f"{len(words)} candidates given; at most {max_candidates} at a time.")
    for w in words:
        if len(w) > 50 or USER_MASK_RE.search(w):
            raise ValueError(f"Candidate {w[:20]!r}... must be a word or short phrase "
                             "(at most 50 characters, no [MASK]).")
    return list(dict.fromkeys(words))


def _candidate_rows(lm: LoadedModel, text: str, mask_index: int, word: str) -> dict:
    """Rows (ids, position to score, target id) for one candidate, plus its pieces.

    The word is put into the sentence and tokenized in context, so tokenizers that care about
    the preceding space (RoBERTa's BPE) give the pieces they would give in running text.
    """
    parts = USER_MASK_RE.split(text)
    before = lm.to_model_text(USER_MASK.join(parts[:mask_index + 1]))
    after = lm.to_model_text(USER_MASK.join(parts[mask_index + 1:]))
    enc = lm.tokenizer(before + word + after, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    span = (len(before), len(before) + len(word))
    piece_idx = [i for i, (s, e) in enumerate(offsets) if e > s and s < span[1] and e > span[0]]
    if not piece_idx or len(piece_idx) > 16:
        raise ValueError(f"Candidate {word!r} does not tokenize to 1-16 pieces with this model.")
    validate.tokens_at_most(len(ids), lm.max_length, lm.name, f"text with {word[:20]!r}")
    rows = []
    for j, pos in enumerate(piece_idx):  # pieces before j are visible, j and after are masked
        row = list(ids)
        for later in piece_idx[j:]:
            row[later] = lm.mask_token_id
        rows.append((row, pos, ids[pos]))
    single = lm.tokenizer(lm.to_model_text(text))["input_ids"]  # the pipeline's one-mask view
    single_pos = [i for i, t in enumerate(single) if t == lm.mask_token_id][mask_index]
    rows.append((single, single_pos, ids[piece_idx[0]]))
    pieces = lm.tokenizer.convert_ids_to_tokens([ids[i] for i in piece_idx])
    return {"rows": rows, "pieces": pieces}


# ---------------------------------------------------------------- sentence score

@anatomy.guarded("The sentence score")
def sentence_score(lm: LoadedModel, text: str, batch_size: int = 64) -> dict:
    """Pseudo-log-likelihood (Salazar et al. 2020): mask each token in turn, sum log p(token).

    The T copies of the sentence (one per scored token) run as batches of `batch_size` rows,
    one forward for sentences up to that length. Returns {"tokens", "log_probs" (one per scored
    token), "pll", "pseudo_perplexity"}.
    """
    enc = encode(lm, text, min_masks=0, max_masks=0) if not USER_MASK_RE.search(text) else None
    if enc is None:
        raise ValueError("Sentence score needs a complete sentence: fill or remove the [MASK]s first.")
    ids = enc.input_ids[0]  # (T,)
    special = set(lm.tokenizer.all_special_ids)
    positions = [i for i, t in enumerate(ids.tolist()) if t not in special]
    if not positions:
        raise ValueError("The text has no words to score.")
    log_probs = []
    for chunk in _chunks(positions, batch_size):
        rows = ids.repeat(len(chunk), 1)  # (C, T): row r masks position chunk[r]
        cols = torch.tensor(chunk, device=lm.device)
        rows[torch.arange(len(chunk)), cols] = lm.mask_token_id
        others = {k: v.expand(len(chunk), -1) for k, v in enc.inputs.items() if k != "input_ids"}
        lp = logits_at(lm, {"input_ids": rows, **others},
                       torch.arange(len(chunk), device=lm.device), cols).log_softmax(-1)
        log_probs += lp.gather(1, ids[cols][:, None])[:, 0].tolist()
    pll = sum(log_probs)
    return {"tokens": lm.tokenizer.convert_ids_to_tokens(ids[positions].tolist()),
            "log_probs": log_probs, "pll": pll,
            "pseudo_perplexity": math.exp(min(-pll / len(positions), 700.0))}


def _chunks(items: list, size: int):
    for start in range(0, len(items), size):
        yield items[start:start + size]


# ---------------------------------------------------------------- words, for click-to-mask

def split_words(text: str) -> list[tuple[str, int, int]]:
    """Words and punctuation of `text` as (word, start, end); `[MASK]` counts as one word."""
    return [(m.group(), m.start(), m.end()) for m in _WORD_RE.finditer(text or "")]


def mask_word(text: str, index: int) -> str:
    """`text` with its `index`-th word (as `split_words` counts) replaced by `[MASK]`."""
    words = split_words(text)
    if not 0 <= index < len(words):
        raise ValueError(f"There is no word number {index} in the text ({len(words)} words).")
    _, start, end = words[index]
    return text[:start] + USER_MASK + text[end:]
