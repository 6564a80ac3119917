"""A BERT encoder forward that computes only what the hidden states at a few positions need.

Fill-mask reads the last layer at its masks only, and a batch of sentences is padded to the
longest. So here every layer runs its linear layers on the real tokens only (no padding rows),
and the last layer runs its attention output and feed-forward at the asked positions only (its
keys and values still come from every token). On a CPU in float32 (and bfloat16 where the CPU
multiplies it natively) the linear layers go through oneDNN: served, with frozen weights packed
once (`packed_linear`); trained, with the weights as they are and the input's gradient through
oneDNN too (`trained_linear`). Same modules, same
weights, same results as `model.base_model(**inputs).last_hidden_state[rows, cols]` up to float
rounding (~1e-6).
Written by hand because transformers runs every layer at every position, padding included
(its padding-free path needs flash-attention on a GPU). The packed weights live in a
`PackedWeights` the caller passes (an engine's, shared by the models it serves): none is kept here.
Only for the architectures whose layers are BERT's (`anatomy`'s `lean` families), with no probe active (`hooks`:
its hooks are on the modules this forward does not call) and no autocast: in eval mode without
grad (`supports`: serving), or while a copy is trained on a CPU (`trains`: the masked-LM loss
needs the last layer at the masked tokens only, ~7% of a bert-base step; every dropout drawn as
the model's own forward draws it, so a seeded run gives the same loss either way). `hidden_at`
returns None for anything else and the caller takes the usual forward.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary

from . import anatomy, hooks



def supports(model) -> bool:
    """Whether `hidden_at` can serve `model` (a *ForMaskedLM) as it is now: eval mode, no grad, and
    not while a probe (heads switched off, projections read) needs the modules' own calls
    (`hooks.active`)."""
    return not model.training and not torch.is_grad_enabled() and _runs(model)


def trains(model) -> bool:
    """Whether `hidden_at` can run `model` while it is trained: train mode on a CPU in float32
    (on a GPU, under autocast, the model's own forward runs)."""
    weight = model.get_input_embeddings().weight
    return (model.training and weight.device.type == "cpu" and weight.dtype == torch.float32
            and _runs(model))


def _runs(model) -> bool:
    config = model.config
    return (anatomy.of(model).lean and not hooks.active()
            # autocast (a fine-tune's evaluation on a GPU) would hand its layers bf16 rows to
            # write into float32 buffers: the model's own forward casts as autocast expects
            and not torch.is_autocast_enabled("cuda") and not torch.is_autocast_enabled("cpu")
            and not config.is_decoder and not getattr(config, "add_cross_attention", False)
            and not getattr(config, "chunk_size_feed_forward", 0)
            and getattr(config, "position_embedding_type", "absolute") == "absolute"
            and config._attn_implementation in ("eager", "sdpa"))


def hidden_at(model, inputs: dict, rows: torch.Tensor, cols: torch.Tensor,
              packed: "PackedWeights | None" = None, edits: dict | None = None) -> torch.Tensor | None:
    """Last hidden states (N, H) at the N positions (rows[i], cols[i]) of a (B, T) batch, or None
    when `model` is not `supports`-ed or a position asked for is padding. Linear layers read their
    weights from `packed` where it applies (`linear`); None: plain `module(x)`. `edits`: {layer:
    edit (B, T, H) -> (B, T, H) or None} as `splice.spliced` takes them, for layers 0..L-1 (the
    last layer is computed at the asked positions only: None for an edit there)."""
    if not (supports(model) or trains(model)) or (edits and max(edits) >= len(anatomy.bert_layers(model))):
        return None
    kernel = Kernels(packed)
    ids = inputs["input_ids"]
    batch, length = ids.shape
    # trained, padding is computed too: a training batch has little (packed blocks), and skipping
    # it costs a gather and a scatter per layer, forward and backward
    tokens = _Tokens(inputs.get("attention_mask"), batch, length, skip_padding=not model.training)
    if not tokens.all_real(rows, cols):
        return None
    hidden = anatomy.embeddings(model)(input_ids=ids, token_type_ids=inputs.get("token_type_ids"))
    hidden = tokens.real(hidden.reshape(batch * length, -1))  # (real tokens, H)
    layers = anatomy.bert_layers(model)
    for index, layer in enumerate(layers[:-1]):
        hidden = _edited(edits, index, hidden, tokens)
        hidden = _layer(layer, hidden, tokens, kernel)
    hidden = _edited(edits, len(layers) - 1, hidden, tokens)
    return _last_layer(layers[-1], hidden, tokens, rows, cols, kernel)


def _edited(edits: dict | None, layer: int, hidden: torch.Tensor, tokens: "_Tokens") -> torch.Tensor:
    """Layer `layer`'s output (real tokens, H) through `edits[layer]`, seen as (B, T, H)."""
    edit = (edits or {}).get(layer)
    if edit is None:
        return hidden
    edited = edit(tokens.padded(hidden))
    return hidden if edited is None else tokens.real(edited.reshape(tokens.batch * tokens.length, -1))


class _Tokens:
    """Where a (B, T) batch's real tokens are: rows of the flat (B*T, H) layout kept, and the
    attention mask (B, 1, 1, T) over keys (None when nothing is padding)."""

    def __init__(self, attention_mask: torch.Tensor | None, batch: int, length: int, skip_padding: bool = True):
        self.batch, self.length = batch, length
        real = None if attention_mask is None else attention_mask.reshape(-1).bool()
        real = None if real is None or bool(real.all()) else real
        self.key_mask = None if real is None else real.view(batch, 1, 1, length)
        self.keep = real if skip_padding else None  # None: every row is computed
        self._real = real

    def real(self, flat: torch.Tensor) -> torch.Tensor:
        """(B*T, D) -> (real tokens, D)"""
        return flat if self.keep is None else flat[self.keep]

    def padded(self, real: torch.Tensor) -> torch.Tensor:
        """(real tokens, D) -> (B, T, D), zeros at padding (masked out as keys)."""
        if self.keep is None:
            return real.view(self.batch, self.length, -1)
        flat = real.new_zeros(self.batch * self.length, real.shape[-1])
        flat[self.keep] = real
        return flat.view(self.batch, self.length, -1)

    def all_real(self, rows: torch.Tensor, cols: torch.Tensor) -> bool:
        return self._real is None or bool(self._real[rows * self.length + cols].all())

    def index_of(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """Indices in the real-token layout of positions (rows[i], cols[i])."""
        flat = rows * self.length + cols
        if self.keep is None:
            return flat
        return (torch.cumsum(self.keep, 0) - 1)[flat]


def _heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, T, D) -> (B, heads, T, D / heads)"""
    return x.view(*x.shape[:2], n_heads, -1).transpose(1, 2)


def _merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, heads, T, d) -> (B, T, heads * d)"""
    return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], -1)


