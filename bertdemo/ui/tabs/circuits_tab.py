"""The Circuits tab: how the model reaches a [MASK] prediction, drawn as an attribution graph of
transcoder features (Ameisen et al. 2025), with each node's card, the attention heads behind an
edge, and nodes switched off or turned up in the real model beside what the graph predicted.

The graph, the heads and the interventions are `bertdemo.circuits`'; this tab lays them out
(`circuits_sections`), wires one line per event and hands each answer to `circuits_results` to be
worded. Every view uses the session's model and its transcoders (`transcoders`: the one place the
tab asks for them; tests replace it). A session's last graph is kept between its events (the
store's kept results), so a click on a node, a new threshold or an intervention does not build the
graph again.
"""
from __future__ import annotations

import re

import gradio as gr
import plotly.graph_objects as go
from gradio.context import get_render_context

from ... import feature_plots, validate
from ...circuits import attribution, drawing, files, heads, interventions
from ...circuits.graph import Graph
from ...circuits.replacement import NORMS
from ...circuits.transcoder_run import TranscodersRequest
from ...config import Settings
from ...features.run import FeatureProgress
from ...model.loading import LoadedModel
from . import circuits_results as results, circuits_sections as sections
from ..parts import live_run, view_downloads
from ..parts.common import empty_table, escape_markdown
from ..parts.context import AppContext, Visitor, handler, standalone_demo
from ..parts.model_line import model_line

KEPT = "circuit_graph"  # the session's last graph, under this name in the store's kept results
MAX_GROUPS, MAX_NODES = 20, 200  # named groups, and node ids in one intervention
MAX_TARGET = 100  # characters of the target box
INTRO = """**How the model reaches its prediction, as a graph.** Each layer's feed-forward block is replaced by a
*transcoder*: a few active features out of thousands, plus an *error* node for what they miss. With
attention frozen for this one sentence and each normalisation taken at its slope, the prediction at the
`[MASK]` is a sum of direct effects between nodes plus constants, and the graph draws the strongest of them: from the words
(bottom), through features layer by layer, to the predicted words (top). Node size = influence on
the prediction; blue edges raise their target, red ones lower it. Click a node for its card and
the attention heads behind its strongest edge from another word; then switch nodes off or turn
them up in the real model and compare with what the graph and the model's slope predicted. Unlike a decoder's graph, a
`[MASK]` draws on words on both sides of it: the scores say how much from each."""
# The page side of a click on a node: the drawing's plotly_click writes the node's id (its first
# customdata) into the node box and presses "Open its card". Re-attached whenever plotly draws
# the plot again (a new graph), checked every 300 ms; installed once per page.
CLICK_JS = """() => {
    if (window.__circuitClicks) return;
    window.__circuitClicks = true;
    const pick = (id) => {
        const box = document.querySelector("#circuit-node textarea, #circuit-node input");
        if (!box) return;
        box.value = id;
        box.dispatchEvent(new Event("input", {bubbles: true}));
        setTimeout(() => { const open = document.getElementById("circuit-open-node"); if (open) open.click(); }, 60);
    };
    setInterval(() => {
        document.querySelectorAll("#circuit-graph .js-plotly-plot").forEach((plot) => {
            if (!plot.on || !plot._fullLayout || plot.__circuitLayout === plot._fullLayout) return;
            plot.__circuitLayout = plot._fullLayout;
            if (plot.removeAllListeners) plot.removeAllListeners("plotly_click");
            plot.on("plotly_click", (event) => {
                const point = event && event.points && event.points[0];
                const data = point && point.customdata;
                if (data) pick(Array.isArray(data) ? data[0] : data);
            });
        });
    }, 300);
}"""
ADD_JS = """(node, nodes) => {
    const id = (node || "").trim();
    const listed = (nodes || "").split(/[\\s,]+/).filter((n) => n);
    if (id && !listed.includes(id)) listed.push(id);
    return listed.join(", ");
}"""


