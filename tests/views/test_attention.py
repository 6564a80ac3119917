"""Attention service: parity with output_attentions, one copy of the weights, views whose rows sum
to 1, and user text that stays text in bertviz's HTML, the iframe and the plots."""
import dataclasses
import html
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForMaskedLM

import bertdemo
from bertdemo.forward import anatomy
from bertdemo import plots
from bertdemo.views.attention_views import (VIEWS, Attention, aggregate, bertviz_html, data_urls, default_selection,
                                eager_twin, mask_rows, rollout, srcdoc_iframe, standalone,
                                view)
from bertdemo.ui.tabs.attention_tab import served_urls

PAIR = ("Paris is the [MASK] of unbelievably France.", "Berlin is nice.")
EVIL = ['<script>alert("x")</script>', "</iframe>", "\"quotes' & <b>bold</b>",
        "<img src=x onerror=alert(1)>", "</SCRIPT >"]


def _reference(lm, *texts):
    """output_attentions of the same folder loaded with eager attention: (L, H, T, T), tokens."""
    model = AutoModelForMaskedLM.from_pretrained(lm.name, attn_implementation="eager").eval()
    inputs = lm.tokenizer(*[lm.to_model_text(t) for t in texts], return_tensors="pt")
    with torch.no_grad():
        attentions = model(**inputs, output_attentions=True).attentions
    return torch.cat(attentions).numpy(), lm.tokenizer.convert_ids_to_tokens(inputs["input_ids"][0])


@pytest.mark.parametrize("arch", ["tiny_bert", "tiny_distilbert", "tiny_roberta"])
@pytest.mark.parametrize("texts", [PAIR[:1], PAIR], ids=["one", "pair"])
def test_weights_equal_output_attentions(arch, texts, request):
    lm = request.getfixturevalue(arch)
    att = bertdemo.attention(lm, *texts)
    expected, tokens = _reference(lm, *texts)
    assert att.tokens == tokens
    assert att.weights.dtype == np.float32 and att.weights.shape == expected.shape
    np.testing.assert_allclose(att.weights, expected, atol=1e-6)


def test_one_copy_of_weights_and_shared_model_stays_sdpa(tiny_bert):
    bertdemo.attention(tiny_bert, PAIR[0])
    twin = eager_twin(tiny_bert)
    assert twin is not tiny_bert.model and eager_twin(tiny_bert) is twin  # made once
    ours = dict(tiny_bert.model.named_parameters()) | dict(tiny_bert.model.named_buffers())
    theirs = dict(twin.named_parameters()) | dict(twin.named_buffers())
    assert ours.keys() == theirs.keys()
    assert all(ours[k].data_ptr() == theirs[k].data_ptr() for k in ours)
    assert tiny_bert.model.config._attn_implementation == "sdpa"  # other users' fast path untouched
    assert twin.config._attn_implementation == anatomy.PROBE_ATTENTION  # the eager formula, scores readable


def test_mask_predictions_equal_fill_mask(tiny_bert):
    text = "The [MASK] tower is a famous [MASK]."
    att = bertdemo.attention(tiny_bert, text, top_k=7)
    expected = bertdemo.fill_mask(tiny_bert, text, top_k=7)
    assert [[p["token_id"] for p in row] for row in att.predictions] == \
        [[p["token_id"] for p in row] for row in expected]
    for ours, theirs in zip(att.predictions, expected):
        assert [p["score"] for p in ours] == pytest.approx([p["score"] for p in theirs], abs=1e-5)
    assert [att.tokens[i] for i in att.mask_positions] == ["[MASK]", "[MASK]"]
    assert mask_rows(att, 1).shape == (2, 2, len(att.tokens))


@pytest.fixture(scope="module")
def pair_attention(tiny_bert):
    return bertdemo.attention(tiny_bert, *PAIR)


