"""The Features tab in a real browser (Debian's chromium, local requests only), on the whole app
serving the tiny BERT with a feature store of its own (a temp folder) that holds a dictionary of
layer 1: a sentence's features, a feature's card, steering, and training a layer with Stop."""
import re
from urllib.parse import urlencode

import pytest
from playwright.sync_api import expect

import app
import bertdemo
from bertdemo.config import Settings
from bertdemo.features.making import train_features
from bertdemo.features.store import FeatureStore
from bertdemo.features.training import FeatureSettings
from conftest import block, broken_header_words, launch, set_slider
from test_features_tab import CORPUS, MASKED, SENTENCE

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def features(tiny_bert, tmp_path_factory):
    store = FeatureStore(tmp_path_factory.mktemp("browser-features"), shipped=None)
    train_features(tiny_bert, 1, CORPUS, FeatureSettings(max_tokens=3000, batch_tokens=512), store=store)
    return store


@pytest.fixture(scope="module")
def features_url(tiny_bert_dir, features):
    demo = app.build_demo(Settings(model=str(tiny_bert_dir), device="cpu", onnx=False), features=features)
    url = launch(demo)
    yield url
    demo.close()


def open_tab(page, url: str) -> None:
    page.goto(url)
    page.get_by_role("tab", name="Features").click()
    expect(page.locator("#features-available")).to_contain_text("Feature dictionaries of")


def test_a_sentences_features_open_a_card_and_a_feature_steers_the_prediction(
        page, features_url, tiny_bert, features, screenshot):
    open_tab(page, features_url)
    expect(page.locator("#features-available")).to_contain_text("layers 1. Layer 1: 256 features")
    page.locator("#features-sentence textarea").fill(SENTENCE)
    page.get_by_role("button", name="Show the sentence's features").click()
    result = bertdemo.sentence_features(tiny_bert, SENTENCE, 1, 5, features)
    strongest = sorted((f for t in result["per_token"] for f in t["features"]), key=lambda f: -f["activation"])
    rows = page.locator("#features-tokens").get_by_role("row")
    expect(rows.nth(1).get_by_role("gridcell").first).to_have_text(str(strongest[0]["feature"]))  # strongest first
    expect(block(page, "Tokens x features").locator(".ytick text", has_text=result["per_token"][0]["token"]).first
           ).to_be_visible()
    chosen = page.locator("#features-feature input").input_value()  # the example's strongest
    expect(page.locator("#feature-summary")).to_contain_text(f"Feature {chosen} of layer 1")

    second = strongest[1]["feature"]
    rows.nth(2).get_by_role("gridcell").nth(1).click()  # a row opens its feature's card
    expect(page.locator("#features-feature input")).to_have_value(str(second))
    expect(page.locator("#feature-summary")).to_contain_text(f"Feature {second} of layer 1")
    card = bertdemo.feature_card(tiny_bert, 1, second, features)
    marked = (len(card["contexts"]) + sum(len(b["examples"]) for b in card["bands"]) + len(card["random_firings"])
              + len(card["at_mask"]["words"]))  # its top contexts, its bands, random firings and [MASK] words
    expect(page.locator("#feature-contexts mark")).to_have_count(marked)
    if card["bands"]:
        expect(page.locator("#feature-contexts")).to_contain_text("Across its range")
    screenshot("features_card")

    page.locator("#features-masked textarea").fill(MASKED)
    expect(page.locator("#steer-target")).to_contain_text(f"Steers feature {second} of layer 1")  # it names it
    expect(page.locator("#steer-scale")).to_contain_text("0 (as it starts) = switched off, 1 = unchanged")
    page.get_by_role("button", name=f"Steer feature {second}: fill the masks with it changed").click()
    expect(page.locator("#steer-note")).to_contain_text(f"Steered: feature {second} of layer 1")
    expect(page.locator("#steer-note")).to_contain_text("switched off (scale 0: 0 switches it off, 1 leaves it "
                                                        "unchanged")
    expect(block(page, "Before and after steering").locator(".legendtext")).to_have_text(["before", "after steering"])

    page.get_by_role("button", name="Which features made the top word").click()
    behind = bertdemo.prediction_features(tiny_bert, MASKED, 1, 5, 20, features)["masks"][0]["features"]
    why = page.locator("#prediction-features").get_by_role("row")
    expect(why.nth(1).get_by_role("gridcell").first).to_have_text(str(behind[0]["feature"]))
    expect(page.locator("#prediction-features-help")).to_contain_text("percentage points")
    expect(page.locator("#features-feature")).not_to_be_in_viewport()  # the card is a screen above
    why.nth(1).get_by_role("gridcell").nth(2).click()  # a row below the card: its card, brought into view
    expect(page.locator("#feature-summary")).to_contain_text(f"Feature {behind[0]['feature']} of layer 1")
    expect(page.locator("#features-feature")).to_be_in_viewport()




def test_tables_break_headers_between_words_and_the_quality_table_fits_the_page(page, features_url):
    open_tab(page, features_url)
    page.get_by_role("button", name="Show every dictionary's quality").click()
    quality = page.locator("#features-quality")
    expect(quality.get_by_role("row").nth(1).get_by_role("gridcell").first).to_have_text("1")
    expect(page.locator("#features-quality-help")).to_contain_text("unexplained share (FVU): the fraction")
    for heading in ("loss added (nats)", "unexplained share (FVU)", "never fired (dead)", "how it was made"):
        expect(quality.get_by_role("columnheader", name=heading)).to_be_visible()
    assert page.viewport_size["width"] == 1280
    width = quality.evaluate("e => [e.querySelector('table').getBoundingClientRect().width, e.clientWidth]")
    assert width[0] <= width[1] + 1  # within the page: no sideways scroll
    assert page.locator(".features-table").count() >= 8
    assert broken_header_words(page, ".features-table") == []


def test_training_a_layer_shows_live_curves_and_stops_without_keeping(page, features_url, tiny_bert, features):
    open_tab(page, features_url)
    set_slider(page, "Features of layer (0 = embeddings)", 2)
    expect(page.locator("#features-available")).to_contain_text("Layer 2 has none")
    page.get_by_label("Keep the dictionary if I press Stop").uncheck()
    page.get_by_role("button", name="Train features for layer 2").click()
    status = page.locator("#features-status")
    expect(status).to_contain_text(re.compile(r"Step \d+: [\d,]+ tokens, FVU"), timeout=60_000)
    expect(block(page, "FVU and dead latents, live").locator(".legendtext")).to_have_text(
        ["FVU (lower is better)", "dead latents"])
    page.get_by_role("button", name="Stop", exact=True).click()
    expect(page.locator("#features-stopping")).to_contain_text("Stop asked")
    expect(status).to_contain_text("Ended early because you pressed Stop", timeout=60_000)
    expect(status).to_contain_text("was not kept")
    assert features.layers(tiny_bert) == [1]


def test_a_link_opens_the_sentences_features_and_the_cards_feature(page, features_url, tiny_bert, features):
    page.goto(features_url + "?" + urlencode({"tab": "features", "layer": 1, "feature": 5, "sentence": SENTENCE}))
    expect(page.get_by_role("tab", name="Features", selected=True)).to_be_visible()
    result = bertdemo.sentence_features(tiny_bert, SENTENCE, 1, 5, features)
    first = max((f for t in result["per_token"] for f in t["features"]), key=lambda f: f["activation"])
    expect(page.locator("#features-tokens").get_by_role("row").nth(1).get_by_role("gridcell").first).to_have_text(
        str(first["feature"]))  # the strongest first
    expect(page.locator("#feature-summary")).to_contain_text("Feature 5 of layer 1")
