"""`python app.py` with no --model and the Hugging Face Hub out of reach: the page serves the
bundled model, says why and what it is, and fills masks with it; in a real browser."""
import re

import pytest
from playwright.sync_api import expect

from bertdemo.model import bundled
from hub_server import hub_env
from test_hub import free_port, start_app, stop

pytestmark = pytest.mark.skipif(not bundled.available(), reason="the bundled model's files are not there")


@pytest.fixture(scope="module")
def offline_url(tmp_path_factory):
    """The app started with no --model, its hub address a port where nothing listens."""
    unreachable = f"http://127.0.0.1:{free_port()}"
    env = {k: v for k, v in hub_env(unreachable, tmp_path_factory.mktemp("hf-home")).items()
           if not k.startswith("BERTDEMO_")}
    proc, url = start_app([], env)
    yield url
    stop(proc)


def test_with_the_hub_out_of_reach_the_page_serves_the_bundled_model_and_says_why(page, offline_url, screenshot):
    page.goto(offline_url)
    banner = page.locator("#model-banner")
    expect(banner).to_contain_text("Serving the bundled model")
    expect(banner).to_contain_text("bert-base-uncased could not be loaded")
    expect(banner).to_contain_text(re.compile("far below bert-base-uncased", re.IGNORECASE))
    expect(page.get_by_text("Model: bundled").first).to_be_visible()  # the tab's model line
    page.get_by_label("Sentence with [MASK]s").fill("The [MASK] barked at the cat.")
    page.get_by_role("button", name="Predict", exact=True).click()
    bars = page.locator("div.block", has=page.locator("[data-testid='block-label']",
                                                      has_text="Predictions per mask"))
    expect(bars.locator(".barlayer .point")).to_have_count(5)
    expect(bars.locator(".ytick text", has_text=re.compile(r"^dog$"))).to_be_visible()
    expect(page.get_by_text("MLM head not in the checkpoint")).to_have_count(0)  # no untrained-head warning
    screenshot("bundled_served_offline")


LINE_TOPS = """banner => {
    // the distinct lines of the banner's text outside its <details>, as laid out in the page
    const tops = [], walker = document.createTreeWalker(banner, NodeFilter.SHOW_TEXT);
    while (walker.nextNode()) {
        const node = walker.currentNode;
        if (!node.textContent.trim() || node.parentElement.closest("details")) continue;
        const range = document.createRange();
        range.selectNodeContents(node);
        for (const rect of range.getClientRects()) if (rect.width > 0) tops.push(rect.top);
    }
    tops.sort((a, b) => a - b);
    return tops.filter((top, i) => i === 0 || top - tops[i - 1] > 8).length;
}"""


def test_the_banner_is_two_lines_with_the_hubs_error_whole_in_a_closed_accordion(page, offline_url, screenshot):
    page.goto(offline_url)
    banner = page.locator("#model-banner")
    expect(banner).to_contain_text("Serving the bundled model, not bert-base-uncased: the Hugging Face Hub did not answer")
    expect(banner).to_contain_text("start the app with --model")
    assert banner.evaluate(LINE_TOPS) <= 2  # what is served, why, how to change it
    accordion = banner.locator("details")
    expect(accordion).to_have_count(1)
    assert accordion.evaluate("d => d.open") is False
    cause = accordion.get_by_text("bert-base-uncased could not be loaded:")
    expect(cause).to_be_hidden()
    screenshot("bundled_banner_closed")
    accordion.locator("summary").click()
    expect(cause).to_be_visible()
    text = accordion.inner_text()  # the hub's error, whole: its first words to its last
    assert "We couldn't connect to" in text and "the hub did not answer" in text
    assert "(save_pretrained output)." in text
    expect(accordion).to_contain_text(re.compile("far below bert-base-uncased", re.IGNORECASE))
    screenshot("bundled_banner_open")
