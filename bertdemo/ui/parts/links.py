"""A link to any view: `/?tab=attention&sentence=...&layer=3&head=7` opens the Attention tab with
that sentence, layer 3 and head 7, and draws it; each tab's "Copy link to this view" writes such
a link for what it shows now.

`tab` is the tab's title in lowercase with hyphens; the other parameters are the names of the tab's
main endpoint (its API's, e.g. `sentence`, `top_k`, `layer`, `head`, `heatmap`, `mask_number`; the
Features tab's also its card's `feature` and its search's `query` and `by`), plus `model` where the model picker offers that model.
Opening a link fills the tab's controls and runs its main view once, except where that view is a
training run (Fine-tune, Classify): a link fills their form and the visitor starts the run. A
value that is unknown, out of range or not of the control's kind falls back to the control's
default with a notice naming the parameter; no value from a link is shown as markup (a control
shows it as text, a notice never repeats it).

The parsing (`parse_link`, `parse_value`) is plain Python over `Control`s, testable without a
browser; `Links` wires it into the page: the controls of each tab are found from its main
endpoint's event, so a tab needs no code of its own to be linked.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

import gradio as gr

from ...model.loading import allowed_choices
from .common import friendly_errors
from .context import AppContext, Visitor
from .model_line import model_line
from .model_picker import pick

# tab -> (api_name of its main endpoint or None, whether opening a link runs it)
TABS = {
    "fill-mask": ("fill_mask", True),
    "attention": ("attention", True),
    "inside-a-prediction": ("layer_predictions", True),
    "embeddings": ("embedding_map", True),
    "corpus-search": ("search_corpus", True),
    "features": ("sentence_features", True),  # its event goes on to the card of `feature`, the search of `query`
    "circuits": ("circuit_graph", True),  # its event goes on to apply the intervention of `nodes`
    "mask-sampling": ("mask_sample", True),
    "fine-tune": ("finetune", False),  # a training run: the link fills the form only
    "classify": ("train_classifier", False),
    "about": (None, False),
}
# tab -> other endpoints whose parameters a link also sets (the main view's event draws them)
ALSO = {"features": ("feature_card", "find_features"), "circuits": ("circuit_intervene",)}
MAX_TEXT = 5_000  # characters of one text value in a link (a longer one falls back to the default)
# Run the linked tab's main view: click its button once the tab is drawn (a tab's content is
# drawn when it is first selected, after the load event that selects it has returned).
RUN_JS = """(id) => {
    if (!id) return;
    const started = Date.now();
    const click = () => {
        const button = document.getElementById(id);
        if (button) button.click();
        else if (Date.now() - started < 20000) setTimeout(click, 100);
    };
    click();
}"""
OPEN_JS = """() => {
    if (!window.location.search) return;
    const started = Date.now();
    const open = () => {
        const button = document.getElementById("link-open");
        if (button) button.click();
        else if (Date.now() - started < 20000) setTimeout(open, 100);
    };
    open();
}"""
RESERVED = {"tab", "model", "__theme", "view", "lang", "deep_link"}  # Gradio's own, or ours


def slug(title: str) -> str:
    """"Inside a prediction" -> "inside-a-prediction": a tab's name in a link."""
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


@dataclass(frozen=True)
class Control:
    """What a link may set on one control: its parameter name, kind ("text", "number", "choice",
    "choices", "bool"), default, and the range or choices it accepts."""

    name: str
    kind: str
    default: object = None
    minimum: float | None = None
    maximum: float | None = None
    whole: bool = False  # a whole number (a step or precision of 1)
    choices: tuple = ()


@dataclass
class Link:
    """A parsed link: the tab (None: none asked or an unknown one), the values it sets by
    parameter name, the model it picks (None: the visitor's own), and a notice per value refused."""

    tab: str | None = None
    values: dict = field(default_factory=dict)
    model: str | None = None
    notices: list[str] = field(default_factory=list)