def render(ctx: AppContext) -> None:
    """Layout (`circuits_sections`), then one line per event."""
    gr.Markdown(INTRO)
    line = gr.Markdown(availability(ctx), elem_id="circuits-available")
    query = sections.query_section()
    drawn, card = sections.graph_section()
    change = sections.intervention_section()
    downloads = sections.downloads_section()
    training = sections.training_section(ctx.settings.limits)

    graph = [*query.inputs]
    drawing = query.draw.click(handler(ctx, on_graph), graph, [drawn.plot, drawn.scores, drawn.nodes, drawn.raw, line],
                               api_name="circuit_graph", concurrency_id="model")
    drawing.then(None, None, None, js=CLICK_JS)
    intervention = [*graph[:3], change.nodes, change.scale, change.supernodes, query.norms]
    drawing.success(handler(ctx, on_linked_intervention), intervention, change.outputs, api_visibility="private",
                    concurrency_id="model")
    card.open.click(handler(ctx, on_node), [*graph, card.node], card.outputs, api_visibility="private",
                    concurrency_id="model")
    drawn.nodes.select(on_pick_node, None, card.node, api_visibility="private", queue=False).success(
        handler(ctx, on_node), [*graph, card.node], card.outputs, api_visibility="private", concurrency_id="model")
    card.add.click(None, [card.node, change.nodes], change.nodes, js=ADD_JS)
    change.apply.click(handler(ctx, on_intervene), intervention, change.outputs, api_name="circuit_intervene",
                       concurrency_id="model")
    downloads.viewer.click(handler(ctx, on_graph_json), [*graph[:5], change.supernodes, query.norms], downloads.viewer_json,
                           api_name="circuit_json", concurrency_id="model")
    downloads.export.click(handler(ctx, on_export), [*graph[:5], change.supernodes, query.norms], downloads.files,
                           api_visibility="private", concurrency_id="model")
    live_run.wire(ctx, "train_transcoders", training.train, {"texts": training.texts,
                                                             "keep_partial": training.keep_partial},
                  [training.status, training.curves, line, training.stopping], on_train_transcoders)
    training.stop.click(handler(ctx, on_stop), None, training.stopping, api_name="stop_transcoders", queue=False)
    tab = get_render_context()
    if isinstance(tab, gr.Tab):  # back on this tab: the model may have changed
        tab.select(handler(ctx, on_show), None, line, api_visibility="private", queue=False)


def create_demo(store=None, settings: Settings | None = None) -> gr.Blocks:
    """The tab on its own, for running or testing it alone."""
    return standalone_demo("circuits", render, store, settings)


# ---------------------------------------------------------------- the service, through one door

def transcoders(holder, lm: LoadedModel) -> dict:
    """`lm`'s transcoders in the app's store (`holder`: a Visitor or the AppContext), {layer:
    Dictionary}; ValueError saying how to get them when it has none. Every handler asks here (a
    test replaces it with transcoders of its own)."""
    try:
        from ...circuits.transcoders import transcoders_for
        from ...runs.kinds import transcoder_store
    except ImportError:  # this build has no transcoders
        found = {}
    else:
        found = transcoders_for(lm, transcoder_store(holder))
    if not found:
        raise validate.InputError("model", f"{lm.name} has no transcoders yet, so there is no circuit to draw: "
                                           "train them below ('Train transcoders'), or bertdemo.train_transcoders.")
    return found


def graph_of(visitor: Visitor, sentence, mask_number, target, node_threshold=0.8, edge_threshold=0.98,
             norms: str = NORMS[0]) -> Graph:
    """The graph of the query, pruned at the thresholds: the session's kept one when it is of the
    same sentence, mask, target, norms, model and transcoders (pruned again if the thresholds
    changed), else built and kept."""
    lm = visitor.lm
    coders = transcoders(visitor, lm)
    node_threshold, edge_threshold = attribution.graph_check_thresholds(node_threshold, edge_threshold)
    wanted = target_of(target)
    key = (id(lm), sentence, _whole(mask_number), wanted, norms, tuple((l, id(d)) for l, d in sorted(coders.items())))
    kept = visitor.store.result(visitor.session, KEPT) if visitor.session else None
    if kept is not None and kept[0] == key:
        graph = kept[1]
        if (graph.node_threshold, graph.edge_threshold) == (node_threshold, edge_threshold):
            return graph
        graph = graph.pruned_at(node_threshold, edge_threshold)
    else:
        graph = attribution.attribution_graph(lm, sentence, mask_number, wanted, transcoders=coders,
                                              node_threshold=node_threshold, edge_threshold=edge_threshold,
                                              max_tokens=visitor.settings.circuit_max_tokens, norms=norms)
    if visitor.session:
        visitor.store.keep_result(visitor.session, KEPT, (key, graph), _graph_bytes(graph))
    return graph


