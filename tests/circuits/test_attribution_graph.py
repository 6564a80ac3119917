"""The attribution graph (bertdemo/circuits/): the replacement reproduces the model, every edge is an
exact direct effect, a hand-written reference gives the same edges, pruning and the viewer's file.

Tiny models of four families (BERT, RoBERTa, ELECTRA with its narrower embeddings, and ModernBERT,
a pre-LayerNorm family with rotary attention and a local window), each with random transcoders
built here (a skip path, a decoder bias): exactness does not depend on the transcoders being good.
"""
from __future__ import annotations

import json
import math

import pytest
import torch
from sparsify import SparseCoder, SparseCoderConfig

import bertdemo
import tiny_models
from bertdemo.circuits import attribution, graph as graphs, interventions
from bertdemo.circuits.replacement import Replacement, demeaned
from bertdemo.features.dictionary import Dictionary
from bertdemo.forward import anatomy

FAMILIES = ["bert", "roberta", "electra", "modernbert"]
TEXT = "Paris is the [MASK] of France."


def tiny_transcoders(lm, seed: int = 0, latents: int = 64, k: int = 8) -> dict:
    """{layer: Dictionary} of random transcoders with a skip path and a decoder bias."""
    torch.manual_seed(seed)
    width = lm.model.config.hidden_size
    found = {}
    for layer in range(1, len(anatomy.of(lm.model).layers) + 1):
        coder = SparseCoder(width, SparseCoderConfig(num_latents=latents, k=k, transcode=True, skip_connection=True))
        torch.nn.init.normal_(coder.W_dec, std=0.3)
        torch.nn.init.normal_(coder.W_skip, std=0.05)
        torch.nn.init.normal_(coder.b_dec, std=0.1)
        found[layer] = Dictionary(coder.eval().requires_grad_(False), layer)
    return found


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    folder = tiny_models.save_tiny_family(request.param, tmp_path_factory.mktemp(request.param))
    lm = bertdemo.load(str(folder), device="cpu")
    return request.param, lm, tiny_transcoders(lm)


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    lm = bertdemo.load(str(tiny_models.save_tiny_bert(tmp_path_factory.mktemp("bert"))), device="cpu")
    return lm, tiny_transcoders(lm, seed=1)


def traced(lm, transcoders, text=TEXT):
    replacement = Replacement(lm, transcoders)
    inputs, position = attribution.encode(lm, text)
    ids = inputs["input_ids"][0]
    sentence = replacement.trace(inputs, position, lm.tokenizer.convert_ids_to_tokens(ids.tolist()),
                                 attribution.coded_positions(lm, ids))
    return replacement, inputs, sentence


def test_the_replacement_with_no_edit_gives_the_models_logits(family):
    name, lm, transcoders = family
    replacement, inputs, sentence = traced(lm, transcoders)
    with torch.no_grad():
        own = lm.model(**inputs).logits[0, sentence.mask]
        again = replacement.forward(sentence, sentence.leaves)
    assert torch.allclose(again, own, atol=1e-4, rtol=1e-4), name
    # the transcoders are far from exact here: the error nodes carry the difference
    assert max(float(e.abs().max()) for e in sentence.leaves.errors.values()) > 1e-2


@pytest.mark.parametrize("norms", ["slope", "scale"])
def test_every_targets_edges_and_bias_add_up_to_its_clean_value(family, norms):
    name, lm, transcoders = family
    graph = attribution.attribution_graph(lm, TEXT, transcoders=transcoders, norms=norms)
    adjacency = graph.adjacency
    assert (adjacency.row_nodes >= 0).sum() == sum(n.kind == "feature" for n in adjacency.columns)  # every feature
    rebuilt = adjacency.rows.sum(1) + adjacency.bias
    assert torch.allclose(rebuilt, adjacency.value, rtol=1e-4, atol=1e-4 * float(adjacency.value.abs().max())), name
    # the logit rows' values are the model's own logits
    replacement, inputs, sentence = traced(lm, transcoders)
    words = torch.tensor(adjacency.extra["words"])
    logits = demeaned(lm.model(**inputs).logits[0, sentence.mask].detach())[words]  # circuit-tracer's targets
    assert torch.allclose(adjacency.value[:len(words)], logits, atol=1e-4)


