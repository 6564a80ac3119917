"""Our graph file in circuit-tracer's own viewer (its frontend at d797c82, vendored in
circuit_tracer_viewer/ with where each file came from), on the tiny BERT with random transcoders
and their statistics over a few lines: the folder `files.write_graph_files` writes, served as
circuit-tracer's local server serves it (`frontend/local_server.py`: the viewer's files at /, the
graph folder at /data/ and /graph_data/), opened in Debian's chromium with only this machine
reachable. The viewer draws every node of ours, its pruning slider reads our `influence` as
circuit-tracer's cumulative share, a node's hover and click show our label, and its
feature-examples panel shows the feature's file (its card's contexts and promoted words); a graph
written without the model (the page's single JSON) still opens, its panel saying the feature
failed to load.

The fields the viewer reads (circuit-tracer d797c82, circuit_tracer/frontend/assets/):
- index.html: graph-metadata.json's `graphs[].slug`, `.scan`, `.prompt`, `.node_threshold`
- attribution_graph/init-cg.js: `metadata.scan`, `qParams` (its keys over the defaults,
  `qParams.clerps`, `qParams.gridsnap`), `nodes`
- attribution_graph/util-cg.js `formatData`: a node's `node_id`, `feature`, `layer`, `ctx_idx`,
  `feature_type` ('embedding', 'logit', 'mlp reconstruction error', 'cross layer transcoder'),
  `influence` (kept while <= the slider), `clerp` (a logit's `Output "w" (p=0.123)`),
  `metadata.prompt_tokens`, `metadata.transcoder_list`; a link's `source`, `target`, `weight`
- attribution_graph/init-cg-feature-detail.js: a feature's `activation`; with a scan starting
  'custom-', `metadata.transcoder_list[layer]` as the scan its feature file is fetched from
- feature_examples/init-feature-examples*.js, attribution_graph/render-act-histogram.js: a feature
  file (circuit_tracer/frontend/feature_models.py, copied below as FeatureFile)
"""
from __future__ import annotations

import dataclasses
import functools
import http.server
import json
import re
import threading
from pathlib import Path

import pydantic
import pytest
from playwright.sync_api import expect

import bertdemo
from bertdemo.circuits import files
from bertdemo.features import making
from bertdemo.features import stats as statistics
from bertdemo.features.data import Lines
from bertdemo.features.views import feature_card
from tiny_models import tiny_transcoders

VIEWER = Path(__file__).parent / "circuit_tracer_viewer"
SENTENCE = "Paris is the [MASK] of France."
SLUG = "paris-tiny"
PLAIN = "paris-plain"  # the same graph written without the model: no feature files
NOUNS = ["cat", "dog", "man", "woman", "car", "house", "book", "river", "city", "tower"]
LINES = [f"the {a} {n} went to {p} ." for n in NOUNS for a in ("big", "small", "old")
         for p in ("paris", "rome", "london")]
LINES += [f"{city} is the {word} of {land} ." for city, land in (("paris", "france"), ("rome", "italy"),
                                                                 ("london", "england"))
          for word in ("capital", "heart", "pride", "city")]
# what index.html loads from the web, answered from lib/ (None: an empty script)
LIBRARIES = {"d3.js": "d3.min.js", "jetpack_2024-07-20.js": "jetpack_2024-07-20.js", "dagre.js": "dagre.min.js",
             "npy_v0.js": None, "hotserver-client-ws.js": None}
FEATURE_EXAMPLES = re.compile(r"^https://[^/]+/features/bertdemo/\d+\.json$")  # the viewer's CDN, blocked


class Example(pydantic.BaseModel, strict=True):  # circuit_tracer/frontend/feature_models.py at d797c82
    tokens_acts_list: list[float]
    train_token_ind: int
    is_repeated_datapoint: bool
    tokens: list[str]


class ExamplesQuantile(pydantic.BaseModel, strict=True):
    quantile_name: str
    examples: list[Example]


class FeatureFile(pydantic.BaseModel, strict=True):  # its `Model`
    transcoder_id: str
    index: int
    examples_quantiles: list[ExamplesQuantile]
    top_logits: list[str]
    bottom_logits: list[str]
    act_min: float
    act_max: float
    quantile_values: list[float]
    histogram: list[float]
    activation_frequency: float


@pytest.fixture(scope="module")
def coders(tiny_bert):
    """Random transcoders with their statistics (contexts, bands, ...) over LINES, as a card needs."""
    lines = Lines(tiny_bert, LINES)
    return making.finish(tiny_bert, tiny_transcoders(tiny_bert), lines, Lines(tiny_bert, LINES[::3]), quality=False)


