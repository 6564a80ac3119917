"""One declaration per encoder family: where its layers, attention and MLM head are, how its
attention scores are formed where they are not q.k, and its wiring for the circuits (`Wiring`).
Adding a family is one `Family` in `FAMILIES` (and its test); a BERT-like model not declared
is discovered from its modules (`discover`). `anatomy.of(model)` reads them.
Imports torch and transformers only.
"""
from __future__ import annotations

import functools
import math
import sys
from dataclasses import dataclass
from typing import Callable

import torch
from transformers.activations import gelu


def part_at(root, path: str | None):
    """`root.a.b.c` for "a.b.c", None where any part is missing (or path is None)."""
    if path is None:
        return None
    try:
        return functools.reduce(getattr, path.split("."), root)
    except AttributeError:
        return None


# ---------------------------------------------------------------- the MLM heads, one per kind

def bert_head(path: str):
    """BERT's head (`BertLMPredictionHead`): `transform` (dense, act, LayerNorm), then `decoder`."""
    def head(model):
        module = part_at(model, path)
        if module is None or not (hasattr(module, "decoder") and hasattr(module, "transform")):
            return None
        return module.transform, module.decoder
    return head


def dense_act_norm_head(path: str, dense: str, act: str | None, norm: str, decoder: str):
    """A head written out: `norm(act(dense(h)))` then `decoder`; `act` None is exact GELU
    (RoBERTa's `gelu`), a path names the module's own activation. Paths relative to `path`."""
    def head(model):
        root = part_at(model, path) if path else model
        parts = [part_at(root, p) for p in (dense, norm, decoder)]
        if root is None or any(p is None for p in parts):
            return None
        activation = gelu if act is None else part_at(root, act)
        d, n, out = parts
        return (lambda h: n(activation(d(h)))), out
    return head


def mobilebert_head(model):
    """MobileBERT's head multiplies by [decoder.weight.T; dense.weight] (the decoder covers the
    embedding width, `dense` the rest of the hidden size): `MobileBertLMPredictionHead.forward`."""
    predictions = part_at(model, "cls.predictions")
    if predictions is None:
        return None
    decoder = _Product(lambda: torch.cat([predictions.decoder.weight.t(), predictions.dense.weight], dim=0),
                       predictions.decoder.bias)
    return predictions.transform, decoder


def deberta_head(model):
    """DeBERTa-v2: the legacy BERT-style `cls` head, or `lm_predictions` against the word embeddings."""
    legacy = bert_head("cls.predictions")(model)
    if legacy is not None:
        return legacy
    head = part_at(model, "lm_predictions.lm_head")
    if head is None:
        return None
    embeddings = model.get_input_embeddings()
    decoder = _Product(lambda: embeddings.weight.t(), head.bias)
    return (lambda h: head.LayerNorm(head.transform_act_fn(head.dense(h)))), decoder


def plain_head(path: str):
    """A head that is one Linear on the (already normed) hidden states: EuroBERT's `lm_head`."""
    def head(model):
        decoder = part_at(model, path)
        return None if decoder is None else ((lambda h: h), decoder)
    return head


class _Product:
    """A decoder that is not one Linear: x (N, in) @ matrix() (in, V) + bias, in the head's own order."""

    def __init__(self, matrix: Callable[[], torch.Tensor], bias: torch.Tensor | None):
        self.matrix, self.bias = matrix, bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = x.matmul(self.matrix())
        return out if self.bias is None else out + self.bias


# ---------------------------------------------------------------- score terms beyond q.k

@dataclass(frozen=True)
class ScoreCapture:
    """How a family that runs its own attention forms its scores, for `hooks` to read them.

    `query`/`key`: paths (within a layer) of the projections whose outputs (B, T, heads * d) are
    the queries and keys; `scale(module, d)`: the factor on q.k; `prepare(attention, kwargs, q, k)`:
    queries and keys as the model scores them (e.g. after the rotary encoding), from the
    self-attention module's call; `extra(attention, kwargs, q, k)`: a (B, heads, T, T) term added
    to the scores (MPNet's relative-position bias, DeBERTa's disentangled terms), or None."""

    query: str
    key: str
    scale: Callable[[torch.nn.Module, int], float] = lambda module, d: d ** -0.5
    prepare: Callable | None = None
    extra: Callable | None = None


