"""Inside a prediction: what each layer would predict (logit lens) and which input tokens caused the
prediction (Captum attributions). Two models side by side: `compare`.

Every function takes `LoadedModel`s and user text with `[MASK]`s (any case), like `fill_mask`,
and raises ValueError saying how to fix bad input.
"""
from __future__ import annotations

import torch

from .. import validate
from ..forward import anatomy, hooks
from ..model.loading import USER_MASK, USER_MASK_RE, LoadedModel
from ..model.logits import mlm_head, required_head
from .fillmask import DEFAULT_MAX_MASKS, Encoded, check_top_k, encode, prediction

METHODS = {"integrated_gradients": "Integrated gradients", "gradient_x_input": "Gradient × input"}
MAX_STEPS = 256
# Saliency costs about steps x tokens of forward+backward work. The cap lets the default 32 steps
# run on the longest text a BERT takes (512 tokens), and 256 steps on texts up to 64 tokens.
MAX_TOKEN_STEPS = 32 * 512
TOKENS_PER_BATCH = 2048  # Captum's internal batch, in rows x tokens: bounds memory on long texts
LENS_CAVEAT = ("The intermediate layers were never trained to be read by the MLM head (only the last "
               "one was), so their predictions show what is already decodable at that depth, not what "
               "the layer 'thinks': early layers often just echo the input or frequent tokens.")


# ---------------------------------------------------------------- layer by layer (logit lens)

@anatomy.guarded("The logit lens")
def layer_predictions(lm: LoadedModel, text: str, top_k: int = 5,
                      max_masks: int = DEFAULT_MAX_MASKS) -> list[dict]:
    """The model's own MLM head applied after the embeddings and after every layer, per mask.

    One forward with `output_hidden_states`; the head runs on (layers + 1) x masks rows only.
    Returns one entry per mask, in order of appearance:
    {"mask": number from 1, "position": index in the tokens,
     "layer_names": ["embeddings", "layer 1", ..., "layer L"],
     "layers": per layer the top-k in `fill_mask`'s format (the last equals `fill_mask`),
     "final": the model's top prediction, "final_rank": its rank at each layer (1 = top),
     "final_prob": its probability at each layer}.
    """
    top_k = check_top_k(top_k, lm)
    enc = encode(lm, text, max_masks=max_masks)
    probs = _layer_probs(lm, enc)  # (L+1, M, V)
    final_ids = probs[-1].argmax(-1)  # (M,)
    final_p = probs.gather(-1, final_ids.expand(probs.shape[0], -1)[..., None])  # (L+1, M, 1)
    ranks = (probs > final_p).sum(-1) + 1  # (L+1, M): tokens strictly more likely, plus one
    scores, ids = probs.topk(top_k, dim=-1)  # (L+1, M, k)
    names = ["embeddings"] + [f"layer {n}" for n in range(1, probs.shape[0])]
    return [{"mask": m + 1, "position": pos, "layer_names": names,
             "layers": [_top_k(lm, ids[layer, m], scores[layer, m]) for layer in range(len(names))],
             "final": prediction(lm, int(final_ids[m]), float(probs[-1, m, final_ids[m]])),
             "final_rank": ranks[:, m].tolist(), "final_prob": final_p[:, m, 0].tolist()}
            for m, pos in enumerate(enc.mask_positions)]


@torch.inference_mode()
def _layer_probs(lm: LoadedModel, enc: Encoded) -> torch.Tensor:
    """Probabilities (L+1, M, V) of the head on each hidden state at the M mask positions."""
    head = required_head(lm, "The logit lens")
    anatomy.of(lm.model).require("stream", "The logit lens")  # Funnel: its blocks pool the sequence
    with hooks.switched_off(lm):
        out = lm.model.base_model(**enc.inputs, output_hidden_states=True)
    # a pre-LayerNorm model's final norm belongs before the head at every depth; the last state
    # is the model's own output (norm included), so the last layer equals fill_mask
    norm = anatomy.final_norm(lm.model)
    states = [norm(h) for h in out.hidden_states[:-1]] + [out.last_hidden_state]
    states = torch.stack([h[0, enc.mask_positions] for h in states])  # (L+1, M, H)
    logits = head(states.flatten(0, 1)).float()  # ((L+1) * M, V): 2-D, the head's fast path
    return logits.view(*states.shape[:2], -1).softmax(-1)


