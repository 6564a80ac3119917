"""Gradio keeps, for every session, a copy of each value its events sent to the page
(`SessionState.config_values`, read only by `/gradio_api/deep_link` to build a deep link). This
page offers no deep links, yet that copy made an idle visitor of the attention tab cost ~31 MB
(a 500-token heatmap, its numbers and the bertviz view), kept until 10,000 later sessions push it
out. `forget_sent_values(demo)` makes each new session keep its components' configuration only.

Gradio has no option for this, so it is done here, in one place, on two names of Gradio 6's
state_holder (`StateHolder.session_data`, `SessionState._update_value_in_config`); the test
tests/test_isolation.py::test_an_idle_session_keeps_no_copy_of_what_it_was_sent fails if they change.
"""
from __future__ import annotations

from collections import OrderedDict

import gradio as gr


def forget_sent_values(demo: gr.Blocks) -> None:
    """Make every session that `demo` (launched) opens from now on keep no copy of sent values."""
    holder = demo.state_holder
    if not isinstance(holder.session_data, SessionsWithoutSentValues):
        holder.session_data = SessionsWithoutSentValues(holder.session_data)


class SessionsWithoutSentValues(OrderedDict):
    """Gradio's table of sessions; each session put in it records no value sent to its page."""

    def __setitem__(self, session_hash, state) -> None:
        state._update_value_in_config = _record_nothing
        super().__setitem__(session_hash, state)


def _record_nothing(key: int, value) -> None:
    """Stands in for SessionState._update_value_in_config: the value sent is not kept."""
