"""`python app.py` with no --model and the Hugging Face Hub out of reach: the page serves the
bundled model, says why and what it is, and fills masks with it; in a real browser."""
import re

import pytest
from playwright.sync_api import expect

from bertdemo import bundled
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