def _top_k(lm: LoadedModel, ids: torch.Tensor, scores: torch.Tensor) -> list[dict]:
    return [prediction(lm, i, s) for i, s in zip(ids.tolist(), scores.tolist())]


# ---------------------------------------------------------------- which tokens caused it

@anatomy.guarded("Attributions")
def saliency(lm: LoadedModel, text: str, target: str | None = None, mask: int = 1,
             method: str = "integrated_gradients", steps: int = 32,
             max_masks: int = DEFAULT_MAX_MASKS) -> dict:
    """Attribution of log p(target at mask number `mask`) to every input token, with Captum.

    Attributions are taken at the input embeddings (the model is called with `inputs_embeds`, so
    no hook touches the shared model) and summed over the hidden size: one float per token.
    - "integrated_gradients": the baseline is the same sentence with every non-special token
      replaced by the pad token. [CLS], [SEP] and the [MASK]s stay, as do positions, so f(baseline)
      is the prediction with the context words removed, and the attributions share out exactly
      f(x) - f(baseline) up to `delta` = sum - (f(x) - f(baseline)), Captum's convergence
      delta, computed from the two forwards already run. Pad, not a zero vector: the
      zero vector is no token the model has seen, and pad is the model's own "nothing here".
    - "gradient_x_input": d f / d embedding . embedding per token; one backward, no baseline,
      `delta` is None.
    `target=None` explains the top prediction; a word that splits into pieces is explained for
    its first piece (`note` says so). Returns {"tokens", "attributions", "delta", "method",
    "steps", "mask", "position", "target": {"token", "token_id", "word", "pieces"}, "note",
    "log_prob", "baseline_log_prob"}.
    """
    enc = encode(lm, text, max_masks=max_masks)
    mask = validate.whole_number(mask, "mask number", 1, len(enc.mask_positions),
                                 f" (1 = the first {USER_MASK})", field="mask")
    method = _check_method(method)
    steps = validate.whole_number(steps, "number of steps", 1, MAX_STEPS, field="steps")
    n_tokens = enc.input_ids.shape[1]
    validate.length_at_most(steps * n_tokens, MAX_TOKEN_STEPS, f"saliency of {n_tokens} tokens x {steps} steps",
                            "token-steps", "Use fewer steps or a shorter text.", field="steps")
    position = enc.mask_positions[mask - 1]
    score = _mask_log_probs(lm, position)
    embeddings = lm.model.get_input_embeddings()
    with torch.no_grad():
        inputs = embeddings(enc.input_ids)  # (1, T, H)
        baseline = embeddings(pad_baseline(lm, enc.input_ids))  # (1, T, H)
        before, after = score(torch.cat([inputs, baseline])).cpu()  # (V,) each
    chosen = target_token(lm, text, mask - 1, target, int(before.argmax()))
    attributions = _attribute(score, inputs, baseline, chosen["token_id"], method, steps)
    gap = float(before[chosen["token_id"]] - after[chosen["token_id"]])  # f(x) - f(baseline)
    delta = float(attributions.sum()) - gap if method == "integrated_gradients" else None  # Captum's sign
    return {"tokens": lm.tokenizer.convert_ids_to_tokens(enc.input_ids[0].tolist()),
            "attributions": attributions.tolist(), "delta": delta, "method": method,
            "steps": steps if method == "integrated_gradients" else None, "mask": mask,
            "position": position, "target": chosen, "note": _pieces_note(chosen),
            "log_prob": float(before[chosen["token_id"]]),
            "baseline_log_prob": float(after[chosen["token_id"]]) if method == "integrated_gradients" else None}