@pytest.mark.parametrize("kind", list(VIEWS))
@pytest.mark.parametrize("words", [False, True])
@pytest.mark.parametrize("hide_special", [False, True])
@pytest.mark.parametrize("layer, head", [(0, 1), (1, 0)])
def test_rows_sum_to_one_in_every_view(pair_attention, kind, words, hide_special, layer, head):
    shown = view(pair_attention, kind, layer, head, words, hide_special)
    assert shown.matrix.shape == (len(shown.labels),) * 2
    np.testing.assert_allclose(shown.matrix.sum(1), 1.0, atol=1e-5)
    assert (shown.matrix >= 0).all()
    assert ("[CLS]" in shown.labels) != hide_special


def test_word_level_sums_key_pieces_and_averages_query_pieces(pair_attention):
    att = pair_attention
    shown = view(att, "head", 1, 1, whole_words=True)
    assert shown.labels == ["[CLS]", "Paris", "is", "the", "[MASK]", "of", "unbelievably", "France",
                            ".", "[SEP]", "Berlin", "is", "nice", ".", "[SEP]"]
    pieces = [i for i, t in enumerate(att.tokens) if t in {"un", "##believ", "##a", "##b", "##ly"}]
    assert len(pieces) == 5
    w, paris = att.weights[1, 1], att.tokens.index("paris")
    word = shown.labels.index("unbelievably")
    # what the word gives: mean over its query pieces; what it receives: sum over its key pieces
    assert shown.matrix[word, 1] == pytest.approx(np.mean([w[p, paris] for p in pieces]), abs=1e-6)
    assert shown.matrix[1, word] == pytest.approx(sum(w[paris, p] for p in pieces), abs=1e-6)
    assert shown.matrix[word, word] == pytest.approx(
        np.mean([sum(w[q, k] for k in pieces) for q in pieces]), abs=1e-6)


def test_rollout_is_abnar_zuidema(pair_attention):
    w = pair_attention.weights.astype(np.float64)
    eye = np.eye(w.shape[-1])

    def with_residual(layer):
        a = 0.5 * w[layer].mean(0) + 0.5 * eye
        return a / a.sum(1, keepdims=True)

    np.testing.assert_allclose(rollout(w, 0), with_residual(0), atol=1e-6)
    np.testing.assert_allclose(rollout(w), with_residual(1) @ with_residual(0), atol=1e-6)
    np.testing.assert_allclose(aggregate(w, "rollout", 1), rollout(w), atol=1e-12)


def test_hide_special_renormalises_over_the_words(pair_attention):
    att = pair_attention
    shown = view(att, "mean_heads", 0, hide_special=True)
    keep = [i for i, s in enumerate(att.special) if not s]
    sub = att.weights[0].mean(0)[np.ix_(keep, keep)]
    np.testing.assert_allclose(shown.matrix, sub / sub.sum(1, keepdims=True), atol=1e-6)
    assert shown.labels == [att.tokens[i] for i in keep]


def test_pair_boundary(pair_attention, tiny_bert):
    att = pair_attention
    assert att.tokens[att.sentence_b_start] == "berlin"
    assert att.tokens[att.sentence_b_start - 1] == "[SEP]"
    by_word, no_special = view(att, whole_words=True), view(att, hide_special=True)
    assert by_word.labels[by_word.boundary] == "Berlin"
    assert no_special.labels[no_special.boundary] == "berlin"
    assert bertdemo.attention(tiny_bert, PAIR[0]).sentence_b_start is None
    assert "Sentence A -> Sentence B" in bertviz_html(att)  # bertviz's A/B filter


def test_over_long_and_empty_input_get_fill_masks_message(tiny_bert):
    text = "[MASK] " + "paris " * 100
    with pytest.raises(ValueError) as ours:
        bertdemo.attention(tiny_bert, text)
    with pytest.raises(ValueError) as theirs:
        bertdemo.fill_mask(tiny_bert, text)
    assert str(ours.value) == str(theirs.value)
    with pytest.raises(ValueError, match="pair of sentences is 68 tokens long.*at most 64"):
        bertdemo.attention(tiny_bert, "paris " * 33, "paris " * 32)
    with pytest.raises(ValueError, match="empty"):
        bertdemo.attention(tiny_bert, "   ")


# ---------------------------------------------------------------- bertviz HTML

def _params(document: str) -> dict:
    """The params object bertviz put into its <script>."""
    start = document.index("const params = ") + len("const params = ")
    return json.JSONDecoder().raw_decode(document, start)[0]