def _projections(kernels: "Kernels", modules: tuple, hidden: torch.Tensor, tokens: _Tokens,
                 n_heads: int) -> list[torch.Tensor]:
    """Each module's projection (B, heads, T, d) of the real tokens' hidden states (real tokens, H),
    all from one matrix product (`Kernels.stacked`)."""
    width = modules[0].out_features
    stacked = tokens.padded(kernels.stacked(modules, hidden))  # (B, T, len(modules) * H)
    return [_heads(stacked[..., i * width:(i + 1) * width], n_heads) for i in range(len(modules))]


def _layer(layer, hidden: torch.Tensor, tokens: _Tokens, kernels: "Kernels",
           head_scale: torch.Tensor | None = None) -> torch.Tensor:
    """One BertLayer on the real tokens (real tokens, H) -> (real tokens, H); `head_scale`
    (B, heads): each row's factor on each head's output (0 switches it off, `hooks`)."""
    attention = anatomy.bert_layer_parts(layer).self_attention
    queries, keys, values = _projections(kernels, (attention.query, attention.key, attention.value), hidden,
                                         tokens, attention.num_attention_heads)
    mixed = F.scaled_dot_product_attention(queries, keys, values, attn_mask=tokens.key_mask,
                                           dropout_p=_dropout_p(attention), scale=attention.scaling)  # (B, heads, T, d)
    mixed = tokens.real(_merge_heads(_scaled(mixed, head_scale)).reshape(-1, hidden.shape[-1]))
    return _feed_forward(layer, mixed, hidden, kernels)


