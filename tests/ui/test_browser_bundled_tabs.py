"""The tabs on the bundled model (6 layers, 12 heads), in a real browser (Debian's chromium): the
tables at 1280 px (the `page` fixture's width) show every column, none hidden past the table's
edge; the layer probe's word-order examples show the embeddings well below the best layer."""
import re

import pytest
from playwright.sync_api import expect

import bertdemo
from bertdemo.model import bundled
from bertdemo.config import Settings
from conftest import launch

pytestmark = pytest.mark.skipif(not bundled.available(), reason="the bundled model's files are not there")

# The element's box against the window and every ancestor that clips what overflows it: what a
# person sees without scrolling (a column past a table's edge is cut off, often with no scrollbar).
SHOWN_WHOLE = """el => {
  const box = el.getBoundingClientRect();
  if (box.width === 0 || box.left < 0 || box.right > window.innerWidth + 0.5) return false;
  for (let a = el.parentElement; a; a = a.parentElement) {
    if (getComputedStyle(a).overflowX === 'visible') continue;
    const clip = a.getBoundingClientRect();
    if (box.left < clip.left - 0.5 || box.right > clip.right + 0.5) return false;
  }
  return true;
}"""


def shown_whole(locator) -> bool:
    return locator.evaluate(SHOWN_WHOLE)


@pytest.fixture(scope="module")
def bundled_url():
    import app

    demo = app.build_demo(Settings(model=str(bundled.FOLDER), device="cpu", onnx=False))
    url = launch(demo)
    yield url
    demo.close()


def test_the_head_grids_last_head_is_on_the_page(page, bundled_url, screenshot):
    page.goto(bundled_url)
    page.get_by_role("tab", name="Attention").click()
    page.get_by_role("textbox", name=re.compile(r"^Sentence")).fill("Paris is the [MASK] of France.")
    page.get_by_role("button", name="Compute head importance").click()
    grid = page.locator("#head-importance")
    last_head = grid.get_by_role("columnheader", name="head 12")  # heads counted from 1
    expect(grid.get_by_role("row")).to_have_count(1 + 6)  # a header, then the 6 layers
    assert shown_whole(last_head)
    assert shown_whole(grid.get_by_role("row").last.get_by_role("gridcell").last)  # layer 6, head 12
    grid.scroll_into_view_if_needed()
    screenshot("widths_head_grid")


def test_the_last_neighbour_is_on_the_page(page, bundled_url, screenshot):
    page.goto(bundled_url)
    page.get_by_role("tab", name="Embeddings").click()
    page.get_by_role("button", name="Map the embeddings").click()
    table = page.locator("#embedding-neighbours")
    expect(table.get_by_role("row")).to_have_count(1 + 6)
    assert shown_whole(table.get_by_role("columnheader", name="nearest 3"))
    for row in table.get_by_role("row").all()[1:]:
        assert shown_whole(row.get_by_role("gridcell").last)
    table.scroll_into_view_if_needed()
    screenshot("widths_neighbours")


def test_joint_completions_show_the_filled_words_first_and_the_sentence_whole(page, bundled_url, screenshot):
    paragraph = ("The history of Paris goes back a long way. In the [MASK] century the city grew along the "
                 "river, and its people built walls, churches and markets. Today it is the [MASK] of France "
                 "and one of the most visited cities of the world, known for its museums and its food.")
    page.goto(bundled_url)
    page.get_by_label("Sentence with [MASK]s").fill(paragraph)
    page.get_by_role("button", name="Predict", exact=True).click()
    table = page.locator("#joint-completions")
    headers = table.get_by_role("columnheader")
    expect(headers.first).to_contain_text("filled words")
    expect(table.get_by_role("row")).to_have_count(1 + 3)  # beam size 3
    first = table.get_by_role("row").nth(1).get_by_role("gridcell")
    expect(first.first).to_have_text(re.compile(r"^\s*\w+ \d+%, \w+ \d+%\s*$"))  # the two words and their p
    for cell in (first.first, first.last):
        assert shown_whole(cell)
    assert shown_whole(headers.last)
    screenshot("widths_joint_completions")


def test_the_word_order_examples_show_the_probe_rising_with_depth(page, bundled_url, screenshot):
    from bertdemo.ui.tabs import classify_tab

    page.goto(bundled_url)
    page.get_by_role("tab", name="Classify").click()
    page.get_by_text("Which layer knows your labels?").click()
    page.get_by_role("button", name="Load the word-order examples").click()
    expect(page.get_by_role("gridcell", name="The farmer chased the dog.", exact=True)).to_be_visible()
    page.get_by_role("button", name="Probe every layer").click()
    rows = classify_tab.example_rows(classify_tab.WORD_ORDER)
    result = bertdemo.probe_layers(bertdemo.load(str(bundled.FOLDER), device="cpu"), rows, seed=0)
    best = result["layers"][result["best_layer"]]
    expect(page.locator("#probe-status")).to_contain_text(f"Best: layer {best['layer']}, {best['accuracy']:.0%}")
    expect(page.locator("#probe-status")).not_to_contain_text("Every layer")
    points = page.locator("#probe-chart .scatterlayer .trace").first.locator(".point")
    expect(points).to_have_count(len(result["layers"]))
    page.locator("#probe-chart").scroll_into_view_if_needed()
    screenshot("classify_probe_word_order")


# Every table's headers, tab after tab: Gradio shows an empty table without headers as "1 2 3".
TABLE_HEADERS = """() => [...document.querySelectorAll('table')].filter(t => t.offsetParent !== null).map(t =>
    [...t.querySelectorAll('thead th')].map(h => h.textContent.replace('⋮', '').trim()))"""
CLOSED_SECTIONS = {"Mask sampling": ["The law behind it: many samples", "The article's mask_tokens, side by side"],
                   "Classify": ["Forgetting, measured", "Adapt, then classify"]}


def test_every_empty_table_shows_its_headers(page, bundled_url):
    page.goto(bundled_url)
    seen = {}
    for tab in ["Fill mask", "Attention", "Embeddings", "Mask sampling", "Fine-tune", "Classify"]:
        page.get_by_role("tab", name=tab).click()
        for section in CLOSED_SECTIONS.get(tab, []):
            page.get_by_text(section).first.click()
        expect(page.locator("table").filter(visible=True).first).to_be_visible()
        seen[tab] = page.evaluate(TABLE_HEADERS)
    tables = [headers for found in seen.values() for headers in found]
    assert len(tables) >= 14, seen
    placeholders = [headers for headers in tables if headers and all(re.fullmatch(r"\d+", h) for h in headers if h)]
    assert not placeholders, seen
    assert ["learning rate", "held-out accuracy", "macro-F1", "MLM loss before", "MLM loss after", "steps"] in seen["Classify"]
    assert ["metric", "before", "after"] in seen["Fine-tune"]
