"""What the page shows of a layer's features: a sentence's features, a feature's card, a feature
switched off or turned up in fill-mask, the features behind a prediction, two uses of a word
contrasted (a dictionary's quality: `quality_views`; what a fine-tune changed: `drift`; a feature's
label and its score: `labels`).

Every function takes a `LoadedModel` and finds its dictionary in a `FeatureStore` (when none is
given, the one its caches hold: `store.shared_store`, an engine's for the models it loaded);
hidden states come from the anatomy's splice point (`forward.splice`), never from a family's
modules. A layer is counted as the rest of the page counts: 0 is the
embeddings, N the N-th layer's output. Every view reads and edits the positions the dictionary was
trained on and only those (`data.kept_positions`): at [CLS], [SEP] and padding no feature is
read, and the hidden state passes through untouched.
"""
from __future__ import annotations

import re

import torch

from .. import validate
from ..forward import splice
from ..model.loading import LoadedModel
from ..views.fillmask import DEFAULT_MAX_MASKS, encode, prediction
from .data import kept_positions
from .dictionary import Dictionary
from .effects import added_norm, output_effects, relative
from .labels import label, label_score, labelled
from .quality import logits_at
from .store import FeatureStore, shared_store

MAX_SCALE = 10.0  # a feature's contribution times at most this (0 = off, 1 = as it is)
MAX_ADD = 10.0  # added where it did not fire: at most this many times its mean activation
MAX_TOP = 50
MAX_CANDIDATES = 64
MAX_CONTRAST_LINES = 200
HEATMAP_FEATURES = 30


def load_features(lm: LoadedModel, layer: int, store: FeatureStore | None = None) -> Dictionary:
    """`lm`'s dictionary of `layer` in `store` (default the one its caches hold, `shared_store`);
    ValueError saying how to get one when it has none."""
    layer = splice.check_layer(lm.model, layer)
    found = (store or shared_store(lm.caches)).get(lm, layer)
    if found is None:
        raise validate.InputError("layer", f"{lm.name} has no feature dictionary for layer {layer} yet: "
                                           f"train one (Features tab, 'Train features for layer {layer}', "
                                           "or bertdemo.train_features).")
    return found


# ---------------------------------------------------------------- a sentence's features

@torch.no_grad()
def sentence_features(lm: LoadedModel, text: str, layer: int, top: int = 5,
                      store: FeatureStore | None = None) -> dict:
    """Each token's strongest features at `layer`, and a token x feature grid of those features.

    Returns {"layer", "tokens": every token, "per_token": [{"position", "token", "features":
    [{"feature", "activation", "label", "label_f1", "label_kind"}] strongest first}] for each counted
    token (not [CLS], [SEP]) ("label_f1", "label_kind": how well the label fits, `label_fit`), "heatmap": {"features", "labels", "activations": (tokens counted, features)}}."""
    dictionary = load_features(lm, layer, store)
    top = validate.whole_number(top, "number of features per token", 1, MAX_TOP, field="top")
    inputs = _tokenized(lm, text)
    keep = _kept(lm, inputs)[0]
    hidden = splice.read(lm.model, inputs, [dictionary.layer])[dictionary.layer][0]  # (T, H)
    positions = keep.nonzero().flatten().tolist()
    acts, indices = dictionary.encode(hidden[positions].float())  # (N, k)
    tokens = lm.tokenizer.convert_ids_to_tokens(inputs["input_ids"][0].tolist())
    words: dict[int, dict] = {}

    def named(feature: int) -> dict:  # a feature's label and its fit, once per feature
        if feature not in words:
            words[feature] = labelled(lm, dictionary, feature)
        return words[feature]
    per_token = []
    for row, position in enumerate(positions):
        order = acts[row].argsort(descending=True)[:top]
        per_token.append({"position": position, "token": tokens[position], "features": [
            {"feature": int(indices[row, i]), "activation": float(acts[row, i]), **named(int(indices[row, i]))}
            for i in order.tolist() if acts[row, i] > 0]})
    return {"layer": dictionary.layer, "tokens": tokens, "per_token": per_token,
            "heatmap": _heatmap(dictionary, acts, indices, per_token, lambda f: named(f)["label"])}