def test_an_edge_is_the_change_when_its_source_alone_is_removed(bert):
    """In the frozen replacement, zeroing one source leaf changes each target by minus its edge."""
    lm, transcoders = bert
    graph = attribution.attribution_graph(lm, TEXT, transcoders=transcoders)
    replacement, _, sentence = traced(lm, transcoders)
    adjacency = graph.adjacency
    columns = adjacency.columns
    feature_layer1 = next(i for i, n in enumerate(columns) if n.kind == "feature" and n.layer == 1)
    error_layer1 = next(i for i, n in enumerate(columns) if n.kind == "error" and n.layer == 1 and n.position == 2)
    token = next(i for i, n in enumerate(columns) if n.kind == "token" and n.position == 1)
    words = torch.tensor(adjacency.extra["words"])
    with torch.no_grad():
        clean = demeaned(replacement.forward(sentence, sentence.leaves))[words]
    for column in (feature_layer1, error_layer1, token):
        node = columns[column]
        leaves = sentence.leaves.copy()
        with torch.no_grad():
            if node.kind == "feature":
                slot = int((sentence.indices[1][node.position] == node.feature).nonzero()[0])
                leaves.features[1][node.position, slot] = 0
            elif node.kind == "error":
                leaves.errors[1][node.position] = 0
            else:
                leaves.tokens[node.position] = 0
            removed = demeaned(replacement.forward(sentence, leaves))[words]
        edges = adjacency.rows[:len(words), column]
        assert torch.allclose(clean - removed, edges, atol=1e-5), node.id


def reference_logit_rows(lm, transcoders, sentence, words, norms="slope"):
    """The logit rows from a frozen BERT written out here from the model's own modules, its
    Jacobian taken whole by torch.autograd.functional.jacobian (no batched backward). Each norm
    after the embeddings' is frozen as `norms` says: "slope", the norm module's own value at the
    clean input plus its own Jacobian there (torch's) times the change; "scale", its 1/sigma."""
    bert = lm.model.bert
    lm.model.set_attn_implementation("eager")  # this test's own model: its weights as they are
    try:
        attentions = lm.model(input_ids=sentence.ids[None], output_attentions=True).attentions
    finally:
        lm.model.set_attn_implementation("sdpa")

    slopes: dict = {}

    def frozen_norm(norm, x, clean, scale_only=False):
        if norms == "slope" and not scale_only:
            key = id(norm)  # each norm module runs once per forward
            if key not in slopes:
                slopes[key] = torch.autograd.functional.jacobian(norm, clean.detach())  # (T, D, T, D)
            return norm(clean).detach() + torch.einsum("tdse,se->td", slopes[key], x - clean)
        scale = torch.rsqrt(clean.var(-1, unbiased=False, keepdim=True) + norm.eps)
        return (x - x.mean(-1, keepdim=True)) * scale * norm.weight + norm.bias

    ids = sentence.ids
    clean_tokens = (bert.embeddings.word_embeddings(ids) + bert.embeddings.position_embeddings(torch.arange(len(ids)))
                    + bert.embeddings.token_type_embeddings(torch.zeros_like(ids))).detach()
    acts = [sentence.leaves.features[l] for l in (1, 2)]
    errors = [sentence.leaves.errors[l] for l in (1, 2)]
    coded = sentence.coded[:, None].float()

    def run(tokens, a1, a2, e1, e2, clean=None):
        record = {} if clean is None else clean
        norm = bert.embeddings.LayerNorm
        h = frozen_norm(norm, tokens, record.setdefault("e", tokens), scale_only=True)  # the token nodes' own
        for index, (a, e) in enumerate(((a1, e1), (a2, e2))):
            layer = bert.encoder.layer[index]
            heads = layer.attention.self.num_attention_heads
            v = layer.attention.self.value(h).view(len(ids), heads, -1).transpose(0, 1)
            mixed = (attentions[index][0] @ v).transpose(0, 1).reshape(len(ids), -1)
            s = h + layer.attention.output.dense(mixed)
            h = frozen_norm(layer.attention.output.LayerNorm, s, record.setdefault(f"a{index}", s))
            coder = transcoders[index + 1].coder
            rows = coder.W_dec[sentence.indices[index + 1]]
            m = (torch.einsum("tk,tkh->th", a, rows) + coder.b_dec + h @ coder.W_skip.mT) * coded + e
            s = h + m
            h = frozen_norm(layer.output.LayerNorm, s, record.setdefault(f"m{index}", s))
        transform = lm.model.cls.predictions.transform
        z = transform.dense(h[sentence.mask])
        clean_z = record.setdefault("z", z)
        z = z * (torch.nn.functional.gelu(clean_z) / clean_z)
        z = frozen_norm(transform.LayerNorm, z[None], record.setdefault("hz", z[None]))[0]
        return demeaned(lm.model.cls.predictions.decoder(z))[words]

    record: dict = {}
    with torch.no_grad():
        run(clean_tokens, *acts, *errors, clean=record)
    record = {k: v.detach() for k, v in record.items()}
    inputs = (clean_tokens, *acts, *errors)
    jacobian = torch.autograd.functional.jacobian(lambda *x: run(*x, clean=dict(record)), inputs)
    edges = [j * x for j, x in zip(jacobian, inputs)]  # (words, *leaf shape) each
    vector = lambda e: e.sum(-1)  # noqa: E731 - a vector leaf's effect: summed over its dimensions
    return {"tokens": vector(edges[0]), "features": (edges[1].flatten(1), edges[2].flatten(1)),
            "errors": (vector(edges[3]), vector(edges[4]))}


