"""The server's allocator: `python app.py` runs under jemalloc where it is installed (Debian's
libjemalloc2; CI installs it), which keeps its memory level as fine-tunes and traffic overlap
(bench/soak.py), and keeps glibc's malloc when asked or when jemalloc is missing."""
import os

import pytest

from bertdemo import memory
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
    proc, _ = start_app(["--model", str(tiny_bert_dir), "--device", "cpu"], env)
    try:
        assert "libjemalloc" in mapped_libraries(proc.pid)  # the pid we started: exec'd, not forked
    finally:
        stop(proc)


@pytest.mark.slow
def test_the_app_keeps_glibc_when_asked(tiny_bert_dir):
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1", "BERTDEMO_MALLOC": "glibc"}
    env.pop("LD_PRELOAD", None)
    proc, _ = start_app(["--model", str(tiny_bert_dir), "--device", "cpu"], env)
    try:
        assert "libjemalloc" not in mapped_libraries(proc.pid)
    finally:
        stop(proc)