def _heatmap(dictionary: Dictionary, acts, indices, per_token: list[dict], named) -> dict:
    shown = {f["feature"] for t in per_token for f in t["features"]}
    dense = torch.zeros(acts.shape[0], dictionary.latents).scatter_(1, indices, acts)
    chosen = sorted(shown, key=lambda f: -float(dense[:, f].max()))[:HEATMAP_FEATURES]
    return {"features": chosen, "labels": [named(f) for f in chosen],
            "activations": dense[:, chosen].tolist() if chosen else [[] for _ in per_token]}


def _kept(lm: LoadedModel, inputs: dict) -> torch.Tensor:
    """(B, T) bool on the model's device: the positions a dictionary reads and edits (the one rule,
    `data.kept_positions`)."""
    ids = inputs["input_ids"]
    attention = inputs.get("attention_mask")
    attention = torch.ones_like(ids) if attention is None else attention
    return kept_positions(lm, ids.cpu(), attention.cpu()).to(ids.device)


def _coded(dictionary: Dictionary, hidden: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """hidden (..., H), keep (...) -> every feature's activation (..., F): the dictionary's codes at
    the kept positions, zero elsewhere (nothing fires on [CLS], [SEP] or padding)."""
    dense = dictionary.dense(hidden.reshape(-1, hidden.shape[-1]).float())
    dense = dense * keep.reshape(-1, 1).to(dense.device)
    return dense.view(*hidden.shape[:-1], -1)


def _tokenized(lm: LoadedModel, text: str) -> dict:
    validate.text(text)
    inputs = lm.tokenizer(lm.to_model_text(text), return_tensors="pt")
    validate.tokens_at_most(inputs["input_ids"].shape[1], lm.max_length, lm.name)
    return {k: v.to(lm.device) for k, v in inputs.items() if k in ("input_ids", "attention_mask", "token_type_ids")}


# ---------------------------------------------------------------- a feature's card

def feature_card(lm: LoadedModel, layer: int, feature: int, store: FeatureStore | None = None,
                 outputs: int = 10, change: torch.Tensor | None = None) -> dict:
    """Everything known of one feature: {"layer", "feature", "label", "label_score" (`label_score`),
    "density", "mean", "max", "histogram": {"edges", "shares"}, "contexts": [{"text", "token",
    "start", "end", "activation", "position"}] strongest first (start/end: the firing token's
    characters in text), "bands": [{"band" (1 weakest .. 10), "low", "high", "examples": [context]}]
    (deciles of its non-zero activations), "random_firings": [context], "at_mask": {"words":
    [{"token", "token_id", "firings", "share", "lift"}], "firings", "masks"} (the hidden words
    when it fires at a [MASK] of held-out lines), "promoted" and "suppressed": [{"token",
    "token_id", "logit_change", "clear"}] measured through the model's MLM head ("clear": the raise
    clears the noise, None where not measured), "cofiring": [{"feature", "share", "label", "label_f1",
    "label_kind"}],
    "statistics_tokens": tokens its statistics count, "missing": what its statistics lack, in words}.
    `change`: its output effect (V,), when the caller measured many features' at once
    (`output_effects` of a list: one batch of forwards instead of one per card); else measured here."""
    dictionary = load_features(lm, layer, store)
    feature = dictionary.check_feature(feature)
    stats = dictionary.stats
    if stats is None:
        raise ValueError(f"The dictionary of layer {dictionary.layer} has no statistics yet: train it again.")
    edges, shares = stats.histogram(feature)
    change = output_effects(lm, dictionary, [feature])[0] if change is None else change  # (V,)
    up, down = change.topk(outputs), (-change).topk(outputs)
    cofiring = [(f, s) for f, s in zip(stats["cofiring"][feature].tolist(), stats["cofiring_share"][feature].tolist())
                if f >= 0]
    context = lambda row: _context(lm, stats.contexts[row[0]], row[1], row[2])  # noqa: E731
    return {"layer": dictionary.layer, "feature": feature, "label": label(lm, dictionary, feature),
            "label_score": label_score(lm, dictionary, feature),
            "density": float(stats["density"][feature]), "mean": float(stats["mean"][feature]),
            "max": float(stats["max"][feature]), "statistics_tokens": stats.tokens,
            "histogram": {"edges": edges, "shares": shares},
            "contexts": [context(row) for row in stats.context_rows(feature)],
            "bands": [{"band": band, "low": low, "high": high, "examples": [context(row) for row in rows]}
                      for band, (low, high, rows) in enumerate(stats.band_rows(feature), 1)]
            if stats.has("band_edges") else [],
            "random_firings": [context(row) for row in stats.random_rows(feature)] if stats.has("random_line") else [],
            "at_mask": _at_mask(lm, stats, feature),
            "promoted": _changes(lm, up.indices, up.values, _clear(dictionary, feature, change, up.indices)),
            "suppressed": _changes(lm, down.indices, -down.values, [None] * len(down.indices)),
            "cofiring": [{"feature": f, "share": float(s), **labelled(lm, dictionary, f)} for f, s in cofiring],
            "missing": _missing(stats)}


# What a card shows from each field of the statistics, for the line saying what a file lacks.
_CARD_FIELDS = {"label_f1": "the label's score", "band_edges": "the activation bands",
                "random_line": "the random firings", "mask_words": "the words at a [MASK]",
                "noise_per_unit": "which promoted words clear the noise"}


def _missing(stats) -> str:
    """What `stats` lacks of what a card shows, in words ("" when nothing)."""
    lacking = [what for name, what in _CARD_FIELDS.items() if not stats.has(name)
               and (name != "noise_per_unit" or stats.has("promoted"))]  # promoted words are a shipped build's
    if not lacking:
        return ""
    return ("This dictionary's statistics were made before the card showed " + ", ".join(lacking)
            + ": they are not shown. Make its statistics again to have them: train it again here, or for the "
              "shipped ones python -m bertdemo train-features --labels-only (transcoders: train-transcoders "
              "--statistics-only).")


def _clear(dictionary: Dictionary, feature: int, change: torch.Tensor, ids: torch.Tensor) -> list[bool | None]:
    """Whether each promoted word's raise over the average word clears the dictionary's noise
    (`effects.promoted`); None each where the statistics did not measure it."""
    stats = dictionary.stats
    if not stats.has("noise_per_unit"):
        return [None] * len(ids)
    floor = float(stats["noise_per_unit"][0]) * float(added_norm(dictionary, [feature])[0])
    return [bool(v > floor) for v in relative(change)[ids].tolist()]


def _at_mask(lm: LoadedModel, stats, feature: int) -> dict:
    """The hidden words when `feature` fires at a [MASK] of the held-out lines (`stats.mask_words`)."""
    if not stats.has("mask_words"):
        return {"words": [], "firings": 0, "masks": 0}
    fires = int(stats["mask_fires"][feature])
    words = [{"token": lm.tokenizer.convert_ids_to_tokens(t), "token_id": t, "firings": c,
              "share": c / max(1, fires), "lift": float(lift)}
             for t, c, lift in zip(stats["mask_words"][feature].tolist(), stats["mask_word_count"][feature].tolist(),
                                   stats["mask_word_lift"][feature].tolist()) if t >= 0]
    return {"words": words, "firings": fires, "masks": int(stats["mask_positions"][0])}


def _context(lm: LoadedModel, text: str, position: int, activation: float) -> dict:
    """A context line with the character span of its token at `position` (with special tokens, as
    the statistics' pass tokenized it)."""
    encoding = lm.tokenizer(text, return_offsets_mapping=True)
    start, end = encoding["offset_mapping"][position] if position < len(encoding["offset_mapping"]) else (0, 0)
    token = lm.tokenizer.convert_ids_to_tokens(encoding["input_ids"][position]) if position < len(encoding["input_ids"]) else ""
    return {"text": text, "token": token, "position": position, "start": int(start), "end": int(end),
            "activation": float(activation)}


def _changes(lm: LoadedModel, ids: torch.Tensor, values: torch.Tensor, clear: list[bool | None]) -> list[dict]:
    return [{"token": lm.tokenizer.decode([i]), "token_id": i, "logit_change": v, "clear": c}
            for i, v, c in zip(ids.tolist(), values.tolist(), clear)]


# ---------------------------------------------------------------- switched off, turned up

def steering_edit(dictionary: Dictionary, feature: int, scale: float, add: float, add_at: torch.Tensor | None,
                  keep: torch.Tensor):
    """The edit of layer (B, T, H) that scales `feature`'s contribution by `scale` where it fires
    (its activation x decoder row; the rest, the coder's error included, untouched) and adds `add`
    x its mean activation x its decoder row at the positions `add_at` (B, T) where it does not fire,
    all at the kept positions `keep` (B, T) alone: [CLS], [SEP] and padding pass through untouched.
    With scale 1 and add 0 the layer is returned exactly as it was."""
    direction = dictionary.direction(feature)
    typical = float(dictionary.stats["mean"][feature]) if dictionary.stats is not None else 1.0

    def edit(hidden):
        if scale == 1.0 and add == 0.0:
            return None
        kept = keep.to(hidden.device).expand(hidden.shape[:-1])
        activation = _coded(dictionary, hidden, kept)[..., feature].to(hidden.device)  # (B, T)
        change = (scale - 1.0) * activation
        if add and add_at is not None:
            change = change + add * typical * (add_at.to(hidden.device) & kept & (activation == 0)).float()
        return hidden + (change[..., None] * direction.to(hidden.device)).to(hidden.dtype)
    return edit


@torch.no_grad()
def steer(lm: LoadedModel, text: str, layer: int, feature: int, scale: float = 0.0, add: float = 0.0,
          top_k: int = 5, store: FeatureStore | None = None, max_masks: int = DEFAULT_MAX_MASKS) -> dict:
    """Fill-mask before and after `feature`'s contribution at `layer` is scaled by `scale` (0 = off,
    2 = doubled) and `add` x its mean activation is added at the [MASK]s where it does not fire.
    The coder's error term is kept, so with scale 1 and add 0 every probability equals the clean
    model's. One forward of two rows: the sentence as it is, and edited (one row with no edit).

    Returns {"layer", "feature", "label", "scale", "add", "fired": [{"position", "token",
    "activation"}], "masks": [{"mask", "position", "before": top-k, "after": top-k, "tokens":
    [{"token", "token_id", "before", "after"}] (the union of both top-k)}]}."""
    dictionary = load_features(lm, layer, store)
    feature = dictionary.check_feature(feature)
    scale = validate.number(scale, "scale", 0.0, MAX_SCALE, field="scale")
    add = validate.number(add, "amount added", 0.0, MAX_ADD, field="add")
    top_k = validate.whole_number(top_k, "top_k", 1, MAX_TOP, field="top_k")
    enc = encode(lm, text, max_masks=max_masks)
    masks = torch.tensor(enc.mask_positions, device=lm.device)
    at_masks = torch.zeros_like(enc.input_ids, dtype=torch.bool)
    at_masks[0, masks] = True
    keep = _kept(lm, enc.inputs)  # (1, T)
    edit = steering_edit(dictionary, feature, scale, add, at_masks, keep)
    seen = {}

    copies = 1 if scale == 1.0 and add == 0.0 else 2  # no edit: one row, and after is before to the bit

    def second_row(hidden):  # (copies, T, H): row 0 stays as it is
        seen["activation"] = _coded(dictionary, hidden[0], keep[0])[:, feature]
        edited = edit(hidden[1:]) if copies == 2 else None
        return None if edited is None else torch.cat([hidden[:1], edited])
    batch = {k: v.repeat(copies, 1) for k, v in enc.inputs.items()}
    rows = torch.arange(copies, device=lm.device).repeat_interleave(len(masks))
    probs = logits_at(lm, batch, rows, masks.repeat(copies), {dictionary.layer: second_row}).float().softmax(-1)
    before, after = probs[:len(masks)], probs[-len(masks):]
    fired = seen["activation"]
    tokens = lm.tokenizer.convert_ids_to_tokens(enc.input_ids[0].tolist())
    return {"layer": dictionary.layer, "feature": feature, "label": label(lm, dictionary, feature),
            "scale": scale, "add": add,
            "fired": [{"position": p, "token": tokens[p], "activation": float(fired[p])}
                      for p in fired.nonzero().flatten().tolist()],
            "masks": [_before_after(lm, m, int(position), before[m], after[m], top_k)
                      for m, position in enumerate(enc.mask_positions)]}


def _before_after(lm: LoadedModel, m: int, position: int, before: torch.Tensor, after: torch.Tensor, top_k: int) -> dict:
    top_before, top_after = before.topk(top_k), after.topk(top_k)
    union = list(dict.fromkeys(top_before.indices.tolist() + top_after.indices.tolist()))
    return {"mask": m + 1, "position": position,
            "before": [prediction(lm, i, s) for i, s in zip(top_before.indices.tolist(), top_before.values.tolist())],
            "after": [prediction(lm, i, s) for i, s in zip(top_after.indices.tolist(), top_after.values.tolist())],
            "tokens": [{"token": lm.tokenizer.decode([i]), "token_id": i, "before": float(before[i]),
                        "after": float(after[i])} for i in union]}


# ---------------------------------------------------------------- the features behind a prediction

def prediction_features(lm: LoadedModel, text: str, layer: int, top: int = 10, candidates: int = 20,
                        store: FeatureStore | None = None, max_masks: int = DEFAULT_MAX_MASKS) -> dict:
    """For each [MASK]'s top word: the features active at `layer` (over the sentence's kept positions:
    every token but [CLS], [SEP] and padding) that most lower its log-probability when switched off.
    A first-order estimate (the gradient of the word's log-probability at the layer, dotted with
    each feature's contribution) picks `candidates`; each is then switched off for real (its
    activation x decoder row removed at every kept position, the coder's error kept), and the
    number shown is that measured change.

    Returns {"layer", "masks": [{"mask", "position", "word", "token_id", "log_prob", "features":
    [{"feature", "label", "label_f1", "label_kind", "drop", "estimate", "activation"}] largest drop
    first}]} ("label_f1", "label_kind": how well the label fits, `label_fit`)."""
    dictionary = load_features(lm, layer, store)
    top = validate.whole_number(top, "number of features", 1, MAX_TOP, field="top")
    candidates = validate.whole_number(candidates, "number of candidates", 1, MAX_CANDIDATES, field="candidates")
    enc = encode(lm, text, max_masks=max_masks)
    inputs = dict(enc.inputs)
    masks = torch.tensor(enc.mask_positions, device=lm.device)
    words, estimates, dense = _estimates(lm, dictionary, inputs, masks)  # (M,), (M, F), (T, F)
    out = []
    for m, position in enumerate(enc.mask_positions):
        active = (dense.sum(0) > 0).nonzero().flatten()
        picked = active[estimates[m, active].argsort(descending=True)[:candidates]].tolist()
        drops = _measured_drops(lm, dictionary, inputs, int(position), int(words[m]), picked, dense)
        clean = drops.pop("clean")
        ranked = sorted(picked, key=lambda f: -drops[f])[:top]
        out.append({"mask": m + 1, "position": int(position), "word": lm.tokenizer.decode([int(words[m])]),
                    "token_id": int(words[m]), "log_prob": clean,
                    "features": [{"feature": f, **labelled(lm, dictionary, f), "drop": drops[f],
                                  "estimate": float(estimates[m, f]), "activation": float(dense[:, f].sum())}
                                 for f in ranked]})
    return {"layer": dictionary.layer, "masks": out}


def _estimates(lm, dictionary: Dictionary, inputs: dict, masks: torch.Tensor):
    """(top word per mask (M,), first-order drop of its log-prob per feature (M, F), the features'
    activations at every position (T, F), zero outside the kept positions: switched off where they
    fire, as `steer` does)."""
    held = {}

    def grab(hidden):
        held["h"] = hidden.detach().requires_grad_(True)
        return held["h"]
    with torch.enable_grad():
        logits = logits_at(lm, inputs, torch.zeros_like(masks), masks, {dictionary.layer: grab}).float()
        log_probs = logits.log_softmax(-1)
        words = log_probs.argmax(-1)
        chosen = log_probs.gather(-1, words[:, None])[:, 0]  # (M,)
        grads = [torch.autograd.grad(chosen[m], held["h"], retain_graph=m + 1 < len(chosen))[0][0]
                 for m in range(len(chosen))]  # each (T, H)
    hidden = held["h"].detach()[0].float()
    dense = _coded(dictionary, hidden, _kept(lm, inputs)[0])  # (T, F)
    W = dictionary.coder.W_dec  # (F, H)
    estimates = torch.stack([(dense * (g.float().cpu() @ W.T)).sum(0) for g in grads])  # (M, F)
    return words.cpu(), estimates, dense


@torch.no_grad()
def _measured_drops(lm, dictionary: Dictionary, inputs: dict, position: int, word: int, features: list[int],
                    dense: torch.Tensor) -> dict:
    """{"clean": log p(word), feature: log p(word) clean - with that feature switched off}."""
    count = len(features) + 1  # row 0: nothing switched off
    batch = {k: v.repeat(count, 1) for k, v in inputs.items()}
    removed = torch.zeros(count, dense.shape[0], dictionary.width)  # (rows, T, H)
    for row, feature in enumerate(features, 1):
        removed[row] = dense[:, feature:feature + 1] * dictionary.direction(feature)[None]

    def switch_off(hidden):
        return hidden - removed.to(hidden.device, hidden.dtype)
    rows = torch.arange(count, device=lm.device)
    cols = torch.full((count,), position, device=lm.device)
    log_p = logits_at(lm, batch, rows, cols, {dictionary.layer: switch_off}).float().log_softmax(-1)[:, word]
    return {"clean": float(log_p[0]), **{f: float(log_p[0] - log_p[row]) for row, f in enumerate(features, 1)}}


# ---------------------------------------------------------------- two uses of a word

@torch.no_grad()
def contrast_features(lm: LoadedModel, texts_a: list[str], texts_b: list[str], word: str, layer: int,
                      top: int = 10, store: FeatureStore | None = None) -> dict:
    """The features that separate two uses of `word`: for each, the share of list A's occurrences
    of the word it fires on (on any of the word's pieces) and list B's.

    Returns {"layer", "word", "occurrences": {"a", "b"}, "a": [{"feature", "label", "label_f1",
    "label_kind", "share_a", "share_b", "separation"}] (features of A's use, separation = share_a -
    share_b, largest first), "b": likewise for B's use}."""
    dictionary = load_features(lm, layer, store)
    word = validate.text(word, "word", example="bank").strip()
    if not re.fullmatch(r"[\w'’-]+", word):
        raise validate.InputError("word", f"Type one word to contrast (letters only), got {validate.shown(word)}.")
    top = validate.whole_number(top, "number of features", 1, MAX_TOP, field="top")
    fired_a, fired_b = (_fired_on_word(lm, dictionary, _lines(texts, name), word, name)
                        for texts, name in ((texts_a, "texts_a"), (texts_b, "texts_b")))
    share_a, share_b = fired_a.float().mean(0), fired_b.float().mean(0)
    separation = share_a - share_b

    def ranked(sign: float) -> list[dict]:
        order = (sign * separation).argsort(descending=True)[:top]
        return [{"feature": f, **labelled(lm, dictionary, f), "share_a": float(share_a[f]),
                 "share_b": float(share_b[f]), "separation": float(separation[f])}
                for f in order.tolist() if sign * separation[f] > 0]
    return {"layer": dictionary.layer, "word": word, "occurrences": {"a": len(fired_a), "b": len(fired_b)},
            "a": ranked(1.0), "b": ranked(-1.0)}


_LIST_NAMES = {"texts_a": "list A (texts_a)", "texts_b": "list B (texts_b)"}


def _lines(texts, name: str) -> list[str]:
    if isinstance(texts, str):
        texts = texts.splitlines()
    lines = [t.strip() for t in texts or [] if isinstance(t, str) and t.strip()]
    if not lines:
        raise validate.InputError(name, f"{_LIST_NAMES[name]} is empty: each list needs at least one sentence "
                                        "using the word, one per line.")
    validate.length_at_most(len(lines), MAX_CONTRAST_LINES, _LIST_NAMES[name], "sentences", field=name)
    return lines


def _fired_on_word(lm, dictionary: Dictionary, lines: list[str], word: str, name: str) -> torch.Tensor:
    """(occurrences, F) bool: which features fire on each occurrence of `word` in `lines`."""
    pattern = re.compile(rf"(?<!\w){re.escape(word)}(?!\w)", re.IGNORECASE)
    rows = []
    for line in lines:
        spans = [m.span() for m in pattern.finditer(line)]
        if not spans:
            continue
        encoding = lm.tokenizer(line, return_offsets_mapping=True, return_tensors="pt")
        validate.tokens_at_most(encoding["input_ids"].shape[1], lm.max_length, lm.name, field=name)
        offsets = encoding.pop("offset_mapping")[0].tolist()
        inputs = {k: v.to(lm.device) for k, v in encoding.items() if k in ("input_ids", "attention_mask")}
        keep = _kept(lm, inputs)[0]
        dense = _coded(dictionary, splice.read(lm.model, inputs, [dictionary.layer])[dictionary.layer][0], keep)
        for start, end in spans:
            pieces = [i for i, (s, e) in enumerate(offsets) if e > s and s < end and e > start and keep[i]]
            if pieces:
                rows.append((dense[pieces] > 0).any(0))
    if not rows:
        raise validate.InputError(name, f"No sentence in {_LIST_NAMES[name]} uses the word {word!r}: each "
                                        "sentence should, in the sense that list stands for.")
    return torch.stack(rows)
