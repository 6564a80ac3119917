"""Attention weights: one forward pass, the views people read (head, means, rollout, words), bertviz HTML.

The shared model runs with sdpa, which returns no weights. `eager_twin` gives an eager-attention
twin that shares every parameter tensor with it, so there is one copy of the weights for both
(made once per model, kept in the model's `caches`).
"""
from __future__ import annotations

import base64
import html
import json
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import bertviz
import numpy as np
import torch
from bertviz import head_view, model_view

from .. import validate
from ..forward import anatomy, hooks
from ..model.loading import LoadedModel
from ..model.logits import mlm_logits
from ..plots import shown_token
from .fillmask import check_text, prediction

VENDOR_DIR = Path(__file__).resolve().parents[2] / "assets" / "vendor"
VENDORED = {  # what bertviz 1.4.1 loads from a CDN -> our copy (jQuery 2.0.0 is not on npm: 3.7.1)
    "require": VENDOR_DIR / "requirejs-2.3.6" / "require.js",
    "d3": VENDOR_DIR / "d3-5.7.0" / "d3.min.js",
    "jquery": VENDOR_DIR / "jquery-3.7.1" / "jquery.min.js",
}
# Where bertviz's HTML names its scripts: the <script src> of require.js, and require.js's
# `paths` entries for d3 and jQuery. Found by shape, not by address, so nothing here depends on
# (or names) the CDN bertviz happens to use.
_SCRIPT_SRC = re.compile(r'(<script src=")(https?://[^"]+)(")')
_REQUIRE_PATH = re.compile(r"\b(d3|jquery): '(https?://[^']+)'")
VIEWS = {  # heatmap aggregates: key -> label shown in the page
    "head": "One layer and head",
    "mean_heads": "Mean over heads (one layer)",
    "mean_layers": "Mean over all layers and heads",
    "rollout": "Attention rollout (up to the layer)",
}
PAYLOAD_BUDGET = 200_000  # attention weights per bertviz view by default (~1.2 MB of JSON)
MAX_VIEW_WEIGHTS = 2_500_000  # most weights in one bertviz view (~10 MB): all 144 heads of a bert-base at 128 tokens


@dataclass(frozen=True, eq=False)
class Attention:
    """Every layer's and head's attention for one input (a sentence, or a pair as in NSP).

    `weights[l, h, i, j]` (float32, shape (layers, heads, T, T)) is how much token i attends to
    token j in layer l, head h; each row sums to 1. `sequence_ids[i]` is 0 (sentence A), 1 (B) or
    None (special tokens such as [CLS], [SEP]); `word_ids[i]` numbers the words of each sentence.
    `predictions` holds, per [MASK] in `mask_positions`, fill_mask-style top-k predictions.
    """

    tokens: list[str]
    weights: np.ndarray
    sequence_ids: list[int | None]
    word_ids: list[int | None]
    offsets: list[tuple[int, int]]
    texts: tuple[str, str | None]  # the model's text of sentence A and B (mask token mapped)
    mask_positions: list[int]
    predictions: list[list[dict]]

    @property
    def num_layers(self) -> int:
        return self.weights.shape[0]

    @property
    def num_heads(self) -> int:
        return self.weights.shape[1]

    @property
    def special(self) -> list[bool]:
        return [s is None for s in self.sequence_ids]

    @property
    def sentence_b_start(self) -> int | None:
        """Index of sentence B's first token, None for a single sentence."""
        return next((i for i, s in enumerate(self.sequence_ids) if s == 1), None)


# ---------------------------------------------------------------- the forward pass

def eager_twin(lm: LoadedModel) -> torch.nn.Module:
    """`lm.model` with attention that gives its weights (`anatomy.attention_twin`), sharing all
    parameter and buffer tensors (no second copy of the weights); made once per model (`lm.caches`).

    Why a twin: attention modules read `config._attn_implementation` on every call and all of them
    share one config, so switching the shared model would race with other users' requests.
    The twin has its own module tree and config over the same tensors.
    """
    return lm.caches.twin(lm.model, anatomy.attention_twin)


