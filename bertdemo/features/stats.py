"""Per-feature statistics over a corpus, computed once and saved beside a dictionary, so a feature's
card needs no corpus pass: how often it fires (density), how strongly (mean, max, a histogram), its
top contexts (corpus line, token, activation), the tokens it fires on most, the features that most
often fire with it, and (where computed) the output tokens it promotes.

    codes = corpus_codes(lm, {3: dictionary}, lines)[3]   # every kept token's top-k codes
    stats = from_codes(codes, lines.texts)                 # FeatureStats
    stats.save(folder / "stats.safetensors")               # + contexts.txt beside it

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
TOP_TOKENS = 5  # tokens a feature fires on most
COFIRING = 5  # features that fire with it most


@dataclass(frozen=True)
class Codes:
    """Every kept token of a corpus pass: its k activations and feature indices (N, k), its line,
    position in the line's tokens and token id (N,)."""

    acts: torch.Tensor
    indices: torch.Tensor
    line: np.ndarray
    position: np.ndarray
    token: np.ndarray

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
        meta.append((batch.lines[rows.numpy()], cols.numpy(), batch.inputs["input_ids"][rows, cols].numpy()))
        for layer in layers:
            acts, indices = dictionaries[layer].encode(states[layer][0])
            parts[layer].append((acts.half(), indices.int()))
    line, position, token = (np.concatenate([m[i] for m in meta]) for i in range(3))
    return {layer: Codes(torch.cat([p[0] for p in parts[layer]]), torch.cat([p[1] for p in parts[layer]]),
                         line.astype(np.int32), position.astype(np.int16), token.astype(np.int32))
            for layer in layers}


class FeatureStats:
    """A dictionary's statistics (see the module doc), as arrays indexed by feature, and the corpus
    lines its contexts point into. `tensors`:
    - "tokens" (1,): kept positions counted; "density" (F,): share of them each feature fires on;
    - "mean", "max" (F,): its activation where it fires; "histogram" (F, BINS) uint8: its firings'
      share per bin of [0, max], x255;
    - "context_line", "context_position" (F, C): its top contexts (-1: none), "context_activation";
    - "top_tokens" (F, 5) token ids it fires on most (-1: none), "top_token_share" their shares of its firings;
    - "cofiring" (F, 5) the features firing with it most, "cofiring_share" P(that one | this one);
    - "promoted" (F, 3) token ids it raises most at a [MASK] (where computed)."""

    def __init__(self, tensors: dict[str, torch.Tensor], contexts: list[str]):
        self.tensors, self.contexts = tensors, contexts

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]

    @property
    def tokens(self) -> int:
        return int(self.tensors["tokens"][0])

    def context_rows(self, feature: int) -> list[tuple[int, int, float]]:
        """[(line, position, activation)] of `feature`'s top contexts, strongest first."""
        lines = self["context_line"][feature].tolist()
        return [(line, pos, act) for line, pos, act in zip(lines, self["context_position"][feature].tolist(),
                                                            self["context_activation"][feature].tolist()) if line >= 0]

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


def from_codes(codes: Codes, texts: list[str], latents: int) -> FeatureStats:
    """The statistics of `latents` features from a corpus pass's codes over `texts`, their contexts
    pointing into all of `texts` (`keep_used_lines` cuts them down)."""
    flat_f = codes.indices.reshape(-1).long()
    flat_a = codes.acts.reshape(-1).float()
    fired = flat_a > 0
    token_of = torch.arange(codes.tokens).repeat_interleave(codes.indices.shape[1])[fired]
    f, a = flat_f[fired], flat_a[fired]
    fires = torch.bincount(f, minlength=latents)
    total = torch.zeros(latents).index_add_(0, f, a)
    top = torch.zeros(latents).scatter_reduce_(0, f, a, "amax")
    tensors = {"tokens": torch.tensor([codes.tokens]), "density": fires.float() / max(1, codes.tokens),
               "mean": total / fires.clamp(min=1), "max": top, "histogram": _histogram(f, a, top, fires, latents)}
    tensors.update(_top_contexts(f, a, token_of.numpy(), codes, latents))
    tensors.update(_top_tokens(f, codes.token[token_of.numpy()], fires, latents))
    tensors.update(_cofiring(f, token_of.numpy(), codes.tokens, fires, latents))
    return FeatureStats(tensors, list(texts))


def index_dtype(count: int) -> np.dtype:
    """The smallest integer type for indices below `count` (and -1 for none): shipped files stay small."""
    return np.dtype(np.int16) if count < 2 ** 15 else np.dtype(np.int32)


def keep_used_lines(stats: list[FeatureStats]) -> None:
    """Cut the context lines of statistics computed over the same corpus down to those their top
    contexts point into, renumbered alike: one contexts file serves them all."""
    texts = stats[0].contexts
    used = np.unique(np.concatenate([s["context_line"][s["context_line"] >= 0].numpy() for s in stats]))
    renumber = np.full(len(texts), -1, dtype=np.int64)
    renumber[used] = np.arange(len(used))
    for s in stats:
        line = s["context_line"].numpy()
        kept = np.where(line >= 0, renumber[np.maximum(line, 0)], -1).astype(index_dtype(len(used)))
        s.tensors["context_line"] = torch.from_numpy(kept)
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


def _top_tokens(f, token_ids: np.ndarray, fires, latents: int) -> dict[str, torch.Tensor]:
    pairs, counts = np.unique(np.stack([f.numpy(), token_ids]), axis=1, return_counts=True)
    order = np.lexsort((-counts, pairs[0]))
    pairs, counts = pairs[:, order], counts[order]
    rank = np.arange(len(counts)) - np.searchsorted(pairs[0], pairs[0])
    keep = rank < TOP_TOKENS
    ids = np.full((latents, TOP_TOKENS), -1, dtype=index_dtype(int(token_ids.max(initial=0)) + 1))
    share = np.zeros((latents, TOP_TOKENS), dtype=np.float16)
    ids[pairs[0][keep], rank[keep]] = pairs[1][keep]
    share[pairs[0][keep], rank[keep]] = counts[keep] / np.maximum(1, fires.numpy()[pairs[0][keep]])
    return {"top_tokens": torch.from_numpy(ids), "top_token_share": torch.from_numpy(share)}


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
