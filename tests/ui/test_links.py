"""A link to any view, without a browser: each tab's link parameters are its main endpoint's, a
value out of range or of the wrong kind falls back to the default with a notice, a link the Copy
button writes opens the same values, and nothing from a URL is repeated in a notice but names."""
import json
from pathlib import Path
from urllib.parse import parse_qsl

import gradio as gr
import pytest

from bertdemo.ui.parts import links
from bertdemo.ui.parts.links import Control, link_query, parse_link, parse_value

ENDPOINTS = json.loads(Path(__file__).resolve().parents[1].joinpath("endpoints.json").read_text())
ATTENTION = [Control("sentence", "text", "The cat sat."), Control("layer", "number", 1, 0, 1, True),
             Control("head", "number", 0, 0, 1, True), Control("heatmap", "choice", "head",
                                                               choices=("head", "mean_heads", "rollout")),
             Control("whole_words", "bool", False), Control("bertviz_layers", "choices", [], choices=(0, 1)),
             Control("threshold", "number", 0.0, 0.0, 1.0)]
CONTROLS = {"attention": ATTENTION, "about": []}


@pytest.mark.parametrize("control, raw, value", [
    (ATTENTION[1], "0", 0), (ATTENTION[1], "1.0", 1), (ATTENTION[6], "0.25", 0.25),
    (ATTENTION[3], "rollout", "rollout"), (ATTENTION[4], "true", True), (ATTENTION[4], "0", False),
    (ATTENTION[5], "1,0", [1, 0]), (ATTENTION[5], "", []), (ATTENTION[0], "<b>x</b>", "<b>x</b>"),
])
def test_a_good_value_is_taken_as_the_control_takes_it(control, raw, value):
    assert parse_value(control, raw) == (value, None)


@pytest.mark.parametrize("control, raw, notice", [
    (ATTENTION[1], "2", "layer: give a whole number from 0 to 1; the default 1 is used."),
    (ATTENTION[1], "0.5", "layer: give a whole number from 0 to 1"),
    (ATTENTION[1], "nan", "layer: give a whole number"),
    (ATTENTION[1], "three", "layer: give a whole number"),
    (ATTENTION[3], "<script>", "heatmap: not one of head, mean_heads, rollout; the default is used."),
    (ATTENTION[4], "maybe", "whole_words: give true or false"),
    (ATTENTION[5], "0,7", "bertviz_layers: give a comma-separated list of 0, 1"),
    (ATTENTION[0], "x" * 5001, "sentence: longer than 5,000 characters"),
    (Control("examples", "other", None), "<i>some rows</i>", "examples: cannot be set from a link"),
])
def test_a_bad_value_falls_back_to_the_default_with_a_notice(control, raw, notice):
    value, said = parse_value(control, raw)
    assert value == control.default and said.startswith(notice)
    assert "<" not in said and raw[:20] not in said  # the value itself is never repeated


def test_a_link_names_its_tab_its_values_and_whats_wrong():
    link = parse_link({"tab": "attention", "layer": "0", "head": "5", "colour": "red", "model": "b"},
                      CONTROLS, ["a", "b"])
    assert (link.tab, link.values, link.model) == ("attention", {"layer": 0}, "b")
    assert link.notices == ["head: give a whole number from 0 to 1; the default 0 is used.",
                            "colour: not a setting of this tab; ignored."]
    assert parse_link({"tab": "attention", "model": "b"}, CONTROLS, ["a"]).model is None  # one model: no choice
    assert parse_link({"tab": "attention", "model": "c"}, CONTROLS, ["a", "b"]).notices[0].startswith("model:")
    unknown = parse_link({"tab": "<img src=x>", "layer": "1"}, CONTROLS, ["a"])
    assert unknown.tab is None and "not one of this app's (attention, about)" in unknown.notices[0]
    assert parse_link({}, CONTROLS, ["a"]).notices == []
    assert parse_link({"__theme": "dark"}, CONTROLS, ["a"]).notices == []
    assert "names no tab" in parse_link({"layer": "1"}, CONTROLS, ["a"]).notices[0]
    assert "<" not in parse_link({"tab": "attention", "<b>": "1"}, CONTROLS, ["a"]).notices[0]


def test_the_copied_link_opens_the_same_values():
    values = {"sentence": "A dog & a cat?", "layer": 0, "head": 1, "heatmap": "rollout", "whole_words": True,
              "bertviz_layers": [0, 1], "threshold": 0.0}
    query = link_query("attention", values, ATTENTION)
    assert "threshold" not in query  # a default is left out; a text never is
    link = parse_link(dict(parse_qsl(query, keep_blank_values=True)), CONTROLS, ["a"])
    assert link.tab == "attention" and link.notices == []
    assert link.values == {k: v for k, v in values.items() if k != "threshold"}


def test_every_tabs_link_parameters_are_its_main_endpoints(app_demo):
    """Found from the running app's events, so the link follows a tab's API when it changes."""
    import app

    endpoints = {fn.api_name: fn for fn in app_demo.fns.values() if getattr(fn, "api_name", None)}
    assert set(links.TABS) == {links.slug(title) for title, _ in app.TABS}
    for tab, (api, _) in links.TABS.items():
        if api is None:
            continue
        pairs = links.Links._inputs(endpoints[api])
        assert [f"{name}: {type(c).__name__}".lower() for name, c in pairs] == \
            [p.lower() for p in ENDPOINTS[f"/{api}"]["parameters"]], tab
        kinds = {name: links.control_of(name, c).kind for name, c in pairs}
        assert "other" not in {kinds[n] for n in kinds if n not in ("examples",)}, tab
    layer = dict(links.Links._inputs(endpoints["attention"]))["layer"]
    assert links.control_of("layer", layer) == Control("layer", "number", 2, 1, 2, True)  # 1 = the first layer
    assert isinstance(layer, gr.Slider)