@torch.inference_mode()
@anatomy.guarded("The attention view")
def attention(lm: LoadedModel, text: str, text_b: str | None = None, top_k: int = 5) -> Attention:
    """Tokens and attention weights (layers, heads, T, T) of `text` (and `text_b`, as an NSP pair).

    Equal to the model's own `output_attentions` (of the view, for a view with heads switched off,
    `heads.heads_off`). With [MASK]s in the text, the same forward pass also gives the top-k
    predictions at each mask. Raises ValueError for empty or over-long text.
    """
    anatomy.of(lm.model).require("attention", "The attention view")
    inputs, meta = encode_input(lm, text, text_b)
    positions = meta.pop("mask_positions")
    cols = torch.tensor(positions, dtype=torch.long, device=lm.device)
    twin = eager_twin(lm)
    with hooks.switched_off(lm, twin):
        logits, out = mlm_logits(twin, inputs, torch.zeros_like(cols), cols,
                                 packed=lm.caches.packed, output_attentions=True)
    if not out.attentions or any(a is None for a in out.attentions):
        raise ValueError(f"{lm.name} ({anatomy.of(lm.model).name}) returns no attention weights, so "
                         "there is nothing to show: " + (anatomy.of(lm.model).family.notes
                                                        if anatomy.of(lm.model).family else "choose another model."))
    weights = torch.cat(out.attentions).float().cpu().numpy()  # (L, H, T, T)
    scores, ids = logits.float().softmax(-1).topk(min(top_k, logits.shape[-1]), dim=-1)
    predictions = [[prediction(lm, i, s) for i, s in zip(r_ids.tolist(), r_scores.tolist())]
                   for r_ids, r_scores in zip(ids, scores)]
    return Attention(weights=weights, mask_positions=positions, predictions=predictions, **meta)


def encode_input(lm: LoadedModel, text: str, text_b: str | None = None):
    """Model inputs (1, T) on the model's device, plus what `Attention` keeps about the tokens
    (and the mask positions). ValueError for empty or over-long text."""
    check_text(text)
    text_b = text_b if isinstance(text_b, str) and text_b.strip() else None
    texts = (lm.to_model_text(text), lm.to_model_text(text_b) if text_b else None)
    enc = lm.tokenizer(*[t for t in texts if t is not None], return_tensors="pt",
                       return_offsets_mapping=True)
    length = enc["input_ids"].shape[1]
    if length > lm.max_length:  # the same message as fill-mask
        what = "text" if text_b is None else "pair of sentences"
        raise ValueError(f"The {what} is {length} tokens long; {lm.name} takes at most "
                         f"{lm.max_length} tokens (special tokens included). Shorten it.")
    ids = enc["input_ids"][0].tolist()
    meta = {"tokens": lm.tokenizer.convert_ids_to_tokens(ids), "sequence_ids": enc.sequence_ids(),
            "word_ids": enc.word_ids(), "offsets": [tuple(o) for o in enc["offset_mapping"][0].tolist()],
            "texts": texts, "mask_positions": [i for i, t in enumerate(ids) if t == lm.mask_token_id]}
    inputs = {k: v.to(lm.device) for k, v in enc.items() if k != "offset_mapping"}
    return inputs, meta


def first_query(lm: LoadedModel, text: str, text_b: str | None = None) -> int:
    """Where a view of one token's query starts: the first [MASK]'s index among the tokens
    ([CLS] = 0), else the first token after [CLS]."""
    _, meta = encode_input(lm, text, text_b)
    return meta["mask_positions"][0] if meta["mask_positions"] else min(1, len(meta["tokens"]) - 1)


# ---------------------------------------------------------------- views for the heatmaps