def _attribute(score, inputs, baseline, token_id: int, method: str, steps: int) -> torch.Tensor:
    """Per-token attributions (T,): Captum's per-dimension ones summed over the hidden size."""
    # Imported here: Captum brings matplotlib, 1-2 s of every server start (and of each test's
    # `python app.py`) for a view many visitors never open.
    from captum.attr import InputXGradient, IntegratedGradients

    with torch.enable_grad():  # a caller's no_grad must not silence the gradients
        if method == "gradient_x_input":
            attr = InputXGradient(score).attribute(inputs.clone().requires_grad_(), target=token_id)
        else:
            rows = max(1, min(steps, TOKENS_PER_BATCH // inputs.shape[1]))
            attr = IntegratedGradients(score).attribute(
                inputs, baselines=baseline, target=token_id, n_steps=steps, internal_batch_size=rows)
    return attr[0].sum(-1).detach().double().cpu()


def _mask_log_probs(lm: LoadedModel, position: int):
    """f(embeddings (B, T, H)) -> log-probabilities (B, V) at `position`, the head only there."""
    head = mlm_head(lm.model, lm.caches.packed)

    def score(embeds: torch.Tensor) -> torch.Tensor:
        with hooks.switched_off(lm):
            if head is None:  # an unknown architecture: its full output, still correct
                logits = lm.model(inputs_embeds=embeds).logits[:, position]
            else:
                logits = head(lm.model.base_model(inputs_embeds=embeds).last_hidden_state[:, position])
        # float32 at least (a half-precision model's softmax loses the small probabilities)
        return logits.to(torch.promote_types(logits.dtype, torch.float32)).log_softmax(-1)
    return score


def pad_baseline(lm: LoadedModel, input_ids: torch.Tensor) -> torch.Tensor:
    """`input_ids` (B, T) with every non-special token replaced by the pad token."""
    special = torch.tensor(lm.tokenizer.all_special_ids, device=input_ids.device)
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else lm.tokenizer.unk_token_id
    return torch.where(torch.isin(input_ids, special), input_ids, torch.full_like(input_ids, pad))


def _check_method(method) -> str:
    if method not in METHODS:
        raise validate.InputError("method", f"Unknown attribution method {str(method)[:40]!r}: choose "
                                            f"{' or '.join(repr(m) for m in METHODS)}.")
    return method


def target_token(lm: LoadedModel, text: str, mask_index: int, target, top_id: int) -> dict:
    """The token explained at mask `mask_index` (from 0): the top prediction `top_id` when
    `target` is empty, else the first piece of the word asked for. {"token", "token_id", "word",
    "pieces"}; ValueError for a word the vocabulary lacks."""
    if target is None or (isinstance(target, str) and not target.strip()):
        return {"token": lm.tokenizer.decode([top_id]), "token_id": top_id, "word": None,
                "pieces": lm.tokenizer.convert_ids_to_tokens([top_id])}
    if not isinstance(target, str) or len(target.strip()) > 50 or USER_MASK_RE.search(target):
        raise validate.InputError("target", "The target must be one word (at most 50 characters, no "
                                            f"{USER_MASK}), or empty for the model's top prediction.")
    word = target.strip()
    ids = word_pieces(lm, text, mask_index, word)
    pieces = lm.tokenizer.convert_ids_to_tokens(ids)
    if not ids or lm.tokenizer.unk_token_id in ids:
        raise validate.InputError("target", f"{word!r} is not in {lm.name}'s vocabulary: it tokenizes "
                                            f"to {pieces}. Choose another word, or leave the target "
                                            "empty to explain the top prediction.")
    return {"token": lm.tokenizer.decode([ids[0]]), "token_id": ids[0], "word": word, "pieces": pieces}


def word_pieces(lm: LoadedModel, text: str, mask_index: int, word: str) -> list[int]:
    """Token ids of `word` written in place of mask `mask_index` (from 0), tokenized in context,
    so byte-level BPE (RoBERTa) gives the pieces it gives in running text (with the space)."""
    parts = USER_MASK_RE.split(text)
    before = lm.to_model_text(USER_MASK.join(parts[:mask_index + 1]))
    after = lm.to_model_text(USER_MASK.join(parts[mask_index + 1:]))
    enc = lm.tokenizer(before + word + after, return_offsets_mapping=True)
    start, end = len(before), len(before) + len(word)
    return [i for i, (s, e) in zip(enc["input_ids"], enc["offset_mapping"]) if e > s and s < end and e > start]


def _pieces_note(chosen: dict) -> str:
    if len(chosen["pieces"]) < 2:
        return ""
    return (f"{chosen['word']!r} splits into {len(chosen['pieces'])} pieces ({' '.join(chosen['pieces'])}): "
            f"explained for its first piece {chosen['pieces'][0]!r}, the token the mask predicts.")
