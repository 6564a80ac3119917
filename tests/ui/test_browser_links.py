"""A link to any view, in a real browser: a link to the Attention tab opens it with the sentence,
layer and head it names, drawn; "Copy link to this view" gives that link back; a bad value falls
back to the default with a notice, and no markup from a link reaches the page."""
import re
from urllib.parse import parse_qs, urlencode, urlparse

from playwright.sync_api import expect

import bertdemo
from conftest import expect_toast

SENTENCE = "The cat sat on the mat because it was tired."


def heatmap_title(page):
    block = page.locator("div.block", has=page.get_by_test_id("block-label").filter(has_text="Attention heatmap"))
    return block.locator(".gtitle")


def test_a_link_opens_the_attention_tab_drawn_and_copy_link_gives_it_back(page, app_url, screenshot):
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.goto(app_url + "?" + urlencode({"tab": "attention", "sentence": SENTENCE, "layer": 1, "head": 2}))
    expect(page.get_by_role("tab", name="Attention", selected=True)).to_be_visible()
    expect(page.get_by_role("textbox", name=re.compile(r"^Sentence")).first).to_have_value(SENTENCE)
    expect(page.get_by_label("number input for Layer (1 = the first)")).to_have_value("1")
    expect(page.get_by_label("number input for Head (1 = the first)")).to_have_value("2")  # the second head
    expect(heatmap_title(page)).to_have_text("Attention, layer 1, head 2: row attends to column")
    screenshot("link_to_attention")

    page.locator("#copy-link-attention").click()
    shown = page.locator("#link-attention textarea, #link-attention input").first
    expect(shown).to_have_value(re.compile(r"tab=attention"))
    url = shown.input_value()
    assert page.evaluate("navigator.clipboard.readText()") == url
    query = {k: v[0] for k, v in parse_qs(urlparse(url).query).items()}
    assert query == {"tab": "attention", "sentence": SENTENCE, "layer": "1", "head": "2"}
    assert urlparse(url).netloc == urlparse(app_url).netloc


def test_a_bad_value_falls_back_with_a_notice_and_markup_stays_text(page, app_url):
    marked = "<img src=x onerror=alert(1)> [MASK] <b>bold</b>"
    page.goto(app_url + "?" + urlencode({"tab": "fill-mask", "sentence": marked, "top_k": 999,
                                         "<script>": "1"}))
    expect(page.get_by_role("tab", name="Fill mask", selected=True)).to_be_visible()
    expect(page.get_by_role("textbox", name=re.compile(r"^Sentence with")).first).to_have_value(marked)
    expect_toast(page, re.compile(r"top_k: give a whole number from 1 to 50; the default 5 is used"))
    expect(page.get_by_label("number input for Top-k per mask")).to_have_value("5")
    expect_toast(page, re.compile(r"script: not a setting of this tab"))
    assert page.locator("img[src=x]").count() == 0 and page.locator("b", has_text="bold").count() == 0
    assert page.dialogs == []
    page.goto(app_url + "?tab=no-such-tab")
    expect_toast(page, re.compile(r"This link's tab is not one of this app's"))
    expect(page.get_by_role("tab", name="Fill mask", selected=True)).to_be_visible()


def test_a_link_runs_a_corpus_search_and_lists_the_hits_as_text(page, app_url, tiny_bert):
    corpus = "the cat sat on the <b>mat</b>\na dog ran in the park\nthe cat is in paris"
    page.goto(app_url + "?" + urlencode({"tab": "corpus-search", "sentence": "the cat sat", "word": "cat",
                                         "layer": 1, "top_k": 4, "corpus": corpus}))
    expect(page.get_by_role("tab", name="Corpus search", selected=True)).to_be_visible()
    hits = page.locator("#search-hits tbody tr")
    expect(hits).to_have_count(4)
    expected = bertdemo.search_corpus(tiny_bert, "the cat sat", word="cat", layer=1, top_k=4, corpus=corpus)
    for row, hit in zip(range(4), expected["hits"]):
        expect(hits.nth(row).locator("mark")).to_have_text(hit["word"])
        expect(hits.nth(row).locator(".sim")).to_have_text(f"{hit['similarity']:.3f}")
    assert page.locator("#search-hits b").count() == 0  # the corpus' markup shows as text
    expect(page.get_by_text("Searched your corpus: 3 lines")).to_be_visible()


def test_a_fill_mask_example_answers_from_its_cache(page, app_url, tiny_bert):
    page.goto(app_url)
    example = "The Eiffel [MASK] is a famous landmark."
    page.get_by_role("button", name=example).or_(page.get_by_text(example, exact=True)).first.click()
    expect(page.get_by_label("Sentence with [MASK]s")).to_have_value(example)
    plot = page.locator("div.block", has=page.get_by_test_id("block-label").filter(has_text="Predictions per mask"))
    best = bertdemo.fill_mask(tiny_bert, example, 5)[0][0]["token"]
    expect(plot.locator(".ytick text", has_text=best).first).to_be_visible()


def test_copy_link_on_classify_leaves_its_table_out(page, app_url):
    page.goto(app_url + "?tab=classify&epochs=3")
    expect(page.get_by_role("tab", name="Classify", selected=True)).to_be_visible()
    page.locator("#copy-link-classify").click()
    shown = page.locator("#link-classify textarea, #link-classify input").first
    expect(shown).to_have_value(re.compile(r"tab=classify"))
    query = {k: v[0] for k, v in parse_qs(urlparse(shown.input_value()).query).items()}
    assert query == {"tab": "classify", "epochs": "3"}
