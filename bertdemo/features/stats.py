"""Per-feature statistics over a corpus, computed once and saved beside a dictionary, so a feature's
card needs no corpus pass: how often it fires (density), how strongly (mean, max, a histogram), its
top contexts (corpus line, token, activation), examples from each band of its activations (deciles)
and a few random firings, the tokens it fires on most by lift, the features that most often fire
with it, (where computed) the output tokens it promotes, and, from held-out lines: how well its
label's tokens detect where it fires, and the hidden words when it fires at a [MASK].

    codes = corpus_codes(lm, {3: dictionary}, lines)[3]   # every kept token's top-k codes
    stats = from_codes(codes, lines.texts, latents,        # FeatureStats
                       held_out=plain[3], masked=masked[3]) # held-out passes, plain and masked
    stats.save(folder / "stats.safetensors")               # + contexts.txt beside it

**Lift** of feature f on token t: (n_ft / n_f) / (n_t / N), how much more often f fires on t than t
occurs (n_ft f's firings on t, n_f its firings, n_t t's occurrences, N the tokens counted). A label's
tokens are a feature's top tokens by lift among those with at least `min_firings(n_f)` firings of
it (MIN_FIRINGS, or MIN_SHARE of its firings when that is more): a rare token it fired on once or
twice by chance does not lead, nor does one that is a sliver of what it fires on.

**Detection score** (delphi's, without a language model): on held-out lines, the label's tokens
predict that the feature fires wherever they occur. precision = its firings on them / their
occurrences, recall = its firings on them / its firings ("its tokens explain 81% of its
firings"), F1 their harmonic mean. A feature with F1 >= WORD_F1 is a word feature (it fires on
those words whatever the sense), else a context feature.

A corpus pass stores each token's k codes (N x k), not activations; the statistics are read off
those codes with array operations (a sort, a sparse product for co-firing).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import scipy.sparse
import torch
from safetensors.torch import load_file, save_file

from ..model.loading import LoadedModel
from .data import RESIDUAL, Lines, Point, pairs_at

CONTEXTS_KEPT = 8  # top contexts per feature
BINS = 16  # histogram bins, from 0 to the feature's largest activation
TOP_TOKENS = 5  # tokens a feature fires on most (by lift)
LABEL_TOKENS = 3  # of them, in its label (and scored as a detector)
MIN_FIRINGS = 3  # on a token, for it to be among a feature's top tokens
MIN_SHARE = 0.05  # ... or this share of the feature's firings, when that is more
WORD_F1 = 0.5  # a label's detection F1 from which a feature is a word feature
COFIRING = 5  # features that fire with it most
BANDS = 10  # activation bands: deciles of its non-zero activations
BAND_EXAMPLES = 2  # examples per band
RANDOM_FIRINGS = 5  # firings drawn at random
MASK_WORDS = 5  # hidden words when it fires at a [MASK]
SEED = 0  # which examples a band and the random firings show


@dataclass(frozen=True)
class Codes:
    """Every kept token of a corpus pass: its k activations and feature indices (N, k), its line,
    position in the line's tokens and token id as the model read it (N,); in a masked pass, `hidden`:
each position's original token where the collator masked it (-100 elsewhere)."""

    acts: torch.Tensor
    indices: torch.Tensor
    line: np.ndarray
    position: np.ndarray
    token: np.ndarray
    hidden: np.ndarray | None = None  # (N,) the word a masked position hides (-100: not masked)

    @property
    def tokens(self) -> int:
        return int(self.acts.shape[0])