def test_bertviz_uses_local_scripts_only(pair_attention):
    served = bertviz_html(pair_attention, "model", script_urls=served_urls())
    assert not re.search(r"['\"]https?://", served)  # (URLs in comments are fine)
    assert served_urls()["require"] in served
    assert served_urls()["d3"].removesuffix(".js") + "'" in served  # require.js adds ".js" itself
    for offline in (standalone(served, served_urls()), bertviz_html(pair_attention, "model")):
        assert "gradio_api" not in offline and not re.search(r"['\"]https?://", offline)
        assert all(url in offline for url in data_urls().values())


def test_the_kept_frame_loads_the_local_scripts_once_and_sits_safely_in_the_page():
    """The page's one bertviz frame: its document loads the served require.js, d3 and jQuery (no
    CDN), and the component's script, which the page's configuration carries inside a <script>,
    holds that document with no markup character that could end it."""
    from bertdemo.ui.parts import bertviz_frame

    urls = served_urls()
    shell = bertviz_frame.shell(urls)
    assert f'<script src="{html.escape(urls["require"], quote=True)}"></script>' in shell
    for name in ("d3", "jquery"):  # require.js adds ".js" itself
        assert json.dumps(urls[name].removesuffix(".js")) in shell and urls[name] not in shell
    assert not re.search(r"['\"]https?://", shell)
    component = bertviz_frame.render(urls, elem_id="bertviz-test")
    assert component.js_on_load.count("<") == 0 and "\\u003cscript" in component.js_on_load
    assert json.loads(re.search(r"frame.srcdoc = (.*);", component.js_on_load).group(1)) == shell
    assert "${" not in component.html_template  # the template never names the value: the frame stays


@pytest.mark.parametrize("kind", ["head", "model"])
def test_bertviz_payload_is_filtered_and_rounded(pair_attention, kind):
    att = pair_attention
    document = bertviz_html(att, kind, layers=[1], heads=[0], decimals=3)
    params = _params(document)
    assert params["include_layers"] == [1]
    shown = params["attention"][0]["attn"]  # filter "All": (layers, heads, T, T)
    assert len(shown) == 1 and len(shown[0]) == (1 if kind == "model" else att.num_heads)
    expected = np.round(att.weights[1, 0].astype(np.float64), 3)
    assert np.array_equal(np.array(shown[0][0]), expected)
    assert params["attention"][0]["left_text"] == att.tokens
    assert document.count('"left_text"') == len(params["attention"])  # the JSON is sent once


def test_default_selection_fits_the_budget():
    def fake(T, L=12, H=12):
        return Attention([f"t{i}" for i in range(T)], np.zeros((L, H, T, T), np.float32), [0] * T,
                         list(range(T)), [(0, 0)] * T, ("", None), [], [])

    assert default_selection(fake(12)) == (list(range(12)), list(range(12)))
    layers, heads = default_selection(fake(128))
    assert len(layers) * len(heads) * 128 * 128 <= 200_000 and layers == [6]
    layers, heads = default_selection(fake(128), "model")
    assert 1 < len(layers) * len(heads) * 128 * 128 <= 200_000


def _evil_attention(n_layers=2, n_heads=2) -> Attention:
    tokens = ["[CLS]", *EVIL, "[SEP]"]
    T = len(tokens)
    w = np.random.default_rng(0).random((n_layers, n_heads, T, T)).astype(np.float32)
    w /= w.sum(-1, keepdims=True)
    seq = [None, *[0] * len(EVIL), None]
    return Attention(tokens, w, seq, [None, *range(len(EVIL)), None], [(0, 0)] * T, ("", None), [], [])


class _Iframes(HTMLParser):
    def __init__(self):
        super().__init__()
        self.srcdocs, self.tags = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "iframe":
            self.srcdocs.append(dict(attrs)["srcdoc"])


