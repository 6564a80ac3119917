"""One home for checking what people and scripts pass in: numbers, probabilities, text, lengths.

Every check returns the value in its proper type or raises `InputError`, a `ValueError` whose
message says how to fix the input and whose `field` names the input at fault (a form shows the
message beside that field). The service and the UI use these same checks.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

DEFAULT_EXAMPLE = "Paris is the [MASK] of France."


class InputError(ValueError):
    """A ValueError that names the input at fault (`field`: "text", "steps", "learning_rate", ...)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def number(value, name: str, low: float = -math.inf, high: float = math.inf, *,
           open_low: bool = False, field: str | None = None) -> float:
    """`value` as a finite float in [low, high] ((low, high] with `open_low`). Booleans and text
    are refused: a script can send anything, and `float("1e3")` would quietly accept a string."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(field or name, f"The {name} must be a number, got {shown(value)}.")
    value = float(value)
    too_low = value <= low if open_low else value < low
    if not math.isfinite(value) or too_low or value > high:
        bound = f"more than {low:g}" if open_low else f"at least {low:g}"
        upper = f" and at most {high:g}" if math.isfinite(high) else ""
        raise InputError(field or name, f"The {name} must be {bound}{upper}, got {shown(value)}.")
    return value


def whole_number(value, name: str, low: int, high: int, hint: str = "", *,
                 field: str | None = None) -> int:
    """`value` as an int in [low, high]; a float with no fractional part is accepted (gr.Number
    and JSON send 3.0 for 3)."""
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value != int(value) or not low <= value <= high):
        raise InputError(field or name, f"The {name} must be a whole number from {low:,} to "
                                        f"{high:,}{hint}, got {shown(value)}.")
    return int(value)


def probability(value, name: str, *, allow_zero: bool = True, allow_one: bool = True,
                field: str | None = None) -> float:
    """`value` as a float in [0, 1] (ends excluded on request)."""
    p = number(value, name, 0.0, 1.0, field=field)
    if (p == 0 and not allow_zero) or (p == 1 and not allow_one):
        ends = "more than 0" if not allow_zero else "at least 0"
        ends += " and less than 1" if not allow_one else " and at most 1"
        raise InputError(field or name, f"The {name} must be {ends}, got {p:g}.")
    return p


def text(value, name: str = "text", example: str = DEFAULT_EXAMPLE, *,
         field: str | None = None) -> str:
    """A non-empty string, returned unchanged."""
    if not isinstance(value, str) or not value.strip():
        raise InputError(field or name, f"The {name} is empty: type a sentence, e.g. '{example}'")
    return value


def length_at_most(size: int, limit: int, what: str, unit: str = "characters",
                   fix: str = "Shorten it.", *, field: str = "text") -> None:
    """Refuse `size` units past `limit`, saying both numbers and the fix."""
    if size > limit:
        raise InputError(field, f"The {what} has {size:,} {unit}; at most {limit:,} are allowed. {fix}")


def tokens_at_most(length: int, limit: int, model: str, what: str = "text", *,
                   field: str = "text") -> None:
    """Refuse an input of `length` tokens past the `limit` that `model` takes (special tokens
    included): the caller never truncates silently."""
    if length > limit:
        raise InputError(field, f"The {what} is {length:,} tokens long; {model} takes at most "
                                f"{limit:,} tokens (special tokens included). Shorten it.")


def model_name(value) -> str:
    """A hub id or a local folder as a string: a `str` or any `os.PathLike` (as transformers takes)."""
    if isinstance(value, (os.PathLike, Path)):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip():
        raise InputError("model", "No model given: pass a hub id such as 'bert-base-uncased' or a "
                                  "local folder.")
    return value.strip()


def shown(value) -> str:
    """The offending value for a message: short, whatever a script sent. A whole number sent as a
    float (gr.Number and JSON send 100000.0 for 100000) reads as the whole number."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        value = int(value)
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
