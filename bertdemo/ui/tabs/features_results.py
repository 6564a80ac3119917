"""The Features tab's results in the page's words: the layers line, a feature's card (its summary and
its contexts as HTML), the notes above each answer and the tables (one row per feature, each column
named in `features_sections`). Plain values in, Markdown, HTML or a `pd.DataFrame` out: no model call
but the quality record a line quotes."""
from __future__ import annotations

import html
import math

import pandas as pd

from ...features import quality_views
from ...features.store import FeatureStore
from ...forward import splice
from ...model.loading import LoadedModel
from . import features_sections as sections
from ..parts.common import escape_markdown


def availability(lm: LoadedModel | None, store: FeatureStore, layer) -> str:
    """Which layers of `lm` have a dictionary, and for `layer`: its quality, or how to get one."""
    if lm is None:
        return ""
    try:
        splice.layer_count(lm.model)
    except ValueError as err:
        return f"⚠️ {escape_markdown(str(err))}."
    layers = store.layers(lm)
    name = escape_markdown(lm.name)
    line = (f"Feature dictionaries of **{name}**: layers {', '.join(map(str, layers))}." if layers
            else f"**{name}** has no feature dictionary yet.")
    layer = layer_number(layer)
    if layer in layers:
        return f"{line} {quality_line(lm, store, layer)}"
    return (f"{line} **Layer {layer} has none**: press **Train features for layer {layer}** below (a few minutes "
            "at most; then every visitor of this model can use it), or pick a layer listed here.")


def quality_line(lm: LoadedModel, store: FeatureStore, layer: int) -> str:
    """One line of a layer's dictionary's quality, the splice's cost first (`quality_views.quality_line`)."""
    return quality_views.quality_line(quality_views.feature_quality(lm, layer, store))


def card_summary(card: dict, model: str) -> str:
    """The card's head: how well its label explains it (read before the label), the label and its
    form, how often and how strongly it fires, and what its statistics lack."""
    score = card.get("label_score") or {}
    missing = f"  \n*{escape_markdown(card['missing'])}*" if card.get("missing") else ""
    return (f"**Feature {card['feature']}** of layer {card['layer']} ({escape_markdown(model)}): {score_tag(score)}"
            f"*{escape_markdown(card['label'])}*  \n{escape_markdown(_capital(score.get('summary', '')))}.  \n"
            "A label reads *fires on → promotes*: the tokens it fires on most by lift (how many times more often it "
            "fires on a token than the token occurs), then the words it raises at a [MASK] where that clears the "
            "noise (what a random direction as large raises), else *no clear output*.  \n"
            f"Fires on {card['density']:.2%} of the {card['statistics_tokens']:,} "
            f"tokens its statistics counted ({firings(card):,} firings{few_firings(card)}); mean activation "
            f"{card['mean']:.3f} where it fires, {share_of_largest(card)} of its largest ({card['max']:.3f}): "
            "activations have no unit and differ from layer to layer, so compare a feature with its own largest. "
            "Promoted and suppressed: its direction, times its mean activation, added at a "
            "[MASK] of a few sentences, through the rest of the model and its MLM head." + missing)


def score_tag(score: dict) -> str:
    """"[word feature, explains 81%] " before a label; "" where it was not scored."""
    if not score.get("kind"):
        return ""
    return f"\\[{score['kind']} feature, explains {score['recall']:.0%}\\] "


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def firings(card: dict) -> int:
    """How many times the feature fired in the tokens its statistics counted."""
    return round(card["density"] * card["statistics_tokens"])


def few_firings(card: dict) -> str:
    return ": too few to say much of what it does" if 0 < firings(card) < 200 else ""


def share_of_largest(card: dict) -> str:
    return f"{card['mean'] / card['max']:.0%}" if card["max"] else "none"


CARD_STYLE = ("<style>#feature-contexts table{border-collapse:collapse;width:100%;font-size:0.95em;margin-bottom:2px}"
              "#feature-contexts td,#feature-contexts th{padding:2px 6px;border:none;text-align:left}"
              "#feature-contexts td.left{text-align:right;width:48%}"
              "#feature-contexts td.word{width:1%;white-space:nowrap}"
              "#feature-contexts td.act{color:#6b7280;width:1%;white-space:nowrap}"
              "#feature-contexts p.under{color:#6b7280;font-size:0.9em;margin:0 0 12px}</style>")


