"""bertdemo: the model service behind the demo. Plain Python; the Gradio UI lives in `bertdemo.ui`."""
from .attention_views import attention  # shadows the module name: use `from bertdemo.attention_views import ...`
from .fillmask import fill_jointly, fill_mask, mask_word, score_candidates, sentence_score, split_words
from .training import compare_masking, finetune  # shadows the module: use `from bertdemo.training import ...`
from .masking import (article_comparison, article_mask_tokens, mask_sample, masking_law, outcome_counts,
                      static_vs_dynamic)
from .experiments import labelling_consequence
from .models import LoadedModel, load, pick_device

__all__ = ["LoadedModel", "load", "pick_device", "fill_mask", "fill_jointly", "score_candidates",
           "sentence_score", "split_words", "mask_word", "attention",
           "mask_sample", "outcome_counts", "static_vs_dynamic", "masking_law", "article_mask_tokens",
           "article_comparison", "labelling_consequence", "finetune", "compare_masking"]
