"""Our graph file in circuit-tracer's own viewer (its frontend at d797c82, vendored in
circuit_tracer_viewer/ with where each file came from), on the tiny BERT with random transcoders:
the folder `files.write_graph_files` writes, served as circuit-tracer's local server serves it
(`frontend/local_server.py`: the viewer's files at /, the graph folder at /data/ and
/graph_data/), opened in Debian's chromium with only this machine reachable. The viewer draws
every node of ours, its pruning slider reads our `influence` as circuit-tracer's cumulative share,
and a node's hover and click show our label.

The fields the viewer reads (circuit-tracer d797c82, circuit_tracer/frontend/assets/):
- index.html: graph-metadata.json's `graphs[].slug`, `.scan`, `.prompt`, `.node_threshold`
- attribution_graph/init-cg.js: `metadata.scan`, `qParams` (its keys over the defaults,
  `qParams.clerps`, `qParams.gridsnap`), `nodes`
- attribution_graph/util-cg.js `formatData`: a node's `node_id`, `feature`, `layer`, `ctx_idx`,
  `feature_type` ('embedding', 'logit', 'mlp reconstruction error', 'cross layer transcoder'),
  `influence` (kept while <= the slider), `clerp` (a logit's `Output "w" (p=0.123)`),
  `metadata.prompt_tokens`, `metadata.transcoder_list`; a link's `source`, `target`, `weight`
- attribution_graph/init-cg-feature-detail.js: a feature's `activation`
"""
from __future__ import annotations

import functools
import http.server
import json
import re
import threading
from pathlib import Path

import pytest
from playwright.sync_api import expect

import bertdemo
from bertdemo.circuits import files
from tiny_models import tiny_transcoders

VIEWER = Path(__file__).parent / "circuit_tracer_viewer"
SENTENCE = "Paris is the [MASK] of France."
SLUG = "paris-tiny"
# what index.html loads from the web, answered from lib/ (None: an empty script)
LIBRARIES = {"d3.js": "d3.min.js", "jetpack_2024-07-20.js": "jetpack_2024-07-20.js", "dagre.js": "dagre.min.js",
             "npy_v0.js": None, "hotserver-client-ws.js": None}
FEATURE_EXAMPLES = re.compile(r"^https://[^/]+/features/bertdemo/\d+\.json$")  # the viewer's CDN, blocked


@pytest.fixture(scope="module")
def graph(tiny_bert):
    return bertdemo.attribution_graph(tiny_bert, SENTENCE, transcoders=tiny_transcoders(tiny_bert))


@pytest.fixture(scope="module")
def viewer_url(graph, tmp_path_factory):
    """The viewer and a graph folder, served on 127.0.0.1 as circuit-tracer's local server lays them."""
    data = tmp_path_factory.mktemp("graph_files")
    files.write_graph_files(graph, data, slug=SLUG)

    class Handler(http.server.SimpleHTTPRequestHandler):
        def translate_path(self, path):
            for prefix in ("/data/", "/graph_data/"):
                if path.startswith(prefix):
                    return str(data / path[len(prefix):].split("?")[0])
            return super().translate_path(path)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(VIEWER)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/index.html"
    server.shutdown()
    server.server_close()


def test_write_graph_files_lays_out_a_folder_as_circuit_tracer_does(graph, tmp_path):
    first = files.write_graph_files(graph, tmp_path, slug="one")
    files.write_graph_files(graph, tmp_path, slug="two")
    files.write_graph_files(graph, tmp_path, slug="one")  # the same slug again replaces its entry
    assert first == tmp_path / "one.json" and (tmp_path / "two.json").exists()
    index = json.loads((tmp_path / "graph-metadata.json").read_text())
    assert [g["slug"] for g in index["graphs"]] == ["two", "one"]
    assert {"slug", "scan", "prompt", "prompt_tokens", "node_threshold"} <= set(index["graphs"][0])
    with pytest.raises(ValueError, match="letters, digits"):
        files.write_graph_files(graph, tmp_path, slug="../escape")


def test_influence_is_circuit_tracers_cumulative_share(graph):
    data = bertdemo.graph_json(graph)
    sources = [n for n in data["nodes"] if n["feature_type"] != "logit"]
    by_share = sorted(sources, key=lambda n: -n["influence_share"])
    cumulative = [n["influence"] for n in by_share]
    assert cumulative == sorted(cumulative) and 0 < cumulative[0] and cumulative[-1] <= 1.0
    assert cumulative[0] >= by_share[0]["influence_share"] - 1e-9  # the strongest holds its own share at least
    assert all(n["influence"] is None for n in data["nodes"] if n["feature_type"] == "logit")
    # every kept feature but the one(s) crossing the threshold lies within it, as in circuit-tracer
    assert sum(n["influence"] > graph.node_threshold for n in sources if n["feature_type"] != "embedding") <= 2


def open_viewer(page, url: str) -> list[str]:
    """Open `url` with index.html's libraries answered from lib/; returns the page's JS errors."""
    def library(route):
        name = LIBRARIES[route.request.url.rsplit("/", 1)[-1]]
        route.fulfill(content_type="application/javascript", body="" if name is None else None,
                      path=None if name is None else VIEWER / "lib" / name)

    for name in LIBRARIES:
        page.route(f"**/{name}", library)  # a page's routes come before the fixture's block
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.goto(url)
    return errors


@pytest.mark.browser
def test_circuit_tracers_viewer_draws_our_graph_and_shows_our_labels(page, viewer_url, graph, screenshot):
    data = bertdemo.graph_json(graph, slug=SLUG)
    errors = open_viewer(page, viewer_url + "?pruningThreshold=1")  # the slider at 1: every node shown
    nodes = page.locator(".link-graph text.node")
    expect(nodes).to_have_count(len(graph.nodes))
    expect(page.locator(".link-graph .prompt-token")).to_have_count(len(graph.tokens))
    expect(page.locator("select.graph-prompt-select")).to_contain_text(SENTENCE)

    feature = max((n for n in data["nodes"] if n["feature_type"] == "cross layer transcoder"),
                  key=lambda n: n["influence_share"])
    assert feature["clerp"] == next(n["label"] for n in graph.nodes if n["id"] == feature["node_id"])
    x, y = page.evaluate("""id => {
        const box = d3.selectAll('.link-graph text.node').filter(d => d.nodeId == id).node().getBoundingClientRect()
        return [box.x + box.width / 2, box.y + box.height / 2]}""", feature["node_id"])
    page.mouse.move(x - 15, y - 15)
    page.mouse.move(x, y, steps=4)
    expect(page.locator(".tooltip")).to_have_text(feature["clerp"])
    page.mouse.click(x, y)
    detail = page.locator(".feature-detail")
    expect(detail).to_contain_text(f"Feature L{feature['layer']}/{feature['feature']}")
    expect(detail).to_contain_text(feature["clerp"])
    expect(detail).to_contain_text(f"Act: {feature['activation']:.2f}")
    screenshot()

    # at the graph's own threshold the slider keeps what circuit-tracer keeps of its own graphs
    page.goto(viewer_url)
    kept = [n for n in data["nodes"] if n["feature_type"] in ("embedding", "logit")
            or n["influence"] <= graph.node_threshold]
    expect(nodes).to_have_count(len(kept))

    assert all(FEATURE_EXAMPLES.match(url) for url in page.blocked), page.blocked
    assert all(e.startswith("Failed to load resource") for e in errors), errors  # only the blocked examples
