"""The sentence's own features: a dictionary of the [CLS] vector a classifier's head reads, and a
Classify decision shown as the features it rests on, measured by switching each off.

Every other dictionary codes a layer's tokens and never reads [CLS] or [SEP] (`data.kept_positions`):
they never saw them in training. This one is the exception, a kind of its own: one vector per
sentence, the last layer's output at [CLS] (the splice point `forward.splice` reads: for BERT's
layout exactly what the classification head's pooler reads; a pre-LayerNorm family's head reads it
after its final norm). Same coder (sparsify's TopK `SparseCoder`), same step (`training.CoderTraining`:
sign-SGD under schedule-free averaging, AuxK), trained on the [CLS] vectors of corpus lines, one
per line, computed once and passed over several times:

    assets/bundled/cls_features/cfg.json, sae.safetensors   the coder (float16), as sparsify saves it
    assets/bundled/cls_features/record.json    how it was made (corpus, lines, seconds, machine) and its
                                               quality (held-out FVU and its interval, training FVU, L0)
    assets/bundled/cls_features/cls_stats.json per feature: lines fired, top corpus lines; the vectors' mean
    ~/.cache/bertdemo/features/<digest>/cls    one made here (`put_cls(store, ...)`)

Shipped beside the per-layer set, not inside it (`train-features` rewrites that folder whole), and
made by `python -m bertdemo train-features --cls` (`make_shipped_cls`). The per-layer store never
lists it (its layers are the `layer_N` folders). A classifier's body is a
copy of the base model's, tuned unless its body was frozen, so its [CLS] vector has moved from the
ones the dictionary was trained on: `classifier_features` says how well the dictionary reconstructs
this very vector (its share of variance left unexplained), beside the held-out FVU.

    coded = make_cls_features(lm, train_texts, held_out_texts, statistics_texts)
    save_cls(coded, folder)
    classifier_features(classifier, "The midfielder scored in the last minute.")
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from .. import validate
from ..config import Limits
from ..forward import lean_forward, splice
from ..model.loading import LoadedModel
from ..training.loop import stop_reason
from . import dictionary as files
from .dictionary import Dictionary
from .quality import LEVEL, RESAMPLES, fvu, resampled
from .store import FeatureStore, shared_store
from .training import CoderTraining, FeatureSettings, machine

FOLDER = "cls"  # in a store: beside the layer_N folders, never one of them
SHIPPED = Path(__file__).resolve().parents[2] / "assets" / "bundled" / "cls_features"
STATS = "cls_stats.json"
MAX_LENGTH = 64  # word pieces per line, special tokens included, as the per-token dictionaries read
TOP_LINES = 3  # corpus lines kept per feature (where it fires most)
MAX_TOP = 32
# A sentence gives one vector, not ~15 tokens: fewer latents than a layer's dictionary (1,024, not
# 8 x hidden), so ~16k lines (four minutes of forwards on 2 cores) train it and its files stay small;
# k as the layers' (in 45 s trials on the bundled model, k 16 left 0.31 of held-out variance, k 32 0.26).
SETTINGS = FeatureSettings(latents=1024, k=32, max_tokens=1_500_000, max_seconds=180.0, batch_tokens=1024,
                           chunk_tokens=1024, dead_tokens=20_000, pause=0.0)


@dataclass(frozen=True, eq=False)
class ClsFeatures:
    """A [CLS] dictionary (`dictionary.layer`: the last layer, whose output it codes) and its
    statistics: {"lines": how many corpus lines, "fired": (F,) lines each feature fired on,
    "top": [[(activation, line index), ...] per feature], "texts": {index: line}, "mean": (H,)
    the held-out vectors' mean}; empty until measured."""

    dictionary: Dictionary
    stats: dict = field(default_factory=dict)


# ---------------------------------------------------------------- the vectors

@torch.no_grad()
def cls_vectors(model, tokenizer, texts: list[str], *, max_length: int = MAX_LENGTH, batch_size: int = 64,
                device: torch.device | str = "cpu", packed=None) -> torch.Tensor:
    """(N, H) float32 on the CPU: the last layer's output at [CLS] for each text (cut at
    `max_length` word pieces), read at the splice point in the model's own forward, eval mode; with
    `packed` (a served model's packed weights), by the lean forward where it serves the model (its
    last layer at [CLS] only: the same vector, a quarter faster)."""
    layer = splice.layer_count(model, "The [CLS] features")
    was_training = model.training
    model.eval()
    encoded = tokenizer(list(texts), truncation=True, max_length=max_length)["input_ids"]
    order = np.argsort([len(ids) for ids in encoded], kind="stable")  # similar lengths: little padding
    out = torch.empty(len(texts), model.config.hidden_size)
    try:
        for start in range(0, len(order), batch_size):
            rows = order[start:start + batch_size]
            inputs = _padded([encoded[i] for i in rows], tokenizer.pad_token_id or 0, device)
            first = torch.zeros(len(rows), dtype=torch.long, device=device)
            lean = lean_forward.hidden_at(model, inputs, torch.arange(len(rows), device=device), first, packed) \
                if packed is not None else None
            read = lean if lean is not None else splice.read(model, inputs, [layer])[layer][:, 0]
            out[torch.as_tensor(rows)] = read.float().cpu()
    finally:
        model.train(was_training)
    return out


def _padded(rows: list[list[int]], pad: int, device) -> dict:
    longest = max(map(len, rows))
    ids = torch.full((len(rows), longest), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), longest), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = torch.tensor(row)
        mask[i, :len(row)] = 1
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device)}


