"""A graph as the file circuit-tracer's viewer and Neuronpedia's graph pages read.

The fields are circuit-tracer's (`frontend/graph_models.py`, `utils/create_graph_files.py`):
{"metadata": {slug, scan, transcoder_list, prompt_tokens, prompt, node_threshold},
 "qParams": {pinnedIds, supernodes, linkType, clickedId, sg_pos},
 "nodes": [{node_id, feature, layer, ctx_idx, feature_type, token_prob, is_target_logit, run_idx,
            reverse_ctx_idx, jsNodeId, clerp, influence, activation}],
 "links": [{source, target, weight}]}
Node ids keep that scheme: "{layer}_{feature}_{position}" for a feature, "0_{layer}_{position}"
for an error, "E_{token id}_{position}" for a token, "{L+1}_{word id}_{position}" for a logit.
Layers are the page's: 1..L for the transcoders, "E" for the embeddings, L + 1 for the logits.
A node's `influence` is circuit-tracer's (`graph.py`'s `prune_graph`, its `cumulative_scores`):
the share of the total influence held by that node and every node stronger than it, so that the
viewer's pruning slider keeps the nodes at or under its value; our own share of the node is
`influence_share` (a logit's: its weight among the targets).
Extra fields the viewer ignores carry what an encoder adds: each node's `label`, `token` and
`influence_share`, and the metadata's `mask_position`, `target` and `scores`.

`write_graph_files` lays a graph out as circuit-tracer's `create_graph_files` does: `<slug>.json`
beside a `graph-metadata.json` index of the folder's graphs, the folder its local server
(`frontend/local_server.py`) serves under `/data/` and `/graph_data/`. Our JSON opened in its viewer
(the frontend of safety-research/circuit-tracer at d797c82, tests/circuits/circuit_tracer_viewer/).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from .graph import Graph, influence

FEATURE_TYPES = {"feature": "cross layer transcoder", "error": "mlp reconstruction error",
                 "token": "embedding", "logit": "logit"}


def graph_json(graph: Graph, slug: str = "bertdemo-graph", scan: str = "bertdemo", supernodes: dict | None = None,
               model: str = "") -> dict:
    """The viewer's JSON of `graph` (pruned at its thresholds). `supernodes`: {name: [node ids]}."""
    cumulative = cumulative_influence(graph)
    nodes = [_node(node, graph, cumulative.get(node["id"])) for node in graph.nodes]
    links = [{"source": e.source, "target": e.target, "weight": e.weight} for e in graph.edges]
    return {"metadata": {"slug": slug, "scan": scan, "transcoder_list": [], "prompt_tokens": graph.tokens,
                         "prompt": graph.text, "node_threshold": graph.node_threshold,
                         "edge_threshold": graph.edge_threshold, "mask_position": graph.mask_position,
                         "target": graph.target, "scores": graph.scores, "model": model,
                         "schema_version": 1},
            "qParams": {"pinnedIds": [], "supernodes": [[name, *ids] for name, ids in (supernodes or {}).items()],
                        "linkType": "both", "clickedId": "", "sg_pos": ""},
            "nodes": nodes, "links": links}


SLUG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def write_graph_files(graph: Graph, folder: Path, slug: str = "bertdemo-graph", **options) -> Path:
    """`graph_json(graph, slug, **options)` written to `folder`/`slug`.json, and its metadata put in
    `folder`/graph-metadata.json (replacing a graph of the same slug), as circuit-tracer's
    `create_graph_files` and `add_graph_metadata` do; returns the graph's file."""
    if not isinstance(slug, str) or not SLUG.fullmatch(slug):
        raise ValueError(f"The slug {slug!r} names the graph's file: letters, digits, '_', '.' and '-', "
                         "starting with a letter or digit.")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    data = graph_json(graph, slug=slug, **options)
    path = folder / f"{slug}.json"
    path.write_text(json.dumps(data))
    index = folder / "graph-metadata.json"
    graphs = json.loads(index.read_text())["graphs"] if index.exists() else []
    graphs = [g for g in graphs if g.get("slug") != slug] + [data["metadata"]]
    index.write_text(json.dumps({"graphs": graphs}, indent=2))
    return path


def cumulative_influence(graph: Graph) -> dict:
    """{node id: the share of the total influence held by it and every stronger node} for the
    graph's source nodes (circuit-tracer's `cumulative_scores`: over every node, pruned or kept)."""
    scores = influence(graph.adjacency)
    total = scores.sum()
    if not total > 0:
        return {}
    ordered, order = torch.sort(scores, descending=True)
    cumulative = torch.empty_like(scores)
    cumulative[order] = torch.cumsum(ordered, 0) / total
    return {node.id: min(float(c), 1.0) for node, c in zip(graph.adjacency.columns, cumulative)}


def _node(node: dict, graph: Graph, cumulative: float | None) -> dict:
    kind = node["kind"]
    layer = "E" if kind == "token" else str(node["layer"])
    is_logit = kind == "logit"
    first_logit = next((n["id"] for n in graph.nodes if n["kind"] == "logit"), None)
    js = {"feature": f"{node['layer']}_{node['feature']}-0", "error": f"{node['layer']}_{node['position']}-0",
          "token": f"E_{node['feature']}-{node['position']}", "logit": f"L_{node['feature']}-{node['position']}"}[kind]
    return {"node_id": node["id"], "feature": node["feature"] if kind != "error" else -1, "layer": layer,
            "ctx_idx": node["position"], "feature_type": FEATURE_TYPES[kind],
            "token_prob": node["activation"] if is_logit else 0.0,
            "is_target_logit": is_logit and node["id"] == first_logit, "run_idx": 0, "reverse_ctx_idx": 0,
            "jsNodeId": js, "clerp": (f'Output "{node["token"]}" (p={node["activation"]:.3f})' if is_logit
                                      else node["label"]),
            "influence": None if is_logit else cumulative, "activation": None if is_logit else node["activation"],
            "label": node["label"], "token": node["token"], "influence_share": node.get("influence")}

