"""The Features tab: what a layer represents, as the features of a sparse autoencoder (a
"dictionary") trained on that layer's output. A sentence's features, one feature's card, a
prediction with a feature switched off or turned up and the features behind it, two uses of a
word told apart, how far each dictionary can be trusted, and training one for a layer that has
none (a run: live curves, Stop).

The views are `bertdemo.features.views`' and the run `bertdemo.features.run`'s (declared in
`runs.kinds`); this tab lays them out (`features_sections`), wires one line per event and words
the results. Every view uses the session's model (its tuned model when switched on) and the app's
`FeatureStore` (`visitor.features`).
"""
from __future__ import annotations

import html
import math
import re

import gradio as gr
import pandas as pd

from ... import feature_plots, validate
from ...config import Settings
from ...features import drift, making, quality_views
from ...features import views as features
from ...features import feature_map as maps, search as finding
from ...features.run import FeatureProgress, FeaturesRequest
from ...features.store import FeatureStore, shared_store
from ...forward import splice
from ...model.loading import LoadedModel
from ...training import export
from ...training.loop import EventLog
from . import features_sections as sections
from ..parts import live_run, plot_clicks, view_downloads
from ..parts.common import empty_table
from ..parts.context import AppContext, Visitor, handler, standalone_demo

INTRO = """**What a layer represents, in features.** A *dictionary* (a sparse autoencoder, EleutherAI's
sparsify) rewrites a layer's output at each token as a few active *features* out of thousands; each
feature tends to mean one thing (a word, a sense, a grammatical role), read off the contexts where
it fires and the words it makes the model predict. Pick a layer, then look at a sentence's features,
open a feature's card (click a row of any table), switch a feature off or turn it up and watch the
prediction change, see which features made a prediction, and contrast two uses of a word. A
dictionary explains most of its layer, not all of it: the quality table says what replacing the layer by
it costs the model, and how much of the layer it explains. Beside every label, *label fits* says how well its
tokens find where the feature fires on held-out text (F1, 0 to 1) and whether that makes it a *word* feature
(it fires on those words whatever the sense) or a *context* feature (a feature's card says it in full)."""


def render(ctx: AppContext) -> None:
    """Layout (`features_sections`), then the events, wired by part."""
    n_layers, start = _layer_count(ctx), default_layer(ctx)
    gr.Markdown(INTRO)
    sections.table_style()
    line = availability(ctx.store.base, _store(ctx), start)
    layer, available = sections.layer_picker(n_layers, start, line)
    sentence = sections.sentence_section()
    finder = sections.find_section()
    first = default_feature(ctx, start)
    opener = sections.card_section(first)
    prediction = sections.prediction_section(start, first)
    contrast = sections.contrast_section()
    quality = sections.quality_section()
    drift = sections.drift_section()
    training = sections.training_section(ctx.settings.limits, start)

    layer.change(handler(ctx, on_layer), layer, [available, training.button], api_visibility="private",
                 trigger_mode="always_last")
    _wire_sentence_and_search(ctx, layer, sentence, finder, opener)
    _wire_card(ctx, layer, opener, [sentence.table, finder.table, prediction.why_table, contrast.table_a,
                                    contrast.table_b, drift.table])
    _wire_prediction_and_contrast(ctx, layer, opener.feature, prediction, contrast)
    _wire_quality_and_drift(ctx, layer, quality, drift)
    live_run.wire(ctx, "train_features", training.button,
                  {"layer": layer, "texts": training.texts, "keep_partial": training.keep_partial},
                  [*training.outputs, available, training.stopping], on_train_features)
    training.stop.click(handler(ctx, on_stop), None, training.stopping, api_name="stop_features", queue=False)


def _wire_sentence_and_search(ctx: AppContext, layer, sentence, finder, opener) -> None:
    """A sentence's features (then the chosen feature's card and the linked search), the search and the map."""
    feature, card = opener.feature, opener.card
    search_inputs = [finder.query, finder.by, layer, finder.top]
    sentence.button.click(handler(ctx, on_sentence_features), [sentence.text, layer, sentence.top], sentence.outputs,
                          api_name="sentence_features", concurrency_id="model").success(
        handler(ctx, on_feature_card), [layer, feature], card.outputs, api_visibility="private",
        concurrency_id="model").success(handler(ctx, on_linked_search), search_inputs, finder.outputs,
                                        api_visibility="private", concurrency_id="model")
    finder.find.click(handler(ctx, on_find_features), search_inputs, finder.outputs,
                      api_name="find_features", concurrency_id="model")
    finder.query.submit(handler(ctx, on_find_features), search_inputs, finder.outputs,
                        api_visibility="private", concurrency_id="model")
    finder.draw.click(handler(ctx, on_feature_map), layer, [finder.map, finder.map_note], api_name="feature_map",
                      concurrency_id="model").then(None, None, None, js=MAP_CLICKS)


def _wire_card(ctx: AppContext, layer, opener, tables: list) -> None:
    """The card: opened by its button or by a row of any table (its own included), its similar
    features, its export."""
    feature, card = opener.feature, opener.card
    opener.button.click(handler(ctx, on_feature_card), [layer, feature], card.outputs, api_name="feature_card",
                        concurrency_id="model")
    card.raw.change(handler(ctx, on_similar_features), [layer, feature], card.similar,  # whichever event drew it
                    api_name="similar_features", concurrency_id="model")
    for table in (*tables, card.cofiring, card.similar):  # a row: its card
        table.select(on_pick_feature, None, feature, api_visibility="private", queue=False).success(
            handler(ctx, on_feature_card), [layer, feature], card.outputs, api_visibility="private",
            concurrency_id="model").success(None, None, None, js=CARD_INTO_VIEW)
    opener.export_button.click(handler(ctx, on_export_card), [layer, feature], opener.export_files,
                               api_visibility="private", concurrency_id="model")