def parse_link(query: dict, controls: dict[str, list[Control]], models: list[str]) -> Link:
    """`query` (the URL's parameters) checked against each tab's `controls` and the `models` the
    picker offers (more than one: the picker allows a choice)."""
    query = {str(k): v for k, v in query.items()}
    link = Link()
    if not query.get("tab"):
        if set(query) - RESERVED:
            link.notices.append("This link names no tab (add tab=fill-mask, tab=attention, …): its "
                                "other parameters are ignored.")
        return link
    tab = str(query["tab"]).strip().lower()
    if tab not in controls:
        link.notices.append(f"This link's tab is not one of this app's ({', '.join(controls)}): "
                            "the page opens as usual.")
        return link
    link.tab = tab
    by_name = {c.name: c for c in controls[tab]}
    for name, raw in query.items():
        if name == "tab" or name in RESERVED - {"model"}:
            continue
        if name == "model":
            if len(models) > 1 and raw in models:
                link.model = raw
            else:
                link.notices.append("model: this server does not offer that model here; the page's model is used.")
            continue
        control = by_name.get(name)
        if control is None:
            link.notices.append(f"{_shown_name(name)}: not a setting of this tab; ignored.")
            continue
        value, notice = parse_value(control, raw)
        if notice:
            link.notices.append(notice)
        else:
            link.values[name] = value
    return link


def parse_value(control: Control, raw) -> tuple[object, str | None]:
    """(the value `raw` (text from a URL) sets `control` to, None) or (its default, why not)."""
    raw = str(raw)
    kind = control.kind
    if kind == "text":
        if len(raw) > MAX_TEXT:
            return control.default, f"{control.name}: longer than {MAX_TEXT:,} characters; the default is used."
        return raw, None
    if kind == "bool":
        word = raw.strip().lower()
        if word in {"true", "1", "yes", "on"}:
            return True, None
        if word in {"false", "0", "no", "off", ""}:
            return False, None
        return control.default, f"{control.name}: give true or false; the default is used."
    if kind == "number":
        try:
            number = float(raw)
        except ValueError:
            number = math.nan
        low = -math.inf if control.minimum is None else control.minimum
        high = math.inf if control.maximum is None else control.maximum
        if not math.isfinite(number) or not low <= number <= high or (control.whole and number != int(number)):
            return control.default, (f"{control.name}: give a {'whole ' if control.whole else ''}number"
                                     f"{_range(control)}; the default {_text(control.default)} is used.")
        return (int(number) if control.whole else number), None
    if kind == "choice":
        for value in control.choices:
            if raw == _text(value):
                return value, None
        return control.default, (f"{control.name}: not one of {', '.join(_text(c) for c in control.choices)}; "
                                 f"the default is used.")
    if kind == "choices":
        picked, known = [], {_text(c): c for c in control.choices}
        for part in (p.strip() for p in raw.split(",") if p.strip()):
            if part not in known:
                return control.default, (f"{control.name}: give a comma-separated list of "
                                         f"{', '.join(known)}; the default is used.")
            picked.append(known[part])
        return picked, None
    return control.default, f"{control.name}: cannot be set from a link; ignored."


def link_query(tab: str, values: dict, controls: list[Control], model: str | None = None) -> str:
    """The query string of a link to `tab` with `values` (what the Copy button writes, in Python:
    the page's button does the same in the browser): the texts (what the view is of), and the other
    values that differ from their defaults."""
    from urllib.parse import urlencode

    params = {"tab": tab}
    if model:
        params["model"] = model
    for control in controls:
        value = _text(values.get(control.name, control.default))
        if value != _text(control.default) or (control.kind == "text" and value):
            params[control.name] = value
    return urlencode(params)