def _last_layer(layer, hidden: torch.Tensor, tokens: _Tokens, rows: torch.Tensor,
                cols: torch.Tensor, kernels: "Kernels", head_scale: torch.Tensor | None = None) -> torch.Tensor:
    """The last BertLayer at the N asked positions only: (real tokens, H) -> (N, H).
    Each sentence's asked positions are its queries, padded to the most any sentence has."""
    attention = anatomy.bert_layer_parts(layer).self_attention
    keys, values = _projections(kernels, (attention.key, attention.value), hidden, tokens,
                                attention.num_attention_heads)
    asked = hidden[tokens.index_of(rows, cols)]  # (N, H)
    slot = _slot_in_row(rows, tokens.batch)
    queries = asked.new_zeros(tokens.batch, int(slot.max()) + 1 if len(slot) else 0, asked.shape[-1])
    queries[rows, slot] = kernels.linear(attention.query, asked)
    queries = _heads(queries, attention.num_attention_heads)
    if attention.training:
        mixed = _trained_attention(attention, queries, keys, values, tokens, rows, cols, slot)
    else:
        mixed = F.scaled_dot_product_attention(queries, keys, values, attn_mask=tokens.key_mask,
                                               scale=attention.scaling)
    # in train mode: the asked rows in the full (B*T) layout, and how many rows that has
    at = (rows * tokens.length + cols, tokens.batch * tokens.length) if layer.training else None
    return _feed_forward(layer, _merge_heads(_scaled(mixed, head_scale))[rows, slot], asked, kernels, at)


def _trained_attention(attention, queries, keys, values, tokens: _Tokens, rows, cols, slot) -> torch.Tensor:
    """The last layer's attention in train mode at the asked queries (B, heads, S, d), as SDPA's
    math path computes it for every query, with its dropout drawn for every query (B, heads, T, T)
    and taken at the asked ones: the same random draws as the model's own forward, so a run
    repeats under its seed whichever forward it takes (the exported script's loss equals the
    demo's)."""
    root = attention.scaling ** 0.5  # as the math path: q and k each scaled by its square root
    scores = (queries * root) @ (keys * root).transpose(-2, -1)  # (B, heads, S, T)
    if tokens.key_mask is not None:
        scores = scores.masked_fill(~tokens.key_mask, float("-inf"))
    weights = scores.softmax(-1)
    p = attention.dropout.p
    if p > 0:
        batch, heads, length = tokens.batch, queries.shape[1], tokens.length
        noise = torch.empty(batch, heads, length, length, dtype=weights.dtype).bernoulli_(1 - p).div_(1 - p)
        asked = weights.new_zeros(weights.shape)
        asked[rows, :, slot] = noise[rows, :, cols]
        weights = weights * asked
    return weights @ values


def _scaled(mixed: torch.Tensor, head_scale: torch.Tensor | None) -> torch.Tensor:
    """(B, heads, T, d) with each row's heads multiplied by head_scale (B, heads)."""
    return mixed if head_scale is None else mixed * head_scale.to(mixed.dtype)[:, :, None, None]


def layer_rows(model, index: int, hidden: torch.Tensor, head_scale: torch.Tensor | None = None,
               packed: PackedWeights | None = None, at: int | None = None) -> torch.Tensor:
    """Layer `index` of a `supports`-ed model on a (B, T, H) batch of unpadded rows, each row's
    heads multiplied by `head_scale` (B, heads) before the output projection: (B, T, H); or, with
    `at`, that position's output only (B, H): the last layer for a prediction there. Same results
    as the layer module (with `hooks` switching the heads off) up to float rounding."""
    batch, length, width = hidden.shape
    tokens = _Tokens(None, batch, length)
    kernel = Kernels(packed)
    layer = anatomy.bert_layers(model)[index]
    flat = hidden.reshape(batch * length, width)
    if at is None:
        return _layer(layer, flat, tokens, kernel, head_scale).view(batch, length, width)
    rows = torch.arange(batch, device=hidden.device)
    return _last_layer(layer, flat, tokens, rows, torch.full_like(rows, at), kernel, head_scale)


def _slot_in_row(rows: torch.Tensor, batch: int) -> torch.Tensor:
    """For each i, how many earlier entries of `rows` equal rows[i] (its query slot in its row)."""
    order = torch.argsort(rows, stable=True)
    counts = torch.bincount(rows, minlength=batch)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.empty_like(rows)
    slot[order] = torch.arange(len(rows), device=rows.device) - starts[rows[order]]
    return slot


