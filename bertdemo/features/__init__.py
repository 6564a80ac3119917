"""Sparse-autoencoder features per layer: the dictionaries and their files, their statistics, their training, the views on them; imports training/, views/, model/, forward/ and the ground floor."""
