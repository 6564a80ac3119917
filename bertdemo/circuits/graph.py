"""An attribution graph as data: its nodes, the direct effects between them, pruning and scores.

The adjacency is kept by rows, as it is computed: one row per target node (the logit nodes and
the features whose incoming edges were computed), one column per source node (every active
feature, every error node, every token node). `rows[r, c]` is the direct effect of source c on
target r: edges run from lower layers to higher ones, so the graph has no cycle.

Pruning and the two scores follow Ameisen et al. (2025) and circuit-tracer's `graph.py`: a node's
influence is its total effect on the logits through the absolute adjacency with each row
normalised to sum 1, weighted by the logits' probabilities (the power series A + A^2 + ...,
finite here since every path goes down a layer); nodes are kept up to `node_threshold` of the
total influence (token and logit nodes always), then edges up to `edge_threshold` of the edge
scores, then nodes left without an edge out (or, for features, in) are dropped until none is.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

KINDS = ("feature", "error", "token", "logit")


@dataclass(frozen=True)
class Node:
    """One node. `layer`: 0 for tokens (the embeddings), 1..L for features and errors (the layer
    whose feed-forward block they belong to), L + 1 for logits. `feature`: the transcoder
    feature (features), the word's vocabulary id (tokens, logits), None for errors.
    `activation`: a feature's activation, a logit node's probability."""

    id: str
    kind: str
    layer: int
    position: int
    feature: int | None = None
    activation: float | None = None
    label: str = ""
    token: str = ""


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    weight: float


@dataclass
class Adjacency:
    """The whole graph before pruning (see the module doc). `columns`: the source nodes, features
    first, then errors, then tokens; `logits`: the logit nodes; `rows` (R, C): R = len(logits) +
    the computed features, `row_nodes` (R,): each row's node as a column index, -1 - i for logit i;
    `bias` (R,), `value` (R,): each target's constant part and its clean value (a feature's
    pre-activation, a logit), so that rows.sum(1) + bias == value; `logit_weights` (len(logits),)."""

    columns: list[Node]
    logits: list[Node]
    rows: torch.Tensor
    row_nodes: torch.Tensor
    bias: torch.Tensor
    value: torch.Tensor
    logit_weights: torch.Tensor
    mask_position: int
    framing: frozenset = frozenset()  # positions of [CLS], [SEP]: neither left nor right of the mask
    extra: dict = field(default_factory=dict)

    def column_mask(self, kind: str) -> torch.Tensor:
        return torch.tensor([n.kind == kind for n in self.columns], dtype=torch.bool)


def normalized(rows: torch.Tensor) -> torch.Tensor:
    absolute = rows.abs()
    return absolute / absolute.sum(1, keepdim=True).clamp(min=1e-10)


def influence(adjacency: Adjacency, rows: torch.Tensor | None = None) -> torch.Tensor:
    """(C,): each column node's influence on the logits (see the module doc), through `rows`
    (default: the adjacency's, normalised)."""
    rows = normalized(adjacency.rows) if rows is None else rows
    weights = torch.zeros(len(adjacency.row_nodes), dtype=rows.dtype)
    is_logit = adjacency.row_nodes < 0
    weights[is_logit] = adjacency.logit_weights.to(rows.dtype)[-1 - adjacency.row_nodes[is_logit]]
    total = torch.zeros(rows.shape[1], dtype=rows.dtype)
    feature_rows = ~is_logit
    for _ in range(10_000):  # ends: each step goes down at least one layer
        step = weights @ rows  # (C,)
        total += step
        weights = torch.zeros_like(weights)
        weights[feature_rows] = step[adjacency.row_nodes[feature_rows]]
        if not bool(weights.any()):
            return total
    raise RuntimeError("influence did not converge: the graph has a cycle")


def _threshold(scores: torch.Tensor, share: float) -> float:
    """The score above which the largest scores sum to `share` of the total."""
    ordered = torch.sort(scores.flatten(), descending=True).values
    total = ordered.sum()
    if total <= 0:
        return float("inf")
    cumulative = torch.cumsum(ordered, 0) / total
    index = min(int(torch.searchsorted(cumulative, torch.tensor(share, dtype=cumulative.dtype))), len(ordered) - 1)
    return float(ordered[index])


@dataclass(frozen=True)
class Pruned:
    """Which column nodes and which edges (rows x columns) survive pruning; each column node's
    influence (share of the total)."""

    keep: torch.Tensor  # (C,) bool
    edges: torch.Tensor  # (R, C) bool
    influence: torch.Tensor  # (C,)


def prune(adjacency: Adjacency, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> Pruned:
    """The nodes and edges kept (see the module doc). ValueError for a threshold outside [0, 1]."""
    for name, value in (("node threshold", node_threshold), ("edge threshold", edge_threshold)):
        if not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
            raise ValueError(f"The {name} is {value!r}: it is a share of the total influence, between 0 and 1.")
    node_influence = influence(adjacency)
    keep = node_influence >= _threshold(node_influence, node_threshold)
    keep |= adjacency.column_mask("token")
    row_keep = torch.where(adjacency.row_nodes < 0, torch.ones_like(adjacency.row_nodes, dtype=torch.bool),
                           keep[adjacency.row_nodes.clamp(min=0)])
    rows = adjacency.rows.clone()
    rows[~row_keep] = 0
    rows[:, ~keep] = 0
    scaled = normalized(rows)
    pruned_influence = influence(adjacency, scaled)
    row_influence = torch.where(adjacency.row_nodes < 0,
                                adjacency.logit_weights.to(rows.dtype)[(-1 - adjacency.row_nodes).clamp(
                                    0, len(adjacency.logit_weights) - 1)],
                                pruned_influence[adjacency.row_nodes.clamp(min=0)])
    edge_scores = scaled * row_influence[:, None]
    edges = edge_scores >= _threshold(edge_scores[edge_scores > 0], edge_threshold)
    edges &= rows != 0
    is_token = adjacency.column_mask("token")
    is_feature = adjacency.column_mask("feature")
    while True:  # a feature or error with no edge out, or a feature with no edge in, goes
        before = keep.clone()
        edges[~torch.where(adjacency.row_nodes < 0, True, keep[adjacency.row_nodes.clamp(min=0)])] = False
        edges[:, ~keep] = False
        has_out = edges.any(0)
        has_in = torch.zeros_like(keep)
        feature_rows = adjacency.row_nodes >= 0
        has_in[adjacency.row_nodes[feature_rows]] = edges[feature_rows].any(1)
        keep &= has_out | is_token
        keep &= has_in | ~is_feature
        if bool((keep == before).all()):
            break
    total = node_influence.sum()
    return Pruned(keep, edges, node_influence / total if total > 0 else node_influence)


def scores(adjacency: Adjacency) -> dict:
    """The graph's replacement and completeness scores (circuit-tracer's `compute_graph_scores`),
    and the shares of the influence from the words left of the mask, right of it, the mask itself
    and the framing tokens ([CLS], [SEP]), summed over every node at those positions."""
    rows = normalized(adjacency.rows)
    node_influence = influence(adjacency, rows)
    is_error, is_token = adjacency.column_mask("error"), adjacency.column_mask("token")
    token_share, error_share = float(node_influence[is_token].sum()), float(node_influence[is_error].sum())
    replacement = token_share / (token_share + error_share) if token_share + error_share > 0 else 0.0
    # per node: the share of its incoming (normalised) weight not from errors; nodes without rows: 1
    complete = torch.ones(len(adjacency.columns) + len(adjacency.logits), dtype=rows.dtype)
    fractions = 1 - rows[:, is_error].sum(1)
    where = torch.where(adjacency.row_nodes < 0, len(adjacency.columns) + (-1 - adjacency.row_nodes),
                        adjacency.row_nodes)
    complete[where] = fractions
    out = torch.cat([node_influence, adjacency.logit_weights.to(rows.dtype)])
    completeness = float((complete * out).sum() / out.sum()) if out.sum() > 0 else 0.0
    positions = torch.tensor([n.position for n in adjacency.columns])
    framing = torch.tensor([n.position in adjacency.framing for n in adjacency.columns], dtype=torch.bool)
    total = float(node_influence.sum()) or 1.0
    side = lambda where: float(node_influence[where & ~framing].sum()) / total  # noqa: E731
    return {"replacement": replacement, "completeness": completeness,
            "left": side(positions < adjacency.mask_position), "right": side(positions > adjacency.mask_position),
            "mask": side(positions == adjacency.mask_position), "framing": float(node_influence[framing].sum()) / total}


@dataclass
class Graph:
    """One sentence's attribution graph as a reader sees it: the kept nodes (logits last) with
    their influence, the kept edges, the scores, and the whole adjacency (`adjacency`) to prune
    again at other thresholds (`pruned_at`)."""

    text: str
    tokens: list[str]
    mask_position: int
    nodes: list[dict]
    edges: list[Edge]
    scores: dict
    node_threshold: float
    edge_threshold: float
    adjacency: Adjacency
    target: str = ""
    timings: dict = field(default_factory=dict)

    def node(self, node_id: str) -> dict:
        """The node `node_id` (kept or pruned), ValueError naming how to find ids when unknown."""
        for found in (*self.adjacency.columns, *self.adjacency.logits):
            if found.id == node_id:
                return node_dict(found)
        raise ValueError(f"No node {node_id!r} in this graph: ids look like '3_117_4' (layer 3, feature 117, "
                         "position 4), '0_3_4' (the error at layer 3, position 4) or 'E_2054_1' (the token at "
                         "position 1); the graph's nodes list them.")

    def pruned_at(self, node_threshold: float, edge_threshold: float) -> "Graph":
        return assemble(self.text, self.tokens, self.adjacency, node_threshold, edge_threshold, self.target,
                        self.timings)


def node_dict(node: Node, influence: float | None = None) -> dict:
    found = {"id": node.id, "kind": node.kind, "layer": node.layer, "position": node.position,
             "feature": node.feature, "activation": node.activation, "label": node.label, "token": node.token}
    if influence is not None:
        found["influence"] = influence
    return found


def assemble(text: str, tokens: list[str], adjacency: Adjacency, node_threshold: float = 0.8,
             edge_threshold: float = 0.98, target: str = "", timings: dict | None = None) -> Graph:
    """The `Graph` of `adjacency` pruned at the thresholds."""
    kept = prune(adjacency, node_threshold, edge_threshold)
    columns = adjacency.columns
    nodes = [node_dict(n, float(kept.influence[i])) for i, n in enumerate(columns) if bool(kept.keep[i])]
    nodes += [node_dict(n, float(adjacency.logit_weights[i])) for i, n in enumerate(adjacency.logits)]
    targets = [adjacency.logits[-1 - r].id if r < 0 else columns[r].id for r in adjacency.row_nodes.tolist()]
    r, c = kept.edges.nonzero().T
    weights = adjacency.rows[r, c]
    order = weights.abs().argsort(descending=True)  # strongest first
    edges = [Edge(columns[ci].id, targets[ri], w) for ri, ci, w in
             zip(r[order].tolist(), c[order].tolist(), weights[order].tolist())]
    return Graph(text, tokens, adjacency.mask_position, nodes, edges, scores(adjacency), float(node_threshold),
                 float(edge_threshold), adjacency, target, dict(timings or {}))
