"""Where a word's meaning lives, layer by layer: contextual embeddings mapped in 2-D, and linear
probes that ask which layer knows a labelling.

Both read h_i^l, the hidden state of token i after layer l (l = 0: the embeddings), from the
model's own `output_hidden_states`. The map is PCA of those states (centred, the top two
components); the probes are logistic regressions (scikit-learn) on frozen, mean-pooled states of
each layer, scored on the Classify tab's held-out split.

    bertdemo.embedding_map(lm, ["I sat by the river bank.", "The bank lent me money."], layer=6, word="bank")
    bertdemo.probe_layers(lm, [("great film", "pos"), ("dull plot", "neg"), ...])

The probes' input is checked once into a `ProbePlan` (`plan_probe`: the examples, the seed, the
split), which `run_probe` runs: the Classify tab's validator makes the plan, its handler runs it.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch

from .. import validate
from ..config import Limits
from ..forward import anatomy, hooks
from ..labelled import Split, check_examples, stratified_split
from ..model.loading import LoadedModel

MAX_LINES = 50  # sentences per map (Settings.embedding_max_lines)
MAX_TOKENS = 2_000  # tokens of all sentences together (Settings.embedding_max_tokens)
NEIGHBOURS = 3  # nearest points listed per point
BATCH = 32  # sentences per forward


@dataclass(frozen=True)
class Encoded:
    """Sentences through the model: per sentence its tokens, character spans, which are special,
    and its hidden states at one layer, `states[s]`: float32 (T_s, hidden)."""

    texts: list[str]
    tokens: list[list[str]]
    spans: list[list[tuple[int, int]]]
    special: list[list[bool]]
    states: list[np.ndarray]


def sentences(texts, *, max_lines: int = MAX_LINES) -> list[str]:
    """`texts` (a list, or one string with a sentence per line) as non-empty stripped lines."""
    if isinstance(texts, str):
        texts = texts.splitlines()
    if not isinstance(texts, (list, tuple)) or not all(isinstance(t, str) for t in texts):
        raise validate.InputError("texts", "The sentences must be text, one per line.")
    lines = [t.strip() for t in texts if t.strip()]
    if not lines:
        raise validate.InputError("texts", "There are no sentences: type one per line, e.g. "
                                           "'I sat on the river bank.' and 'The bank lent me money.'")
    validate.length_at_most(len(lines), max_lines, "list of sentences", "lines", "Use fewer sentences.",
                            field="texts")
    return lines


@torch.inference_mode()
def encode(lm: LoadedModel, texts: list[str], layer: int, *, max_tokens: int = MAX_TOKENS) -> Encoded:
    """Every sentence's hidden states after `layer` (0 = the embeddings; one padded forward per
    BATCH sentences, only that layer's states kept). Refuses a sentence past the model's length and `max_tokens` in all."""
    enc = lm.tokenizer(texts, return_offsets_mapping=True, return_special_tokens_mask=True, truncation=False)
    lengths = [len(ids) for ids in enc["input_ids"]]
    for number, length in enumerate(lengths, 1):
        validate.tokens_at_most(length, lm.max_length, lm.name, f"sentence on line {number}", field="texts")
    validate.length_at_most(sum(lengths), max_tokens, "list of sentences", "tokens", "Use fewer or shorter "
                            "sentences.", field="texts")
    states: list = [None] * len(texts)
    for group in anatomy.batches(lm.model, lengths, BATCH):  # padded, or one length per forward
        batch = lm.tokenizer.pad([{"input_ids": enc["input_ids"][i]} for i in group], return_tensors="pt").to(lm.device)
        with hooks.switched_off(lm):  # a heads-off view (heads.heads_off) maps without its heads
            hidden = lm.model.base_model(**batch, output_hidden_states=True).hidden_states  # L+1 x (B, T, H)
        _check_per_token(lm, hidden, layer, batch["input_ids"].shape[1])
        at_layer = hidden[layer].float().cpu().numpy()  # (B, T, H)
        for row, i in enumerate(group):
            states[i] = at_layer[row, :lengths[i]]
    return Encoded(texts, [lm.tokenizer.convert_ids_to_tokens(ids) for ids in enc["input_ids"]],
                   [[tuple(span) for span in spans] for spans in enc["offset_mapping"]],
                   [[bool(s) for s in mask] for mask in enc["special_tokens_mask"]], states)


def _check_per_token(lm: LoadedModel, hidden: tuple, layer: int, length: int) -> None:
    """InputError when `layer`'s states (of a forward of `length` tokens) are not one per token:
    Funnel pools the sequence between its blocks."""
    if hidden[layer].shape[1] == length:
        return
    per_token = [str(n) for n, h in enumerate(hidden[:layer_count(lm) + 1]) if h.shape[1] == length]
    raise validate.InputError("layer", f"Layer {layer} of this model ({anatomy.of(lm.model).name}) holds a pooled "
                                       f"sequence ({hidden[layer].shape[1]} positions for {length} tokens), not one "
                                       f"state per token: choose layer {' or '.join(per_token)}.")


def layer_count(lm: LoadedModel) -> int:
    return lm.model.config.num_hidden_layers if hasattr(lm.model.config, "num_hidden_layers") \
        else lm.model.config.n_layers


def check_layer(lm: LoadedModel, layer) -> int:
    last = layer_count(lm)
    return validate.whole_number(layer, "layer", 0, last, f" (0 = the embeddings, {last} = the last layer)",
                                 field="layer")


# ---------------------------------------------------------------- the map

@anatomy.guarded("The embedding map")
def embedding_map(lm: LoadedModel, texts, *, layer: int, word: str | None = None,
                  max_lines: int = MAX_LINES, max_tokens: int = MAX_TOKENS) -> dict:
    """The hidden states at `layer` (0 = embeddings, L = last) as points on their top two
    principal components.

    Points: every non-special token of every sentence, or, with `word`, each occurrence of that
    word (whole word, any case; a word split into pieces is the mean of its pieces): the lines
    without it are left out and listed in "missing". Returns {"layer", "word", "missing":
    [{"line" (1-based), "text"}] (empty without a word), "points": [{"sentence" (0-based line),
    "text", "token", "position" (token
    index; a word's first piece), "x", "y", "neighbours": [{"point", "similarity"}] (the NEIGHBOURS
    nearest other points by cosine in the full hidden space)}], "explained": [ratio of the total
    variance on each axis]}. Each axis' sign is fixed so its largest loading is positive (as
    scikit-learn's PCA does)."""
    lines = sentences(texts, max_lines=max_lines)
    layer = check_layer(lm, layer)
    if word is not None and not isinstance(word, str):
        raise validate.InputError("word", "The word must be text, e.g. 'bank', or empty to map every token.")
    word = word.strip() or None if word else None
    encoded = encode(lm, lines, layer, max_tokens=max_tokens)
    points, vectors, missing = _word_points(encoded, word) if word else (*_token_points(encoded), [])
    if len(points) < 2:
        why = f", and {_not_in(word, missing)}" if missing else ""
        raise validate.InputError("texts", f"A map needs at least two points{why}: add a sentence (or a word "
                                           "that occurs more than once).")
    coords, explained = pca_2d(vectors)
    for point, (x, y), near in zip(points, coords, nearest(vectors)):
        point.update(x=float(x), y=float(y), neighbours=near)
    return {"layer": layer, "word": word, "points": points, "explained": explained,
            "missing": [{"line": n, "text": lines[n - 1]} for n in missing]}