# ---------------------------------------------------------------- training and measuring

@dataclass
class ClsHistory:
    """A training run on [CLS] vectors: FVU per step (on its batch), vectors seen, seconds, why it ended."""

    fvu: list[float] = field(default_factory=list)
    seen: int = 0
    seconds: float = 0.0
    stopped: str | None = None


def train_cls(vectors: torch.Tensor, settings: FeatureSettings = SETTINGS, *,
              should_stop: Callable[[], bool] | None = None,
              on_step: Callable[[int, float], None] | None = None) -> tuple[torch.nn.Module, ClsHistory]:
    """A TopK coder trained on `vectors` (N, H) by the per-layer dictionaries' step, in shuffled
    passes of `settings.batch_tokens` vectors, until `settings.max_tokens` vectors seen or
    `settings.max_seconds` (or `should_stop()`: the one stop rule, `loop.stop_reason`)."""
    torch.manual_seed(settings.seed)
    trained = CoderTraining(vectors.shape[1], settings, None, torch.device("cpu"))
    history, started = ClsHistory(), time.perf_counter()
    generator = torch.Generator().manual_seed(settings.seed)
    while history.seen < settings.max_tokens and history.stopped is None:
        for batch in vectors[torch.randperm(len(vectors), generator=generator)].split(settings.batch_tokens):
            history.stopped = stop_reason(should_stop, time.perf_counter() - started, settings.max_seconds)
            if history.stopped is not None or history.seen >= settings.max_tokens:
                break
            step_fvu, _ = trained.step(batch, settings)
            history.fvu.append(step_fvu)
            history.seen += len(batch)
            if on_step is not None:
                on_step(len(history.fvu), step_fvu)
    history.seconds = time.perf_counter() - started
    return trained.finished(), history


def fit(dictionary: Dictionary, vectors: torch.Tensor, resamples: int = RESAMPLES, seed: int = 0) -> dict:
    """How well `dictionary` reconstructs `vectors` (N, H): FVU (`quality.fvu`, the one FVU) with a
    bootstrap interval over the vectors (one per line), L0, and the share of latents that fired."""
    acts, indices = dictionary.encode(vectors)
    error = (dictionary.decode(acts, indices) - vectors).pow(2).sum(-1).double().numpy()  # (N,)
    squared = vectors.double().pow(2).sum(-1).numpy()
    total = vectors.double().numpy()  # (N, H)
    weights = resampled(len(vectors), resamples, seed)  # (R, N)
    draws = fvu(weights @ error, weights @ squared, weights @ total, weights.sum(1))
    tail = (1 - LEVEL) / 2 * 100
    fired = torch.zeros(dictionary.latents, dtype=torch.bool)
    fired[indices[acts > 0]] = True
    return {"fvu": float(fvu(error.sum(), squared.sum(), total.sum(0), len(vectors))),
            "interval": [float(np.percentile(draws, tail)), float(np.percentile(draws, 100 - tail))],
            "level": LEVEL, "resamples": resamples, "vectors": len(vectors),
            "l0": float((acts > 0).sum(-1).float().mean()), "fired_share": float(fired.float().mean())}


def statistics(dictionary: Dictionary, vectors: torch.Tensor, texts: list[str], top: int = TOP_LINES) -> dict:
    """Per feature over `texts` (their [CLS] `vectors`): how many lines it fires on and the `top`
    lines where it fires most (only those lines' texts kept), and the vectors' mean."""
    dense = dictionary.dense(vectors)  # (N, F)
    fired = (dense > 0).sum(0)
    values, rows = dense.topk(min(top, len(texts)), dim=0)  # (top, F)
    tops = [[(round(float(v), 4), int(r)) for v, r in zip(values[:, f], rows[:, f]) if v > 0]
            for f in range(dictionary.latents)]
    used = sorted({r for entries in tops for _, r in entries})
    return {"lines": len(texts), "fired": fired.tolist(), "top": tops, "texts": {str(r): texts[r] for r in used},
            "mean": [round(float(v), 6) for v in vectors.mean(0)]}