@pytest.mark.parametrize("norms", ["slope", "scale"])
def test_a_hand_written_two_layer_reference_gives_the_same_logit_edges(bert, norms):
    lm, transcoders = bert
    graph = attribution.attribution_graph(lm, TEXT, transcoders=transcoders, norms=norms)
    _, _, sentence = traced(lm, transcoders)
    adjacency = graph.adjacency
    assert adjacency.extra["norms"] == norms
    words = torch.tensor(adjacency.extra["words"])
    reference = reference_logit_rows(lm, transcoders, sentence, words, norms)
    rows = adjacency.rows[:len(words)]
    compared = 0
    for column, node in enumerate(adjacency.columns):
        if node.kind == "token":
            expected = reference["tokens"][:, node.position]
        elif node.kind == "error":
            expected = reference["errors"][node.layer - 1][:, node.position]
        else:
            slot = int((sentence.indices[node.layer][node.position] == node.feature).nonzero()[0])
            expected = reference["features"][node.layer - 1][:, node.position * sentence.indices[1].shape[1] + slot]
        assert torch.allclose(rows[:, column], expected, atol=2e-5), node.id
        compared += 1
    assert compared == len(adjacency.columns)


def test_an_intervention_at_scale_one_is_the_clean_model_and_at_zero_changes_it(bert):
    lm, transcoders = bert
    graph = attribution.attribution_graph(lm, TEXT, transcoders=transcoders)
    strongest = max((n for n in graph.nodes if n["kind"] == "feature"), key=lambda n: n["influence"])
    same = interventions.intervene(lm, TEXT, [strongest["id"]], 1.0, graph=graph, transcoders=transcoders)
    assert all(w["change"] == 0.0 for w in same["words"])
    assert same["before"] == same["after"]
    off = interventions.intervene(lm, TEXT, [strongest["id"]], 0.0, graph=graph, transcoders=transcoders)
    assert any(abs(w["change"]) > 1e-4 for w in off["words"])
    assert all(math.isfinite(w["predicted_change"]) for w in off["words"])


