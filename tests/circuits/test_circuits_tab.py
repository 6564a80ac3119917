"""The Circuits tab's handlers called as plain functions, with no server: the tiny BERT and random
transcoders built here (`tiny_models.tiny_transcoders`), put where the tab asks for them
(`circuits_tab.transcoders`); each handler's answer compared with the service's."""
import logging
import re
from urllib.parse import parse_qsl

import gradio as gr
import pytest
import torch

import bertdemo
from bertdemo.circuits import attribution, heads
from bertdemo.config import Settings
from bertdemo.disk import DiskCache
from bertdemo.sessions import SessionStore
from bertdemo.ui.parts import links
from bertdemo.ui.parts.context import AppContext, Visitor, handler
from bertdemo.ui.tabs import circuits_results as results, circuits_tab as tab
from tiny_models import tiny_transcoders

SENTENCE = "Paris is the [MASK] of France."


@pytest.fixture(scope="module")
def coders(tiny_bert):
    return tiny_transcoders(tiny_bert)


@pytest.fixture
def visitor(tiny_bert, coders, monkeypatch):
    monkeypatch.setattr(tab, "transcoders", lambda holder, lm: coders)
    return Visitor(SessionStore(tiny_bert), Settings(model=tiny_bert.name, device="cpu"), "s1", bertdemo.Engine())


def drawn_ids(figure) -> dict[str, list[str]]:
    """Each node trace's name -> the ids its points carry (their first customdata)."""
    return {trace.name: [c[0] for c in trace.customdata] for trace in figure.data if trace.customdata is not None}


def test_the_drawing_has_every_kept_node_the_logits_and_the_tokens(visitor, tiny_bert, coders):
    figure, scores, table, raw, line = tab.on_graph(visitor, SENTENCE, 1, "", 0.8, 0.98, "slope")
    graph = bertdemo.attribution_graph(tiny_bert, SENTENCE, transcoders=coders)
    ids = drawn_ids(figure)
    assert sorted(i for found in ids.values() for i in found) == sorted(n["id"] for n in graph.nodes)
    assert ids["logit (a predicted word)"] == [n["id"] for n in graph.nodes if n["kind"] == "logit"]
    assert len(ids["token (embedding)"]) == len(graph.tokens)
    ticks = list(figure.layout.xaxis.ticktext)
    assert "[MASK]" in ticks[graph.mask_position] and "<b" in ticks[graph.mask_position]
    assert list(figure.layout.yaxis.ticktext) == ["embeddings", "layer 1", "layer 2", "logits"]
    assert f"Replacement score {graph.scores['replacement']:.0%}" in scores and "Completeness" in scores
    assert "9 tokens" in scores
    assert list(table.columns) == list(tab.sections.NODE_COLUMNS) and table["kind"].iloc[-1] == "logit" != table["kind"][0]
    assert raw["nodes"] == graph.nodes and raw["scores"] == graph.scores
    assert "Transcoders of layers 1-2 (64 features each)" in line


def test_the_sessions_graph_is_kept_and_pruned_again_for_new_thresholds(visitor, monkeypatch):
    first = tab.graph_of(visitor, SENTENCE, 1, "")
    calls = []
    monkeypatch.setattr(attribution, "attribution_graph", lambda *a, **k: calls.append(a))
    assert tab.graph_of(visitor, SENTENCE, 1, "") is first
    sparser = tab.graph_of(visitor, SENTENCE, 1, "", 0.5, 0.9)
    assert not calls and sparser.adjacency is first.adjacency and len(sparser.nodes) <= len(first.nodes)


