"""The offline build of the bundled model (its corpus, its training script): never imported by the app; imports training/ and below."""
