"""Switching a graph's nodes off or turning them up in the real model, beside what the graph predicted.

    result = intervene(lm, "Paris is the [MASK] of France.", ["3_117_4", "5_2001_4"], scale=0.0)

A feature node's decoder row times its activation is scaled at its position (scale 0: removed),
in the real model's forward: attention is not frozen, and every later layer's feed-forward block
runs as it does (the error kept: the edit adds (scale - 1) x activation x decoder row to the
block's true output). The activation is the transcoder's code of the block's input in that same
forward, so the edit follows what earlier edits changed. An error node is scaled the same way
(its vector, the block's output minus the transcoder's).

A logit here is what the graph's logit nodes hold: the word's logit less the vocabulary's mean
(circuit-tracer's demeaned targets; a change every word shares moves no probability).

The graph's prediction: in the replacement model, with every other node free to follow (its
edges), the change of a logit is (scale - 1) x the node's total effect on it (the signed
adjacency's power series; features respond linearly, no gating by their ReLU). Beside it, the
first-order change in the real model (`first_order_changes`): the same parts dotted with the
logit's gradient, every multiplier live. The two differ where the graph froze what the model
does not: attention weights, the transcoders' linear answer and frozen errors where the model has
its MLPs, and, in a graph whose norms kept only their 1/sigma (norms="scale"), each LayerNorm's
removal of the part of a change along its own input.
"""
from __future__ import annotations

import torch

from .. import validate
from ..forward import mlp_points
from ..model.loading import LoadedModel
from .attribution import MAX_TOKENS, attribution_graph, encode
from .graph import Adjacency, Graph
from .replacement import demeaned

MAX_SCALE = 100.0


def total_effects(adjacency: Adjacency) -> torch.Tensor:
    """(logits, C): the total (signed) effect of each column node on each logit node: what the
    logit changes by when the node is removed, times -1, with every feature downstream following
    linearly. An edge s -> t is t's pre-activation's share from s (its sensitivity to s times s's
    value), so along a path each intermediate feature's edge out is divided by its activation:
    effect(s) = e(s->t1) * e(t1->t2) / a_t1 * ... * e(tk->logit) / a_tk."""
    activation = torch.tensor([n.activation if n.kind == "feature" and n.activation else 0.0
                               for n in adjacency.columns], dtype=adjacency.rows.dtype)
    feature_rows = adjacency.row_nodes >= 0
    nodes = adjacency.row_nodes[feature_rows]
    per_unit = torch.where(activation[nodes] > 0, 1.0 / activation[nodes].clamp(min=1e-12), 0.0)
    effects = []
    for i in range(len(adjacency.logits)):
        weights = (adjacency.row_nodes == -1 - i).to(adjacency.rows.dtype)
        total = torch.zeros(adjacency.rows.shape[1], dtype=adjacency.rows.dtype)
        for _ in range(10_000):  # every path goes down a layer: this ends
            step = weights @ adjacency.rows  # (C,)
            total += step
            weights = torch.zeros_like(weights)
            weights[feature_rows] = step[nodes] * per_unit
            if not bool(weights.any()):
                break
        effects.append(total)
    return torch.stack(effects)


def _chosen(graph: Graph, nodes) -> list[dict]:
    if isinstance(nodes, str):
        nodes = [n for n in nodes.replace(",", " ").split() if n]
    if not nodes:
        raise validate.InputError("nodes", "Name at least one node to switch off or turn up: a feature id such as "
                                           "'3_117_4' from the graph (click a node to see its id).")
    found = [graph.node(str(n).strip()) for n in nodes]
    for node in found:
        if node["kind"] not in ("feature", "error"):
            raise validate.InputError("nodes", f"{node['id']} is a {node['kind']} node: only feature and error "
                                               "nodes can be switched off or turned up.")
    return found


@torch.no_grad()
def intervene(lm: LoadedModel, text: str, nodes, scale: float = 0.0, mask: int = 1, *, graph: Graph | None = None,
              transcoders: dict | None = None, top: int = 5, max_tokens: int = MAX_TOKENS, **graph_options) -> dict:
    """The prediction at the `mask`-th [MASK] before and after scaling `nodes` (ids) by `scale`,
    and, per logit node of the graph, its measured and predicted change. `graph`: the sentence's
    graph when already built (else built here with `graph_options`)."""
    scale = validate.number(scale, "scale", -MAX_SCALE, MAX_SCALE, field="scale")
    if graph is None:
        graph = attribution_graph(lm, text, mask, transcoders=transcoders, max_tokens=max_tokens, **graph_options)
    chosen = _chosen(graph, nodes)
    from .attribution import transcoders_of

    coders = transcoders_of(lm, transcoders)
    inputs, position = encode(lm, text, mask, max_tokens)
    before = demeaned(lm.model(**inputs).logits[0, position].float())
    by_layer: dict[int, list[dict]] = {}
    for node in chosen:
        by_layer.setdefault(node["layer"], []).append(node)
    with mlp_points.edited(lm.model, {layer: _edit(coders[layer].coder, members, scale)
                                      for layer, members in by_layer.items()}):
        after = demeaned(lm.model(**inputs).logits[0, position].float())
    words = [node.feature for node in graph.adjacency.logits]
    first_order = first_order_changes(lm, coders, inputs, position, words, by_layer, scale)
    return _report(lm, graph, chosen, scale, before, after, first_order, top)


