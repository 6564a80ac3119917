"""The one line that tells a visitor which model their tabs use, worded for where it is shown."""
from __future__ import annotations

import html
from typing import Literal

from ...model.loading import LoadedModel

Place = Literal["tab", "picker", "finetune", "banner"]


def model_line(store, session: str | None = None, place: Place = "tab") -> str:
    """Markdown saying which model `session` uses now (the app's when `session` is None):

    - `"tab"`: a tab's own line, the model its buttons run: "Model: **name** on `cpu`".
    - `"picker"` (above the tabs) and `"finetune"` (in the Fine-tune tab): which model the tabs
      use, with the state of the session's tuned model (in use, ready, or evicted).
    - `"banner"`: the page's heading about the app's model.
    Never raises: without a model it gives the store's load error, which says how to fix it.
    """
    try:
        base = store.base_for(session)
    except ValueError as err:
        return f"### ⚠️ No model is loaded\n{err}" if place == "banner" else f"⚠️ {err}"
    tuned, using_tuned = store.tuned(session), store.using_tuned(session)
    lm = tuned if using_tuned else base
    if place == "tab":
        return " ".join([f"Model: **{lm.name}** on `{lm.device}`{_precision(lm)}", *_warnings(lm, place)])
    if place == "banner":
        return "\n".join([f"### Using {lm.name}{_precision(lm)}", *_warnings(lm, place)])
    tabs = "The other tabs" if place == "finetune" else "Your tabs"
    if using_tuned:
        line = (f"{tabs} use **your tuned model** ({tuned.name}) in this browser session only; "
                f"“Back to the base model” in the Fine-tune tab returns them to **{base.name}**. "
                f"It lives in this server process's memory only: if the process stops or your "
                f"connection moves to another one, it is gone (download it to keep it).")
    elif store.was_evicted(session):
        line = (f"{tabs} use **{base.name}**. Your tuned model was freed to make room for other "
                f"visitors' (at most {store.max_tuned} are kept): fine-tune again.")
    elif tuned is not None:
        line = f"{tabs} use **{base.name}**; your tuned model is ready (“Use my tuned model in all tabs”)."
    else:
        family = f" ({base.card.family})" if place == "picker" and base.card.family else ""
        line = f"{tabs} use **{base.name}**{family}."
    return " ".join([line, *_warnings(lm, place)])


def _precision(lm: LoadedModel) -> str:
    """', in bfloat16' when the weights are not float32 (the default), so a visitor knows, and
    that it was picked for speed when `--dtype auto` picked it (the model card says more)."""
    if lm.card.dtype == "float32":
        return ""
    return f", in {lm.card.dtype}" + (" (faster on this CPU; see the model card)" if lm.card.precision else "")


def _warnings(lm: LoadedModel, place: Place) -> list[str]:
    """What a visitor must know about `lm` wherever its name is shown: what its checkpoint lacked
    (its model card's warning, e.g. an MLM head never trained), and above the tabs where its
    weights come from when the card says (the bundled model's training)."""
    found = [f"⚠️ **{lm.card.warning}.**"] if lm.card.warning else []
    if lm.card.provenance and place == "banner":
        found.append(details("What this model is", lm.card.provenance))
    return found


def details(summary: str, *paragraphs: str) -> str:
    """Markdown for a closed <details> below a short banner: `summary` shown, `paragraphs`
    (Markdown, or HTML on one line) inside, each whole."""
    return "\n\n".join([f"<details><summary>{html.escape(summary, quote=False)}</summary>", *paragraphs,
                         "</details>"])


def model_card(store, session: str | None = None, features=None) -> str:
    """Markdown of the model card of the model `session`'s tabs use: size, precision, device,
    weights, what the checkpoint lacked or had in excess, and (given the app's `features` store)
    its feature dictionaries' quality."""
    try:
        lm = store.for_session(session)
    except ValueError as err:
        return f"⚠️ {err}"
    card = lm.card
    lines = [f"**{lm.name}**: {card.summary()}."]
    if card.views:
        lines.append(f"Family and views: {card.views}.")
    if card.precision:
        lines.append(f"Precision: {card.precision} (`--dtype auto`). bfloat16 keeps 8 significant bits: "
                     "probabilities move by about 0.01 at most, and the top word changes only where "
                     "float32's two best are about that close.")
    if card.provenance:
        lines.append(card.provenance)
    if card.head_missing:
        lines.append(f"⚠️ **{card.warning}.** Not in the checkpoint: "
                     + ", ".join(f"`{k}`" for k in card.head_missing) + ".")
    elif card.body_missing:
        lines.append(f"⚠️ {card.warning}: " + ", ".join(f"`{k}`" for k in card.body_missing[:8]) + ".")
    else:
        lines.append("Every weight of the masked LM was in the checkpoint."
                     if card.weights != "in memory" else "Built or tuned in this server's memory.")
    if card.unused:
        lines.append("In the checkpoint but not used by a masked LM: "
                     + ", ".join(f"`{k}`" for k in card.unused[:8]) + ".")
    if features is not None:
        from ...features.quality_views import quality_summary

        summary = quality_summary(lm, features)
        if summary:
            lines.append(summary)
    return "\n\n".join(lines)