def contexts_html(card: dict, width: int = 70) -> str:
    """The feature's whole range: its top contexts, examples from each band of its activations, a few
    random firings (the text around the firing token, the token highlighted, its activation), and the
    hidden words when it fires at a [MASK]; a line under each table says what it shows. Every piece
    of text is HTML-escaped."""
    if not card["contexts"]:
        return "<p>It never fired on the statistics' corpus.</p>"
    top = _rows(card["contexts"], width)
    parts = [CARD_STYLE, "<p><b>Top contexts</b></p>", _html_table(top),
             "<p class='under'>Its strongest firings, at most one per corpus line: the activation, then the line "
             "with the token it fired on highlighted.</p>"]
    if card.get("bands"):
        rows = [f"<tr><td class='act' colspan='4'>band {b['band']} of {len(card['bands'])}: "
                f"{b['low']:.2f} to {b['high']:.2f}</td></tr>" + _rows(b["examples"], width) for b in card["bands"]]
        parts += ["<p><b>Across its range</b></p>", _html_table("".join(rows)),
                  "<p class='under'>Its firings cut into ten bands of equal counts by activation (deciles of its "
                  "non-zero activations), weakest first, with examples drawn at random from each: what it does "
                  "when it fires weakly, not only at its strongest.</p>"]
    if card.get("random_firings"):
        parts += ["<p><b>Random firings</b></p>", _html_table(_rows(card["random_firings"], width)),
                  "<p class='under'>Firings drawn at random from all of its firings: what a typical firing looks "
                  "like, not only its strongest.</p>"]
    parts.append(_at_mask_html(card.get("at_mask")))
    return "".join(parts)


def _at_mask_html(at_mask: dict | None) -> str:
    """The hidden words when the feature fires at a [MASK] of held-out lines, with the line under it."""
    if not at_mask or not at_mask.get("masks"):
        return ""
    head = "<p><b>What it fires for at a [MASK]</b></p>"
    if not at_mask["words"]:
        return head + (f"<p class='under'>It did not fire at any of the {at_mask['masks']:,} [MASK]s of the held-out "
                       "lines: it reads the word itself, not what a gap may hold.</p>")
    rows = "".join(f"<tr><td class='word'><mark>{html.escape(w['token'])}</mark></td><td>{w['firings']:,}</td>"
                   f"<td>{w['share']:.0%}</td><td>{w['lift']:.1f}</td></tr>" for w in at_mask["words"])
    return (head + "<table><thead><tr><th>hidden word</th><th>its firings there</th><th>share of its [MASK] "
            "firings</th><th>lift</th></tr></thead><tbody>" + rows + "</tbody></table>"
            f"<p class='under'>It fired at {at_mask['firings']:,} of the {at_mask['masks']:,} [MASK]s of held-out lines "
            "(each line masked as in training); the words those [MASK]s hid, by lift: how many times more often it "
            "fires at a [MASK] hiding the word than such [MASK]s occur. A word here is what the model, at that "
            "layer, already guesses the gap holds.</p>")


def _rows(contexts: list[dict], width: int) -> str:
    """A table row per context: its activation, the text before, the firing token highlighted, the text after."""
    rows = []
    for context in contexts:
        text, start, end = context["text"], context["start"], context["end"]
        left = ("…" if start > width else "") + text[max(0, start - width):start]
        right = text[end:end + width] + ("…" if end + width < len(text) else "")
        rows.append(f"<tr><td class='act'>{context['activation']:.2f}</td><td class='left'>{html.escape(left)}</td>"
                    f"<td class='word'><mark title='{html.escape(context['token'], quote=True)}'>"
                    f"{html.escape(text[start:end] or context['token'])}</mark></td>"
                    f"<td class='right'>{html.escape(right)}</td></tr>")
    return "".join(rows)


def _html_table(rows: str) -> str:
    return "<table><tbody>" + rows + "</tbody></table>"


