"""Export a fine-tune as train_mlm.py + run.json: the same run on transformers' Trainer."""
import json
import re
import subprocess
import sys
import zipfile

import pytest
import torch

import bertdemo
import bertdemo.training.fine_tuning
import tiny_models
from bertdemo.training import export

TEXT = "\n".join(tiny_models.SENTENCES * 3)
SETTINGS = dict(training_length=2, batch_size=4, learning_rate=3e-4, seed=3, block_length=32, mask_probability=0.2)


@pytest.fixture(scope="module")
def runs(tiny_bert):
    """{masking: history} for a 2-step run with each masking."""
    return {m: bertdemo.finetune(tiny_bert, TEXT, masking=m, **SETTINGS)[1] for m in ("dynamic", "static")}


def test_run_json_holds_every_setting_of_the_run(runs, tiny_bert_dir):
    config = export.run_config(runs["static"], str(tiny_bert_dir), weight_decay=0.02)
    assert config["model"] == str(tiny_bert_dir) and config["data_file"] == "train.txt"
    assert {k: config[k] for k in ("training_length", "length_unit", "batch_size", "learning_rate", "seed",
                                   "block_length", "mask_probability", "masking", "weight_decay")} == dict(
        training_length=2, length_unit="steps", batch_size=4, learning_rate=3e-4, seed=3, block_length=32,
        mask_probability=0.2, masking="static", weight_decay=0.02)
    assert config["collator"]["class"] == "DataCollatorForLanguageModeling"
    assert config["demo"]["steps_run"] == 2 and config["demo"]["eval_after"]["step"] == 2
    assert config["keep_best"] is True  # the fine-tune's keep_best, under the same name


def test_run_json_says_when_the_run_kept_the_last_weights(tiny_bert, tiny_bert_dir):
    _, history = bertdemo.finetune(tiny_bert, TEXT, keep_best=False, **SETTINGS)
    assert export.run_config(history, str(tiny_bert_dir))["keep_best"] is False


def test_export_zip_has_script_settings_and_data(runs, tiny_bert_dir, tmp_path):
    path = export.export_run(runs["dynamic"], str(tiny_bert_dir), TEXT, tmp_path / "run.zip")
    with zipfile.ZipFile(path) as archive:
        assert sorted(archive.namelist()) == ["train-mlm/run.json", "train-mlm/train.txt",
                                              "train-mlm/train_mlm.py"]
        assert json.loads(archive.read("train-mlm/run.json"))["masking"] == "dynamic"
        assert archive.read("train-mlm/train.txt").decode().splitlines() == TEXT.splitlines()
        script = archive.read("train-mlm/train_mlm.py").decode()
    assert not re.search(r"^\s*(import|from)\s+bertdemo", script, re.MULTILINE)  # self-contained
    compile(script, "train_mlm.py", "exec")


def test_run_json_and_the_script_call_each_setting_by_the_forms_name(runs, tiny_bert_dir):
    """The form, the plan, run.json and train_mlm.py: one name per setting."""
    import dataclasses

    from bertdemo.training.fine_tuning import FinetuneForm

    config = export.run_config(runs["static"], str(tiny_bert_dir))
    form = {f.name for f in dataclasses.fields(FinetuneForm)} - {"text"}
    assert form <= set(config) and {"steps", "epochs", "max_length", "mlm_probability"}.isdisjoint(config)
    read = set(re.findall(r'run(?:\[|\.get\()"(\w+)"', export.TEMPLATE.read_text()))
    assert form <= read <= set(config)  # the script reads the form's settings, under their names


def test_the_script_counts_epochs_in_steps_as_the_demo(tiny_bert, tiny_bert_dir):
    import importlib.util

    _, history = bertdemo.finetune(tiny_bert, TEXT, **dict(SETTINGS, training_length=1.5, length_unit="epochs"),
                                   should_stop=lambda: True)
    config = export.run_config(history, str(tiny_bert_dir))
    assert (config["training_length"], config["length_unit"]) == (1.5, "epochs")
    spec = importlib.util.spec_from_file_location("train_mlm", export.TEMPLATE)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.planned_steps(config, history.train_blocks) == history.planned_steps == config["demo"]["steps_planned"]
    assert history.planned_steps > 1


def test_a_history_without_settings_is_refused():
    with pytest.raises(ValueError, match="bertdemo.finetune"):
        export.run_config(bertdemo.training.fine_tuning.MLMHistory(planned_steps=1), "bert-base-uncased")


def run_script(folder, *args):
    result = subprocess.run([sys.executable, str(folder / "train_mlm.py"), *args], capture_output=True,
                            text=True, timeout=420, cwd=folder)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("masking", ["dynamic", "static"])
def test_first_step_loss_matches_the_demo_loop(runs, tiny_bert_dir, tmp_path, masking):
    """Same batch, same masks, same dropout: the script's Trainer loss equals the demo's step 1."""
    folder = export.write_files(runs[masking], str(tiny_bert_dir), TEXT, tmp_path)
    loss = json.loads(run_script(folder, "--first-batch-loss").strip().splitlines()[-1])["loss"]
    assert loss == pytest.approx(runs[masking].steps[0].loss, rel=1e-5)