def _wire_prediction_and_contrast(ctx: AppContext, layer, feature, prediction, contrast) -> None:
    """Steer (named after the card's feature), the features behind a prediction, the contrast."""
    gr.on([feature.change, layer.change], on_steer_target, [layer, feature], prediction.named,
          api_visibility="private", queue=False)
    prediction.steer.click(handler(ctx, on_steer), [prediction.masked, layer, feature, prediction.scale, prediction.add,
                                                    prediction.top_k], prediction.steered,
                           api_name="steer_feature", concurrency_id="model")
    prediction.why.click(handler(ctx, on_prediction_features), [prediction.masked, layer, prediction.why_top],
                         prediction.why_outputs, api_name="prediction_features", concurrency_id="model")
    contrast.button.click(handler(ctx, on_contrast), [contrast.texts_a, contrast.texts_b, contrast.word, layer,
                                                      contrast.top], contrast.outputs,
                          api_name="contrast_features", concurrency_id="model")


def _wire_quality_and_drift(ctx: AppContext, layer, quality, drift) -> None:
    quality.button.click(handler(ctx, on_quality), None, quality.outputs, api_name="feature_quality",
                         concurrency_id="model").success(quality_notes, quality.raw, quality.words,
                                                         api_visibility="private", queue=False)
    drift_inputs = [drift.text, layer, drift.top, drift.sort_by]
    drift.button.click(handler(ctx, on_tuning_drift), drift_inputs, drift.outputs,
                       api_name="features_after_tuning", concurrency_id="model")
    drift.sort_by.change(handler(ctx, on_drift_sort), drift_inputs, drift.outputs,
                         api_visibility="private", concurrency_id="model", trigger_mode="always_last")


# A click on a point of the map writes its feature into the card's box and opens the card.
SIMILAR = 8  # similar features on a card
MAP_CLICKS = plot_clicks.opener("features-map", "features-feature", "features-open-card")
# A row clicked in any table: once its card is drawn, the card is scrolled into view (its number's box at the top)
CARD_INTO_VIEW = """() => {
    const card = document.getElementById("features-feature");
    if (card) card.scrollIntoView({block: "start"});
}"""


def create_demo(store=None, settings: Settings | None = None) -> gr.Blocks:
    """The tab on its own, for running or testing it alone."""
    return standalone_demo("features", render, store, settings)


# ---------------------------------------------------------------- handlers: the views

def on_layer(visitor: Visitor, layer):
    """The line saying which layers have a dictionary, and the train button named for `layer`."""
    button = gr.update(value=f"Train features for layer {_int(layer)}")
    return availability(visitor.lm, _store(visitor), layer), button


def on_sentence_features(visitor: Visitor, sentence, layer, top_features):
    """Each token's strongest sparse-autoencoder features at one layer, and a token x feature grid.

    Args:
        sentence: any text, e.g. "I sat on the river bank."; at most the model's length (512 tokens for BERT).
        layer: 0 = the embeddings, N = the N-th layer's output; the layer needs a feature dictionary (the bundled model ships layers 1 to 6).
        top_features: features listed per token, 1 to 50.

    Returns:
        a tokens x features heatmap (plotly), a table with one row per token and feature (feature, token, position, activation, label fits: the label's F1 on held-out text and its kind, label), and the raw result {"layer", "tokens", "per_token": [{"position", "token", "features": [{"feature", "activation", "label", "label_f1", "label_kind"}]}], "heatmap": {"features", "labels", "activations"}}.
    """
    lm = visitor.lm
    result = features.sentence_features(lm, sentence, layer, top_features, _store(visitor))
    title = f"Layer {result['layer']} of {lm.name}: each token's strongest features"
    return feature_plots.feature_heatmap(result, title), token_frame(result), result


def on_feature_card(visitor: Visitor, layer, feature):
    """Everything known of one feature of a layer's dictionary: what it fires on and what it does.

    Args:
        layer: 0 = the embeddings, N = the N-th layer's output; the layer needs a feature dictionary.
        feature: the feature's number, 0 to the dictionary's size - 1 (e.g. 3,072 features for the bundled model's layers).

    Returns:
        a summary (Markdown: how well its label explains it, what kind of feature it is, the label, density, mean and largest activation), its activations' histogram (plotly), its top contexts, examples from each band of its activations and random firings with the firing token highlighted, and the hidden words when it fires at a [MASK] (HTML), the tokens it promotes and suppresses at a [MASK] (plotly), the features that fire with it (table), and the raw card {"layer", "feature", "label", "label_score": {"precision", "recall", "f1", "kind": "word" or "context", "held_out_firings", "held_out_tokens", "summary"}, "density", "mean", "max", "histogram", "contexts": [{"text", "token", "start", "end", "activation"}], "bands": [{"band", "low", "high", "examples"}], "random_firings", "at_mask": {"words": [{"token", "token_id", "firings", "share", "lift"}], "firings", "masks"}, "promoted", "suppressed": [{"token", "token_id", "logit_change", "clear"}], "cofiring": [{"feature", "share", "label", "label_f1", "label_kind"}], "missing"}.
    """
    card = features.feature_card(visitor.lm, layer, feature, _store(visitor))
    return (card_summary(card, visitor.lm.name), feature_plots.feature_histogram(card), contexts_html(card),
            feature_plots.feature_effects(card), cofiring_frame(card), card)