def _not_in(word: str, lines: list[int]) -> str:
    shown = word if len(word) <= 40 else word[:40] + "…"
    return f"'{shown}' is not in line{'s' if len(lines) > 1 else ''} {', '.join(map(str, lines))}"


def _token_points(encoded: Encoded) -> tuple[list[dict], np.ndarray]:
    points, vectors = [], []
    for s, text in enumerate(encoded.texts):
        for i, token in enumerate(encoded.tokens[s]):
            if not encoded.special[s][i]:
                points.append({"sentence": s, "text": text, "token": token, "position": i})
                vectors.append(encoded.states[s][i])
    return points, np.asarray(vectors)


def _word_points(encoded: Encoded, word: str) -> tuple[list[dict], np.ndarray, list[int]]:
    """One point per occurrence of `word`: the mean of the pieces whose characters it covers; and
    the lines (1-based) without it. ValueError if no line has it."""
    pattern = re.compile(rf"(?<!\w){re.escape(word)}(?!\w)", re.IGNORECASE)
    points, vectors, missing = [], [], []
    for s, text in enumerate(encoded.texts):
        found = list(pattern.finditer(text))
        if not found:
            missing.append(s + 1)
        for match in found:
            pieces = [i for i, (a, b) in enumerate(encoded.spans[s])
                      if not encoded.special[s][i] and a < match.end() and b > match.start()]
            if pieces:
                points.append({"sentence": s, "text": text, "token": match.group(0), "position": pieces[0],
                               "pieces": [encoded.tokens[s][i] for i in pieces]})
                vectors.append(encoded.states[s][pieces].mean(0))
    if not points:
        raise validate.InputError("word", f"{_not_in(word, missing)}: use it in at least two sentences, or "
                                          "leave the word empty to map every token.")
    return points, np.asarray(vectors), missing


