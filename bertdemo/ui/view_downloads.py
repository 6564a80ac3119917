"""Beside each attention view: a button that writes its numbers (CSV, JSON with the tokens) and its
image (PNG, SVG) with `bertdemo.views.view_files`, and the files it lists for download. The files go into
the session's own folder, which the session store deletes with the session."""
from __future__ import annotations

from pathlib import Path

import gradio as gr

from .context import Visitor


def controls(what: str) -> tuple[gr.Button, gr.File]:
    """The export button and the list of files it fills, for the view named `what`."""
    with gr.Row():
        button = gr.Button(f"Export {what}: numbers and image", size="sm", scale=1)
        files = gr.File(label=f"{what[0].upper()}{what[1:]}: CSV, JSON, PNG, SVG", file_count="multiple",
                        height=120, scale=3, visible=False)  # shown once it has files
    return button, files


def folder(visitor: Visitor) -> Path:
    """Where this session's exports are written (inside its temp folder)."""
    return visitor.store.session_dir(visitor.session) / "exports"


def listed(paths) -> dict:
    """The file list's update: these files, shown."""
    return gr.update(value=[str(p) for p in paths], visible=True)
