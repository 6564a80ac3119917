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
code this way, the browser test `tests/ui/test_browser_page.py` says so.

**One drawing per new figure** (`ONE_DRAW_JS`, installed by the same load event before the hidden
chart gets its figure). Gradio 6's Plot keys its plotly child on the value: a new figure is first
drawn by the old child (`Plotly.react` into the chart about to be removed) and then, from scratch,
by the new one, so every new chart on the page cost two drawings (the features map's 2,000 points:
200-300 ms each in chromium). Plotly.js sets `window.Plotly` when it loads; the hook catches that
and defers each `react` to a microtask, after Gradio's update has run, and skips a chart no longer
in the page. The chart the visitor sees is drawn once, by the same call with the same arguments.
Should a later Gradio draw another way, nothing is skipped that stays in the page.
"""
from __future__ import annotations

import json

import gradio as gr

ELEM_ID = "chart-code-preload"
# Wrap plotly.js's `react` once it loads (it assigns `window.Plotly`): each call waits for a
# microtask and draws only into a chart still in the page. Resize calls made meanwhile find the
# chart in the page and without a layout yet, and resolve without drawing (plotly's own check).
ONE_DRAW_JS = """(() => {
    if (window.__bertdemoOneDraw) return;
    window.__bertdemoOneDraw = true;
    // drawings done and skipped, by the id of the chart's nearest element with one (the tests read them)
    const drawn = window.__bertdemoDrawn = {}, skipped = window.__bertdemoSkipped = {};
    const wrap = (plotly) => {
        if (!plotly || plotly.__oneDraw || typeof plotly.react !== "function") return plotly;
        const react = plotly.react;
        plotly.react = function (chart, ...rest) {
            if (!(chart instanceof Element)) return react.call(plotly, chart, ...rest);
            return new Promise((resolve, reject) => queueMicrotask(() => {
                const where = (chart.closest("[id]") || {}).id || "";
                const counts = chart.isConnected ? drawn : skipped;
                counts[where] = (counts[where] || 0) + 1;
                if (!chart.isConnected) { resolve(chart); return; }
                Promise.resolve(react.call(plotly, chart, ...rest)).then(resolve, reject);
            }));
        };
        plotly.__oneDraw = true;
        return plotly;
    };
    let current = wrap(window.Plotly);
    Object.defineProperty(window, "Plotly", {configurable: true, enumerable: true,
                                             get: () => current, set: (loaded) => { current = wrap(loaded); }});
})();"""
# The load event's JavaScript: wait for the page's first paint (two animation frames, then a task),
# then give the hidden chart its figure. `%s` is the figure as Gradio's Plot sends it to the page.
PRELOAD_JS = """() => { ONE_DRAW; return new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(
    () => setTimeout(() => done(%s), 0)))); }"""


def render(demo: gr.Blocks) -> gr.Plot:
    """Add the hidden chart and its load event to `demo` (inside its `with gr.Blocks()`)."""
    chart = gr.Plot(visible="hidden", show_label=False, container=False, elem_id=ELEM_ID)
    payload = chart.postprocess(tiny_figure())
    demo.load(None, None, chart, js=PRELOAD_JS.replace("ONE_DRAW", ONE_DRAW_JS) % json.dumps(payload.model_dump()),
              api_visibility="private", queue=False)
    return chart


def tiny_figure():
    """One horizontal bar, as the Fill mask tab's chart is drawn: enough for plotly.js to load and
    set up what a bar chart needs; the plain template (~260 bytes in the page)."""
    import plotly.graph_objects as go

    return go.Figure(go.Bar(orientation="h", x=[1], y=["preload"]),
                     layout=dict(template="none", width=40, height=40, margin=dict(l=0, r=0, t=0, b=0)))
