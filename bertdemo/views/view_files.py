"""The attention views as files a person keeps: their numbers (CSV, and JSON with the tokens) and
their image (PNG and SVG), drawn with matplotlib (already installed with captum), offline.

Each function writes one view into `folder` as `<name>.csv`, `.json`, `.png` and `.svg` and
returns the paths. Images are drawn on a `matplotlib.figure.Figure` of their own (no pyplot
state: safe from several threads), with TeX-like `$...$` in tokens shown as it is typed. In the
SVG the text is drawn as paths, so no token can become markup.
"""
from __future__ import annotations

import csv
import json
import textwrap
import warnings
from pathlib import Path

import numpy as np

from .attention_views import Attention, View, mask_rows

BLUE_SCALE, DIVERGING = "Blues", "RdBu"  # as the page's heatmaps


def heatmap(view: View, folder: Path, tokens: list[str], threshold: float = 0.0) -> list[Path]:
    """One heatmap (`attention_views.view`): rows attend to columns; cells under `threshold`
    are blank in the image only (the numbers are all there)."""
    labels, matrix = view.labels, np.asarray(view.matrix, dtype=np.float64)
    rows = [[label, *_rounded(row)] for label, row in zip(labels, matrix)]
    data = {"title": view.title, "labels": labels, "matrix": [_rounded(r) for r in matrix],
            "boundary": view.boundary, "tokens": tokens}
    shown = np.where(matrix >= threshold, matrix, np.nan)

    def draw(fig):
        ax = fig.subplots()
        _cells(fig, ax, shown, labels, labels, BLUE_SCALE, 0.0, max(float(matrix.max()), 1e-6), "weight")
        ax.set_xlabel("attends to (key)")
        ax.set_ylabel("token (query)")
        if view.boundary is not None:
            for line in (ax.axvline, ax.axhline):
                line(view.boundary - 0.5, color="crimson", linestyle="--", linewidth=1.5)
    return _write(folder, "attention-heatmap", ["query \\ key", *labels], rows, data, view.title,
                  _square(len(labels)), draw)


def mask_grid(att: Attention, mask_index: int, folder: Path, hide_special: bool = False,
              first_layer: int = 0, first_head: int = 0) -> list[Path]:
    """What one [MASK] looked at: its attention to every token in every layer and head (the
    numbers), and the token it attends to most per layer and head (the image); layers named from
    `first_layer` (the page's 1: 0 is the embeddings), heads from `first_head` (the page's 1)."""
    weights = mask_rows(att, mask_index).astype(np.float64)  # (L, H, T)
    ranked = weights.copy()
    if hide_special:
        ranked[:, :, np.array(att.special, dtype=bool)] = -1.0
    top = ranked.argmax(-1)  # (L, H)
    n_layers, n_heads = top.shape
    header = ["layer", "head", *att.tokens]
    rows = [[layer + first_layer, h + first_head, *_rounded(weights[layer, h])]
            for layer in range(n_layers) for h in range(n_heads)]
    most = [[att.tokens[j] for j in row] for row in top]
    data = {"tokens": att.tokens, "mask": mask_index + 1, "position": att.mask_positions[mask_index],
            "weights": [[_rounded(w) for w in layer] for layer in weights], "most_attended": most,
            "hide_special": hide_special}
    title = f"What [MASK] {mask_index + 1} looked at (token with the most weight)"

    def draw(fig):
        ax = fig.subplots()
        values = np.take_along_axis(weights, top[..., None], -1)[..., 0]
        _cells(fig, ax, values, [str(x + first_layer) for x in range(n_layers)],
               [str(x + first_head) for x in range(n_heads)], "Oranges", 0.0, 1.0, "weight", text=most)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
    return _write(folder, "mask-attention", header, rows, data, title, _grid(n_layers, n_heads), draw)


