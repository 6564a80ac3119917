"""Making a dictionary, start to end: the corpus split -> training -> statistics -> quality -> saved.

    dictionary, history = train_features(lm, 3)                       # the default corpus
    dictionary, history = train_features(lm, 3, texts=my_lines, settings=FeatureSettings(max_seconds=60))

The default corpus is the corpus search's (assets/corpus/everyday.txt); a visitor's own text works
too. One line in twenty (chosen by a hash of the line, so the same whatever the order) is held out
for the quality figures. A stopped run's dictionary is kept when `keep_partial` (it has trained on
fewer tokens, and its figures say so), else discarded; either way the history says how it ended.
`make_shipped` trains every layer of a model from one forward per batch, for the files shipped in
assets/bundled/features (`python -m bertdemo train-features`). Transcoders are made by the same
steps at their own point (`point=data.FEED_FORWARD`: `bertdemo/circuits/transcoders.py`).
"""
from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Callable

from ..model.loading import LoadedModel
from ..views.corpus_search import DEFAULT_CORPUS
from . import dictionary as files
from .data import RESIDUAL, Lines, Point, point_of
from .dictionary import Dictionary
from .quality import measure
from .stats import corpus_codes, from_codes, keep_used_lines
from .store import FeatureStore, weights_digest
from .training import FeatureHistory, FeatureSettings, machine, train
from .views import default_store, promoted_ids

MIN_TOKENS = 1_000  # kept positions: below this a dictionary learns nothing worth showing
MAX_HELD_OUT = 2_000  # lines measured


