"""End to end in a real browser (Debian's chromium) that can reach only this machine, as for a
viewer with no internet access: the attention tab's bertviz views, heatmaps and export."""
import re

import pytest
from playwright.sync_api import expect

import bertdemo
from bertdemo.config import Settings
from bertdemo.sessions import SessionStore
from bertdemo.ui.tabs import attention_tab
from conftest import launch

EVIL = '<img src=x onerror=alert(1)> "quoted" </iframe><script>alert("x")</script>'


def show_attention(page, url: str, text: str, text_b: str = "", tab: bool = True):
    page.goto(url)
    if tab:
        page.get_by_role("tab", name="Attention").click()
    page.get_by_role("textbox", name=re.compile(r"^Sentence")).fill(text)
    page.get_by_role("textbox", name=re.compile(r"^Second sentence")).fill(text_b)
    page.get_by_role("button", name="Show attention").click()
    return page.frame_locator("#bertviz-view iframe")


def test_attention_tab_renders_bertviz_offline(page, app_url, screenshot):
    frame = show_attention(page, app_url, "Paris is the [MASK] of France.", "Berlin is nice.")
    expect(frame.locator("svg text", has_text=re.compile(r"^paris$")).first).to_be_visible()
    expect(frame.locator("svg text", has_text="[MASK]").first).to_be_visible()
    expect(frame.locator("#filter option")).to_have_text(
        ["All", "Sentence A -> Sentence A", "Sentence B -> Sentence B", "Sentence A -> Sentence B",
         "Sentence B -> Sentence A"])  # the A/B boundary, in bertviz's own filter
    expect(frame.locator("#layer option")).to_have_text(["1", "2"])  # layers as every tab counts them
    expect(page.get_by_text("What [MASK] 1 looked at")).to_be_visible()
    expect(page.locator("#bertviz-view ~ * .js-plotly-plot, .js-plotly-plot").first).to_be_visible()
    screenshot("attention_head_view")

    page.get_by_label("Model view").check()
    expect(frame.locator("svg text", has_text="Heads")).to_be_visible()
    expect(frame.locator("svg text", has_text=re.compile(r"^2$"))).to_have_count(2)  # layer 2 and head 2: from 1
    expect(frame.locator("svg text", has_text=re.compile(r"^0$"))).to_have_count(0)
    assert not [u for u in page.blocked if re.search(r"cdnjs|d3|jquery|require", u)]
    screenshot("attention_model_view")


def test_downloaded_view_works_without_any_server(page, app_url, tmp_path):
    show_attention(page, app_url, "The cat sat on the mat.")
    expect(page.frame_locator("#bertviz-view iframe").locator("svg text").first).to_be_visible()
    with page.expect_download() as download:
        page.get_by_text("Download this view as standalone HTML").click()
    saved = tmp_path / "view.html"
    download.value.save_as(saved)
    page.context.route("**/*", lambda route: route.abort()
                       if not route.request.url.startswith(("file:", "data:")) else route.continue_())
    page.goto(saved.as_uri())
    expect(page.locator("svg text", has_text=re.compile(r"^cat$")).first).to_be_visible()


@pytest.fixture(scope="module")
def real_vocab_url(real_vocab_bert):
    """The attention tab alone, over a model whose vocab keeps `<`, `>`, `/`, `=` and quotes."""
    demo = attention_tab.create_demo(SessionStore(real_vocab_bert), Settings(device="cpu"))
    yield launch(demo)
    demo.close()


def test_user_text_renders_as_text(page, real_vocab_url, real_vocab_bert, screenshot):
    tokens = bertdemo.attention(real_vocab_bert, EVIL).tokens
    frame = show_attention(page, real_vocab_url, EVIL, tab=False)
    left_column = frame.locator("svg text")
    expect(left_column).to_have_count(2 * len(tokens))  # bertviz draws each token left and right
    assert left_column.all_text_contents()[:len(tokens)] == tokens
    expect(frame.locator("img")).to_have_count(0)
    expect(page.locator("g.xtick text", has_text="<").first).to_be_attached()  # plotly tick label
    screenshot("attention_user_markup")
    page.get_by_text("Tokens and the heatmap's numbers (JSON)").click()
    expect(page.get_by_text('"quoted"').first).to_be_visible()  # the JSON, as text
    expect(page.get_by_text('"<"').first).to_be_visible()
    assert page.dialogs == []  # no alert() ran anywhere