def test_the_norms_switch_draws_the_graph_each_way_and_says_what_reaches_the_logit(visitor, tiny_bert, coders):
    slope = tab.graph_of(visitor, SENTENCE, 1, "", norms="slope")
    scale = tab.graph_of(visitor, SENTENCE, 1, "", norms="scale")
    assert scale.adjacency.extra["norms"] == "scale" and slope.adjacency.extra["norms"] == "slope"
    service = bertdemo.attribution_graph(tiny_bert, SENTENCE, transcoders=coders, norms="scale")
    assert torch.equal(scale.adjacency.rows, service.adjacency.rows)
    assert not torch.allclose(scale.adjacency.rows, slope.adjacency.rows)
    for graph in (slope, scale):
        value, edges = float(graph.adjacency.value[0]), float(graph.adjacency.rows[0].sum())
        words = results.scores_words(graph)
        assert f"is {value:.2f}** (less the vocabulary's mean, as its node holds it): {edges:.2f} of it arrives" in words
        assert f"the other {value - edges:.2f} is constant" in words
        assert ("what each LayerNorm keeps" in words) == (graph is slope)
    ctx = AppContext(visitor.store, visitor.settings, visitor.engine)
    with pytest.raises(gr.Error, match="norms is 'sideways'"):
        handler(ctx, tab.on_graph)(SENTENCE, 1, "", 0.8, 0.98, "sideways", request=None)


def test_a_nodes_card_opens_with_the_heads_behind_its_strongest_edge(visitor, tiny_bert, coders):
    graph = tab.graph_of(visitor, SENTENCE, 1, "")
    node = next(n for n in graph.nodes if n["kind"] == "feature" and n["layer"] == 1
                and heads.strongest_across(graph, n["id"]) is not None)
    summary, effects, note, table = tab.on_node(visitor, SENTENCE, 1, "", 0.8, 0.98, "slope", node["id"])
    assert f"Feature {node['feature']} of layer 1" in summary and node["id"] in summary
    assert "no statistics yet" in summary and effects["visible"] is False
    split = heads.edge_heads(tiny_bert, graph, heads.strongest_across(graph, node["id"]), node["id"],
                             transcoders=coders)
    assert split["adjacent"] and split["elsewhere"] == pytest.approx(0.0, abs=1e-6)  # token -> layer 1
    assert sum(h["weight"] for h in split["heads"]) == pytest.approx(split["weight"], rel=1e-4)
    assert list(table["head"]) == [f"1:{h['head'] + 1}" for h in split["heads"]]  # heads from 1, as the page counts
    assert "add up to the edge" in note
    token = next(n for n in graph.nodes if n["kind"] == "token")
    assert tab.on_node(visitor, SENTENCE, 1, "", 0.8, 0.98, "slope", token["id"])[2] == "A token node has no incoming edge."
    logit = next(n for n in graph.nodes if n["kind"] == "logit")
    assert "The logit of" in tab.on_node(visitor, SENTENCE, 1, "", 0.8, 0.98, "slope", logit["id"])[0]


def test_a_card_escapes_labels_and_tokens():
    node = {"id": "1_3_2", "kind": "feature", "layer": 1, "position": 2, "feature": 3, "activation": 1.0,
            "label": "<script>alert(1)</script>", "token": "<b>", "influence": 0.1}
    shown = results.card_html(node, None)
    assert "<script>" not in shown and "&lt;script&gt;" in shown and "&lt;b&gt;" in shown


def test_an_intervention_at_scale_one_changes_nothing_and_at_zero_as_the_service_says(visitor, tiny_bert, coders):
    graph = tab.graph_of(visitor, SENTENCE, 1, "")
    features = [n["id"] for n in graph.nodes if n["kind"] == "feature"][:2]
    note, bars, table, raw = tab.on_intervene(visitor, SENTENCE, 1, "", ", ".join(features), 1, "", "slope")
    assert max(abs(w["change"]) for w in raw["words"]) < 1e-5
    assert list(table["p before"]) == pytest.approx(list(table["p after"]), abs=1e-6)
    note, bars, table, raw = tab.on_intervene(visitor, SENTENCE, 1, "", "group", 0, f"group: {' '.join(features)}", "slope")
    expected = bertdemo.intervene(tiny_bert, SENTENCE, features, 0.0, graph=graph, transcoders=coders)
    assert raw == expected and "switched off" in note and "(groups: group)" in note
    assert [d.name for d in bars.data] == ["before", "after"]
    assert list(table["as the graph predicted"]) == [round(w["predicted_change"], 4)
                                                               for w in expected["words"]]
    assert list(table["as the model's slope predicts"]) == [round(w["first_order_change"], 4)
                                                              for w in expected["words"]]