class Encodes(Protocol):
    """What the statistics need of a dictionary (`dictionary.Dictionary` is one; named here so the
    statistics, which a dictionary's files hold, do not import the dictionary)."""

    def encode(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, H) states -> their top-k (N, k) activations and (N, k) feature ids."""


@torch.no_grad()
def corpus_codes(lm: LoadedModel, dictionaries: dict[int, Encodes], lines: Lines, *,
                 masked_share: float = 0.0, seed: int = 0, batch_tokens: int = 4096,
                 point: Point = RESIDUAL) -> dict[int, Codes]:
    """One pass over `lines` (plain unless `masked_share`): {layer: Codes} from one forward per
    batch that reads every dictionary's layer at `point` (what a transcoder reads: its block's input)."""
    layers = sorted(dictionaries)
    parts: dict[int, list] = {layer: [] for layer in layers}
    meta: list = []
    for batch in lines.batches(lm, batch_tokens=batch_tokens, seed=seed, masked_share=masked_share,
                               order=np.arange(len(lines)), endless=False):
        states = pairs_at(lm, batch, layers, point)
        rows, cols = batch.keep.nonzero(as_tuple=True)
        meta.append((batch.lines[rows.numpy()], cols.numpy(), batch.inputs["input_ids"][rows, cols].numpy(),
                     batch.labels[rows, cols].numpy()))
        for layer in layers:
            acts, indices = dictionaries[layer].encode(states[layer][0])
            parts[layer].append((acts.half(), indices.int()))
    line, position, token, hidden = (np.concatenate([m[i] for m in meta]) for i in range(4))
    return {layer: Codes(torch.cat([p[0] for p in parts[layer]]), torch.cat([p[1] for p in parts[layer]]),
                         line.astype(np.int32), position.astype(np.int16), token.astype(np.int32),
                         _at_masks(lm, token, hidden) if masked_share else None)
            for layer in layers}


def _at_masks(lm: LoadedModel, token: np.ndarray, hidden: np.ndarray) -> np.ndarray:
    """The hidden word at each position the model read as [MASK] (-100 elsewhere: not masked, or
    the collator's random or kept token)."""
    mask = lm.tokenizer.mask_token_id
    return np.where(token == mask, hidden, -100).astype(np.int32) if mask is not None else np.full_like(hidden, -100)


class FeatureStats:
    """A dictionary's statistics (see the module doc), as arrays indexed by feature, and the corpus
    lines its contexts point into. `tensors`:
    - "tokens" (1,): kept positions counted; "density" (F,): share of them each feature fires on;
    - "mean", "max" (F,): its activation where it fires; "histogram" (F, BINS) uint8: its firings'
      share per bin of [0, max], x255;
    - "context_line", "context_position" (F, C): its top contexts (-1: none), "context_activation";
    - "top_tokens" (F, 5) token ids it fires on most by lift (-1: none), "top_token_share" their
      shares of its firings, "top_token_lift" their lift (older files: by count, no lift);
    - "cofiring" (F, 5) the features firing with it most, "cofiring_share" P(that one | this one);
    - "band_edges" (F, BANDS + 1): its bands' lowest activations and its largest; "band_line",
      "band_position", "band_activation" (F, BANDS, BAND_EXAMPLES): examples drawn from each band (-1: none);
    - "random_line", "random_position", "random_activation" (F, RANDOM_FIRINGS): firings drawn at random;
    - "promoted" (F, 3) token ids it raises most at a [MASK] (where computed; -1 where none clears
      the noise), "promoted_change" their logit change, "promoted_noise" its standard error across contexts;
    - from held-out lines (where computed): "label_precision", "label_recall", "label_f1" (F,) its
      label's tokens as a detector, "label_fires" (F,) its firings there, "detection_tokens" (1,);
    - from them masked: "mask_words" (F, 5) the hidden words when it fires at a [MASK] (by lift),
      "mask_word_count", "mask_word_lift", "mask_fires" (F,) its firings at a [MASK], "mask_positions" (1,).
    A field a file lacks (made before it was computed) is absent: `has` says which."""

    def __init__(self, tensors: dict[str, torch.Tensor], contexts: list[str]):
        self.tensors, self.contexts = tensors, contexts

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]

    @property
    def tokens(self) -> int:
        return int(self.tensors["tokens"][0])

    def has(self, *names: str) -> bool:
        return all(name in self.tensors for name in names)

    def context_rows(self, feature: int) -> list[tuple[int, int, float]]:
        """[(line, position, activation)] of `feature`'s top contexts, strongest first."""
        lines = self["context_line"][feature].tolist()
        return [(line, pos, act) for line, pos, act in zip(lines, self["context_position"][feature].tolist(),
                                                            self["context_activation"][feature].tolist()) if line >= 0]

    def band_rows(self, feature: int) -> list[tuple[float, float, list[tuple[int, int, float]]]]:
        """Per activation band, weakest first: (lowest, highest activation, [(line, position,
        activation)] its examples); bands a feature with few firings leaves empty are left out."""
        edges = self["band_edges"][feature].float().tolist()
        lines, positions = self["band_line"][feature].tolist(), self["band_position"][feature].tolist()
        acts = self["band_activation"][feature].float().tolist()
        return [(edges[b], edges[b + 1], [(line, pos, act) for line, pos, act in zip(lines[b], positions[b], acts[b])
                                          if line >= 0]) for b in range(len(lines)) if lines[b][0] >= 0]

    def random_rows(self, feature: int) -> list[tuple[int, int, float]]:
        """[(line, position, activation)] of its firings drawn at random."""
        return [(line, pos, act) for line, pos, act in zip(self["random_line"][feature].tolist(),
                                                           self["random_position"][feature].tolist(),
                                                           self["random_activation"][feature].float().tolist())
                if line >= 0]

    def histogram(self, feature: int) -> tuple[list[float], list[float]]:
        """(bin edges (BINS + 1), share of its firings per bin)."""
        top = float(self["max"][feature])
        edges = torch.linspace(0, top, BINS + 1).tolist()
        return edges, (self["histogram"][feature].float() / 255).tolist()

    def save(self, path: Path, contexts: Path) -> None:
        """Write the arrays to `path` and the context lines to `contexts` (into a folder being
        written whole: `dictionary.save`). Contexts shared by several dictionaries (the shipped
        ones) are written once by whoever writes the first."""
        save_file({k: v.contiguous() for k, v in self.tensors.items()}, str(path))
        if not Path(contexts).is_file():
            Path(contexts).write_text("".join(line + "\n" for line in self.contexts), encoding="utf-8")

    @classmethod
    def load(cls, path: Path, contexts: Path) -> "FeatureStats":
        lines = Path(contexts).read_text(encoding="utf-8").split("\n")[:-1]
        return cls(load_file(str(path)), lines)