def pca_2d(vectors: np.ndarray) -> tuple[np.ndarray, list[float]]:
    """(N, H) -> the (N, 2) coordinates on the top two principal components and the share of the
    total variance each explains. By hand: three lines of SVD beat pulling in a fitted estimator."""
    centred = vectors - vectors.mean(0)
    _, singular, axes = np.linalg.svd(centred, full_matrices=False)  # axes: (k, H)
    axes = axes[:2]
    axes = axes * np.sign(axes[np.arange(len(axes)), np.abs(axes).argmax(1)])[:, None]
    variance = singular ** 2
    total = variance.sum() or 1.0
    explained = [float(v / total) for v in variance[:2]] + [0.0] * (2 - len(variance[:2]))
    coords = centred @ axes.T
    return np.pad(coords, ((0, 0), (0, 2 - coords.shape[1]))), explained


def nearest(vectors: np.ndarray, k: int = NEIGHBOURS) -> list[list[dict]]:
    """Each point's k nearest other points by cosine similarity: [{"point", "similarity"}]."""
    unit = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    similarity = unit @ unit.T
    np.fill_diagonal(similarity, -np.inf)
    order = np.argsort(-similarity, axis=1)[:, :min(k, len(vectors) - 1)]  # never the point itself
    return [[{"point": int(j), "similarity": float(similarity[i, j])} for j in row] for i, row in enumerate(order)]


# ---------------------------------------------------------------- the probes

SEED_MAX = 2**31 - 1  # as the Classify tab's seed


@dataclass(frozen=True)
class ProbePlan:
    """The layer probes' input, checked once (`plan_probe`): the seed, the examples split by it
    (the classifier's split with the same seed) and the labels, sorted. What `run_probe` takes;
    nothing checks them again."""

    seed: int
    split: Split
    labels: list[str]

    @property
    def nbytes(self) -> int:
        """About what the plan holds in memory (its texts and labels), for a session's kept results."""
        return 200 + sum(len(t) + len(lab) + 100 for part in (self.split.train, self.split.held_out)
                         for t, lab in part)


def plan_probe(examples, seed=0, limits: Limits | None = None) -> ProbePlan:
    """`examples` ((text, label) pairs, `check_examples`) and `seed` (a whole number) checked once
    into the probes' plan; InputError naming the field at fault ("examples" or "seed")."""
    pairs = check_examples(examples, limits)
    seed = validate.whole_number(seed, "seed", 0, SEED_MAX, field="seed")
    return ProbePlan(seed, stratified_split(pairs, seed), sorted({label for _, label in pairs}))


