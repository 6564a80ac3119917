"""The MLM head at a few positions, and `mlm_logits`: the one door through which every prediction
goes, choosing its forward (ONNX Runtime, the lean forward, the model's own) from what the model
anatomy says the model supports."""
from __future__ import annotations

import torch

from ..forward import anatomy, lean_forward


def mlm_head(model, packed: lean_forward.PackedWeights | None = None):
    """The MLM head as a function of hidden states (N, H) -> logits (N, V), or None if unknown
    (`anatomy.mlm_head`: each family's own transform and decoder).

    Written by hand because transformers has no `logits_to_keep` for masked LMs: running the
    head only where it is needed skips most of a (T, H) x (H, V) matmul. A decoder that is one
    Linear runs as `lean_forward.rows_linear` (same weights, same results, fast at a few rows;
    packed for oneDNN in `packed` when the model is served). The model itself is left as it is.
    """
    return anatomy.mlm_head(model, lambda decoder, x: lean_forward.rows_linear(decoder, x, packed))


def required_head(lm, view: str):
    """`mlm_head` of a loaded model and its packed weights, for a view that cannot run without it;
    ValueError naming the view: what the family lacks when the anatomy knows, else that the model
    does not expose its head."""
    head = mlm_head(lm.model, lm.caches.packed)
    if head is None:
        anatomy.of(lm.model).require("head", view)
        raise ValueError(f"{view} needs the MLM head, which {lm.name} does not expose.")
    return head


def mlm_logits(model, inputs: dict, rows: torch.Tensor, cols: torch.Tensor,
               packed: lean_forward.PackedWeights | None = None, onnx=None, **forward_kwargs):
    """Logits (N, V) at the N positions (rows[i], cols[i]) of a (B, T) batch, and the forward's
    output (for `output_attentions=True` or `output_hidden_states=True` in `forward_kwargs`;
    None when a lean forward ran).

    The one door through which every prediction goes, choosing its forward from what the model
    anatomy says the model supports:
    - `onnx` (the model's `onnx_engine.OnnxMaskedLM`, for a served BERT-layout model) when the batch
      suits it (`suits`), nothing needs the modules' own calls and no extra output is asked;
    - else the lean forward (`lean_forward.hidden_at`: no padding rows, last layer at the asked
      positions; BERT-layout families without grad, or trained on a CPU) with the head at the
      positions only (`mlm_head`);
    - else the model's own base forward with the head at the positions, or, for a model whose head
      the anatomy does not know, its whole forward (still correct).
    `packed`: where a served model's weights packed for oneDNN are kept (its `caches.packed`). No
    grad mode is set here: training calls it too.
    """
    if onnx is not None and not forward_kwargs and onnx.suits(inputs) and lean_forward.supports(model):
        return onnx.logits(inputs, rows, cols), None
    head = mlm_head(model, packed)
    if head is None:
        out = model(**inputs, **forward_kwargs)
        return out.logits[rows, cols], out
    hidden = None if forward_kwargs else lean_forward.hidden_at(model, inputs, rows, cols, packed)
    if hidden is not None:
        return head(hidden), None
    out = model.base_model(**inputs, **forward_kwargs)
    return head(out.last_hidden_state[rows, cols]), out
