"""Examples whose results are cached lazily, per model: a click on an example answers at once.

Gradio's lazy cache (`gr.Examples(cache_examples=True, cache_mode="lazy")`) runs an example the
first time anyone clicks it and shows everyone that result afterwards, from files in
.gradio/cached_examples/<the examples' component id>. Two things make that wrong here as it is:
visitors use different models (a pick, their fine-tuned model), and the files outlive the process
(an app restarted with other weights would show the old model's answers; a new component shifts
the ids). So `ModelExamples` keeps one cache per model, in a folder named after a digest of its
weights (`bertdemo.model.digest.model_digest`) and of the examples: the served and picked models'
caches on disk, entries of the server's disk cache (`disk.DiskCache`, its "examples" folder: within the
one budget, least recently used out first), reused after a restart; a visitor's fine-tuned model's
in a folder of this process that is removed at exit (it exists for one session only).
"""
from __future__ import annotations

import atexit
import contextlib
import hashlib
import io
import json
import shutil
import threading
from pathlib import Path

from gradio.helpers import Examples

from ... import disk
from ...model.digest import model_digest
from .common import session_id
from .context import AppContext


class ModelExamples(Examples):
    """`gr.Examples` with a lazy cache per model (see the module doc); `fn` is a handler
    (`context.handler`), run with the clicking visitor's request on a miss."""

    def __init__(self, ctx: AppContext, examples: list[list], inputs, outputs, fn, name: str, **kwargs):
        with contextlib.redirect_stdout(io.StringIO()):  # Gradio names its own folder, not the one used
            super().__init__(examples, inputs, outputs, fn=fn, cache_examples=True, cache_mode="lazy",
                             _initiated_directly=False, **kwargs)
        self.ctx = ctx
        what = json.dumps([name, examples, [type(o).__name__ for o in self.outputs]], default=str)
        self.name = f"{name}-{hashlib.blake2b(what.encode(), digest_size=6).hexdigest()}"
        self._switch = threading.Lock()  # the folder is the object's: one load at a time
        self._temp: Path | None = None
        self.create()  # what gr.Examples(...) does after making the object

    def folder_for(self, request) -> Path:
        """Where the visitor of `request`'s model keeps its cached results."""
        session = session_id(request)
        lm = self.ctx.store.for_session(session)
        digest = model_digest(lm)
        if self.ctx.store.using_tuned(session):
            if self._temp is None:
                self._temp = disk.process_temp("examples")
                atexit.register(shutil.rmtree, self._temp, ignore_errors=True)
            return self._temp / self.name / digest
        folder = self.ctx.engine.disk.folder("examples") / self.name / digest
        self.ctx.engine.disk.touch(folder)
        return folder

    def load_from_cache(self, example_id: int, request=None) -> list:
        with self._switch:
            folder = self.folder_for(request)
            self.cached_folder = folder
            self.cached_file = folder / "log.csv"
            self.cached_indices_file = folder / "indices.csv"
            return super().load_from_cache(example_id, request)
