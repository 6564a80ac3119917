"""The about tab (placeholder until its issue lands)."""
import gradio as gr

from ..config import Settings
from ..sessions import ModelStore


def render(store: ModelStore, settings: Settings) -> None:
    gr.Markdown("Coming soon.")