def rollout(weights: np.ndarray, upto: int | None = None) -> np.ndarray:
    """Attention rollout (Abnar & Zuidema 2020) through layers 0..upto: (T, T), rows sum to 1.

    Each layer is averaged over heads, the residual connection added as 0.5*A + 0.5*I and rows
    renormalised; the layers are multiplied: R = A'_upto ... A'_1 A'_0.
    """
    upto = weights.shape[0] - 1 if upto is None else upto
    eye = np.eye(weights.shape[-1])
    result = eye
    for layer in weights[:upto + 1].astype(np.float64):  # (H, T, T)
        mixed = 0.5 * layer.mean(0) + 0.5 * eye
        result = (mixed / mixed.sum(-1, keepdims=True)) @ result
    return result


def aggregate(weights: np.ndarray, heatmap: str = "head", layer: int = 0, head: int = 0) -> np.ndarray:
    """The (T, T) matrix of the heatmap `heatmap` (a key of `VIEWS`) from (L, H, T, T); rows sum to 1."""
    layer, head = _check_index(layer, weights.shape[0], "layer"), _check_index(head, weights.shape[1], "head")
    if heatmap == "head":
        return weights[layer, head].astype(np.float64)
    if heatmap == "mean_heads":
        return weights[layer].astype(np.float64).mean(0)
    if heatmap == "mean_layers":
        return weights.astype(np.float64).mean((0, 1))
    if heatmap == "rollout":
        return rollout(weights, layer)
    raise ValueError(f"Unknown heatmap {heatmap!r}: choose one of {', '.join(VIEWS)}.")


def _check_index(value, size: int, what: str) -> int:
    return validate.whole_number(value, what, 0, size - 1)


@dataclass(frozen=True)
class Group:
    """Tokens shown as one row/column: a word's pieces, or one special token."""

    label: str
    indices: list[int]
    special: bool
    sequence: int | None


def token_groups(att: Attention, whole_words: bool = False) -> list[Group]:
    """One group per token, or (`whole_words=True`) one per word: its pieces, labelled with its text."""
    groups: list[Group] = []
    for i, (token, seq, word) in enumerate(zip(att.tokens, att.sequence_ids, att.word_ids)):
        last = groups[-1] if groups else None
        if whole_words and seq is not None and last and last.sequence == seq and \
                att.word_ids[last.indices[-1]] == word:  # the next piece of the same word
            last.indices.append(i)
        else:
            groups.append(Group(token, [i], seq is None, seq))
    if whole_words:
        groups = [_labelled(att, g) for g in groups]
    return groups


def _labelled(att: Attention, group: Group) -> Group:
    if group.special:
        return group
    start, end = att.offsets[group.indices[0]][0], att.offsets[group.indices[-1]][1]
    return Group(att.texts[group.sequence][start:end] or group.label, group.indices, False, group.sequence)


def merge(matrix: np.ndarray, groups: list[Group]) -> np.ndarray:
    """(T, T) -> (G, G): sum over a group's key pieces, mean over its query pieces.

    A word receives all the attention its pieces receive, and gives the average of what its
    pieces give, so rows that summed to 1 still do.
    """
    members = np.zeros((len(groups), matrix.shape[0]))  # (G, T)
    for g, group in enumerate(groups):
        members[g, group.indices] = 1.0
    means = members / members.sum(1, keepdims=True)
    return means @ matrix @ members.T


@dataclass(frozen=True)
class View:
    """A heatmap's data: `matrix[i, j]` is how much row `labels[i]` attends to column `labels[j]`."""

    labels: list[str]
    matrix: np.ndarray  # (N, N), rows sum to 1
    boundary: int | None  # index of sentence B's first row/column, None for one sentence
    title: str