def target_of(target) -> str | tuple[str, str] | None:
    """The target box in the service's terms: None (empty), a word, or two words ('a vs b', 'a, b')."""
    if target is None or not str(target).strip():
        return None
    if len(str(target)) > MAX_TARGET:
        raise validate.InputError("target", f"The target is a word or two, at most {MAX_TARGET} characters "
                                            "('capital', or 'capital vs city').")
    words = [w for w in re.split(r"\s+vs\.?\s+|\s*,\s*|\s+-\s+", str(target).strip()) if w]
    if len(words) > 2:
        raise validate.InputError("target", "The target is one word, or two to compare ('capital vs city').")
    return words[0] if len(words) == 1 else (words[0], words[1])


# ---------------------------------------------------------------- handlers

def on_graph(visitor: Visitor, sentence, mask_number, target, node_threshold, edge_threshold, norms):
    """The attribution graph of one [MASK]'s prediction: transcoder features, error and token nodes
    and the predicted words, with the direct effects between them (Ameisen et al. 2025).

    Args:
        sentence: text with at least one [MASK] (any case), e.g. "Paris is the [MASK] of France."; at most the server's circuit limit (64 tokens by default).
        mask_number: which [MASK] to explain, 1 = the first.
        target: empty for the mask's top words (weighted by probability), a word for its logit, or "capital vs city" for the logit difference of two words.
        node_threshold: 0 to 1: keep the nodes that make up this share of the influence on the prediction (0.8 by default).
        edge_threshold: 0 to 1: then keep the edges that make up this share of the edge scores (0.98 by default).
        norms: how the graph freezes each LayerNorm: "slope" (its slope at the sentence, the default: predictions that follow the model's) or "scale" (its 1/sigma alone, as circuit-tracer does).

    Returns:
        the graph drawn (plotly; each node's id is its first customdata), its scores in words, a table of the most influential nodes, the raw graph {"text", "tokens", "mask_position", "target", "scores": {"replacement", "completeness", "left", "right", "mask", "framing"}, "nodes": [{"id", "kind", "layer", "position", "feature", "activation", "label", "token", "influence"}], "edges": [{"source", "target", "weight"}]}, and the model line.
    """
    graph = graph_of(visitor, sentence, mask_number, target, node_threshold, edge_threshold, norms)
    return (drawing.figure(graph), results.scores_words(graph), results.node_frame(graph),
            results.raw_graph(graph), availability(visitor, visitor.session))


def on_node(visitor: Visitor, sentence, mask_number, target, node_threshold, edge_threshold, norms, node):
    """A node's card (what it is, its activation and influence; a feature's card where its transcoder
    has statistics) and the attention heads behind its strongest kept edge from another position."""
    graph = graph_of(visitor, sentence, mask_number, target, node_threshold, edge_threshold, norms)
    found = graph.node(str(node or "").strip())
    card = _feature_card(visitor, found)
    summary = results.card_html(found, card)
    effects = gr.update(value=_effects(card), visible=True) if card else gr.update(value=None, visible=False)
    source = heads.strongest_across(graph, found["id"])
    if source is None:
        why = ("A token node has no incoming edge." if found["kind"] == "token"
               else "No kept edge comes into it from another position.")
        return summary, effects, why, empty_table(sections.HEAD_COLUMNS)
    split = heads.edge_heads(visitor.lm, graph, source, found["id"], transcoders=transcoders(visitor, visitor.lm))
    return summary, effects, results.heads_words(graph, split), results.head_frame(split)


def on_show(visitor: Visitor) -> str:
    return availability(visitor, visitor.session)


def on_pick_node(evt: gr.SelectData):
    """A click on a row of the nodes table: its node id (the first column)."""
    row = getattr(evt, "row_value", None)
    try:
        return str(row[0]) if row and row[0] else gr.skip()
    except (TypeError, IndexError):
        return gr.skip()