def _roformer_rotary(attention, kwargs, q, k):
    """RoFormer's rotary encoding of (B, heads, T, d) queries and keys, as its self-attention
    applies it (`apply_rotary_position_embeddings`) with the encoder's sinusoidal positions."""
    positions = kwargs.get("sinusoidal_pos")
    if positions is None:
        return q, k
    return attention.apply_rotary_position_embeddings(positions, q, k)


def _mpnet_bias(attention, kwargs, q, k):
    return kwargs.get("position_bias")


def _deberta_scale(module, d: int) -> float:
    factor = 1 + len(set(module.pos_att_type) & {"c2p", "p2c"})
    return 1.0 / math.sqrt(d * factor)


def _deberta_terms(attention, kwargs, q, k):
    """DeBERTa's content-to-position and position-to-content terms (B, heads, T, T), as its
    `disentangled_attention_bias` computes them for these queries and keys."""
    if not attention.relative_attention:
        return None
    batch, heads, length, d = q.shape
    flat_q, flat_k = q.reshape(batch * heads, length, d), k.reshape(batch * heads, length, d)
    factor = 1 + len(set(attention.pos_att_type) & {"c2p", "p2c"})
    rel = attention.disentangled_attention_bias(flat_q, flat_k, kwargs.get("relative_pos"),
                                                kwargs.get("rel_embeddings"), factor)
    return None if rel is None else rel.view(batch, heads, length, length)


# ---------------------------------------------------------------- one declaration per family

@dataclass(frozen=True)
class Wiring:
    """How a layer's blocks are wired, for a view that rebuilds the forward from its parts (the
    circuits' frozen replacement) or reads and edits the feed-forward block (its transcoders).
    Paths are within one layer, except `embedding_norm`/`embedding_project` (from the base model)
    and `head` (from the *ForMaskedLM).

    Post-LayerNorm (BERT): h = norm_a(h + attention(h)); h = norm_m(h + mlp(h)).
    Pre-LayerNorm (ModernBERT): h = h + attention(norm_a(h)); h = h + mlp(norm_m(h)); the family's
    `final_norm` after the last layer."""

    norm_first: bool
    attention_norm: str  # the norm after (post-LN) or before (pre-LN) attention; may be an Identity
    mlp_norm: str
    value: str  # the value projection (H -> heads * d); with `fused_qkv` the one projection of q, k, v
    mlp: tuple[str, ...]  # the feed-forward block as modules called in turn: its input is the first's
    embedding_norm: str  # the norm the embeddings' sum goes through (its input: the token nodes)
    head: tuple[str, str | None, str, str]  # dense, activation (None: exact GELU), norm, decoder
    fused_qkv: bool = False  # (B, T, 3 * H) laid out as (3, heads, d): the values are the last third
    embedding_project: str | None = None  # a Linear from the embedding width to the hidden size


_BERT_WIRING = dict(norm_first=False, attention_norm="attention.output.LayerNorm", mlp_norm="output.LayerNorm",
                    value="attention.self.value", mlp=("intermediate", "output.dense"),
                    embedding_norm="embeddings.LayerNorm")
_BERT_HEAD = ("cls.predictions.transform.dense", "cls.predictions.transform.transform_act_fn",
              "cls.predictions.transform.LayerNorm", "cls.predictions.decoder")
_ROBERTA_WIRING = Wiring(**_BERT_WIRING, head=("lm_head.dense", None, "lm_head.layer_norm", "lm_head.decoder"))


