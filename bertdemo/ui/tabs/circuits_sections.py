"""The Circuits tab's layout, one function per section (the tab's `render` wires them): the query,
the graph with its scores and nodes beside a node's card, the intervention, the downloads, and
training transcoders. Each returns a named record of its components."""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from ...config import Limits
from ..parts import view_downloads
from ..parts.common import empty_table

SENTENCE = "Paris is the [MASK] of France."
EXAMPLES = [[SENTENCE, 1, ""], [SENTENCE, 1, "capital vs city"],
            ["The man went to the [MASK] to buy a [MASK] of milk.", 2, ""]]
NODE_COLUMNS = ("id", "kind", "layer", "token", "label", "influence")
HEAD_COLUMNS = ("head", "part of the edge", "share")
NORMS = [("at their slope", "slope"), ("by 1/sigma alone", "scale")]  # the service's `norms`, in words
WORD_COLUMNS = ("word", "p before", "p after", "logit change", "as the graph predicted",
                "as the model's slope predicts")


@dataclass
class Query:
    """What a graph is of: the sentence, which mask, the target, the pruning thresholds, how the
    graph freezes the norms."""

    sentence: gr.Textbox
    mask_number: gr.Number
    target: gr.Textbox
    node_threshold: gr.Slider
    edge_threshold: gr.Slider
    norms: gr.Radio
    draw: gr.Button

    @property
    def inputs(self) -> list:
        return [self.sentence, self.mask_number, self.target, self.node_threshold, self.edge_threshold, self.norms]


@dataclass
class Drawn:
    plot: gr.Plot
    scores: gr.Markdown
    nodes: gr.Dataframe
    raw: gr.JSON


@dataclass
class Card:
    node: gr.Textbox
    open: gr.Button
    add: gr.Button
    summary: gr.HTML
    effects: gr.Plot
    heads_note: gr.Markdown
    heads: gr.Dataframe

    @property
    def outputs(self) -> list:
        return [self.summary, self.effects, self.heads_note, self.heads]


@dataclass
class Intervention:
    nodes: gr.Textbox
    scale: gr.Slider
    supernodes: gr.Textbox
    apply: gr.Button
    note: gr.Markdown
    bars: gr.Plot
    words: gr.Dataframe
    raw: gr.JSON

    @property
    def outputs(self) -> list:
        return [self.note, self.bars, self.words, self.raw]


@dataclass
class Downloads:
    export: gr.Button
    files: gr.File
    viewer: gr.Button
    viewer_json: gr.JSON


@dataclass
class Training:
    texts: gr.Textbox
    keep_partial: gr.Checkbox
    train: gr.Button
    stop: gr.Button
    stopping: gr.Markdown
    status: gr.Markdown
    curves: gr.Plot


def query_section() -> Query:
    with gr.Row():
        sentence = gr.Textbox(label="Sentence with [MASK]", value=SENTENCE, lines=2, scale=4,
                              elem_id="circuits-sentence")
        with gr.Column(scale=2):
            mask_number = gr.Number(label="Which [MASK] (1 = the first)", value=1, precision=0, minimum=1)
            target = gr.Textbox(label="Target", placeholder="empty: the mask's top words", elem_id="circuits-target",
                                info="Empty: the top words, weighted by probability; a word: its logit; "
                                     "'capital vs city': their logit difference.")
    with gr.Row():
        node_threshold = gr.Slider(0, 1, value=0.8, step=0.01, label="Node threshold",
                                   info="Keep the nodes that make up this share of the influence.")
        edge_threshold = gr.Slider(0, 1, value=0.98, step=0.01, label="Edge threshold",
                                   info="Then the edges that make up this share of the edge scores.")
        norms = gr.Radio(NORMS, value=NORMS[0][1], label="LayerNorms in the graph", elem_id="circuits-norms",
                         info="At their slope: as the model answers a small change. By 1/sigma alone: as "
                              "circuit-tracer freezes them (a change along a norm's input passes whole).")
        draw = gr.Button("Draw the graph", variant="primary", elem_id="circuits-draw")
    gr.Examples(EXAMPLES, [sentence, mask_number, target])
    return Query(sentence, mask_number, target, node_threshold, edge_threshold, norms, draw)


def graph_section() -> tuple[Drawn, Card]:
    """The drawing and its scores; under them the nodes table beside a node's card."""
    plot = gr.Plot(label="Attribution graph (click a node for its card)", elem_id="circuit-graph")
    scores = gr.Markdown(elem_id="circuit-scores")
    with gr.Row(equal_height=False):
        with gr.Column(scale=1):
            nodes = gr.Dataframe(empty_table(NODE_COLUMNS),
                                 label="The most influential nodes (click a row for its card)", interactive=False,
                                 wrap=True, max_height=520, elem_id="circuit-nodes",
                                 column_widths=["17%", "13%", "10%", "20%", "25%", "15%"])
        with gr.Column(scale=1):
            card = _card()
    with gr.Accordion("Raw graph (JSON)", open=False):
        raw = gr.JSON()
    return Drawn(plot, scores, nodes, raw), card