@pytest.mark.parametrize("kind", ["head", "model"])
def test_user_text_stays_text_in_bertviz_and_the_iframe(kind):
    att = _evil_attention()
    document = bertviz_html(att, kind)
    assert _params(document)["attention"][0]["left_text"] == att.tokens  # same text, decoded
    harmless = bertviz_html(Attention(["a"] * len(att.tokens), *_fields(att)), kind)
    for needle in ("</script", "<img", "</iframe", "<b>"):  # only bertviz's own tags remain
        assert document.lower().count(needle.lower()) == harmless.lower().count(needle.lower())
    frame = srcdoc_iframe(document, 500)
    parser = _Iframes()
    parser.feed(frame)
    assert parser.tags == ["iframe"] and parser.srcdocs == [document]
    assert "<" not in frame[frame.index("srcdoc=") : frame.rindex("</iframe>")].split('"', 1)[1]


def _fields(att: Attention):
    return att.weights, att.sequence_ids, att.word_ids, att.offsets, att.texts, [], []


def test_user_text_stays_text_in_plots():
    att = _evil_attention()
    shown = view(att, "head")
    heatmap = plots.attention_heatmap(shown.labels, shown.matrix, shown.title).data[0]
    assert [html.unescape(x).rstrip("\u200b") for x in heatmap.x] == att.tokens
    grid = plots.mask_attention_grid(att.weights[:, :, 1, :], att.tokens).data[0]
    shown_text = [*heatmap.x, *heatmap.y, *np.ravel(grid.text),
                  *[part for cell in np.ravel(grid.customdata) for part in cell.split("<br>")]]
    assert not any("<" in t or ">" in t for t in shown_text)  # plotly would read them as markup
    assert any("&lt;img src=x onerror=alert(1)&gt;" in t for t in shown_text)


def test_real_tokenizer_keeps_markup_characters(real_vocab_bert):
    text = '<script>alert("x")</script> </iframe> <img src=x onerror=alert(1)>'
    att = bertdemo.attention(real_vocab_bert, text)
    assert {"<", ">", "/", "script", "alert", "=", '"'} <= set(att.tokens)
    document = bertviz_html(att)
    assert _params(document)["attention"][0]["left_text"] == att.tokens
    assert "<img" not in document and "</iframe" not in document
    words = view(att, whole_words=True).labels
    assert "onerror" in words and "<" in words


def test_endpoint_matches_service_and_refuses_long_text(client, tiny_bert):
    from gradio_client.exceptions import AppError

    text = "Paris is the [MASK] of France."
    viz, download, note, heatmap, raw, grid, preds, mask_note = client.predict(
        text, "", "model", [], [], "mean_heads", 1, 1, True, True, 0.0, 1, api_name="/attention")
    expected = bertdemo.attention(tiny_bert, text)
    assert raw["tokens"] == expected.tokens
    shown = view(expected, "mean_heads", 0, 0, whole_words=True, hide_special=True)  # the page's layer 1: the first
    assert raw["heatmap"]["title"] == "Attention, layer 1, mean over heads (words): row attends to column"
    assert raw["heatmap"]["labels"] == shown.labels
    np.testing.assert_allclose(raw["heatmap"]["matrix"], shown.matrix, atol=1e-4)
    assert viz.startswith("<iframe srcdoc=") and "Layers 1-2, heads 1-2" in note  # as every tab counts
    assert "`[MASK]` 1 of 1" in mask_note
    with open(download, encoding="utf-8") as f:
        assert "data:text/javascript;base64," in f.read()
    as_shown = dataclasses.replace(tiny_bert, name=Path(tiny_bert.name).name)  # the page hides server paths
    with pytest.raises(AppError, match=re.escape(str(_fill_mask_error(as_shown)))):
        client.predict("[MASK] " + "paris " * 100, "", "head", [], [], "head", 1, 1, False, False,
                       0.0, 1, api_name="/attention")


def _fill_mask_error(lm) -> ValueError:
    try:
        bertdemo.fill_mask(lm, "[MASK] " + "paris " * 100)
    except ValueError as err:
        return err
    raise AssertionError("fill_mask accepted an over-long text")


# ---------------------------------------------------------------- the tab's handlers, no server