def on_similar_features(visitor: Visitor, layer, feature):
    """The features of a layer whose decoder directions (what each writes into the layer) are nearest
    one feature's, by cosine: the "similar features" of its card.

    Args:
        layer: 0 = the embeddings, N = the N-th layer's output; the layer needs a feature dictionary.
        feature: the feature's number in that layer's dictionary.

    Returns:
        a table (feature, cosine, label fits: the label's F1 on held-out text and its kind, label), nearest first.
    """
    return similar_frame(finding.similar_features(visitor.lm, layer, feature, SIMILAR, _store(visitor)))


def on_find_features(visitor: Visitor, query, by, layer, top_features):
    """Find features of a layer's dictionary by a word (the features that fire on it most across the
    corpus, by lift: how many times more often the feature fires on the word than the word occurs)
    or by the text of their labels.

    Args:
        query: a word (by word: one word of the model's vocabulary, e.g. "river", or a piece as the vocabulary writes it, e.g. "##ing"), or text a label holds (by label, e.g. "capital").
        by: "word" or "label".
        layer: 0 = the embeddings, N = the N-th layer's output; the layer needs a feature dictionary.
        top_features: features listed, 1 to 50.

    Returns:
        a line saying what was found (by word: the word's occurrences in the corpus searched; by label: how many labels hold the text, or, with none, that the nearest labels are shown), a table (by word: feature, lift, the share of the word's occurrences it fires on, the share of its firings on the word, label fits, label; by label: feature, density, label fits, label; label fits: the label's F1 on held-out text and its kind, word or context), and the raw result (by word {"layer", "word", "token", "token_id", "occurrences", "corpus": {"tokens", "lines"}, "min_firings", "features": [{"feature", "lift", "firings", "word_share", "feature_share", "label", "label_f1", "label_kind"}]}; by label {"layer", "text", "matched", "total", "features": [{"feature", "label", "label_f1", "label_kind", "density"}]}).
    """
    lm, store = visitor.lm, _store(visitor)
    top_features = validate.whole_number(top_features, "number of features", 1, finding.MAX_TOP, field="top_features")
    if by == "label":
        result = finding.features_by_label(lm, query, layer, top_features, store)
        return found_label_note(result), label_frame(result), result
    if by not in (None, "word"):
        raise validate.InputError("by", f"Search by 'word' or 'label', got {validate.shown(by)}.")
    result = finding.features_for_word(lm, query, layer, top_features, store)
    return found_word_note(result), word_frame(result), result


def on_linked_search(visitor: Visitor, query, by, layer, top_features):
    """The search a link asks for (its `query`), after the link's sentence and card; nothing without one."""
    if not (isinstance(query, str) and query.strip()):
        return gr.skip(), gr.skip(), gr.skip()
    return on_find_features(visitor, query, by, layer, top_features)


def on_feature_map(visitor: Visitor, layer):
    """Every feature of a layer's dictionary as a point on a 2-D map, placed by the direction it writes
    into the layer (UMAP of the decoder rows' cosine distances, else PCA), coloured by its density (or its
    label's score where the labels were scored). Its layout is computed once per dictionary and kept.

    Args:
        layer: 0 = the embeddings, N = the N-th layer's output; the layer needs a feature dictionary.

    Returns:
        the map (plotly; each point's customdata is its feature number, and a click on it opens its card) and a line saying how it was laid out.
    """
    result = maps.feature_map(visitor.lm, layer, _store(visitor))
    return feature_plots.feature_map(result), map_note(result)


def on_pick_feature(evt: gr.SelectData):
    """A click on a row of a features table: its feature (every such table's first column)."""
    return feature_of_row(getattr(evt, "row_value", None))


def on_steer_target(layer, feature):
    """The steer form's line and button, naming the feature (the card's) they steer."""
    try:
        shown = int(feature)
    except (TypeError, ValueError):
        shown = "?"
    return sections.steer_target(_int(layer), shown), gr.update(value=sections.steer_button_text(shown))


def feature_of_row(row) -> int:
    """The feature a table row names (its first cell), or no change for a row without one."""
    try:
        return int(row[0])
    except (TypeError, ValueError, IndexError):
        return gr.skip()


def on_export_card(visitor: Visitor, layer, feature) -> dict:
    """The feature's card as files: JSON (everything), CSV, and its image (PNG, SVG)."""
    card = features.feature_card(visitor.lm, layer, feature, _store(visitor))
    return view_downloads.listed(view_downloads.feature_card_files(card, view_downloads.folder(visitor)))


def on_steer(visitor: Visitor, sentence, layer, feature, scale, mean_activations_added, top_k):
    """Fill-mask before and after one feature is scaled where it fires, or added at the [MASK]s
    where it does not (the dictionary's error term is kept: scale 1 and 0 added change nothing).

    Args:
        sentence: text with one or more [MASK] (any case), e.g. "The [MASK] was on the table.".
        layer: 0 = the embeddings, N = the N-th layer's output; the layer needs a feature dictionary.
        feature: the feature's number in that layer's dictionary.
        scale: 0 to 10: its contribution times this where it fires (0 = switched off, 1 = unchanged, 2 = doubled).
        mean_activations_added: 0 to 10: at each [MASK] where it does not fire, this many times its mean
            activation added.
        top_k: predictions per mask before and after, 1 to 50.

    Returns:
        a sentence saying where the feature fires, before/after bars per mask (plotly), and the raw result {"layer", "feature", "label", "scale", "add", "fired": [{"position", "token", "activation"}], "masks": [{"mask", "before", "after", "tokens": [{"token", "token_id", "before", "after"}]}]}.
    """
    result = features.steer(visitor.lm, sentence, layer, feature, scale, mean_activations_added, top_k, _store(visitor),
                            max_masks=visitor.settings.max_masks)
    return steer_note(result), feature_plots.steer_bars(result), result


