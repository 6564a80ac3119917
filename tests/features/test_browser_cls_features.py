"""The Classify tab's "The features this decision rests on" ([CLS] features, `features/cls_features.py`)
in a real browser (Debian's chromium, local requests only), on the Features tab's app (its own
feature store, here also holding a [CLS] dictionary of the tiny BERT made by the test): a classifier
trained from the page, the section opened and run, its line and table drawn, and the table the
service's features for the same classifier trained the same way."""
import pytest
from playwright.sync_api import expect

import bertdemo
from bertdemo.features import cls_features
from bertdemo.features.training import FeatureSettings
from bertdemo.ui.tabs import classify_tab
from test_browser_classify import RUN, fill_settings
from test_browser_classify import open_tab as open_classify
from conftest import broken_header_words
from test_browser_features import features, features_url  # noqa: F401 - its page, shared

pytestmark = pytest.mark.browser
SENTENCE = "the big dog went to rome ."
SHOWN = 8  # the section's default "Features shown": more than the dictionary's k, so every active one
SMALL = FeatureSettings(latents=32, k=4, max_tokens=6_000, max_seconds=30, batch_tokens=32, dead_tokens=500,
                        pause=0.0)


@pytest.fixture(scope="module")
def cls_dictionary(tiny_bert, features):  # noqa: F811 - the shared store, given a [CLS] dictionary
    texts = [text for text, _ in classify_tab.example_rows(classify_tab.FIRST_EXAMPLE)]  # 45 lines
    coded = cls_features.make_cls_features(tiny_bert, texts[::2], texts[1::2], settings=SMALL, corpus="test lines")
    return cls_features.put_cls(features, coded)


def test_the_decision_is_shown_as_the_features_it_rests_on(page, features_url, tiny_bert, cls_dictionary,  # noqa: F811
                                                            screenshot):
    examples = classify_tab.example_rows(classify_tab.FIRST_EXAMPLE)
    classifier, reference = bertdemo.train_classifier(tiny_bert, [tuple(r) for r in examples], **RUN)
    expected = cls_features.classifier_features(classifier, SENTENCE, SHOWN, features=cls_dictionary)
    open_classify(page, features_url)
    fill_settings(page, **RUN)
    page.get_by_role("button", name="Train the classifier").click()
    expect(page.locator("#classify-status")).to_contain_text(f"Done: {reference.planned_steps} steps",
                                                             timeout=60_000)

    page.get_by_text("The features this decision rests on", exact=True).click()  # the folded section
    page.get_by_label("A sentence to classify").fill(SENTENCE)
    page.get_by_role("button", name="Show the features it rests on").click()
    note = page.locator("#classify-why-note")
    expect(note).to_contain_text(f"Decided {expected['label']} at")
    expect(note).to_contain_text("held-out FVU")
    rows = page.locator("#classify-why").get_by_role("row")
    expect(rows).to_have_count(len(expected["features"]) + 1)  # + the header: every active feature, drawn
    for heading in classify_tab.sections.WHY_COLUMNS:
        expect(page.locator("#classify-why").get_by_role("columnheader", name=heading)).to_be_visible()
    width = page.locator("#classify-why").evaluate(
        "e => [e.querySelector('table').getBoundingClientRect().width, e.clientWidth]")
    assert width[0] <= width[1] + 1  # every column within the page: no sideways scroll to the numbers
    assert broken_header_words(page, "#classify-why") == []  # no "fea tur e"
    shown = {int(rows.nth(i).get_by_role("gridcell").first.inner_text())
             for i in range(1, len(expected["features"]) + 1)}
    assert shown == {f["feature"] for f in expected["features"]}  # the same vector's active features
    expect(rows.nth(1)).to_contain_text("→")  # its probability with → without it
    screenshot("classify_cls_features")
