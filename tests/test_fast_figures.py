"""The figures built from dicts (bertdemo/plots.py) equal the same charts built through plotly's
validated API (tests/reference_plots.py): same traces, labels, values, layout and template."""
import json

import numpy as np
import pytest
from plotly.subplots import make_subplots

import reference_plots
from bertdemo import plots
from bertdemo.training.loop import Evaluation, Step


def _json(fig) -> dict:
    """What gr.Plot sends to the page: the figure's JSON, parsed (key order aside)."""
    return json.loads(fig.to_json())


def _predictions(n_masks: int, k: int = 5) -> list[list[dict]]:
    words = ["capital", "city", "capital", "<b>heart</b>", "centre", "home", "seat"]  # a repeat, markup
    return [[{"token": words[(i + m) % len(words)], "score": 0.5 / (i + 1) - 0.01 * m} for i in range(k)]
            for m in range(n_masks)]


@pytest.mark.parametrize("n_masks, k", [(0, 5), (1, 5), (2, 3), (3, 7), (10, 1)])
def test_prediction_bars(n_masks, k):
    preds = _predictions(n_masks, k)
    assert _json(plots.prediction_bars(preds)) == _json(reference_plots.prediction_bars(preds))


@pytest.mark.parametrize("n_masks, k", [(0, 5), (1, 5), (3, 7)])
def test_prediction_bars_json_is_what_the_figure_sends(n_masks, k):
    preds = _predictions(n_masks, k)
    assert json.loads(plots.prediction_bars_json(preds)) == _json(plots.prediction_bars(preds))


@pytest.mark.parametrize("top, axis_end", [(0.11, 0.1265), (0.9, 1.0), (0.001, 0.05)])
def test_a_prediction_charts_axis_fits_its_bars(top, axis_end):
    """A 10% best guess fills most of the chart's width, not a sliver of 0-100%; no axis runs past
    100% or shrinks to nothing; every mask's row shares one axis, so rows compare."""
    preds = [[{"token": "city", "score": top}, {"token": "capital", "score": top / 2}], [{"token": "x", "score": top / 3}]]
    layout = plots.prediction_bars(preds).layout
    assert layout.xaxis.range == layout.xaxis2.range == (0, pytest.approx(axis_end))


def test_token_scores():
    tokens, lps = ["the", "cat", "the", "<i>sat</i>"], [-0.5, -3.25, -0.75, -9.0]
    assert _json(plots.token_scores(tokens, lps, "PLL by token")) == \
        _json(reference_plots.token_scores(tokens, lps, "PLL by token"))


@pytest.mark.parametrize("n, boundary, threshold", [(6, None, 0.0), (6, 3, 0.2), (30, 12, 0.05)])
def test_attention_heatmap(n, boundary, threshold):
    matrix = np.random.default_rng(n).dirichlet(np.ones(n), size=n).astype(np.float32)
    labels = ["[CLS]", *(f"w{i % 4}" for i in range(n - 3)), "<b>x</b>", "[SEP]"]
    new = plots.attention_heatmap(labels, matrix, "Layer 1, head 2", boundary, threshold)
    ref = reference_plots.attention_heatmap(labels, matrix, "Layer 1, head 2", boundary, threshold)
    assert _json(new) == _json(ref)
    assert new.data[0].x == ref.data[0].x  # attribute access still works on the fast figure


@pytest.mark.parametrize("hidden", [None, [True, False, False, False, True]])
def test_mask_attention_grid(hidden):
    rows = np.random.default_rng(1).random((3, 4, 5))
    labels = ["[CLS]", "paris", "<img>", "[MASK]", "[SEP]"]
    assert _json(plots.mask_attention_grid(rows, labels, hidden)) == \
        _json(reference_plots.mask_attention_grid(rows, labels, hidden))


@pytest.mark.parametrize("planned", [None, 0, 300])
def test_finetune_curves(planned):
    steps = [Step(i, 39, 5 - i / 50, 1e-4, elapsed=i / 10) for i in range(1, 40)]
    evals = [Evaluation(i * 10, 4.5 - i / 10, 0.1 * i) for i in range(4)]
    assert _json(plots.finetune_curves(steps, evals, planned)) == \
        _json(reference_plots.finetune_curves(steps, evals, planned))
    assert _json(plots.finetune_curves([], [], planned)) == _json(reference_plots.finetune_curves([], [], planned))
    kept = (20, "kept: step 20")  # the best evaluation's line
    assert _json(plots.finetune_curves(steps, evals, planned, best=kept)) == \
        _json(reference_plots.finetune_curves(steps, evals, planned, best=kept))


def test_cached_layouts_are_not_shared_between_figures():
    first = plots.prediction_bars(_predictions(2))
    plots.prediction_bars(_predictions(2, 1)).layout.height = 999
    assert _json(plots.prediction_bars(_predictions(2))) == _json(first)


@pytest.mark.parametrize("n_rows", [0, 1, 2, 3, 7, 10, 13, 64])
def test_the_layouts_worked_out_are_make_subplots_to_the_letter(n_rows):
    """plots works out make_subplots' layouts itself (make_subplots takes ~30 ms a call): the same
    JSON, key order and last digit included."""
    n = max(n_rows, 1)
    stacked = make_subplots(rows=n, cols=1, subplot_titles=[f"[MASK] {i + 1}" for i in range(n_rows)],
                            vertical_spacing=0.25 / n).layout.to_plotly_json()
    secondary = make_subplots(specs=[[{"secondary_y": True}]]).layout.to_plotly_json()
    for layout in (stacked, secondary):
        layout.pop("template")
    assert json.dumps(plots._subplot_rows(n_rows)) == json.dumps(stacked)
    assert json.dumps(plots._secondary_y_layout()) == json.dumps(secondary)
