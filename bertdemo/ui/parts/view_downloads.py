"""Beside each attention view (and the Features tab's card): a button that writes its numbers (CSV,
JSON with the tokens) and its image (PNG, SVG) with `bertdemo.views.view_files`, and the files it
lists for download. The files go into the session's own folder, which the session store deletes
with the session."""
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


def feature_card_files(card: dict, folder: Path) -> list[Path]:
    """A feature's card (`features.views.feature_card`) as files: everything in the JSON, one row
    per context, promoted or suppressed token and co-firing feature in the CSV, and its histogram,
    output effects and top contexts drawn in the PNG and SVG (as `view_files` draws the attention
    views: matplotlib, its own figure, tokens as text)."""
    from ...views import view_files

    header = ["part", "rank", "text", "token", "value"]
    rows = [["context", i, c["text"], c["token"], round(c["activation"], 6)]
            for i, c in enumerate(card["contexts"], 1)]
    rows += [[part, i, "", r["token"], round(r["logit_change"], 6)]
             for part in ("promoted", "suppressed") for i, r in enumerate(card[part], 1)]
    rows += [["cofiring", i, c["label"], f"feature {c['feature']}", round(c["share"], 6)]
             for i, c in enumerate(card["cofiring"], 1)]
    title = f"Layer {card['layer']}, feature {card['feature']}: {card['label']}"

    def draw(fig):
        grid = fig.add_gridspec(2, 3, height_ratios=[1, 1.1])
        edges, shares = card["histogram"]["edges"], card["histogram"]["shares"]
        ax = fig.add_subplot(grid[0, 0])
        width = (edges[1] - edges[0]) if len(edges) > 1 else 1.0
        ax.bar(edges[:-1], shares, width=width, align="edge", color="#f59e0b")
        ax.set_xlabel("activation")
        ax.set_ylabel("share of its firings")
        ax.set_title(f"fires on {card['density']:.2%} of tokens")
        for col, part, colour in ((1, "promoted", "#16a34a"), (2, "suppressed", "#dc2626")):
            ax = fig.add_subplot(grid[0, col])
            values = [r["logit_change"] for r in card[part]][::-1]
            ax.barh(range(len(values)), values, color=colour)
            ax.set_yticks(range(len(values)), [r["token"] for r in card[part]][::-1])
            ax.set_xlabel("logit change at a [MASK]")
            ax.set_title(part)
        ax = fig.add_subplot(grid[1, :])
        ax.axis("off")
        lines = [f"{c['activation']:.2f}  {_context_line(c)}" for c in card["contexts"]] or ["(no contexts)"]
        ax.text(0, 1, "Top contexts (the firing token in [brackets]):\n" + "\n".join(lines), va="top",
                ha="left", family="monospace", fontsize=8, transform=ax.transAxes)
    return view_files._write(folder, f"feature-{card['layer']}-{card['feature']}", header, rows, card, title,
                             (13, 6.5), draw)


def _context_line(context: dict, width: int = 50) -> str:
    """A context cut around its firing token, the token in brackets."""
    text, start, end = context["text"], context["start"], context["end"]
    left = ("…" if start > width else "") + text[max(0, start - width):start]
    right = text[end:end + width] + ("…" if end + width < len(text) else "")
    return f"{left}[{text[start:end]}]{right}"
