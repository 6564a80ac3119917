"""The page's own code in a real browser (Debian's chromium): the chart code (Gradio's plotly.js
module) is fetched and run while the visitor reads, before any click, asking nothing of the server;
the first Predict then fetches no code and draws the right chart. Behaviour, not time: the times
are `bench/bench_page.py`'s."""
import json
import urllib.request

from playwright.sync_api import expect

import bertdemo
from bertdemo.ui.parts.preload import ELEM_ID
from conftest import block

SENTENCE = "The [MASK] sat on the [MASK]."


def test_the_chart_code_is_fetched_before_the_first_click_and_the_first_predict_draws_its_chart(
        page, app_url, tiny_bert, screenshot):
    requests = []
    page.on("request", lambda request: requests.append(request))
    page.goto(app_url)
    expect(page.get_by_role("tab", name="Attention")).to_be_visible()
    # The hidden chart has been drawn by Gradio's own Plot: plotly.js is loaded and has run, with no click.
    expect(page.locator(f"#{ELEM_ID} .js-plotly-plot .main-svg").first).to_be_attached()
    expect(page.locator(f"#{ELEM_ID}")).to_be_hidden()  # and the visitor does not see it
    preload = preload_event(app_url)
    assert not preload["backend_fn"]  # JavaScript alone: the server computes nothing for it
    asked = [json.loads(r.post_data).get("fn_index") for r in requests if r.method == "POST" and r.post_data
             and ("/queue/join" in r.url or "/run/" in r.url)]
    assert preload["id"] not in asked
    scripts_before = {r.url for r in requests if r.resource_type == "script"}

    page.get_by_label("Sentence with [MASK]s").fill(SENTENCE)
    clicked = len(requests)
    page.get_by_role("button", name="Predict", exact=True).click()
    plot = block(page, "Predictions per mask")
    expect(plot.locator(".barlayer .point")).to_have_count(2 * 5)  # two masks, top-5 each
    for per_mask in bertdemo.fill_mask(tiny_bert, SENTENCE, 5):
        expect(plot.locator(".ytick text", has_text=per_mask[0]["token"]).first).to_be_visible()
    new_scripts = [r.url for r in requests[clicked:] if r.resource_type == "script" and r.url not in scripts_before]
    assert new_scripts == [], f"the first Predict fetched code: {new_scripts}"
    screenshot("first_predict_after_preload")

    # A new figure is drawn once: Gradio's Plot would draw it into the chart it is about to
    # replace and again into the new one (preload.ONE_DRAW_JS skips the first)
    chart = plot.locator(".js-plotly-plot").first.evaluate("chart => (chart.closest('[id]') || {}).id || ''")
    drawn = lambda: page.evaluate("(key) => (window.__bertdemoDrawn || {})[key] || 0", chart)
    before = drawn()
    assert before >= 1
    page.get_by_label("Sentence with [MASK]s").fill("Paris is the [MASK] of France.")
    page.get_by_role("button", name="Predict", exact=True).click()
    expect(plot.locator(".barlayer .point")).to_have_count(5)
    expect(plot.locator(".ytick text", has_text=bertdemo.fill_mask(tiny_bert, "Paris is the [MASK] of France.", 5)[0][0]["token"]).first).to_be_visible()
    page.wait_for_timeout(300)  # a second drawing, were there one, would come within a frame or two
    assert drawn() == before + 1, f"the new figure was drawn {drawn() - before} times"


def preload_event(url: str) -> dict:
    """The page's event that gives the hidden chart its figure (from the app's config)."""
    with urllib.request.urlopen(f"{url}config") as response:
        config = json.load(response)
    chart = next(c["id"] for c in config["components"] if c.get("props", {}).get("elem_id") == ELEM_ID)
    return next(d for d in config["dependencies"] if chart in d["outputs"])


def test_the_pages_fonts_come_from_the_app_whole(page, app_url):
    """Offline the page looks as online: every font is served by the app itself (none from Google),
    and each face holds every letter, so bold text never falls back letter by letter (Gradio's own
    SemiBold files hold 55 glyphs: "ʙERT" in a bold heading)."""
    import io
    import string

    from fontTools.ttLib import TTFont

    page.goto(app_url)
    expect(page.get_by_role("heading", name="bertdemo")).to_be_visible()
    loaded = ("[...document.fonts].filter(f => f.status === 'loaded' && !f.family.startsWith('KaTeX'))"
              ".map(f => f.family + ' ' + f.weight).sort()")
    page.wait_for_function(f"{loaded}.length >= 4")  # a face loads when text first uses it
    assert page.evaluate(loaded) == ["IBM Plex Mono 400", "IBM Plex Mono 700", "Source Sans Pro 400",
                                     "Source Sans Pro 700"]
    assert not [url for url in page.blocked if "font" in url]  # nothing asked of Google
    served = page.evaluate("[...new Set(performance.getEntriesByType('resource').map(e => e.name)"
                           ".filter(url => url.includes('/static/fonts/')))]")
    assert len(served) == 4 and all(url.startswith(app_url) for url in served), served
    for url in served:
        with urllib.request.urlopen(url) as answer:
            glyphs = TTFont(io.BytesIO(answer.read())).getBestCmap()
        assert not [c for c in string.ascii_letters + string.digits if ord(c) not in glyphs], url