def steer_note(result: dict) -> str:
    fired = result["fired"]
    where = (", ".join(f"{escape_markdown(f['token'])} ({f['activation']:.2f})" for f in fired[:12])
             + (" …" if len(fired) > 12 else "")) if fired else "no token of this sentence"
    scale = result["scale"]
    what = "switched off" if scale == 0 else "unchanged" if scale == 1 else f"times {scale:g}"
    added = (f"; {result['add']:g} x its mean activation added at the masks where it does not fire"
             if result["add"] else "")
    return (f"Steered: feature {result['feature']} of layer {result['layer']} (*{escape_markdown(result['label'])}*). "
            f"It fires on {where}. Where it fires it is **{what}** (scale {scale:g}: 0 switches it off, 1 leaves it "
            f"unchanged, 2 doubles it){added}.")


def found_word_note(result: dict) -> str:
    corpus = result["corpus"]
    word = escape_markdown(result["token"])
    if not result["features"]:
        return f"No feature of layer {result['layer']} fires on '{word}' {result['min_firings']} times or more."
    return (f"'{word}' occurs **{result['occurrences']:,}** times in the {corpus['lines']:,} lines searched "
            f"({corpus['tokens']:,} tokens). Layer {result['layer']}'s features that fire on it, by **lift**: how "
            f"many times more often the feature fires on '{word}' than '{word}' occurs (a feature that fires on little "
            f"else comes first); each fires on it at least {result['min_firings']} time(s)."
            + (" Few occurrences: read the lift as a first guess." if result["occurrences"] < 10 else ""))


def found_label_note(result: dict) -> str:
    text = escape_markdown(result["text"])
    if not result["matched"]:
        return (f"No label of layer {result['layer']} holds '{text}'. The features whose labels are spelled "
                "nearest it are listed instead.")
    return (f"{result['total']:,} label(s) of layer {result['layer']} hold '{text}': those where it is a whole word "
            "first, the more often firing first.")


def map_note(result: dict) -> str:
    how = ("UMAP of the cosine distances between their decoder rows" if result["method"] == "umap"
           else "the first two principal components (PCA) of their unit decoder rows")
    kept = "read from the disk cache" if result["cached"] else "computed now and kept for the next visitor"
    return (f"Layer {result['layer']}: {len(result['features']):,} features placed by {how} ({kept}); colour: "
            f"{result['colour']['name']}. Click a point for its card.")


def label_fits(row: dict) -> str:
    """A table's "label fits" cell from a view's row: its label's F1 and kind ("0.91 word", "0.12
    context"; `labels.label_fit`, the card's score), "not scored" where there is none."""
    if row.get("label_kind") is None:
        return "not scored"
    return f"{row['label_f1']:.2f} {row['label_kind']}"


def word_frame(result: dict) -> pd.DataFrame:
    rows = [[f["feature"], f"×{f['lift']:,.0f}" if f["lift"] >= 10 else f"×{f['lift']:.1f}",
             f"{f['firings']:,} of {result['occurrences']:,} ({f['word_share']:.0%})", f"{f['feature_share']:.1%}",
             label_fits(f), f["label"]] for f in result["features"]]
    return pd.DataFrame(rows, columns=list(sections.WORD_COLUMNS))


def label_frame(result: dict) -> pd.DataFrame:
    rows = [[f["feature"], f"{f['density']:.3%}", label_fits(f), f["label"]] for f in result["features"]]
    return pd.DataFrame(rows, columns=list(sections.LABEL_COLUMNS))


def similar_frame(result: dict) -> pd.DataFrame:
    rows = [[s["feature"], round(s["cosine"], 3), label_fits(s), s["label"]] for s in result["features"]]
    return pd.DataFrame(rows, columns=list(sections.SIMILAR_COLUMNS))


def token_frame(result: dict) -> pd.DataFrame:
    """Every token's features in one table, the strongest first (the heatmap keeps the sentence's order)."""
    rows = sorted(([f["feature"], t["token"], t["position"], round(f["activation"], 4), label_fits(f), f["label"]]
                   for t in result["per_token"] for f in t["features"]), key=lambda row: -row[3])
    return pd.DataFrame(rows, columns=list(sections.TOKEN_COLUMNS))


def cofiring_frame(card: dict) -> pd.DataFrame:
    rows = [[c["feature"], f"{c['share']:.0%}", label_fits(c), c["label"]] for c in card["cofiring"]]
    return pd.DataFrame(rows, columns=list(sections.COFIRING_COLUMNS))