def node_parts(coder, nodes: list[dict], output: torch.Tensor, block_input: torch.Tensor) -> torch.Tensor:
    """(T, H): what `nodes` (one layer's) add to the block's output (1, T, H) at their positions:
    a feature its activation times its decoder row, an error node the block's output minus the
    transcoder's. The activation is the transcoder's code of `block_input` (1, T, H)."""
    codes = coder.encode(block_input[0].to(coder.dtype))
    parts = torch.zeros_like(output[0])
    for node in nodes:
        p = node["position"]
        if node["kind"] == "error":
            rebuilt = coder.decode(codes[0][p:p + 1], codes[1][p:p + 1])[0]
            if coder.W_skip is not None:
                rebuilt = rebuilt + block_input[0, p].to(coder.dtype) @ coder.W_skip.mT
            parts[p] += output[0, p] - rebuilt.to(output.dtype)
            continue
        acts, indices = codes[0][p], codes[1][p]
        hit = (indices == node["feature"]) & (acts > 0)
        activation = acts[hit].sum() if bool(hit.any()) else acts.new_zeros(())
        parts[p] += (activation * coder.W_dec[node["feature"]]).to(output.dtype)
    return parts


def _edit(coder, nodes: list[dict], scale: float):
    """The block-output edit at one layer: each node's part scaled at its position (its code read
    from this forward's block input, so earlier edits count)."""
    def edit(output: torch.Tensor, block_input: torch.Tensor) -> torch.Tensor:
        return output + (scale - 1.0) * node_parts(coder, nodes, output, block_input)[None]
    return edit


def first_order_changes(lm: LoadedModel, coders: dict, inputs: dict, position: int, words: list[int],
                        by_layer: dict[int, list[dict]], scale: float) -> torch.Tensor:
    """(len(words),): each word's logit change (less the mean's) predicted to first order in the real model: the
    chosen nodes' parts times (scale - 1), dotted with the logit's gradient at their block's output,
    with attention, every LayerNorm and GELU live (one forward, one backward per word). Where the
    graph freezes those multipliers this slope does not; single-node removals follow it closely
    (docs/circuits.md, Measured)."""
    probes: dict[int, torch.Tensor] = {}
    parts: dict[int, torch.Tensor] = {}

    def probe(layer: int):
        def edit(output: torch.Tensor, block_input: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                parts[layer] = node_parts(coders[layer].coder, by_layer[layer], output, block_input)
            probes[layer] = torch.zeros_like(output, requires_grad=True)
            return output + probes[layer]
        return edit

    layers = sorted(by_layer)
    with torch.enable_grad(), mlp_points.edited(lm.model, {layer: probe(layer) for layer in layers}):
        logits = demeaned(lm.model(**inputs).logits[0, position].float())
        changes = []
        for i, word in enumerate(words):
            grads = torch.autograd.grad(logits[word], [probes[layer] for layer in layers],
                                        retain_graph=i < len(words) - 1)
            changes.append(sum(float((g[0] * parts[layer]).sum()) for g, layer in zip(grads, layers)))
    return (scale - 1.0) * torch.tensor(changes)


def _report(lm: LoadedModel, graph: Graph, chosen: list[dict], scale: float, before: torch.Tensor,
            after: torch.Tensor, first_order: torch.Tensor, top: int) -> dict:
    adjacency = graph.adjacency
    effects = total_effects(adjacency)  # (logits, C)
    index = {n.id: i for i, n in enumerate(adjacency.columns)}
    predicted = (scale - 1.0) * effects[:, [index[n["id"]] for n in chosen]].sum(1)
    p_before, p_after = before.softmax(-1), after.softmax(-1)
    words = []
    for i, node in enumerate(adjacency.logits):
        w = node.feature
        words.append({"word": node.token, "logit_before": float(before[w]), "logit_after": float(after[w]),
                      "change": float(after[w] - before[w]), "predicted_change": float(predicted[i]),
                      "first_order_change": float(first_order[i]),
                      "probability_before": float(p_before[w]), "probability_after": float(p_after[w])})
    listed = lambda p: [{"word": lm.tokenizer.convert_ids_to_tokens(int(i)), "probability": float(v)}  # noqa: E731
                        for v, i in zip(*p.topk(top))]
    return {"nodes": [n["id"] for n in chosen], "scale": scale, "before": listed(p_before), "after": listed(p_after),
            "words": words}
