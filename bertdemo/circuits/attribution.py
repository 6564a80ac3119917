"""How an encoder reaches a [MASK] prediction: the attribution graph of one sentence.

    graph = attribution_graph(lm, "Paris is the [MASK] of France.")        # the mask's top words
    graph = attribution_graph(lm, text, target="capital")                   # one word
    graph = attribution_graph(lm, text, target=("capital", "city"))         # their logit difference
    graph.nodes, graph.edges, graph.scores

The sentence goes through its local replacement model (`replacement`): linear in its nodes, so
the direct effect of a source on a target is exact: the gradient of the target with respect to
the source's value, times that value, with every other node held (features are leaves: no path
runs through another feature's encoder). A target's incoming edges and its bias (the replacement
run with every leaf at zero) add up to its clean value (`check_exactness`).

The edges into a batch of targets of one layer come from one pass through the replacement's
transpose, written out (`Replacement.gradients_at_block_input`, `gradients_at_logits`): each
target's cotangent is one row of the batch. (torch's batched backward, `is_grads_batched`, gave
the same rows about 2x slower on a CPU, copying its batch at every broadcast.) Rows are computed
for the logit nodes first, then for features in order of their influence on the logits as far
as it is known (circuit-tracer's order), up to `max_feature_nodes`; a feature left without a row
is still a source of edges.
"""
from __future__ import annotations

import time

import torch

from .. import validate
from ..forward import anatomy, mlp_points
from ..model.loading import LoadedModel
from ..views.fillmask import USER_MASK, USER_MASK_RE
from .graph import Adjacency, Graph, Node, assemble, influence, normalized
from .replacement import NORMS, Gradients, Leaves, Replacement, Sentence, demeaned

MAX_TOKENS = 64  # the operator's limit on a sentence (special tokens included): --circuit-tokens
MAX_WORDS = 10  # logit nodes at most
TOP_SHARE = 0.95  # the mask's top words until their probabilities sum to this
MAX_FEATURE_NODES = 4096
BATCH = 512  # targets per pass through the transpose
MAX_ENTRIES = 16_000_000  # rows x columns of the adjacency kept (64 MB in float32)


def encode(lm: LoadedModel, text: str, mask: int = 1, max_tokens: int = MAX_TOKENS) -> tuple[dict, int]:
    """({"input_ids", "attention_mask", ...} (1, T), the position of the `mask`-th [MASK]).
    ValueError: no [MASK], `mask` past the number of masks, a sentence over `max_tokens`."""
    validate.text(text)
    masks = len(USER_MASK_RE.findall(text))
    if masks == 0:
        raise validate.InputError("text", f"No {USER_MASK} in the text: put {USER_MASK} where the word whose "
                                          "prediction you want explained goes, e.g. 'Paris is the [MASK] of France.'")
    mask = validate.whole_number(mask, "mask", 1, masks, f" (the text has {masks} {USER_MASK}"
                                 f"{'s' if masks > 1 else ''}: 1 is the first)", field="mask")
    inputs = dict(lm.tokenizer(lm.to_model_text(text), return_tensors="pt"))
    length = inputs["input_ids"].shape[1]
    validate.tokens_at_most(length, min(max_tokens, lm.max_length), lm.name, "sentence for a circuit")
    positions = (inputs["input_ids"][0] == lm.mask_token_id).nonzero().flatten().tolist()
    return {k: v.to(lm.device) for k, v in inputs.items()}, positions[mask - 1]


def coded_positions(lm: LoadedModel, ids: torch.Tensor) -> torch.Tensor:
    """(T,) bool: the positions transcoders read (every real token and [MASK]; not [CLS], [SEP])."""
    from ..features.data import kept_positions

    return kept_positions(lm, ids[None].cpu(), torch.ones(1, len(ids), dtype=torch.long))[0]


def target_words(lm: LoadedModel, logits: torch.Tensor, target, words: int = MAX_WORDS
                 ) -> tuple[torch.Tensor, torch.Tensor, str]:
    """(word ids (n,), their weights (n,), the target in words). None: the mask's top words until
    their probabilities sum to 0.95 (at most `words`), weighted by probability; a word: that word,
    weight 1; two words: the first's logit minus the second's (weights 1, -1)."""
    probabilities = logits.float().softmax(-1)
    if target is None or target == "" or target == []:
        top = probabilities.topk(min(words, len(probabilities)))
        count = int(torch.searchsorted(top.values.cumsum(0), torch.tensor(TOP_SHARE))) + 1
        ids = top.indices[:min(count, len(top.indices))]
        return ids, probabilities[ids].to(logits.dtype), "the mask's top words, by probability"
    named = [target] if isinstance(target, str) else list(target)
    if not 1 <= len(named) <= 2:
        raise validate.InputError("target", "The target is one word, or two words to compare (their logit difference).")
    ids = torch.tensor([_word_id(lm, w) for w in named])
    if len(ids) == 2:
        return ids, torch.tensor([1.0, -1.0], dtype=logits.dtype), f"logit of {named[0]!r} minus {named[1]!r}"
    return ids, torch.ones(1, dtype=logits.dtype), f"logit of {named[0]!r}"


