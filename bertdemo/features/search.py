"""Finding a feature without a sentence that fires it: by a word, by its label's text, by the
direction it writes (the features nearest it).

    features_for_word(lm, "bank", layer=3)          # the features that fire on "bank" most, by lift
    features_by_label(lm, "river", layer=3)          # the features whose label holds "river"
    similar_features(lm, layer=3, feature=1265)      # nearest decoder directions (cosine)

**Lift** of feature f on token t is how much more often f fires on t than t occurs:
(n_ft / n_f) / (n_t / N), with n_ft f's firings on t, n_f its firings, n_t t's occurrences, N the
tokens counted. For one word the features are ranked by it: a feature that fires on "bank" and
little else comes before one that fires on every noun, however often that one fires on "bank". A
feature needs MIN_FIRINGS firings on the word (fewer where the word occurs fewer times), so one
chance firing of a rare feature does not lead.

The counts come from one corpus pass over the lines the dictionary's statistics keep (its
`contexts.txt`: for the shipped dictionaries 5,999 of the 6,000 held-out lines their statistics
read) and the default corpus (`assets/corpus/everyday.txt`, the page's example words), at the
positions every statistic counts (`data.kept_positions`). The pass runs on the first
search of a dictionary and is kept in the disk cache (`TokenCounts`, an entry beside the
dictionaries trained here, under the dictionary's own digest), so nothing shipped is regenerated.
"""
from __future__ import annotations

import difflib
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import load_file, save_file

from .. import validate
from ..model.loading import LoadedModel
from ..views.corpus_search import DEFAULT_CORPUS
from .data import Lines, point_of
from .dictionary import Dictionary
from .stats import corpus_codes
from .store import FeatureStore, shared_store
from .labels import NO_CLEAR_OUTPUT, label, label_fit, labelled, labels as labels_of
from .views import load_features

MIN_FIRINGS = 3  # on the word, for a feature to be listed (fewer when the word occurs fewer times)
MAX_TOP = 50
MAX_QUERY = 100  # characters of a label search
NEAREST_LABELS = 8  # shown when no label holds the text
COUNTS = "counts.safetensors"


# ---------------------------------------------------------------- the counts, kept on disk

