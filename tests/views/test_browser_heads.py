"""The attention tab's heads, deeper, in a real browser (Debian's chromium, local requests only): the
neuron view and its clicked token, the importance grid whose click switches a head off, and an
export downloaded and read back, each checked against the Python API."""
import csv
import re

from playwright.sync_api import expect

import bertdemo

MASK_SECTION = re.compile(r"^What the \[MASK\] looked at")  # the folded section's own button
SENTENCE = "Paris is the [MASK] of France."


def open_attention(page, url: str) -> None:
    page.goto(url)
    page.get_by_role("tab", name="Attention").click()
    page.get_by_role("textbox", name=re.compile(r"^Sentence")).fill(SENTENCE)


def plot_title(page, label: str):
    """The title of the plotly figure in the block labelled `label`."""
    block = page.locator("div.block", has=page.get_by_test_id("block-label").filter(has_text=label))
    return block.locator(".gtitle")


def test_neuron_view_draws_and_a_clicked_token_becomes_the_query(page, app_url, tiny_bert, screenshot):
    open_attention(page, app_url)
    # the query starts on the sentence's [MASK], the token the tab is about
    expect(page.get_by_role("spinbutton", name=re.compile(r"^Query token"))).to_have_value("4")
    page.get_by_role("button", name="Show the neuron view").click()
    title = plot_title(page, "Neuron view: query, keys")
    expect(title).to_have_text("Layer 1, head 1: the query of token 4, “[MASK]”, against every key")  # the first
    weights = bertdemo.neuron_view(tiny_bert, SENTENCE, layer=0, head=0, token=4)["weights"]
    page.locator("#neuron-tokens .token", has_text="paris").click()
    expect(page.get_by_role("spinbutton", name=re.compile(r"^Query token"))).to_have_value("1")
    expect(title).to_have_text("Layer 1, head 1: the query of token 1, “paris”, against every key")
    weights = bertdemo.neuron_view(tiny_bert, SENTENCE, layer=0, head=0, token=1)["weights"]
    block = page.locator("div.block", has=page.get_by_test_id("block-label").filter(has_text="Neuron view: query"))
    expect(block.locator(".bartext", has_text=f"{max(weights):.2f}").first).to_be_attached()  # the weights' bars
    screenshot("attention_neuron_view")


def test_a_click_on_the_grid_switches_a_head_off_and_the_predictions_change(page, app_url, tiny_bert,
                                                                            screenshot):
    open_attention(page, app_url)
    page.get_by_role("button", name="Compute head importance").click()
    delta = bertdemo.head_importance(tiny_bert, SENTENCE)["delta"]
    grid = page.locator("#head-importance")
    cell = grid.get_by_test_id("cell-1-1")  # the second layer ("layer 2"), its first head (column 0 names the layer)
    expect(grid.get_by_test_id("cell-1-0")).to_have_text("layer 2")
    expect(grid.get_by_role("columnheader", name="head 2")).to_be_visible()  # heads from 1
    expect(grid.get_by_role("columnheader", name="head 0")).to_have_count(0)
    expect(cell).to_have_text(f"{delta[1][0]:+.3f}")
    cell.click()
    heads = page.get_by_role("textbox", name=re.compile(r"^Heads switched off"))
    expect(heads).to_have_value("2:1")
    expect(grid.get_by_test_id("cell-1-1")).to_have_text(f"✕ {delta[1][0]:+.3f}")
    expect(page.get_by_text("1 of 4 heads switched off (2:1)")).to_be_visible()
    expect(page.locator(".legendtext", has_text="1 heads off")).to_be_visible()
    screenshot("attention_head_importance")
    grid.get_by_test_id("cell-1-1").click()  # and on again
    expect(heads).to_have_value("")
    expect(page.get_by_text("Every head is on")).to_be_visible()


def test_an_export_downloads_the_numbers_and_an_image(page, app_url, tiny_bert, tmp_path):
    open_attention(page, app_url)
    page.get_by_role("button", name="Compute head importance").click()
    expect(page.locator("#head-importance").get_by_test_id("cell-0-1")).not_to_have_text("")
    page.get_by_role("button", name="Export the head importance: numbers and image").click()
    for name in ("head-importance.csv", "head-importance.json", "head-importance.png", "head-importance.svg"):
        expect(page.locator(f"a[download='{name}']")).to_be_visible()
    with page.expect_download() as download:
        page.locator("a[download='head-importance.csv']").click()
    saved = tmp_path / "importance.csv"
    download.value.save_as(saved)
    rows = list(csv.reader(saved.open(encoding="utf-8")))
    expected = bertdemo.head_importance(tiny_bert, SENTENCE)["delta"]
    assert rows[0] == ["layer", "head 1", "head 2"]
    assert [[round(float(x), 4) for x in row[1:]] for row in rows[1:]] == \
        [[round(d, 4) for d in row] for row in expected]
    with page.expect_download() as download:
        page.locator("a[download='head-importance.png']").click()
    image = tmp_path / "importance.png"
    download.value.save_as(image)
    assert image.read_bytes()[:4] == b"\x89PNG"


def test_heads_count_from_one_wherever_the_page_shows_them(page, app_url):
    open_attention(page, app_url)
    expect(page.locator("#layers-line")).to_contain_text("Heads are counted as you would: head 1 is a layer's first")
    page.get_by_role("button", name="Show attention").click()
    expect(plot_title(page, "Attention heatmap")).to_have_text("Attention, layer 2, head 1: row attends to column")
    page.get_by_role("button", name=MASK_SECTION).click()  # a folded section
    grid = page.get_by_test_id("block-label").filter(has_text="Most-attended token per layer and head").locator(
        "xpath=ancestor::div[contains(concat(' ', @class, ' '), ' block ')][1]")  # its own block, not the section's
    expect(grid.locator(".xtick text")).to_have_text(["1", "2"])  # the [MASK] grid's heads
    expect(page.get_by_label("number input for Head (1 = the first)")).to_have_value("1")
    expect(page.get_by_label("number input for Neuron view: head (1 = the first)")).to_have_value("1")
    page.get_by_label("Model view").check()
    frame = page.frame_locator("#bertviz-view iframe")
    expect(frame.locator("svg text", has_text="Heads")).to_be_visible()
    expect(frame.locator("svg text", has_text=re.compile(r"^0$"))).to_have_count(0)  # bertviz's labels: 1 and 2