def _word_id(lm: LoadedModel, word) -> int:
    if not isinstance(word, str) or not word.strip():
        raise validate.InputError("target", "A target word is a word of the vocabulary, e.g. 'capital'.")
    pieces = lm.tokenizer.tokenize(word.strip())
    candidates = [word.strip(), *pieces[:1]] if len(pieces) == 1 else [word.strip()]
    for candidate in candidates:
        found = lm.tokenizer.convert_tokens_to_ids(candidate)
        if found is not None and found != lm.tokenizer.unk_token_id:
            return int(found)
    raise validate.InputError("target", f"{word!r} is not one word of {lm.name}'s vocabulary (it reads it as "
                                        f"{' + '.join(pieces) or 'nothing'}): pick a word it predicts whole.")


class _Columns:
    """Where each source node sits in a row: features (layer, position, slot), errors (layer,
    position), tokens (position)."""

    def __init__(self, sentence: Sentence, layers: int):
        self.features: list[tuple[int, int, int]] = []
        for layer in range(1, layers + 1):
            acts = sentence.leaves.features[layer]
            for position, slot in (acts > 0).nonzero().tolist():
                self.features.append((layer, position, slot))
        self.slots = torch.tensor(self.features, dtype=torch.long).reshape(-1, 3)  # (features, 3)
        self.by_layer = {layer: (self.slots[:, 0] == layer).nonzero().flatten() for layer in range(1, layers + 1)}
        length = len(sentence.tokens)
        self.errors_at = len(self.features)
        self.tokens_at = self.errors_at + layers * length
        self.count = self.tokens_at + length
        self.length, self.layers = length, layers

    def error(self, layer: int, position: int) -> int:
        return self.errors_at + (layer - 1) * self.length + position


def _rows_from_grads(grads: Gradients, leaves: Leaves, columns: _Columns, layers: int) -> torch.Tensor:
    """(n, C): each target's direct effects, its gradients with respect to the leaves times the
    leaves' values (a vector leaf's summed over its dimensions)."""
    n = grads.tokens.shape[0]
    rows = torch.zeros(n, columns.count, dtype=leaves.tokens.dtype)
    rows[:, columns.tokens_at:] = (grads.tokens * leaves.tokens).sum(-1)
    for layer in range(1, layers + 1):
        if layer in grads.features:
            chosen = columns.by_layer[layer]
            p, s = columns.slots[chosen, 1], columns.slots[chosen, 2]
            rows[:, chosen] = grads.features[layer][:, p, s] * leaves.features[layer][p, s]
            start = columns.error(layer, 0)
            rows[:, start:start + columns.length] = grads.error_effects[layer]
    return rows