def make_cls_features(lm: LoadedModel, train_texts: list[str], held_out_texts: list[str],
                      statistics_texts: list[str] | None = None, settings: FeatureSettings = SETTINGS, *,
                      corpus: str = "", echo: Callable[[str], None] = lambda _: None,
                      vectors: dict[str, torch.Tensor] | None = None) -> ClsFeatures:
    """`lm`'s [CLS] dictionary, start to end: the [CLS] vectors of every line (`vectors`: those
    already computed, by name "train", "held_out", "statistics"), training, its FVU on the held-out
    lines (and on as many training lines), its statistics over `statistics_texts` (default the
    held-out lines), its record (corpus, lines, seconds, machine, settings, quality)."""
    started, cpu = time.perf_counter(), time.process_time()
    named = {"train": train_texts, "held_out": held_out_texts, "statistics": statistics_texts or held_out_texts}
    vectors = dict(vectors or {})
    for name, texts in named.items():
        if name not in vectors:
            vectors[name] = cls_vectors(lm.model, lm.tokenizer, texts, device=lm.device, packed=lm.caches.packed)
            echo(f"[CLS] vectors of {len(texts):,} {name} lines: {time.perf_counter() - started:.0f} s")
    reading, reading_cpu = time.perf_counter() - started, time.process_time() - cpu
    coder, history = train_cls(vectors["train"], settings)
    training_cpu = time.process_time() - cpu - reading_cpu
    echo(f"trained: {history.seen:,} vectors seen in {history.seconds:.0f} s")
    layer = splice.layer_count(lm.model, "The [CLS] features")
    dictionary = Dictionary(coder, layer)
    held_out = fit(dictionary, vectors["held_out"])
    trained_fit = fit(dictionary, vectors["train"][:len(held_out_texts)])
    record = {"model": lm.name, "weights": lm.weights_digest, "layer": layer, "point": "cls",
              "position": "[CLS]: the last layer's output at the first position, what the classifier's head reads",
              "training": {"corpus": corpus, "lines": len(train_texts), "vectors_seen": history.seen,
                           "passes": history.seen / max(1, len(train_texts)), "seconds": round(history.seconds, 1),
                           "cpu_seconds": round(training_cpu, 1), "seconds_reading_vectors": round(reading, 1),
                           "cpu_seconds_reading_vectors": round(reading_cpu, 1), "steps": len(history.fvu),
                           "stopped": history.stopped, "machine": machine(), "settings": asdict(settings)},
              "quality": {**held_out, "held_out_lines": len(held_out_texts), "training_fvu": trained_fit["fvu"]}}
    dictionary = Dictionary(coder, layer, None, record)
    stats = statistics(dictionary, vectors["statistics"], named["statistics"])
    stats["mean"] = [round(float(v), 6) for v in vectors["held_out"].mean(0)]
    return ClsFeatures(dictionary, stats)


def make_shipped_cls(lm: LoadedModel, corpus: Path, out: Path = SHIPPED, settings: FeatureSettings = SETTINGS, *,
                     train_lines: int = 16_000, statistics_lines: int = 2_000, held_out: tuple[int, int] = (6_000, 10_000),
                     echo: Callable[[str], None] = print) -> ClsFeatures:
    """The bundled model's [CLS] dictionary: trained on the first `train_lines` of `corpus`/train.txt,
    its statistics over the first `statistics_lines` of `corpus`/heldout.txt and its quality over
    held-out lines `held_out` (the per-layer set's quality lines, `making.shipped_lines`); saved in `out`."""
    train = (corpus / "train.txt").read_text(encoding="utf-8").splitlines()[:train_lines]
    held = (corpus / "heldout.txt").read_text(encoding="utf-8").splitlines()
    coded = make_cls_features(lm, train, held[held_out[0]:held_out[1]], held[:statistics_lines], settings,
                              corpus=f"{corpus.name}: train.txt lines 1-{len(train):,}; held out: heldout.txt lines "
                                     f"{held_out[0] + 1:,}-{held_out[1]:,}; statistics: heldout.txt lines "
                                     f"1-{statistics_lines:,}", echo=echo)
    quality = coded.dictionary.record["quality"]
    echo(f"[CLS]: held-out FVU {quality['fvu']:.3f} ({quality['interval'][0]:.3f}-{quality['interval'][1]:.3f}) on "
         f"{quality['held_out_lines']:,} lines, training FVU {quality['training_fvu']:.3f}, L0 {quality['l0']:.1f}")
    return save_cls(coded, out)


