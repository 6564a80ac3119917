"""bertdemo: the model service behind the demo. Plain Python; the Gradio UI lives in `bertdemo.ui`.

The layers, each a folder that imports only those below it: `forward` < `model` < `views` <
`serving` < `training` < `features` < `circuits` < `runs` < `sessions` < `ui`. The ground floor under all of them: `config`,
`validate`, `labelled`, `memory`, `plots`. `build` (the bundled model's offline build) is outside
the app's path.

The public API below loads its module on first use (PEP 562), so importing the package (or
`bertdemo.memory`, before torch) loads nothing else.
"""
import importlib

_HOMES = {  # public name -> the module that defines it
    "Engine": "serving.engine",
    "LoadedModel": "model.loading", "load": "model.loading", "pick_device": "model.loading",
    "load_bundled": "model.bundled",
    **dict.fromkeys(["fill_mask", "fill_jointly", "score_candidates", "sentence_score", "split_words",
                     "mask_word"], "views.fillmask"),
    "attention": "views.attention_views",
    **dict.fromkeys(["mask_sample", "outcome_counts", "static_vs_dynamic", "masking_law",
                     "article_mask_tokens", "article_comparison"], "views.masking"),
    "labelling_consequence": "training.experiments",
    "finetune": "training.fine_tuning", "compare_masking": "training.fine_tuning",
    **dict.fromkeys(["train_classifier", "classify", "adapt_then_classify"], "training.classification"),
    **dict.fromkeys(["forgetting", "lr_sweep"], "training.forgetting"),
    "parse_examples": "labelled",
    "layer_predictions": "views.explain", "saliency": "views.explain",
    "compare_predictions": "views.compare", "compare_scores": "views.compare",
    **dict.fromkeys(["neuron_view", "heads_off", "head_importance"], "views.heads"),
    "embedding_map": "views.embeddings", "probe_layers": "views.embeddings",
    "search_corpus": "views.corpus_search",
    **dict.fromkeys(["load_features", "sentence_features", "feature_card", "steer", "prediction_features",
                     "contrast_features"], "features.views"),
    "feature_quality": "features.quality_views", "tuning_drift": "features.drift",
    **dict.fromkeys(["features_for_word", "features_by_label", "similar_features"], "features.search"),
    "feature_map": "features.feature_map",
    **dict.fromkeys(["classifier_features", "make_cls_features"], "features.cls_features"),
    "train_features": "features.making", "FeatureSettings": "features.training",
    **dict.fromkeys(["train_transcoders", "transcoders_for"], "circuits.transcoders"),
    "attribution_graph": "circuits.attribution", "intervene": "circuits.interventions",
    "graph_json": "circuits.files",
}
__all__ = list(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'bertdemo' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
    globals()[name] = value  # once: later lookups do not come back here
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