def _feed_forward(layer, mixed: torch.Tensor, residual: torch.Tensor, kernels: "Kernels",
                  at: tuple[torch.Tensor, int] | None = None) -> torch.Tensor:
    """Attention output projection, then the feed-forward, each with residual and LayerNorm
    (BertSelfOutput, BertIntermediate, BertOutput). `at`: in train mode, (which rows of the full
    B*T layout these are, B*T): the last layer's asked positions, for their dropout draws."""
    parts = anatomy.bert_layer_parts(layer)
    attention_output, intermediate, output = parts.attention_output, parts.intermediate, parts.output
    attended = attention_output.LayerNorm(_project_add(attention_output, mixed, residual, kernels, at))
    inner = kernels.linear_act(intermediate.dense, attended, intermediate.intermediate_act_fn)
    return output.LayerNorm(_project_add(output, inner, attended, kernels, at))


def _project_add(output, x: torch.Tensor, residual: torch.Tensor, kernels: "Kernels",
                 at: tuple[torch.Tensor, int] | None = None) -> torch.Tensor:
    """output.dense(x), its dropout (train mode only), + residual: BertSelfOutput / BertOutput
    before their LayerNorm. With `at` (index, B*T) the dropout is drawn for all B*T rows, as the
    model's own forward draws it (`at::dropout`: bernoulli, divide, multiply), and taken at index."""
    if not output.training:
        return kernels.linear_add(output.dense, x, residual)
    projected = kernels.linear(output.dense, x)
    p = output.dropout.p
    if at is None or p == 0:
        return output.dropout(projected) + residual
    index, every = at
    noise = torch.empty(every, projected.shape[-1], dtype=projected.dtype).bernoulli_(1 - p).div_(1 - p)
    return projected * noise[index] + residual


def _dropout_p(attention) -> float:
    """The attention weights' dropout, as BertSelfAttention applies it (train mode only)."""
    return attention.dropout.p if attention.training else 0.0


# ---------------------------------------------------------------- linear layers, packed for oneDNN

_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
# bfloat16 weights are packed too where the CPU multiplies bfloat16 natively (AVX512-BF16, AMX):
# measured on an Intel Xeon with AMX, bert-base, 16 short sentences: 113 -> 94 ms, one 42 -> 33 ms
_NATIVE_BF16 = _ONEDNN and torch.ops.mkldnn._is_mkldnn_bf16_supported()
_PACKED_DTYPES = (torch.float32, torch.bfloat16) if _NATIVE_BF16 else (torch.float32,)


def packs_bf16() -> bool:
    """Whether bfloat16 weights go through oneDNN's packed kernels here (native bfloat16 products)."""
    return torch.bfloat16 in _PACKED_DTYPES


def stamp(tensors) -> tuple:
    """The tensors' versions and storages: changes when one is changed in place (an optimizer step,
    `load_state_dict`, `mul_`) or its storage replaced (moved to another device). What every cache
    of something made from a model's weights checks (packed weights, the ONNX export's session, the
    weights digest) before it reuses it."""
    return tuple((t._version, t.data_ptr()) for t in tensors)