def test_named_groups_expand_in_the_nodes_and_go_into_the_viewers_json(visitor):
    groups = tab.parse_groups("capital: 1_2_4 2_5_4\nfrance: 1_9_6; x.y: 2_1_1")
    assert groups == {"capital": ["1_2_4", "2_5_4"], "france": ["1_9_6"], "x.y": ["2_1_1"]}
    assert tab.chosen_nodes("capital, 1_9_6 france", groups) == ["1_2_4", "2_5_4", "1_9_6"]
    for bad in ("no colon here", "two words: 1_2_3", "empty:"):
        with pytest.raises(ValueError, match="A named group is a name"):
            tab.parse_groups(bad)
    graph = tab.graph_of(visitor, SENTENCE, 1, "")
    feature = next(n["id"] for n in graph.nodes if n["kind"] == "feature")
    viewer = tab.on_graph_json(visitor, SENTENCE, 1, "", 0.8, 0.98, f"mine: {feature}", "slope")
    assert viewer["qParams"]["supernodes"] == [["mine", feature]]
    assert {n["node_id"] for n in viewer["nodes"]} == {n["id"] for n in graph.nodes}
    with pytest.raises(ValueError, match="No node '9_9_9'"):
        tab.on_graph_json(visitor, SENTENCE, 1, "", 0.8, 0.98, "mine: 9_9_9", "slope")


def test_the_export_writes_the_viewers_json_a_table_and_the_drawing(visitor):
    update = tab.on_export(visitor, SENTENCE, 1, "", 0.8, 0.98, "", "slope")
    assert sorted(p.rsplit(".", 1)[1] for p in update["value"]) == ["csv", "json", "png", "svg"]


def test_the_target_box_reads_a_word_or_two():
    assert tab.target_of("") is None and tab.target_of("  ") is None
    assert tab.target_of("capital") == "capital"
    assert tab.target_of("capital vs city") == tab.target_of("capital, city") == ("capital", "city")
    with pytest.raises(ValueError, match="one word, or two"):
        tab.target_of("a, b, c")


@pytest.mark.parametrize("inputs, message", [
    (("Paris is the capital of France.", 1, "", 0.8, 0.98), "No [MASK] in the text"),
    ((SENTENCE, 2, "", 0.8, 0.98), "the text has 1 [MASK]"),
    (("Paris " * 70 + "[MASK].", 1, "", 0.8, 0.98), "tokens"),
    ((SENTENCE, 1, "", 1.5, 0.98), "node threshold is 1.5"),
    ((SENTENCE, 1, "", 0.8, -0.1), "edge threshold is -0.1"),
    ((SENTENCE, 1, "zzzunknownword", 0.8, 0.98), "vocabulary"),
])
def test_bad_input_to_the_graph_is_one_message_and_one_log_line(visitor, inputs, message, caplog):
    ctx = AppContext(visitor.store, visitor.settings, visitor.engine)
    with caplog.at_level(logging.INFO, logger="bertdemo"), pytest.raises(gr.Error, match=re.escape(message)) as refused:
        handler(ctx, tab.on_graph)(*inputs, "slope", request=None)
    assert "Traceback" not in str(refused.value.message)
    lines = [r for r in caplog.records if r.name == "bertdemo"]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO and "refused its input" in lines[0].getMessage()


def test_the_operators_token_limit_holds(visitor):
    tight = Visitor(visitor.store, Settings(model=visitor.settings.model, device="cpu", circuit_max_tokens=8), "s2",
                    visitor.engine)
    with pytest.raises(ValueError, match="tokens"):
        tab.graph_of(tight, SENTENCE, 1, "")  # 9 tokens
    assert tab.graph_of(visitor, SENTENCE, 1, "").tokens[-1] == "[SEP]"


