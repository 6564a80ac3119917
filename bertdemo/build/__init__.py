"""The offline builds (the bundled model's corpus and training, the search's corpus): never imported by the app."""
