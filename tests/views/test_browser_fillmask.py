"""The fill-mask and About tabs, and the no-model page, in a real browser (Debian's chromium) that
can reach only this machine, driven as a person would: type, click, read what appears."""
import re

import pytest
from playwright.sync_api import expect

import app
import bertdemo
from bertdemo.config import Settings
from bertdemo.ui.parts.model_banner import BUNDLED_BUTTON
from bertdemo.ui.serving import lifecycle

SENTENCE = "Paris is the [MASK] of France."


def block(page, label: str):
    """The Gradio component whose label reads `label`."""
    return page.locator("div.block", has=page.locator("[data-testid='block-label']", has_text=label))


def predict(page, text: str) -> None:
    page.get_by_label("Sentence with [MASK]s").fill(text)
    page.get_by_role("button", name="Predict", exact=True).click()


def test_predict_draws_one_bar_per_prediction(page, app_url, tiny_bert, screenshot):
    page.goto(app_url)
    predict(page, "The [MASK] sat on the [MASK].")
    plot = block(page, "Predictions per mask")
    expect(plot.locator(".barlayer .point")).to_have_count(2 * 5)  # two masks, top-5 each
    expect(plot.get_by_text("[MASK] 2")).to_be_visible()
    for per_mask in bertdemo.fill_mask(tiny_bert, "The [MASK] sat on the [MASK].", 5):
        expect(plot.locator(".ytick text", has_text=per_mask[0]["token"]).first).to_be_visible()
    expect(page.get_by_text("tiny-bert").first).to_be_visible()  # the model line
    best = bertdemo.fill_jointly(tiny_bert, "The [MASK] sat on the [MASK].", 3)[0]["text"]
    expect(page.get_by_text(best, exact=True).filter(visible=True).first).to_be_visible()
    screenshot("fillmask_bars")


def test_a_right_to_left_sentence_is_said_to_be_beyond_what_the_model_reads(page, app_url, tiny_bert, screenshot):
    from bertdemo.views.reading import reading_notice
    from bertdemo.ui.tabs.fillmask_tab import reading_words

    hebrew = "פריז היא [MASK] של צרפת."
    notice = reading_notice(tiny_bert, hebrew)
    assert notice.script == "Hebrew"
    page.goto(app_url)
    predict(page, hebrew)
    expect(block(page, "Predictions per mask").locator(".barlayer .point")).to_have_count(5)  # still predicted
    name = tiny_bert.name.rsplit("/", 1)[-1]
    said = page.locator("p", has_text="reads mostly Latin-script text")
    expect(said).to_have_text(re.sub(r"\*\*", "", reading_words(notice, name)))
    expect(said).to_contain_text("this sentence is in Hebrew script, 0.0% of its vocabulary")
    screenshot("fillmask_right_to_left_notice")
    predict(page, SENTENCE)  # a sentence it reads: the notice goes
    expect(said).to_have_count(0)


def test_clicking_a_word_turns_it_into_a_mask(page, app_url):
    page.goto(app_url)
    page.get_by_label("Sentence with [MASK]s").fill("Paris is the capital of France.")
    words = page.locator("[data-testid='highlighted-text'] .token")
    words.filter(has_text="capital").click()
    expect(page.get_by_label("Sentence with [MASK]s")).to_have_value("Paris is the [MASK] of France.")
    expect(words.filter(has_text="[MASK]")).to_have_count(1)  # the strip shows the new mask


def test_text_without_a_mask_shows_the_error_and_the_page_keeps_working(page, app_url, screenshot):
    page.goto(app_url)
    predict(page, "There is no mask here.")
    toast = page.locator(".toast-body", has_text=re.compile(r"No \[MASK\] in the text"))
    expect(toast).to_be_visible()
    expect(toast).to_have_css("opacity", "1")  # faded in: what a person reads, and the screenshot shows
    screenshot("fillmask_error")
    predict(page, SENTENCE)
    expect(block(page, "Predictions per mask").locator(".barlayer .point")).to_have_count(5)


def test_about_tab_shows_the_formula_and_the_glue_chart(page, app_url, screenshot):
    page.goto(app_url)
    page.get_by_role("tab", name="About").click()
    expect(page.get_by_text("Masked-language modelling in one formula")).to_be_visible()
    expect(page.locator(".katex-display").first).to_be_visible()  # the loss, typeset
    expect(page.locator(".katex").nth(3)).to_be_visible()  # and the inline $M$, $x$, $\\tilde x$
    expect(page.get_by_text(re.compile(r"\$M\$"))).to_have_count(0)  # no raw dollar signs left
    chart = block(page, "GLUE [1] scores")
    expect(chart.locator(".barlayer .point")).to_have_count(4 * 8)  # 4 systems x 8 tasks
    expect(chart.locator(".legendtext", has_text="BERT-large [4]")).to_be_visible()
    expect(page.get_by_text("arXiv:1810.04805")).to_be_visible()  # its sources
    screenshot("about_tab")


@pytest.fixture(scope="module")
def no_model_url():
    """The app started offline with a model it can't fetch."""
    settings = Settings(model="bertdemo-tests/no-such-model", device="cpu", port=None, onnx=False)
    demo = app.build_demo(settings)
    url, _ = lifecycle.serve(demo, settings, block=False)
    yield url
    demo.close()


def test_without_a_model_the_page_says_how_to_fix_and_the_bundled_button_works(page, no_model_url,
                                                                                screenshot):
    page.goto(no_model_url)
    expect(page.get_by_role("heading", name="No model is loaded")).to_be_visible()
    expect(page.get_by_text("python -m bertdemo download").first).to_be_visible()
    screenshot("no_model_banner")
    page.get_by_role("button", name=BUNDLED_BUTTON).click()
    expect(page.locator("#model-banner")).to_contain_text("Serving the bundled model: small and trained offline")
    expect(page.get_by_role("button", name=BUNDLED_BUTTON)).to_be_hidden()
    predict(page, SENTENCE)
    expect(block(page, "Predictions per mask").locator(".barlayer .point")).to_have_count(5)
    expect(page.get_by_text("Model: bundled")).to_be_visible()  # the tab's model line
    screenshot("no_model_bundled_loaded")


def test_compare_shows_both_models_tokens_and_refuses_a_missing_tuned_model(page, app_url, tiny_bert,
                                                                           tiny_bert_dir, screenshot):
    page.goto(app_url)
    page.get_by_label("Sentence with [MASK]s").fill(SENTENCE)
    page.get_by_text("Compare with another model").click()
    page.get_by_role("button", name="Compare", exact=True).click()  # B: your fine-tuned model
    expect(page.get_by_text("No fine-tuned model in this session yet").first).to_be_visible()
    page.get_by_label("Compare with (B)").click()
    page.get_by_role("option", name=tiny_bert_dir.name).click()
    page.get_by_role("button", name="Compare", exact=True).click()
    expect(page.get_by_text(f"A = {tiny_bert_dir.name}, B = {tiny_bert_dir.name}")).to_be_visible()
    table = page.locator("div.block", has=page.get_by_text("Tokens of either top-k"))
    for prediction in bertdemo.fill_mask(tiny_bert, SENTENCE, 5)[0]:
        expect(table.get_by_role("gridcell", name=prediction["token"], exact=True).first).to_be_visible()
    bars = block(page, "Probability under A and B, per mask").last  # not the accordion around it
    expect(bars.locator(".barlayer .point")).to_have_count(2 * 5)  # two models, the same five tokens
    screenshot("fillmask_compare")
