"""A loaded model: loading, its card and caches, the bundled model, the one door for MLM logits; imports forward/."""