@pytest.fixture(scope="module")
def graph(tiny_bert, coders):
    return bertdemo.attribution_graph(tiny_bert, SENTENCE, transcoders=coders)


@pytest.fixture(scope="module")
def folder(graph, tiny_bert, coders, tmp_path_factory):
    """A graph folder: the graph with its feature files (SLUG) and without (PLAIN)."""
    data = tmp_path_factory.mktemp("graph_files")
    files.write_graph_files(graph, data, slug=SLUG, lm=tiny_bert, transcoders=coders)
    files.write_graph_files(graph, data, slug=PLAIN)
    return data


@pytest.fixture(scope="module")
def viewer_url(folder):
    """The viewer and a graph folder, served on 127.0.0.1 as circuit-tracer's local server lays them."""
    data = folder

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


def feature_files(folder: Path, slug: str) -> dict[tuple[int, int], dict]:
    """{(layer, feature): its file} as the graph's metadata points at them, './data/' being `folder`."""
    metadata = json.loads((folder / f"{slug}.json").read_text())["metadata"]
    found = {}
    for layer, scan in enumerate(metadata["transcoder_list"]):
        at = folder / scan.removeprefix("./data/") if scan else None
        for path in at.glob("*.json") if at else ():
            found[layer, int(path.stem)] = json.loads(path.read_text())
    return found


def test_each_feature_of_the_graph_has_a_file_of_circuit_tracers_fields_from_its_card(folder, graph, tiny_bert,
                                                                                      coders):
    metadata = json.loads((folder / f"{SLUG}.json").read_text())["metadata"]
    assert metadata["scan"].startswith("custom-")  # the viewer's sign to read transcoder_list per layer
    assert all(s.startswith("./data/") for s in metadata["transcoder_list"][1:])
    written = feature_files(folder, SLUG)
    used = {(n["layer"], n["feature"]) for n in graph.nodes if n["kind"] == "feature"}
    assert set(written) == used
    assert sum(bool(data["examples_quantiles"]) for data in written.values()) >= len(used) / 2
    for (layer, feature), data in written.items():
        FeatureFile.model_validate(data)
        card = feature_card(tiny_bert, layer, feature, files.LayerStore(coders))
        assert data["index"] == feature and data["transcoder_id"].endswith(f"layer-{layer}")
        assert data["top_logits"] == [w["token"] for w in card["promoted"]]
        assert data["bottom_logits"] == [w["token"] for w in card["suppressed"]]
        assert data["activation_frequency"] == pytest.approx(card["density"])
        assert data["act_max"] == pytest.approx(card["max"]) and len(data["histogram"]) == statistics.BINS
        assert len(data["quantile_values"]) == 100 and data["quantile_values"] == sorted(data["quantile_values"])
        assert data["quantile_values"][-1] == pytest.approx(card["max"], rel=1e-4)
        groups = data["examples_quantiles"]
        if not card["contexts"]:  # it never fired on LINES: nothing to show
            assert groups == []
            continue
        assert groups[0]["quantile_name"] == "Top activations" and len(groups[0]["examples"]) == len(card["contexts"])
        assert sum(len(g["examples"]) for g in groups) == (len(card["contexts"]) + len(card["random_firings"])
                                                            + sum(len(b["examples"]) for b in card["bands"]))
        for example, context in zip(groups[0]["examples"], card["contexts"]):
            assert "".join(example["tokens"]) == context["text"]  # its pieces are the line
            assert len(example["tokens_acts_list"]) == len(example["tokens"])
            at = example["train_token_ind"]
            assert example["tokens"][at].strip() == context["text"][context["start"]:context["end"]]
            assert example["tokens_acts_list"][at] == pytest.approx(context["activation"]) and context["activation"] > 0
    # a layer's feature index is its own: feature 0 of each layer, two files
    nodes = [{**graph.nodes[0], "kind": "feature", "layer": layer, "feature": 0} for layer in sorted(coders)]
    both = files.write_feature_files(tiny_bert, dataclasses.replace(graph, nodes=nodes), coders, folder / "both")
    assert [p.relative_to(folder / "both").as_posix() for p in both] == ["layer-1/0.json", "layer-2/0.json"]
    one, two = (json.loads(p.read_text()) for p in both)
    assert one["transcoder_id"] != two["transcoder_id"] and one["top_logits"] != two["top_logits"]


