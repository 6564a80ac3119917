"""The Fine-tune tab's "Export as a training script": the session's last finished run as a zip of
train_mlm.py, run.json and train.txt (bertdemo/training/export.py), for transformers' Trainer on any number
of GPUs or machines. Kept apart from the tab so the tab gains one line, `render(ctx)` in its
layout; the run itself is remembered by the fine-tune's keep policy (`runs.kinds.keep_tuned`)."""
from __future__ import annotations

import gradio as gr

from ...training import export
from ..parts.context import AppContext, Visitor, handler


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