def neuron(result: dict, folder: Path) -> list[Path]:
    """The neuron view (`heads.neuron_view`): one row per key token and dimension in the CSV
    (query, key, product, and the token's score and weight), everything in the JSON."""
    tokens, query = result["tokens"], result["query"]
    header = ["index", "token", "dimension", "query", "key", "product", "score", "weight"]
    rows = [[i, token, d, _num(query[d]), _num(result["keys"][i][d]), _num(result["products"][i][d]),
             _num(result["scores"][i]), _num(result["weights"][i])]
            for i, token in enumerate(tokens) for d in range(result["head_dim"])]
    title = (f"Layer {result['layer']}, head {result['head']}: the query of token {result['token']}, "
             f"“{tokens[result['token']]}”, against every key")  # as the page's title
    labels, dims = [f"{i} {t}" for i, t in enumerate(tokens)], [str(d) for d in range(result["head_dim"])]

    def draw(fig):
        grid = fig.add_gridspec(2, 4, height_ratios=[1, max(len(tokens), 1)], width_ratios=[3, 3, 1.2, 1.2])
        keys, products = np.array(result["keys"]), np.array(result["products"])
        span = max(float(np.abs(keys).max()), float(np.abs(query).max()), 1e-6)
        _cells(fig, fig.add_subplot(grid[0, 0]), np.array([query]), [labels[result["token"]]], dims,
               DIVERGING + "_r", -span, span, None, ticks=False)
        for col, values, name in ((0, keys, "keys"), (1, products, "query × key")):
            ax = fig.add_subplot(grid[1, col])
            limit = max(float(np.abs(values).max()), 1e-6)
            _cells(fig, ax, values, labels if col == 0 else [""] * len(labels), dims, DIVERGING + "_r",
                   -limit, limit, None, ticks=False)
            ax.set_xlabel(f"{name} (per dimension)")
        for col, values, name, colour in ((2, result["scores"], "score", "#64748b"),
                                          (3, result["weights"], "weight", "#f59e0b")):
            ax = fig.add_subplot(grid[1, col])
            ax.barh(range(len(values)), values, color=colour)
            ax.set_ylim(len(values) - 0.5, -0.5)
            ax.set_yticks([])
            ax.set_xlabel(name)
    height = min(3 + 0.28 * len(tokens), 40)
    return _write(folder, "neuron-view", header, rows, result, title, (14, height), draw)


def importance(result: dict, folder: Path, first_layer: int = 0, first_head: int = 0) -> list[Path]:
    """Head importance (`heads.head_importance`): the layers x heads change in log p(target);
    layers named from `first_layer` (the page's 1: 0 is the embeddings), heads from `first_head`
    (the page's 1)."""
    delta = np.array(result["delta"], dtype=np.float64)
    n_layers, n_heads = delta.shape
    header = ["layer", *[f"head {h + first_head}" for h in range(n_heads)]]
    rows = [[layer + first_layer, *_rounded(row)] for layer, row in enumerate(delta)]
    off = {tuple(pair) for pair in result.get("heads_off", [])}
    title = (f"Change in log p({result['target']['token']!r}) at [MASK] {result['mask'] + 1} with each "
             f"head off (log p = {result['log_prob']:.3f} with all on)")
    text = [[("✕ " if (layer, h) in off else "") + f"{delta[layer, h]:+.2f}" for h in range(n_heads)]
            for layer in range(n_layers)]
    span = max(float(np.abs(delta).max()), 1e-6)

    def draw(fig):
        ax = fig.subplots()
        _cells(fig, ax, delta, [str(x + first_layer) for x in range(n_layers)],
               [str(x + first_head) for x in range(n_heads)], DIVERGING, -span, span, "Δ log p", text=text)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
    return _write(folder, "head-importance", header, rows, result, title, _grid(n_layers, n_heads), draw)


