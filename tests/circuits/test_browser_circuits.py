"""The Circuits tab in a real browser (Debian's chromium, local requests only), on the whole app
serving the tiny BERT with random transcoders (`tiny_models.tiny_transcoders`, put where the tab
asks for them): the graph drawn, a node's card opened by a click on the drawing, an intervention,
and a link reopened with its sentence, threshold, nodes and named groups."""
import re
from urllib.parse import urlencode

import pytest
from playwright.sync_api import expect

import app
import bertdemo
from bertdemo.config import Settings
from bertdemo.ui.tabs import circuits_tab
from conftest import block, broken_header_words, launch
from tiny_models import tiny_transcoders

pytestmark = pytest.mark.browser
SENTENCE = "Paris is the [MASK] of France."
FEATURE = "rgb(245, 158, 11)"  # drawing.STYLE's feature colour, as the browser writes it


@pytest.fixture(scope="module")
def coders(tiny_bert):
    return tiny_transcoders(tiny_bert)


@pytest.fixture(scope="module")
def circuits_url(tiny_bert_dir, coders):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(circuits_tab, "transcoders", lambda holder, lm: coders)
        demo = app.build_demo(Settings(model=str(tiny_bert_dir), device="cpu", onnx=False))
        url = launch(demo)
        yield url
        demo.close()


@pytest.fixture(scope="module")
def graph(tiny_bert, coders):
    return bertdemo.attribution_graph(tiny_bert, SENTENCE, transcoders=coders)


def draw(page, url: str) -> None:
    page.goto(url)
    page.get_by_role("tab", name="Circuits").click()
    expect(page.locator("#circuits-available")).to_contain_text("Transcoders of layers 1-2")
    page.locator("#circuits-sentence textarea").fill(SENTENCE)
    page.get_by_role("button", name="Draw the graph").click()
    expect(page.locator("#circuit-scores")).to_contain_text("Replacement score")


def test_the_graph_is_drawn_and_a_click_on_a_node_opens_its_card_and_heads(page, circuits_url, graph, screenshot):
    draw(page, circuits_url)
    plot = block(page, "Attribution graph")
    expect(plot.locator(".legendtext")).to_contain_text(["token (embedding)", "transcoder feature",
                                                         "logit (a predicted word)"])
    expect(plot.locator(".xtick text", has_text="[MASK]")).to_be_visible()
    first = sorted((n for n in graph.nodes if n["kind"] != "logit"), key=lambda n: -n["influence"])[0]
    expect(page.locator("#circuit-nodes").get_by_role("row").nth(1).get_by_role("gridcell").first).to_have_text(
        first["id"])
    assert broken_header_words(page, "#circuit-nodes") == []  # the page's style: no "influenc e"
    screenshot("circuits_graph")

    points = plot.locator(f"path.point[style*='{FEATURE}']")
    expect(points.first).to_be_attached()
    page.locator("#circuit-graph").scroll_into_view_if_needed()
    points.last.click(force=True)  # plotly's own layer over the points takes the click, as a visitor's
    node = page.locator("#circuit-node textarea, #circuit-node input").first
    expect(node).to_have_value(re.compile(r"^\d+_\d+_\d+$"))
    clicked = graph.node(node.input_value())
    assert clicked["kind"] == "feature"
    expect(page.locator("#circuit-card")).to_contain_text(f"Feature {clicked['feature']} of layer {clicked['layer']}")
    expect(page.locator("#circuit-heads-note")).to_contain_text("strongest kept edge from another position")
    expect(page.locator("#circuit-heads").get_by_role("row")).to_have_count(3)  # the header and 2 heads
    screenshot("circuits_card")


def test_an_intervention_shows_before_and_after_beside_the_graphs_prediction(page, circuits_url, graph, screenshot):
    draw(page, circuits_url)
    features = [n["id"] for n in graph.nodes if n["kind"] == "feature"][:2]
    page.locator("#circuit-intervene-nodes textarea, #circuit-intervene-nodes input").first.fill(", ".join(features))
    page.get_by_role("button", name="Apply").click()
    expect(page.locator("#circuit-intervention-note")).to_contain_text("2 node(s) switched off in the real model")
    logits = [n for n in graph.nodes if n["kind"] == "logit"]
    expect(page.locator("#circuit-intervention").get_by_role("row")).to_have_count(len(logits) + 1)
    expect(block(page, "probability before and after").locator(".legendtext")).to_have_text(["before", "after"])
    screenshot("circuits_intervention")


def test_a_link_reopens_the_graph_its_threshold_and_its_intervention(page, circuits_url, graph):
    feature = next(n["id"] for n in graph.nodes if n["kind"] == "feature")
    query = {"tab": "circuits", "sentence": SENTENCE, "node_threshold": 0.6, "nodes": "mine",
             "supernodes": f"mine: {feature}"}
    page.goto(circuits_url + "?" + urlencode(query))
    expect(page.get_by_role("tab", name="Circuits", selected=True)).to_be_visible()
    expect(page.locator("#circuit-scores")).to_contain_text("thresholds 0.6 / 0.98")
    expect(page.locator("#circuit-intervention-note")).to_contain_text("1 node(s) (groups: mine) switched off")
    page.locator("#copy-link-circuits").click()
    copied = page.locator("#link-circuits textarea, #link-circuits input").first
    expect(copied).to_have_value(re.compile(r"tab=circuits.*node_threshold=0\.6"))
    link = copied.input_value()
    assert "supernodes=mine" in link and "nodes=mine" in link
    page.goto(link)
    expect(page.locator("#circuit-scores")).to_contain_text("thresholds 0.6 / 0.98")
    expect(page.locator("#circuit-intervention-note")).to_contain_text("(groups: mine) switched off")
