"""A feature in words and how far to trust them: its label (the tokens it fires on most by lift, then
the words it promotes that clear the noise), the label's score on held-out lines (its tokens as a
detector of where it fires: a word feature or a context feature), and the two fields every table
shows beside a label. Read from a dictionary's statistics (`stats`); the views, the search, the map
and the drift all name features here."""
from __future__ import annotations

import torch

from ..model.loading import LoadedModel
from .dictionary import Dictionary
from .stats import LABEL_TOKENS, WORD_F1

NO_CLEAR_OUTPUT = "no clear output"


def label(lm: LoadedModel, dictionary: Dictionary, feature: int) -> str:
    """A feature in words, from its statistics: the tokens it fires on most by lift and, where
    measured, the words it promotes that clear the noise, e.g. "bank, banks, shore → river, water"
    ("→ no clear output" when none does); "feature 12" without statistics. Statistics made before
    lift rank its tokens by count (`label_score` says it is not scored)."""
    return labels(lm, dictionary, [feature])[0]


def labels(lm: LoadedModel, dictionary: Dictionary, features: list[int] | None = None) -> list[str]:
    """`label` of each of `features` (default every feature), the statistics read and the tokens
    named once for all of them: a map or a label search names every feature (3,072 of them one at a
    time took 59 ms, at once 24 ms)."""
    features = list(range(dictionary.latents)) if features is None else list(features)
    stats = dictionary.stats
    if stats is None:
        return [f"feature {f}" for f in features]
    rows = torch.as_tensor(features, dtype=torch.long)  # a tensor: indexing by a list of 3,072 took 20 ms
    fires = [[t for t in row if t >= 0][:LABEL_TOKENS] for row in stats["top_tokens"][rows].tolist()]
    promoted = stats.tensors.get("promoted")
    raised = ([[t for t in row if t >= 0] for row in promoted[rows].tolist()] if promoted is not None
              else [[] for _ in features])
    ids = sorted({t for listed in (fires, raised) for row in listed for t in row})
    name = dict(zip(ids, lm.tokenizer.convert_ids_to_tokens(ids)))
    unclear = [NO_CLEAR_OUTPUT] if stats.has("noise_per_unit") else []
    return [", ".join(name[t] for t in tokens) + (f" → {', '.join([name[t] for t in up] or unclear)}"
                                                  if up or unclear else "")
            if tokens else f"feature {f} (never fired on the statistics' corpus)"
            for f, tokens, up in zip(features, fires, raised)]


def label_fit(dictionary: Dictionary, feature: int) -> dict:
    """The card's verdict on `feature`'s label in two fields, for every table that shows the label:
    {"label_f1": its detection F1 on held-out lines, "label_kind": "word" (F1 >= WORD_F1) or
    "context"}; both None where it is not scored (statistics made before labels were scored, or it
    never fired on the held-out lines). The one rule `label_score` words."""
    stats = dictionary.stats
    if stats is None or not stats.has("label_f1"):
        return {"label_f1": None, "label_kind": None}
    # scored: it fired on the held-out lines and has tokens to detect with (its label is not "never fired")
    if int(stats["label_fires"][feature]) == 0 or not bool((stats["top_tokens"][feature] >= 0).any()):
        return {"label_f1": None, "label_kind": None}
    f1 = float(stats["label_f1"][feature])
    return {"label_f1": f1, "label_kind": "word" if f1 >= WORD_F1 else "context"}


def labelled(lm: LoadedModel, dictionary: Dictionary, feature: int) -> dict:
    """A table row's words for `feature`: {"label", "label_f1", "label_kind"} (`label`, `label_fit`)."""
    return {"label": label(lm, dictionary, feature), **label_fit(dictionary, feature)}


def label_score(lm: LoadedModel, dictionary: Dictionary, feature: int) -> dict:
    """How well `feature`'s label explains it, measured on held-out lines (`stats.detection`): its
    tokens as a detector of where it fires. {"precision", "recall", "f1", "kind": "word" (F1 >=
    WORD_F1: it fires on those words whatever the sense) or "context", "held_out_firings",
    "held_out_tokens", "summary": in words, e.g. "a context feature: its tokens explain 12% of its
    firings ..."}; {"kind": None, "summary": what is missing} for statistics made before it."""
    stats = dictionary.stats
    if stats is None or not stats.has("label_f1"):
        return {"kind": None, "summary": "not scored: this dictionary's statistics were made before labels were "
                                         "scored (their tokens are ranked by count); make them again to score it"}
    precision, recall, f1 = (float(stats[name][feature]) for name in ("label_precision", "label_recall", "label_f1"))
    fires, tokens = int(stats["label_fires"][feature]), int(stats["detection_tokens"][0])
    words = ", ".join(_tokens(lm, [t for t in stats["top_tokens"][feature].tolist() if t >= 0][:LABEL_TOKENS]))
    scores = {"precision": precision, "recall": recall, "f1": f1, "held_out_firings": fires, "held_out_tokens": tokens}
    kind = label_fit(dictionary, feature)["label_kind"]
    if kind is None:
        return {**scores, "kind": None, "summary": f"not scored: it did not fire on the {tokens:,} held-out tokens"}
    explained = (f"its tokens ({words}) explain {recall:.0%} of its {fires:,} firings on held-out lines, and it "
                 f"fires on {precision:.0%} of their occurrences (F1 {f1:.2f})")
    if kind == "word":
        sense = ", whatever the sense" if precision >= 0.5 else ""
        summary = f"a word feature: it fires on {words}{sense}; {explained}"
    else:
        summary = f"a context feature: {explained}; what it stands for is more than its words"
    return {**scores, "kind": kind, "summary": summary}


def _tokens(lm: LoadedModel, ids: list[int]) -> list[str]:
    return [lm.tokenizer.convert_ids_to_tokens(i) for i in ids]