def prediction_frame(result: dict) -> pd.DataFrame:
    """A row per mask and feature: the top word's probability with the feature and without it, and the
    change in percentage points, measured and estimated (the raw result keeps the drops in log p)."""
    rows = []
    for m in result["masks"]:
        p = math.exp(m["log_prob"])
        for rank, f in enumerate(m["features"], 1):
            without = p * math.exp(-f["drop"])
            rows.append([f["feature"], m["mask"], m["word"], rank, f"{p:.1%} → {without:.1%}",
                         round(100 * (without - p), 2), round(100 * (p * math.exp(-f["estimate"]) - p), 2),
                         label_fits(f), f["label"]])
    return pd.DataFrame(rows, columns=list(sections.PREDICTION_COLUMNS))


def contrast_frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([[r["feature"], f"{r['share_a']:.0%}", f"{r['share_b']:.0%}", round(r["separation"], 3),
                          label_fits(r), r["label"]] for r in rows], columns=list(sections.CONTRAST_COLUMNS))


def drift_frame(result: dict) -> pd.DataFrame:
    def activation(value):
        return None if value is None else round(value, 3)
    rows = [[r["feature"], f"{r['density_base']:.2%}", f"{r['density_tuned']:.2%}", f"{100 * r['share_change']:+.2f}",
             activation(r["mean_base"]), activation(r["mean_tuned"]),
             None if r["activation_change"] is None else f"{r['activation_change']:+.3f}", label_fits(r), r["label"]]
            for r in result["features"]]
    return pd.DataFrame(rows, columns=list(sections.DRIFT_COLUMNS))


def quality_frame(rows: list[dict]) -> pd.DataFrame:
    """One row per layer, the splice's cost first, under plain headings (sections.QUALITY_COLUMNS, each
    said in sections.QUALITY_HELP); the cross-entropies themselves stay in the raw figures."""
    def number(value, digits=3):
        return round(value, digits) if isinstance(value, (int, float)) else None

    def recovered(q):
        shares = [(q.get("loss_recovered") or {}).get(ablation) for ablation in ("zero", "mean")]
        return " / ".join("n/a" if v is None else f"{v:.0%}" for v in shares)
    table = []
    for q in rows:
        cost = quality_views.splice_cost(q) or {}
        interval = (q.get("interval") or {}).get("fvu")
        window = f" in {q['dead_window']:,} tokens" if "dead_window" in q else ""
        held = (q.get("held_out") or {}).get("tokens", q.get("tokens"))
        table.append([q["layer"], number(cost.get("added_cross_entropy")), number(cost.get("perplexity_ratio")),
                      number(cost.get("kl")), number(q.get("fvu")),
                      f"{interval[0]:.3f}–{interval[1]:.3f}" if interval else None,
                      f"{q['dead']:.1%}{window}" if "dead" in q else None, number(q.get("l0"), 1),
                      recovered(q), held, how_made(q)])
    return pd.DataFrame(table, columns=list(sections.QUALITY_COLUMNS))


def how_made(q: dict) -> str:
    """A dictionary's making in a line: its size and k, the tokens and passes, minutes, machine, what ended it."""
    training = q.get("training") or {}
    parts = [f"{q['latents']:,} features, k = {q['k']}"]
    if training.get("tokens") is not None:
        passes = training.get("passes")
        parts.append(f"{training['tokens']:,} tokens" + (f", {passes:.1f} passes" if passes is not None else ""))
    if training.get("minutes") is not None:
        parts.append(f"{training['minutes']:.1f} min" + (f" on {training['machine']}" if training.get("machine")
                                                         else ""))
    stopped = training.get("stopped")
    parts.append(f"ended by {ENDED.get(stopped, stopped) if stopped else 'its token limit'}")
    return "; ".join(parts)


ENDED = {"stopped": "Stop", "time limit": "the time limit", "diverged": "diverging", "shutdown": "a server stop",
         "closed": "the page closing"}  # training.loop.STOP_REASONS in a sentence


def layer_number(value) -> int:
    """A layer as the page sent it (a number, or nothing yet): its int, else 0."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0