@pytest.mark.slow
def test_the_exported_script_keeps_the_best_evaluations_weights(runs, tiny_bert_dir, tmp_path):
    """keep_best in run.json: Trainer's load_best_model_at_end, and the script says which it kept."""
    folder = export.write_files(runs["dynamic"], str(tiny_bert_dir), TEXT, tmp_path)
    out = run_script(folder, "--max-steps", "3")
    assert re.search(r"kept the weights of checkpoint-[123] \(lowest held-out loss\)", out), out
    assert bertdemo.load(str(folder / "tuned-model"), device="cpu").card.head_trained


@pytest.mark.slow
def test_exported_script_trains_and_saves_a_model_bertdemo_loads(runs, tiny_bert, tiny_bert_dir, tmp_path):
    folder = export.write_files(runs["dynamic"], str(tiny_bert_dir), TEXT, tmp_path)
    out = run_script(folder, "--max-steps", "2")
    assert "saved to" in out and "perplexity" in out
    tuned = bertdemo.load(str(folder / "tuned-model"), device="cpu")
    assert tuned.card.head_trained and tuned.card.weights == "safetensors"
    moved = [not torch.equal(a, b) for a, b in zip(tuned.model.parameters(), tiny_bert.model.parameters())]
    assert any(moved)  # two optimiser steps changed the weights
    assert bertdemo.fill_mask(tuned, "paris is the [MASK] of france.", 3)  # and it predicts


def test_a_sessions_last_run_exports_once_and_only_its_own(runs, tiny_bert):
    from bertdemo.sessions import SessionStore

    store = SessionStore(tiny_bert)
    with pytest.raises(ValueError, match="no finished fine-tune"):
        export.script_zip(store, "s1")
    export.remember(store, "s1", export.FinishedRun(runs["static"], "bert-base-uncased", TEXT))
    first = export.script_zip(store, "s1")
    assert export.script_zip(store, "s1") == first  # made once per run
    with zipfile.ZipFile(first) as archive:
        assert json.loads(archive.read("train-mlm/run.json"))["model"] == "bert-base-uncased"
    with pytest.raises(ValueError, match="no finished fine-tune"):
        export.script_zip(store, "s2")  # another visitor has nothing to export
    store.drop("s1")
    assert not first.exists()


@pytest.mark.slow
def test_the_fine_tune_tabs_export_button_gives_the_sessions_last_run(client, tiny_bert_dir):
    """Through the running app: a fine-tune, then /export_training_script, in one session."""
    with pytest.raises(Exception, match="no finished fine-tune"):
        client.predict(api_name="/export_training_script")
    client.predict(TEXT, 2, "steps", 3e-4, 4, 32, 0.2, "static", 3, False, "", api_name="/finetune")
    path = client.predict(api_name="/export_training_script")
    with zipfile.ZipFile(path) as archive:
        config = json.loads(archive.read("train-mlm/run.json"))
        assert archive.read("train-mlm/train.txt").decode().splitlines() == TEXT.splitlines()
    assert (config["training_length"], config["length_unit"], config["masking"], config["seed"],
            config["block_length"]) == (2, "steps", "static", 3, 32)
    assert config["model"] == tiny_bert_dir.name  # the page's name for a server folder, never its path
    assert str(tiny_bert_dir) not in json.dumps(config) and "model_note" in config


def test_a_finished_run_names_a_hub_model_by_its_id(runs, tiny_bert):
    from bertdemo.config import Settings
    from bertdemo.sessions import SessionStore
    from bertdemo.ui.parts.context import Visitor
    from bertdemo.ui.tabs import export_button

    store, settings = SessionStore(tiny_bert), Settings(model="bert-base-uncased")
    export.remember(store, "s1", export.finished_run(runs["dynamic"], "bert-base-uncased", TEXT,
                                                     settings.allowed_models))
    path = export_button.on_export_script(Visitor(store, settings, "s1", bertdemo.Engine()))
    with zipfile.ZipFile(path) as archive:
        config = json.loads(archive.read("train-mlm/run.json"))
    assert config["model"] == "bert-base-uncased" and "model_note" not in config


@pytest.mark.slow
def test_the_same_script_runs_unchanged_under_torchrun_on_two_processes(runs, tiny_bert_dir, tmp_path):
    """`torchrun --nproc_per_node 2 train_mlm.py`: one model trained across both processes (CPU,
    gloo), one save, and the held-out loss before training equals the one-process figure."""
    import shutil

    folder = export.write_files(runs["dynamic"], str(tiny_bert_dir), TEXT, tmp_path)
    one = run_script(folder, "--max-steps", "1", "--output-dir", str(tmp_path / "one"))
    torchrun = shutil.which("torchrun") or pytest.fail("torchrun (installed with torch) not found")
    result = subprocess.run([torchrun, "--nproc_per_node", "2", "train_mlm.py", "--max-steps", "2"],
                            cwd=folder, capture_output=True, text=True, timeout=480)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("saved to") == 1  # the main process saves and reports
    before = [line for line in result.stdout.splitlines() if line.startswith("before:")]
    assert before == [line for line in one.splitlines() if line.startswith("before:")]
    assert bertdemo.load(str(folder / "tuned-model"), device="cpu").card.head_trained
