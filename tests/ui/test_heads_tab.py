"""The attention tab's heads panel and exports, called as Gradio would call them but with no server:
the neuron view redrawn from a kept query, the importance grid's clicks switching heads off and on,
and every view's export (numbers with the tokens, an image) in the session's own folder."""
import csv
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import gradio as gr
import numpy as np
import pytest

import bertdemo
import bertdemo.views.compare
from bertdemo.views.attention_views import view
from bertdemo.config import Settings
from bertdemo.sessions import SessionStore
from bertdemo.ui.parts import heads_panel
from bertdemo.ui.parts.context import Visitor
from bertdemo.ui.tabs import attention_tab

SENTENCE = "Paris is the [MASK] of France."
MARKUP = 'Paris <b>is</b> the [MASK] of "$France$".'


@pytest.fixture
def visitor(real_vocab_bert):
    store = SessionStore(real_vocab_bert)
    yield Visitor(store, Settings(device="cpu"), "s1", bertdemo.Engine())
    store.drop("s1")


def click(row, col):
    return gr.SelectData(None, {"index": [row, col], "value": ""})


def test_neuron_view_keeps_only_its_query_and_redraws_for_other_choices(visitor, real_vocab_bert):
    """The page counts layers from 1 (0 is the embeddings, as on every tab) and heads from 1; the Python
    API both from 0."""
    figure, tokens, numbers = heads_panel.on_neuron(visitor, SENTENCE, "", 2, 1, 4)  # the second layer's first head
    assert numbers == {**bertdemo.neuron_view(real_vocab_bert, SENTENCE, layer=1, head=0, token=4), "layer": 2,
                       "head": 1}
    assert [label for _, label in tokens] == [None] * 4 + ["query"] + [None] * (len(tokens) - 5)
    assert visitor.store.result_bytes() < 2_000
    _, _, again = heads_panel.on_neuron_options(visitor, 1, 2, 2)  # the first layer's second head
    assert again == {**bertdemo.neuron_view(real_vocab_bert, SENTENCE, layer=0, head=1, token=2), "layer": 1,
                     "head": 2}
    assert heads_panel.on_token_click(gr.SelectData(None, {"index": 6, "value": "x"})) == 6
    assert figure.layout.title.text.startswith("Layer 2, head 1: the query of token 4, “[MASK]”,")
    with pytest.raises(ValueError, match="from 1 to 2"):
        heads_panel.on_neuron(visitor, SENTENCE, "", 0, 1, 4)
    with pytest.raises(ValueError, match=r"head must be a whole number from 1 to 2 \(1 = the first head\)"):
        heads_panel.on_neuron(visitor, SENTENCE, "", 1, 0, 4)


def test_the_neuron_view_starts_on_the_first_mask(visitor):
    assert heads_panel.on_sentence(visitor, SENTENCE, "") == 4  # a new sentence: its [MASK]
    assert heads_panel.on_sentence(visitor, "The cat sat.", "") == 1  # none: the first token after [CLS]
    _, tokens, numbers = heads_panel.on_neuron(visitor, SENTENCE, "", 1, 1, None)  # a script sends none
    assert numbers["token"] == 4 and tokens[4] == ("[MASK] ", "query")


def test_grid_clicks_switch_heads_off_and_on_and_the_predictions_follow(visitor, real_vocab_bert):
    note, grid, result = heads_panel.on_importance(visitor, SENTENCE, 1, "", "")
    np.testing.assert_allclose(result["delta"], bertdemo.head_importance(real_vocab_bert, SENTENCE)["delta"], atol=1e-6)
    assert "log p =" in note and list(grid.data.columns) == ["layer", "head 1", "head 2"]  # heads from 1
    assert list(grid.data["layer"]) == ["layer 1", "layer 2"]  # as every tab counts: 0 is the embeddings
    heads, grid, _, off_note, compared = heads_panel.on_grid_click(visitor, "", click(1, 2))  # layer 2, head 2
    assert heads == "2:2" and grid.data.iloc[1, 2].startswith("✕") and "1 of 4 heads" in off_note
    expected = bertdemo.views.compare.compare_predictions(real_vocab_bert, bertdemo.heads_off(real_vocab_bert, [(1, 1)]),
                                                    SENTENCE)
    assert [r["b"] for r in compared["masks"][0]["changes"]] == \
        pytest.approx([r["b"] for r in expected["masks"][0]["changes"]], abs=1e-6)
    heads, grid, *_ = heads_panel.on_grid_click(visitor, heads, click(0, 0))  # the layer cell: all of layer 1
    assert heads == "1:1, 1:2, 2:2"
    heads, *_ = heads_panel.on_grid_click(visitor, heads, click(0, 0))
    heads, grid, _, off_note, predictions = heads_panel.on_grid_click(visitor, heads, click(1, 2))
    assert heads == "" and "Every head is on" in off_note
    assert predictions == bertdemo.fill_mask(real_vocab_bert, SENTENCE, 5)
    assert not any(str(cell).startswith("✕") for cell in grid.data.to_numpy().ravel())