def on_intervene(visitor: Visitor, sentence, mask_number, target, nodes, scale, supernodes, norms):
    """Switch graph nodes off or turn them up in the real model (attention not frozen, the
    transcoder's error kept) and compare the prediction with what the graph predicted.

    Args:
        sentence: text with at least one [MASK] (any case), e.g. "Paris is the [MASK] of France.".
        mask_number: which [MASK], 1 = the first.
        target: as for /circuit_graph: empty (the top words), a word, or "capital vs city".
        nodes: feature or error node ids of the graph (e.g. "2_117_4, 1_12_6"), or names of groups given in supernodes.
        scale: 0 to 10: each node's contribution times this (0 = switched off, 1 = unchanged, 2 = doubled).
        supernodes: named groups of node ids, "name: id id; name2: id", usable in nodes.
        norms: as for /circuit_graph: "slope" (the default) or "scale"; the graph whose prediction is shown.

    Returns:
        a summary (top words before and after), bars of the graph's words' probability before and after, a table per word (probability before and after, the logit change measured, as the frozen graph predicted it and as the real model's slope predicts it; logits less the vocabulary's mean, as the graph's logit nodes), and the raw result {"nodes", "scale", "before", "after": [{"word", "probability"}], "words": [{"word", "logit_before", "logit_after", "change", "predicted_change", "first_order_change", "probability_before", "probability_after"}]}.
    """
    groups = parse_groups(supernodes)
    chosen = chosen_nodes(nodes, groups)
    graph = graph_of(visitor, sentence, mask_number, target, norms=norms)
    result = interventions.intervene(visitor.lm, sentence, chosen, scale, mask_number, graph=graph,
                                     transcoders=transcoders(visitor, visitor.lm),
                                     max_tokens=visitor.settings.circuit_max_tokens)
    return (results.intervention_words(result, groups, nodes), results.intervention_bars(result),
            results.word_frame(result), result)


def on_linked_intervention(visitor: Visitor, sentence, mask_number, target, nodes, scale, supernodes, norms):
    """After a graph is drawn: the intervention its nodes box names (a link's), else nothing; a
    node the new graph lacks is said in the note, not raised."""
    if not str(nodes or "").strip():
        return (gr.skip(),) * 4
    try:
        return on_intervene(visitor, sentence, mask_number, target, nodes, scale, supernodes, norms)
    except ValueError as err:
        return f"The intervention was not applied: {escape_markdown(str(err))}", None, gr.skip(), gr.skip()


def on_graph_json(visitor: Visitor, sentence, mask_number, target, node_threshold, edge_threshold, supernodes,
                  norms):
    """The graph in the JSON format circuit-tracer's viewer and Neuronpedia's graph pages read
    ({"metadata", "qParams", "nodes", "links"}), with the named groups as its supernodes.

    Args:
        sentence: text with at least one [MASK] (any case), e.g. "Paris is the [MASK] of France.".
        mask_number: which [MASK], 1 = the first.
        target: as for /circuit_graph.
        node_threshold: 0 to 1, as for /circuit_graph.
        edge_threshold: 0 to 1, as for /circuit_graph.
        supernodes: named groups of node ids, "name: id id; name2: id" (may be empty).
        norms: as for /circuit_graph: "slope" (the default) or "scale".
    """
    graph = graph_of(visitor, sentence, mask_number, target, node_threshold, edge_threshold, norms)
    return files.graph_json(graph, supernodes=_checked_groups(graph, supernodes), model=visitor.lm.name)


def on_export(visitor: Visitor, sentence, mask_number, target, node_threshold, edge_threshold, supernodes,
              norms) -> dict:
    """The graph as files: the viewer's JSON, a CSV of its nodes and edges, the drawing as PNG and SVG."""
    graph = graph_of(visitor, sentence, mask_number, target, node_threshold, edge_threshold, norms)
    paths = drawing.graph_files(graph, view_downloads.folder(visitor), supernodes=_checked_groups(graph, supernodes),
                                model=visitor.lm.name)
    return view_downloads.listed(paths)


# ---------------------------------------------------------------- handlers: training transcoders

def on_train_transcoders(visitor: Visitor, request: TranscodersRequest, progress=gr.Progress()):
    """Train transcoders for every layer of this session's model (a run: one per visitor,
    /stop_transcoders ends it); kept for every visitor of that model. Parameters: `texts` (one
    sentence per line; empty: the default corpus), `keep_partial` (keep a run stopped early).
    Yields the status, the live FVU curves (one per layer), the model line and the Stop line."""
    outcome = yield from live_run.stream(
        visitor, "train_transcoders", request, progress, lambda log: _live_outputs(log, progress),
        cleared=("Starting: reading the corpus…", None, gr.skip(), ""))
    _, history = outcome.result
    yield (trained_status(outcome.kept, history, outcome.plan), results.training_curves(history.steps),
           availability(visitor, visitor.session), gr.skip())


def _live_outputs(log, progress) -> tuple:
    events = [e for e in log.latest.evals if isinstance(e, FeatureProgress)]
    if not events:
        return (gr.skip(),) * 4
    last = events[-1].step
    progress(events[-1].done, desc=f"training transcoders: {last.tokens:,} tokens")
    fvu = ", ".join(f"{v:.3f}" for v in last.fvu)
    status = (f"Step {last.step}: {last.tokens:,} tokens, FVU per layer {fvu}, {last.tokens_per_s:,.0f} tokens/s. "
              "When training ends, their statistics and quality are measured before they are kept.")
    return status, results.training_curves([e.step for e in events]), gr.skip(), gr.skip()


