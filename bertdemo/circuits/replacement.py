"""The local replacement model of one sentence: the model made linear in its nodes.

The clean forward is run once and every nonlinearity outside the transcoders is frozen at its
clean value as a multiplier: each head's attention weights, each norm (below), the MLM head's
activation (GELU(x) as x times its clean GELU(x)/x). Each layer's feed-forward output becomes its
transcoder's features (activation x decoder row, plus the transcoder's bias and skip path) plus an
error node, the true output minus the transcoder's, per (layer, position). Then every value
downstream is affine in the leaves:

    token nodes   (T, E)   what the embeddings' norm reads: word + position + type embeddings
    features      (T, k)   per layer, the active transcoder features' activations
    errors        (T, H)   per layer
    (constants)             every bias: the bias node

With the leaves at their clean values the forward reproduces the clean logits (`check_parity`);
with all leaves at zero it gives each value's bias. Positions the transcoders were not trained on
([CLS], [SEP]) keep their true feed-forward output, all of it an error node.

A norm is frozen in one of two ways (`norms`):

    "slope"   (default) its slope at the clean input: 1/sigma and, beside the mean subtraction,
              the projection off the clean input's own direction d, the part of a change that a
              norm takes away (its output's scale is fixed). Affine: y = s g (c - d (d.c) + kept)
              + b, with c the centred input, d = c_clean s / sqrt(D) and kept = d (d.c_clean),
              what the norm keeps of its clean input whatever the nodes do (a constant: the bias).
    "scale"   its 1/sigma alone, as Ameisen et al. and circuit-tracer freeze a norm's denominator:
              y = s g c + b. A change along the input's own direction passes at full size, which a
              real norm takes away: through a post-LayerNorm encoder's 13 norms that overstates
              early nodes' effects several-fold (docs/circuits.md, Measured).

The embeddings' norm keeps its 1/sigma alone either way: the token nodes are all of its input, so
its slope would give each token no effect at all (a norm is blind to its input's scale).

Written by hand, not hooked into transformers' modules, because edges are read from batched
backward passes through this small linear function (`attribution`): a few batched matrix products
per layer, where the model's own modules would run its feed-forward blocks and attention scores
again for every target. The parts come from the model anatomy (`Anatomy.wiring`); the attention
weights from the attention views' twin, as the model computed them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .. import validate
from ..forward import anatomy
from ..model.loading import LoadedModel

RMS_NAMES = ("RMSNorm",)


def demeaned(logits: torch.Tensor) -> torch.Tensor:
    """A logit node's value: each logit (..., V) less the mean over the vocabulary, as circuit-tracer
    takes its targets: what the softmax reads (a change shared by every word moves no probability)."""
    return logits - logits.mean(-1, keepdim=True)


NORMS = ("slope", "scale")  # how a norm is frozen (module doc); the first is the default
SCALE_ONLY = ("embed",)  # norms frozen by their 1/sigma alone whatever `norms` says: the token nodes' own


@dataclass
class Leaves:
    """The replacement's inputs: token nodes (T, E), and per layer 1..L feature activations (T, k)
    and error nodes (T, H). Any may be replaced (zeros: the bias; one source alone: its effect)."""

    tokens: torch.Tensor
    features: dict[int, torch.Tensor]
    errors: dict[int, torch.Tensor]

    def zeros(self) -> "Leaves":
        return Leaves(torch.zeros_like(self.tokens), {l: torch.zeros_like(a) for l, a in self.features.items()},
                      {l: torch.zeros_like(e) for l, e in self.errors.items()})

    def copy(self) -> "Leaves":
        """A copy to edit (one source removed, features following) without touching these."""
        return Leaves(self.tokens.clone(), {l: a.clone() for l, a in self.features.items()},
                      {l: e.clone() for l, e in self.errors.items()})


@dataclass
class Gradients:
    """A batch of n targets' gradients: per layer the features' (n, T, k) and the error nodes'
    direct effects (n, T): their gradient (n, T, H) dotted with the error's value as the transpose
    passes, so a batch holds no (n, T, H) per layer; and the token nodes' gradients (n, T, E)."""

    features: dict[int, torch.Tensor]
    error_effects: dict[int, torch.Tensor]
    tokens: torch.Tensor | None = None