def comparison(result: dict, folder: Path) -> list[Path]:
    """Predictions of two models (`compare.compare_predictions`), e.g. every head on and a view
    with heads off: per mask, each token's probability under both and the change."""
    names = result["models"]
    header = ["mask", "token", names[0], names[1], "change"]
    rows = [[mask["mask"], r["token"], _num(r["a"]), _num(r["b"]), _num(r["change"])]
            for mask in result["masks"] for r in mask["changes"]]
    title = f"{names[0]} vs {names[1]}"

    def draw(fig):
        axes = np.atleast_1d(fig.subplots(max(len(result["masks"]), 1), 1, squeeze=False)[:, 0])
        for ax, mask in zip(axes, result["masks"]):
            at = np.arange(len(mask["changes"]))
            for shift, key, name, colour in ((-0.2, "a", names[0], "#6366f1"), (0.2, "b", names[1], "#f59e0b")):
                ax.bar(at + shift, [r[key] or 0.0 for r in mask["changes"]], 0.4, label=name, color=colour)
            ax.set_xticks(at, [r["token"] for r in mask["changes"]], rotation=45, ha="right")
            ax.set_ylabel("probability")
            ax.set_title(f"[MASK] {mask['mask']}")
        axes[0].legend()
    widest = max((len(m["changes"]) for m in result["masks"]), default=5)
    size = (max(6, 0.6 * widest), 3.5 * len(result["masks"]) + 1)
    return _write(folder, "heads-off-predictions", header, rows, result, title, size, draw)


# ---------------------------------------------------------------- writing

def _write(folder: Path, name: str, header: list, rows: list[list], data: dict, title: str,
           size: tuple[float, float], draw) -> list[Path]:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    table, numbers = folder / f"{name}.csv", folder / f"{name}.json"
    with table.open("w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([header, *rows])
    numbers.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return [table, numbers, *_images(folder / name, title, size, draw)]


def _images(stem: Path, title: str, size: tuple[float, float], draw) -> list[Path]:
    """`draw(figure)` saved as stem.png and stem.svg."""
    import matplotlib
    from matplotlib.figure import Figure

    with matplotlib.rc_context({"text.parse_math": False, "font.size": 9}), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a glyph the font lacks (emoji) is drawn as a box: fine here
        fig = Figure(figsize=size, layout="constrained")
        draw(fig)
        fig.suptitle(textwrap.fill(title, max(30, int(size[0] * 11))))  # ~11 characters an inch
        paths = [stem.with_suffix(".png"), stem.with_suffix(".svg")]
        fig.savefig(paths[0], dpi=110)
        fig.savefig(paths[1])
    return paths


def _cells(fig, ax, values: np.ndarray, rows: list[str], cols: list[str], cmap: str, vmin: float,
           vmax: float, bar_label: str | None, text=None, ticks: bool = True) -> None:
    """A heatmap of `values` (rows x cols) on `ax`, labelled where the labels fit."""
    image = ax.imshow(values, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto", interpolation="nearest")
    for axis, labels, setter in ((0, rows, ax.set_yticks), (1, cols, ax.set_xticks)):
        every = max(1, len(labels) // 60)  # at most ~60 labels an axis
        at = list(range(0, len(labels), every))
        setter(at, [labels[i] for i in at] if ticks or axis == 0 else [], **({"rotation": 90} if axis else {}))
    if text is not None and values.size <= 400:  # a label in each cell while they are readable
        for (i, j), label in np.ndenumerate(np.array(text, dtype=object)):
            ax.text(j, i, label, ha="center", va="center", fontsize=7)
    if bar_label is not None:
        fig.colorbar(image, ax=ax, label=bar_label, shrink=0.8)


def _square(n: int) -> tuple[float, float]:
    side = min(max(5.0, 1.5 + 0.32 * n), 30.0)
    return side + 1.5, side


def _grid(n_layers: int, n_heads: int) -> tuple[float, float]:
    return min(max(5.0, 1.5 + 0.7 * n_heads), 30.0), min(max(3.0, 1.2 + 0.45 * n_layers), 30.0)


def _rounded(values) -> list[float]:
    return [round(float(v), 6) for v in values]


def _num(value):
    return None if value is None else round(float(value), 6)