class PackedWeights:
    """Linear weights packed for oneDNN, one copy per weight tensor: modules that share a weight
    (the attention tab's eager twin, a decoder tied to the word embeddings) share its packed copy,
    and an entry goes with its weight. `caches.ModelCaches` holds one (an engine's, shared by the
    models it serves)."""

    def __init__(self):
        self._entries: "WeakIdKeyDictionary[torch.Tensor, tuple]" = WeakIdKeyDictionary()
        self._stacks: "WeakIdKeyDictionary[torch.Tensor, tuple]" = WeakIdKeyDictionary()

    def __len__(self) -> int:
        return len(self._entries) + len(self._stacks)

    def weight(self, module: torch.nn.Linear) -> torch.Tensor:
        """`module`'s weight in oneDNN's blocked layout, packed again if the weight was changed in
        place or replaced since (`load_state_dict`, `mul_`: both bump the version)."""
        weight = module.weight
        now = stamp([weight])
        entry = self._entries.get(weight)
        if entry is None or entry[0] != now:
            # 16: the row count oneDNN picks its layout for (a crowd's masks); any count works
            entry = (now, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 16))
            self._entries[weight] = entry
        return entry[1]

    def stacked(self, modules: tuple[torch.nn.Linear, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The weights of `modules` (same input) stacked along their outputs, packed, and their
        biases stacked likewise: one matrix product for a layer's query, key and value. Kept
        apart from the single weights, under the first module's weight, made again if any of
        them was changed or replaced."""
        tensors = [t for m in modules for t in (m.weight, m.bias) if t is not None]
        now = stamp(tensors)
        entry = self._stacks.get(modules[0].weight)
        if entry is None or entry[0] != now:
            weight = torch.cat([m.weight.detach() for m in modules])
            bias = None if modules[0].bias is None else torch.cat([m.bias.detach() for m in modules])
            entry = (now, torch.ops.mkldnn._reorder_linear_weight(weight, 16), bias)
            self._stacks[modules[0].weight] = entry
        return entry[1], entry[2]

    def forget_model(self, model: torch.nn.Module) -> None:
        """Free every packed weight of `model`'s linear layers (packed again if used again)."""
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                self.forget(module)

    def forget(self, module: torch.nn.Linear) -> None:
        self._entries.pop(module.weight, None)
        self._stacks.pop(module.weight, None)


def linear(module: torch.nn.Linear, x: torch.Tensor, packed: PackedWeights | None = None) -> torch.Tensor:
    """`module(x)` for x (N, in) -> (N, out), through `packed_linear` where it applies, through
    `trained_linear` while the module is trained on a CPU."""
    if packed is not None and packable(module, x):
        return packed_linear(module, x, packed)
    if packed is not None:
        packed.forget(module)
    if trained_through_onednn(module, x):
        return trained_linear(x, module.weight, module.bias)
    return module(x)


def trained_through_onednn(module: torch.nn.Linear, x: torch.Tensor) -> bool:
    """Whether `trained_linear` applies: `module`'s weight trained (it asks for grad, grad mode
    on), x (N, in) float32 on a CPU with oneDNN."""
    return (_ONEDNN and x.dim() == 2 and x.device.type == "cpu"
            and x.dtype == module.weight.dtype == torch.float32
            and torch.is_grad_enabled() and module.weight.requires_grad)


def trained_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for x (N, in), weight (out, in) -> (N, out): its forward and
    its input's gradient through oneDNN (`_OneDnnLinear`), the weight's gradient as autograd's."""
    return _OneDnnLinear.apply(x, weight, bias)


class _OneDnnLinear(torch.autograd.Function):
    """Why by hand: on a CPU `F.linear` and its backward run MKL's sgemm, and oneDNN's kernel is
    faster on a training step's products (measured on an AMD EPYC, 2 vCPUs, bert-base shapes:
    at 1024 rows forward 164-196 GF/s with MKL, 191-211 with oneDNN, input gradient 160-202 vs
    183-218; the MLM decoder at 154 masked rows forward 68 vs 36 ms, input gradient 49 vs 37 ms).
    The weight's gradient is a tie or worse in oneDNN: it stays `grad.T @ x`, as autograd's.
    oneDNN reads the weight as it is on each call (trained weights change every step: none is
    packed). Same sums up to float rounding (~1e-6)."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad = grad.contiguous()
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:  # grad (N, out) @ weight (out, in): weight.T taken as a linear's weight
            grad_x = torch.ops.mkldnn._linear_pointwise(grad, weight.t(), None, "none", [], "")
        if ctx.needs_input_grad[1]:
            grad_weight = grad.t() @ x
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad.sum(0)
        return grad_x, grad_weight, grad_bias


def rows_linear(module: torch.nn.Linear, x: torch.Tensor, packed: PackedWeights | None = None) -> torch.Tensor:
    """`module(x)` for a large weight and few rows, x (N, in) -> (N, out): the LM head's decoder.

    Through `packed_linear` where it applies (a served model); else, on CPU, as (W @ x.T).T: for
    a few rows and a large weight, the x @ W.T kernel that `F.linear` runs on CPU is 1.5-4x slower
    (measured on the 30522 x 768 decoder at N = 2-256 rows, equal at N = 1). Same sums up to float
    rounding (~1e-6 on logits); autograd works through it, so training uses it too. Other inputs
    (the full (B, T, H) forward, CUDA) take `module(x)`.
    """
    if packed is not None and packable(module, x):
        return packed_linear(module, x, packed)
    if trained_through_onednn(module, x):
        return trained_linear(x, module.weight, module.bias)
    if x.dim() != 2 or x.device.type != "cpu":
        return module(x)
    if module.bias is None:
        return (module.weight @ x.T).T.contiguous()
    return torch.addmm(module.bias[:, None], module.weight, x.T).T.contiguous()


def packable(module: torch.nn.Linear, x: torch.Tensor) -> bool:
    """Whether `packed_linear(module, x)` applies: x (N, in) on a CPU with oneDNN, float32 (or
    bfloat16 where `packs_bf16`) as the weight is, no
    gradient asked through x (the oneDNN kernel has none: attributions take `module(x)`), and
    frozen weights (a model being served). Weights that require grad are being trained, maybe by
    an optimizer that writes them without bumping their version (fused AdamW): never packed. (A
    model unfrozen, trained in place and frozen again with no forward in between would keep its
    old packed weights; our trainers train copies.)"""
    return (_ONEDNN and x.dim() == 2 and x.device.type == "cpu" and x.dtype in _PACKED_DTYPES
            and x.dtype == module.weight.dtype and not (x.requires_grad and torch.is_grad_enabled())
            and not _trainable(module))


def packed_linear(module: torch.nn.Linear, x: torch.Tensor, packed: PackedWeights) -> torch.Tensor:
    """`module(x)` for x (N, in) -> (N, out) through oneDNN with the weight packed once in `packed`
    (the kernel torch.compile's CPU freezing uses). Measured on bert-base: a forward of one
    sentence takes 30-40% less time than with `F.linear` (which repacks the weight on every call),
    of 16 sentences ~25% less, and the 30522 x 768 decoder at 1-16 rows 25-45% less than
    `W @ h.T`. Costs a second copy of the weights used (430 MB for bert-base's encoder and decoder)."""
    return torch.ops.mkldnn._linear_pointwise(x, packed.weight(module), module.bias, "none", [], "")


class Kernels:
    """The linear layers of one forward, through oneDNN with `packed` weights where they apply
    (`packable`), else the modules' own calls. Besides `linear`: `stacked` (several projections
    of one input in one product), `linear_act` (with GELU computed by the same kernel, as its
    post-op) and `linear_add` (with the residual added by the kernel): each one pass over memory
    fewer per layer, results the same up to float rounding (~1e-6)."""

    def __init__(self, packed: PackedWeights | None):
        self.packed = packed

    def linear(self, module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
        return linear(module, x, self.packed)

    def _packs(self, modules: tuple, x: torch.Tensor) -> bool:
        if self.packed is not None and all(packable(m, x) for m in modules):
            return True
        for module in modules if self.packed is not None else ():
            self.packed.forget(module)
        return False

    def stacked(self, modules: tuple[torch.nn.Linear, ...], x: torch.Tensor) -> torch.Tensor:
        """(N, in) -> (N, sum of out): each module's output side by side."""
        if not self._packs(modules, x):
            if not _trainable(modules[0]):  # serving unpacked: no copy of the weights per call
                return torch.cat([module(x) for module in modules], dim=-1)
            # trained: one product (its output side by side already) and autograd splits the grads
            bias = None if modules[0].bias is None else torch.cat([m.bias for m in modules])
            weight = torch.cat([m.weight for m in modules])
            if trained_through_onednn(modules[0], x):
                return trained_linear(x, weight, bias)
            return F.linear(x, weight, bias)
        weight, bias = self.packed.stacked(modules)
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")

    def linear_act(self, module: torch.nn.Linear, x: torch.Tensor, act) -> torch.Tensor:
        """act(module(x)); GELU (erf, BERT's "gelu") in the kernel, any other `act` after it."""
        if not (_is_exact_gelu(act) and self._packs((module,), x)):
            return act(self.linear(module, x))
        return torch.ops.mkldnn._linear_pointwise(x, self.packed.weight(module), module.bias, "gelu", [], "none")

    def linear_add(self, module: torch.nn.Linear, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """module(x) + residual, both (N, out)."""
        if not self._packs((module,), x) or residual.dtype != x.dtype:
            return self.linear(module, x) + residual
        return torch.ops.mkldnn._linear_pointwise.binary(x, residual.contiguous(), self.packed.weight(module),
                                                         module.bias, "add")


def _is_exact_gelu(act) -> bool:
    """Whether `act` is the erf GELU (transformers' GELUActivation for "gelu", or nn.GELU())."""
    if isinstance(act, torch.nn.GELU):
        return act.approximate == "none"
    return type(act).__name__ == "GELUActivation" and getattr(act, "act", None) is F.gelu


def _trainable(module: torch.nn.Linear) -> bool:
    return module.weight.requires_grad or (module.bias is not None and module.bias.requires_grad)
