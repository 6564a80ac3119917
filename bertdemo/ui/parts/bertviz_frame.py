"""The bertviz view's one frame, kept for the whole visit: each new view is posted into it.

A bertviz view is a document of its own (scripts run in it; `gr.HTML` runs none), which the tab
used to show as a new `<iframe srcdoc>` per answer: every answer then parsed and ran require.js,
jQuery and d3 again, and the frame only started once the page had drawn every chart of the answer.
Here the page holds one sandboxed frame whose document (the shell) loads those scripts once, when the
tab is first shown; each answer's document is posted to it and drawn in place (its markup swapped,
its script run), so a later answer fetches and parses no code and the frame draws alongside the page.

The value of the component is still the view as an `<iframe srcdoc=...>` (what `/attention` has
always returned); the page reads the document and the height out of it. Both halves of the message
protocol live here: the frame says `{bertvizReady: true}` once it listens, the page posts
`{bertviz: document}`; each side reads only messages from the other.
"""
from __future__ import annotations

import html
import json

import gradio as gr

# The shell's script: bertviz's modules fetched once, then every posted view drawn in place. Its body
# is replaced by the posted document's markup; the posted scripts are inert copies from DOMParser,
# so each is made again to run (require.js, which this document has loaded already, is skipped).
SHELL_JS = """
require.config({paths: {d3: D3_PATH, jquery: JQUERY_PATH}});
requirejs(['jquery', 'd3'], () => {});  // fetched and run while the visitor reads
const show = (page) => {
    const posted = new DOMParser().parseFromString(page, 'text/html');
    document.body.replaceChildren();
    for (const node of [...posted.body.childNodes]) {
        if (node.nodeName !== 'SCRIPT') { document.body.appendChild(document.adoptNode(node)); continue; }
        if (node.src) continue;
        const script = document.createElement('script');
        script.textContent = node.textContent;
        document.body.appendChild(script);
    }
};
window.addEventListener('message', (event) => {
    if (event.source !== window.parent || !event.data || !event.data.bertvizPort || !event.ports[0]) return;
    event.ports[0].onmessage = (posted) => { if (typeof posted.data === 'string') show(posted.data); };
});
window.parent.postMessage({bertvizReady: true}, '*');
"""

# The page's side, run once when the component is first drawn (`element`, `props`, `watch` are
# gr.HTML's): make the frame, and post each new value's document to it, sized as the value's frame.
# Until the frame listens, the latest value waits; an empty value hides the frame.
PAGE_JS = """
const frame = document.createElement('iframe');
frame.setAttribute('sandbox', 'allow-scripts');
frame.title = 'bertviz';
frame.style.cssText = 'width:100%;border:1px solid #ddd;border-radius:6px;display:none';
frame.srcdoc = SHELL_DOCUMENT;
element.appendChild(frame);
let port = null, posted = null;
const post = () => {
    if (port && props.value === posted) return;
    const shown = new DOMParser().parseFromString(props.value || '', 'text/html').querySelector('iframe');
    if (!shown) { frame.style.display = 'none'; return; }
    frame.title = shown.title;
    frame.style.height = shown.style.height;
    frame.style.display = 'block';
    if (!port) return;
    posted = props.value;
    port.postMessage(shown.getAttribute('srcdoc'));
};
window.addEventListener('message', (event) => {
    if (event.source !== frame.contentWindow || !event.data || !event.data.bertvizReady) return;
    const channel = new MessageChannel();
    frame.contentWindow.postMessage({bertvizPort: true}, '*', [channel.port2]);
    port = channel.port1;
    posted = null;  // a new frame document (or the first) has drawn nothing yet
    post();
});
// Post the moment Gradio sets the value, inside the task that then draws the answer's charts, so the
// frame (a process of its own) draws alongside them instead of after; watch() runs only after
// that task's drawing, and stays as the fallback where a value is set some other way.
let value = props.value;
try {
    Object.defineProperty(props, 'value', {configurable: true, enumerable: true, get: () => value,
                                           set: (next) => { value = next; post(); }});
} catch (err) { // a props object that refuses: watch() alone
}
watch('value', post);
post();
"""


def shell(script_urls: dict[str, str]) -> str:
    """The frame's own document: require.js, d3 and jQuery from `script_urls` ({"require", "d3",
    "jquery"} -> URL, as `attention_views.script_urls` gives them), and the script that draws each
    posted view. require.js appends ".js" to its paths itself."""
    script = (SHELL_JS.replace("D3_PATH", json.dumps(script_urls["d3"].removesuffix(".js")))
              .replace("JQUERY_PATH", json.dumps(script_urls["jquery"].removesuffix(".js"))))
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>bertviz</title>"
            f"<script src=\"{html.escape(script_urls['require'], quote=True)}\"></script>"
            f"<script>{script}</script></head>\n<body style=\"margin:8px\"></body></html>")


def render(script_urls: dict[str, str], elem_id: str) -> gr.HTML:
    """The component: its value is a view as `<iframe srcdoc=...>` (`srcdoc_iframe`), drawn in the
    one frame. Its template never names the value, so a new value leaves the frame in place."""
    document = json.dumps(shell(script_urls))
    for char in "<>&":  # the page's configuration sits in a <script>: no "</script>" in it
        document = document.replace(char, f"\\u{ord(char):04x}")
    return gr.HTML(html_template="", js_on_load=PAGE_JS.replace("SHELL_DOCUMENT", document), elem_id=elem_id)
