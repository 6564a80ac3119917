"""bertdemo: the model service behind the demo. Plain Python; the Gradio UI lives in `bertdemo.ui`."""
from .fillmask import fill_jointly, fill_mask, mask_word, score_candidates, sentence_score, split_words
from .models import LoadedModel, load, pick_device

__all__ = ["LoadedModel", "load", "pick_device", "fill_mask", "fill_jointly", "score_candidates",
           "sentence_score", "split_words", "mask_word"]
