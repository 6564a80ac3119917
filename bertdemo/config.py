"""Settings for the demo: one dataclass, every field overridable by a flag or an env var."""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields

DEFAULT_MODEL = "bert-base-uncased"


@dataclass
class Settings:
    """What the operator can set. `app.py` maps each field to `--flag` and `BERTDEMO_FIELD`."""

    model: str = DEFAULT_MODEL  # hub id or local folder
    models: str | None = None  # comma-separated: more models visitors may pick (--model is always offered)
    device: str | None = None  # None: CUDA when present, else CPU
    host: str = "127.0.0.1"
    port: int = 7860
    max_masks: int = 10  # most [MASK]s accepted in one sentence
    max_top_k: int = 50  # most predictions shown per mask
    max_candidates: int = 10  # most candidate words scored at once
    max_batch: int = 16  # fill-mask requests batched into one forward (1: no batching)
    finetune_max_chars: int = 20_000  # most characters of pasted text per fine-tune
    finetune_max_steps: int = 300  # most training steps per fine-tune run
    finetune_max_seconds: int = 120  # wall-clock limit per run; the loop stops cleanly there
    finetune_max_models: int = 8  # tuned models kept in memory; the least recently used is evicted
    finetune_concurrency: int = 1  # fine-tunes running at once; the others wait in the queue
    queue_size: int = 64  # most requests waiting in the queue; past it new ones are refused
    max_sessions: int = 1000  # sessions whose page state Gradio keeps (~0.3 MB each); the oldest go first
    download_max_mb: int = 2048  # downloads kept on disk; past it the least recent sessions' are deleted
    download_max_age: int = 3600  # seconds a download stays available; older files are deleted
    allow_pickle: bool = False  # accept checkpoints without safetensors (pickle can run code)
    mcp: bool = False  # also serve the quick tools to MCP clients (agents) at /gradio_api/mcp/; on in a Space
    share: bool = False  # ask Gradio's share server for a public *.gradio.live link
    auth: str | None = field(default=None, repr=False)  # "user:password": login page (kept out of logs)

    @property
    def allowed_models(self) -> list[str]:
        """What a visitor may pick in the page: `model` first, then each of `models`, once."""
        names = [self.model, *(self.models or "").split(",")]
        return list(dict.fromkeys(name.strip() for name in names if name and name.strip()))

    @classmethod
    def from_env(cls, environ: dict | None = None) -> "Settings":
        """Settings with each `BERTDEMO_<FIELD>` env var applied (e.g. BERTDEMO_MODEL)."""
        environ = os.environ if environ is None else environ
        values = _hosting_defaults(environ)
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


def _hosting_defaults(environ) -> dict:
    """Host and port from the hosting platform's conventions; BERTDEMO_HOST/PORT still win.

    Gradio reads GRADIO_SERVER_NAME/GRADIO_SERVER_PORT (our Docker image sets them), and a Hugging
    Face Space sets SPACE_ID and serves whatever listens on 0.0.0.0:7860.
    """
    values = {}
    if environ.get("GRADIO_SERVER_NAME"):
        values["host"] = environ["GRADIO_SERVER_NAME"]
    elif environ.get("SPACE_ID"):
        values["host"] = "0.0.0.0"
    if environ.get("SPACE_ID"):
        values["mcp"] = True  # a 2026 Space is expected to offer its tools to agents
    if environ.get("GRADIO_SERVER_PORT"):
        values["port"] = int(environ["GRADIO_SERVER_PORT"])
    return values
