"""The Embeddings tab and the Classify tab's layer probes in a real browser (Debian's chromium,
local requests only): draw the map of a word in six sentences, and the accuracy-by-layer chart."""
import pytest
from playwright.sync_api import expect

import bertdemo
from bertdemo.ui.tabs import classify_tab, embeddings_tab
from conftest import block

pytestmark = pytest.mark.browser


def test_the_map_draws_one_point_per_occurrence_and_lists_neighbours(page, app_url, tiny_bert, screenshot):
    page.goto(app_url)
    page.get_by_role("tab", name="Embeddings").click()
    page.get_by_role("button", name="Map the embeddings").click()
    lines = embeddings_tab.EXAMPLES["bank"]
    result = bertdemo.embedding_map(tiny_bert, lines, layer=tiny_bert.model.config.num_hidden_layers, word="bank")
    chart = block(page, "Hidden states at the chosen layer")
    expect(chart.locator(".scatterlayer .point")).to_have_count(len(lines))
    expect(chart.locator(".legendtext")).to_have_count(len(lines))  # one colour per sentence
    expect(chart.locator(".xtitle")).to_contain_text(f"PC1 ({result['explained'][0]:.0%} of the variance)")
    table = page.locator("#embedding-neighbours")
    expect(table.get_by_role("row")).to_have_count(len(lines) + 1)  # a header, then a row per point
    expect(table.get_by_role("gridcell", name=embeddings_tab.label(result["points"][0]), exact=True).first
           ).to_be_visible()
    screenshot("embeddings_map")


def test_the_probe_chart_has_a_point_per_layer_and_the_baseline(page, app_url, tiny_bert, screenshot):
    page.goto(app_url)
    page.get_by_role("tab", name="Classify").click()
    page.get_by_text("Which layer knows your labels?").click()
    page.get_by_role("button", name="Probe every layer").click()
    rows = [list(row) for row in classify_tab.example_rows(classify_tab.FIRST_EXAMPLE)]
    result = bertdemo.probe_layers(tiny_bert, rows, seed=0)
    best = result["layers"][result["best_layer"]]
    expect(page.locator("#probe-status")).to_contain_text(f"Best: layer {best['layer']}, {best['accuracy']:.0%}")
    chart = page.locator("#probe-chart")
    expect(chart.locator(".scatterlayer .trace").first.locator(".point")).to_have_count(len(result["layers"]))
    expect(chart.locator(".legendtext", has_text="majority class")).to_be_visible()
    screenshot("classify_probe")