@dataclass(frozen=True)
class Family:
    """Where one architecture keeps its parts. Paths are attribute paths: `layers` and
    `final_norm` from the base model (`model.base_model`), `attention`, `output` and the
    scorer from one layer, the head from the *ForMaskedLM."""

    name: str
    layers: str  # the layer list, e.g. "encoder.layer"
    attention: str  # the self-attention module that computes the scores, within a layer
    output: str  # the Linear after the heads (its input: heads side by side), within a layer
    head: Callable  # model -> (transform, decoder) or None
    scores: ScoreCapture | None = None  # None: through transformers' attention interface
    final_norm: str | None = None
    lean: bool = False  # BERT's own layer layout: the lean forward and ONNX Runtime serve it
    padding_sensitive: bool = False  # its answer depends on the padding after a sentence (`batches`)
    fixed_length: Callable | None = None  # config -> the one length its forward takes, or None: any
    rows_apart: Callable | None = None  # layers -> None: where its padded forward mixes a batch's rows, no more
    unroll: Callable | None = None  # model -> the layers in calling order (ALBERT's shared ones)
    head_views: bool = True  # False: its heads are not what the head views can switch or score
    attention_weights: bool = True  # False: it has no attention maps to show (see `notes`)
    residual_stream: bool = True  # False: its layers do not pass one (B, T, H) state on (see `notes`)
    wiring: Wiring | None = None  # None: no view rebuilds its layers from their parts (circuits)
    notes: str = ""


