"""Labelled examples, as the Classify tab and the layer probes take them: read from CSV/TSV text
(`parse_examples`) or the page's table (`table_examples`), checked once (`check_examples`: rows,
labels, caps; InputError naming the row at fault), counted per label, and split into training and
held-out parts by label (`stratified_split`, seeded)."""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass

import torch

from . import validate
from .config import Limits

LABEL_MAX_CHARS = 64
MAX_TOKENS = 128  # of each text, as the classifier and the forgetting measure read it; longer ones are cut
HELD_OUT_SHARE = 0.2
HEADER_TEXT = {"text", "sentence", "example"}  # a first row naming its columns so is a header
HEADER_LABEL = {"label", "class", "category"}


@dataclass
class Split:
    """The stratified split: about 20% of each label held out (at least one), fixed by the seed."""

    train: list[tuple[str, str]]
    held_out: list[tuple[str, str]]


def check_examples(examples, limits: Limits | None = None) -> list[tuple[str, str]]:
    """`examples` as a list of (text, label) string pairs, stripped; raises InputError (field
    "examples") naming the row at fault and how to fix it."""
    limits = limits or Limits()
    if isinstance(examples, (str, bytes)) or not isinstance(examples, (list, tuple)):
        raise validate.InputError("examples", "The examples must be a list of (text, label) pairs.")
    validate.length_at_most(len(examples), limits.max_examples, "table", "examples", "Use fewer examples.",
                            field="examples")
    pairs = [_check_row(i, row) for i, row in enumerate(examples, start=1)]
    validate.length_at_most(sum(len(t) + len(lab) for t, lab in pairs), limits.max_chars,
                            "table", fix="Use fewer or shorter examples.", field="examples")
    _check_label_counts(pairs)
    return pairs


def _check_row(number: int, row) -> tuple[str, str]:
    if isinstance(row, (str, bytes)) or not isinstance(row, (list, tuple)) or len(row) != 2:
        raise validate.InputError("examples", f"Row {number} is not a (text, label) pair: give "
                                              "each example as two cells, its text and its label.")
    text, label = row
    if not isinstance(text, str) or not text.strip():
        raise validate.InputError("examples", f"Row {number} has no text: write a sentence in "
                                              "its text cell, or delete the row.")
    if isinstance(label, int) and not isinstance(label, bool):
        label = str(label)  # a script's 0/1 labels
    if not isinstance(label, str) or not label.strip():
        raise validate.InputError("examples", f"Row {number} has no label: write its class "
                                              "(e.g. 'sport') in the label cell.")
    if len(label.strip()) > LABEL_MAX_CHARS:
        raise validate.InputError("examples", f"Row {number}'s label has {len(label.strip())} "
                                              f"characters; at most {LABEL_MAX_CHARS} are allowed.")
    return text.strip(), label.strip()


def _check_label_counts(pairs: list[tuple[str, str]]) -> None:
    counts = label_counts(pairs)
    if len(counts) < 2:
        have = f"only the label {next(iter(counts))!r}" if counts else "no examples"
        raise validate.InputError("examples", f"The table has {have}: a classifier needs at least "
                                              "two labels, each with two or more examples.")
    single = [label for label, n in counts.items() if n < 2]
    if single:
        raise validate.InputError("examples", "Each label needs at least two examples (one to "
                                              "train on, one to test on); only one has: "
                                              + ", ".join(repr(s) for s in single[:5]) + ".")


def label_counts(pairs: list[tuple[str, str]]) -> dict[str, int]:
    """{label: examples}, labels in order of first appearance (the order of the outputs)."""
    counts: dict[str, int] = {}
    for _, label in pairs:
        counts[label] = counts.get(label, 0) + 1
    return counts


def table_examples(table) -> list:
    """A table's rows as (text, label) pairs, rows left wholly blank dropped (a row added and not
    filled in). Takes what a Gradio Dataframe gives (a list of rows) and what a script sends
    ({"data": rows} or a pandas DataFrame); anything else is returned as it is, for
    `check_examples` to refuse."""
    if hasattr(table, "values") and hasattr(table, "columns"):  # a pandas DataFrame
        table = table.values.tolist()
    if isinstance(table, dict) and "data" in table:
        table = table["data"]
    if not isinstance(table, list):
        return table
    return [tuple(row) if isinstance(row, list) else row for row in table
            if not (isinstance(row, list) and all(cell is None or str(cell).strip() == "" for cell in row))]


def parse_examples(content: str, limits: Limits | None = None) -> list[tuple[str, str]]:
    """Rows of `text,label` (or tab-separated) as (text, label) pairs, unchecked beyond the format.

    A first row naming its columns (text/sentence/example and label/class/category, any order,
    any case) is a header and picks the columns; without one each row is exactly text, label.
    Quote a text that contains the separator: `"Goal, and a win",sport`. Blank lines are skipped.
    """
    limits = limits or Limits()
    if not isinstance(content, str):
        raise validate.InputError("file", "The file must be text: UTF-8 CSV or TSV.")
    # Twice the examples' cap: separators, quotes and a header come on top of texts and labels,
    # which `check_examples` then caps exactly.
    validate.length_at_most(len(content), 2 * limits.max_chars, "file", fix="Upload fewer examples.",
                            field="file")
    content = content.lstrip("\ufeff")  # a BOM from Excel is not part of the first cell
    delimiter = "\t" if "\t" in "\n".join(content.splitlines()[:5]) else ","
    reader = csv.reader(io.StringIO(content), delimiter=delimiter, strict=True)
    try:  # (line number, cells) of each non-blank line
        rows = [(reader.line_num, r) for r in reader if any(cell.strip() for cell in r)]
    except csv.Error as err:
        raise validate.InputError("file", f"The file is not valid CSV ({err}); quote a text that "
                                          'contains commas or quotes: "Goal, and a win",sport') from None
    header = _header_columns(rows[0][1]) if rows else None
    text, label = header or (0, 1)
    rows = rows[1:] if header else rows
    for line, cells in rows:  # with a header extra columns are fine; without, exactly two
        if len(cells) <= max(text, label) or (header is None and len(cells) != 2):
            raise validate.InputError("file", f"Line {line} has {len(cells)} cell(s); write "
                                              "text,label on each line (quote a text with commas).")
    if not rows:
        raise validate.InputError("file", "The file has no examples (a header row only?): write "
                                          "one text,label pair per line.")
    return [(cells[text], cells[label]) for _, cells in rows]


def _header_columns(cells: list[str]) -> tuple[int, int] | None:
    """(text column, label column) if `cells` is a header row naming them, else None."""
    names = [cell.strip().lower() for cell in cells]
    text = next((i for i, n in enumerate(names) if n in HEADER_TEXT), None)
    label = next((i for i, n in enumerate(names) if n in HEADER_LABEL), None)
    return None if text is None or label is None else (text, label)


def stratified_split(examples: list[tuple[str, str]], seed: int = 0) -> Split:
    """About HELD_OUT_SHARE of each label held out (at least one, and at least one left to train
    on), chosen by a generator seeded with `seed`; both parts keep the examples' order."""
    generator = torch.Generator().manual_seed(seed)
    held: set[int] = set()
    for label in label_counts(examples):
        indices = [i for i, (_, lab) in enumerate(examples) if lab == label]
        n_held = min(len(indices) - 1, max(1, round(HELD_OUT_SHARE * len(indices))))
        order = torch.randperm(len(indices), generator=generator).tolist()
        held.update(indices[j] for j in order[:n_held])
    return Split([e for i, e in enumerate(examples) if i not in held],
                 [e for i, e in enumerate(examples) if i in held])
