"""Two models side by side on the same input: each one's predictions at every mask and how much
each token's probability changed (`compare_predictions`, a token matched across vocabularies by
`same_token`), both models' sentence scores (`compare_scores`), and the fine-tune's probes before
and after (`compare_probes`). Fill mask's "compare with", heads off and the fine-tune all show these."""
from __future__ import annotations

import torch

from .. import validate
from ..forward import anatomy
from ..model.loading import USER_MASK_RE, LoadedModel
from .fillmask import (DEFAULT_MAX_MASKS, check_top_k, encode, fill_jointly, fill_mask, logits_at, prediction,
                       sentence_score)


@anatomy.guarded("Comparing two models")
def compare_predictions(lm: LoadedModel, other_model: LoadedModel, text: str, top_k: int = 5,
                        max_masks: int = DEFAULT_MAX_MASKS, max_top_k: int = 10**9) -> dict:
    """Both models' top-k per mask (each as `fill_mask` gives it) and how each token's
    probability changes from `lm` to `other_model`; `top_k` from 1 to `max_top_k` (a server's limit).

    Returns {"models": [lm.name, other_model.name], "masks": [{"mask": number from 1, "a": lm's top-k,
    "b": other_model's top-k, "changes": [{"token", "a", "b", "change"}]}]}: `changes` lists the tokens
    of either top-k (lm's first) with their probability under each model and b - a; a token the
    other model's vocabulary lacks has None there (BERT's `capital` is RoBERTa's `Ġcapital`: the
    same word start is matched).
    """
    top_k = min(check_top_k(top_k, lm, max_top_k, name="top-k"), other_model.model.config.vocab_size)
    probs_a, probs_b = _mask_probs(lm, text, max_masks), _mask_probs(other_model, text, max_masks)
    masks = []
    for m, (pa, pb) in enumerate(zip(probs_a, probs_b)):  # (V_a,), (V_b,)
        top_a, top_b = _top_k(lm, *_ids_scores(pa, top_k)), _top_k(other_model, *_ids_scores(pb, top_k))
        masks.append({"mask": m + 1, "a": top_a, "b": top_b,
                      "changes": _changes(lm, other_model, pa, pb, top_a, top_b)})
    return {"models": [lm.name, other_model.name], "masks": masks}


def _top_k(lm: LoadedModel, ids: torch.Tensor, scores: torch.Tensor) -> list[dict]:
    return [prediction(lm, i, s) for i, s in zip(ids.tolist(), scores.tolist())]


def _ids_scores(probs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    scores, ids = probs.topk(k)
    return ids, scores


def _mask_probs(lm: LoadedModel, text: str, max_masks: int) -> torch.Tensor:
    """Probabilities (M, V) at each mask: `fill_mask`'s forward, all of the vocabulary kept."""
    enc = encode(lm, text, max_masks=max_masks)
    cols = torch.tensor(enc.mask_positions, device=lm.device)
    return logits_at(lm, enc.inputs, torch.zeros_like(cols), cols).softmax(-1).cpu()


def _changes(lm, other, pa, pb, top_a: list[dict], top_b: list[dict]) -> list[dict]:
    """Each token of either top-k once, with p under each model (None if its vocabulary lacks it)."""
    pairs = [(p["token"], p["token_id"], same_token(lm, p["token_id"], other)) for p in top_a]
    pairs += [(p["token"], same_token(other, p["token_id"], lm), p["token_id"]) for p in top_b]
    rows, seen = [], set()
    for token, id_a, id_b in pairs:
        if (id_a, id_b) in seen:
            continue
        seen.add((id_a, id_b))
        a = float(pa[id_a]) if id_a is not None else None
        b = float(pb[id_b]) if id_b is not None else None
        rows.append({"token": token, "a": a, "b": b,
                     "change": b - a if a is not None and b is not None else None})
    return rows


def same_token(source: LoadedModel, token_id: int, target: LoadedModel) -> int | None:
    """The id in `target`'s vocabulary of `source`'s token `token_id`, None if it has none.

    The same entry when both share a vocabulary (a tuned model and its base, BERT and DistilBERT);
    across tokenizer families, the same word start ('capital' in BERT, 'Ġcapital' in RoBERTa).
    """
    raw = source.tokenizer.convert_ids_to_tokens(token_id)
    if target.tokenizer.convert_ids_to_tokens(token_id) == raw:
        return token_id
    word = source.tokenizer.decode([token_id]).strip()
    for candidate in ("Ġ" + word, "▁" + word, word):
        found = target.tokenizer.convert_tokens_to_ids(candidate)
        if found is not None and found != target.tokenizer.unk_token_id:
            return found
    return None


@anatomy.guarded("Comparing two models' scores")
def compare_scores(lm: LoadedModel, other_model: LoadedModel, text: str,
                   max_masks: int = DEFAULT_MAX_MASKS) -> dict:
    """Both models' sentence score (pseudo-log-likelihood) of the same sentence.

    Masks in `text` are first filled with `lm`'s best joint completion, so both score one
    sentence. Returns {"sentence", "models", "a": sentence_score(lm), "b": sentence_score(other_model),
    "change": b's PLL - a's, "token_changes": per token b - a log-prob, None when the two
    tokenizers cut the sentence differently}.
    """
    sentence = validate.text(text)
    if USER_MASK_RE.search(sentence):
        sentence = fill_jointly(lm, sentence, 1, max_masks=max_masks)[0]["text"]
    a, b = sentence_score(lm, sentence), sentence_score(other_model, sentence)
    same_cut = a["tokens"] == b["tokens"]
    return {"sentence": sentence, "models": [lm.name, other_model.name], "a": a, "b": b,
            "change": b["pll"] - a["pll"],
            "token_changes": [y - x for x, y in zip(a["log_probs"], b["log_probs"])] if same_cut else None}


def compare_probes(before: LoadedModel, after: LoadedModel, probes: list[str], top_k: int = 3,
                   max_masks: int = 10) -> list[dict]:
    """Fill-mask top-k of each probe with both models: [{"probe", "before", "after"}], where
    before/after are `fill_mask` outputs (a list per mask)."""
    probes = [p.strip() for p in probes if p and p.strip()]
    if not probes:
        raise ValueError("No probe sentences: write one or more sentences with [MASK], one per line.")
    if len(probes) > 10:
        raise ValueError(f"{len(probes)} probe sentences given; at most 10 at a time.")
    return [{"probe": p, "before": fill_mask(before, p, top_k, max_masks=max_masks),
             "after": fill_mask(after, p, top_k, max_masks=max_masks)} for p in probes]
