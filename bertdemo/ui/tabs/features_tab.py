"""The Features tab: what a layer represents, as the features of a sparse autoencoder (a
"dictionary") trained on that layer's output. A sentence's features, one feature's card, a
prediction with a feature switched off or turned up and the features behind it, two uses of a
word told apart, how far each dictionary can be trusted, and training one for a layer that has
none (a run: live curves, Stop).

The views are `bertdemo.features.views`' and the run `bertdemo.features.run`'s (declared in
`runs.kinds`); this tab lays them out (`features_sections`), wires one line per event and hands
each answer to `features_results` to be worded. Every view uses the session's model (its tuned
model when switched on) and the app's `FeatureStore` (`visitor.features`).
"""
from __future__ import annotations

import gradio as gr

from ... import feature_plots, validate
from ...config import Settings
from ...features import drift, making, quality_views
from ...features import views as features
from ...features import feature_map as maps, search as finding
from ...features.run import FeatureProgress, FeaturesRequest
from ...features.store import FeatureStore, shared_store
from ...forward import splice
from ...training import export
from ...training.loop import EventLog
from . import features_results as results, features_sections as sections
from ..parts import live_run, plot_clicks, view_downloads
from ..parts.common import empty_table, escape_markdown
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
    line = results.availability(ctx.store.base, _store(ctx), start)
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
    button = gr.update(value=f"Train features for layer {results.layer_number(layer)}")
    return results.availability(visitor.lm, _store(visitor), layer), button


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
    return feature_plots.feature_heatmap(result, title), results.token_frame(result), result


def on_feature_card(visitor: Visitor, layer, feature):
    """Everything known of one feature of a layer's dictionary: what it fires on and what it does.

    Args:
        layer: 0 = the embeddings, N = the N-th layer's output; the layer needs a feature dictionary.
        feature: the feature's number, 0 to the dictionary's size - 1 (e.g. 3,072 features for the bundled model's layers).

    Returns:
        a summary (Markdown: how well its label explains it, what kind of feature it is, the label, density, mean and largest activation), its activations' histogram (plotly), its top contexts, examples from each band of its activations and random firings with the firing token highlighted, and the hidden words when it fires at a [MASK] (HTML), the tokens it promotes and suppresses at a [MASK] (plotly), the features that fire with it (table), and the raw card {"layer", "feature", "label", "label_score": {"precision", "recall", "f1", "kind": "word" or "context", "held_out_firings", "held_out_tokens", "summary"}, "density", "mean", "max", "histogram", "contexts": [{"text", "token", "start", "end", "activation"}], "bands": [{"band", "low", "high", "examples"}], "random_firings", "at_mask": {"words": [{"token", "token_id", "firings", "share", "lift"}], "firings", "masks"}, "promoted", "suppressed": [{"token", "token_id", "logit_change", "clear"}], "cofiring": [{"feature", "share", "label", "label_f1", "label_kind"}], "missing"}.
    """
    card = features.feature_card(visitor.lm, layer, feature, _store(visitor))
    return (results.card_summary(card, visitor.lm.name), feature_plots.feature_histogram(card),
            results.contexts_html(card), feature_plots.feature_effects(card), results.cofiring_frame(card), card)


def on_similar_features(visitor: Visitor, layer, feature):
    """The features of a layer whose decoder directions (what each writes into the layer) are nearest
    one feature's, by cosine: the "similar features" of its card.

    Args:
        layer: 0 = the embeddings, N = the N-th layer's output; the layer needs a feature dictionary.
        feature: the feature's number in that layer's dictionary.

    Returns:
        a table (feature, cosine, label fits: the label's F1 on held-out text and its kind, label), nearest first.
    """
    return results.similar_frame(finding.similar_features(visitor.lm, layer, feature, SIMILAR, _store(visitor)))


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
        return results.found_label_note(result), results.label_frame(result), result
    if by not in (None, "word"):
        raise validate.InputError("by", f"Search by 'word' or 'label', got {validate.shown(by)}.")
    result = finding.features_for_word(lm, query, layer, top_features, store)
    return results.found_word_note(result), results.word_frame(result), result


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
    return feature_plots.feature_map(result), results.map_note(result)


def on_pick_feature(evt: gr.SelectData):
    """A click on a row of a features table: its feature (every such table's first column)."""
    return feature_of_row(getattr(evt, "row_value", None))


def on_steer_target(layer, feature):
    """The steer form's line and button, naming the feature (the card's) they steer."""
    try:
        shown = int(feature)
    except (TypeError, ValueError):
        shown = "?"
    return sections.steer_target(results.layer_number(layer), shown), gr.update(value=sections.steer_button_text(shown))


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
    return results.steer_note(result), feature_plots.steer_bars(result), result


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
    return results.prediction_frame(result), result


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
    note = (f"'{escape_markdown(result['word'])}' at layer {result['layer']}: {count['a']} occurrence(s) in list A, "
            f"{count['b']} in list B. Separation = share of A's occurrences it fires on − share of B's.")
    return note, results.contrast_frame(result["a"]), results.contrast_frame(result["b"])


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
    return results.quality_frame(rows), rows


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
    return note, results.drift_frame(result)


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
    quality = results.quality_frame([_public(quality_views.feature_quality(plan.lm, plan.layer, plan.store))]) \
        if dictionary is not None else empty_table(sections.QUALITY_COLUMNS)
    yield (final_status(outcome.kept, history, plan), feature_plots.feature_curves(history.steps), quality,
           results.availability(plan.lm, plan.store, plan.layer), gr.skip())


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
    where = f"layer {plan.layer} of **{escape_markdown(plan.lm.name)}**"
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