class _Attributor:
    """One sentence's replacement and the rows read from it: each batch of targets' gradients
    through the replacement's transpose (`Replacement.gradients_at_*`), times the leaves."""

    def __init__(self, replacement: Replacement, sentence: Sentence, words: torch.Tensor, weights: torch.Tensor):
        self.replacement, self.sentence = replacement, sentence
        self.layers = replacement.layers
        self.leaves = sentence.leaves
        reads, zero_reads = {}, {}
        with torch.no_grad():
            self.logits = demeaned(replacement.forward(sentence, self.leaves, reads=reads))[words]  # (n,)
            self.pre = {l: replacement.pre_activations(sentence, l, reads) for l in range(1, self.layers + 1)}
            self.logit_bias = demeaned(replacement.forward(sentence, sentence.leaves.zeros(), reads=zero_reads))[words]
            self.pre_bias = {l: replacement.pre_activations(sentence, l, zero_reads) for l in range(1, self.layers + 1)}
        self.columns = _Columns(sentence, self.layers)
        self.words, self.weights = words, weights

    @torch.no_grad()
    def logit_rows(self) -> torch.Tensor:
        directions = self.replacement.decoder_rows(self.words)
        grads = self.replacement.gradients_at_logits(self.sentence, directions)
        return _rows_from_grads(grads, self.leaves, self.columns, self.layers)

    @torch.no_grad()
    def feature_rows(self, chosen: list[int]) -> torch.Tensor:
        """(len(chosen), C): the rows of the features at column indices `chosen`, batched per layer."""
        rows = torch.zeros(len(chosen), self.columns.count, dtype=self.logits.dtype)
        by_layer: dict[int, list[int]] = {}
        for i, column in enumerate(chosen):
            by_layer.setdefault(self.columns.features[column][0], []).append(i)
        length = len(self.sentence.tokens)
        for layer, members in by_layer.items():
            encoder = self.replacement.transcoders[layer].coder.encoder.weight.to(self.logits.dtype)
            for start in range(0, len(members), BATCH):
                part = members[start:start + BATCH]
                cotangent = torch.zeros(len(part), length, encoder.shape[1], dtype=self.logits.dtype)
                for row, i in enumerate(part):
                    _, position, slot = self.columns.features[chosen[i]]
                    cotangent[row, position] = encoder[int(self.sentence.indices[layer][position, slot])]
                grads = self.replacement.gradients_at_block_input(self.sentence, layer, cotangent)
                rows[part] = _rows_from_grads(grads, self.leaves, self.columns, self.layers)
        return rows

    def feature_values(self, chosen: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(clean pre-activations, biases) of the features at `chosen`."""
        keys = [self.columns.features[c] for c in chosen]
        value = torch.stack([self.pre[l][p, s] for l, p, s in keys]) if keys else torch.zeros(0)
        bias = torch.stack([self.pre_bias[l][p, s] for l, p, s in keys]) if keys else torch.zeros(0)
        return value, bias


def transcoders_of(lm: LoadedModel, transcoders: dict | None) -> dict:
    if transcoders is not None:
        return transcoders
    from .transcoders import transcoders_for

    found = transcoders_for(lm)
    if not found:
        raise validate.InputError("model", f"{lm.name} has no transcoders yet, so there is no circuit to draw: train "
                                           "them (the Circuits tab's 'Train transcoders', or bertdemo.train_transcoders).")
    return found


@anatomy.guarded("Circuits")
def attribution_graph(lm: LoadedModel, text: str, mask: int = 1, target=None, *, transcoders: dict | None = None,
                      node_threshold: float = 0.8, edge_threshold: float = 0.98, words: int = MAX_WORDS,
                      max_feature_nodes: int = MAX_FEATURE_NODES, max_tokens: int = MAX_TOKENS,
                      labels: bool = True, norms: str = NORMS[0]) -> Graph:
    """The attribution graph of the `mask`-th [MASK] of `text` (see the module doc), pruned at
    the thresholds (`Graph.pruned_at` prunes again). `target`: None (the top words), a word, or
    two words (their logit difference). `transcoders`: {layer: Dictionary}, default the model's.
    `norms`: how the replacement freezes each norm, "slope" or "scale" (`replacement`'s doc)."""
    started = time.perf_counter()
    mlp_points.check(lm.model)  # a ValueError in words for a family that cannot be frozen
    graph_check_thresholds(node_threshold, edge_threshold)
    inputs, position = encode(lm, text, mask, max_tokens)
    replacement = Replacement(lm, transcoders_of(lm, transcoders), norms=norms)
    ids = inputs["input_ids"][0].cpu()
    tokens = lm.tokenizer.convert_ids_to_tokens(ids.tolist())
    sentence = replacement.trace(inputs, position, tokens, coded_positions(lm, ids))
    words_ids, weights, target_text = target_words(lm, sentence.logits, target, words)
    traced = time.perf_counter()
    attributor = _Attributor(replacement, sentence, words_ids, weights)
    adjacency = _adjacency(lm, attributor, max_feature_nodes, labels)
    done = time.perf_counter()
    return assemble(text, tokens, adjacency, node_threshold, edge_threshold, target_text,
                    {"trace": traced - started, "edges": done - traced, "seconds": time.perf_counter() - started})


def graph_check_thresholds(node_threshold, edge_threshold) -> None:
    for name, value in (("node_threshold", node_threshold), ("edge_threshold", edge_threshold)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
            raise validate.InputError(name, f"The {name.replace('_', ' ')} is {value!r}: it is a share of the "
                                            "total influence, between 0 and 1 (0.8 and 0.98 by default).")
    return float(node_threshold), float(edge_threshold)


def _adjacency(lm: LoadedModel, attributor: _Attributor, max_feature_nodes: int, labels: bool) -> Adjacency:
    """Rows for the logits, then for features in order of influence, up to `max_feature_nodes`."""
    columns = attributor.columns
    logit_rows = attributor.logit_rows()
    rows = [logit_rows]
    row_nodes = [-1 - i for i in range(len(attributor.words))]
    values = [attributor.logits.detach()]
    biases = [attributor.logit_bias]
    done: set[int] = set()
    # the adjacency's rows x columns within MAX_ENTRIES floats: pruning copies it a few times
    total = min(len(columns.features), max_feature_nodes, max(BATCH, MAX_ENTRIES // columns.count))
    while len(done) < total:
        current = Adjacency([], [], torch.cat(rows), torch.tensor(row_nodes), torch.zeros(0), torch.zeros(0),
                            attributor.weights, 0)
        estimate = influence(current, normalized(current.rows))[:len(columns.features)].clone()
        if done:
            estimate[list(done)] = -1.0
        batch = min(BATCH if len(columns.features) > total else len(columns.features), total - len(done))
        chosen = estimate.topk(batch).indices.tolist()
        rows.append(attributor.feature_rows(chosen))
        value, bias = attributor.feature_values(chosen)
        values.append(value)
        biases.append(bias)
        row_nodes += chosen
        done.update(chosen)
    nodes = _column_nodes(lm, attributor, labels)
    logits = [Node(f"{attributor.layers + 1}_{int(w)}_{attributor.sentence.mask}", "logit", attributor.layers + 1,
                   attributor.sentence.mask, int(w), float(p), _word(lm, int(w)), _word(lm, int(w)))
              for w, p in zip(attributor.words, attributor.weights)]
    framing = frozenset(int(p) for p in (~attributor.sentence.coded).nonzero().flatten())
    return Adjacency(nodes, logits, torch.cat(rows).detach(), torch.tensor(row_nodes), torch.cat(biases).detach(),
                     torch.cat(values).detach(), attributor.weights.detach().abs(), attributor.sentence.mask, framing,
                     {"words": attributor.words.tolist(), "features": len(columns.features), "feature_rows": len(done),
                      "norms": attributor.replacement.norms})


def _word(lm: LoadedModel, token_id: int) -> str:
    return lm.tokenizer.convert_ids_to_tokens(token_id)


def _column_nodes(lm: LoadedModel, attributor: _Attributor, labels: bool) -> list[Node]:
    sentence, columns = attributor.sentence, attributor.columns
    transcoders = attributor.replacement.transcoders
    named: dict[tuple[int, int], str] = {}

    def label(layer: int, feature: int) -> str:
        if (layer, feature) not in named:
            if labels and transcoders[layer].stats is not None:
                from ..features.labels import label as feature_label

                named[(layer, feature)] = feature_label(lm, transcoders[layer], feature)
            else:
                named[(layer, feature)] = f"feature {feature}"
        return named[(layer, feature)]

    nodes = []
    for layer, position, slot in columns.features:
        feature = int(sentence.indices[layer][position, slot])
        nodes.append(Node(f"{layer}_{feature}_{position}", "feature", layer, position, feature,
                          float(sentence.leaves.features[layer][position, slot]), label(layer, feature),
                          sentence.tokens[position]))
    for layer in range(1, attributor.layers + 1):
        for position in range(columns.length):
            nodes.append(Node(f"0_{layer}_{position}", "error", layer, position, None,
                              float(sentence.leaves.errors[layer][position].norm()),
                              f"what layer {layer}'s transcoder misses at {sentence.tokens[position]!r}",
                              sentence.tokens[position]))
    for position, token in enumerate(sentence.tokens):
        nodes.append(Node(f"E_{int(sentence.ids[position])}_{position}", "token", 0, position,
                          int(sentence.ids[position]), None, token, token))
    return nodes


def check_exactness(graph: Graph) -> float:
    """The largest gap, over every target row, between its incoming edges plus its bias and its
    clean value (a feature's pre-activation, a logit), relative to the size of what is added up
    (the edges' and the bias' magnitudes, at least the value's): a value that is a near-cancellation
    of large terms is exact to float32's rounding of those terms, not of the small result."""
    adjacency = graph.adjacency
    rebuilt = adjacency.rows.sum(1) + adjacency.bias
    scale = torch.maximum(adjacency.rows.abs().sum(1) + adjacency.bias.abs(), adjacency.value.abs()).clamp(min=1e-12)
    return float(((rebuilt - adjacency.value).abs() / scale).max())
