"""The graph drawn (bertdemo/circuits/drawing.py): every kept node once, where its layer and
position say, with its id for a click; nodes sharing a place side by side; the strongest edges by
sign; user text escaped; the files (the viewer's JSON, a CSV, PNG and SVG)."""
import csv
import json

import pytest

import bertdemo
import tiny_models
from bertdemo.circuits import attribution, drawing
from bertdemo.circuits.graph import Edge

TEXT = "Paris is the [MASK] of France."


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    lm = bertdemo.load(str(tiny_models.save_tiny_bert(tmp_path_factory.mktemp("bert"))), device="cpu")
    return attribution.attribution_graph(lm, TEXT, transcoders=tiny_models.tiny_transcoders(lm))


def node_points(figure) -> dict[str, tuple[float, float]]:
    return {c[0]: (x, y) for trace in figure.data if trace.customdata is not None
            for c, x, y in zip(trace.customdata, trace.x, trace.y)}


def test_every_kept_node_is_drawn_once_at_its_layer_and_near_its_position(graph):
    points = node_points(drawing.figure(graph))
    assert sorted(points) == sorted(n["id"] for n in graph.nodes)
    for node in graph.nodes:
        x, y = points[node["id"]]
        assert y == node["layer"]
        if node["kind"] != "logit":  # the logits spread along their own row
            assert abs(x - node["position"]) <= drawing.SPREAD / 2 + 1e-9
    places = {}
    for node in graph.nodes:
        places.setdefault((node["layer"], node["position"]), []).append(points[node["id"]][0])
    crowded = max(places.values(), key=len)
    assert len(crowded) > 1 and len(set(crowded)) == len(crowded)  # side by side, not on top of each other


def test_bigger_influence_bigger_node_and_the_kinds_told_apart(graph):
    placed = {p.node["id"]: p for p in drawing.layout(graph).nodes}
    ordered = sorted((n for n in graph.nodes if n["kind"] == "feature"), key=lambda n: n["influence"])
    assert placed[ordered[0]["id"]].size <= placed[ordered[-1]["id"]].size
    figure = drawing.figure(graph)
    symbols = {t.name: t.marker.symbol for t in figure.data if t.customdata is not None}
    assert len(set(symbols.values())) == len(symbols) == 4


def test_the_strongest_edges_are_drawn_by_sign(graph):
    figure = drawing.figure(graph, max_edges=20)
    lines = [t for t in figure.data if t.mode == "lines" and t.x != (None,)]
    segments = sum(len(t.x) // 3 for t in lines)
    assert segments == min(20, len(graph.edges))
    colours = {t.line.color for t in lines}
    signs = {e.weight >= 0 for e in graph.edges[:20]}
    assert colours == {drawing.POSITIVE if s else drawing.NEGATIVE for s in signs}


def test_labels_and_tokens_stay_text(graph):
    node = dict(next(n for n in graph.nodes if n["kind"] == "feature"), label="<img src=x onerror=alert(1)>",
                token="<b>")
    tampered = type(graph)(graph.text, ["<script>"] + graph.tokens[1:], graph.mask_position,
                           [node if n["id"] == node["id"] else n for n in graph.nodes],
                           [Edge(e.source, e.target, e.weight) for e in graph.edges], graph.scores,
                           graph.node_threshold, graph.edge_threshold, graph.adjacency, graph.target)
    shown = drawing.figure(tampered).to_json()
    assert "<img" not in shown and "<script>" not in shown and "&lt;img" in shown


def test_the_files_hold_the_viewers_json_a_table_and_the_drawing(graph, tmp_path):
    paths = drawing.graph_files(graph, tmp_path, supernodes={"g": [graph.nodes[0]["id"]]}, model="tiny")
    assert sorted(p.suffix for p in paths) == [".csv", ".json", ".png", ".svg"]
    viewer = json.loads((tmp_path / "circuit.json").read_text())
    assert viewer["metadata"]["model"] == "tiny" and viewer["qParams"]["supernodes"] == [["g", graph.nodes[0]["id"]]]
    rows = list(csv.DictReader((tmp_path / "circuit.csv").open()))
    assert sum(r["part"] == "node" for r in rows) == len(graph.nodes)
    assert sum(r["part"] == "edge" for r in rows) == len(graph.edges)
    assert (tmp_path / "circuit.png").stat().st_size > 10_000
    assert (tmp_path / "circuit.svg").read_text().startswith("<?xml")
