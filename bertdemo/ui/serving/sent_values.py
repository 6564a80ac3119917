"""Gradio keeps, for every session, a configuration of each of the page's components plus a copy of
each value its events sent (`SessionState.config_values`), read only by `/gradio_api/deep_link` to
build a deep link. This page offers no deep links, yet that copy cost every visitor ~20 ms of CPU
when their session opened (255 components' configurations, JSON schemas included: 75% of the
server's Python time under a crowd of new visitors) and, once they had viewed the attention of a
500-token sentence, ~31 MB kept until 10,000 later sessions pushed it out.
`forget_sent_values(demo)` makes the sessions of a launched app keep neither.

Gradio has no option for this, so it is done here, in one place, on four names of Gradio 6's
state_holder (`StateHolder.__getitem__`, `SessionState.__init__`, and the two `_update_*config`
methods); tests/serving/test_isolation.py::test_an_idle_session_keeps_no_copy_of_what_it_was_sent fails
if they change.
"""
from __future__ import annotations

from types import SimpleNamespace

import gradio as gr
from gradio.state_holder import SessionState, StateHolder


def forget_sent_values(demo: gr.Blocks) -> None:
    """Make every session that `demo` (launched) opens from now on keep no deep-link copies."""
    # In place (`__class__` assignment: the subclass adds no fields), so that every reference
    # Gradio holds to the app's state holder sees the change.
    demo.state_holder.__class__ = HolderOfLeanSessions


class HolderOfLeanSessions(StateHolder):
    """Gradio's table of sessions, opening each session as a `SessionWithoutSentValues`."""

    def __getitem__(self, session_id: str) -> SessionState:
        if session_id not in self.session_data:
            self.session_data[session_id] = SessionWithoutSentValues(self.blocks)
        return super().__getitem__(session_id)


class SessionWithoutSentValues(SessionState):
    """A session as Gradio keeps it (its components' updates, its gr.State values), without the
    deep-link copies: no configuration per component, no value sent."""

    def __init__(self, blocks: gr.Blocks):
        # Gradio's own constructor, shown no components to copy the configuration of.
        super().__init__(SimpleNamespace(default_config=blocks.default_config, blocks={}))

    def _update_config(self, key: int) -> None:
        """A component's configuration after an update, for deep links: not kept."""

    def _update_value_in_config(self, key: int, value) -> None:
        """A value sent to the page, for deep links: not kept."""