def on_prediction_features(visitor: Visitor, sentence, layer, top_features):
    """The features at one layer that most lower each [MASK]'s top word when switched off: picked by
    a first-order estimate, then each switched off for real and the drop in log p measured.

    Args:
        sentence: text with one or more [MASK] (any case), e.g. "Paris is the [MASK] of France.".
        layer: 0 = the embeddings, N = the N-th layer's output; the layer needs a feature dictionary.
        top_features: features listed per mask, 1 to 50.

    Returns:
        a table (feature, mask, word, rank, the word's probability with the feature → switched off, the change in percentage points measured and estimated, label fits, label) and the raw result (the drops in log p) {"layer", "masks": [{"mask", "word", "token_id", "log_prob", "features": [{"feature", "label", "label_f1", "label_kind", "drop", "estimate", "activation"}]}]}.
    """
    top = validate.whole_number(top_features, "number of features", 1, features.MAX_TOP, field="top_features")
    candidates = min(features.MAX_CANDIDATES, max(20, 2 * top))  # measured, of which `top` are shown
    result = features.prediction_features(visitor.lm, sentence, layer, top, candidates, _store(visitor),
                                          max_masks=visitor.settings.max_masks)
    return prediction_frame(result), result


def on_contrast(visitor: Visitor, texts_a, texts_b, word, layer, top_features):
    """The features that tell two uses of a word apart: for each, the share of each list's
    occurrences of the word it fires on.

    Args:
        texts_a: sentences using the word one way, one per line (at most 200).
        texts_b: sentences using it the other way, one per line.
        word: the word both lists use, e.g. "bank".
        layer: 0 = the embeddings, N = the N-th layer's output; the layer needs a feature dictionary.
        top_features: features listed per list, 1 to 50.

    Returns:
        a summary line, list A's features and list B's (tables: feature, shares, separation, label fits: the label's F1 on held-out text and its kind, label).
    """
    result = features.contrast_features(visitor.lm, texts_a, texts_b, word, layer, top_features, _store(visitor))
    count = result["occurrences"]
    note = (f"'{_markdown(result['word'])}' at layer {result['layer']}: {count['a']} occurrence(s) in list A, "
            f"{count['b']} in list B. Separation = share of A's occurrences it fires on − share of B's.")
    return note, contrast_frame(result["a"]), contrast_frame(result["b"])


def on_quality(visitor: Visitor):
    """How far to trust each layer's dictionary of the model: measured on held-out text when it was made.

    Returns:
        a table with one row per layer with a dictionary, under plain headings: what replacing the layer by its reconstruction costs the masked LM first (loss added: cross-entropy in nats, perplexity ratio, KL divergence of the spliced from the clean predictions at the masked positions), then the unexplained share (FVU) and its 95% range, the share never fired (dead, over the window it states), features active per token (L0), loss recovered against zero- and mean-ablation, the held-out tokens, and how it was made (features, k, tokens, passes over its text, minutes, machine, what ended it); and the raw figures (the cross-entropies among them), one dict per layer, each with "notes": the same in words (how few held-out tokens, intervals, overfitting).
    """
    lm, store = visitor.lm, _store(visitor)
    splice.layer_count(lm.model)
    layers = store.layers(lm)
    if not layers:
        raise ValueError(f"{lm.name} has no feature dictionary yet: pick a layer and press "
                         "'Train features for layer N' (or call bertdemo.train_features).")
    rows = [_public(quality_views.feature_quality(lm, layer, store)) for layer in layers]
    return quality_frame(rows), rows


def quality_notes(rows) -> str:
    """The quality table's figures in words, one paragraph per layer (from the raw figures)."""
    return "\n\n".join(f"**Layer {row['layer']}.** " + " ".join(row.get("notes") or [])
                        for row in rows or [] if isinstance(row, dict) and "layer" in row)


def on_tuning_drift(visitor: Visitor, text, layer, top_features, sort_by):
    """What your fine-tune changed at one layer, through the base model's dictionary: which features
    fire more or less often, or more or less strongly, on the text, and how well the base dictionary
    still explains the tuned model's layer (FVU).

    Args:
        text: sentences to compare on, one per line; empty: the text your last fine-tune trained on
            (else the default corpus).
        layer: 0 = the embeddings, N = the N-th layer's output; the base model needs a dictionary there.
        top_features: features listed, 1 to 50.
        sort_by: "share" (the change of firing share) or "activation" (the change of mean activation
            where it fires): the features that changed most by that column, largest first.

    Returns:
        a summary line (the FVU of the base dictionary on each model) and a table of the features
        that changed most, the two changes in columns of their own.
    """
    tuned = visitor.store.tuned(visitor.session)
    if tuned is None:
        raise ValueError("You have no fine-tuned model yet: run one in the Fine-tune tab, then come back.")
    base = visitor.store.base_for(visitor.session)
    if not (isinstance(text, str) and text.strip()):
        last = visitor.store.result(visitor.session, export.LAST_RUN)
        text = last.text if last is not None else None
    result = drift.tuning_drift(base, tuned, text if text else making.default_texts(), layer, top_features,
                                _store(visitor), sort_by)
    fvu = result["fvu"]
    note = (f"Layer {result['layer']}, {result['tokens']:,} tokens: the base model's dictionary leaves "
            f"{fvu['base']:.1%} of the base model's layer unexplained (FVU) and {fvu['tuned']:.1%} of the "
            f"tuned model's. Sorted by {drift.SORTS[result['sort_by']]}, largest first: the share of tokens "
            "it fires on, tuned − base, in points; its mean activation where it fires, tuned − base (blank "
            "where it fires in one model only).")
    return note, drift_frame(result)