def on_stop(visitor: Visitor) -> str:
    if live_run.stop(visitor):
        return "Stop asked: the run ends after its current step."
    return "Nothing is running: there is no training of yours to stop."


def trained_status(kept, history, plan) -> str:
    """What the run did, in the page's words: how it ended, whether its transcoders were kept."""
    head = live_run.how_it_ended(history, plan.settings.max_seconds)
    name = escape_markdown(plan.lm.name)
    if kept is not None and kept.kept:
        return (f"{head} The transcoders of **{name}** (layers {plan.layers[0]}-{plan.layers[-1]}) are **kept**: "
                "every visitor of this model can draw its circuits now.")
    if not history.steps:
        return f"{head} No step ran, so there are no transcoders to keep."
    return (f"{head} They were **not kept** (tick “Keep the transcoders if I press Stop…” to keep a stopped "
            f"run's): **{name}** still has none.")


# ---------------------------------------------------------------- what the page shows

def availability(holder, session: str | None = None) -> str:
    """The model line, and whether the session's model has transcoders (else how to get them).
    `holder`: a Visitor or the AppContext (whose store and transcoders are the app's)."""
    line = model_line(holder.store, session)
    try:
        lm = holder.store.for_session(session)
    except ValueError:
        return line
    try:
        found = transcoders(holder, lm)
    except ValueError as err:
        return f"{line}  \n⚠️ {escape_markdown(str(err))}"
    layers = sorted(found)
    widths = {layer: found[layer].latents for layer in layers}
    common = max(set(widths.values()), key=list(widths.values()).count)
    others = "".join(f"; layer {layer}: {width:,}" for layer, width in widths.items() if width != common)
    return f"{line}  \nTranscoders of layers {layers[0]}-{layers[-1]} ({common:,} features each{others})."


def _feature_card(visitor: Visitor, node: dict) -> dict | None:
    """The Features tab's card of a feature node's transcoder feature, where it has statistics."""
    if node["kind"] != "feature":
        return None
    coder = transcoders(visitor, visitor.lm).get(node["layer"])
    if coder is None or coder.stats is None:
        return None
    from ...features import views as features

    return features.feature_card(visitor.lm, node["layer"], node["feature"], files.LayerStore({node["layer"]: coder}))


def _effects(card: dict) -> go.Figure:
    return feature_plots.feature_effects(card)


# ---------------------------------------------------------------- node lists and groups

def parse_groups(text) -> dict[str, list[str]]:
    """"name: id id, id; name2: id" (or one group per line) -> {name: [ids]}; ValueError in words."""
    groups: dict[str, list[str]] = {}
    for part in (p.strip() for p in re.split(r"[;\n]+", str(text or ""))):
        if not part:
            continue
        name, colon, ids = part.partition(":")
        name, ids = name.strip(), [i for i in re.split(r"[\s,]+", ids) if i]
        if not colon or not re.fullmatch(r"[\w.-]{1,40}", name) or not ids:
            raise validate.InputError("supernodes", "A named group is a name (letters, digits, '-', '_', at most 40), "
                                                    "a colon and node ids, e.g. 'capital: 2_117_4 2_30_4'.")
        groups[name] = ids
    if len(groups) > MAX_GROUPS:
        raise validate.InputError("supernodes", f"At most {MAX_GROUPS} named groups.")
    return groups


def chosen_nodes(nodes, groups: dict[str, list[str]]) -> list[str]:
    """The node ids `nodes` names (ids or group names, comma or space separated), each once."""
    chosen: list[str] = []
    for item in (i for i in re.split(r"[\s,]+", str(nodes or "")) if i):
        for node in groups.get(item, [item]):
            if node not in chosen:
                chosen.append(node)
    if len(chosen) > MAX_NODES:
        raise validate.InputError("nodes", f"At most {MAX_NODES} nodes at once.")
    return chosen


def _checked_groups(graph: Graph, supernodes) -> dict[str, list[str]]:
    groups = parse_groups(supernodes)
    for ids in groups.values():
        for node in ids:
            graph.node(node)  # ValueError in words for an id not in the graph
    return groups


# ---------------------------------------------------------------- helpers

def _graph_bytes(graph: Graph) -> int:
    a = graph.adjacency
    return int(a.rows.numel() * a.rows.element_size() + 200 * (len(a.columns) + len(graph.edges)))


def _whole(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return value
