"""Settings for the demo: one dataclass, every field overridable by a flag or an env var."""
from __future__ import annotations

import os
from dataclasses import dataclass, fields

DEFAULT_MODEL = "bert-base-uncased"


@dataclass
class Settings:
    """What the operator can set. `app.py` maps each field to `--flag` and `BERTDEMO_FIELD`."""

    model: str = DEFAULT_MODEL  # hub id or local folder
    device: str | None = None  # None: CUDA when present, else CPU
    host: str = "127.0.0.1"
    port: int = 7860
    max_masks: int = 10  # most [MASK]s accepted in one sentence
    max_top_k: int = 50  # most predictions shown per mask
    max_candidates: int = 10  # most candidate words scored at once
    allow_pickle: bool = False  # accept checkpoints without safetensors (pickle can run code)

    @classmethod
    def from_env(cls, environ: dict | None = None) -> "Settings":
        """Settings with each `BERTDEMO_<FIELD>` env var applied (e.g. BERTDEMO_MODEL)."""
        environ = os.environ if environ is None else environ
        values = {}
        for f in fields(cls):
            raw = environ.get(f"BERTDEMO_{f.name.upper()}")
            if raw is None:
                continue
            values[f.name] = _parse(raw, f.type)
        return cls(**values)


def _parse(raw: str, type_name: str):
    """Turn an env-var string into the field's type (`bool`, `int` or `str`)."""
    if "bool" in type_name:
        return raw.strip().lower() in {"1", "true", "yes", "on"}
    if type_name == "int":
        return int(raw)
    return raw or None