def view(att: Attention, heatmap: str = "head", layer: int = 0, head: int = 0, whole_words: bool = False,
         hide_special: bool = False, first_layer: int = 0, first_head: int = 0) -> View:
    """A heatmap (`VIEWS`: one head, a mean, rollout), optionally per word and without special tokens.

    Hiding [CLS]/[SEP] drops their rows and columns and renormalises each row over the tokens left
    (BERT sends much attention to them, Clark et al. 2019), so rows still sum to 1. `layer` and `head`
    count from 0; the title names them counted from `first_layer` and `first_head` (the page's 1 and
    1: layer 0 is the embeddings).
    """
    matrix = aggregate(att.weights, heatmap, layer, head)
    groups = token_groups(att, whole_words)
    if whole_words:
        matrix = merge(matrix, groups)
    if hide_special:
        keep = [g for g, group in enumerate(groups) if not group.special]
        if not keep:
            raise ValueError("The input has only special tokens: type some words.")
        matrix = matrix[np.ix_(keep, keep)]
        matrix = matrix / np.maximum(matrix.sum(-1, keepdims=True), 1e-12)
        groups = [groups[g] for g in keep]
    boundary = next((g for g, group in enumerate(groups) if group.sequence == 1), None)
    return View([g.label for g in groups], matrix, boundary,
                _title(heatmap, layer + first_layer, head + first_head, whole_words))


def _title(heatmap: str, layer: int, head: int, whole_words: bool) -> str:
    where = {"head": f"layer {layer}, head {head}", "mean_heads": f"layer {layer}, mean over heads",
             "mean_layers": "mean over all layers and heads",
             "rollout": f"rollout through layer {layer}"}[heatmap]
    return f"Attention, {where}{' (words)' if whole_words else ''}: row attends to column"


def mask_rows(att: Attention, mask_index: int = 0) -> np.ndarray:
    """What one [MASK] looked at: (layers, heads, T), its attention row in every head."""
    if not att.mask_positions:
        raise ValueError("There is no [MASK] in the text: put one where a word is missing.")
    mask_index = _check_index(mask_index, len(att.mask_positions), "mask index")
    return att.weights[:, :, att.mask_positions[mask_index], :]


# ---------------------------------------------------------------- bertviz