def from_codes(codes: Codes, texts: list[str], latents: int, *, held_out: Codes | None = None,
               masked: Codes | None = None) -> FeatureStats:
    """The statistics of `latents` features from a corpus pass's codes over `texts`, their contexts
    pointing into all of `texts` (`keep_used_lines` cuts them down); with a plain pass over held-out
    lines (`held_out`), its labels' detection scores; with a masked one (`masked`), the hidden words
    at its firings on a [MASK]."""
    f, a, token_of = _firings(codes)
    fires = torch.bincount(f, minlength=latents)
    total = torch.zeros(latents).index_add_(0, f, a)
    top = torch.zeros(latents).scatter_reduce_(0, f, a, "amax")
    tensors = {"tokens": torch.tensor([codes.tokens]), "density": fires.float() / max(1, codes.tokens),
               "mean": total / fires.clamp(min=1), "max": top, "histogram": _histogram(f, a, top, fires, latents)}
    tensors.update(_top_contexts(f, a, token_of, codes, latents))
    ids, counts, lift = ranked_tokens(f.numpy(), codes.token[token_of], latents, np.bincount(codes.token),
                                      codes.tokens, TOP_TOKENS)
    tensors.update(top_tokens=torch.from_numpy(ids.astype(index_dtype(int(codes.token.max(initial=0)) + 1))),
                   top_token_share=torch.from_numpy((counts / np.maximum(1, fires.numpy())[:, None]).astype(np.float16)),
                   top_token_lift=torch.from_numpy(lift.astype(np.float32)))
    tensors.update(_cofiring(f, token_of, codes.tokens, fires, latents))
    tensors.update(_bands(f.numpy(), a.numpy(), token_of, codes, latents))
    tensors.update(_random_firings(f.numpy(), a.numpy(), token_of, codes, latents))
    if held_out is not None:
        tensors.update(detection(held_out, tensors["top_tokens"][:, :LABEL_TOKENS], latents))
    if masked is not None:
        tensors.update(mask_words(masked, latents))
    return FeatureStats(compact(tensors), list(texts))