@dataclass
class Frozen:
    """What the clean forward fixed: per norm call its 1/sigma (T, 1) (key: "embed", "a3", "m3",
    "final", "head") and, frozen by its slope, the clean input's direction d (T, D) and what the
    norm keeps of it (T, D); per layer its attention weights (heads, T, T), and the head's
    activation ratio (D,) at the mask."""

    scales: dict[str, torch.Tensor] = field(default_factory=dict)
    directions: dict[str, torch.Tensor] = field(default_factory=dict)
    kept: dict[str, torch.Tensor] = field(default_factory=dict)
    attention: dict[int, torch.Tensor] = field(default_factory=dict)
    head_ratio: torch.Tensor | None = None


@dataclass
class Sentence:
    """One sentence through the replacement: its tokens, the mask position, the frozen multipliers,
    the clean leaves, each layer's transcoder codes and the clean values the tests compare with."""

    ids: torch.Tensor  # (T,)
    tokens: list[str]
    mask: int  # the [MASK]'s position
    coded: torch.Tensor  # (T,) bool: positions the transcoders read ([CLS], [SEP] not)
    frozen: Frozen
    leaves: Leaves
    indices: dict[int, torch.Tensor]  # layer -> (T, k) active feature indices
    mlp_in: dict[int, torch.Tensor]  # layer -> (T, H) the block's clean input
    mlp_out: dict[int, torch.Tensor]  # layer -> (T, H) its clean output
    logits: torch.Tensor  # (V,) the model's own logits at the mask