def on_drift_sort(visitor: Visitor, text, layer, top_features, sort_by):
    """The drift table again, sorted by the change just picked; nothing before a fine-tune."""
    if visitor.store.tuned(visitor.session) is None:
        return gr.skip(), gr.skip()
    return on_tuning_drift(visitor, text, layer, top_features, sort_by)


# ---------------------------------------------------------------- handlers: the run

def on_train_features(visitor: Visitor, request: FeaturesRequest, progress=gr.Progress()):
    """Train a feature dictionary for one layer of this session's model (a run: one per visitor,
    /stop_features ends it); kept for every visitor of that model. Parameters: `layer` (one without
    a dictionary), `texts` (one sentence per line; empty: the default corpus), `keep_partial` (keep
    a run stopped early). Yields the status, the live FVU and dead-latent curves, the new
    dictionary's quality table, the layers line and the Stop button's line."""
    outcome = yield from live_run.stream(
        visitor, "train_features", request, progress, lambda log: _live_outputs(log, progress),
        cleared=("Starting: reading the corpus…", None, empty_table(sections.QUALITY_COLUMNS), gr.skip(), ""))
    dictionary, history = outcome.result
    plan = outcome.plan
    quality = quality_frame([_public(quality_views.feature_quality(plan.lm, plan.layer, plan.store))]) \
        if dictionary is not None else empty_table(sections.QUALITY_COLUMNS)
    yield (final_status(outcome.kept, history, plan), feature_plots.feature_curves(history.steps), quality,
           availability(plan.lm, plan.store, plan.layer), gr.skip())


def _live_outputs(log: EventLog, progress) -> tuple:
    events = [e for e in log.latest.evals if isinstance(e, FeatureProgress)]
    if not events:
        return (gr.skip(),) * 5
    last = events[-1].step
    progress(events[-1].done, desc=f"training features: {last.tokens:,} tokens")
    status = (f"Step {last.step}: {last.tokens:,} tokens, FVU {last.fvu[0]:.3f}, {last.dead[0]:.1%} dead, "
              f"{last.tokens_per_s:,.0f} tokens/s. When training ends, its statistics and quality are "
              "measured before it is kept.")
    return status, feature_plots.feature_curves([e.step for e in events]), gr.skip(), gr.skip(), gr.skip()


def on_stop(visitor: Visitor) -> str:
    if live_run.stop(visitor):
        return "Stop asked: the run ends after its current step."
    return "Nothing is running: there is no training of yours to stop."


def final_status(kept, history, plan) -> str:
    """What the run did, in the page's words: how it ended, whether its dictionary was kept."""
    where = f"layer {plan.layer} of **{_markdown(plan.lm.name)}**"
    head = live_run.how_it_ended(history, plan.settings.max_seconds)
    if kept is not None and kept.kept:
        partial = (" (“Keep the dictionary if I press Stop…” was ticked: it has trained on fewer tokens, as its "
                   "figures show)" if history.stopped is not None else "")
        figures = quality_views.feature_quality(plan.lm, plan.layer, plan.store)
        return (f"{head} Its dictionary is **kept** as the one of {where}{partial}: every visitor of this model "
                f"can use it now. {quality_views.quality_line(figures)}\n\n" + " ".join(figures["notes"]))
    if not history.steps:
        return f"{head} No step ran, so there is no dictionary to keep."
    return (f"{head} Its dictionary was **not kept** (tick “Keep the dictionary if I press Stop…” to keep a "
            f"stopped run's): {where} still has none.")


# ---------------------------------------------------------------- what the page shows

def availability(lm: LoadedModel | None, store: FeatureStore, layer) -> str:
    """Which layers of `lm` have a dictionary, and for `layer`: its quality, or how to get one."""
    if lm is None:
        return ""
    try:
        splice.layer_count(lm.model)
    except ValueError as err:
        return f"⚠️ {_markdown(str(err))}."
    layers = store.layers(lm)
    name = _markdown(lm.name)
    line = (f"Feature dictionaries of **{name}**: layers {', '.join(map(str, layers))}." if layers
            else f"**{name}** has no feature dictionary yet.")
    layer = _int(layer)
    if layer in layers:
        return f"{line} {quality_line(lm, store, layer)}"
    return (f"{line} **Layer {layer} has none**: press **Train features for layer {layer}** below (a few minutes "
            "at most; then every visitor of this model can use it), or pick a layer listed here.")


def quality_line(lm: LoadedModel, store: FeatureStore, layer: int) -> str:
    """One line of a layer's dictionary's quality, the splice's cost first (`quality_views.quality_line`)."""
    return quality_views.quality_line(quality_views.feature_quality(lm, layer, store))


