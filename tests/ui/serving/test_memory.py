"""The server's allocator: `python app.py` runs under jemalloc where it is installed (Debian's
libjemalloc2; CI installs it), which keeps its memory level as fine-tunes and traffic overlap
(bench/soak.py), and keeps glibc's malloc when asked or when jemalloc is missing."""
import os
from pathlib import Path

import pytest

from bertdemo import memory
from bertdemo.serving import compute
from test_hub import start_app, stop

JEMALLOC = memory.jemalloc_library()


def test_the_environment_preloads_jemalloc_once_and_only_when_wanted():
    library = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
    env = memory.jemalloc_environ({"PATH": "/bin", "LD_PRELOAD": "/opt/other.so"}, library)
    assert env["LD_PRELOAD"].split() == [library, "/opt/other.so"] and env["PATH"] == "/bin"
    assert memory.jemalloc_environ(env, library) is None  # already preloaded: no second exec
    assert memory.jemalloc_environ({"BERTDEMO_MALLOC": "glibc"}, library) is None
    assert memory.jemalloc_environ({}, None) is None  # not installed: glibc, capped and trimmed


def mapped_libraries(pid: int) -> str:
    with open(f"/proc/{pid}/maps") as maps:
        return maps.read()


@pytest.mark.slow
@pytest.mark.skipif(JEMALLOC is None, reason="jemalloc is not installed (apt-get install libjemalloc2)")
def test_the_app_runs_under_jemalloc_in_the_same_process(tiny_bert_dir, tmp_path):
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1"}
    env.pop("LD_PRELOAD", None)
    env.pop("BERTDEMO_MALLOC", None)
    env.pop("GOMP_SPINCOUNT", None)
    proc, _ = start_app(["--model", str(tiny_bert_dir), "--device", "cpu"], env)
    try:
        assert "libjemalloc" in mapped_libraries(proc.pid)  # the pid we started: exec'd, not forked
        # and exec'd with torch's OpenMP told to spin briefly (bertdemo/serving/compute.py)
        environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
        assert f"GOMP_SPINCOUNT={compute.OPENMP_SPIN}".encode() in environ
    finally:
        stop(proc)


def test_torchs_openmp_is_told_to_spin_briefly_unless_the_environment_says_otherwise():
    environ = {}
    compute.short_openmp_spin(environ)
    assert environ == {"GOMP_SPINCOUNT": compute.OPENMP_SPIN}
    mine = {"GOMP_SPINCOUNT": "300000"}
    compute.short_openmp_spin(mine)
    assert mine == {"GOMP_SPINCOUNT": "300000"}


@pytest.mark.slow
def test_the_app_keeps_glibc_when_asked(tiny_bert_dir):
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1", "BERTDEMO_MALLOC": "glibc"}
    env.pop("LD_PRELOAD", None)
    proc, _ = start_app(["--model", str(tiny_bert_dir), "--device", "cpu"], env)
    try:
        assert "libjemalloc" not in mapped_libraries(proc.pid)
    finally:
        stop(proc)


PAGES_KEPT_SCRIPT = r"""
import ctypes
from bertdemo import memory
mallctl = memory._mallctl()

def read(name):
    value, size = ctypes.c_ssize_t(0), ctypes.c_size_t(ctypes.sizeof(ctypes.c_ssize_t))
    assert mallctl(name.encode(), ctypes.byref(value), ctypes.byref(size), None, 0) == 0
    return value.value
before = read("arena.0.dirty_decay_ms")
with memory.pages_kept():
    with memory.pages_kept():  # a second run at the same time
        inner = read("arena.0.dirty_decay_ms")
    still = read("arena.0.dirty_decay_ms")  # the first run goes on: still kept
after = read("arena.0.dirty_decay_ms")
print(memory.allocator(), before, inner, still, after)
"""


@pytest.mark.skipif(JEMALLOC is None, reason="jemalloc is not installed (apt-get install libjemalloc2)")
def test_a_training_run_keeps_jemallocs_freed_pages_until_the_last_run_ends():
    """Inside `pages_kept` (every training run) jemalloc purges nothing (decay -1); the decay it had
    comes back when the last run ends, which hands the unused pages back to the system."""
    import subprocess
    import sys

    env = {**os.environ, "LD_PRELOAD": JEMALLOC}
    out = subprocess.run([sys.executable, "-c", PAGES_KEPT_SCRIPT], env=env, capture_output=True, text=True,
                         cwd=str(Path(__file__).resolve().parents[3]), timeout=120)
    allocator, before, inner, still, after = out.stdout.split()
    assert allocator == "jemalloc", out.stderr
    assert int(before) >= 0 and int(inner) == -1 and int(still) == -1 and int(after) == int(before)


RUNS_BACK_TO_BACK_SCRIPT = r"""
import threading
import torch
from bertdemo import memory

def rss_mb():
    return next(int(line.split()[1]) // 1024 for line in open("/proc/self/status") if line.startswith("VmRSS"))

def run():  # a training run in a thread of its own, as runs.Run does: 256 MB freed and made anew
    with memory.pages_kept():
        for _ in range(3):
            blocks = [torch.ones(1024, 1024 * 8) for _ in range(8)]
            del blocks

before = rss_mb()
for _ in range(4):  # back to back, each in a new thread (so in another jemalloc arena)
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    print(rss_mb() - before)
"""


@pytest.mark.slow
@pytest.mark.skipif(JEMALLOC is None, reason="jemalloc is not installed (apt-get install libjemalloc2)")
def test_runs_back_to_back_hand_their_pages_back_as_each_ends():
    """A run's freed pages are back with the system as soon as it ends, not ~10 s later: the next
    run, in another arena, would otherwise find them still held, and memory climbed run after run."""
    import subprocess
    import sys

    env = {**os.environ, "LD_PRELOAD": JEMALLOC}
    out = subprocess.run([sys.executable, "-c", RUNS_BACK_TO_BACK_SCRIPT], env=env, capture_output=True,
                         text=True, cwd=str(Path(__file__).resolve().parents[3]), timeout=120)
    held = [int(mb) for mb in out.stdout.split()]
    assert len(held) == 4, out.stderr
    assert max(held) < 64, f"MB still held after each run: {held}"


def test_pages_kept_does_nothing_under_glibc():
    if memory.allocator() == "jemalloc":
        pytest.skip("this test process runs on jemalloc")
    with memory.pages_kept():
        assert memory._mallctl() is None
