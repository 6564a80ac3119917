"""Take a fine-tune further: the same run as a `train_mlm.py` on transformers' Trainer.

`training_files(history, model, texts)` gives the files, `export_run(...)` a zip of them:
  train_mlm.py  a fixed script (bertdemo/training/templates/train_mlm.py): the demo's data steps, then
                `Trainer` with `DataCollatorForLanguageModeling`; runs unchanged under `python`,
                `accelerate launch` or `torchrun`, so several GPUs or machines use an existing engine
  run.json      this run's settings (model, data file, masking, collator, lr, schedule, batch,
                block length, seed, keep_best), the only thing that differs between exports;
                the Fine-tune form's settings under the form's names (training_length,
                length_unit, block_length, mask_probability, ...); the script resolves the
                length to steps as the demo does
  train.txt     the text the run trained on
Needs only torch, transformers and accelerate where it runs, not bertdemo.
"""
from __future__ import annotations

import dataclasses
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..model.loading import allowed_choices, display_name
from .fine_tuning import MLMHistory

TEMPLATE = Path(__file__).with_name("templates") / "train_mlm.py"
DATA_FILE = "train.txt"
FOLDER_NOTE = ("The demo loaded this model from a folder on its server, shown here by its name: put "
               "your copy's path (a save_pretrained folder) or its hub id in `model`.")  # run.json's model_note


def run_config(history: MLMHistory, model: str, *, weight_decay: float = 0.01,
               warmup_ratio: float = 0.1, model_note: str | None = None) -> dict:
    """run.json for the run that made `history`, on `model` (a hub id or a folder path).

    `weight_decay` and `warmup_ratio` are `finetune`'s arguments of the same names (the demo uses
    their defaults). The form's settings keep the form's names (the script counts epochs in steps
    as the demo does); "demo" records what the demo ran: its steps planned and done.
    """
    s = history.settings
    if not s:
        raise ValueError("This history has no settings: export a run made by bertdemo.finetune.")
    config = {
        "model": model, "data_file": DATA_FILE, "output_dir": "tuned-model",
        "training_length": s["training_length"], "length_unit": s["length_unit"],
        "batch_size": s["batch_size"], "block_length": s["block_length"], "masking": s["masking"],
        "mask_probability": s["mask_probability"],
        # the script passes mask_probability as the collator's own keyword, mlm_probability
        "collator": {"class": "DataCollatorForLanguageModeling", "mask_replace_prob": 0.8,
                     "random_replace_prob": 0.1},
        "learning_rate": s["learning_rate"], "lr_schedule": "linear", "warmup_ratio": warmup_ratio,
        "weight_decay": weight_decay, "max_grad_norm": 1.0, "optimizer": "adamw_torch", "seed": s["seed"],
        "keep_best": s.get("keep_best", False),
        "demo": {"steps_planned": s["steps"], "steps_run": len(history.steps), "stopped": history.stopped,
                 "eval_before": _scores(history.before) if history.evals else None,
                 "eval_after": _scores(history.after) if history.evals else None,
                 "kept": _scores(history.kept) if history.kept else None},
    }
    if model_note:
        config["model_note"] = model_note
    return config


def _scores(evaluation) -> dict:
    """An `Evaluation` as run.json keeps it: its step and masked-token scores."""
    return {k: v for k, v in dataclasses.asdict(evaluation).items() if v is not None and k != "run"}


def training_files(history: MLMHistory, model: str, texts: str | list[str], **config) -> dict[str, str]:
    """{file name: text}: train_mlm.py, run.json and the training text."""
    text = texts if isinstance(texts, str) else "\n".join(texts)
    return {"train_mlm.py": TEMPLATE.read_text(encoding="utf-8"),
            "run.json": json.dumps(run_config(history, model, **config), indent=2) + "\n",
            DATA_FILE: text if text.endswith("\n") else text + "\n"}


def write_files(history: MLMHistory, model: str, texts: str | list[str], folder: str | Path,
                **config) -> Path:
    """The files in `folder` (made if needed), ready for `python folder/train_mlm.py`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in training_files(history, model, texts, **config).items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def export_run(history: MLMHistory, model: str, texts: str | list[str], path: str | Path,
               **config) -> Path:
    """A zip at `path` holding `train-mlm/` with the three files; returns `path`."""
    path = Path(path)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, text in training_files(history, model, texts, **config).items():
            archive.writestr(f"train-mlm/{name}", text)
    return path


# ---------------------------------------------------------------- a session's last run, for the page

LAST_RUN = "finetune_run"  # the name a session store keeps it under


@dataclass(eq=False)
class FinishedRun:
    """What an export needs from a finished fine-tune: its history, model reference and text."""

    history: MLMHistory
    model: str  # hub id, or the name a visitor sees for a server folder (never its path)
    text: str
    model_note: str | None = None  # e.g. "a folder on the demo's server: put your copy's path here"


def finished_run(history: MLMHistory, base: str, text: str, allowed_models: list[str]) -> FinishedRun:
    """A finished fine-tune of the model named `base` (as the page names it, or its path), named
    as its export names it: a hub id as it is; a folder on the server by its name only, with
    FOLDER_NOTE, so no server path leaves the server. `allowed_models`: the operator's list
    (`Settings.allowed_models`)."""
    name = display_name(base)
    entry = allowed_choices(allowed_models).get(name)
    on_hub = entry is not None and not Path(entry).exists()
    return FinishedRun(history, name, text, None if on_hub else FOLDER_NOTE)


def remember(store, session: str | None, run: FinishedRun) -> None:
    """Keep the session's last finished run (replacing the earlier one) for `script_zip`."""
    store.keep_result(session, LAST_RUN, run, nbytes=len(run.text.encode()) + 4096)


def script_zip(store, session: str | None) -> Path:
    """The session's last run as the export zip, made once per run; ValueError if there is none."""
    run = store.result(session, LAST_RUN)
    if run is None:
        raise ValueError("There is no finished fine-tune to export yet: run one first, then export it.")
    return store.cached_file(session, "training-script", run, lambda folder: export_run(
        run.history, run.model, run.text, folder / "train-mlm.zip", model_note=run.model_note))
