"""Making a dictionary, start to end: the corpus split -> training -> statistics -> quality -> saved.

    dictionary, history = train_features(lm, 3)                       # the default corpus
    dictionary, history = train_features(lm, 3, texts=my_lines, settings=FeatureSettings(max_seconds=60))

The default corpus is the corpus search's (assets/corpus/everyday.txt); a visitor's own text works
too. Lines are held out for the quality figures by a hash of each (the same whatever the order):
20,000 tokens where the corpus has five times that, else a fifth of its tokens (the quality figures
say how few: the default corpus has ~16,000). A stopped run's dictionary is kept when `keep_partial` (it has trained on
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
from typing import Callable, Sequence

from ..model.loading import LoadedModel
from ..views.corpus_search import DEFAULT_CORPUS
from . import dictionary as files
from .data import RESIDUAL, Lines, Point, point_of
from .dictionary import Dictionary
from .effects import promoted
from .quality import measure
from .stats import corpus_codes, from_codes, keep_used_lines
from .store import FeatureStore, shared_store
from .training import FeatureHistory, FeatureSettings, machine, train

MIN_TOKENS = 1_000  # kept positions: below this a dictionary learns nothing worth showing
HELD_OUT_TOKENS = 20_000  # the held-out text, where the corpus allows
HELD_OUT_SHARE = 0.2  # of a corpus's tokens at most: the rest is what it trains on
MASK_SEED = 1  # the masks of the held-out pass the [MASK] statistics read


def split_corpus(texts: list[str], sizes: Sequence[int] | None = None) -> tuple[list[str], list[str]]:
    """(training lines, held-out lines): lines held out in the order of a hash of their text until
    HELD_OUT_TOKENS tokens, or HELD_OUT_SHARE of the corpus's when that is fewer; each kept in the
    corpus's order. `sizes`: each line's tokens (default: its words)."""
    lines = [t.strip() for t in texts if t and t.strip()]
    if sizes is None:
        sizes = [len(t.split()) for t in lines]
    goal = min(HELD_OUT_TOKENS, HELD_OUT_SHARE * sum(sizes))
    held, tokens = set(), 0
    for i in sorted(range(len(lines)), key=lambda i: hashlib.sha1(lines[i].encode()).hexdigest()):
        if tokens >= goal and held:
            break
        held.add(lines[i])
        tokens += sizes[i]
    train_lines = [t for t in lines if t not in held] or lines
    return train_lines, [t for t in dict.fromkeys(lines) if t in held]


def default_texts() -> list[str]:
    return DEFAULT_CORPUS.read_text(encoding="utf-8").splitlines()


def corpus_lines(lm: LoadedModel, texts: list[str] | str | None) -> tuple[Lines, Lines]:
    """(training Lines, held-out Lines) of `texts` (None or empty: the default corpus); ValueError
    when there is too little text to learn from."""
    if isinstance(texts, str):
        texts = texts.splitlines()
    chosen = texts if texts and any(t.strip() for t in texts) else default_texts()
    whole = Lines(lm, chosen)
    training, held_out = split_corpus(whole.texts, whole.lengths.tolist())
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
    store = store or shared_store(lm.caches)
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
    if not history.steps or (history.stopped is not None and not keep_partial) or history.stopped == "shutdown":
        # a server's stop keeps nothing it would first have to measure (statistics, held-out
        # quality: seconds to a minute): the process is ending, within the 10 s a container gets
        return {}, history, held_out
    return finish(lm, trained, lines, held_out, training=lines), history, held_out


def finish(lm: LoadedModel, trained: dict[int, Dictionary], lines: Lines, held_out: Lines,
           effects: bool = False, training: Lines | None = None, quality: bool = True,
           echo: Callable[[str], None] | None = None) -> dict[int, Dictionary]:
    """Each trained dictionary with its statistics (over `lines`, plain, at what it reads; its
    labels' detection scores over `held_out`, plain, and the hidden words at its firings on a
    [MASK] over `held_out` masked; with the promoted tokens of every feature when `effects`) and its
    quality figures (over `held_out`; its FVU on `training`, the text it trained on, beside them) in
    its record (unless not `quality`: then the record's figures stay). The dictionaries are all of
    one point (all transcoders, or none)."""
    points = {point_of(d) for d in trained.values()}
    if len(points) != 1:
        raise ValueError("finish takes dictionaries of one point: the transcoders apart from the others")
    point, say = points.pop(), echo or (lambda _: None)
    started = time.perf_counter()
    codes = corpus_codes(lm, trained, lines, point=point)
    plain = corpus_codes(lm, trained, held_out, point=point)
    masked = corpus_codes(lm, trained, held_out, point=point, masked_share=1.0, seed=MASK_SEED)
    say(f"three corpus passes: {time.perf_counter() - started:.0f} s")
    stats_of = {layer: from_codes(codes[layer], lines.texts, d.latents, held_out=plain[layer], masked=masked[layer])
                for layer, d in trained.items()}
    keep_used_lines(list(stats_of.values()))
    say(f"statistics: {time.perf_counter() - started:.0f} s")
    done = {}
    for layer, dictionary in trained.items():
        stats = stats_of[layer]
        with_stats = Dictionary(dictionary.coder, layer, None, dictionary.record, stats)
        if effects:
            stats.tensors.update(promoted(lm, with_stats))
            say(f"layer {layer}'s promoted words: {time.perf_counter() - started:.0f} s")
        if not quality:
            done[layer] = Dictionary(dictionary.coder, layer, None, dictionary.record, stats)
            continue
        quality_figures = measure(lm, with_stats, held_out, training=training)
        record = {**dictionary.record, "weights": lm.weights_digest, "quality": quality_figures,
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
        "weights": lm.weights_digest, "model": lm.name, "layers": layers, "tokens": history.tokens,
        "minutes": round((time.perf_counter() - started) / 60, 2), "machine": machine(),
        "corpus": corpus.name, "settings": trained[layers[0]].record["training"]["settings"]})
    return finish_shipped(lm, corpus, out, statistics_lines=statistics_lines, held_out_lines=held_out_lines, echo=echo,
                          training=lines)


def finish_shipped(lm: LoadedModel, corpus: Path, out: Path, *, statistics_lines: int = 6000, held_out_lines: int = 4000,
                   echo: Callable[[str], None] = print, training: Lines | None = None, quality: bool = True,
                   layers: list[int] | None = None) -> dict:
    """The shipped coders in `out` (as stored, float16) with their statistics over the first
    `statistics_lines` of `corpus`/heldout.txt (one contexts.txt for all; the labels' scores and
    the [MASK] statistics over the next `held_out_lines`), the promoted tokens of every feature,
    and (unless not `quality`: the figures they have stay) their quality over those held-out lines
    (with their FVU on `training`, default `corpus`/train.txt); training.json gets the figures.
    `layers`: those alone (a trial run: written to another `out`)."""
    started = time.perf_counter()
    record = json.loads((out / "training.json").read_text(encoding="utf-8"))
    trained = {layer: files.load(out / f"layer_{layer}") for layer in layers or record["layers"]}
    trained = {layer: Dictionary(d.coder, layer, None, d.record) for layer, d in trained.items()}
    stats_lines, held_out = shipped_lines(lm, corpus, statistics_lines, held_out_lines)
    training = (training or shipped_training(lm, corpus)) if quality else None
    done = finish(lm, trained, stats_lines, held_out, effects=True, training=training, quality=quality, echo=echo)
    (out / files.CONTEXTS).unlink(missing_ok=True)
    for layer, dictionary in done.items():
        files.save(dictionary, out / f"layer_{layer}", half=True, contexts=f"../{files.CONTEXTS}")
        echo(quality_echo(layer, dictionary.record["quality"]) if quality else f"layer {layer}: statistics saved")
    minutes = round((time.perf_counter() - started) / 60, 2)
    record.update({"minutes_statistics" if quality else "minutes_labels_only": minutes,
                   "statistics": {"lines": len(stats_lines), "held_out_lines": len(held_out)}})
    if quality:
        record.update(quality={layer: d.record["quality"] for layer, d in done.items()})
    files.write_json(out / "training.json", record)
    return record


def measure_shipped(lm: LoadedModel, corpus: Path, out: Path, *, statistics_lines: int = 6000,
                    held_out_lines: int = 4000, echo: Callable[[str], None] = print) -> dict:
    """The shipped coders and statistics in `out` left as they are, their quality measured again
    (`quality.measure`, as defined now) on the same held-out lines as when they were made, with their
    FVU on `corpus`/train.txt and the passes over it: each layer's record.json (its quality and its
    training's text and passes) and training.json are written again. Returns training.json."""
    record = json.loads((out / "training.json").read_text(encoding="utf-8"))
    _, held_out = shipped_lines(lm, corpus, statistics_lines, held_out_lines)
    training = shipped_training(lm, corpus)
    text = {"lines": len(training), "tokens": training.tokens}
    for layer in record["layers"]:
        dictionary = files.load(out / f"layer_{layer}")
        quality = {**dictionary.record.get("quality", {}), **measure(lm, dictionary, held_out, training=training)}
        trained = dictionary.record.get("training", {})
        files.write_json(out / f"layer_{layer}" / files.RECORD, {
            **dictionary.record, "quality": quality,
            "training": {**trained, "text": text, "passes": trained.get("tokens", 0) / max(1, training.tokens)}})
        record.setdefault("quality", {})[str(layer)] = quality
        echo(quality_echo(layer, quality))
    record.update(text=text, passes=record.get("tokens", 0) / max(1, training.tokens))
    files.write_json(out / "training.json", record)
    return record


def quality_echo(layer: int, q: dict) -> str:
    """One line of a layer's quality for a terminal, the splice's cost first."""
    cost = q["splice_cost"]
    return (f"layer {layer}: cross-entropy +{cost['added_cross_entropy']:.3f} nats (perplexity "
            f"x{cost['perplexity_ratio']:.3f}, KL {cost['kl']:.3f}); FVU {q['fvu']:.3f}, dead {q['dead']:.1%} "
            f"over {q['dead_window']:,} tokens, L0 {q['l0']:.1f}, loss recovered "
            f"{_figure(q['loss_recovered']['zero'])} (zero) {_figure(q['loss_recovered']['mean'])} (mean)")


def shipped_training(lm: LoadedModel, corpus: Path) -> Lines:
    """The text a shipped set trained on: `corpus`/train.txt."""
    return Lines(lm, (corpus / "train.txt").read_text(encoding="utf-8").splitlines())


def shipped_lines(lm: LoadedModel, corpus: Path, statistics_lines: int, held_out_lines: int) -> tuple[Lines, Lines]:
    """(the statistics' lines, the quality's lines) of a shipped set: the first `statistics_lines`
    of `corpus`/heldout.txt, then the next `held_out_lines`."""
    held = (corpus / "heldout.txt").read_text(encoding="utf-8").splitlines()
    return Lines(lm, held[:statistics_lines]), Lines(lm, held[statistics_lines:statistics_lines + held_out_lines])


def _figure(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"
