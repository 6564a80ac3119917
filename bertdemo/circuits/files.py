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
Extra fields the viewer ignores carry what an encoder adds: each node's `label` and `token`, and
the metadata's `mask_position`, `target` and `scores`.
"""
from __future__ import annotations

from .graph import Graph

FEATURE_TYPES = {"feature": "cross layer transcoder", "error": "mlp reconstruction error",
                 "token": "embedding", "logit": "logit"}


def graph_json(graph: Graph, slug: str = "bertdemo-graph", scan: str = "bertdemo", supernodes: dict | None = None,
               model: str = "") -> dict:
    """The viewer's JSON of `graph` (pruned at its thresholds). `supernodes`: {name: [node ids]}."""
    nodes = [_node(node, graph) for node in graph.nodes]
    links = [{"source": e.source, "target": e.target, "weight": e.weight} for e in graph.edges]
    return {"metadata": {"slug": slug, "scan": scan, "transcoder_list": [], "prompt_tokens": graph.tokens,
                         "prompt": graph.text, "node_threshold": graph.node_threshold,
                         "edge_threshold": graph.edge_threshold, "mask_position": graph.mask_position,
                         "target": graph.target, "scores": graph.scores, "model": model,
                         "schema_version": 1},
            "qParams": {"pinnedIds": [], "supernodes": [[name, *ids] for name, ids in (supernodes or {}).items()],
                        "linkType": "both", "clickedId": "", "sg_pos": ""},
            "nodes": nodes, "links": links}


def _node(node: dict, graph: Graph) -> dict:
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
            "influence": node.get("influence"), "activation": None if is_logit else node["activation"],
            "label": node["label"], "token": node["token"]}