# ---------------------------------------------------------------- files and where they are

def save_cls(coded: ClsFeatures, folder: Path | str, half: bool = True) -> ClsFeatures:
    """The coder and its record as `dictionary.save` writes a layer's (float16 when `half`), and the
    statistics beside them. Returns it with its folder."""
    saved = files.save(coded.dictionary, folder, half=half, contexts=STATS)  # its lines are in the statistics
    files.write_json(saved.folder / STATS, coded.stats)
    (saved.folder / STATS).chmod(0o644)
    return ClsFeatures(saved, coded.stats)


def load_cls(folder: Path | str) -> ClsFeatures:
    folder = Path(folder)
    dictionary = files.load(folder)
    stats = json.loads((folder / STATS).read_text(encoding="utf-8")) if (folder / STATS).is_file() else {}
    return ClsFeatures(dictionary, stats)


def cls_folder(weights: str, store: FeatureStore | None = None, shipped: Path | None = SHIPPED) -> Path | None:
    """Where the [CLS] dictionary of the model with weights digest `weights` is: shipped (its record
    names those weights), else in `store`'s folder under the digest; None when there is none."""
    candidates = [Path(shipped)] if shipped is not None else []
    if store is not None:
        candidates.append(store.folder / weights / FOLDER)
    for folder in candidates:
        record = folder / files.RECORD
        if (folder / "cfg.json").is_file() and record.is_file() and \
                json.loads(record.read_text(encoding="utf-8")).get("weights") == weights:
            return folder
    return None


def put_cls(store: FeatureStore, coded: ClsFeatures) -> ClsFeatures:
    """Keep `coded` in `store` as its model's [CLS] dictionary (under the weights its record names),
    on disk and loaded (what `found_cls` returns from now on)."""
    weights = coded.dictionary.record["weights"]
    saved = save_cls(coded, store.folder / weights / FOLDER, half=False)
    store.keep((FOLDER, weights), saved.dictionary.folder, saved)
    return saved


def found_cls(weights: str | None, store: FeatureStore | None) -> ClsFeatures | None:
    """The [CLS] dictionary of the model with weights digest `weights` (`cls_folder`), read from disk
    once and kept loaded by `store`, as it keeps its layer dictionaries; with no store (a classifier
    made by hand, without its model's caches: `classifier_features` finds the store they hold) the
    shipped one alone, read from disk. None where there is none."""
    if not weights:
        return None
    if store is None:
        folder = cls_folder(weights)
        return load_cls(folder) if folder is not None else None
    return store.kept((FOLDER, weights), lambda: cls_folder(weights, store), load_cls)


# ---------------------------------------------------------------- the view