def probe_layers(lm: LoadedModel, examples, *, seed: int = 0, max_examples: int | None = None) -> dict:
    """Which layer knows the labels: `run_probe(lm, plan_probe(examples, seed))`, at most
    `max_examples` examples (None: `Limits`' default)."""
    return run_probe(lm, plan_probe(examples, seed, Limits(max_examples=max_examples) if max_examples else None))


@anatomy.guarded("The layer probes")
def run_probe(lm: LoadedModel, plan: ProbePlan) -> dict:
    """A logistic regression per hidden state the model gives (0 = embeddings .. L, and for Funnel its
    decoder's after its encoder's) on the frozen hidden states mean-pooled over each text's tokens, trained on the plan's training split and scored on its
    held-out part.

    Returns {"layers": [{"layer", "accuracy"}] (one per hidden state: L + 1 entries), "baseline" (held-out accuracy of
    always answering the training split's most frequent label), "best_layer", "labels",
    "train_size", "held_out_size"}."""
    from sklearn.linear_model import LogisticRegression

    split, labels, seed = plan.split, plan.labels, plan.seed
    train_x, held_x = pooled(lm, [t for t, _ in split.train]), pooled(lm, [t for t, _ in split.held_out])
    train_y = np.array([labels.index(label) for _, label in split.train])
    held_y = np.array([labels.index(label) for _, label in split.held_out])
    layers = []
    for layer in range(train_x.shape[1]):
        probe = LogisticRegression(max_iter=2000, random_state=seed).fit(train_x[:, layer], train_y)
        layers.append({"layer": layer, "accuracy": float((probe.predict(held_x[:, layer]) == held_y).mean())})
    majority = Counter(train_y.tolist()).most_common(1)[0][0]
    best = max(layers, key=lambda entry: entry["accuracy"])
    return {"layers": layers, "baseline": float((held_y == majority).mean()), "best_layer": best["layer"],
            "labels": labels, "train_size": len(split.train), "held_out_size": len(split.held_out)}


@torch.inference_mode()
def pooled(lm: LoadedModel, texts: list[str], max_length: int = 128) -> np.ndarray:
    """(N, S, H): each of the S hidden states the model gives (the embeddings and every layer: S = L + 1;
    Funnel's decoder layers after its encoder's too), averaged over each text's tokens (special
    tokens included, padding not); texts cut at `max_length` tokens, as the classifier cuts them."""
    ids = lm.tokenizer(texts, truncation=True, max_length=min(max_length, lm.max_length))["input_ids"]
    out: list = [None] * len(texts)
    for group in anatomy.batches(lm.model, [len(row) for row in ids], BATCH):  # padded, or one length per forward
        batch = lm.tokenizer.pad([{"input_ids": ids[i]} for i in group], return_tensors="pt").to(lm.device)
        with hooks.switched_off(lm):
            hidden = lm.model.base_model(**batch, output_hidden_states=True).hidden_states
        means = torch.stack([_token_mean(h, batch["attention_mask"]) for h in hidden], 1)  # (B, L+1, H)
        for row, i in enumerate(group):
            out[i] = means[row].float().cpu().numpy()
    return np.stack(out)


def _token_mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T_l, H) states, (B, T) attention mask -> (B, H): the mean over each text's tokens. A layer
    whose sequence is pooled (Funnel's later blocks: T_l < T) comes from a forward without padding (a
    padding-sensitive family shares one only between texts of one length): its mean is over all of it."""
    if hidden.shape[1] != mask.shape[1]:
        return hidden.mean(1)
    weights = mask[:, :, None].to(hidden.dtype)  # (B, T, 1)
    return (hidden * weights).sum(1) / weights.sum(1)