def test_the_predicted_change_is_the_change_in_the_replacement_with_features_following(bert):
    """Remove a layer-1 feature in the frozen replacement and let every active feature above it
    follow its pre-activation (no gating): the logits move by exactly the graph's prediction."""
    lm, transcoders = bert
    graph = attribution.attribution_graph(lm, TEXT, transcoders=transcoders)
    replacement, _, sentence = traced(lm, transcoders)
    adjacency = graph.adjacency
    words = torch.tensor(adjacency.extra["words"])
    column = next(i for i, n in enumerate(adjacency.columns) if n.kind == "feature" and n.layer == 1)
    node = adjacency.columns[column]
    leaves = sentence.leaves.copy()
    with torch.no_grad():
        clean = demeaned(replacement.forward(sentence, sentence.leaves))[words]
        slot = int((sentence.indices[1][node.position] == node.feature).nonzero()[0])
        leaves.features[1][node.position, slot] = 0
        active = {l: sentence.leaves.features[l] > 0 for l in leaves.features}
        for layer in range(2, replacement.layers + 1):  # each layer's active features follow the change below
            reads: dict = {}
            replacement.forward(sentence, leaves, reads=reads, upto=layer)
            pre = replacement.pre_activations(sentence, layer, reads)
            leaves.features[layer] = torch.where(active[layer], pre, torch.zeros_like(pre))
        moved = demeaned(replacement.forward(sentence, leaves))[words] - clean
    predicted = -interventions.total_effects(adjacency)[:, column]
    assert torch.allclose(moved, predicted, atol=1e-4 * float(clean.abs().max())), (moved, predicted)


def test_the_first_order_change_is_the_real_models_slope(bert):
    """Small edits in the real model (a hundredth of a node added and removed, attention and every
    LayerNorm live) move each logit by the first-order prediction: their central difference (the
    second-order term cancels) equals it, for a feature, an error node and both at once; at scale 1
    the prediction is zero."""
    lm, transcoders = bert
    graph = attribution.attribution_graph(lm, TEXT, transcoders=transcoders)
    feature = max((n for n in graph.nodes if n["kind"] == "feature" and n["layer"] == 1), key=lambda n: n["influence"])
    error = next(n for n in graph.nodes if n["kind"] == "error" and n["layer"] == 2)
    for nodes in ([feature["id"]], [error["id"]], [feature["id"], error["id"]]):
        up, down = (interventions.intervene(lm, TEXT, nodes, scale, graph=graph, transcoders=transcoders)["words"]
                    for scale in (1.01, 0.99))
        for above, below in zip(up, down):
            assert below["first_order_change"] == -above["first_order_change"] != 0.0
            central = (above["change"] - below["change"]) / 2
            assert math.isclose(central, above["first_order_change"], rel_tol=0.02, abs_tol=1e-6), (nodes, above, below)
    same = interventions.intervene(lm, TEXT, [feature["id"]], 1.0, graph=graph, transcoders=transcoders)
    assert all(w["first_order_change"] == 0.0 for w in same["words"])


def test_pruning_keeps_every_logit_and_token_node_and_drops_nodes_with_no_way_out(bert):
    lm, transcoders = bert
    graph = attribution.attribution_graph(lm, TEXT, transcoders=transcoders, node_threshold=0.5, edge_threshold=0.9)
    kinds = [n["kind"] for n in graph.nodes]
    assert kinds.count("token") == len(graph.tokens)
    assert kinds.count("logit") == len(graph.adjacency.logits)
    full = sum(n.kind == "feature" for n in graph.adjacency.columns)
    assert 0 < kinds.count("feature") < full
    kept = {n["id"] for n in graph.nodes}
    assert all(e.source in kept and e.target in kept for e in graph.edges)
    sources = {e.source for e in graph.edges}
    assert all(n["id"] in sources for n in graph.nodes if n["kind"] in ("feature", "error"))
    looser = graph.pruned_at(0.95, 0.99)
    assert sum(n["kind"] == "feature" for n in looser.nodes) > kinds.count("feature")


