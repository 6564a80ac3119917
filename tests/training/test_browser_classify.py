"""The Classify tab in a real browser (Debian's chromium) that reaches only this machine, driven as a
person would: the bundled examples in the table, Train, the confusion matrix, new sentences; bad
input gets a message beside its field and the table keeps what was there. What the page shows
is checked against `bertdemo.train_classifier` run the same way."""
import re

import pytest
from playwright.sync_api import expect

import bertdemo
from bertdemo.ui.tabs import classify_tab
from conftest import expect_toast, set_slider

pytestmark = pytest.mark.browser
RUN = dict(epochs=2, learning_rate=1e-3, batch_size=16, seed=0)  # ~6 steps on the tiny model: a second


def open_tab(page, url: str) -> None:
    page.goto(url)
    page.get_by_role("tab", name="Classify").click()
    expect(page.locator("#classify-table")).to_contain_text("The striker scored twice")


def fill_settings(page, epochs, learning_rate, batch_size, seed) -> None:
    page.get_by_label("Epochs").fill(str(epochs))
    page.get_by_label("Learning rate").fill(str(learning_rate))
    set_slider(page, "Batch size", batch_size)
    page.get_by_label("Seed").fill(str(seed))


def test_train_from_the_table_and_read_the_confusion_matrix(page, app_url, tiny_bert, screenshot):
    examples = classify_tab.example_rows(classify_tab.FIRST_EXAMPLE)
    _, reference = bertdemo.train_classifier(tiny_bert, [tuple(r) for r in examples], **RUN)
    open_tab(page, app_url)
    fill_settings(page, **RUN)
    page.get_by_role("button", name="Train the classifier").click()
    status = page.locator("#classify-status")
    expect(status).to_contain_text(f"Done: {reference.planned_steps} steps", timeout=60_000)
    expect(status).to_contain_text(f"on {reference.held_out_size} examples of 3 labels")

    confusion = page.locator("#classify-confusion")
    cells = confusion.locator(".heatmaplayer text, g.textpoint text, text.textpoint")
    expect(cells).to_have_count(9)
    shown = [int(t) for t in cells.all_text_contents()]
    assert sorted(shown) == sorted(sum(reference.confusion, [])), (shown, reference.confusion)
    assert sum(shown) == reference.held_out_size
    expect(confusion.locator(".xtick text")).to_have_text(["sport", "cooking", "space"])

    predictions = page.locator("#classify-predictions")
    expect(predictions.get_by_role("row")).to_have_count(reference.held_out_size + 1)  # + header
    mistakes = [p["text"] for p in reference.predictions if not p["correct"]]
    if mistakes:  # mistakes first, as the service orders them
        expect(predictions.get_by_role("row").nth(1)).to_contain_text(mistakes[0])
    page.get_by_role("textbox", name="Classify new sentences (one per line)").fill("the dog\nparis")
    page.get_by_role("button", name="Classify", exact=True).click()
    expect(page.locator("#classify-result").get_by_role("row")).to_have_count(3)
    screenshot("classify-trained")


def test_bad_input_gets_a_message_beside_the_field_and_the_table_keeps_its_rows(page, app_url, screenshot):
    open_tab(page, app_url)
    table = page.locator("#classify-table")
    table.get_by_role("gridcell", name="The striker scored twice in the second half.").dblclick()
    page.keyboard.press("ControlOrMeta+a")
    page.keyboard.type("A sentence I typed myself.")
    page.keyboard.press("Enter")
    expect(table).to_contain_text("A sentence I typed myself.")
    page.get_by_label("Learning rate").fill("0")
    page.get_by_role("button", name="Train the classifier").click()
    expect(page.get_by_text(re.compile(r"The learning rate must be more than 0"))).to_be_visible()
    expect(table).to_contain_text("A sentence I typed myself.")
    expect(table).to_contain_text("Our goalkeeper saved a penalty in the final minute.")
    page.get_by_role("button", name="Classify", exact=True).click()
    expect_toast(page, "no classifier yet")
    screenshot("classify-bad-input")
