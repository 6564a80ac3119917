"""A layer's features on a 2-D map: each feature a point, placed by its decoder direction (what it
writes into the layer), so features that write alike sit together.

    feature_map(lm, layer=3)     # {"method": "umap", "x", "y", "density", "labels", "colour", ...}

The layout is UMAP's (`umap-learn`) on the cosine distances between the decoder rows, where it is
installed; else the first two principal components (scikit-learn's PCA) of the unit rows. It is
computed once per dictionary and kept in the disk cache beside the dictionaries trained here (an
entry under the dictionary's digest: `search.kept_entry`), written under a temporary name and
renamed when whole; drawing it again reads that file. The colour is each feature's label score
(its label's detection F1, `stats.detection`) where the statistics hold one, else its density (log10 of the share of tokens it
fires on).
"""
from __future__ import annotations

import math

import numpy as np
import torch
from safetensors.numpy import load_file

from ..model.loading import LoadedModel
from .dictionary import Dictionary
from .search import keep, kept_entry, unit_directions
from .store import FeatureStore, shared_store
from .labels import labels
from .views import load_features

LAYOUT = "layout.safetensors"
NEIGHBOURS = 15  # UMAP's n_neighbors (fewer for a dictionary of fewer features)
SEED = 0
LABEL_SCORE = "label_f1"  # (F,) in the statistics, where the labels were scored


def umap_installed() -> bool:
    try:
        import umap  # noqa: F401
    except ImportError:
        return False
    return True


def layout(dictionary: Dictionary, method: str) -> np.ndarray:
    """(F, 2) float32: each feature's place from its unit decoder row, by `method` ("umap", "pca")."""
    unit = unit_directions(dictionary).numpy().astype(np.float64)
    if method == "pca":
        from sklearn.decomposition import PCA

        return PCA(n_components=2, random_state=SEED).fit_transform(unit).astype(np.float32)
    if method != "umap":
        raise ValueError(f"A map's method is 'umap' or 'pca', got {method!r}.")
    import warnings

    import umap

    distances = np.clip(1.0 - unit @ unit.T, 0.0, 2.0)  # cosine distance, exact (F is a few thousand)
    np.fill_diagonal(distances, 0.0)
    threads = torch.get_num_threads()
    try:
        with warnings.catch_warnings():  # "n_jobs overridden by random_state": one thread, the same map each time
            warnings.simplefilter("ignore")
            reducer = umap.UMAP(n_components=2, metric="precomputed", random_state=SEED,
                                n_neighbors=max(2, min(NEIGHBOURS, len(unit) - 1)))
            return reducer.fit_transform(distances).astype(np.float32)
    finally:
        # UMAP hands numba back its own thread count on the way out, through OpenMP's setting that
        # torch reads too: unset, every later forward of the server would run on the machine's
        # count, not the operator's (OMP_NUM_THREADS), and the ONNX crossover would be timed again.
        torch.set_num_threads(threads)


def kept_layout(lm: LoadedModel, dictionary: Dictionary, store: FeatureStore, method: str) -> tuple[np.ndarray, bool]:
    """(the dictionary's layout by `method`, whether it was read from the disk cache)."""
    entry = kept_entry(store, lm, dictionary, f"map-{method}")
    if (entry / LAYOUT).is_file():
        try:
            found = load_file(str(entry / LAYOUT))["xy"]
            store.cache.touch(entry)
            return found, True
        except (OSError, KeyError, ValueError):  # evicted while read: compute it again
            pass
    xy = layout(dictionary, method)
    keep(store, entry, LAYOUT, {"xy": xy}, metadata={"method": method})
    return xy, False


def feature_map(lm: LoadedModel, layer: int, store: FeatureStore | None = None, method: str | None = None) -> dict:
    """Every feature of `lm`'s dictionary of `layer` as a point (see the module doc). `method`:
    "umap" or "pca" (default: UMAP where installed).

    Returns {"layer", "method", "cached": whether the layout was read from the disk cache, "features",
    "x", "y", "density", "firings": each feature's firings in the statistics, "labels", "colour":
    {"name": "label score" or "density (log10)", "values"}, "statistics_tokens"}."""
    store = store or shared_store(lm.caches)
    dictionary = load_features(lm, layer, store)
    method = method or ("umap" if umap_installed() else "pca")
    xy, cached = kept_layout(lm, dictionary, store, method)
    stats = dictionary.stats
    density = stats["density"].numpy().astype(float) if stats is not None else np.zeros(dictionary.latents)
    tokens = stats.tokens if stats is not None else 0
    score = stats.tensors.get(LABEL_SCORE) if stats is not None else None
    if score is not None:
        colour = {"name": "label score (F1)", "values": score.float().tolist()}
    else:
        floor = 1.0 / max(1, tokens)  # a feature that never fired sits at the bottom of the scale
        colour = {"name": "density (log10)", "values": [math.log10(max(d, floor)) for d in density.tolist()]}
    return {"layer": dictionary.layer, "method": method, "cached": cached,
            "features": list(range(dictionary.latents)), "x": xy[:, 0].tolist(), "y": xy[:, 1].tolist(),
            "density": density.tolist(), "firings": [round(d * tokens) for d in density.tolist()],
            "labels": labels(lm, dictionary), "colour": colour,
            "statistics_tokens": tokens}
