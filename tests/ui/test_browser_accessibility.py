"""The page against axe-core's WCAG 2 A and AA rules, tab by tab, in a real browser (Debian's
chromium). axe-core (axe.min.js, from the PyPI package `axe-playwright-python`, pinned in
requirements-dev.txt) is injected into the page and run on the whole page once each tab is open.
What our code causes must pass; what only Gradio's markup causes is allowed below, rule by rule, at
most the written number of nodes per tab, each with its reason (docs/accessibility.md shows each
with the smallest example). A new rule, or more nodes than allowed, fails."""
import json

import pytest
from axe_playwright_python.base import AXE_FILE_PATH
from playwright.sync_api import expect

import app

WCAG_A_AA = ["wcag2a", "wcag2aa"]

# What only Gradio's markup causes (docs/accessibility.md), with why, and how many nodes each tab has.
GRADIO_CAUSED = {
    "aria-prohibited-attr": "an empty chart (gr.Plot, gr.LinePlot, ... with no figure yet) shows Gradio's "
                            "placeholder <div aria-label='Empty value'>: a div with no role may not carry "
                            "aria-label. `with gr.Blocks(): gr.Plot()` alone shows it.",
    "scrollable-region-focusable": "Gradio's Dataframe scrolls its rows in <div role='none' "
                                   "class='virtual-table-viewport'>, which takes no keyboard focus.",
}
ALLOWED = {  # tab -> rule -> nodes (Gradio 6.31, axe-core 4.12)
    "Fill mask": {"aria-prohibited-attr": 1},
    "Attention": {"aria-prohibited-attr": 4},
    "Inside a prediction": {"aria-prohibited-attr": 2},
    "Embeddings": {"aria-prohibited-attr": 1},
    "Corpus search": {"aria-prohibited-attr": 1},
    "Features": {"aria-prohibited-attr": 6, "scrollable-region-focusable": 2},
    "Circuits": {"aria-prohibited-attr": 2, "scrollable-region-focusable": 1},
    "Mask sampling": {"aria-prohibited-attr": 3},
    "Fine-tune": {"aria-prohibited-attr": 3},
    "Classify": {"aria-prohibited-attr": 3},
    "About": {},
}


def axe(page) -> dict[str, list[str]]:
    """axe-core's violations on the page as it is now: rule id -> the CSS selectors of its nodes."""
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        page.add_script_tag(path=str(AXE_FILE_PATH))
    result = page.evaluate("tags => axe.run(document, {runOnly: {type: 'tag', values: tags}, "
                           "resultTypes: ['violations']})", WCAG_A_AA)
    return {v["id"]: [" ".join(map(str, n["target"])) for n in v["nodes"]] for v in result["violations"]}


def settled(page, tries: int = 10) -> dict[str, list[str]]:
    """axe-core's violations once the page has stopped changing: no update pending (Gradio fades an
    updating component's text) and two runs in a row alike (a tab's load event may start its
    updates, and their fade, just after the check for pending ones)."""
    last = None
    for _ in range(tries):
        page.wait_for_function("!document.querySelector('.pending')")
        found = axe(page)
        if found == last:
            return found
        last = found
    return last


@pytest.fixture(scope="module")
def findings(browser, app_url):
    """Each tab's violations, the page opened once and each tab clicked in turn."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(app_url)
               else route.abort())
    page.goto(app_url)
    found = {}
    for title, _ in app.TABS:
        tab = page.get_by_role("tab", name=title, exact=True).first
        tab.click()
        expect(tab).to_have_attribute("aria-selected", "true")
        expect(page.get_by_role("tabpanel").filter(visible=True).first).to_be_visible()
        found[title] = settled(page)
    context.close()
    return found


@pytest.mark.parametrize("title", [title for title, _ in app.TABS])
def test_each_tab_passes_wcag_a_and_aa_but_for_what_gradio_causes(findings, title):
    found, allowed = findings[title], ALLOWED[title]
    new = {rule: nodes for rule, nodes in found.items() if rule not in allowed}
    assert not new, f"{title}: axe-core finds {json.dumps(new, indent=1)}"
    over = {rule: nodes for rule, nodes in found.items() if len(nodes) > allowed[rule]}
    assert not over, f"{title}: more nodes than Gradio's markup explains ({allowed}): {json.dumps(over, indent=1)}"


def test_every_allowed_rule_has_its_reason():
    assert {rule for rules in ALLOWED.values() for rule in rules} <= set(GRADIO_CAUSED)
    assert set(ALLOWED) == {title for title, _ in app.TABS}
