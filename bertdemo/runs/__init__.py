"""Runs: the slots (imports no trainer: the session store holds them), a run's life, the kinds of run (these import training/)."""
