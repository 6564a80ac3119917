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

Given the model, it also writes a feature file per feature of the graph (`frontend/feature_models.py`:
{transcoder_id, index, examples_quantiles: [{quantile_name, examples: [{tokens_acts_list,
train_token_ind, is_repeated_datapoint, tokens}]}], top_logits, bottom_logits, act_min, act_max,
quantile_values, histogram, activation_frequency}, and our `label` and `layer`), made from the feature's card
(`features.views.feature_card`), in `features/<slug>/layer-<n>/<feature>.json`: a feature index is
its layer's, so each layer has its folder. The graph's metadata points the viewer at them as
circuit-tracer's own graphs of several transcoders do: the scan "custom-bertdemo", and
`transcoder_list[layer]` the layer's folder as the viewer fetches it ("./data/features/..."; a scan
starting "./" is read from there rather than from its authors' CDN). Our layers count from 1, so the
list's entry 0 (the embeddings) is "". Without feature files the scan stays "bertdemo" and the
viewer's panel says a feature failed to load.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import torch

from ..model.loading import LoadedModel
from .graph import Graph, influence

FEATURE_TYPES = {"feature": "cross layer transcoder", "error": "mlp reconstruction error",
                 "token": "embedding", "logit": "logit"}


def graph_json(graph: Graph, slug: str = "bertdemo-graph", scan: str = "bertdemo", supernodes: dict | None = None,
               model: str = "", features_at: str | None = None) -> dict:
    """The viewer's JSON of `graph` (pruned at its thresholds). `supernodes`: {name: [node ids]}.
    `features_at`: the folder of its feature files as the viewer fetches it (e.g.
    "./data/features/<slug>", each layer's in "layer-<n>"); the scan then says so (module doc)."""
    cumulative = cumulative_influence(graph)
    nodes = [_node(node, graph, cumulative.get(node["id"])) for node in graph.nodes]
    links = [{"source": e.source, "target": e.target, "weight": e.weight} for e in graph.edges]
    transcoder_list = []
    if features_at is not None:
        scan = f"custom-{scan}"  # the viewer's sign that transcoder_list[layer] names each layer's features
        transcoder_list = [""] + [f"{features_at}/layer-{layer}" for layer in range(1, _layers(graph) + 1)]
    return {"metadata": {"slug": slug, "scan": scan, "transcoder_list": transcoder_list, "prompt_tokens": graph.tokens,
                         "prompt": graph.text, "node_threshold": graph.node_threshold,
                         "edge_threshold": graph.edge_threshold, "mask_position": graph.mask_position,
                         "target": graph.target, "scores": graph.scores, "model": model,
                         "norms": graph.adjacency.extra["norms"],
                         "schema_version": 1},
            "qParams": {"pinnedIds": [], "supernodes": [[name, *ids] for name, ids in (supernodes or {}).items()],
                        "linkType": "both", "clickedId": "", "sg_pos": ""},
            "nodes": nodes, "links": links}


SLUG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def write_graph_files(graph: Graph, folder: Path, slug: str = "bertdemo-graph", *, lm: LoadedModel | None = None,
                      transcoders: dict | None = None, **options) -> Path:
    """`graph_json(graph, slug, **options)` written to `folder`/`slug`.json, and its metadata put in
    `folder`/graph-metadata.json (replacing a graph of the same slug), as circuit-tracer's
    `create_graph_files` and `add_graph_metadata` do; returns the graph's file. Given `lm` (the
    graph's model) and its `transcoders` ({layer: Dictionary}, default the model's), each feature's
    file too, in `folder`/features/`slug`/ (`write_feature_files`), and the graph points at them."""
    if not isinstance(slug, str) or not SLUG.fullmatch(slug):
        raise ValueError(f"The slug {slug!r} names the graph's file: letters, digits, '_', '.' and '-', "
                         "starting with a letter or digit.")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if lm is not None:
        from .attribution import transcoders_of

        write_feature_files(lm, graph, transcoders_of(lm, transcoders), folder / "features" / slug)
        options = {"model": lm.name, **options, "features_at": f"./data/features/{slug}"}  # the local server's /data/
    data = graph_json(graph, slug=slug, **options)
    path = folder / f"{slug}.json"
    path.write_text(json.dumps(data))
    index = folder / "graph-metadata.json"
    graphs = json.loads(index.read_text())["graphs"] if index.exists() else []
    graphs = [g for g in graphs if g.get("slug") != slug] + [data["metadata"]]
    index.write_text(json.dumps({"graphs": graphs}, indent=2))
    return path


# ---------------------------------------------------------------- the feature files