@torch.no_grad()
def classifier_features(classifier, text: str, top: int = 10, store: FeatureStore | None = None,
                        features: ClsFeatures | None = None) -> dict:
    """The features a classifier's decision on `text` rests on: the [CLS] dictionary of the model
    the classifier was built from (`features`, else found by its weights in `store` or shipped)
    codes the [CLS] vector its head reads; each active feature is switched off there (its activation
    x decoder row removed, the coder's error kept: the rest of the vector as it was) and the
    classifier's probability of its decided label measured before -> after, largest fall first.

    Returns {"text", "label", "probability", "probabilities": {label: p}, "unexplained": this vector's
    squared error over its squared distance from the corpus mean, "together": p with every active
    feature off at once, "features": [{"feature", "activation", "before", "after", "change" (points,
    after - before), "fired", "lines", "top": [{"activation", "text"}]}], "dictionary": its record's
    quality and training}."""
    if classifier is None:
        raise validate.InputError("classifier", "There is no classifier yet: train one first "
                                                "(Classify tab, 'Train the classifier', or bertdemo.train_classifier).")
    text = validate.text(text, "sentence", "The midfielder scored in the last minute.", field="text")
    validate.length_at_most(len(text), Limits.max_chars, "sentence", fix="Shorten it.", field="text")
    top = validate.whole_number(top, "number of features", 1, MAX_TOP, field="top")
    coded = features or _found(classifier, store)
    dictionary = coded.dictionary
    model = classifier.model
    if dictionary.width != model.config.hidden_size:
        raise validate.InputError("classifier", f"The [CLS] dictionary is {dictionary.width} wide and this "
                                                f"classifier's vectors {model.config.hidden_size}: they belong to "
                                                "different models. Train the classifier from the model it was made for.")
    layer = splice.layer_count(model, "The [CLS] features")
    inputs = dict(classifier.tokenizer(text, truncation=True, max_length=classifier.max_length, return_tensors="pt"))
    inputs = {k: v.to(classifier.device) for k, v in inputs.items() if k in ("input_ids", "attention_mask",
                                                                              "token_type_ids")}
    was_training = model.training
    model.eval()  # no dropout: the vector coded is the one the head reads when it classifies
    try:
        vector = splice.read(model, inputs, [layer])[layer][0, 0].float().cpu()  # (H,)
    finally:
        model.train(was_training)
    acts, indices = (t[0] for t in dictionary.encode(vector[None]))
    active = [(int(f), float(a)) for a, f in zip(acts, indices) if a > 0]
    removed = torch.zeros(len(active) + 2, dictionary.width)  # row 0 clean, then one per feature, then all
    for row, (feature, activation) in enumerate(active, 1):
        removed[row] = activation * dictionary.direction(feature)
    removed[-1] = removed[1:-1].sum(0)
    probs = switched_off(model, inputs, layer, removed)  # (rows, labels)
    decided = int(probs[0].argmax())
    before = float(probs[0, decided])
    rows = [{"feature": feature, "activation": activation, "before": before, "after": float(probs[row, decided]),
             "change": 100 * (float(probs[row, decided]) - before), **_described(coded.stats, feature)}
            for row, (feature, activation) in enumerate(active, 1)]
    rows.sort(key=lambda r: r["change"])
    reconstruction = dictionary.decode(acts[None], indices[None])[0]
    mean = torch.tensor(coded.stats["mean"]) if coded.stats.get("mean") else dictionary.coder.b_dec.detach()
    labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
    return {"text": text, "label": labels[decided], "probability": before,
            "probabilities": dict(zip(labels, probs[0].tolist())),
            "unexplained": float((vector - reconstruction).pow(2).sum() / (vector - mean).pow(2).sum().clamp_min(1e-12)),
            "together": float(probs[-1, decided]), "active": len(active), "features": rows[:top],
            "dictionary": {"quality": dictionary.record.get("quality", {}),
                           "training": dictionary.record.get("training", {}), "latents": dictionary.latents,
                           "k": dictionary.k, "statistics_lines": coded.stats.get("lines", 0)}}


@torch.no_grad()
def switched_off(model, inputs: dict, layer: int, removed: torch.Tensor) -> torch.Tensor:
    """The classifier's label probabilities (rows, labels) for the sentence in `inputs` repeated once
    per row of `removed` (rows, H), each row's vector subtracted from the [CLS] position's state at
    `layer`'s output (the splice point) before the head reads it; eval mode."""
    count = removed.shape[0]
    batch = {k: v.repeat(count, 1) for k, v in inputs.items()}

    def edit(hidden):  # (rows, T, H)
        hidden = hidden.clone()
        hidden[:, 0] -= removed.to(hidden.device, hidden.dtype)
        return hidden
    was_training = model.training
    model.eval()
    try:
        with splice.spliced(model, {layer: edit}):
            logits = model(**batch).logits
    finally:
        model.train(was_training)
    return logits.float().softmax(-1).cpu()


def _found(classifier, store: FeatureStore | None) -> ClsFeatures:
    """`store`'s [CLS] dictionary of the classifier's model, else the one the caches of the model it was
    copied from hold (`shared_store`: an engine's for the models it loaded), as every feature view finds
    a layer's."""
    caches = getattr(classifier, "caches", None)
    if store is None and caches is not None:
        store = shared_store(caches)
    found = found_cls(getattr(classifier, "base_weights", None), store)
    if found is None:
        raise validate.InputError("classifier", "The model this classifier was trained from has no [CLS] "
                                                "dictionary: one is shipped for the bundled model only. Train the "
                                                "classifier from the bundled model (or make one: "
                                                "bertdemo.features.cls_features.make_cls_features).")
    return found


def _described(stats: dict, feature: int) -> dict:
    """What the statistics say of `feature`: lines it fired on, of how many, its top lines."""
    if not stats.get("fired"):
        return {"fired": None, "lines": 0, "top": []}
    return {"fired": int(stats["fired"][feature]), "lines": int(stats["lines"]),
            "top": [{"activation": a, "text": stats["texts"][str(r)]} for a, r in stats["top"][feature]]}

