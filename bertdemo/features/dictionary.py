"""A dictionary of features for one layer: EleutherAI's `sparsify.SparseCoder` and the files beside it.

A dictionary is a TopK sparse autoencoder on the residual stream at one layer's output
(`forward.splice`): `encode` keeps the k largest of ReLU(W_enc (h - b_dec) + b_enc), `decode` sums
those latents' rows of W_dec plus b_dec. The coder itself is sparsify's, unchanged, and is saved in
sparsify's own format, so `sparsify.SparseCoder.load_from_disk(folder)` loads a dictionary's folder.
A transcoder (`bertdemo/circuits/transcoders.py`) is the same class with sparsify's `transcode=True`:
it reads a layer's feed-forward input and writes its output (`data.FEED_FORWARD`), encoding its
input as it is (no b_dec subtracted), with an optional linear skip path (W_skip):

    layer_3/cfg.json          sparsify's config (+ d_in)
    layer_3/sae.safetensors   the coder's weights (float16 where shipped, float32 when trained here)
    layer_3/stats.safetensors per-feature statistics over a corpus (`stats.FeatureStats`)
    layer_3/record.json       how it was trained (tokens, minutes, machine), the model it belongs to
                              (its weights digest) and its quality figures (`quality.py`)
    contexts.txt              (beside the layer folders) the corpus lines the statistics point into

The coder knows nothing about models; the views ask the anatomy for hidden states and a splice
point, then the dictionary for codes. Computation runs in float32 whatever the file's precision.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from .. import disk

# sparsify picks its decoder at import: Triton's kernel where Triton imports, unless this says no.
# On a CPU there is nothing for Triton to run on, so the eager decoder (torch's embedding_bag) it is.
if not torch.cuda.is_available():
    os.environ.setdefault("SPARSIFY_DISABLE_TRITON", "1")
with contextlib.redirect_stdout(io.StringIO()):  # it prints which decoder it chose
    from sparsify import SparseCoder, SparseCoderConfig
    from sparsify.sign_sgd import SignSGD  # noqa: F401 - the training's optimizer, imported here after the switch

RECORD = "record.json"
STATS = "stats.safetensors"
CONTEXTS = "contexts.txt"
EXPANSION = 8  # latents per hidden unit, by default
K = 32  # latents kept per token, by default


@dataclass(frozen=True, eq=False)
class Dictionary:
    """One layer's sparse coder (float32, eval mode), where its files are (`folder`, None until
    saved), what it records of its training (`record`) and its per-feature statistics (`stats`,
    a `stats.FeatureStats`, None until computed)."""

    coder: SparseCoder
    layer: int
    folder: Path | None = None
    record: dict = field(default_factory=dict)
    stats: object | None = None

    @property
    def latents(self) -> int:
        return self.coder.num_latents

    @property
    def k(self) -> int:
        return self.coder.cfg.k

    @property
    def width(self) -> int:
        return self.coder.d_in

    @torch.no_grad()
    def encode(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden (N, H) -> (activations (N, k), feature indices (N, k)) on the coder's device; an
        activation may be 0 where fewer than k latents pass the ReLU."""
        out = self.coder.encode(hidden.to(self.coder.device, self.coder.dtype))
        return out.top_acts, out.top_indices

    @torch.no_grad()
    def dense(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (N, H) -> every feature's activation (N, F), zero where it is not in the top k."""
        acts, indices = self.encode(hidden)
        return torch.zeros(hidden.shape[0], self.latents, dtype=acts.dtype).scatter_(1, indices, acts)

    @torch.no_grad()
    def decode(self, acts: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """(activations (N, k), indices (N, k)) -> the reconstruction (N, H)."""
        return self.coder.decode(acts, indices)

    @property
    def transcodes(self) -> bool:
        """Whether it is a transcoder (reads one point of the model, writes another: sparsify's
        `transcode`), not a dictionary of one point."""
        return bool(self.coder.cfg.transcode)

    @torch.no_grad()
    def output(self, x: torch.Tensor, codes: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """x (N, H) -> what the coder writes for it (N, H): its codes (`encode(x)` unless given)
        decoded, plus the skip path x @ W_skip^T where it has one (a transcoder's). For a
        dictionary, x's reconstruction."""
        x = x.to(self.coder.device, self.coder.dtype)
        out = self.decode(*(codes if codes is not None else self.encode(x)))
        return out if self.coder.W_skip is None else out + x @ self.coder.W_skip.mT

    def direction(self, feature: int) -> torch.Tensor:
        """Feature `feature`'s decoder row (H,): what one unit of its activation adds to the layer."""
        return self.coder.W_dec[feature].detach()

    def check_feature(self, feature) -> int:
        from .. import validate

        return validate.whole_number(feature, "feature", 0, self.latents - 1,
                                     f" (this dictionary of layer {self.layer} has {self.latents:,})",
                                     field="feature")


def new_coder(width: int, latents: int | None = None, k: int = K, device: torch.device | str = "cpu", *,
              transcode: bool = False, skip_connection: bool = False) -> SparseCoder:
    """An untrained TopK coder for a hidden size `width`: `latents` (default 8 x width), `k` kept;
    `transcode`: a transcoder (its decoder starts at zeros, as sparsify makes it), with a linear
    skip path when `skip_connection`."""
    config = SparseCoderConfig(activation="topk", num_latents=latents or EXPANSION * width, k=k,
                               transcode=transcode, skip_connection=skip_connection)
    return SparseCoder(width, config, device=device, dtype=torch.float32)


def keeping(coder: SparseCoder, keep: torch.Tensor) -> SparseCoder:
    """`coder` with only the latents where `keep` (bool (F,)) is true, in their order: on any input
    where no removed latent wins a top-k place its codes name the same features (renumbered) with
    the same activations, so its output is the same."""
    kept = keep.nonzero().squeeze(1)
    cfg = replace(coder.cfg, num_latents=len(kept))
    smaller = SparseCoder(coder.d_in, cfg, device=coder.device, dtype=coder.dtype)
    state = coder.state_dict()
    state.update({"encoder.weight": state["encoder.weight"][kept], "encoder.bias": state["encoder.bias"][kept],
                  "W_dec": state["W_dec"][kept]})
    smaller.load_state_dict(state)
    return smaller.eval().requires_grad_(False)


def save(dictionary: Dictionary, folder: Path | str, half: bool = False, contexts: str = CONTEXTS) -> Dictionary:
    """Write `dictionary` as the folder `folder` (sparsify's files, the record, the statistics and
    their context lines, named `contexts` relative to the folder): written whole under a temporary
    name beside it (`disk.DiskCache.temporary`: a start removes it if the writer was killed), then
    renamed over any older one. `half` stores the coder in float16. Returns the dictionary
    with its folder."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f"{disk.temporary_prefix()}{folder.name}-"))
    try:
        record = _write(dictionary, staging, half, contexts)
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Dictionary(dictionary.coder, dictionary.layer, folder, record, dictionary.stats)


def _write(dictionary: Dictionary, staging: Path, half: bool, contexts: str) -> dict:
    """`save`'s files into `staging`, readable by every user (safetensors writes 0600 and mkdtemp
    0700: a server running as another user reads them). Returns the record written."""
    coder = dictionary.coder
    if half:
        coder = SparseCoder(coder.d_in, coder.cfg, dtype=torch.float16)
        coder.load_state_dict({k: v.half() for k, v in dictionary.coder.state_dict().items()})
    coder.save_to_disk(staging)  # cfg.json + sae.safetensors
    record = {**dictionary.record, "layer": dictionary.layer, "contexts": contexts}
    write_json(staging / RECORD, record)
    if dictionary.stats is not None:
        dictionary.stats.save(staging / STATS, staging / contexts)
    for written in staging.iterdir():
        written.chmod(0o644)
    staging.chmod(0o755)
    return record


def load(folder: Path | str) -> Dictionary:
    """The dictionary in `folder` (as `save` wrote it), computing in float32."""
    from .stats import FeatureStats

    folder = Path(folder)
    with contextlib.redirect_stdout(io.StringIO()):
        stored = SparseCoder.load_from_disk(folder)
    coder = SparseCoder(stored.d_in, stored.cfg, dtype=torch.float32)
    coder.load_state_dict({k: v.float() for k, v in stored.state_dict().items()})
    coder.eval().requires_grad_(False)
    record = json.loads((folder / RECORD).read_text(encoding="utf-8")) if (folder / RECORD).is_file() else {}
    stats = FeatureStats.load(folder / STATS, folder / record.get("contexts", CONTEXTS)) \
        if (folder / STATS).is_file() else None
    return Dictionary(coder, int(record.get("layer", -1)), folder, record, stats)


def write_json(path: Path, value) -> None:
    """`value` as JSON at `path`, written under a temporary name and renamed when whole."""
    part = path.with_name(f".{path.name}.part")
    part.write_text(json.dumps(value, indent=1), encoding="utf-8")
    os.replace(part, path)
