"""The "Inside a prediction" tab in a real browser (Debian's chromium, local requests only):
open each view as a person would and find the sentence's tokens and the model's answers in it."""
import pytest
from playwright.sync_api import expect

import bertdemo

pytestmark = pytest.mark.browser
SENTENCE = "Paris is the [MASK] of France."


def block(page, label: str):
    """The Gradio component whose label reads `label`."""
    return page.locator("div.block", has=page.locator("[data-testid='block-label']", has_text=label))


def open_tab(page, app_url: str, sentence: str) -> None:
    page.goto(app_url)
    page.get_by_role("tab", name="Inside a prediction").click()
    page.get_by_label("Sentence to look inside").fill(sentence)


def test_layer_by_layer_shows_each_layers_top_tokens(page, app_url, tiny_bert, screenshot):
    open_tab(page, app_url, SENTENCE)
    page.get_by_role("button", name="Show predictions after each layer").click()
    heatmap = block(page, "Top tokens after each layer")
    entry = bertdemo.layer_predictions(tiny_bert, SENTENCE, 5)[0]
    for label in entry["layer_names"]:  # embeddings, layer 1, layer 2
        expect(heatmap.locator(".ytick text", has_text=label)).to_be_visible()
    for prediction in entry["layers"][-1]:
        expect(heatmap.locator("text", has_text=prediction["token"]).first).to_be_visible()
    ranks = block(page, "Rank of the final answer after each layer")
    expect(ranks.locator(".scatterlayer .point")).to_have_count(len(entry["layer_names"]))
    expect(page.get_by_text("never trained to be read by the MLM head")).to_be_visible()
    screenshot("explain_layers")


def test_saliency_colours_every_token_beside_the_masks_attention(page, app_url, tiny_bert, screenshot):
    open_tab(page, app_url, SENTENCE)
    page.get_by_label("Explain which word").fill("capitals")
    page.get_by_role("button", name="Explain this mask").click()
    result = bertdemo.saliency(tiny_bert, SENTENCE, target="capitals")
    view = page.locator("#explain-tokens")
    for row in ("attribution", "attention"):
        chips = view.locator(f"[data-row='{row}'] .explain-token")
        expect(chips).to_have_count(len(result["tokens"]))
        for token in ("paris", "france", "[MASK]"):
            expect(chips.filter(has_text=token).first).to_be_visible()
    paris = result["attributions"][result["tokens"].index("paris")]
    expect(view.locator("[data-row='attribution'] .explain-token", has_text="paris")).to_have_attribute(
        "title", f"paris: {paris:+.4f}")
    expect(page.get_by_text("explained for its first piece")).to_be_visible()
    screenshot("explain_saliency")