def write_feature_files(lm: LoadedModel, graph: Graph, transcoders: dict, folder: Path) -> list[Path]:
    """One file per feature of `graph` (once however many positions it is at), from its card, as
    `folder`/layer-<n>/<feature>.json; features whose transcoder has no statistics get none (the
    viewer says they failed to load). A card measures what its feature promotes through the model's
    head: here every feature of a layer at once (`output_effects` of the list, in batches of
    forwards), then each card from its row. The folder is written afresh: an earlier graph's of the
    same slug (perhaps of another model) would show the wrong examples."""
    from ..features.effects import output_effects
    from ..features.views import feature_card

    folder = Path(folder)
    shutil.rmtree(folder, ignore_errors=True)
    by_layer: dict[int, list[int]] = {}
    for layer, feature in sorted({(n["layer"], n["feature"]) for n in graph.nodes if n["kind"] == "feature"}):
        by_layer.setdefault(layer, []).append(feature)
    written = []
    for layer, features in by_layer.items():
        transcoder = transcoders.get(layer)
        if transcoder is None or transcoder.stats is None:
            continue
        changes = output_effects(lm, transcoder, features)  # (features, V)
        for feature, change in zip(features, changes):
            card = feature_card(lm, layer, feature, LayerStore(transcoders), change=change)
            path = folder / f"layer-{layer}" / f"{feature}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(feature_file(lm, card, f"{lm.name}/transcoders/layer-{layer}")))
            written.append(path)
    return written


class LayerStore:
    """{layer: transcoder} as the features' views ask a store for a layer's dictionary (the
    Circuits tab's node card asks through it too)."""

    def __init__(self, coders: dict):
        self.coders = coders

    def get(self, lm, layer):
        return self.coders.get(layer)


def feature_file(lm: LoadedModel, card: dict, transcoder_id: str) -> dict:
    """A feature's card (`features.views.feature_card`) as the viewer's feature file: its top
    contexts, then each activation band strongest first, then its random firings, as the example
    groups; the words it promotes and suppresses through the real head as the top and bottom
    logits; its histogram (BINS bins from 0 to its largest activation), percentiles and density."""
    edges, shares = card["histogram"]["edges"], card["histogram"]["shares"]
    groups = [("Top activations", card["contexts"])]
    groups += [(f"Band {b['band']} of {len(card['bands'])}: activations {b['low']:.2f} to {b['high']:.2f}",
                b["examples"]) for b in reversed(card["bands"])]
    groups += [("Random firings", card["random_firings"])]
    seen: set = set()
    quantiles = [{"quantile_name": name, "examples": [_example(lm, c, seen) for c in contexts]}
                 for name, contexts in groups if contexts]
    return {"transcoder_id": transcoder_id, "index": card["feature"], "examples_quantiles": quantiles,
            "top_logits": [w["token"] for w in card["promoted"]],
            "bottom_logits": [w["token"] for w in card["suppressed"]],
            "act_min": 0.0, "act_max": card["max"], "quantile_values": _percentiles(edges, shares),
            "histogram": shares, "activation_frequency": card["density"],
            "label": card["label"], "layer": card["layer"]}


def _example(lm: LoadedModel, context: dict, seen: set) -> dict:
    """A card's context line as the viewer's example: its tokens as pieces of the text (each with
    the spaces before it, [CLS] and [SEP] left out) and the activation at the firing token (the
    statistics keep that one; the others read 0). Repeated: the same firing shown in a group above."""
    encoding = lm.tokenizer(context["text"], return_offsets_mapping=True)
    tokens, at, previous = [], 0, 0
    for position, (start, end) in enumerate(encoding["offset_mapping"]):
        if end <= start:  # a special token: no characters of the text
            continue
        if position == context["position"]:
            at = len(tokens)
        tokens.append(context["text"][previous:end])
        previous = end
    acts = [0.0] * len(tokens)
    if tokens:
        acts[at] = context["activation"]
    key = (context["text"], context["position"])
    repeated = key in seen
    seen.add(key)
    return {"tokens_acts_list": acts, "train_token_ind": at, "is_repeated_datapoint": repeated, "tokens": tokens}


def _percentiles(edges: list[float], shares: list[float]) -> list[float]:
    """Its 1st..100th percentiles (the viewer's `quantile_values`: an activation at or under entry
    i is in percentile i + 1), read off the histogram's cumulative shares."""
    cumulative = np.maximum.accumulate(np.concatenate([[0.0], np.cumsum(shares)]))
    if cumulative[-1] <= 0:
        return [0.0] * 100
    return np.interp(np.arange(1, 101) / 100, cumulative / cumulative[-1], edges).tolist()


def _layers(graph: Graph) -> int:
    """The model's layers: the logits' layer less one."""
    return max((n["layer"] for n in graph.nodes), default=1) - 1


# ---------------------------------------------------------------- influence and nodes

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