def test_writing_a_slug_again_replaces_its_feature_files(graph, tiny_bert, coders, tmp_path):
    files.write_graph_files(graph, tmp_path, slug="s", lm=tiny_bert, transcoders=coders)
    stale = tmp_path / "features" / "s" / "layer-1" / "999.json"
    stale.write_text("{}")
    files.write_graph_files(graph, tmp_path, slug="s", lm=tiny_bert, transcoders=coders)
    assert not stale.exists() and feature_files(tmp_path, "s")
    plain = bertdemo.graph_json(graph)["metadata"]  # the page's single JSON: no files, circuit-tracer's defaults
    assert plain["scan"] == "bertdemo" and plain["transcoder_list"] == []


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


def node_centre(page, node_id: str) -> tuple[float, float]:
    return page.evaluate("""id => {
        const box = d3.selectAll('.link-graph text.node').filter(d => d.nodeId == id).node().getBoundingClientRect()
        return [box.x + box.width / 2, box.y + box.height / 2]}""", node_id)


@pytest.mark.browser
def test_circuit_tracers_viewer_draws_our_graph_and_shows_our_labels_and_examples(page, viewer_url, graph, folder,
                                                                                    screenshot):
    data = bertdemo.graph_json(graph, slug=SLUG)
    errors = open_viewer(page, viewer_url + f"?slug={SLUG}&pruningThreshold=1")  # the slider at 1: every node shown
    nodes = page.locator(".link-graph text.node")
    expect(nodes).to_have_count(len(graph.nodes))
    expect(page.locator(".link-graph .prompt-token")).to_have_count(len(graph.tokens))
    expect(page.locator("select.graph-prompt-select")).to_contain_text(SENTENCE)

    written = feature_files(folder, SLUG)
    feature = max((n for n in data["nodes"] if n["feature_type"] == "cross layer transcoder"
                   and written[int(n["layer"]), n["feature"]]["examples_quantiles"]),  # one that fired on LINES
                  key=lambda n: n["influence_share"])
    assert feature["clerp"] == next(n["label"] for n in graph.nodes if n["id"] == feature["node_id"])
    x, y = node_centre(page, feature["node_id"])
    page.mouse.move(x - 15, y - 15)
    page.mouse.move(x, y, steps=4)
    expect(page.locator(".tooltip")).to_have_text(feature["clerp"])
    page.mouse.click(x, y)
    detail = page.locator(".feature-detail")
    expect(detail).to_contain_text(f"Feature L{feature['layer']}/{feature['feature']}")
    expect(detail).to_contain_text(feature["clerp"])
    expect(detail).to_contain_text(f"Act: {feature['activation']:.2f}")
    # the examples panel: the feature's file, its card's contexts with the firing token marked
    shown = written[int(feature["layer"]), feature["feature"]]
    examples = [e for group in shown["examples_quantiles"] for e in group["examples"]]
    panel = detail.locator(".feature-example-list")
    expect(panel.locator(".ctx-container")).to_have_count(len(examples))
    expect(panel.locator(".quantile-title").first).to_have_text("Top activations")
    first = examples[0]
    expect(panel.locator(".ctx-container").first).to_contain_text("".join(first["tokens"]).strip())
    expect(panel.locator(".train_token_ind").first).to_have_text(first["tokens"][first["train_token_ind"]].strip())
    rows = detail.locator(".feature-example-logits .ctx-container")
    expect(rows).to_have_count(2)
    top, bottom = rows.all()  # what it promotes, what it suppresses
    expect(top.locator(".token")).to_have_text(shown["top_logits"])
    expect(bottom.locator(".token")).to_have_text(shown["bottom_logits"])
    expect(detail.locator(".feature-title span")).to_contain_text(f"Freq: {shown['activation_frequency']:.3%}")
    screenshot()
    assert page.blocked == []  # every file it asked for is ours

    # the graph without feature files (the page's single JSON): at its own threshold the slider keeps
    # what circuit-tracer keeps of its own graphs; the panel says the feature failed to load
    page.goto(viewer_url + f"?slug={PLAIN}")
    kept = [n for n in data["nodes"] if n["feature_type"] in ("embedding", "logit")
            or n["influence"] <= graph.node_threshold]
    expect(nodes).to_have_count(len(kept))
    x, y = node_centre(page, feature["node_id"])
    page.mouse.click(x, y)
    expect(detail).to_contain_text(f"Feature {feature['feature']} failed to load")

    assert page.blocked and all(FEATURE_EXAMPLES.match(url) for url in page.blocked), page.blocked
    assert all(e.startswith("Failed to load resource") for e in errors), errors  # only the blocked examples