def control_of(name: str, component) -> Control:
    """The `Control` a link may set on a Gradio component (a kind "other" for one it cannot)."""
    default = component.value
    if isinstance(component, gr.Checkbox):
        return Control(name, "bool", bool(default))
    if isinstance(component, gr.Slider):
        whole = float(component.step).is_integer() and float(component.minimum).is_integer()
        return Control(name, "number", default, component.minimum, component.maximum, whole)
    if isinstance(component, gr.Number):
        return Control(name, "number", default, component.minimum, component.maximum, component.precision == 0)
    if isinstance(component, gr.CheckboxGroup) or (isinstance(component, gr.Dropdown) and component.multiselect):
        return Control(name, "choices", list(default or []), choices=tuple(v for _, v in component.choices))
    if isinstance(component, (gr.Dropdown, gr.Radio)):
        return Control(name, "choice", default, choices=tuple(v for _, v in component.choices))
    if isinstance(component, gr.Textbox):
        return Control(name, "text", default or "")
    return Control(name, "other", default)


def _text(value) -> str:
    """A value as a link writes it (and as the page's JavaScript `String(...)` does)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (list, tuple)):
        return ",".join(_text(v) for v in value)
    return "" if value is None else str(value)


def _range(control: Control) -> str:
    if control.minimum is not None and control.maximum is not None:
        return f" from {_text(control.minimum)} to {_text(control.maximum)}"
    if control.minimum is not None:
        return f" of at least {_text(control.minimum)}"
    return ""


def _shown_name(name: str) -> str:
    """A parameter name from a URL as a notice may repeat it: word characters, at most 30."""
    return re.sub(r"[^\w-]", "", name)[:30] or "a parameter"


# ---------------------------------------------------------------- the page

class Links:
    """Copy buttons on the tabs, and the page load that opens a link.

        links = Links(ctx)
        with gr.Tabs() as tabs:
            with gr.Tab("Attention", id="attention"):
                attention_tab.render(ctx)
                links.button("attention")
        links.wire(demo, tabs)   # last, inside the Blocks: the tabs' endpoints exist by then
    """

    def __init__(self, ctx: AppContext):
        self.ctx = ctx
        self.buttons: dict[str, tuple[gr.Button, gr.Textbox]] = {}

    def button(self, tab: str) -> None:
        """The tab's "Copy link to this view" button and the box that shows the link."""
        with gr.Row():
            copy = gr.Button("Copy link to this view", size="sm", scale=1, elem_id=f"copy-link-{tab}")
            shown = gr.Textbox(label="Link to this view", show_label=False,
                               placeholder="The link appears here (and in your clipboard)",
                               interactive=False, scale=4, container=False, elem_id=f"link-{tab}")
        self.buttons[tab] = (copy, shown)

    def wire(self, demo: gr.Blocks, tabs: gr.Tabs) -> None:
        """The copy buttons' clicks and the page load; inside `demo`'s context, after every tab."""
        endpoints = {fn.api_name: fn for fn in demo.fns.values() if getattr(fn, "api_name", None)}
        inputs = {tab: _unique([self._inputs(endpoints.get(name)) for name in (api, *ALSO.get(tab, ()))])
                  for tab, (api, _) in TABS.items()}
        controls = {tab: [control_of(name, c) for name, c in pairs] for tab, pairs in inputs.items()}
        picker_fn = endpoints.get("choose_model")
        picker, note = (picker_fn.inputs[0], picker_fn.outputs[0]) if picker_fn else (None, None)
        models = list(allowed_choices(self.ctx.settings.allowed_models))
        run_ids = {tab: self._run_id(demo, endpoints[api], tab) for tab, (api, runs) in TABS.items()
                   if runs and api in endpoints}
        for tab, (copy, shown) in self.buttons.items():  # a table or a file is not written into a link
            linkable = [(c, control) for (_, c), control in zip(inputs.get(tab, []), controls.get(tab, []))
                        if control.kind != "other"]
            copy.click(None, [c for c, _ in linkable] + ([picker] if picker else []), shown,
                       js=_copy_js(tab, [control for _, control in linkable],
                                   models[0] if len(models) > 1 else None))
        targets = list({id(c): c for pairs in inputs.values() for _, c in pairs}.values())
        run = gr.Textbox(visible="hidden", elem_id="link-run")  # the button the link's view runs with

        def on_open(visitor: Visitor, request: gr.Request):
            link = parse_link(dict(request.query_params), controls, models)
            updates = {id(c): gr.skip() for c in targets}
            for name, component in inputs.get(link.tab, []):
                if name in link.values:
                    updates[id(component)] = link.values[name]
            picked = gr.skip(), gr.skip()
            if link.model is not None:
                try:
                    visitor.store.choose_base(visitor.session, pick(visitor, link.model))
                    picked = link.model, model_line(visitor.store, visitor.session, place="picker")
                except ValueError as err:
                    link.notices.append(f"model: could not be loaded ({err}); the page's model is used.")
            for notice in link.notices:
                gr.Warning(notice)
            selected = gr.Tabs(selected=link.tab) if link.tab else gr.skip()
            run_tab = run_ids.get(link.tab, "")
            return (selected, *(picked if picker else ()), run_tab, *(updates[id(c)] for c in targets))

        # Only a page opened from a link sends an event: the page load is JavaScript alone, and it
        # presses the hidden opener when the address has parameters (a plain visit queues nothing).
        opener = gr.Button(visible="hidden", elem_id="link-open")
        demo.load(None, None, None, js=OPEN_JS)
        outputs = [tabs, *([picker, note] if picker else []), run, *targets]
        opener.click(_with_request(self.ctx, on_open), None, outputs, api_visibility="private").then(
            None, run, None, js=RUN_JS)

    @staticmethod
    def _inputs(fn) -> list[tuple[str, object]]:
        """(parameter name, component) of an endpoint's inputs, named as its API names them."""
        if fn is None:
            return []
        import inspect

        names = [p.name for p in inspect.signature(fn.fn).parameters.values()
                 if p.name != "request" and not isinstance(p.default, gr.Progress)]
        return list(zip(names, fn.inputs))

    @staticmethod
    def _run_id(demo: gr.Blocks, fn, tab: str) -> str:
        """The element id of the button that runs `fn` (given one if it has none)."""
        button = demo.blocks[fn.targets[0][0]]
        if not button.elem_id:
            button.elem_id = f"run-{tab}"
        return button.elem_id


