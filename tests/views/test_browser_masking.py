"""The mask-sampling tab in a real browser (Debian's chromium) that can reach only this machine,
driven as a person would: type a sentence, sample, resample, show the epochs and the law, and
read what appears. What the page shows is checked against `bertdemo.views.masking` itself."""
import re

import pytest
from playwright.sync_api import expect

from bertdemo.views import masking
from bertdemo import plots
from conftest import block, expect_toast, set_slider

SENTENCE = "Paris is the capital of France and Berlin is the capital of Germany."
P = 0.5  # more tokens chosen than at 15%, so one sample shows every outcome


def outcome_color(outcome: str) -> str:
    """The strip's background for `outcome`: its colour from the map, at Gradio's 50% alpha."""
    hex_color = plots.OUTCOME_COLORS[outcome].lstrip("#")
    r, g, b = (int(hex_color[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r}, {g}, {b}, 0.5)"


def open_tab(page, url: str, sentence: str = SENTENCE, p: float = P) -> None:
    page.goto(url)
    page.get_by_role("tab", name="Mask sampling").click()
    page.get_by_role("textbox", name=re.compile(r"^Text")).fill(sentence)
    set_slider(page, "mlm_probability (chosen)", p)


def expect_sample_shown(page, rows: list[dict]) -> None:
    """The strip colours exactly the chosen tokens, each by its outcome; the table's 'model sees'
    row is what the collator fed the model."""
    chosen = [r for r in rows if r["outcome"]]
    coloured = block(page, "Tokens coloured by outcome").locator(".token.highlighted")
    expect(coloured).to_have_text([r["token"] for r in chosen])
    for token, row in zip(coloured.all(), chosen):
        expect(token).to_have_css("background-color", outcome_color(row["outcome"]))
    seen = page.locator("tr", has=page.locator("th", has_text="model sees")).locator("td")
    expect(seen).to_have_text([r["seen"] for r in rows])


def test_sample_colours_the_strip_and_resample_draws_again(page, app_url, tiny_bert, screenshot):
    first = masking.mask_sample(tiny_bert.tokenizer, SENTENCE, 0, P)
    second = masking.mask_sample(tiny_bert.tokenizer, SENTENCE, 1, P)
    assert {r["outcome"] for r in second} >= {"mask", "random", "keep"}  # the sentence shows all three
    assert [r["seen"] for r in first] != [r["seen"] for r in second]

    open_tab(page, app_url)
    page.get_by_role("button", name="Sample", exact=True).click()
    expect_sample_shown(page, first)
    legend = block(page, "Tokens coloured by outcome").get_by_test_id("highlighted-text:category-legend")
    expect(legend).to_have_text(re.compile(r"mask\s*random\s*keep"))

    page.get_by_role("button", name="Resample (seed + 1)").click()
    expect(page.get_by_label("Seed", exact=True)).to_have_value("1")
    expect_sample_shown(page, second)
    screenshot("masking_sample")


def test_epochs_grid_curve_and_law_plot_render(page, app_url, tiny_bert, screenshot):
    epochs = 6
    expected = masking.static_vs_dynamic(tiny_bert.tokenizer, SENTENCE, epochs, 0, P)
    open_tab(page, app_url)
    set_slider(page, "Epochs", epochs)
    page.get_by_role("button", name="Show the epochs").click()

    expect(page.get_by_text(f"After {epochs} epochs, tokens ever chosen")).to_be_visible()
    grid = block(page, "What the model sees each epoch")
    expect(grid.locator(".hm")).to_have_count(2)  # static and dynamic heatmaps, side by side
    expect(grid.locator(".gtitle, .annotation-text")).to_have_text(["static", "dynamic"])
    cells = [seen for mode in ("static", "dynamic") for row in expected[mode]["seen"] for seen in row]
    expect(grid.locator(".hm text")).to_have_text(cells)  # what the model sees, cell by cell
    expect(grid.locator(".hm text").first).to_have_css("font-size", "13px")  # a size one reads
    curve = block(page, "Tokens ever chosen")
    expect(curve.locator(".scatterlayer .trace")).to_have_count(4)  # static/dynamic x measured/theory
    expect(curve.locator(".legendtext", has_text="dynamic, measured")).to_be_visible()
    screenshot("masking_epochs")

    page.get_by_text("The law behind it: many samples").click()
    page.get_by_role("button", name="Sample many times").click()
    law = block(page, "Measured vs configured rates")
    expect(law.locator(".barlayer .point")).to_have_count(4)  # chosen, mask, random, keep
    expect(law.locator(".scatterlayer .point")).to_have_count(4)  # the configured rates
    expect(law.locator(".xtick text")).to_have_text(
        [re.compile(rf"^{name}\(n=[\d,]+\)$") for name in ("chosen", "mask", "random", "keep")])
    expect(page.get_by_role("columnheader", name="95% interval")).to_be_visible()  # the table
    expect(page.get_by_role("row", name=re.compile(rf"^chosen {P} "))).to_be_visible()  # p as typed
    screenshot("masking_law")


def test_replace_probabilities_over_one_show_the_error(page, app_url, tiny_bert, screenshot):
    slider = "random_replace_prob (chosen → random)"
    with pytest.raises(ValueError) as refused:  # 0.8 to [MASK] + 0.3 random: more than all chosen
        masking.mask_sample(tiny_bert.tokenizer, SENTENCE, 0, P, 0.8, 0.3)
    open_tab(page, app_url)
    set_slider(page, slider, 0.3)
    page.get_by_role("button", name="Sample", exact=True).click()
    expect_toast(page, str(refused.value))  # the service's words, which say how to fix it
    screenshot("masking_error")

    set_slider(page, slider, 0.1)  # fixed: the page keeps working
    page.get_by_role("button", name="Sample", exact=True).click()
    expect_sample_shown(page, masking.mask_sample(tiny_bert.tokenizer, SENTENCE, 0, P))
