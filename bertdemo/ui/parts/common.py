"""What every tab shares: turning service errors into messages in the page, an empty table, a chart,
text escaped for Markdown."""
import contextlib
import functools
import inspect
import logging
import math
import re

import gradio as gr
import pandas as pd
from gradio.components.plot import PlotData

log = logging.getLogger("bertdemo")
# How every tab counts layers and heads (said once above the tabs): the hidden state after the
# embeddings is layer 0, the N-th layer's output layer N; layer N's attention heads are the N-th
# layer's, head 1 its first. The Python API's own `layer` and `head` arguments keep their meaning
# (attention and heads count from 0 there).
FIRST_HEAD = 1  # the page's number of a layer's first head (the views count from 0)
LAYERS_LINE = ("**Layers** are counted the same way on every tab: **0 = the embeddings**, **N = the N-th "
               "layer** (its output; its attention heads). **Heads** are counted as you would: **head 1** is a "
               "layer's first.")
# Two or more /segments not glued to a word, URL or relative path: a path on the server.
_MARKUP = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~])")  # what escape_markdown escapes
_SERVER_PATH = re.compile(r"""(?<![\w.:/~-])(?:/[^\s'"`/<>]+){2,}/?""")


def friendly_errors(fn):
    """Run a handler (plain, generator or async); a ValueError becomes `gr.Error` with its message,
    anything else a short generic message (details go to the server log, never to the visitor).

    The server log gets one line for bad input (it is answered, nothing failed) and the traceback
    only for a real fault; Gradio is told not to print its own for either."""
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def stream(*args, **kwargs):
            with _errors_as_messages(fn):
                yield from fn(*args, **kwargs)
        return stream
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def awaited(*args, **kwargs):
            with _errors_as_messages(fn):
                return await fn(*args, **kwargs)
        return awaited

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with _errors_as_messages(fn):
            return fn(*args, **kwargs)
    return wrapper


@contextlib.contextmanager
def _errors_as_messages(fn):
    try:
        yield
    except gr.Error:
        raise
    except ValueError as err:
        log.info("%s refused its input: %s", fn.__name__, " ".join(str(err).split()))
        raise gr.Error(hide_paths(str(err)), print_exception=False) from None
    except Exception:  # noqa: BLE001 - the server must stay up whatever the input
        log.exception("handler %s failed", fn.__name__)
        raise gr.Error("Something went wrong on the server; try a shorter or simpler input.",
                       print_exception=False) from None


def hide_paths(message: str) -> str:
    """`message` with each absolute path cut to its last part ('/srv/models/bert' -> 'bert'):
    a share link's visitors see which model failed, never where the server keeps it."""
    return _SERVER_PATH.sub(lambda m: m.group(0).rstrip("/").rsplit("/", 1)[-1], message)


def refuse_non_finite_numbers(demo: gr.Blocks) -> None:
    """Make every Number and Slider of `demo` refuse anything but a finite number with a message
    naming the control. The page never sends NaN, inf or text there, but a script can (JSON
    allows NaN and Infinity); Gradio would then fail with no message (a whole-number box rounds
    NaN) or hand NaN to the handler (a slider's range check lets it through). Gradio's own range
    check keeps its message, logged as one line instead of a traceback."""
    for block in demo.blocks.values():
        if isinstance(block, (gr.Number, gr.Slider)):
            block.preprocess = _finite_first(block.preprocess, block.label or "This number")


def _finite_first(preprocess, label: str):
    def refuse(message: str):
        log.info("refused input: %s", message)
        return gr.Error(message, print_exception=False)

    @functools.wraps(preprocess)
    def checked(payload):
        if payload is not None and (isinstance(payload, bool) or not isinstance(payload, (int, float))):
            raise refuse(f"{label}: give a number, not {str(payload)[:40]!r}.")
        if isinstance(payload, float) and not math.isfinite(payload):
            raise refuse(f"{label}: give a finite number, not {payload}.")
        try:
            return preprocess(payload)
        except gr.Error as err:  # Gradio's range check: its message, one log line, no traceback
            raise refuse(err.message) from None
    return checked


def session_id(request: gr.Request | None) -> str | None:
    return getattr(request, "session_hash", None) if request is not None else None


def empty_table(columns) -> pd.DataFrame:
    """A table with its headers and no rows (not Gradio's placeholder "1 2 3"): what a table shows
    before its first answer, and while a run goes (the last run's results are gone)."""
    return pd.DataFrame(columns=list(columns))


def escape_markdown(text) -> str:
    """Text shown as itself in Markdown: its markup characters escaped (a model's name, a word, an error)."""
    return _MARKUP.sub(r"\\\1", str(text))


def plotly_chart(figure_json: str) -> PlotData:
    """A plotly chart already written as JSON (`plots.*_json`) for a `gr.Plot` output: Gradio
    sends it as it is, where a `go.Figure` would be copied and encoded again per request."""
    return PlotData(type="plotly", plot=figure_json)