def card_summary(card: dict, model: str) -> str:
    """The card's head: how well its label explains it (read before the label), the label and its
    form, how often and how strongly it fires, and what its statistics lack."""
    score = card.get("label_score") or {}
    missing = f"  \n*{_markdown(card['missing'])}*" if card.get("missing") else ""
    return (f"**Feature {card['feature']}** of layer {card['layer']} ({_markdown(model)}): {score_tag(score)}"
            f"*{_markdown(card['label'])}*  \n{_markdown(_capital(score.get('summary', '')))}.  \n"
            "A label reads *fires on → promotes*: the tokens it fires on most by lift (how many times more often it "
            "fires on a token than the token occurs), then the words it raises at a [MASK] where that clears the "
            "noise (what a random direction as large raises), else *no clear output*.  \n"
            f"Fires on {card['density']:.2%} of the {card['statistics_tokens']:,} "
            f"tokens its statistics counted ({firings(card):,} firings{few_firings(card)}); mean activation "
            f"{card['mean']:.3f} where it fires, {share_of_largest(card)} of its largest ({card['max']:.3f}): "
            "activations have no unit and differ from layer to layer, so compare a feature with its own largest. "
            "Promoted and suppressed: its direction, times its mean activation, added at a "
            "[MASK] of a few sentences, through the rest of the model and its MLM head." + missing)


def score_tag(score: dict) -> str:
    """"[word feature, explains 81%] " before a label; "" where it was not scored."""
    if not score.get("kind"):
        return ""
    return f"\\[{score['kind']} feature, explains {score['recall']:.0%}\\] "


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def firings(card: dict) -> int:
    """How many times the feature fired in the tokens its statistics counted."""
    return round(card["density"] * card["statistics_tokens"])


def few_firings(card: dict) -> str:
    return ": too few to say much of what it does" if 0 < firings(card) < 200 else ""


def share_of_largest(card: dict) -> str:
    return f"{card['mean'] / card['max']:.0%}" if card["max"] else "none"


CARD_STYLE = ("<style>#feature-contexts table{border-collapse:collapse;width:100%;font-size:0.95em;margin-bottom:2px}"
              "#feature-contexts td,#feature-contexts th{padding:2px 6px;border:none;text-align:left}"
              "#feature-contexts td.left{text-align:right;width:48%}"
              "#feature-contexts td.word{width:1%;white-space:nowrap}"
              "#feature-contexts td.act{color:#6b7280;width:1%;white-space:nowrap}"
              "#feature-contexts p.under{color:#6b7280;font-size:0.9em;margin:0 0 12px}</style>")


def contexts_html(card: dict, width: int = 70) -> str:
    """The feature's whole range: its top contexts, examples from each band of its activations, a few
    random firings (the text around the firing token, the token highlighted, its activation), and the
    hidden words when it fires at a [MASK]; a line under each table says what it shows. Every piece
    of text is HTML-escaped."""
    if not card["contexts"]:
        return "<p>It never fired on the statistics' corpus.</p>"
    top = _rows(card["contexts"], width)
    parts = [CARD_STYLE, "<p><b>Top contexts</b></p>", _html_table(top),
             "<p class='under'>Its strongest firings, at most one per corpus line: the activation, then the line "
             "with the token it fired on highlighted.</p>"]
    if card.get("bands"):
        rows = [f"<tr><td class='act' colspan='4'>band {b['band']} of {len(card['bands'])}: "
                f"{b['low']:.2f} to {b['high']:.2f}</td></tr>" + _rows(b["examples"], width) for b in card["bands"]]
        parts += ["<p><b>Across its range</b></p>", _html_table("".join(rows)),
                  "<p class='under'>Its firings cut into ten bands of equal counts by activation (deciles of its "
                  "non-zero activations), weakest first, with examples drawn at random from each: what it does "
                  "when it fires weakly, not only at its strongest.</p>"]
    if card.get("random_firings"):
        parts += ["<p><b>Random firings</b></p>", _html_table(_rows(card["random_firings"], width)),
                  "<p class='under'>Firings drawn at random from all of its firings: what a typical firing looks "
                  "like, not only its strongest.</p>"]
    parts.append(_at_mask_html(card.get("at_mask")))
    return "".join(parts)


def _at_mask_html(at_mask: dict | None) -> str:
    """The hidden words when the feature fires at a [MASK] of held-out lines, with the line under it."""
    if not at_mask or not at_mask.get("masks"):
        return ""
    head = "<p><b>What it fires for at a [MASK]</b></p>"
    if not at_mask["words"]:
        return head + (f"<p class='under'>It did not fire at any of the {at_mask['masks']:,} [MASK]s of the held-out "
                       "lines: it reads the word itself, not what a gap may hold.</p>")
    rows = "".join(f"<tr><td class='word'><mark>{html.escape(w['token'])}</mark></td><td>{w['firings']:,}</td>"
                   f"<td>{w['share']:.0%}</td><td>{w['lift']:.1f}</td></tr>" for w in at_mask["words"])
    return (head + "<table><thead><tr><th>hidden word</th><th>its firings there</th><th>share of its [MASK] "
            "firings</th><th>lift</th></tr></thead><tbody>" + rows + "</tbody></table>"
            f"<p class='under'>It fired at {at_mask['firings']:,} of the {at_mask['masks']:,} [MASK]s of held-out lines "
            "(each line masked as in training); the words those [MASK]s hid, by lift: how many times more often it "
            "fires at a [MASK] hiding the word than such [MASK]s occur. A word here is what the model, at that "
            "layer, already guesses the gap holds.</p>")