def default_selection(att: Attention, bertviz_view: str = "head",
                      budget: int = PAYLOAD_BUDGET) -> tuple[list[int], list[int]]:
    """Layers and heads of the bertviz view ("head" or "model") shown by default: all when they fit `budget`
    weights, else evenly spread. The head view sends all heads of each layer it shows."""
    L, H, T = att.num_layers, att.num_heads, len(att.tokens)
    per_head = T * T * (2 if att.sentence_b_start is not None else 1)  # bertviz repeats A/B pairs
    if bertviz_view == "head":
        return _spread(L, max(1, budget // (per_head * H))), list(range(H))
    cells = max(1, budget // per_head)  # thumbnails that fit
    n_layers = min(L, max(1, round((cells * L / H) ** 0.5)))
    return _spread(L, n_layers), _spread(H, max(1, cells // n_layers))


def _spread(n: int, k: int) -> list[int]:
    """k indices out of range(n), evenly spread and centred (all of them when k >= n)."""
    if k >= n:
        return list(range(n))
    return sorted({min(n - 1, round((i + 0.5) * n / k - 0.5)) for i in range(k)})


def bertviz_html(att: Attention, bertviz_view: str = "head", layers: list[int] | None = None,
                 heads: list[int] | None = None, script_urls: dict[str, str] | None = None,
                 decimals: int | None = None, max_weights: int = MAX_VIEW_WEIGHTS, first_layer: int = 0,
                 first_head: int = 0) -> str:
    """A complete HTML document with bertviz's head view (`bertviz_view="head"`) or model view ("model").

    `layers` and `heads` (model view only) filter what is sent, None for `default_selection`;
    weights are rounded to `decimals` (None: 3, or 2 when over 100k weights are sent, which keeps
    a 128-token default view under 1 MB; bertviz draws weights under 0.005 invisibly thin anyway). Scripts come from `script_urls` ({"require", "d3",
    "jquery"} -> URL), by default inlined as data: URLs so the file works offline. Tokens are
    escaped for the <script> they sit in. A chosen view of more weights than `max_weights` (or
    than the default view, if that is more) raises ValueError: the page and its download would
    be too large. `layers` and `heads` count from 0; bertviz's own labels name them counted from
    `first_layer` and `first_head` (the page's 1 and 1: layer 0 is the embeddings; the head view
    labels no head, it colours them).
    """
    if bertviz_view not in {"head", "model"}:
        raise ValueError(f"Unknown bertviz view {bertviz_view!r}: use 'head' or 'model'.")
    auto_layers, auto_heads = default_selection(att, bertviz_view)
    layers = sorted({_check_index(x, att.num_layers, "layer") for x in layers}) if layers else auto_layers
    heads = sorted({_check_index(x, att.num_heads, "head") for x in heads}) if heads else auto_heads
    def weights_sent(n_layers: int, n_heads: int) -> int:
        return n_layers * (n_heads if bertviz_view == "model" else att.num_heads) * len(att.tokens) ** 2

    sent = weights_sent(len(layers), len(heads))
    pair = 2 if att.sentence_b_start is not None else 1  # bertviz repeats A/B pairs
    limit = max(max_weights, pair * weights_sent(len(auto_layers), len(auto_heads)))  # never below the default
    if pair * sent > limit:
        raise ValueError(f"That view would hold {pair * sent:,} attention weights; at most {limit:,} "
                         "fit in one page. Tick fewer layers or heads, or shorten the text.")
    if decimals is None:
        decimals = 3 if sent <= 100_000 else 2
    rounded = torch.from_numpy(np.round(att.weights[layers].astype(np.float64), decimals))
    unused = torch.zeros(1, att.num_heads, 1, 1)  # bertviz indexes by layer number, reads only `layers`
    per_layer = [unused] * att.num_layers
    for i, layer in enumerate(layers):
        per_layer[layer] = rounded[i:i + 1]  # (1, H, T, T)
    common = dict(attention=per_layer, tokens=[shown_token(t) for t in att.tokens], sentence_b_start=att.sentence_b_start,
                  include_layers=layers, html_action="return")
    if bertviz_view == "head":
        body = head_view(**common, layer=layers[0]).data
    else:
        body = model_view(**common, include_heads=heads, display_mode="light").data
    body = _script_safe_params(body, bertviz_view)
    body = _layer_labels(body, bertviz_view, first_layer) if first_layer else body
    body = _head_labels(body, first_head) if first_head and bertviz_view == "model" else body
    body = _local_scripts(body, script_urls or data_urls())
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>bertviz "
            f"{bertviz_view} view</title></head>\n<body style=\"margin:8px\">{body}</body></html>")


def _script_safe_params(body: str, bertviz_view: str) -> str:
    """Re-serialize bertviz's params JSON so no token can end the <script> it sits in.

    bertviz writes `json.dumps(params)` into a <script>: a token `</script>` would close it. It
    also pastes the JSON a second time into a comment naming the marker; we keep only the code's.
    `<`, `>` and `&` only occur inside JSON strings, where `\\u003c` etc. mean the same.
    """
    template = (Path(bertviz.__file__).parent / f"{bertviz_view}_view.js").read_text()
    prefix = template[:template.index("PYTHON_PARAMS")]
    start = body.index(prefix) + len(prefix)
    params, end = json.JSONDecoder().raw_decode(body, start)
    safe = (json.dumps(_integral_floats_as_ints(params), separators=(",", ":")).replace("<", "\\u003c")
            .replace(">", "\\u003e").replace("&", "\\u0026"))
    return body[:start] + safe + body[end:].replace(body[start:end], "PYTHON_PARAMS")  # once, not twice


# Where bertviz's scripts write a layer's number for the reader (its index, from 0)
_LAYER_LABELS = {"head": [".val(layer).text(layer)"],
                 "model": [".text(config.layers[i])", "'Layer ' + config.layers[layerIndex]"]}


def _layer_labels(body: str, bertviz_view: str, first_layer: int) -> str:
    """bertviz's layer labels counted from `first_layer` (its data keeps the indices)."""
    for label in _LAYER_LABELS[bertviz_view]:
        if label not in body:
            raise RuntimeError(f"bertviz's {bertviz_view} view no longer writes {label!r}: update _LAYER_LABELS.")
        shifted = (label.replace(".text(layer)", f".text(layer + {first_layer})")
                   .replace(".text(config.layers[i])", f".text(config.layers[i] + {first_layer})")
                   .replace("config.layers[layerIndex]", f"(config.layers[layerIndex] + {first_layer})"))
        body = body.replace(label, shifted)
    return body


# Where bertviz's model view writes a head's number for the reader (its index, from 0)
_HEAD_LABELS = {".text(config.heads[i])": ".text(config.heads[i] + {first})",
                "\", Head \" + config.heads[headIndex]": "\", Head \" + (config.heads[headIndex] + {first})"}


def _head_labels(body: str, first_head: int) -> str:
    """bertviz's model view's head labels counted from `first_head` (its data keeps the indices)."""
    for label, shifted in _HEAD_LABELS.items():
        if label not in body:
            raise RuntimeError(f"bertviz's model view no longer writes {label!r}: update _HEAD_LABELS.")
        body = body.replace(label, shifted.format(first=first_head))
    return body


def _integral_floats_as_ints(value):
    """0.0 -> 0 and 1.0 -> 1 throughout: most rounded weights of a long sentence are 0, and "0"
    is half the bytes of "0.0" (JavaScript reads both as the same number)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_integral_floats_as_ints(v) for v in value]
    if isinstance(value, dict):
        return {k: _integral_floats_as_ints(v) for k, v in value.items()}
    return value


def _local_scripts(body: str, urls: dict[str, str]) -> str:
    """Point bertviz's require.js, d3 and jQuery at `urls` instead of the internet."""
    def require_src(match: re.Match) -> str:
        if "require" not in match.group(2):
            raise RuntimeError(f"bertviz loads a script we do not vendor: {match.group(2)}")
        return match.group(1) + urls["require"] + match.group(3)

    body = _SCRIPT_SRC.sub(require_src, body)
    # require.js appends ".js" to its paths itself
    body = _REQUIRE_PATH.sub(lambda m: f"{m.group(1)}: '{urls[m.group(1)].removesuffix('.js')}'", body)
    if _SCRIPT_SRC.search(body) or _REQUIRE_PATH.search(body):
        raise RuntimeError("bertviz still names an online script: vendor it under assets/vendor.")
    return body


def standalone(document: str, script_urls: dict[str, str]) -> str:
    """`document` (built with `script_urls`) with those scripts inlined as data: URLs instead."""
    inline = data_urls()
    for name, url in script_urls.items():
        document = document.replace(url if name == "require" else url.removesuffix(".js"), inline[name])
    return document


def data_urls() -> dict[str, str]:
    """The vendored scripts as data: URLs, for a standalone file: read when asked (420 kB, about
    2 ms), so no module keeps them between requests."""
    return {name: "data:text/javascript;base64," + base64.b64encode(path.read_bytes()).decode()
            for name, path in VENDORED.items()}


def script_urls(file_route: str) -> dict[str, str]:
    """URLs of the vendored scripts under a route that serves files by their path (the web app
    passes its own, e.g. Gradio's), relative to the page."""
    return {name: file_route + quote(str(path)) for name, path in VENDORED.items()}


def srcdoc_iframe(document: str, height: int, title: str = "bertviz") -> str:
    """An <iframe> showing `document`, which may run scripts but cannot reach the page around it."""
    return (f'<iframe srcdoc="{html.escape(document, quote=True)}" sandbox="allow-scripts" '
            f'title="{html.escape(title, quote=True)}" '
            f'style="width:100%;height:{int(height)}px;border:1px solid #ddd;border-radius:6px"></iframe>')


def view_height(att: Attention, bertviz_view: str, n_layers: int) -> int:
    """Pixels the bertviz view needs, from the layout constants in bertviz's head/model_view.js."""
    T = len(att.tokens)
    if bertviz_view == "head":
        return 90 + int(22.5 * T)
    thumbnail = T * 7 * 12 / att.num_heads + 10
    return 60 + int(max(n_layers * thumbnail + 38, T * 18 + 55))
