"""What every tab shares: turning service errors into messages in the page."""
import functools
import logging

import gradio as gr

log = logging.getLogger("bertdemo")


def friendly_errors(fn):
    """Run a handler; a ValueError becomes `gr.Error` with its message, anything else a short
    generic message (details go to the server log, never to the visitor)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except gr.Error:
            raise
        except ValueError as err:
            raise gr.Error(str(err)) from None
        except Exception:  # noqa: BLE001 - the server must stay up whatever the input
            log.exception("handler %s failed", fn.__name__)
            raise gr.Error("Something went wrong on the server; try a shorter or simpler input.") from None
    return wrapper


def session_id(request: gr.Request | None) -> str | None:
    return getattr(request, "session_hash", None) if request is not None else None
