"""bertdemo: the model service behind the demo. Plain Python; the Gradio UI lives in `bertdemo.ui`."""
from .attention_views import attention
from .bundled import load_bundled
from .corpus_search import search_corpus
from .embeddings import embedding_map, probe_layers
from .engine import Engine
from .classification import (adapt_then_classify, classify, forgetting, lr_sweep, parse_examples,
                             train_classifier)
from .explain import compare_predictions, compare_scores, layer_predictions, saliency
from .experiments import labelling_consequence
from .heads import head_importance, heads_off, neuron_view
from .fillmask import fill_jointly, fill_mask, mask_word, score_candidates, sentence_score, split_words
from .masking import (article_comparison, article_mask_tokens, mask_sample, masking_law, outcome_counts,
                      static_vs_dynamic)
from .models import LoadedModel, load, pick_device
from .fine_tuning import compare_masking, finetune

__all__ = ["Engine", "LoadedModel", "load", "load_bundled", "pick_device", "fill_mask", "fill_jointly", "score_candidates",
           "sentence_score", "split_words", "mask_word", "attention",
           "mask_sample", "outcome_counts", "static_vs_dynamic", "masking_law", "article_mask_tokens",
           "article_comparison", "labelling_consequence", "finetune", "compare_masking",
           "train_classifier", "classify", "forgetting", "lr_sweep", "adapt_then_classify",
           "parse_examples", "layer_predictions", "saliency", "compare_predictions", "compare_scores",
           "neuron_view", "heads_off", "head_importance", "embedding_map", "probe_layers", "search_corpus"]