def _card() -> Card:
    with gr.Row():
        node = gr.Textbox(label="Node", placeholder="click a node, or type its id (e.g. 2_117_4)", scale=2,
                          elem_id="circuit-node")
        with gr.Column(scale=1, min_width=160):
            open_card = gr.Button("Open its card", size="sm", elem_id="circuit-open-node")
            add = gr.Button("Add it to the intervention", size="sm", elem_id="circuit-add-node")
    summary = gr.HTML("<p>Click a node of the graph, or a row of the table, for its card.</p>", elem_id="circuit-card")
    effects = gr.Plot(label="What the feature does to the prediction at a [MASK]", visible=False)
    heads_note = gr.Markdown(elem_id="circuit-heads-note")
    heads = gr.Dataframe(empty_table(HEAD_COLUMNS), label="The attention heads that carry that edge", interactive=False,
                         elem_id="circuit-heads")
    return Card(node, open_card, add, summary, effects, heads_note, heads)


def intervention_section() -> Intervention:
    gr.Markdown("### Switch nodes off or turn them up, in the real model")
    with gr.Row():
        nodes = gr.Textbox(label="Nodes", placeholder="ids or group names, comma separated", scale=3,
                           elem_id="circuit-intervene-nodes", info="Feature or error nodes (click one, then "
                           "'Add it to the intervention'), or the name of a group below.")
        scale = gr.Slider(0, 10, value=0, step=0.1, label="Scale", scale=2,
                          info="0 = switched off, 1 = unchanged, 2 = doubled.")
    supernodes = gr.Textbox(label="Named groups (supernodes)", lines=2, elem_id="circuit-supernodes",
                            placeholder="capital: 2_117_4 2_30_4; france: 1_12_6",
                            info="name: node ids; one group per line or separated by ';'. Kept in the link "
                                 "and in the JSON for circuit-tracer's viewer.")
    apply = gr.Button("Apply", variant="primary", elem_id="circuit-apply")
    note = gr.Markdown(elem_id="circuit-intervention-note")
    with gr.Row():
        bars = gr.Plot(label="The graph's words: probability before and after")
        words = gr.Dataframe(empty_table(WORD_COLUMNS), label="Measured in the model beside the graph's prediction",
                             interactive=False, elem_id="circuit-intervention")
    gr.Markdown("Logit changes, each logit less the vocabulary's mean as the graph's word nodes hold it (a change "
                "every word shares moves no probability). *As the graph predicted*: through the frozen graph, every other feature "
                "following linearly. *As the model's slope predicts*: the same nodes' parts times the real "
                "model's gradient, attention and every LayerNorm live. Both rank single nodes' measured changes "
                "well; the slope a little better, since the graph holds each head's attention weights and answers "
                "through the transcoders where the model has its MLPs (docs/circuits.md).")
    with gr.Accordion("Raw intervention (JSON)", open=False):
        raw = gr.JSON()
    return Intervention(nodes, scale, supernodes, apply, note, bars, words, raw)


def downloads_section() -> Downloads:
    gr.Markdown("### Downloads")
    export, files = view_downloads.controls("the graph")
    with gr.Accordion("The graph as circuit-tracer's JSON (its viewer and Neuronpedia's graph pages read it)",
                      open=False):
        viewer = gr.Button("Show the viewer's JSON", size="sm")
        viewer_json = gr.JSON()
    return Downloads(export, files, viewer, viewer_json)


def training_section(limits: Limits) -> Training:
    """Training a model's transcoders (every layer at once: a circuit needs them all), as a run."""
    with gr.Accordion("Train transcoders for this model", open=False):
        gr.Markdown("A model without transcoders has no graph to draw. The bundled model ships them; any other "
                    "model's are trained here (every layer at once), kept for every visitor of that model.")
        texts = gr.Textbox(label="Text to train on, one sentence per line (empty: the default corpus)", lines=3,
                           max_lines=10, info=f"At most {limits.max_chars:,} characters; training stops after "
                                              f"{limits.features_max_tokens:,} tokens or "
                                              f"{min(limits.features_max_seconds, limits.max_seconds):.0f} s.")
        keep_partial = gr.Checkbox(True, label="Keep the transcoders if I press Stop or the time runs out")
        with gr.Row():
            train = gr.Button("Train transcoders", variant="primary", elem_id="train-transcoders")
            with gr.Column():
                stop = gr.Button("Stop", variant="stop")
                stopping = gr.Markdown(elem_id="transcoders-stopping")
        status = gr.Markdown(elem_id="transcoders-status")
        curves = gr.Plot(label="FVU per layer, live")
    return Training(texts, keep_partial, train, stop, stopping, status, curves)
