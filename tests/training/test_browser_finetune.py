"""The fine-tune tab in a real browser (Debian's chromium) that can reach only this machine, driven
as a person would: paste text, press Fine-tune, watch it run to the end, switch the other tabs to
the tuned model. What the page shows is checked against `bertdemo.finetune` run the same way."""
import re
from pathlib import Path

import pytest
from playwright.sync_api import expect

from bertdemo.config import Settings
from bertdemo.views.compare import compare_probes
from bertdemo.training.fine_tuning import default_probes, finetune
from bertdemo.ui.tabs import finetune_tab
from conftest import block, set_slider

TEXT = """Paris is the capital of France.
The Eiffel tower is a famous landmark.
Berlin is the capital of Germany.
London is the capital of England.
Rome is the capital of Italy."""  # 5 lines: one is held out for evaluation
RUN = dict(training_length=8, batch_size=2, block_length=16)  # under a second of training on the tiny model
LIMITS = Settings().limits  # the app's, as `app_url` serves it

# What appears only while the run goes: the live status line and gr.Progress's bar. A run this
# short may show them for less than a retrying assertion takes to look, so the page records them.
RECORD_LIVE = """() => {
  window.shownWhileRunning = new Set();
  new MutationObserver(() => {
    for (const el of document.querySelectorAll('#finetune-status, .progress-text'))
      if (el.innerText.trim()) window.shownWhileRunning.add(el.innerText.trim());
  }).observe(document.body, {subtree: true, childList: true, characterData: true});
}"""


def open_tab(page, url: str) -> None:
    page.goto(url)
    page.get_by_role("tab", name="Fine-tune").click()


def fill_form(page, text: str, training_length: int, batch_size: int, block_length: int) -> None:
    page.get_by_role("textbox", name=re.compile(r"^Your text")).fill(text)
    page.get_by_label("Training length").fill(str(training_length))
    set_slider(page, "Batch size (blocks)", batch_size)
    set_slider(page, "Block length (tokens)", block_length)


def table_row(page, first_cell: str):
    """The cells of the table row whose first cell reads `first_cell`."""
    return page.get_by_role("row").filter(
        has=page.get_by_role("gridcell", name=first_cell, exact=True)).get_by_role("gridcell")


@pytest.fixture(scope="module")
def reference(tiny_bert):
    """The same run through the service: the page must show exactly its numbers."""
    tuned, history = finetune(tiny_bert, TEXT, **RUN)
    probes = default_probes(TEXT)
    return tuned, history, compare_probes(tiny_bert, tuned, probes)


def test_a_short_fine_tune_runs_to_the_end_and_the_tuned_model_reaches_fill_mask(
        page, app_url, tiny_bert, reference, screenshot):
    tuned, history, probe_rows = reference
    open_tab(page, app_url)
    fill_form(page, TEXT, **RUN)
    page.get_by_role("button", name="Suggest probes from my text").click()
    expect(page.get_by_role("textbox", name=re.compile(r"^Probe sentences"))).to_have_value(
        "\n".join(row["probe"] for row in probe_rows))

    page.evaluate(RECORD_LIVE)
    page.get_by_role("button", name="Fine-tune", exact=True).click()
    status = page.locator("#finetune-status")
    expect(status).to_contain_text(f"Done: {RUN['training_length']} steps in", timeout=60_000)
    expect(status).to_contain_text("Evaluated on 1 held-out line(s)")
    shown = page.evaluate("[...window.shownWhileRunning]")
    assert any(re.match(rf"Step \d+/{RUN['training_length']} — loss \d", s) for s in shown), shown
    assert any(re.match(rf"\d+/{RUN['training_length']} steps", s) for s in shown), shown  # the progress bar

    curve = block(page, "Loss and eval accuracy, live")
    expect(curve.locator(".legendtext")).to_have_text(
        ["training loss", "eval loss (fixed masks)", "eval accuracy"])
    eval_loss = curve.locator(".scatterlayer .trace").nth(1)
    expect(eval_loss.locator(".point")).to_have_count(len(history.evals))  # before, during, after

    metrics = finetune_tab._metrics_frame(history)  # the tab's own formatting of the service's run
    for row in metrics.itertuples(index=False):
        expect(table_row(page, row.metric)).to_have_text([row.metric, str(row.before), str(row.after)])
    for row in finetune_tab._probe_frame(probe_rows).itertuples(index=False):
        expect(table_row(page, row.probe)).to_have_text(list(row))
    screenshot("finetune_done")

    page.get_by_role("button", name="Use my tuned model in all tabs").click()
    expect(page.get_by_text("The other tabs use your tuned model")).to_be_visible()
    page.get_by_role("tab", name="Fill mask").click()
    model_line = page.get_by_text(re.compile(r"^Model: "))
    shown_name = Path(tuned.name).name  # a folder goes by its own name: no server path in the page
    expect(model_line).to_have_text(f"Model: {shown_name} on cpu")  # before anything is pressed
    page.get_by_role("button", name="Predict", exact=True).click()
    bars = block(page, "Predictions per mask")
    expect(bars.locator(".barlayer .point")).to_have_count(5)
    expect(model_line).to_have_text(f"Model: {shown_name} on cpu")
    screenshot("finetune_tuned_in_fillmask")


