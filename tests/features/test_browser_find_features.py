"""The Features tab's "Find a feature" in a real browser (Debian's chromium, local requests only), on
the whole app serving the tiny BERT with a dictionary of layer 1 trained here: a search by word and
by label, a found row opening its card with its similar features, bad input said, and the layer's
map, where a click on a point opens that feature's card."""
import re
from urllib.parse import urlencode

import numpy as np
import pytest
from playwright.sync_api import expect

import bertdemo
from conftest import expect_toast
from test_browser_features import features, features_url, open_tab  # noqa: F401 - its page, shared

pytestmark = pytest.mark.browser
WORD = "river"


def cells(page, table: str, row: int):
    return page.locator(f"#{table}").get_by_role("row").nth(row).get_by_role("gridcell")


def settled_centre(page, locator, tries: int = 40) -> tuple[float, float]:
    """The centre of `locator`'s box once two reads 250 ms apart agree."""
    last = None
    for _ in range(tries):
        box = locator.bounding_box()
        if box is not None and box == last:
            return box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
        last = box
        page.wait_for_timeout(250)
    raise AssertionError(f"the point never held still: last box {last}")


def test_a_word_finds_features_by_lift_and_a_row_opens_its_card(page, features_url, tiny_bert, features, screenshot):
    open_tab(page, features_url)
    page.locator("#features-query").get_by_role("textbox").fill(WORD)
    page.get_by_role("button", name="Find features").click()
    found = bertdemo.features_for_word(tiny_bert, WORD, 1, 10, features)
    expect(page.locator("#features-found-note")).to_contain_text(f"'{WORD}' occurs {found['occurrences']:,} times")
    first = found["features"][0]
    expect(cells(page, "features-found", 1).first).to_have_text(str(first["feature"]))
    expect(page.locator("#features-found").get_by_role("row")).to_have_count(len(found["features"]) + 1)
    cells(page, "features-found", 1).nth(1).click()  # a found row opens its card, with its similar features
    expect(page.locator("#feature-summary")).to_contain_text(f"Feature {first['feature']} of layer 1")
    nearest = bertdemo.similar_features(tiny_bert, 1, first["feature"], 8, features)["features"][0]
    expect(cells(page, "feature-similar", 1).first).to_have_text(str(nearest["feature"]))
    screenshot("features_found_by_word")

    page.get_by_text("by label", exact=True).click()
    page.locator("#features-query").get_by_role("textbox").fill("zzzq")  # no label holds it: the nearest, said
    page.get_by_role("button", name="Find features").click()
    expect(page.locator("#features-found-note")).to_contain_text("No label of layer 1 holds 'zzzq'")

    page.get_by_text("by word", exact=True).click()
    page.locator("#features-query").get_by_role("textbox").fill("unbelievable")  # not one piece of the vocabulary
    page.get_by_role("button", name="Find features").click()
    expect_toast(page, re.compile(r"splits into 'un', '##believ', '##able'"))


def test_the_map_is_drawn_and_a_click_on_a_point_opens_its_card(page, features_url, tiny_bert, features, screenshot):
    open_tab(page, features_url)
    page.get_by_role("button", name="Draw the map of this layer's features").click()
    note = page.locator("#features-map-note")
    expect(note).to_contain_text("Click a point for its card", timeout=120_000)  # UMAP's first run compiles
    points = page.locator("#features-map path.point")
    expect(points).to_have_count(features.get(tiny_bert, 1).latents)
    layout = bertdemo.feature_map(tiny_bert, 1, features)  # read from the disk cache, as the page drew it
    xy = np.stack([layout["x"], layout["y"]], 1)
    gaps = np.linalg.norm(xy[:, None] - xy[None], axis=-1) + np.eye(len(xy)) * 1e9
    picked = int(gaps.min(1).argmax())  # the point farthest from any other: a click there is on it alone
    # plotly draws the points in the data's order; its own layer over them takes the click, as a visitor's.
    # The chart may still be settling (a redraw at its final size): aim once its box holds still, and
    # click once plotly's hover names the picked feature.
    points.nth(picked).scroll_into_view_if_needed()
    centre = settled_centre(page, points.nth(picked))
    page.mouse.move(*centre)
    expect(page.locator("#features-map .hoverlayer")).to_contain_text(f"feature {picked}:")
    page.mouse.down()
    page.mouse.up()
    expect(page.locator("#features-feature input")).to_have_value(str(picked))
    expect(page.locator("#feature-summary")).to_contain_text(f"Feature {picked} of layer 1")
    screenshot("features_map")

    page.get_by_role("button", name="Draw the map of this layer's features").click()  # again: read from disk
    expect(note).to_contain_text("read from the disk cache")


def test_a_link_runs_its_search(page, features_url, tiny_bert, features):
    page.goto(features_url + "?" + urlencode({"tab": "features", "layer": 1, "query": WORD, "by": "word"}))
    expect(page.get_by_role("tab", name="Features", selected=True)).to_be_visible()
    first = bertdemo.features_for_word(tiny_bert, WORD, 1, 5, features)["features"][0]
    expect(cells(page, "features-found", 1).first).to_have_text(str(first["feature"]), timeout=30_000)
    expect(page.locator("#features-query").get_by_role("textbox")).to_have_value(WORD)