def test_scores_are_shares_and_the_left_and_right_of_the_mask_are_told_apart(bert):
    lm, transcoders = bert
    graph = attribution.attribution_graph(lm, TEXT, transcoders=transcoders)
    s = graph.scores
    for name in ("replacement", "completeness", "left", "right", "mask", "framing"):
        assert 0.0 <= s[name] <= 1.0 + 1e-6, name
    assert s["left"] + s["right"] + s["mask"] + s["framing"] == pytest.approx(1.0, abs=1e-5)
    # the same words moved to the other side of the mask move their share with them
    flipped = attribution.attribution_graph(lm, "[MASK] is the capital of France.", transcoders=transcoders)
    assert flipped.scores["left"] == pytest.approx(0.0, abs=1e-9)
    assert flipped.scores["right"] > 0.1


def test_the_viewers_file_round_trips_with_its_fields(bert, tmp_path):
    lm, transcoders = bert
    graph = attribution.attribution_graph(lm, TEXT, transcoders=transcoders)
    file = tmp_path / "graph.json"
    file.write_text(json.dumps(bertdemo.graph_json(graph, supernodes={"capital city": [graph.edges[0].source]})))
    read = json.loads(file.read_text())
    assert set(read) == {"metadata", "qParams", "nodes", "links"}
    assert {"slug", "scan", "prompt_tokens", "prompt", "node_threshold"} <= set(read["metadata"])
    node_fields = {"node_id", "feature", "layer", "ctx_idx", "feature_type", "jsNodeId", "clerp", "influence",
                   "activation", "is_target_logit", "token_prob"}
    assert all(node_fields <= set(n) for n in read["nodes"])
    ids = {n["node_id"] for n in read["nodes"]}
    assert all(link["source"] in ids and link["target"] in ids for link in read["links"])
    assert len(read["links"]) == len(graph.edges)
    assert sum(n["is_target_logit"] for n in read["nodes"]) == 1
    assert read["qParams"]["supernodes"][0][0] == "capital city"
    types = {n["feature_type"] for n in read["nodes"]}
    assert {"embedding", "logit", "cross layer transcoder"} <= types


@pytest.mark.parametrize("text, options, field", [
    ("No mask here.", {}, "text"),
    ("The [MASK] sat on the [MASK].", {"mask": 3}, "mask"),
    ("word " * 70 + "[MASK].", {}, "text"),
    (TEXT, {"node_threshold": 1.5}, "node_threshold"),
    (TEXT, {"edge_threshold": -0.1}, "edge_threshold"),
    (TEXT, {"target": "notawordintinyvocab"}, "target"),
])
def test_bad_input_is_refused_in_words(bert, text, options, field):
    lm, transcoders = bert
    with pytest.raises(ValueError) as refused:
        attribution.attribution_graph(lm, text, transcoders=transcoders, **options)
    assert getattr(refused.value, "field", field) == field
    assert len(str(refused.value)) > 20


def test_several_masks_pick_which_one(bert):
    lm, transcoders = bert
    second = attribution.attribution_graph(lm, "The [MASK] sat on the [MASK].", mask=2, transcoders=transcoders)
    first = attribution.attribution_graph(lm, "The [MASK] sat on the [MASK].", mask=1, transcoders=transcoders)
    assert second.mask_position > first.mask_position


def test_an_unknown_node_and_a_model_without_transcoders_are_refused(bert, tmp_path):
    lm, transcoders = bert
    graph = attribution.attribution_graph(lm, TEXT, transcoders=transcoders)
    with pytest.raises(ValueError, match="No node"):
        interventions.intervene(lm, TEXT, ["9_9_9"], 0.0, graph=graph, transcoders=transcoders)
    with pytest.raises(ValueError, match="token node"):
        interventions.intervene(lm, TEXT, [next(n["id"] for n in graph.nodes if n["kind"] == "token")],
                                0.0, graph=graph, transcoders=transcoders)
    with pytest.raises(ValueError, match="no transcoders for layer"):
        attribution.attribution_graph(lm, TEXT, transcoders={1: transcoders[1]})


def test_a_family_whose_parts_are_not_declared_is_refused_naming_why(tmp_path):
    lm = bertdemo.load(str(tiny_models.save_tiny_family("deberta-v2", tmp_path / "deberta")), device="cpu")
    with pytest.raises(ValueError, match="cannot be frozen"):
        attribution.attribution_graph(lm, TEXT, transcoders={})
