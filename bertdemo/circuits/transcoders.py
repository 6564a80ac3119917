"""Transcoders per layer: each feed-forward block's output written as a sparse sum of features of its input.

A transcoder of layer N (1..L) is a features `Dictionary` whose coder is EleutherAI's sparsify
`SparseCoder` in its transcoder mode (`transcode=True`, TopK, a linear skip path when `SETTINGS`
says so): it reads the block's input x (for BERT the attention block's normalised output; for a
pre-LayerNorm family the block's normalised input) and predicts the block's output y before the
residual add, y ~ decode(encode(x)) + W_skip x (`forward/mlp_points.py` finds both points through
the anatomy). Everything else is the features' own, at that point (`features.data.FEED_FORWARD`):
the data (plain and 15%-masked lines, [CLS], [SEP] and padding left out), the training loop
(sparsify's transcoder step: decoder started at zeros and never normalised), the statistics
(density, top contexts, labels: computed on the codes of the block's input, so a feature card
works for a transcoder feature), the quality figures (FVU of the block's output; masked-LM loss
with that output replaced at the kept positions, against zero- and mean-ablating it), the files
and the store (of kind "transcoders").

    transcoders, history = train_transcoders(lm, [1, 2])   # kept in the store under lm's weights
    transcoders_for(lm)                                    # {layer: Dictionary}; {} when none
    replaced_quality(lm, transcoders_for(lm), lines)       # every layer replaced at once: CE, KL

Shipped for the bundled model in assets/bundled/transcoders (`python -m bertdemo train-transcoders`);
trained ones in the server's disk cache, `<cache>/transcoders/<weights digest>/layer_N`.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable

import numpy as np

import torch
import torch.nn.functional as F

from ..features import dictionary as files
from ..features import making
from ..features.data import FEED_FORWARD, Lines
from ..features.dictionary import Dictionary
from ..features.quality import logits_at, masked_batches, replacement
from ..features.store import FeatureStore, shared_store
from ..features.stats import corpus_codes, index_dtype
from ..features.training import FeatureHistory, FeatureSettings, train
from ..forward import mlp_points
from ..model.caches import ModelCaches
from ..model.loading import LoadedModel

KIND = "transcoders"  # the disk cache's kind
SHIPPED = Path(__file__).resolve().parents[2] / "assets" / "bundled" / "transcoders"
# 8 x the hidden size latents, k = 32, as the dictionaries; the skip path measured better, and half
# sparsify's learning rate: at its full rate a transcoder's held-out FVU stalls higher and a sixth of
# its latents die (docs/features.md#the-shipped-transcoders-the-bundled-model).
SETTINGS = FeatureSettings(skip_connection=True, rate_scale=0.5)
# The shipped set's layers whose settings differ from SETTINGS (`retrain_shipped`; live runs keep
# SETTINGS for every layer): measured in docs/features.md#the-shipped-transcoders-the-bundled-model.
# Layers 3 and 4 went on from their first coders at k = 48 (a fresh batch order), layer 6 was made
# again at 2 x the hidden size and k = 64 (its block output is nearly constant: at 8 x, 28% of its
# latents never fired), then pruned of the 137 latents its training never fired (`prune_shipped`).
LAYER_SETTINGS: dict[int, FeatureSettings] = {3: replace(SETTINGS, k=48, seed=1), 4: replace(SETTINGS, k=48, seed=1),
                                              6: replace(SETTINGS, latents=768, k=64)}


def store_of(caches: ModelCaches) -> FeatureStore:
    """The transcoders every model of `caches` is offered (`features.store.shared_store`, of kind
    "transcoders"): an engine's caches hold the app's (the shipped ones, and those trained here in the
    engine's disk cache); a model loaded in code has its own, in the default disk cache."""
    return shared_store(caches, KIND, SHIPPED)


def transcoders_for(lm: LoadedModel, store: FeatureStore | None = None) -> dict[int, Dictionary]:
    """{layer: transcoder} for every layer of `lm` that has one (shipped or trained here), {} when none."""
    store = store or store_of(lm.caches)
    found = {layer: store.get(lm, layer) for layer in store.layers(lm)}
    return {layer: transcoder for layer, transcoder in found.items() if transcoder is not None}


def train_transcoders(lm: LoadedModel, layers: list[int] | None = None, texts: list[str] | str | None = None,
                      settings: FeatureSettings = SETTINGS, *, store: FeatureStore | None = None,
                      on_event: Callable | None = None, should_stop: Callable[[], bool] | None = None,
                      keep_partial: bool = True, resume: bool = False) -> tuple[dict[int, Dictionary], FeatureHistory]:
    """Train `lm`'s transcoders of `layers` (default every layer, 1..L) from one forward per batch
    on `texts` (None: the default corpus; one line in twenty held out), with their statistics and
    quality, and keep them in `store` for every later visitor of this model. When every layer then
    has one (trained now or kept before), each record's quality also says what replacing all of
    them at once does (`replaced_quality`). `resume`: go on from the store's. Returns ({layer:
    transcoder}, empty when a stopped run is not kept; the history)."""
    store = store or store_of(lm.caches)
    count = mlp_points.check(lm.model, "Transcoders")
    layers = list(range(1, count + 1)) if layers is None else [FEED_FORWARD.check_layer(lm.model, l) for l in layers]
    done, history, held_out = making.made(lm, layers, texts, settings, store=store, point=FEED_FORWARD,
                                          on_event=on_event, should_stop=should_stop, keep_partial=keep_partial,
                                          resume=resume)
    if not done:
        return {}, history
    every = {**transcoders_for(lm, store), **done}
    if sorted(every) == list(range(1, count + 1)):
        together = replaced_quality(lm, every, held_out)
        done = {layer: _with_all_layers(t, together) for layer, t in done.items()}
    return {layer: store.put(lm, transcoder) for layer, transcoder in done.items()}, history


def _with_all_layers(transcoder: Dictionary, together: dict) -> Dictionary:
    record = {**transcoder.record, "quality": {**transcoder.record["quality"], "all_layers": together}}
    return Dictionary(transcoder.coder, transcoder.layer, transcoder.folder, record, transcoder.stats)


@torch.no_grad()
def replaced_quality(lm: LoadedModel, transcoders: dict[int, Dictionary], lines: Lines,
                     batch_tokens: int = 4096) -> dict:
    """Every layer in `transcoders` replaced at once, on `lines` with the quality's fixed masks (each
    block's output replaced by its transcoder's at the kept positions, each transcoder reading what
    the replaced layers below it give): {"layers", "targets", "cross_entropy": {"clean",
    "replaced"}, "kl"}: the masked-LM cross-entropy of both, and KL(clean || replaced) of the
    predicted distributions, each a mean over the masked positions, in nats."""
    sums = {"clean": 0.0, "replaced": 0.0, "kl": 0.0}
    targets = 0
    for batch in masked_batches(lm, lines, batch_tokens):
        inputs = {k: v.to(lm.device) for k, v in batch.inputs.items()}
        labels = batch.labels.to(lm.device)
        rows, cols = (labels != -100).nonzero(as_tuple=True)
        keep = batch.keep.to(lm.device)
        edits = {layer: FEED_FORWARD.edit(replacement("spliced", t, None, keep)) for layer, t in transcoders.items()}
        clean = logits_at(lm, inputs, rows, cols, {}, FEED_FORWARD).float().log_softmax(-1)
        replaced = logits_at(lm, inputs, rows, cols, edits, FEED_FORWARD).float().log_softmax(-1)
        words = labels[rows, cols]
        sums["clean"] += float(F.nll_loss(clean, words, reduction="sum"))
        sums["replaced"] += float(F.nll_loss(replaced, words, reduction="sum"))
        sums["kl"] += float(F.kl_div(replaced, clean, log_target=True, reduction="sum"))
        targets += len(rows)
    if targets == 0:
        raise ValueError("The held-out text is too short to mask: paste more text.")
    return {"layers": sorted(transcoders), "targets": targets,
            "cross_entropy": {"clean": sums["clean"] / targets, "replaced": sums["replaced"] / targets},
            "kl": sums["kl"] / targets}


def make_shipped(lm: LoadedModel, corpus: Path, out: Path, settings: FeatureSettings = SETTINGS, *,
                 layers: list[int] | None = None, statistics_lines: int = 6000, held_out_lines: int = 4000,
                 echo: Callable[[str], None] = print) -> dict:
    """The shipped transcoders of `lm`, as the shipped dictionaries are made (`making.make_shipped`
    at the feed-forward point: trained from one forward per batch, float16, statistics with every
    feature's promoted tokens, quality), then every layer replaced at once, written into each
    record and training.json. Returns training.json."""
    making.make_shipped(lm, corpus, out, settings, layers=layers, statistics_lines=statistics_lines,
                        held_out_lines=held_out_lines, echo=echo, point=FEED_FORWARD)
    return finish_all_layers(lm, corpus, out, statistics_lines=statistics_lines, held_out_lines=held_out_lines,
                             echo=echo)


def finish_all_layers(lm: LoadedModel, corpus: Path, out: Path, *, statistics_lines: int = 6000,
                      held_out_lines: int = 4000, echo: Callable[[str], None] = print) -> dict:
    """The shipped transcoders in `out` replaced all at once on the quality's held-out lines:
    the figures go into each layer's record.json and training.json. Returns training.json."""
    started = time.perf_counter()
    record = json.loads((out / "training.json").read_text(encoding="utf-8"))
    transcoders = {layer: files.load(out / f"layer_{layer}") for layer in record["layers"]}
    _, held_out = making.shipped_lines(lm, corpus, statistics_lines, held_out_lines)
    together = replaced_quality(lm, transcoders, held_out)
    for layer, transcoder in transcoders.items():
        files.write_json(out / f"layer_{layer}" / files.RECORD, _with_all_layers(transcoder, together).record)
    ce = together["cross_entropy"]
    echo(f"all {len(transcoders)} layers replaced: cross-entropy {ce['clean']:.3f} clean, {ce['replaced']:.3f} "
         f"replaced; KL {together['kl']:.3f}")
    record["quality"] = {**record["quality"], "all_layers": together}
    record["minutes_statistics"] = round(record.get("minutes_statistics", 0) + (time.perf_counter() - started) / 60, 2)
    files.write_json(out / "training.json", record)
    return record


def retrain_shipped(lm: LoadedModel, corpus: Path, out: Path, plan: dict[int, FeatureSettings], *,
                    resume: tuple[int, ...] = (), statistics_lines: int = 6000, held_out_lines: int = 4000,
                    echo: Callable[[str], None] = print) -> dict:
    """Some layers of the shipped set in `out` trained again, each with its own settings (`plan`:
    {layer: settings}; layers of equal settings from one forward per batch), those in `resume` going
    on from their coder in `out`; the other layers' files left as they are. Their statistics, every
    feature's promoted tokens and their quality are made as `make_shipped` makes them (over the
    same lines, from the coders as stored, float16), their context lines found in the one
    contexts.txt (the others' indices into it unchanged); then every layer replaced at once.
    training.json's `per_layer` says how each layer was trained. Returns training.json."""
    lines = making.shipped_training(lm, corpus)
    started = time.perf_counter()
    groups: dict[tuple, list[int]] = {}  # (settings, resumed) -> its layers, trained together
    for layer in sorted(plan):
        groups.setdefault((plan[layer], layer in resume), []).append(layer)
    trained = _train_groups(lm, lines, out, groups, echo)
    echo(f"trained in {(time.perf_counter() - started) / 60:.2f} min")
    how = {}
    for layer, dictionary in trained.items():
        training = dictionary.record["training"]
        how[layer] = {"settings": asdict(plan[layer]), "tokens": training["tokens"], "minutes": training["minutes"],
                      "trained_with": groups[(plan[layer], layer in resume)],
                      **({"resumed_from": {k: training["resumed_from"].get(k) for k in ("tokens", "minutes", "settings")}}
                         if "resumed_from" in training else {})}
    return _store_layers(lm, corpus, out, trained, how, lines, started, "minutes_retrained",
                         statistics_lines=statistics_lines, held_out_lines=held_out_lines, echo=echo)


def prune_shipped(lm: LoadedModel, corpus: Path, out: Path, layers: list[int], *, probe_lines: int = 20_000,
                  statistics_lines: int = 6000, held_out_lines: int = 4000, echo: Callable[[str], None] = print) -> dict:
    """`layers`' coders in `out` without the latents that never fire over the first `probe_lines`
    lines of the text they trained on (one plain pass, one with every line 15%-masked, as the
    training reads them). A latent that never wins a top-k place there changes no output there:
    the coder computes the same on that text with fewer latents (its features renumbered). Their
    statistics, promoted tokens and quality made again, and every layer replaced at once, as
    `retrain_shipped` does; training.json's `per_layer` and each record's training say how many
    were removed, on how many tokens. Returns training.json."""
    lines = making.shipped_training(lm, corpus)
    started = time.perf_counter()
    probe = Lines(lm, lines.texts[:probe_lines])
    coders = {layer: files.load(out / f"layer_{layer}") for layer in layers}
    fired, tokens = _fired(lm, coders, probe)
    pruned, how = {}, {}
    before = _per_layer(json.loads((out / "training.json").read_text(encoding="utf-8")))
    for layer, coder in coders.items():
        removed = {"latents_before": coder.latents, "removed": int((~fired[layer]).sum()),
                   "never_fired_over": {"lines": len(probe), "tokens": tokens, "passes": "plain and 15%-masked"}}
        echo(f"layer {layer}: {removed['removed']} of {coder.latents} latents never fired over {tokens:,} "
             f"training tokens: removed")
        training = {**coder.record.get("training", {}), "pruned": removed}
        pruned[layer] = Dictionary(files.keeping(coder.coder, fired[layer]), layer, None,
                                   {**coder.record, "training": training})
        how[layer] = {**before.get(str(layer), {}), "pruned": removed}
    return _store_layers(lm, corpus, out, pruned, how, lines, started, "minutes_pruned",
                         statistics_lines=statistics_lines, held_out_lines=held_out_lines, echo=echo)


def _fired(lm: LoadedModel, coders: dict[int, Dictionary], lines: Lines) -> tuple[dict[int, torch.Tensor], int]:
    """({layer: which of its coder's latents fire at least once (F,) bool}, tokens read) over
    `lines` read twice: plain, then every line 15%-masked."""
    fired = {layer: torch.zeros(coder.latents, dtype=torch.bool) for layer, coder in coders.items()}
    tokens = 0
    for masked_share in (0.0, 1.0):
        codes = corpus_codes(lm, coders, lines, point=FEED_FORWARD, masked_share=masked_share)
        for layer, layer_codes in codes.items():
            fired[layer][layer_codes.indices[layer_codes.acts > 0].long()] = True
        tokens += next(iter(codes.values())).tokens
    return fired, tokens


def _store_layers(lm: LoadedModel, corpus: Path, out: Path, coders: dict[int, Dictionary], how: dict, lines: Lines,
                  started: float, minutes_key: str, *, statistics_lines: int, held_out_lines: int,
                  echo: Callable[[str], None]) -> dict:
    """New coders of some layers of the shipped set in `out` finished (statistics over the same
    lines as the others', every feature's promoted tokens, quality), their context lines found in
    the one contexts.txt (the others' indices into it unchanged), saved in float16 over their
    folders, how each was made (`how`: {layer: ...}) into training.json's `per_layer` and the
    minutes since `started` as its `minutes_key`; then every layer replaced at once. Returns
    training.json."""
    record = json.loads((out / "training.json").read_text(encoding="utf-8"))
    stats_lines, held_out = making.shipped_lines(lm, corpus, statistics_lines, held_out_lines)
    finished = making.finish(lm, coders, stats_lines, held_out, effects=True, training=lines, echo=echo)
    shared = (out / files.CONTEXTS).read_text(encoding="utf-8").split("\n")[:-1]
    count = len(shared)
    for dictionary in finished.values():
        _into_contexts(dictionary.stats, shared)
    if len(shared) > count:  # lines added at the end: the others' indices hold
        (out / files.CONTEXTS).write_text("".join(line + "\n" for line in shared), encoding="utf-8")
    for layer, dictionary in finished.items():
        files.save(dictionary, out / f"layer_{layer}", half=True, contexts=f"../{files.CONTEXTS}")
        echo(making.quality_echo(layer, dictionary.record["quality"]))
    per_layer = _per_layer(record)
    for layer, dictionary in finished.items():
        per_layer[str(layer)] = how[layer]
        record["quality"][str(layer)] = dictionary.record["quality"]
    record["per_layer"] = per_layer
    record[minutes_key] = round((time.perf_counter() - started) / 60, 2)
    files.write_json(out / "training.json", record)
    return finish_all_layers(lm, corpus, out, statistics_lines=statistics_lines, held_out_lines=held_out_lines,
                             echo=echo)


def _per_layer(record: dict) -> dict[str, dict]:
    """training.json's `per_layer` (how each layer was made), or, for a set made in one run, that
    run's settings, tokens and minutes for every layer."""
    return record.get("per_layer") or {
        str(layer): {"settings": record["settings"], "tokens": record["tokens"], "minutes": record["minutes"],
                     "trained_with": record["layers"]} for layer in record["layers"]}


def _train_groups(lm: LoadedModel, lines: Lines, out: Path, groups: dict[tuple, list[int]],
                  echo: Callable[[str], None]) -> dict[int, Dictionary]:
    """`retrain_shipped`'s training: each group's layers ((settings, resumed) -> layers) from one
    forward per batch, a resumed group from its coders in `out`; each coder as it will be stored
    (float16), its record saying what it went on from."""
    trained: dict[int, Dictionary] = {}
    for (settings, resumed), layers in groups.items():
        start = {layer: files.load(out / f"layer_{layer}") for layer in layers} if resumed else None
        echo(f"layers {layers}: {'going on from the shipped coders, ' if resumed else ''}{settings.max_tokens:,} "
             f"tokens or {settings.max_seconds:.0f} s, {settings}")

        def report(step) -> None:
            if step.step % 100 == 0:
                echo(f"step {step.step}: {step.tokens:,} tokens, {step.tokens_per_s:,.0f}/s; FVU "
                     + " ".join(f"{f:.3f}" for f in step.fvu) + "; dead " + " ".join(f"{d:.1%}" for d in step.dead))
        done, _ = train(lm, layers, lines, settings, point=FEED_FORWARD, on_event=report, start_from=start)
        for layer, d in done.items():  # as stored: float16
            d.coder.load_state_dict({k: v.half().float() for k, v in d.coder.state_dict().items()})
            before = start[layer].record.get("training", {}) if start else None
            trained[layer] = Dictionary(d.coder, layer, None, {
                **d.record, "training": {**d.record["training"], **({"resumed_from": before} if before else {})}})
    return trained


def _into_contexts(stats, shared: list[str]) -> None:
    """`stats`' context lines pointed at in `shared` (the shipped contexts.txt: the same corpus lines),
    lines it lacks added at its end, so the other layers' indices stay as they are."""
    where = {}
    for i, text in enumerate(shared):
        where.setdefault(text, i)
    renumber = np.empty(len(stats.contexts), dtype=np.int64)
    for i, text in enumerate(stats.contexts):
        if text not in where:
            where[text] = len(shared)
            shared.append(text)
        renumber[i] = where[text]
    for name in [name for name in stats.tensors if name.endswith("_line")]:
        line = stats.tensors[name].numpy().astype(np.int64)
        stats.tensors[name] = torch.from_numpy(np.where(line >= 0, renumber[np.maximum(line, 0)], -1)
                                               .astype(index_dtype(len(shared))))
    stats.contexts = list(shared)