@dataclass(frozen=True)
class TokenCounts:
    """One corpus pass's counts for a dictionary: `token_count` (V,) each token's occurrences,
    `fires` (F,) each feature's firings, and per token the features that fired on it and how often
    (`indptr` (V + 1,), `features`, `counts`: token-major, as a CSR matrix's rows), over `tokens`
    positions of `lines` corpus lines."""

    token_count: np.ndarray
    fires: np.ndarray
    indptr: np.ndarray
    features: np.ndarray
    counts: np.ndarray
    tokens: int
    lines: int

    def row(self, token: int) -> tuple[np.ndarray, np.ndarray]:
        """(features that fired on `token`, how many times each)."""
        start, end = int(self.indptr[token]), int(self.indptr[token + 1])
        return self.features[start:end].astype(np.int64), self.counts[start:end].astype(np.int64)

    def lift(self, token: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(features, their firings on `token`, their lift on it) for every feature that fired on it."""
        features, together = self.row(token)
        share_of_corpus = self.token_count[token] / max(1, self.tokens)
        lift = together / np.maximum(1, self.fires[features]) / max(share_of_corpus, 1e-12)
        return features, together, lift

    def arrays(self) -> dict[str, np.ndarray]:
        return {"token_count": self.token_count, "fires": self.fires, "indptr": self.indptr,
                "features": self.features, "counts": self.counts,
                "tokens": np.array([self.tokens, self.lines], dtype=np.int64)}

    @classmethod
    def of(cls, arrays: dict[str, np.ndarray]) -> "TokenCounts":
        tokens, lines = (int(v) for v in arrays["tokens"])
        return cls(arrays["token_count"], arrays["fires"], arrays["indptr"], arrays["features"], arrays["counts"],
                   tokens, lines)


def count_tokens(lm: LoadedModel, dictionary: Dictionary, texts: list[str]) -> TokenCounts:
    """One plain pass over `texts` at the dictionary's point: every (token, feature) firing counted."""
    lines = Lines(lm, texts)
    codes = corpus_codes(lm, {dictionary.layer: dictionary}, lines, point=point_of(dictionary))[dictionary.layer]
    vocab, latents = max(len(lm.tokenizer), int(codes.token.max(initial=0)) + 1), dictionary.latents
    k = codes.indices.shape[1]
    fired = (codes.acts.float() > 0).numpy().reshape(-1)
    feature = codes.indices.numpy().reshape(-1).astype(np.int64)[fired]
    token = np.repeat(codes.token.astype(np.int64), k)[fired]
    pairs, counts = np.unique(token * latents + feature, return_counts=True)  # sorted: token-major
    return TokenCounts(token_count=np.bincount(codes.token, minlength=vocab).astype(np.int32),
                       fires=np.bincount(feature, minlength=latents).astype(np.int32),
                       indptr=np.searchsorted(pairs // latents, np.arange(vocab + 1)).astype(np.int64),
                       features=(pairs % latents).astype(np.int16 if latents < 2 ** 15 else np.int32),
                       counts=counts.astype(np.int32), tokens=codes.tokens, lines=len(lines))


def dictionary_digest(lm: LoadedModel, dictionary: Dictionary) -> str:
    """What a dictionary's derived files (its counts, its map) are kept under: its coder's weights
    digest (the one weights digest, `model.digest`, remembered in the model's caches while the coder
    is unchanged), its layer and kind, its statistics' size, and the model's weights digest."""
    stats = f"{dictionary.stats.tokens}/{len(dictionary.stats.contexts)}" if dictionary.stats is not None else ""
    coder = lm.caches.digest(dictionary.coder)
    # the point by its name: a Point's repr holds its functions' addresses, another in every process
    what = f"{lm.weights_digest}/{dictionary.layer}/{point_of(dictionary).name}/{coder}/{stats}"
    return hashlib.blake2b(what.encode(), digest_size=10).hexdigest()


def kept_entry(store: FeatureStore, lm: LoadedModel, dictionary: Dictionary, what: str) -> Path:
    """Where a dictionary's derived file `what` ("counts", "map-umap", ...) is kept in the store's
    disk cache: an entry of the store's kind beside the dictionaries trained here, so it is counted
    in the one budget and evicted least recently used first like them."""
    return store.folder / f"{what}-{dictionary_digest(lm, dictionary)}" / f"layer_{dictionary.layer}"


def keep(store: FeatureStore, entry: Path, name: str, arrays: dict[str, np.ndarray],
         metadata: dict[str, str] | None = None) -> None:
    """Write `arrays` as `entry`/`name`: into a folder under a temporary name, renamed when whole;
    when another request wrote it meanwhile, theirs stays."""
    staging = store.cache.temporary(store.kind, entry.name, inside=entry.parent)
    try:
        save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(staging / name), metadata=metadata)
        for path in (staging / name, staging):
            path.chmod(0o644 if path.is_file() else 0o755)
        try:
            staging.rename(entry)
        except OSError:  # written meanwhile by another request
            pass
    finally:
        if staging.exists():
            for path in staging.iterdir():
                path.unlink()
            staging.rmdir()
    store.cache.trim(keep=(entry,))


def token_counts(lm: LoadedModel, dictionary: Dictionary, store: FeatureStore) -> TokenCounts:
    """The dictionary's `TokenCounts`: from the disk cache, else counted now (a corpus pass over its
    statistics' lines and the default corpus) and kept there. Its layer alone: the shipped six from one
    forward cost less in all (256 s against 70 s for one, at a load of 7 on 2 cores) but would make the
    first visitor wait for all of them."""
    if dictionary.stats is None:
        raise ValueError(f"The dictionary of layer {dictionary.layer} has no statistics yet: train it again.")
    entry = kept_entry(store, lm, dictionary, "counts")
    if (entry / COUNTS).is_file():
        try:
            found = TokenCounts.of(load_file(str(entry / COUNTS)))
            store.cache.touch(entry)
            return found
        except (OSError, KeyError, ValueError):  # evicted while read, or not whole: count again
            pass
    counts = count_tokens(lm, dictionary, counted_lines(dictionary))
    keep(store, entry, COUNTS, counts.arrays())
    return counts


def counted_lines(dictionary: Dictionary) -> list[str]:
    """The lines a dictionary's counts are over: its statistics' lines, then the default corpus's
    (each line once)."""
    default = DEFAULT_CORPUS.read_text(encoding="utf-8").splitlines() if DEFAULT_CORPUS.is_file() else []
    return list(dict.fromkeys(line.strip() for line in [*dictionary.stats.contexts, *default] if line.strip()))


# ---------------------------------------------------------------- by a word

def word_token(lm: LoadedModel, word) -> tuple[str, int]:
    """(the vocabulary's piece, its id) for `word`: one word the tokenizer keeps whole, or a piece
    as the vocabulary writes it ("##ing"); InputError naming the pieces it splits into otherwise."""
    if not isinstance(word, str) or not word.strip():
        raise validate.InputError("query", "The word to search by is empty: type one, e.g. 'bank'.")
    word = word.strip()
    validate.length_at_most(len(word), MAX_QUERY, "word", fix="Type one word.", field="query")
    vocabulary = lm.tokenizer.get_vocab()
    if word in vocabulary:
        return word, vocabulary[word]
    pieces = lm.tokenizer.tokenize(lm.to_model_text(word))
    if len(pieces) == 1 and pieces[0] in vocabulary and pieces[0] != lm.tokenizer.unk_token:
        return pieces[0], vocabulary[pieces[0]]
    if len(word.split()) > 1:
        raise validate.InputError("query", f"Type one word to search by, got {len(word.split())}: "
                                           f"{validate.shown(word)}.")
    shown = ", ".join(f"'{p}'" for p in pieces) or "nothing"
    raise validate.InputError("query", f"{validate.shown(word)} is not in {lm.name}'s vocabulary: it splits into "
                                       f"{shown}. Search one of those pieces (as written), or another word.")


def features_for_word(lm: LoadedModel, word: str, layer: int, top: int = 10,
                      store: FeatureStore | None = None) -> dict:
    """The features that fire on `word` most across the corpus, by lift (see the module doc).

    Returns {"layer", "word", "token", "token_id", "occurrences": the word's count, "corpus":
    {"tokens", "lines"}, "min_firings", "features": [{"feature", "lift", "firings": on the word,
    "word_share": firings / occurrences, "feature_share": share of its firings that are on the
    word, "label", "label_f1", "label_kind"}] largest lift first} ("label_f1", "label_kind": how
    well the label fits, `labels.label_fit`)."""
    store = store or shared_store(lm.caches)
    dictionary = load_features(lm, layer, store)
    top = validate.whole_number(top, "number of features", 1, MAX_TOP, field="top")
    token, token_id = word_token(lm, word)
    counts = token_counts(lm, dictionary, store)
    occurrences = int(counts.token_count[token_id]) if token_id < len(counts.token_count) else 0
    if occurrences == 0:
        raise validate.InputError("query", f"'{token}' never occurs in the {counts.lines:,} corpus lines searched "
                                           f"(the layer {dictionary.layer} dictionary's statistics' lines and the "
                                           "default corpus), so no feature can be said to fire on it: try "
                                           "another word.")
    features, together, lift = counts.lift(token_id)
    need = min(MIN_FIRINGS, occurrences)
    kept = together >= need
    features, together, lift = features[kept], together[kept], lift[kept]
    order = np.lexsort((-together, -lift))[:top]
    return {"layer": dictionary.layer, "word": word.strip(), "token": token, "token_id": token_id,
            "occurrences": occurrences, "corpus": {"tokens": counts.tokens, "lines": counts.lines},
            "min_firings": need,
            "features": [{"feature": int(features[i]), "lift": float(lift[i]), "firings": int(together[i]),
                          "word_share": float(together[i] / occurrences),
                          "feature_share": float(together[i] / max(1, counts.fires[features[i]])),
                          **labelled(lm, dictionary, int(features[i]))} for i in order]}


# ---------------------------------------------------------------- by label text

def features_by_label(lm: LoadedModel, text: str, layer: int, top: int = 10,
                      store: FeatureStore | None = None) -> dict:
    """The features whose label holds `text` (any case): those where it is one of the label's words
    first, then those where it is part of one, the more often firing first. With no match, the
    nearest labels (by spelling) instead, and "matched" False.

    Returns {"layer", "text", "matched", "total": matches in all, "features": [{"feature",
    "label", "label_f1", "label_kind", "density"}]}."""
    dictionary = load_features(lm, layer, store)
    if not isinstance(text, str) or not text.strip():
        raise validate.InputError("query", "The label text to search for is empty: type a word, e.g. 'river'.")
    text = text.strip()
    validate.length_at_most(len(text), MAX_QUERY, "label text", fix="Type a word or two.", field="query")
    top = validate.whole_number(top, "number of features", 1, MAX_TOP, field="top")
    labels = labels_of(lm, dictionary)
    density = dictionary.stats["density"].tolist() if dictionary.stats is not None else [0.0] * len(labels)
    wanted = text.lower()
    words_of = [_words(name) for name in labels]
    exact = [f for f, words in enumerate(words_of) if wanted in words]
    partial = [f for f, name in enumerate(labels)
               if wanted in name.lower().replace(NO_CLEAR_OUTPUT, "") and f not in set(exact)]
    matched = sorted(exact, key=lambda f: -density[f]) + sorted(partial, key=lambda f: -density[f])
    found = bool(matched)
    if not found:
        matched = _nearest(wanted, words_of, density)
    return {"layer": dictionary.layer, "text": text, "matched": found, "total": len(matched) if found else 0,
            "features": [{"feature": f, "label": labels[f], **label_fit(dictionary, f), "density": float(density[f])}
                         for f in matched[:top]]}


def _words(name: str) -> set[str]:
    """A label's words, lower-cased: its tokens on both sides of the arrow, word pieces' '##' kept off
    ("no clear output" is not words of its own)."""
    name = name.lower().replace(NO_CLEAR_OUTPUT, "")
    return {w.lstrip("#") for w in re.split(r"\s*(?:,|→|->)\s*|\s+", name) if w.strip("#")}


def _nearest(wanted: str, words_of: list[set[str]], density: list[float]) -> list[int]:
    """The features whose label words are spelled nearest `wanted`, nearest first."""
    every = sorted({w for words in words_of for w in words})
    close = difflib.get_close_matches(wanted, every, n=NEAREST_LABELS, cutoff=0.5)
    rank = {w: i for i, w in enumerate(close)}
    scored = [(min(rank[w] for w in words if w in rank), -density[f], f)
              for f, words in enumerate(words_of) if words & rank.keys()]
    return [f for *_, f in sorted(scored)]


# ---------------------------------------------------------------- by direction

def similar_features(lm: LoadedModel, layer: int, feature: int, top: int = 10,
                     store: FeatureStore | None = None) -> dict:
    """The features whose decoder directions (what one unit of each adds to the layer) are nearest
    `feature`'s, by cosine.

    Returns {"layer", "feature", "label", "features": [{"feature", "cosine", "label", "label_f1",
    "label_kind"}] nearest first}."""
    dictionary = load_features(lm, layer, store)
    feature = dictionary.check_feature(feature)
    top = validate.whole_number(top, "number of features", 1, MAX_TOP, field="top")
    unit = unit_directions(dictionary)
    cosine = unit @ unit[feature]
    cosine[feature] = -2.0  # not itself
    best = cosine.topk(min(top, dictionary.latents - 1))
    return {"layer": dictionary.layer, "feature": feature, "label": label(lm, dictionary, feature),
            "features": [{"feature": f, "cosine": c, **labelled(lm, dictionary, f)}
                         for f, c in zip(best.indices.tolist(), best.values.tolist())]}


def unit_directions(dictionary: Dictionary) -> torch.Tensor:
    """(F, H) the decoder rows scaled to unit length (a zero row stays zero)."""
    rows = dictionary.coder.W_dec.detach().float()
    return rows / rows.norm(dim=1, keepdim=True).clamp(min=1e-12)