class Replacement:
    """The linear replacement of `lm` for one sentence, given a transcoder per layer
    (`transcoders[l]`: a features `Dictionary` whose coder was trained with transcode=True)."""

    def __init__(self, lm: LoadedModel, transcoders: dict, dtype: torch.dtype = torch.float32, norms: str = NORMS[0]):
        self.lm, self.model = lm, lm.model
        self.anatomy = anatomy.of(lm.model)
        self.wiring = self.anatomy.wiring
        self.layers = len(self.anatomy.layers)
        missing = [l for l in range(1, self.layers + 1) if l not in transcoders]
        if missing:
            raise ValueError(f"{lm.name} has no transcoders for layer(s) {', '.join(map(str, missing))}: train "
                             "them first (the Circuits tab's Train, or bertdemo.train_transcoders)")
        if norms not in NORMS:
            raise validate.InputError("norms", f"norms is {validate.shown(norms)}: 'slope' (each norm frozen at its "
                                               "slope, the default) or 'scale' (its 1/sigma alone, as circuit-tracer "
                                               "does).")
        self.transcoders = transcoders
        self.dtype, self.norms = dtype, norms
        self._check_parts()

    # ------------------------------------------------------------ the parts, through the anatomy

    def _check_parts(self) -> None:
        w, a = self.wiring, self.anatomy
        for layer in range(self.layers):
            for path in (w.attention_norm, w.mlp_norm, w.value, *w.mlp):
                if a.part(layer, path) is None:
                    raise ValueError(f"Circuits cannot freeze this model ({a.name}): layer {layer + 1} has no "
                                     f"'{path}'")
            if a.attention[layer].module is None:
                raise ValueError(f"Circuits cannot freeze this model ({a.name}): no attention weights")
        if a.model_part(self.model, w.embedding_norm) is None or self._head_module(3) is None:
            raise ValueError(f"Circuits cannot freeze this model ({a.name}): its embeddings' norm or MLM head "
                             "is not where it is declared")

    def _head_module(self, index: int):
        path = self.wiring.head[index]
        return None if path is None else self.anatomy.model_part(self.model, path, base=False)

    def _linear(self, module, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, module.weight.to(self.dtype), None if module.bias is None else module.bias.to(self.dtype))

    def _norm(self, module, x: torch.Tensor, key: str, frozen: Frozen, record: bool) -> torch.Tensor:
        """`module` (a LayerNorm, an RMS norm or an Identity) on x (T, D), frozen (module doc) at
        what `frozen` holds under `key`, or measured and recorded there when `record`."""
        if module is None or isinstance(module, torch.nn.Identity):
            return x
        centred = x if self._rms(module) else x - x.mean(-1, keepdim=True)
        if record:
            self._record_norm(module, centred.detach(), key, frozen)
        elif key in frozen.directions:
            d = frozen.directions[key]
            centred = centred - d * (d * centred).sum(-1, keepdim=True) + frozen.kept[key]
        y = centred * frozen.scales[key]
        if getattr(module, "weight", None) is not None:
            y = y * module.weight.to(self.dtype)
        if getattr(module, "bias", None) is not None:
            y = y + module.bias.to(self.dtype)
        return y

    def _record_norm(self, module, centred: torch.Tensor, key: str, frozen: Frozen) -> None:
        """The clean input's 1/sigma (T, 1) and, for a norm frozen by its slope, d (T, D), scaled so
        that the slope's projection is exactly (1 - d d^T): with the norm's eps, c s / sqrt(D)."""
        eps = getattr(module, "eps", None) or getattr(module, "variance_epsilon", 1e-12)
        scale = torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + eps)
        frozen.scales[key] = scale
        if self.norms == "slope" and key not in SCALE_ONLY:
            d = centred * scale / centred.shape[-1] ** 0.5
            frozen.directions[key] = d
            frozen.kept[key] = d * (d * centred).sum(-1, keepdim=True)

    @staticmethod
    def _rms(module) -> bool:
        return any(name in type(module).__name__ for name in RMS_NAMES)

    def _attention(self, layer: int, x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Layer `layer` (0-based) attention output (T, H) at frozen `weights` (heads, T, T):
        each head's weights times its values, heads side by side, through the output projection."""
        parts = self.anatomy.attention[layer]
        values = self._linear(self.anatomy.part(layer, self.wiring.value), x)  # (T, heads * d) or (T, 3 * ...)
        if self.wiring.fused_qkv:
            values = values[:, 2 * values.shape[-1] // 3:]
        length = x.shape[0]
        values = values.view(length, -1, parts.head_dim).transpose(0, 1)  # (kv heads, T, d)
        if values.shape[0] != parts.heads:  # grouped keys and values: each serves several heads
            values = values.repeat_interleave(parts.heads // values.shape[0], dim=0)
        mixed = torch.matmul(weights, values).transpose(0, 1).reshape(length, -1)  # (T, heads * d)
        return self._linear(parts.output, mixed)

    def _mlp_replaced(self, layer: int, x: torch.Tensor, sentence: Sentence, leaves: Leaves) -> torch.Tensor:
        """Layer `layer` (1-based) feed-forward output (T, H) as transcoder features + bias + skip +
        error (at coded positions), error alone elsewhere."""
        coder = self.transcoders[layer].coder
        rows = coder.W_dec.to(self.dtype)[sentence.indices[layer]]  # (T, k, H)
        decoded = torch.einsum("tk,tkh->th", leaves.features[layer], rows) + coder.b_dec.to(self.dtype)
        if coder.W_skip is not None:
            decoded = decoded + x @ coder.W_skip.to(self.dtype).mT
        return decoded * sentence.coded[:, None].to(self.dtype) + leaves.errors[layer]

    def _mlp_true(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        out = x
        for path in self.wiring.mlp:
            out = self.anatomy.part(layer - 1, path)(out)
        return out

    # ------------------------------------------------------------ the forward, clean or frozen

    def forward(self, sentence: Sentence, leaves: Leaves, *, record: bool = False, upto: int | None = None,
                reads: dict | None = None) -> torch.Tensor:
        """The replacement's logits (V,) at the mask from `leaves`, at the sentence's frozen
        multipliers. `reads`, when given, receives each layer's block input (T, H) under its layer.
        `upto`: stop after reading layer `upto`'s block input (returns None). With `record`, the
        multipliers are measured instead (the clean forward: `trace`)."""
        w, frozen = self.wiring, sentence.frozen
        h = self._norm(self.anatomy.model_part(self.model, w.embedding_norm), leaves.tokens, "embed", frozen, record)
        project = self.anatomy.model_part(self.model, w.embedding_project) if w.embedding_project else None
        if project is not None:
            h = self._linear(project, h)
        for layer in range(1, self.layers + 1):
            weights = frozen.attention[layer].to(self.dtype)
            attention_norm = self.anatomy.part(layer - 1, w.attention_norm)
            mlp_norm = self.anatomy.part(layer - 1, w.mlp_norm)
            if w.norm_first:
                h = h + self._attention(layer - 1, self._norm(attention_norm, h, f"a{layer}", frozen, record), weights)
                x = self._norm(mlp_norm, h, f"m{layer}", frozen, record)
            else:
                h = x = self._norm(attention_norm, h + self._attention(layer - 1, h, weights), f"a{layer}", frozen, record)
            if reads is not None:
                reads[layer] = x
            if upto == layer:
                return None
            out = self._mlp_true(layer, x) if record else self._mlp_replaced(layer, x, sentence, leaves)
            if record:
                sentence.mlp_in[layer], sentence.mlp_out[layer] = x.detach(), out.detach()
            h = h + out if w.norm_first else self._norm(mlp_norm, h + out, f"m{layer}", frozen, record)
        if w.norm_first:  # the final norm of a pre-LayerNorm family (None elsewhere: no norm)
            h = self._norm(self.anatomy.model_part(self.model, self.anatomy.family.final_norm), h, "final",
                           frozen, record)
        return self.head(h[sentence.mask], frozen, record)

    def head(self, hidden: torch.Tensor, frozen: Frozen, record: bool = False) -> torch.Tensor:
        """The MLM head at the mask: hidden (H,) -> logits (V,), its activation and norm frozen."""
        dense, activation, norm, decoder = (self._head_module(i) for i in range(4))
        z = self._linear(dense, hidden)
        if record:
            act = activation(z) if activation is not None else F.gelu(z)  # None: exact GELU
            safe = torch.where(z.abs() > 1e-12, z, torch.ones_like(z))
            frozen.head_ratio = torch.where(z.abs() > 1e-12, act / safe, torch.full_like(z, 0.5)).detach()
        z = z * frozen.head_ratio
        z = self._norm(norm, z[None], "head", frozen, record)[0]
        return self._decoder(decoder, z)

    def _decoder(self, decoder, z: torch.Tensor) -> torch.Tensor:
        if isinstance(decoder, torch.nn.Linear):
            return self._linear(decoder, z)
        return decoder(z.to(self.model.dtype)).to(self.dtype)  # a product the anatomy builds (MobileBERT, DeBERTa)

    def decoder_rows(self, words: torch.Tensor) -> torch.Tensor:
        """(n, D): the directions of the words' (n,) logit nodes at the decoder's input: each word's
        decoder row less the mean row, as circuit-tracer's demeaned unembedding columns (`demeaned`)."""
        weight = self._head_module(3).weight.to(self.dtype)
        return weight[words] - weight.mean(0)

    # ------------------------------------------------------------ the clean forward

    @torch.no_grad()
    def trace(self, inputs: dict, mask: int, tokens: list[str], coded: torch.Tensor) -> Sentence:
        """The clean forward of one sentence (`inputs`: (1, T) tensors): attention weights from the
        model's attention twin, then this module's own forward measuring every multiplier and the
        transcoders' codes and errors. `coded` (T,) bool: the positions the transcoders read."""
        from ..views.attention_views import eager_twin

        twin = eager_twin(self.lm)
        embed_in: dict = {}
        norm = self.anatomy.model_part(twin, self.wiring.embedding_norm)
        handle = norm.register_forward_pre_hook(lambda m, args: embed_in.setdefault("x", args[0]))
        try:
            out = twin(**inputs, output_attentions=True)
        finally:
            handle.remove()
        logits = out.logits[0, mask].to(self.dtype)
        frozen = Frozen(attention={l + 1: a[0].to(self.dtype) for l, a in enumerate(out.attentions)})
        tokens_in = embed_in["x"][0].to(self.dtype)
        sentence = Sentence(inputs["input_ids"][0], tokens, mask, coded, frozen, None, {}, {}, {}, logits)
        clean = Leaves(tokens_in, {}, {})
        self.forward(sentence, clean, record=True)
        features, errors = {}, {}
        for layer in range(1, self.layers + 1):
            x, y = sentence.mlp_in[layer], sentence.mlp_out[layer]
            coder = self.transcoders[layer].coder
            acts, indices = coder.encode(x.to(coder.dtype))[:2]
            acts = acts.to(self.dtype) * coded[:, None].to(self.dtype)
            sentence.indices[layer] = indices
            features[layer] = acts
            rows = coder.W_dec.to(self.dtype)[indices]
            decoded = torch.einsum("tk,tkh->th", acts, rows) + coder.b_dec.to(self.dtype)
            if coder.W_skip is not None:
                decoded = decoded + x @ coder.W_skip.to(self.dtype).mT
            errors[layer] = y - decoded * coded[:, None].to(self.dtype)
        sentence.leaves = Leaves(tokens_in, features, errors)
        return sentence

    # ------------------------------------------------------------ its transpose: every target's gradients

    def gradients_at_block_input(self, sentence: Sentence, layer: int, cotangent: torch.Tensor) -> "Gradients":
        """The gradients of sum(cotangent * layer `layer`'s block input) with respect to every leaf,
        for a batch of n targets at once: cotangent (n, T, H). The transpose of `forward`, written
        out: each frozen norm, attention's value-output path and feed-forward replacement in turn."""
        w, frozen = self.wiring, sentence.frozen
        if w.norm_first:  # x_l = norm_m(h'_l), h'_l = h_{l-1} + attention(norm_a(h_{l-1}))
            g = self._norm_t(self.anatomy.part(layer - 1, w.mlp_norm), cotangent, f"m{layer}", frozen)
        else:  # x_l = norm_a(h_{l-1} + attention(h_{l-1}))
            g = self._norm_t(self.anatomy.part(layer - 1, w.attention_norm), cotangent, f"a{layer}", frozen)
        return self._down(sentence, self._through_attention(sentence, layer, g), layer - 1)

    def gradients_at_logits(self, sentence: Sentence, rows: torch.Tensor) -> "Gradients":
        """The gradients of each target `rows @ logits` ((n, V) or the decoder rows' span: rows
        given as (n, D) decoder-input directions) with respect to every leaf."""
        dense, _, norm, _ = (self._head_module(i) for i in range(4))
        frozen = sentence.frozen
        g = self._norm_t(norm, rows[:, None, :], "head", frozen)[:, 0] * frozen.head_ratio
        g = g @ dense.weight.to(self.dtype)  # (n, H) at the final hidden state at the mask
        full = torch.zeros(len(rows), len(sentence.tokens), g.shape[-1], dtype=self.dtype)
        full[:, sentence.mask] = g
        if self.wiring.norm_first:
            final = self.anatomy.model_part(self.model, self.anatomy.family.final_norm)
            full = self._norm_t(final, full, "final", frozen)
        return self._down(sentence, full, self.layers)

    def _through_attention(self, sentence: Sentence, layer: int, g: torch.Tensor) -> torch.Tensor:
        """g at s = h + attention(norm_a?(h)) -> g at h (layer `layer`, 1-based)."""
        w = self.wiring
        weights = sentence.frozen.attention[layer].to(self.dtype)
        back = self._attention_t(layer - 1, g, weights)
        if w.norm_first:
            back = self._norm_t(self.anatomy.part(layer - 1, w.attention_norm), back, f"a{layer}", sentence.frozen)
        return g + back

    def _down(self, sentence: Sentence, g: torch.Tensor, top: int) -> "Gradients":
        """From g (n, T, H) at layer `top`'s output down to the token nodes, collecting the
        gradients of each layer's features and errors on the way."""
        w, frozen = self.wiring, sentence.frozen
        grads = Gradients({}, {})
        for layer in range(top, 0, -1):
            mlp_norm = self.anatomy.part(layer - 1, w.mlp_norm)
            g_out = g if w.norm_first else self._norm_t(mlp_norm, g, f"m{layer}", frozen)  # at the block output
            g_x = self._mlp_t(layer, g_out, sentence, grads)
            if w.norm_first:  # h_l = h'_l + out, x_l = norm_m(h'_l)
                g = self._through_attention(sentence, layer, g_out + self._norm_t(mlp_norm, g_x, f"m{layer}", frozen))
            else:  # h_l = norm_m(x_l + out), x_l = norm_a(h_{l-1} + attention(h_{l-1}))
                g_s = self._norm_t(self.anatomy.part(layer - 1, w.attention_norm), g_out + g_x, f"a{layer}", frozen)
                g = self._through_attention(sentence, layer, g_s)
        project = self.anatomy.model_part(self.model, w.embedding_project) if w.embedding_project else None
        if project is not None:
            g = g @ project.weight.to(self.dtype)
        grads.tokens = self._norm_t(self.anatomy.model_part(self.model, w.embedding_norm), g, "embed", frozen)
        return grads

    def _mlp_t(self, layer: int, g_out: torch.Tensor, sentence: Sentence, grads: "Gradients") -> torch.Tensor:
        """The feed-forward replacement's transpose: the features' gradients and the errors' direct
        effects into `grads`; returns the gradient at the block input through the skip path (zeros without)."""
        coder = self.transcoders[layer].coder
        coded = g_out * sentence.coded[:, None].to(self.dtype)
        rows = coder.W_dec.to(self.dtype)[sentence.indices[layer]]  # (T, k, H)
        grads.features[layer] = torch.einsum("nth,tkh->ntk", coded, rows)
        grads.error_effects[layer] = torch.einsum("nth,th->nt", g_out, sentence.leaves.errors[layer])
        if coder.W_skip is None:
            return torch.zeros_like(g_out)
        return coded @ coder.W_skip.to(self.dtype)

    def _norm_t(self, module, g: torch.Tensor, key: str, frozen: Frozen) -> torch.Tensor:
        """The frozen norm's transpose: g (n, T, D) at its output -> at its input."""
        if module is None or isinstance(module, torch.nn.Identity):
            return g
        if getattr(module, "weight", None) is not None:
            g = g * module.weight.to(self.dtype)
        g = g * frozen.scales[key]
        if not self._rms(module):
            g = g - g.mean(-1, keepdim=True)
        if key in frozen.directions:  # d is centred: the projection and the mean's commute
            d = frozen.directions[key]
            g = g - d * (g * d).sum(-1, keepdim=True)
        return g

    def _attention_t(self, layer: int, g: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """`_attention`'s transpose (layer 0-based): g (n, T, H) at its output -> at its input."""
        parts = self.anatomy.attention[layer]
        n, length = g.shape[:2]
        mixed = (g @ parts.output.weight.to(self.dtype)).view(n, length, parts.heads, parts.head_dim).transpose(1, 2)
        values = torch.matmul(weights.transpose(-1, -2), mixed)  # (n, heads, T, d)
        projection = self.anatomy.part(layer, self.wiring.value).weight.to(self.dtype)
        if self.wiring.fused_qkv:
            projection = projection[2 * projection.shape[0] // 3:]
        kv_heads = projection.shape[0] // parts.head_dim
        if kv_heads != parts.heads:  # each key-value head served parts.heads // kv_heads heads
            values = values.reshape(n, kv_heads, parts.heads // kv_heads, length, parts.head_dim).sum(2)
        return values.transpose(1, 2).reshape(n, length, -1) @ projection

    def pre_activations(self, sentence: Sentence, layer: int, reads: dict) -> torch.Tensor:
        """(T, k): the encoder's pre-activation of each active feature of `layer` at each position,
        from the block inputs in `reads`."""
        coder = self.transcoders[layer].coder
        rows = coder.encoder.weight.to(self.dtype)[sentence.indices[layer]]  # (T, k, H)
        return torch.einsum("th,tkh->tk", reads[layer], rows) + coder.encoder.bias.to(self.dtype)[sentence.indices[layer]]

