"""The chart code fetched while the visitor reads: a hidden one-bar chart drawn just after the tabs show.

Gradio draws a `gr.Plot` with plotly.js, a module of its own (`PlotlyPlot-<hash>.js`, 4.6 MB of
JavaScript, 1.3 MB compressed) that it fetches and parses only when a chart first gets a value: on
every visit the first Predict (or the first chart of any tab) waited ~1.3 s for it. Here the page
holds one more `gr.Plot`, hidden (in the page but taking no space), and its load event hands it a
one-bar figure in JavaScript alone once the page has painted, so Gradio's own Plot loads and runs
plotly.js (and draws once) while the visitor reads. Nothing is asked of the server: the figure is
serialised here, once, when the page is built, by the component itself.

Why this survives a Gradio upgrade: the page never names a chunk. It asks Gradio's own component to
draw, and whichever module that component imports for a plotly figure is the one the visible charts
import next (the browser keeps one copy of each module). The figure is the payload `Plot.postprocess`
makes, the same one a Python handler's figure becomes. If a later Gradio stopped loading the chart
code this way, the browser test `tests/test_browser_page.py` says so.
"""
from __future__ import annotations

import json

import gradio as gr

ELEM_ID = "chart-code-preload"
# The load event's JavaScript: wait for the page's first paint (two animation frames, then a task),
# then give the hidden chart its figure. `%s` is the figure as Gradio's Plot sends it to the page.
PRELOAD_JS = """() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(
    () => setTimeout(() => done(%s), 0))))"""


def render(demo: gr.Blocks) -> gr.Plot:
    """Add the hidden chart and its load event to `demo` (inside its `with gr.Blocks()`)."""
    chart = gr.Plot(visible="hidden", show_label=False, container=False, elem_id=ELEM_ID)
    payload = chart.postprocess(tiny_figure())
    demo.load(None, None, chart, js=PRELOAD_JS % json.dumps(payload.model_dump()),
              api_visibility="private", queue=False)
    return chart


def tiny_figure():
    """One horizontal bar, as the Fill mask tab's chart is drawn: enough for plotly.js to load and
    set up what a bar chart needs; the plain template (~260 bytes in the page)."""
    import plotly.graph_objects as go

    return go.Figure(go.Bar(orientation="h", x=[1], y=["preload"]),
                     layout=dict(template="none", width=40, height=40, margin=dict(l=0, r=0, t=0, b=0)))
