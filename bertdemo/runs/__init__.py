"""Runs: the slots (imports no trainer: the session store holds them), a run's life (imports training/), the kinds of run (import the life and their jobs)."""