def _rows(contexts: list[dict], width: int) -> str:
    """A table row per context: its activation, the text before, the firing token highlighted, the text after."""
    rows = []
    for context in contexts:
        text, start, end = context["text"], context["start"], context["end"]
        left = ("…" if start > width else "") + text[max(0, start - width):start]
        right = text[end:end + width] + ("…" if end + width < len(text) else "")
        rows.append(f"<tr><td class='act'>{context['activation']:.2f}</td><td class='left'>{html.escape(left)}</td>"
                    f"<td class='word'><mark title='{html.escape(context['token'], quote=True)}'>"
                    f"{html.escape(text[start:end] or context['token'])}</mark></td>"
                    f"<td class='right'>{html.escape(right)}</td></tr>")
    return "".join(rows)


def _html_table(rows: str) -> str:
    return "<table><tbody>" + rows + "</tbody></table>"


def steer_note(result: dict) -> str:
    fired = result["fired"]
    where = (", ".join(f"{_markdown(f['token'])} ({f['activation']:.2f})" for f in fired[:12])
             + (" …" if len(fired) > 12 else "")) if fired else "no token of this sentence"
    scale = result["scale"]
    what = "switched off" if scale == 0 else "unchanged" if scale == 1 else f"times {scale:g}"
    added = (f"; {result['add']:g} x its mean activation added at the masks where it does not fire"
             if result["add"] else "")
    return (f"Steered: feature {result['feature']} of layer {result['layer']} (*{_markdown(result['label'])}*). "
            f"It fires on {where}. Where it fires it is **{what}** (scale {scale:g}: 0 switches it off, 1 leaves it "
            f"unchanged, 2 doubles it){added}.")


def found_word_note(result: dict) -> str:
    corpus = result["corpus"]
    word = _markdown(result["token"])
    if not result["features"]:
        return f"No feature of layer {result['layer']} fires on '{word}' {result['min_firings']} times or more."
    return (f"'{word}' occurs **{result['occurrences']:,}** times in the {corpus['lines']:,} lines searched "
            f"({corpus['tokens']:,} tokens). Layer {result['layer']}'s features that fire on it, by **lift**: how "
            f"many times more often the feature fires on '{word}' than '{word}' occurs (a feature that fires on little "
            f"else comes first); each fires on it at least {result['min_firings']} time(s)."
            + (" Few occurrences: read the lift as a first guess." if result["occurrences"] < 10 else ""))


def found_label_note(result: dict) -> str:
    text = _markdown(result["text"])
    if not result["matched"]:
        return (f"No label of layer {result['layer']} holds '{text}'. The features whose labels are spelled "
                "nearest it are listed instead.")
    return (f"{result['total']:,} label(s) of layer {result['layer']} hold '{text}': those where it is a whole word "
            "first, the more often firing first.")


def map_note(result: dict) -> str:
    how = ("UMAP of the cosine distances between their decoder rows" if result["method"] == "umap"
           else "the first two principal components (PCA) of their unit decoder rows")
    kept = "read from the disk cache" if result["cached"] else "computed now and kept for the next visitor"
    return (f"Layer {result['layer']}: {len(result['features']):,} features placed by {how} ({kept}); colour: "
            f"{result['colour']['name']}. Click a point for its card.")


def label_fits(row: dict) -> str:
    """A table's "label fits" cell from a view's row: its label's F1 and kind ("0.91 word", "0.12
    context"; `views.label_fit`, the card's score), "not scored" where there is none."""
    if row.get("label_kind") is None:
        return "not scored"
    return f"{row['label_f1']:.2f} {row['label_kind']}"


def word_frame(result: dict) -> pd.DataFrame:
    rows = [[f["feature"], f"×{f['lift']:,.0f}" if f["lift"] >= 10 else f"×{f['lift']:.1f}",
             f"{f['firings']:,} of {result['occurrences']:,} ({f['word_share']:.0%})", f"{f['feature_share']:.1%}",
             label_fits(f), f["label"]] for f in result["features"]]
    return pd.DataFrame(rows, columns=list(sections.WORD_COLUMNS))


def label_frame(result: dict) -> pd.DataFrame:
    rows = [[f["feature"], f"{f['density']:.3%}", label_fits(f), f["label"]] for f in result["features"]]
    return pd.DataFrame(rows, columns=list(sections.LABEL_COLUMNS))


def similar_frame(result: dict) -> pd.DataFrame:
    rows = [[s["feature"], round(s["cosine"], 3), label_fits(s), s["label"]] for s in result["features"]]
    return pd.DataFrame(rows, columns=list(sections.SIMILAR_COLUMNS))


def token_frame(result: dict) -> pd.DataFrame:
    """Every token's features in one table, the strongest first (the heatmap keeps the sentence's order)."""
    rows = sorted(([f["feature"], t["token"], t["position"], round(f["activation"], 4), label_fits(f), f["label"]]
                   for t in result["per_token"] for f in t["features"]), key=lambda row: -row[3])
    return pd.DataFrame(rows, columns=list(sections.TOKEN_COLUMNS))


def cofiring_frame(card: dict) -> pd.DataFrame:
    rows = [[c["feature"], f"{c['share']:.0%}", label_fits(c), c["label"]] for c in card["cofiring"]]
    return pd.DataFrame(rows, columns=list(sections.COFIRING_COLUMNS))


