"""A model's weights digest: the one name its weights go by on disk (the feature dictionaries and
transcoders; with its config and tokenizer, `model_digest`, the ONNX exports, the search indexes
and the examples' results). One formula, so a restart finds what was kept under it and a tuned
model (other weights) does not.

The formula is the one the shipped dictionaries' records were written with
(`assets/bundled/features/*/record.json`, `assets/bundled/transcoders/*/record.json`): every
parameter in `named_parameters()` order, its name, shape and dtype, then its bytes; blake2b, 12
bytes. The bytes are read after `.detach().cpu()`, so a model on a GPU has the digest it has on a
CPU. `ModelCaches.digest` remembers it per model; `LoadedModel.weights_digest` asks it there.
"""
from __future__ import annotations

import hashlib
import json

import torch


def weights_digest(model: torch.nn.Module) -> str:
    """A digest of `model`'s parameters (names, shapes, dtypes, bytes), computed now (see the module
    doc; `LoadedModel.weights_digest` remembers it)."""
    digest = hashlib.blake2b(digest_size=12)
    for name, tensor in model.named_parameters():
        digest.update(f"{name}{tuple(tensor.shape)}{tensor.dtype}".encode())
        # one flat row first: a 0-d tensor has no last dimension to view as bytes
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def model_digest(lm) -> str:
    """What a cache of a `LoadedModel`'s results is kept under: its weights digest (remembered), its
    config (another head count or epsilon over the same weights computes otherwise), its tokenizer."""
    config = json.dumps(lm.model.config.to_dict(), sort_keys=True, default=str)
    tokenizer = f"{type(lm.tokenizer).__name__}:{len(lm.tokenizer)}:{lm.max_length}"
    return hashlib.blake2b(f"{lm.weights_digest}:{config}:{tokenizer}".encode(), digest_size=12).hexdigest()
