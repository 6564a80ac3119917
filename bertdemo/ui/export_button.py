"""The Fine-tune tab's "Export as a training script": the session's last finished run as a zip of
train_mlm.py, run.json and train.txt (bertdemo/training/export.py), for transformers' Trainer on any number
of GPUs or machines. Kept apart from the tab so the tab gains two lines: `render(ctx)` in its
layout and `remember_run(...)` when a run ends."""
from __future__ import annotations

from pathlib import Path

import gradio as gr

from ..config import Settings
from ..model.loading import LoadedModel, allowed_choices
from ..training import export
from ..training.fine_tuning import MLMHistory
from .context import AppContext, Visitor, handler

FOLDER_NOTE = ("The demo loaded this model from a folder on its server, shown here by its name: put "
               "your copy's path (a save_pretrained folder) or its hub id in `model`.")


def render(ctx: AppContext) -> None:
    """The button and the file it fills, inside the current Blocks context."""
    button = gr.Button("Export as a training script (.zip)")
    script = gr.File(label="train_mlm.py + run.json + train.txt: `python train_mlm.py`, or "
                           "`accelerate launch train_mlm.py` on several GPUs", height=90)
    button.click(handler(ctx, on_export_script), None, script, api_name="export_training_script",
                 concurrency_id="model")


def on_export_script(visitor: Visitor) -> str:
    """The zip of this session's last finished fine-tune as a Trainer script (made once per run)."""
    return str(export.script_zip(visitor.store, visitor.session))


def remember_run(store, session: str | None, settings: Settings, base: LoadedModel,
                 history: MLMHistory, text: str) -> None:
    """Keep a finished run for the export, naming its base model as the page does (a hub id as
    it is; a server folder by its name only, with a note, so no server path leaves the server)."""
    entry = allowed_choices(settings.allowed_models).get(base.name)
    on_hub = entry is not None and not Path(entry).exists()
    run = export.FinishedRun(history, base.name, text, None if on_hub else FOLDER_NOTE)
    export.remember(store, session, run)