def prediction_frame(result: dict) -> pd.DataFrame:
    """A row per mask and feature: the top word's probability with the feature and without it, and the
    change in percentage points, measured and estimated (the raw result keeps the drops in log p)."""
    rows = []
    for m in result["masks"]:
        p = math.exp(m["log_prob"])
        for rank, f in enumerate(m["features"], 1):
            without = p * math.exp(-f["drop"])
            rows.append([f["feature"], m["mask"], m["word"], rank, f"{p:.1%} → {without:.1%}",
                         round(100 * (without - p), 2), round(100 * (p * math.exp(-f["estimate"]) - p), 2),
                         label_fits(f), f["label"]])
    return pd.DataFrame(rows, columns=list(sections.PREDICTION_COLUMNS))


def contrast_frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([[r["feature"], f"{r['share_a']:.0%}", f"{r['share_b']:.0%}", round(r["separation"], 3),
                          label_fits(r), r["label"]] for r in rows], columns=list(sections.CONTRAST_COLUMNS))


def drift_frame(result: dict) -> pd.DataFrame:
    def activation(value):
        return None if value is None else round(value, 3)
    rows = [[r["feature"], f"{r['density_base']:.2%}", f"{r['density_tuned']:.2%}", f"{100 * r['share_change']:+.2f}",
             activation(r["mean_base"]), activation(r["mean_tuned"]),
             None if r["activation_change"] is None else f"{r['activation_change']:+.3f}", label_fits(r), r["label"]]
            for r in result["features"]]
    return pd.DataFrame(rows, columns=list(sections.DRIFT_COLUMNS))


def quality_frame(rows: list[dict]) -> pd.DataFrame:
    """One row per layer, the splice's cost first, under plain headings (sections.QUALITY_COLUMNS, each
    said in sections.QUALITY_HELP); the cross-entropies themselves stay in the raw figures."""
    def number(value, digits=3):
        return round(value, digits) if isinstance(value, (int, float)) else None

    def recovered(q):
        shares = [(q.get("loss_recovered") or {}).get(ablation) for ablation in ("zero", "mean")]
        return " / ".join("n/a" if v is None else f"{v:.0%}" for v in shares)
    table = []
    for q in rows:
        cost = quality_views.splice_cost(q) or {}
        interval = (q.get("interval") or {}).get("fvu")
        window = f" in {q['dead_window']:,} tokens" if "dead_window" in q else ""
        held = (q.get("held_out") or {}).get("tokens", q.get("tokens"))
        table.append([q["layer"], number(cost.get("added_cross_entropy")), number(cost.get("perplexity_ratio")),
                      number(cost.get("kl")), number(q.get("fvu")),
                      f"{interval[0]:.3f}–{interval[1]:.3f}" if interval else None,
                      f"{q['dead']:.1%}{window}" if "dead" in q else None, number(q.get("l0"), 1),
                      recovered(q), held, how_made(q)])
    return pd.DataFrame(table, columns=list(sections.QUALITY_COLUMNS))


def how_made(q: dict) -> str:
    """A dictionary's making in a line: its size and k, the tokens and passes, minutes, machine, what ended it."""
    training = q.get("training") or {}
    parts = [f"{q['latents']:,} features, k = {q['k']}"]
    if training.get("tokens") is not None:
        passes = training.get("passes")
        parts.append(f"{training['tokens']:,} tokens" + (f", {passes:.1f} passes" if passes is not None else ""))
    if training.get("minutes") is not None:
        parts.append(f"{training['minutes']:.1f} min" + (f" on {training['machine']}" if training.get("machine")
                                                         else ""))
    stopped = training.get("stopped")
    parts.append(f"ended by {ENDED.get(stopped, stopped) if stopped else 'its token limit'}")
    return "; ".join(parts)


ENDED = {"stopped": "Stop", "time limit": "the time limit", "diverged": "diverging", "shutdown": "a server stop",
         "closed": "the page closing"}  # training.loop.STOP_REASONS in a sentence


# ---------------------------------------------------------------- helpers

def default_layer(ctx: AppContext) -> int:
    """The middle one of the layers the app's model has a dictionary of; else its middle layer."""
    lm = ctx.store.base
    if lm is None:
        return 1
    try:
        layers = _store(ctx).layers(lm)
    except ValueError:
        layers = []
    return layers[(len(layers) - 1) // 2] if layers else _layer_count(ctx) // 2


def default_feature(ctx: AppContext, layer: int) -> int:
    """The feature the card opens with: the strongest of the example sentence at `layer` (0 where
    the app's model has no dictionary there)."""
    lm = ctx.store.base
    try:
        found = features.sentence_features(lm, sections.SENTENCE, layer, 1, _store(ctx)) if lm is not None else None
    except ValueError:
        found = None
    fired = [(f["activation"], f["feature"]) for t in (found or {}).get("per_token", []) for f in t["features"]]
    return max(fired)[1] if fired else 0


def _layer_count(ctx: AppContext) -> int:
    """L of the app's model (layers 0..L); bert-base's 12 without one or where features cannot splice."""
    lm = ctx.store.base
    try:
        return splice.layer_count(lm.model) if lm is not None else 12
    except ValueError:
        return 12


def _store(holder) -> FeatureStore:
    """The app's feature store (a Visitor's or the AppContext's), else the one its engine holds."""
    return holder.features if holder.features is not None else shared_store(holder.engine.caches)


def _public(quality: dict) -> dict:
    """A quality record without where the server keeps its files."""
    return {k: v for k, v in quality.items() if k != "folder"}


def _int(value) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _markdown(text: str) -> str:
    """Text shown as itself in Markdown: its markup characters escaped."""
    return re.sub(r"([\\`*_{}\[\]()#+\-.!|<>~])", r"\\\1", str(text))
