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

MASK_SECTION = re.compile(r"^What the \[MASK\] looked at")  # the folded section's own button
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
    expect(plot_block(page, "Attention heatmap").locator(".js-plotly-plot")).to_be_visible()
    screenshot("attention_head_view")

    page.get_by_label("Model view").check()
    expect(frame.locator("svg text", has_text="Heads")).to_be_visible()
    expect(frame.locator("svg text", has_text=re.compile(r"^2$"))).to_have_count(2)  # layer 2 and head 2: from 1
    expect(frame.locator("svg text", has_text=re.compile(r"^0$"))).to_have_count(0)
    assert not [u for u in page.blocked if re.search(r"cdnjs|d3|jquery|require", u)]
    screenshot("attention_model_view")


def plot_block(page, label: str):
    """The block of the chart labelled `label` (Gradio's label above it; not a section around it)."""
    return page.get_by_test_id("block-label").filter(has_text=label).locator(
        "xpath=ancestor::div[contains(concat(' ', @class, ' '), ' block ')][1]")


def test_mask_section_is_drawn_when_opened(page, app_url):
    """What the [MASK] looked at starts folded, its charts not drawn (an answer draws only what the
    visitor sees); opened, they show this answer's mask, and follow the next answer while open."""
    show_attention(page, app_url, "Paris is the [MASK] of France.")
    expect(plot_block(page, "Attention heatmap").locator(".js-plotly-plot")).to_be_visible()
    grid = plot_block(page, "Most-attended token per layer and head")
    expect(grid).to_have_count(0)  # folded: not drawn, not even hidden
    expect(page.locator(".js-plotly-plot").filter(visible=True)).to_have_count(1)  # the heatmap alone
    page.get_by_role("button", name=MASK_SECTION).click()
    expect(grid.locator(".gtitle")).to_have_text("What [MASK] 1 looked at (token with the most weight)")
    expect(grid.locator(".ytick text")).to_have_count(2)  # the tiny model's two layers
    assert sorted(grid.locator(".ytick text").all_text_contents()) == ["1", "2"]
    bars = plot_block(page, "Fill-mask predictions for this mask")
    expect(bars.locator(".js-plotly-plot")).to_be_visible()
    first = bars.locator(".ytick text").all_text_contents()
    page.get_by_role("textbox", name=re.compile(r"^Sentence")).fill("[MASK] is the capital of France.")
    page.get_by_role("button", name="Show attention").click()
    expect(bars.locator(".ytick text")).not_to_have_text(first)  # this answer's mask, drawn while open
    page.get_by_role("button", name=MASK_SECTION).click()
    expect(grid).to_have_count(0)  # folded again: later answers draw nothing there


def test_later_answers_reuse_the_bertviz_frame(page, app_url):
    """One frame for the visit: a later answer (and another view) is drawn in the same document,
    with new content, and the page fetches no script for it."""
    frame = show_attention(page, app_url, "Paris is the [MASK] of France.")
    expect(frame.locator("svg text", has_text=re.compile(r"^paris$")).first).to_be_visible()
    document = next(f for f in page.frames if f.parent_frame is page.main_frame and f.url == "about:srcdoc")
    document.evaluate("window.firstDocument = true")
    fetched = []
    page.on("request", lambda request: fetched.append(request.url) if request.resource_type == "script" else None)
    page.get_by_role("textbox", name=re.compile(r"^Sentence")).fill("The cat sat on the mat.")
    page.get_by_role("button", name="Show attention").click()
    expect(frame.locator("svg text", has_text=re.compile(r"^cat$")).first).to_be_visible()
    expect(frame.locator("svg text", has_text=re.compile(r"^paris$"))).to_have_count(0)
    assert document.evaluate("window.firstDocument") is True, "a new document was built for the answer"
    page.get_by_label("Model view").check()
    expect(frame.locator("svg text", has_text="Heads")).to_be_visible()
    assert document.evaluate("window.firstDocument") is True
    assert page.locator("#bertviz-view iframe").count() == 1
    assert fetched == [], f"a later answer fetched code: {fetched}"


def test_downloaded_view_works_without_any_server(page, app_url, tmp_path):
    show_attention(page, app_url, "The cat sat on the mat.")
    expect(page.frame_locator("#bertviz-view iframe").locator("svg text").first).to_be_visible()
    with page.expect_download() as download:
        page.get_by_text("Download this view as standalone HTML").click()
    saved = tmp_path / "view.html"
    download.value.save_as(saved)
    page.route("**/*", lambda route: route.abort()
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
    expect(page.locator("#attention-numbers")).to_have_count(0)  # the numbers' section is folded: not drawn
    page.get_by_text("Tokens and the heatmap's numbers (JSON)").click()
    expect(page.locator("#attention-numbers")).to_be_visible()
    expect(page.get_by_text('"quoted"').first).to_be_visible()  # the JSON, as text
    expect(page.get_by_text('"<"').first).to_be_visible()
    assert page.dialogs == []  # no alert() ran anywhere