@pytest.mark.parametrize("text, steps, role, field", [
    ("", 8, "textbox", "Your text"),
    (TEXT, LIMITS.max_steps + 1, "spinbutton", "Training length"),
], ids=["empty text", "too many steps"])
def test_bad_input_is_refused_with_its_message_beside_the_field(page, app_url, tiny_bert, screenshot,
                                                                text, steps, role, field):
    with pytest.raises(ValueError) as refused:  # what the service says, word for word
        finetune(tiny_bert, text, training_length=steps, batch_size=2, block_length=16, limits=LIMITS)
    open_tab(page, app_url)
    fill_form(page, text, steps, 2, 16)
    page.get_by_role("button", name="Fine-tune", exact=True).click()
    at_fault = page.get_by_role(role, name=re.compile(f"^{field}"))
    expect(at_fault).to_have_class(re.compile(r"\bvalidation-error\b"))  # outlined in red
    beside = page.locator("label", has=at_fault).locator(".validation-error", has_text=str(refused.value))
    expect(beside).to_be_visible()
    expect(page.locator(".validation-error")).to_have_count(2)  # that field and its message only
    expect(page.locator("#finetune-status")).to_have_text("")  # no run started
    if not text:
        screenshot("finetune_error")


# What the tables held while each run went: the status line and the metrics table's data rows at
# every change of the page, so that a table cleared for a moment is seen however short the run.
RECORD_TABLES = """() => {
  window.tablesSeen = [];
  new MutationObserver(() => {
    const rows = document.querySelectorAll('#finetune-metrics tbody tr, #finetune-probes tbody tr');
    window.tablesSeen.push([document.querySelector('#finetune-status').innerText.trim(), rows.length]);
  }).observe(document.body, {subtree: true, childList: true, characterData: true});
}"""


def test_a_second_fine_tune_clears_the_last_runs_tables_as_it_starts(page, app_url, screenshot):
    open_tab(page, app_url)
    fill_form(page, TEXT, **RUN)
    page.get_by_role("button", name="Fine-tune", exact=True).click()
    status = page.locator("#finetune-status")
    expect(status).to_contain_text("Done:", timeout=60_000)
    metric_rows = page.locator("#finetune-metrics").get_by_role("row")
    expect(metric_rows).to_have_count(5)  # a header and four metrics

    page.evaluate(RECORD_TABLES)
    page.get_by_label("Training length").fill("12")
    page.get_by_role("button", name="Fine-tune", exact=True).click()
    expect(status).to_contain_text("Done: 12 steps in", timeout=60_000)
    seen = page.evaluate("window.tablesSeen")
    # (the last step's line stays while the final tables arrive: steps 1-11 and before only)
    running = [rows for text, rows in seen if re.search(r"Starting…|Evaluating the base|Step ([1-9]|1[01])/12 ", text)]
    assert running and all(rows == 0 for rows in running), seen  # no row of the first run while it ran
    expect(metric_rows).to_have_count(5)
    screenshot("finetune_second_run")


OVERFIT_TEXT = TEXT  # 4 training lines and one held out: 40 steps at 1e-2 learn them by heart
OVERFIT = dict(training_length=40, batch_size=2, block_length=16)


def test_an_overfitting_run_says_so_and_keeps_the_best_steps_model(page, app_url, tiny_bert, screenshot):
    tuned, history = finetune(tiny_bert, OVERFIT_TEXT, learning_rate=1e-2, **OVERFIT)
    best = history.kept
    assert best is not None and best.step < OVERFIT["training_length"]  # the run overfits: held-out loss rose
    open_tab(page, app_url)
    fill_form(page, OVERFIT_TEXT, **OVERFIT)
    page.get_by_label("Learning rate").fill("0.01")
    page.get_by_role("button", name="Suggest probes from my text").click()
    probe_rows = compare_probes(tiny_bert, tuned, default_probes(OVERFIT_TEXT))
    expect(page.get_by_role("textbox", name=re.compile(r"^Probe sentences"))).to_have_value(
        "\n".join(row["probe"] for row in probe_rows))
    expect(page.get_by_role("checkbox", name="Keep the weights of the best evaluation")).to_be_checked()
    page.get_by_role("button", name="Fine-tune", exact=True).click()
    status = page.locator("#finetune-status")
    expect(status).to_contain_text(f"Done: {OVERFIT['training_length']} steps in", timeout=60_000)
    expect(status).to_contain_text(f"Overfitting: held-out loss has risen for")
    expect(status).to_contain_text(f"{best.loss:.3f} at step {best.step}")
    expect(status).to_contain_text(f"Kept the weights of step {best.step}")
    curve = block(page, "Loss and eval accuracy, live")
    expect(curve.locator(".annotation-text", has_text=f"kept: step {best.step}")).to_be_visible()  # on the chart
    kept = f"after (kept: step {best.step})"
    expect(page.locator("#finetune-metrics").get_by_text(kept, exact=True)).to_be_visible()
    expect(page.locator("#finetune-probes").get_by_text(kept, exact=True)).to_be_visible()
    for row in finetune_tab._metrics_frame(history).itertuples(index=False):  # the kept model's scores
        expect(table_row(page, row[0])).to_have_text([str(cell) for cell in row])
    for row in finetune_tab._probe_frame(probe_rows, history).itertuples(index=False):
        expect(table_row(page, row[0])).to_have_text(list(row))
    screenshot("finetune_overfitting_kept")


def test_a_paste_over_the_limit_is_refused_naming_both_lengths(page, app_url, screenshot):
    text = ("Paris is the capital of France and the Seine flows through it.\n" * 500)[:LIMITS.max_chars + 7_249]
    open_tab(page, app_url)
    box = page.get_by_role("textbox", name=re.compile(r"^Your text"))
    box.fill(text)
    expect(box).to_have_value(text)  # the box keeps the whole paste: nothing cut silently
    page.get_by_role("button", name="Fine-tune", exact=True).click()
    message = f"The text has {len(text):,} characters; at most {LIMITS.max_chars:,} are allowed."
    expect(page.locator("label", has=box).locator(".validation-error", has_text=message)).to_be_visible()
    expect(page.locator("#finetune-status")).to_have_text("")  # no run started
    screenshot("finetune_text_over_the_limit")
