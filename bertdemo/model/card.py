"""What was loaded, as a person choosing a model wants to know it (`ModelCard`): size, precision,
device, family, and what the checkpoint lacked."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from ..forward import anatomy

UNTRAINED_HEAD = ("MLM head not in the checkpoint: randomly initialised, predictions are noise "
                  "until you fine-tune")


@dataclass(frozen=True)
class ModelCard:
    """What was loaded, as a person choosing a model wants to know it: size, precision, device,
    and what the checkpoint lacked (transformers' loading info), so a model whose MLM head was
    newly initialised is never shown as if it were trained."""

    architecture: str  # e.g. "BertForMaskedLM"
    parameters: int  # distinct parameters (tied embeddings counted once)
    dtype: str  # e.g. "float32"
    device: str  # e.g. "cpu", "cuda:0"
    weights: str = "in memory"  # "safetensors", "pickle" or "in memory" (built or tuned in this process)
    head_missing: tuple[str, ...] = ()  # MLM-head weights the checkpoint lacked: randomly initialised
    body_missing: tuple[str, ...] = ()  # other weights it lacked (also randomly initialised)
    unused: tuple[str, ...] = ()  # checkpoint weights this architecture has no place for (e.g. pooler)
    family: str = ""  # the encoder family as the model anatomy names it, e.g. "ModernBERT"
    views: str = ""  # which views it supports, in words (`anatomy.views_line`)
    provenance: str | None = None  # where the weights come from, when known (the bundled model's training)
    precision: str = ""  # why this dtype, when it was picked by timing (`--dtype auto`), in words

    @property
    def head_trained(self) -> bool:
        return not self.head_missing

    @property
    def size_mb(self) -> float:
        """Parameter memory in MB (1e6 bytes) at this precision."""
        return self.parameters * torch.finfo(getattr(torch, self.dtype)).bits / 8 / 1e6

    @property
    def warning(self) -> str | None:
        """One plain sentence when predictions cannot be trusted, else None."""
        if self.head_missing:
            return UNTRAINED_HEAD
        if self.body_missing:
            return (f"{len(self.body_missing)} weights were not in the checkpoint and were randomly "
                    "initialised: predictions may be degraded")
        return None

    def summary(self) -> str:
        """e.g. 'BertForMaskedLM, 109.5M parameters (438 MB float32) on cpu, safetensors weights'."""
        size = f"{self.size_mb:,.0f}" if self.size_mb >= 10 else f"{self.size_mb:.2g}"
        return (f"{self.architecture}, {_count(self.parameters)} parameters ({size} MB "
                f"{self.dtype}) on {self.device}, {self.weights} weights")

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "head_trained": self.head_trained,
                "size_mb": round(self.size_mb, 1), "warning": self.warning}

    @classmethod
    def of(cls, model: PreTrainedModel, loading_info: dict | None = None,
           weights: str = "in memory") -> "ModelCard":
        """The card of `model`; `loading_info` is from `from_pretrained(output_loading_info=True)`."""
        info = loading_info or {}
        prefix = f"{getattr(model, 'base_model_prefix', '')}."  # a stand-in module has none
        missing = sorted(info.get("missing_keys") or ())
        first = next(model.parameters(), torch.empty(0))  # any torch module will do, even a stand-in
        known = getattr(model, "config", None) is not None
        return cls(type(model).__name__, sum(p.numel() for p in model.parameters()),
                   str(first.dtype).removeprefix("torch."), str(first.device), weights,
                   family=anatomy.of(model).name if known else "",
                   views=anatomy.views_line(model) if known else "",
                   head_missing=tuple(k for k in missing if not k.startswith(prefix)),
                   body_missing=tuple(k for k in missing if k.startswith(prefix)),
                   unused=tuple(sorted(info.get("unexpected_keys") or ())))


def _count(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e5 else f"{n:,}"
