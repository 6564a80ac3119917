"""Which endpoints an MCP client (an agent) sees as tools when the app runs with `--mcp`.

Gradio 6 serves a Model Context Protocol server beside the app (`launch(mcp_server=True)`, at
`/gradio_api/mcp/`) and makes every public named endpoint a tool, named after its Python function,
described by that function's docstring (its "Args:" lines describe the parameters). Gradio has no
per-event switch to keep an endpoint out of MCP yet in the API (`api_visibility="undocumented"`
would also hide it from the API page and from `gradio_client` users reading it), so after launch
`keep_tools` narrows the server's tool table to `TOOLS`, each named by its `api_name`.

Tools are quick, stateless questions about the model. Long or session-bound actions (fine-tunes,
stop, downloads, model choice, classifier training) are not tools: an agent's call has no browser
session to keep their results in, and one fine-tune would hold the server's only training slot.
"""
from __future__ import annotations

import logging

import gradio as gr

log = logging.getLogger("bertdemo")

# api_name -> what an agent asks with it.
TOOLS = {
    "fill_mask": "top-k predictions at each [MASK]",
    "fill_jointly": "completions of all masks together (beam search)",
    "score_candidates": "probability of given words at one mask",
    "sentence_score": "pseudo-log-likelihood of a sentence",
    "mask_sample": "one draw of BERT's 15% / 80-10-10 corruption of a sentence",
    "layer_predictions": "what each layer would predict at a mask (logit lens)",
    "saliency": "which input words caused a prediction (Captum attributions)",
    "neuron_view": "one attention head's query for a token against every key: scores and weights",
    "head_importance": "how much switching off each attention head changes a [MASK]'s prediction",
    "embedding_map": "a word's hidden states in several sentences at one layer, in 2-D (PCA), with neighbours",
    "search_corpus": "the corpus words nearest (cosine, at one layer) to a word as a sentence uses it",
    "sentence_features": "each token's strongest sparse-autoencoder features at one layer",
    "feature_card": "one feature of a layer: label, density, top contexts, tokens it promotes and suppresses",
    "steer_feature": "fill-mask with one feature switched off, turned up or added at the [MASK]s",
    "prediction_features": "the features at one layer whose removal most lowers each [MASK]'s top word",
    "feature_quality": "how far to trust each layer's feature dictionary: what replacing the layer by it costs "
                       "(cross-entropy added, perplexity ratio, KL), then FVU, dead, L0, loss recovered",
    "find_features": "a layer's features found by a word (those that fire on it most, by lift) or by label text",
    "similar_features": "the features of a layer whose decoder directions are nearest one feature's (cosine)",
    "feature_map": "every feature of a layer on a 2-D map (UMAP of the decoder directions), coloured by density",
    "circuit_graph": "the attribution graph of a [MASK]'s prediction: transcoder features, their edges, its scores",
    "circuit_intervene": "graph nodes switched off or turned up in the real model, beside the graph's prediction",
    "circuit_json": "the attribution graph as circuit-tracer's graph file (its viewer and Neuronpedia read it)",
}


def keep_tools(demo: gr.Blocks, tools=tuple(TOOLS)) -> list[str]:
    """Narrow the launched demo's MCP server to `tools` (api_names that exist); returns the tool
    names served. Does nothing when the demo runs without an MCP server."""
    server = getattr(demo, "mcp_server_obj", None)
    if server is None:
        return []
    endpoints = set(server.api_info["named_endpoints"])
    # Named after the api_name (the handler functions are called on_x); on a Space Gradio
    # prefixes every tool with the Space's name, so keep its prefix.
    server.tool_to_endpoint = {server.tool_prefix + name: f"/{name}" for name in tools
                               if f"/{name}" in endpoints}
    missing = [name for name in tools if f"/{name}" not in endpoints]
    if missing:
        log.warning("MCP: endpoints %s not found; not served as tools", ", ".join(missing))
    return list(server.tool_to_endpoint)


def mcp_url(local_url: str) -> str:
    """Where MCP clients connect (streamable HTTP): the app's URL + gradio_api/mcp/."""
    return local_url.rstrip("/") + "/gradio_api/mcp/"