def _visitor(lm, session="s1"):
    from bertdemo.config import Settings
    from bertdemo.sessions import SessionStore
    from bertdemo.ui.parts.context import Visitor

    return Visitor(SessionStore(lm), Settings(device="cpu"), session, bertdemo.Engine())


def test_handlers_keep_only_the_query_and_recompute_the_same_views(real_vocab_bert):
    """An idle session keeps a few hundred bytes, whatever its length; option changes still work."""
    from bertdemo.ui.tabs import attention_tab

    visitor = _visitor(real_vocab_bert)
    text = "The [MASK] sat on the mat because it was tired and " + "very " * 100 + "sleepy."
    viz, download, note, heatmap, raw, grid, preds, mask_note = attention_tab.on_run(
        visitor, text, "", "head", [], [], "head", 2, 2, False, False, 0.0, 1)  # the page's layer 2, head 2: 1, 1
    att = bertdemo.attention(real_vocab_bert, text)
    assert len(att.tokens) > 100 and att.weights.nbytes > 100_000
    assert visitor.store.result_bytes() < 2_000  # the query, not the (layers, heads, T, T) weights
    assert not any(isinstance(v, np.ndarray) for v in vars(visitor.store.result("s1", "attention")).values())
    assert raw["heatmap"]["matrix"] == [[round(w, 4) for w in row] for row in view(att, "head", 1, 1).matrix.tolist()]
    _, changed = attention_tab.on_heatmap(visitor, "rollout", 2, 1, True, True, 0.0)
    expected = view(att, "rollout", 1, 0, whole_words=True, hide_special=True)
    assert changed["heatmap"]["labels"] == expected.labels
    np.testing.assert_allclose(changed["heatmap"]["matrix"], expected.matrix, atol=1e-4)
    frame, export, viz_note = attention_tab.on_viz(visitor, "model", [1], [2])  # the first layer, the second head
    assert "Layers 1, heads 2 of 2 x 2" in viz_note and frame.startswith("<iframe srcdoc=")
    assert ".text(config.layers[i] + 1)" in frame  # bertviz's own labels count from 1 too
    assert ".text(config.heads[i] + 1)" in frame and "(config.heads[headIndex] + 1)" in frame  # its heads too
    sent = json.loads(re.search(r'"include_heads":\s*(\[[^\]]*\])', html.unescape(frame)).group(1))
    assert sent == [1]  # bertviz's data keeps the index
    assert Path(export).parent.parent == visitor.store.session_dir("s1")  # the session's own files
    assert "[MASK]` 1 of 1" in attention_tab.on_mask(visitor, 1, True)[2]
    with pytest.raises(ValueError, match="mask number must be a whole number from 1 to 1"):
        attention_tab.on_mask(visitor, 2, False)
    visitor.store.drop("s1")
    assert not Path(export).exists() and attention_tab.recall(visitor) is None


def test_option_changes_before_any_run_change_nothing(tiny_bert):
    import gradio as gr

    from bertdemo.ui.tabs import attention_tab

    visitor = _visitor(tiny_bert)
    assert all(isinstance(x, type(gr.skip())) for x in attention_tab.on_viz(visitor, "head", [], []))
    assert all(isinstance(x, type(gr.skip())) for x in attention_tab.on_mask(visitor, 1, False))


def test_a_freed_model_asks_to_run_again(tiny_bert):
    from bertdemo.model.loading import LoadedModel
    from bertdemo.ui.tabs import attention_tab

    visitor = _visitor(tiny_bert)
    tuned = LoadedModel("tuned", tiny_bert.tokenizer, tiny_bert.model, tiny_bert.device)
    visitor.store.put_model("s1", "tuned", tuned)
    visitor.store.use_tuned("s1")
    attention_tab.on_run(visitor, "Paris is the [MASK] of France.", "", "head", [], [], "head", 1, 0,
                         False, False, 0.0, 1)
    visitor.store.use_base("s1")
    del tuned
    visitor.store.put_model("s1", "tuned", tiny_bert)  # its tuned model replaced: the old one is freed
    import gc
    gc.collect()
    with pytest.raises(ValueError, match="Show attention again"):
        attention_tab.on_heatmap(visitor, "head", 1, 0, False, False, 0.0)
