"""The attention heads behind an edge (bertdemo/circuits/heads.py): on the tiny BERT (2 layers, 2
heads) with random transcoders, the split is exact: for an adjacent pair the heads' parts add up
to the graph's own edge and nothing crosses elsewhere; for a longer path the heads of the
target's layer plus what crossed earlier add up to it; a head's part is what the edge loses when
that head alone is cut from the frozen attention."""
import pytest

import bertdemo
import tiny_models
from bertdemo.circuits import attribution, heads
from bertdemo.circuits.replacement import Replacement

TEXT = "Paris is the [MASK] of France."


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    lm = bertdemo.load(str(tiny_models.save_tiny_bert(tmp_path_factory.mktemp("bert"))), device="cpu")
    coders = tiny_models.tiny_transcoders(lm)
    # every node and edge kept: the split is of any edge, whatever pruning would draw
    return lm, coders, attribution.attribution_graph(lm, TEXT, transcoders=coders, node_threshold=1.0,
                                                     edge_threshold=1.0)


def across(graph, source_layer, target_kind, target_layer=None):
    nodes = {n["id"]: n for n in graph.nodes}
    return next(e for e in graph.edges if nodes[e.source]["layer"] == source_layer
                and nodes[e.source]["position"] != nodes[e.target]["position"]
                and nodes[e.target]["kind"] == target_kind
                and (target_layer is None or nodes[e.target]["layer"] == target_layer))


def test_an_adjacent_edge_is_all_carried_by_the_heads_between(built):
    lm, coders, graph = built
    edge = across(graph, 1, "feature", 2)  # a layer-1 node into a layer-2 feature at another position
    split = heads.edge_heads(lm, graph, edge.source, edge.target, transcoders=coders)
    assert split["adjacent"] and split["across"] and split["layer"] == 2
    assert split["weight"] == pytest.approx(edge.weight, rel=1e-4)
    assert split["elsewhere"] == pytest.approx(0.0, abs=1e-6)
    assert sum(h["weight"] for h in split["heads"]) == pytest.approx(edge.weight, rel=1e-4)
    assert sum(h["share"] for h in split["heads"]) == pytest.approx(1.0, rel=1e-4)
    assert sorted(h["head"] for h in split["heads"]) == [0, 1]


def test_a_longer_path_splits_the_targets_layer_and_keeps_the_rest(built):
    lm, coders, graph = built
    edge = across(graph, 0, "logit")  # a token into a logit: two attention layers between
    split = heads.edge_heads(lm, graph, edge.source, edge.target, transcoders=coders)
    assert not split["adjacent"] and split["layer"] == 2
    assert split["elsewhere"] + sum(h["weight"] for h in split["heads"]) == pytest.approx(edge.weight, rel=1e-4)


def test_a_heads_part_is_what_the_edge_loses_without_that_head(built):
    lm, coders, graph = built
    edge = across(graph, 1, "feature", 2)
    split = heads.edge_heads(lm, graph, edge.source, edge.target, transcoders=coders)
    replacement = Replacement(lm, coders, norms=graph.adjacency.extra["norms"])
    sentence = heads._traced(lm, replacement, graph)
    source, target = graph.node(edge.source), graph.node(edge.target)
    for part in split["heads"]:
        sentence.frozen.attention[2] = sentence.frozen.attention[2].clone()
        kept = sentence.frozen.attention[2][part["head"]].clone()
        sentence.frozen.attention[2][part["head"]] = 0
        without = heads._direct_effect(replacement, sentence, source, target)
        sentence.frozen.attention[2][part["head"]] = kept
        assert edge.weight - without == pytest.approx(part["weight"], rel=1e-4, abs=1e-7)


def test_the_strongest_edge_across_positions_and_what_is_refused(built):
    lm, coders, graph = built
    target = next(n["id"] for n in graph.nodes if n["kind"] == "logit")
    source = heads.strongest_across(graph, target)
    positions = {n["id"]: n["position"] for n in graph.nodes}
    into = [e for e in graph.edges if e.target == target and positions[e.source] != positions[target]]
    assert source == max(into, key=lambda e: abs(e.weight)).source
    token = next(n["id"] for n in graph.nodes if n["kind"] == "token")
    assert heads.strongest_across(graph, token) is None
    with pytest.raises(ValueError, match="an edge starts at a feature, an error or a token"):
        heads.edge_heads(lm, graph, target, token, transcoders=coders)
    with pytest.raises(ValueError, match="an edge ends at a feature or a logit"):
        heads.edge_heads(lm, graph, token, token, transcoders=coders)
    feature_2 = next(n["id"] for n in graph.nodes if n["kind"] == "feature" and n["layer"] == 2)
    feature_1 = next(n["id"] for n in graph.nodes if n["kind"] == "feature" and n["layer"] == 1)
    with pytest.raises(ValueError, match="an edge goes up at least one layer"):
        heads.edge_heads(lm, graph, feature_2, feature_1, transcoders=coders)
    with pytest.raises(ValueError, match="No node"):
        heads.edge_heads(lm, graph, "9_9_9", target, transcoders=coders)
