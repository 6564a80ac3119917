"""Which model each browser session sees: the shared base model unless it switched to its own."""
from __future__ import annotations

import threading

from .models import LoadedModel


class ModelStore:
    """The base model (shared, read-only) plus per-session overrides, keyed by session id."""

    def __init__(self, base: LoadedModel | None, load_error: str | None = None):
        self.base = base
        self.load_error = load_error  # why `base` is None, shown in the page
        self._active: dict[str, LoadedModel] = {}
        self._lock = threading.Lock()

    def for_session(self, session_id: str | None) -> LoadedModel:
        """The model this session uses now. Raises ValueError if no model could be loaded."""
        with self._lock:
            lm = self._active.get(session_id) if session_id else None
        if lm is not None:
            return lm
        if self.base is None:
            raise ValueError(self.load_error or "No model is loaded: start the app with --model.")
        return self.base

    def drop(self, session_id: str | None) -> None:
        """Forget everything of a session (called when its browser tab closes)."""
        with self._lock:
            self._active.pop(session_id, None)