def compact(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The card's fields in the smallest types that hold them (shipped files stay small): positions
    in int8 (a line is at most 64 pieces), ids and counts in int16 where they fit, lifts and scores
    in float16 (a lift past float16's largest, 65,504, is kept as that)."""
    out = dict(tensors)
    for name, value in tensors.items():
        if name.endswith("_position") and int(value.max()) < 2 ** 7:
            out[name] = value.to(torch.int8)
        elif name in ("mask_words", "mask_word_count") and int(value.max()) < 2 ** 15:
            out[name] = value.to(torch.int16)
        elif name in ("top_token_lift", "mask_word_lift", "label_precision", "label_recall", "label_f1"):
            out[name] = value.float().clamp(max=torch.finfo(torch.float16).max).half()
    return out


def _firings(codes: Codes) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """Every firing of a pass (activation > 0): its feature, activation and token's row in `codes`."""
    flat_f = codes.indices.reshape(-1).long()
    flat_a = codes.acts.reshape(-1).float()
    fired = flat_a > 0
    token_of = torch.arange(codes.tokens).repeat_interleave(codes.indices.shape[1])[fired]
    return flat_f[fired], flat_a[fired], token_of.numpy()


def min_firings(fires: np.ndarray | int) -> np.ndarray:
    """The firings on a token a feature with `fires` firings needs for that token to be among its top
    tokens: MIN_FIRINGS, or MIN_SHARE of its firings when that is more."""
    return np.maximum(MIN_FIRINGS, np.ceil(MIN_SHARE * np.asarray(fires))).astype(np.int64)


def ranked_tokens(f: np.ndarray, token: np.ndarray, latents: int, token_count: np.ndarray, tokens: int,
                  keep: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per feature its `keep` top tokens by lift (see the module doc) among those with at least
    `min_firings` of its firings (or, where none has, its most-fired), from its firings `f` on
    `token`: (ids (F, keep), -1 none; its firings on each; their lift), every token counted
    `token_count` times in `tokens`."""
    ids = np.full((latents, keep), -1, dtype=np.int64)
    counts = np.zeros((latents, keep), dtype=np.int64)
    lift = np.zeros((latents, keep), dtype=np.float64)
    if not len(f):
        return ids, counts, lift
    pairs, together = np.unique(np.stack([f, token]), axis=1, return_counts=True)
    fires = np.bincount(f, minlength=latents)
    most = np.zeros(latents, dtype=np.int64)
    np.maximum.at(most, pairs[0], together)
    kept = together >= np.minimum(min_firings(fires[pairs[0]]), most[pairs[0]])
    pairs, together = pairs[:, kept], together[kept]
    share_of_corpus = token_count[pairs[1]] / max(1, tokens)
    pair_lift = together / fires[pairs[0]] / np.maximum(share_of_corpus, 1e-12)
    order = np.lexsort((-together, -pair_lift, pairs[0]))
    pairs, together, pair_lift = pairs[:, order], together[order], pair_lift[order]
    rank = np.arange(len(together)) - np.searchsorted(pairs[0], pairs[0])
    top = rank < keep
    at = (pairs[0][top], rank[top])
    ids[at], counts[at], lift[at] = pairs[1][top], together[top], pair_lift[top]
    return ids, counts, lift


def detection(held_out: Codes, label_tokens: torch.Tensor, latents: int) -> dict[str, torch.Tensor]:
    """Each feature's label (its `label_tokens` (F, n), -1 none) as a detector on a plain held-out
    pass: it predicts a firing wherever one of its tokens occurs. "label_precision" = its firings
    on them / their occurrences, "label_recall" = its firings on them / its firings, "label_f1",
    "label_fires" its firings there (0: the scores say nothing), "detection_tokens" the tokens."""
    f, _, token_of = _firings(held_out)
    f = f.numpy()
    labels = label_tokens.numpy().astype(np.int64)
    token = held_out.token[token_of].astype(np.int64)
    hit = (labels[f] == token[:, None]).any(1)
    true = np.bincount(f[hit], minlength=latents)
    fires = np.bincount(f, minlength=latents)
    occurrences = np.bincount(held_out.token, minlength=int(labels.max(initial=0)) + 1)
    predicted = np.where(labels >= 0, occurrences[np.maximum(labels, 0)], 0).sum(1)
    precision = true / np.maximum(1, predicted)
    recall = true / np.maximum(1, fires)
    f1 = 2 * precision * recall / np.maximum(precision + recall, 1e-12)
    return {"label_precision": torch.from_numpy(precision.astype(np.float32)),
            "label_recall": torch.from_numpy(recall.astype(np.float32)),
            "label_f1": torch.from_numpy(f1.astype(np.float32)),
            "label_fires": torch.from_numpy(fires.astype(np.int32)),
            "detection_tokens": torch.tensor([held_out.tokens])}


def mask_words(masked: Codes, latents: int) -> dict[str, torch.Tensor]:
    """From a masked pass (its `hidden` words at the [MASK]s): per feature the hidden words when it
    fires at a [MASK], MASK_WORDS by lift against how often each word is the hidden one (as top
    tokens are ranked), their counts, its firings at a [MASK] and the [MASK]s counted."""
    if masked.hidden is None:
        raise ValueError("mask_words needs a masked pass: corpus_codes(..., masked_share=1.0)")
    f, _, token_of = _firings(masked)
    hidden = masked.hidden[token_of]
    at_mask = hidden >= 0
    f, hidden = f.numpy()[at_mask], hidden[at_mask]
    masks = masked.hidden[masked.hidden >= 0]
    ids, counts, lift = ranked_tokens(f, hidden, latents, np.bincount(masks, minlength=int(hidden.max(initial=0)) + 1),
                                      len(masks), MASK_WORDS)
    return {"mask_words": torch.from_numpy(ids.astype(np.int32)), "mask_word_count": torch.from_numpy(counts.astype(np.int32)),
            "mask_word_lift": torch.from_numpy(lift.astype(np.float32)),
            "mask_fires": torch.from_numpy(np.bincount(f, minlength=latents).astype(np.int32)),
            "mask_positions": torch.tensor([len(masks)])}


def _bands(f: np.ndarray, a: np.ndarray, token_of: np.ndarray, codes: Codes, latents: int) -> dict[str, torch.Tensor]:
    """Each feature's firings, weakest first, cut into BANDS bands of (within one) equal counts (the
    firing of rank r of n is in band r * BANDS // n: deciles of its non-zero activations), and
    BAND_EXAMPLES drawn at random from each."""
    order = np.lexsort((a, f))
    fo, ao = f[order], a[order]
    fires = np.bincount(f, minlength=latents)
    rank = np.arange(len(order)) - np.searchsorted(fo, fo)
    band = rank * BANDS // np.maximum(1, fires[fo])
    edges = np.zeros((latents, BANDS + 1), dtype=np.float32)
    first = np.ones(len(order), dtype=bool)
    first[1:] = (fo[1:] != fo[:-1]) | (band[1:] != band[:-1])
    edges[fo[first], band[first]] = ao[first]
    edges[:, BANDS] = 0
    np.maximum.at(edges[:, BANDS], fo, ao)
    edges[:, :BANDS] = np.maximum.accumulate(edges[:, :BANDS], axis=1)  # an empty band starts where the last did
    key = np.random.default_rng(SEED).random(len(order))
    within = np.lexsort((key, band, fo))
    group = (fo * BANDS + band)[within]
    slot = np.arange(len(within)) - np.searchsorted(group, group)
    chosen = within[slot < BAND_EXAMPLES]
    where = (fo[chosen], band[chosen], slot[slot < BAND_EXAMPLES])
    line, position, activation = _examples((latents, BANDS, BAND_EXAMPLES), where, order[chosen], a, token_of, codes)
    return {"band_edges": torch.from_numpy(edges.astype(np.float16)), "band_line": line, "band_position": position,
            "band_activation": activation}


def _random_firings(f: np.ndarray, a: np.ndarray, token_of: np.ndarray, codes: Codes, latents: int) -> dict[str, torch.Tensor]:
    """RANDOM_FIRINGS of each feature's firings, drawn at random (seeded)."""
    key = np.random.default_rng(SEED + 1).random(len(f))
    order = np.lexsort((key, f))
    slot = np.arange(len(order)) - np.searchsorted(f[order], f[order])
    chosen = order[slot < RANDOM_FIRINGS]
    line, position, activation = _examples((latents, RANDOM_FIRINGS), (f[chosen], slot[slot < RANDOM_FIRINGS]),
                                           chosen, a, token_of, codes)
    return {"random_line": line, "random_position": position, "random_activation": activation}


def _examples(shape: tuple, where: tuple, firings: np.ndarray, a: np.ndarray, token_of: np.ndarray,
              codes: Codes) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(line, position, activation) arrays of `shape` (-1: none) holding `firings` at `where`."""
    line = np.full(shape, -1, dtype=np.int32)
    position = np.full(shape, -1, dtype=np.int16)
    activation = np.zeros(shape, dtype=np.float16)
    line[where] = codes.line[token_of[firings]]
    position[where] = codes.position[token_of[firings]]
    activation[where] = a[firings]
    return torch.from_numpy(line), torch.from_numpy(position), torch.from_numpy(activation)


def index_dtype(count: int) -> np.dtype:
    """The smallest integer type for indices below `count` (and -1 for none): shipped files stay small."""
    return np.dtype(np.int16) if count < 2 ** 15 else np.dtype(np.int32)


def keep_used_lines(stats: list[FeatureStats]) -> None:
    """Cut the context lines of statistics computed over the same corpus down to those their top
    contexts point into, renumbered alike: one contexts file serves them all."""
    texts = stats[0].contexts
    names = [[name for name in s.tensors if name.endswith("_line")] for s in stats]  # the contexts, bands, random firings
    used = np.unique(np.concatenate([s[name][s[name] >= 0].numpy().ravel() for s, kept in zip(stats, names)
                                     for name in kept]))
    renumber = np.full(len(texts), -1, dtype=np.int64)
    renumber[used] = np.arange(len(used))
    for s, kept in zip(stats, names):
        for name in kept:
            line = s[name].numpy()
            s.tensors[name] = torch.from_numpy(np.where(line >= 0, renumber[np.maximum(line, 0)], -1)
                                               .astype(index_dtype(len(used))))
        s.contexts = [texts[i] for i in used]


def _histogram(f, a, top, fires, latents: int) -> torch.Tensor:
    bins = (a / top[f].clamp(min=1e-12) * BINS).long().clamp(max=BINS - 1)
    counts = torch.zeros(latents * BINS).index_add_(0, f * BINS + bins, torch.ones_like(a)).view(latents, BINS)
    return (counts / fires.clamp(min=1)[:, None] * 255).round().to(torch.uint8)


def _top_contexts(f, a, token_of: np.ndarray, codes: Codes, latents: int) -> dict[str, torch.Tensor]:
    """Per feature its CONTEXTS_KEPT strongest firings, at most one per corpus line."""
    f, a = f.numpy(), a.numpy()
    line = codes.line[token_of]
    order = np.lexsort((-a, line, f))  # by feature, then line, strongest first
    first = np.ones(len(order), dtype=bool)
    first[1:] = (f[order][1:] != f[order][:-1]) | (line[order][1:] != line[order][:-1])
    best = order[first]  # each (feature, line)'s strongest token
    best = best[np.lexsort((-a[best], f[best]))]  # by feature, strongest first
    starts = np.searchsorted(f[best], np.arange(latents))
    rank = np.arange(len(best)) - starts[f[best]]
    keep = best[rank < CONTEXTS_KEPT]
    slot = rank[rank < CONTEXTS_KEPT]
    out_line = np.full((latents, CONTEXTS_KEPT), -1, dtype=np.int32)
    out_pos = np.full((latents, CONTEXTS_KEPT), -1, dtype=np.int16)
    out_act = np.zeros((latents, CONTEXTS_KEPT), dtype=np.float16)
    out_line[f[keep], slot] = line[keep]
    out_pos[f[keep], slot] = codes.position[token_of[keep]]
    out_act[f[keep], slot] = a[keep]
    return {"context_line": torch.from_numpy(out_line), "context_position": torch.from_numpy(out_pos),
            "context_activation": torch.from_numpy(out_act)}


def _cofiring(f, token_of: np.ndarray, tokens: int, fires, latents: int) -> dict[str, torch.Tensor]:
    """P(other fires | this fires) for the COFIRING others most often firing at the same token."""
    fired = scipy.sparse.csr_matrix((np.ones(len(token_of), dtype=np.float32), (token_of, f.numpy())),
                                    shape=(tokens, latents))
    together = (fired.T @ fired).tocsr()
    together.setdiag(0)
    together.eliminate_zeros()
    ids = np.full((latents, COFIRING), -1, dtype=index_dtype(latents))
    share = np.zeros((latents, COFIRING), dtype=np.float16)
    for feature in np.flatnonzero(np.diff(together.indptr)):
        start, end = together.indptr[feature], together.indptr[feature + 1]
        cols, counts = together.indices[start:end], together.data[start:end]
        best = np.argsort(-counts, kind="stable")[:COFIRING]
        ids[feature, :len(best)] = cols[best]
        share[feature, :len(best)] = counts[best] / max(1, int(fires[feature]))
    return {"cofiring": torch.from_numpy(ids), "cofiring_share": torch.from_numpy(share)}