def _nystromformer_length(config) -> int | None:
    """Nystromformer's landmarks are means over `segment_means_seq_len // num_landmarks` positions,
    cut by a fixed reshape (`NystromformerSelfAttention.forward`): with fewer landmarks than
    `segment_means_seq_len` its forward takes exactly num_landmarks * (segment_means_seq_len //
    num_landmarks) tokens (the original model pads every input to it); with as many, it runs full
    attention at any length."""
    landmarks, length = config.num_landmarks, config.segment_means_seq_len
    return None if landmarks == length else landmarks * (length // landmarks)


def _nystromformer_rows_apart(layers) -> None:
    """Each layer's `iterative_inv` scaled per sentence (`_own_rows_inverse`)."""
    for layer in layers:
        attention = layer.attention.self
        attention.iterative_inv = functools.partial(_own_rows_inverse, attention)


def _own_rows_inverse(attention, mat: torch.Tensor, n_iter: int = 6) -> torch.Tensor:
    """`NystromformerSelfAttention.iterative_inv` of (B, heads, m, m) with its first guess scaled per
    sentence: the original scales it by the largest column sum of the whole batch, so a sentence's
    answer moved with the others in its batch (1e-2 in logits); alone, the two are the same."""
    identity = torch.eye(mat.size(-1), device=mat.device)
    key = mat
    if attention.init_option == "original":
        value = key.transpose(-1, -2) / torch.sum(key, dim=-2).amax(dim=(-2, -1))[:, None, None, None]
    else:
        value = 1 / torch.max(torch.sum(key, dim=-2), dim=-1).values[:, :, None, None] * key.transpose(-1, -2)
    for _ in range(n_iter):
        key_value = torch.matmul(key, value)
        value = torch.matmul(0.25 * value, 13 * identity - torch.matmul(
            key_value, 15 * identity - torch.matmul(key_value, 7 * identity - key_value)))
    return value


_BERT_SCORES = ScoreCapture("attention.self.query", "attention.self.key")
_ROBERTA_HEAD = dense_act_norm_head("lm_head", "dense", None, "layer_norm", "decoder")


def _albert_calls(model) -> list:
    """ALBERT's layers as the encoder calls them: layer i runs group i * groups // L, each
    group's `inner_group_num` layers in turn (AlbertTransformer.forward)."""
    config, encoder = model.config, model.base_model.encoder
    per_group = config.num_hidden_layers / config.num_hidden_groups
    return [layer for i in range(config.num_hidden_layers)
            for layer in encoder.albert_layer_groups[int(i / per_group)].albert_layers]


_BERT = dict(layers="encoder.layer", attention="attention.self", output="attention.output.dense")
FAMILIES: dict[str, Family] = {
    "bert": Family("BERT", head=bert_head("cls.predictions"), lean=True, wiring=Wiring(**_BERT_WIRING, head=_BERT_HEAD),
                   **_BERT),
    "roberta": Family("RoBERTa", head=_ROBERTA_HEAD, lean=True, wiring=_ROBERTA_WIRING, **_BERT),
    "xlm-roberta": Family("XLM-R", head=_ROBERTA_HEAD, lean=True, wiring=_ROBERTA_WIRING, **_BERT),
    "camembert": Family("CamemBERT", head=_ROBERTA_HEAD, lean=True, wiring=_ROBERTA_WIRING, **_BERT),
    "data2vec-text": Family("Data2Vec-text", head=_ROBERTA_HEAD, wiring=_ROBERTA_WIRING, **_BERT),
    "ernie": Family("ERNIE", head=bert_head("cls.predictions"), wiring=Wiring(**_BERT_WIRING, head=_BERT_HEAD), **_BERT),
    "electra": Family("ELECTRA", head=dense_act_norm_head("", "generator_predictions.dense",
                                                          "generator_predictions.activation",
                                                          "generator_predictions.LayerNorm",
                                                          "generator_lm_head"),
                        wiring=Wiring(**_BERT_WIRING, embedding_project="embeddings_project",
                                      head=("generator_predictions.dense", "generator_predictions.activation",
                                            "generator_predictions.LayerNorm", "generator_lm_head")), **_BERT),
    "mobilebert": Family("MobileBERT", head=mobilebert_head, **_BERT),
    "roberta-prelayernorm": Family("RoBERTa-PreLayerNorm", head=_ROBERTA_HEAD, final_norm="LayerNorm", **_BERT),
    "xlm-roberta-xl": Family("XLM-R XL", head=_ROBERTA_HEAD, final_norm="encoder.LayerNorm", **_BERT),
    "megatron-bert": Family("Megatron-BERT", head=bert_head("cls.predictions"), scores=_BERT_SCORES,
                            final_norm="encoder.ln", **_BERT),
    "big_bird": Family("BigBird", head=bert_head("cls.predictions"), scores=_BERT_SCORES,
                       notes="attention weights in its full-attention mode (short inputs)", **_BERT),
    "roformer": Family("RoFormer", head=bert_head("cls.predictions"),
                       scores=ScoreCapture("attention.self.query", "attention.self.key",
                                           prepare=_roformer_rotary), **_BERT),
    "deberta-v2": Family("DeBERTa-v2/v3", head=deberta_head,
                         scores=ScoreCapture("attention.self.query_proj", "attention.self.key_proj",
                                             scale=_deberta_scale, extra=_deberta_terms), **_BERT),
    "mpnet": Family("MPNet", layers="encoder.layer", attention="attention.attn", output="attention.attn.o",
                    head=_ROBERTA_HEAD, scores=ScoreCapture("attention.attn.q", "attention.attn.k",
                                                            extra=_mpnet_bias)),
    "distilbert": Family("DistilBERT", layers="transformer.layer", attention="attention",
                         output="attention.out_lin",
                         head=dense_act_norm_head("", "vocab_transform", "activation", "vocab_layer_norm",
                                                  "vocab_projector")),
    "albert": Family("ALBERT", layers="encoder.albert_layer_groups", attention="attention",
                     output="attention.dense", unroll=_albert_calls,
                     head=dense_act_norm_head("predictions", "dense", "activation", "LayerNorm", "decoder")),
    "modernbert": Family("ModernBERT", layers="layers", attention="attn", output="attn.Wo",
                         final_norm="final_norm",
                         head=dense_act_norm_head("", "head.dense", "head.act", "head.norm", "decoder"),
                         wiring=Wiring(norm_first=True, attention_norm="attn_norm", mlp_norm="mlp_norm",
                                       value="attn.Wqkv", fused_qkv=True, mlp=("mlp",),
                                       embedding_norm="embeddings.norm",
                                       head=("head.dense", "head.act", "head.norm", "decoder"))),
    "eurobert": Family("EuroBERT", layers="layers", attention="self_attn", output="self_attn.o_proj",
                       final_norm="norm", head=plain_head("lm_head")),
    "fnet": Family("FNet", layers="encoder.layer", attention="fourier", output="fourier.output.dense",
                   head=bert_head("cls.predictions"), padding_sensitive=True, head_views=False,
                   attention_weights=False,
                   notes="it mixes tokens with a Fourier transform: it has no attention weights or heads"),
    "funnel": Family("Funnel", layers="encoder.blocks", attention="attention", output="attention.post_proj",
                     head=plain_head("lm_head"), head_views=False, attention_weights=False,
                     residual_stream=False, padding_sensitive=True,  # its pooling averages padding in
                     notes="it pools the sequence between its blocks, so its attention maps shrink layer "
                           "by layer and its heads are not BERT's"),
    "convbert": Family("ConvBERT", head=bert_head("cls.predictions"), padding_sensitive=True,
                       scores=_BERT_SCORES, head_views=False,
                       notes="half of each layer's heads are convolutions over the sequence, not attention",
                       **_BERT),
    # a convolution over the values (conv_kernel_size) sees the padding; with fewer landmarks than
    # segment_means_seq_len its scores are no softmax of q.k, every input is padded to its one length
    # and its landmarks' inverse is made per sentence (it was scaled by the whole batch)
    "nystromformer": Family("Nystromformer", head=bert_head("cls.predictions"), scores=_BERT_SCORES,
                            padding_sensitive=True, fixed_length=_nystromformer_length,
                            rows_apart=_nystromformer_rows_apart, **_BERT),
}


def discover(model) -> Family | None:
    """A Family for an undeclared model whose modules have BERT's layout (BertLayer copies, a
    BERT- or RoBERTa-style head), else None."""
    base = getattr(model, "base_model", None)
    stack = part_at(base, "encoder.layer")
    if not stack or not all(part_at(layer, "attention.self.query") is not None and
                            isinstance(part_at(layer, "attention.output.dense"), torch.nn.Linear) for layer in stack):
        return None
    if bert_head("cls.predictions")(model) is not None:
        head = bert_head("cls.predictions")
    elif _ROBERTA_HEAD(model) is not None:
        head = _ROBERTA_HEAD
    else:
        head = lambda m: None  # noqa: E731 - fill mask takes the model's own forward
    # the modelling module dispatches through transformers' attention interface, or scores by itself
    uses_interface = hasattr(sys.modules.get(type(model).__module__), "ALL_ATTENTION_FUNCTIONS")
    return Family(f"{model.config.model_type} (discovered)", head=head,
                  scores=None if uses_interface else _BERT_SCORES, **_BERT)


# ---------------------------------------------------------------- the BERT layout's modules (the lean forward, the ONNX export)

def bert_layer_parts(layer):
    """A BERT-layout layer's modules for the lean forward (`lean_forward`): its self-attention
    (query, key, value, scaling, dropout), the attention output (dense, dropout, LayerNorm), the
    intermediate dense and activation, and the output (dense, dropout, LayerNorm)."""
    return _BertParts(layer.attention.self, layer.attention.output, layer.intermediate, layer.output)


@dataclass(frozen=True)
class _BertParts:
    self_attention: torch.nn.Module  # .query .key .value .num_attention_heads .scaling .dropout
    attention_output: torch.nn.Module  # .dense .dropout .LayerNorm
    intermediate: torch.nn.Module  # .dense .intermediate_act_fn
    output: torch.nn.Module  # .dense .dropout .LayerNorm


def embeddings(model):
    """The base model's embedding module."""
    return model.base_model.embeddings


def head_module(model) -> torch.nn.Module:
    """The MLM head as one module (what the ONNX export traces), for `lean` models."""
    return model.cls if hasattr(model, "cls") else model.lm_head
