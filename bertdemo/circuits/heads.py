"""The attention heads that carry an edge of an attribution graph.

    split = edge_heads(lm, graph, "1_17_2", "2_40_4")     # a feature at "Paris" into one at [MASK]
    split["heads"]   # [{"head": 0, "weight": 0.81, "share": 0.74}, ...] largest first

At frozen attention a source at position p reaches a target at another position q only through
the value-output paths of the attention layers between them, and at each layer that path is a sum
over heads. Everything the target reads after its own layer's attention (the norm that follows it,
the target's feed-forward input, or for a logit the last feed-forward block, the final norms and
the MLM head) works position by position, so the edge is exactly

    edge = elsewhere + sum over h of head_h

where head_h is what arrives at q through head h of the *target's attention layer* (a feature's
own layer; for a logit the last layer) and `elsewhere` is what reaches q without crossing there
(through the residual stream: what crossed at an earlier layer, or stayed at q). Each head_h is
measured, not estimated: the replacement is run with that layer's attention weights cut to head h
alone, and with every head cut (`elsewhere`); the difference is head h's part.

- Adjacent layers (a source one layer below the target's attention, e.g. a layer-1 feature into a
  layer-2 feature, or a token into a layer-1 feature): the heads carry all of a cross-position
  edge, `elsewhere` is 0 and the shares sum to 1.
- Longer paths: the split is of the attention at the target's layer only (the heads of earlier
  layers are not told apart); `elsewhere` holds what crossed earlier, and `adjacent` is False.
"""
from __future__ import annotations

import torch

from .. import validate
from ..model.loading import LoadedModel
from .attribution import coded_positions, encode, transcoders_of
from .graph import Graph
from .replacement import Leaves, Replacement, Sentence, demeaned

SOURCES = ("feature", "error", "token")
TARGETS = ("feature", "logit")


def edge_heads(lm: LoadedModel, graph: Graph, source: str, target: str, *, transcoders: dict | None = None) -> dict:
    """How the edge `source` -> `target` of `graph` splits over the heads of the target's
    attention layer (see the module doc). Returns {"source", "target", "weight": the edge,
    "layer": that attention layer, "adjacent": whether one attention layer lies between them,
    "across": whether the two are at different positions, "elsewhere": the part no head there
    carries, "heads": [{"head", "weight", "share": weight / edge (None for an edge of 0)}] by
    |weight|, largest first}. ValueError in words for an id not in the graph or a pair with no
    edge between them (a target at or below its source's layer)."""
    src, dst = graph.node(str(source).strip()), graph.node(str(target).strip())
    if src["kind"] not in SOURCES:
        raise validate.InputError("source", f"{src['id']} is a {src['kind']} node: an edge starts at a feature, "
                                            "an error or a token node.")
    if dst["kind"] not in TARGETS:
        raise validate.InputError("target", f"{dst['id']} is a {dst['kind']} node: an edge ends at a feature or "
                                            "a logit node.")
    if dst["layer"] <= src["layer"]:
        raise validate.InputError("target", f"No edge from {src['id']} (layer {src['layer']}) to {dst['id']} "
                                            f"(layer {dst['layer']}): an edge goes up at least one layer.")
    replacement = Replacement(lm, transcoders_of(lm, transcoders), norms=graph.adjacency.extra["norms"])
    sentence = _traced(lm, replacement, graph)
    layer = min(dst["layer"], replacement.layers)  # the last attention before the target reads
    full = sentence.frozen.attention[layer]
    heads = full.shape[0]

    def edge(weights: torch.Tensor) -> float:
        sentence.frozen.attention[layer] = weights
        try:
            return _direct_effect(replacement, sentence, src, dst)
        finally:
            sentence.frozen.attention[layer] = full
    weight = edge(full)
    elsewhere = edge(torch.zeros_like(full)) if layer > src["layer"] else weight
    parts = []
    for head in range(heads if layer > src["layer"] else 0):
        alone = torch.zeros_like(full)
        alone[head] = full[head]
        parts.append(edge(alone) - elsewhere)
    listed = [{"head": h, "weight": w, "share": (w / weight if weight else None)} for h, w in enumerate(parts)]
    listed.sort(key=lambda h: -abs(h["weight"]))
    return {"source": src["id"], "target": dst["id"], "weight": weight, "layer": layer,
            "adjacent": layer == src["layer"] + 1, "across": src["position"] != dst["position"],
            "elsewhere": elsewhere, "heads": listed}


def strongest_across(graph: Graph, node: str) -> str | None:
    """The source of the strongest kept edge into `node` from another position, or None."""
    target = graph.node(str(node).strip())
    positions = {n["id"]: n["position"] for n in graph.nodes}
    found = [e for e in graph.edges if e.target == target["id"] and positions.get(e.source) != target["position"]]
    return max(found, key=lambda e: abs(e.weight)).source if found else None


def _traced(lm: LoadedModel, replacement: Replacement, graph: Graph) -> Sentence:
    """The graph's sentence through `replacement` again (its clean forward, multipliers frozen)."""
    inputs, _ = encode(lm, graph.text, 1)  # the first mask only checks the text; the graph says which
    ids = inputs["input_ids"][0].cpu()
    if int(ids[graph.mask_position]) != lm.mask_token_id:
        raise ValueError("This graph was not built from this model's reading of its sentence.")
    tokens = lm.tokenizer.convert_ids_to_tokens(ids.tolist())
    return replacement.trace(inputs, graph.mask_position, tokens, coded_positions(lm, ids))


def _direct_effect(replacement: Replacement, sentence: Sentence, source: dict, target: dict) -> float:
    """The direct effect of `source` on `target` in the replacement at the sentence's (possibly
    edited) frozen multipliers: the target's gradient with respect to the source's leaf, times it."""
    leaves = sentence.leaves.copy()
    leaf, at = _leaf(leaves, sentence, source)
    leaf.requires_grad_(True)  # a fresh copy: the one leaf whose gradient is read
    with torch.enable_grad():
        value = _target_value(replacement, sentence, leaves, target)
        (grad,) = torch.autograd.grad(value, leaf)
    return float((grad[at] * leaf[at].detach()).sum())


def _leaf(leaves: Leaves, sentence: Sentence, node: dict) -> tuple[torch.Tensor, tuple]:
    """(the leaf tensor holding `node`, its index there)."""
    p = node["position"]
    if node["kind"] == "token":
        return leaves.tokens, (p,)
    if node["kind"] == "error":
        return leaves.errors[node["layer"]], (p,)
    return leaves.features[node["layer"]], (p, _slot(sentence, node))


def _slot(sentence: Sentence, node: dict) -> int:
    hits = (sentence.indices[node["layer"]][node["position"]] == node["feature"]).nonzero().flatten()
    if not len(hits):
        raise ValueError(f"Feature {node['id']} is not active in this sentence.")
    return int(hits[0])


def _target_value(replacement: Replacement, sentence: Sentence, leaves: Leaves, node: dict) -> torch.Tensor:
    """The target's value from `leaves`: a feature's pre-activation, a logit."""
    if node["kind"] == "logit":
        return demeaned(replacement.forward(sentence, leaves))[node["feature"]]
    reads: dict = {}
    replacement.forward(sentence, leaves, upto=node["layer"], reads=reads)
    return replacement.pre_activations(sentence, node["layer"], reads)[node["position"], _slot(sentence, node)]