def split_corpus(texts: list[str]) -> tuple[list[str], list[str]]:
    """(training lines, held-out lines): one line in twenty held out by a hash of its text; a
    corpus too small to hold any out measures on its last line in ten."""
    lines = [t.strip() for t in texts if t and t.strip()]
    held = [t for t in lines if int(hashlib.sha1(t.encode()).hexdigest()[:8], 16) % 20 == 0]
    if not held:
        held = lines[-max(1, len(lines) // 10):]
    train_lines = [t for t in lines if t not in set(held)] or lines
    return train_lines, held[:MAX_HELD_OUT]


def default_texts() -> list[str]:
    return DEFAULT_CORPUS.read_text(encoding="utf-8").splitlines()


def corpus_lines(lm: LoadedModel, texts: list[str] | str | None) -> tuple[Lines, Lines]:
    """(training Lines, held-out Lines) of `texts` (None or empty: the default corpus); ValueError
    when there is too little text to learn from."""
    if isinstance(texts, str):
        texts = texts.splitlines()
    chosen = texts if texts and any(t.strip() for t in texts) else default_texts()
    training, held_out = split_corpus(chosen)
    lines = Lines(lm, training)
    if lines.tokens < MIN_TOKENS:
        from .. import validate

        raise validate.InputError("texts", f"The corpus has {lines.tokens:,} tokens to train on; a dictionary "
                                           f"needs at least {MIN_TOKENS:,}. Paste more text, or leave it empty "
                                           "for the default corpus.")
    return lines, Lines(lm, held_out)


def train_features(lm: LoadedModel, layer: int, texts: list[str] | str | None = None,
                   settings: FeatureSettings = FeatureSettings(), *, store: FeatureStore | None = None,
                   on_event: Callable | None = None, should_stop: Callable[[], bool] | None = None,
                   keep_partial: bool = True, resume: bool = False) -> tuple[Dictionary | None, FeatureHistory]:
    """Train `lm`'s dictionary of `layer` on `texts` (see the module doc), compute its statistics
    and quality, and keep it in `store` for every later visitor of this model. `resume`: go on from
    the dictionary the store has for that layer. Returns (the dictionary, or None when a stopped run
    is not kept; the history)."""
    store = store or default_store()
    done, history, _ = made(lm, [layer], texts, settings, store=store, on_event=on_event, should_stop=should_stop,
                            keep_partial=keep_partial, resume=resume)
    return (store.put(lm, done[layer]) if done else None), history


def made(lm: LoadedModel, layers: list[int], texts: list[str] | str | None, settings: FeatureSettings, *,
         store: FeatureStore, point: Point = RESIDUAL, on_event: Callable | None = None,
         should_stop: Callable[[], bool] | None = None, keep_partial: bool = True,
         resume: bool = False) -> tuple[dict[int, Dictionary], FeatureHistory, Lines]:
    """`train_features`' steps for several layers at `point` from one forward per batch, up to
    (not including) keeping them: ({layer: Dictionary with statistics and quality}, empty when a
    stopped run is not kept; the history; the held-out lines measured on). `resume`: go on from
    what `store` has for each layer."""
    lines, held_out = corpus_lines(lm, texts)
    start = {layer: found for layer in layers if resume and (found := store.get(lm, layer)) is not None} or None
    trained, history = train(lm, layers, lines, settings, point=point, on_event=on_event, should_stop=should_stop,
                             start_from=start)
    if not history.steps or (history.stopped is not None and not keep_partial):
        return {}, history, held_out
    return finish(lm, trained, lines, held_out), history, held_out


def finish(lm: LoadedModel, trained: dict[int, Dictionary], lines: Lines, held_out: Lines,
           effects: bool = False) -> dict[int, Dictionary]:
    """Each trained dictionary with its statistics (over `lines`, plain, at what it reads; with the
    promoted tokens of every feature when `effects`) and its quality figures (over `held_out`) in
    its record. The dictionaries are all of one point (all transcoders, or none)."""
    points = {point_of(d) for d in trained.values()}
    if len(points) != 1:
        raise ValueError("finish takes dictionaries of one point: the transcoders apart from the others")
    codes = corpus_codes(lm, trained, lines, point=points.pop())
    stats_of = {layer: from_codes(codes[layer], lines.texts, d.latents) for layer, d in trained.items()}
    keep_used_lines(list(stats_of.values()))
    done = {}
    for layer, dictionary in trained.items():
        stats = stats_of[layer]
        with_stats = Dictionary(dictionary.coder, layer, None, dictionary.record, stats)
        if effects:
            stats.tensors["promoted"] = promoted_ids(lm, with_stats)
        quality = measure(lm, with_stats, held_out)
        record = {**dictionary.record, "weights": weights_digest(lm.model), "quality": quality,
                  "statistics": {"lines": len(lines), "tokens": codes[layer].tokens}}
        done[layer] = Dictionary(dictionary.coder, layer, None, record, stats)
    return done


def make_shipped(lm: LoadedModel, corpus: Path, out: Path, settings: FeatureSettings, *, layers: list[int] | None = None,
                 statistics_lines: int = 6000, held_out_lines: int = 4000, echo: Callable[[str], None] = print,
                 point: Point = RESIDUAL) -> dict:
    """The dictionaries (or, at `point`, the transcoders) of `layers` (default: every layer, 1..L)
    of `lm`, trained on `corpus`/train.txt from one forward per batch, then `finish_shipped`.
    Returns training.json."""
    layers = layers or list(range(1, lm.model.config.num_hidden_layers + 1))
    lines = Lines(lm, (corpus / "train.txt").read_text(encoding="utf-8").splitlines())
    what = "transcoders" if point.transcode else "dictionaries"
    echo(f"training {len(layers)} {what} on {lines.tokens:,} tokens a pass ({len(lines):,} lines), "
         f"{settings.max_tokens:,} tokens or {settings.max_seconds:.0f} s")
    started = time.perf_counter()

    def report(step) -> None:
        if step.step % 100 == 0:
            echo(f"step {step.step}: {step.tokens:,} tokens, {step.tokens_per_s:,.0f}/s; FVU "
                 + " ".join(f"{f:.3f}" for f in step.fvu) + "; dead " + " ".join(f"{d:.1%}" for d in step.dead))
    trained, history = train(lm, layers, lines, settings, point=point, on_event=report)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for layer, dictionary in trained.items():  # the coders first (float16, as shipped): the rest is made from them
        files.save(dictionary, out / f"layer_{layer}", half=True, contexts=f"../{files.CONTEXTS}")
    files.write_json(out / "training.json", {
        "weights": weights_digest(lm.model), "model": lm.name, "layers": layers, "tokens": history.tokens,
        "minutes": round((time.perf_counter() - started) / 60, 2), "machine": machine(),
        "corpus": corpus.name, "settings": trained[layers[0]].record["training"]["settings"]})
    return finish_shipped(lm, corpus, out, statistics_lines=statistics_lines, held_out_lines=held_out_lines, echo=echo)


def finish_shipped(lm: LoadedModel, corpus: Path, out: Path, *, statistics_lines: int = 6000, held_out_lines: int = 4000,
                   echo: Callable[[str], None] = print) -> dict:
    """The shipped coders in `out` (as stored, float16) with their statistics over the first
    `statistics_lines` of `corpus`/heldout.txt (one contexts.txt for all), the promoted tokens of
    every feature, and their quality over the next `held_out_lines`; training.json gets the figures."""
    started = time.perf_counter()
    record = json.loads((out / "training.json").read_text(encoding="utf-8"))
    trained = {layer: files.load(out / f"layer_{layer}") for layer in record["layers"]}
    trained = {layer: Dictionary(d.coder, layer, None, d.record) for layer, d in trained.items()}
    stats_lines, held_out = shipped_lines(lm, corpus, statistics_lines, held_out_lines)
    done = finish(lm, trained, stats_lines, held_out, effects=True)
    (out / files.CONTEXTS).unlink(missing_ok=True)
    for layer, dictionary in done.items():
        files.save(dictionary, out / f"layer_{layer}", half=True, contexts=f"../{files.CONTEXTS}")
        q = dictionary.record["quality"]
        echo(f"layer {layer}: FVU {q['fvu']:.3f}, dead {q['dead']:.1%}, L0 {q['l0']:.1f}, loss recovered "
             f"{_figure(q['loss_recovered']['zero'])} (zero) {_figure(q['loss_recovered']['mean'])} (mean)")
    record.update(minutes_statistics=round((time.perf_counter() - started) / 60, 2),
                  statistics={"lines": len(stats_lines), "held_out_lines": len(held_out)},
                  quality={layer: d.record["quality"] for layer, d in done.items()})
    files.write_json(out / "training.json", record)
    return record


def shipped_lines(lm: LoadedModel, corpus: Path, statistics_lines: int, held_out_lines: int) -> tuple[Lines, Lines]:
    """(the statistics' lines, the quality's lines) of a shipped set: the first `statistics_lines`
    of `corpus`/heldout.txt, then the next `held_out_lines`."""
    held = (corpus / "heldout.txt").read_text(encoding="utf-8").splitlines()
    return Lines(lm, held[:statistics_lines]), Lines(lm, held[statistics_lines:statistics_lines + held_out_lines])


def _figure(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"