def _unique(lists: list[list[tuple[str, object]]]) -> list[tuple[str, object]]:
    """(name, component) pairs of several endpoints, each name once (the first endpoint's)."""
    seen, pairs = set(), []
    for name, component in (pair for found in lists for pair in found):
        if name not in seen:
            seen.add(name)
            pairs.append((name, component))
    return pairs


def _with_request(ctx: AppContext, fn):
    """`fn(visitor, request)` as a Gradio handler that also receives the request."""
    def on_open(request: gr.Request):
        return fn(ctx.visitor(request), request)
    return friendly_errors(on_open)


def _copy_js(tab: str, controls: list[Control], default_model: str | None) -> str:
    """The browser side of "Copy link to this view": the link to this tab with the values that
    differ from the defaults, its texts always (and the model, when the picker offers several and another is
    picked), copied to the clipboard and shown."""
    names = json.dumps([c.name for c in controls])
    defaults = json.dumps([_text(c.default) for c in controls])
    kinds = json.dumps([c.kind for c in controls])
    return f"""(...values) => {{
        const names = {names}, defaults = {defaults}, kinds = {kinds}, defaultModel = {json.dumps(default_model)};
        const text = (v) => Array.isArray(v) ? v.map(text).join(",") : (v === null || v === undefined ? "" : String(v));
        const params = new URLSearchParams({{tab: {json.dumps(tab)}}});
        if (defaultModel !== null && values.length > names.length && text(values[names.length]) !== defaultModel)
            params.set("model", text(values[names.length]));
        names.forEach((name, i) => {{
            const value = text(values[i]);
            const changed = kinds[i] === "number" && defaults[i] !== "" ? Number(value) !== Number(defaults[i])
                : value !== defaults[i];
            if (changed || (kinds[i] === "text" && value !== "")) params.set(name, value);
        }});
        const url = window.location.origin + window.location.pathname + "?" + params.toString();
        if (navigator.clipboard) navigator.clipboard.writeText(url).catch(() => {{}});
        return url;
    }}"""