def test_an_unknown_node_and_a_model_without_transcoders_are_refused_in_words(visitor, monkeypatch, caplog, tmp_path):
    ctx = AppContext(visitor.store, visitor.settings, visitor.engine)
    with pytest.raises(gr.Error, match="No node '9_9_9'"):
        handler(ctx, tab.on_intervene)(SENTENCE, 1, "", "9_9_9", 0, "", "slope", request=None)
    with pytest.raises(gr.Error, match="No node"):
        handler(ctx, tab.on_node)(SENTENCE, 1, "", 0.8, 0.98, "slope", "9_9_9", request=None)
    monkeypatch.undo()  # the real door, to an engine whose disk cache has no transcoders (another test may
    # have trained some for the same tiny model in the session's default disk cache)
    ctx = AppContext(visitor.store, visitor.settings, bertdemo.Engine(disk=DiskCache(tmp_path)))
    with caplog.at_level(logging.INFO, logger="bertdemo"), pytest.raises(gr.Error, match="has no transcoders"):
        handler(ctx, tab.on_graph)(SENTENCE, 1, "", 0.8, 0.98, "slope", request=None)
    assert [r.levelno for r in caplog.records if r.name == "bertdemo"] == [logging.INFO]
    assert "has no transcoders" in tab.availability(ctx, "s1")


def test_a_link_to_the_view_round_trips(tiny_bert_dir, coders, monkeypatch):
    """The tab's link parameters are its endpoints' (the graph's, then the intervention's); a
    link the Copy button writes opens the same values."""
    import app

    monkeypatch.setattr(tab, "transcoders", lambda holder, lm: coders)
    demo = app.build_demo(Settings(model=str(tiny_bert_dir), device="cpu", onnx=False))
    endpoints = {fn.api_name: fn for fn in demo.fns.values() if getattr(fn, "api_name", None)}
    pairs = links._unique([links.Links._inputs(endpoints[api]) for api in ("circuit_graph", *links.ALSO["circuits"])])
    controls = [links.control_of(name, c) for name, c in pairs]
    assert [c.name for c in controls] == ["sentence", "mask_number", "target", "node_threshold", "edge_threshold",
                                          "norms", "nodes", "scale", "supernodes"]
    values = {"sentence": "The man went to the [MASK] to buy a [MASK] of milk.", "mask_number": 2,
              "target": "bottle vs glass", "node_threshold": 0.6, "edge_threshold": 0.98, "norms": "scale",
              "nodes": "1_2_3, 2_4_5",
              "scale": 0, "supernodes": "milk: 1_2_3 2_4_5"}
    query = links.link_query("circuits", values, controls)
    assert "edge_threshold" not in query and "node_threshold=0.6" in query
    link = links.parse_link(dict(parse_qsl(query, keep_blank_values=True)), {"circuits": controls}, ["a"])
    assert link.tab == "circuits" and link.notices == []
    assert link.values == {k: v for k, v in values.items() if k not in ("edge_threshold", "scale")}


def test_transcoders_trained_from_the_tab_are_kept_and_draw_a_graph(tmp_path):
    """No transcoders: the line says so; a run trains every layer's (live curves, one per layer),
    keeps them in the app's store, and the graph draws through the real door. A model of its own
    (another seed): what it trains goes into the default store, which no other test's model sees."""
    from bertdemo.circuits.transcoder_run import TranscodersRequest
    from test_features_tab import CORPUS
    from tiny_models import save_tiny_bert

    lm = bertdemo.load(str(save_tiny_bert(tmp_path / "own", seed=7)), device="cpu")
    settings = Settings(model=lm.name, device="cpu", features_max_tokens=3000)
    visitor = Visitor(SessionStore(lm), settings, "t1", bertdemo.Engine())
    assert "has no transcoders yet" in tab.availability(visitor, "t1")
    request = TranscodersRequest(texts="\n".join(CORPUS), keep_partial=False)
    shown = list(tab.on_train_transcoders(visitor, request, progress=lambda *a, **k: None))
    status, curves, line, _ = shown[-1]
    assert status.startswith("**Done**") and "are **kept**" in status
    assert [t.name for t in curves.data] == ["layer 1", "layer 2"]
    assert "Transcoders of layers 1-2" in line
    figure = tab.on_graph(visitor, SENTENCE, 1, "", 0.8, 0.98, "slope")[0]
    assert "logit (a predicted word)" in {t.name for t in figure.data}
    assert tab.on_stop(visitor).startswith("Nothing is running")