def test_heads_off_endpoint_handler_and_its_refusals(visitor):
    _, note, result = heads_panel.on_heads_off(visitor, SENTENCE, "*:*")
    assert "4 of 4 heads switched off" in note and result["models"] == ["every head on", "4 heads off"]
    for text, message in [("", "No heads to switch off: list .* layers 1 to 2"),
                          ("1:9", "head must be a whole number from 1 to 2"),
                          ("1:0", r"head must be a whole number from 1 to 2 \(counted from 1\)"),
                          ("0:1", "layer must be a whole number from 1 to 2"), ("left", "Could not read 'left'")]:
        with pytest.raises(ValueError, match=message):
            heads_panel.on_heads_off(visitor, SENTENCE, text)
    with pytest.raises(ValueError, match="mask number must be a whole number from 1 to 1"):
        heads_panel.on_importance(visitor, SENTENCE, 2, "", "")


def test_importance_checks_the_sentence_and_its_mask_number_once(visitor, monkeypatch):
    """One tokenization and one check of the mask number per click (in the service, counted from 1)."""
    from bertdemo import validate
    numbers, real = [], validate.whole_number
    monkeypatch.setattr(validate, "whole_number",
                        lambda value, name, *a, **k: (numbers.append(name), real(value, name, *a, **k))[1])
    cuts, cut = [], visitor.lm.tokenizer.__class__.__call__
    monkeypatch.setattr(visitor.lm.tokenizer.__class__, "__call__",
                        lambda self, text, *a, **k: (cuts.append(text), cut(self, text, *a, **k))[1])
    heads_panel.on_importance(visitor, SENTENCE, 1, "", "")
    assert numbers.count("mask number") == 1 and "mask" not in numbers
    assert cuts.count(visitor.lm.to_model_text(SENTENCE)) == 1


def _read(update):
    files = {Path(p).suffix: Path(p) for p in update["value"]}
    assert update["visible"]
    assert set(files) == {".csv", ".json", ".png", ".svg"}
    assert files[".png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = ET.parse(files[".svg"]).getroot()  # well-formed XML
    assert not any(el.tag.endswith("script") for el in svg.iter())
    rows = list(csv.reader(files[".csv"].open(encoding="utf-8")))
    return rows, json.loads(files[".json"].read_text(encoding="utf-8")), files


@pytest.mark.slow
def test_every_view_exports_its_numbers_with_the_tokens_and_an_image(visitor, real_vocab_bert):
    attention_tab.on_run(visitor, MARKUP, "", "head", [], [], "head", 2, 1, False, False, 0.0, 1)
    att = bertdemo.attention(real_vocab_bert, MARKUP)
    rows, numbers, files = _read(attention_tab.on_export_heatmap(visitor, "mean_heads", 2, 1, True, False, 0.1))
    shown = view(att, "mean_heads", 1, 0, whole_words=True)
    assert rows[0][1:] == shown.labels and numbers["tokens"] == att.tokens
    np.testing.assert_allclose(np.array([r[1:] for r in rows[1:]], dtype=float), shown.matrix, atol=1e-6)
    assert Path(files[".csv"]).is_relative_to(visitor.store.session_dir("s1"))
    assert b"<b>" not in files[".svg"].read_bytes()  # text drawn as paths: no token is markup

    rows, numbers, _ = _read(attention_tab.on_export_mask(visitor, 1, True))
    assert rows[0] == ["layer", "head", *att.tokens] and len(rows) == 1 + 2 * 2
    assert [row[0] for row in rows[1:]] == ["1", "1", "2", "2"]  # layers as the page counts them
    assert [row[1] for row in rows[1:]] == ["1", "2", "1", "2"]  # and heads
    np.testing.assert_allclose(numbers["weights"], att.weights[:, :, att.mask_positions[0]], atol=1e-6)

    heads_panel.on_neuron(visitor, MARKUP, "", 2, 2, 3)
    rows, numbers, _ = _read(heads_panel.on_export_neuron(visitor, 2, 2, 3))
    expected = {**bertdemo.neuron_view(real_vocab_bert, MARKUP, layer=1, head=1, token=3), "layer": 2, "head": 2}
    assert numbers == json.loads(json.dumps(expected)) and len(rows) == 1 + len(att.tokens) * expected["head_dim"]

    heads_panel.on_importance(visitor, MARKUP, 1, "", "1:2")  # the first layer's second head
    rows, numbers, _ = _read(heads_panel.on_export_importance(visitor))
    assert rows[0] == ["layer", "head 1", "head 2"] and numbers["heads_off"] == [[0, 1]]  # the numbers: from 0
    assert [row[0] for row in rows[1:]] == ["1", "2"]

    rows, numbers, _ = _read(heads_panel.on_export_heads_off(visitor, MARKUP, "1:1"))
    assert rows[0] == ["mask", "token", "every head on", "1 heads off", "change"]
    visitor.store.drop("s1")
    assert not Path(files[".csv"]).exists()  # deleted with the session


def test_exports_before_anything_is_shown_say_what_to_press(visitor):
    with pytest.raises(ValueError, match="Press Show attention first"):
        attention_tab.on_export_heatmap(visitor, "head", 1, 1, False, False, 0.0)
    with pytest.raises(ValueError, match="Press Show the neuron view first"):
        heads_panel.on_export_neuron(visitor, 1, 1, 0)
    with pytest.raises(ValueError, match="Press Compute head importance first"):
        heads_panel.on_export_importance(visitor)
