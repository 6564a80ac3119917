"""The server log says what is normal: bad input is one line, a real fault its traceback; the
offline fallback to the bundled model is one warning saying what is served and why; the first
start's ONNX export prints no tracer or optimizer noise."""
import asyncio
import gc
import logging
import warnings

import gradio as gr
import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

import app
from bertdemo.model import bundled
from bertdemo.forward import onnx_engine
from bertdemo.config import DEFAULT_MODEL, Settings
from bertdemo.serving.engine import Engine
from bertdemo.sessions import SessionStore
from bertdemo.ui.parts.common import refuse_non_finite_numbers
from bertdemo.ui.parts.context import AppContext, handler
from conftest import launch


def on_echo(visitor, text: str):
    """Bad input is a ValueError saying the fix; 'crash' stands for a bug."""
    if not text:
        raise ValueError("Type a sentence with [MASK] in it.")
    if text == "crash":
        raise RuntimeError("a bug in the server")
    return text


async def on_echo_async(visitor, text: str):
    """`on_echo` awaited on the server's event loop, as Predict is."""
    await asyncio.sleep(0)
    return on_echo(visitor, text)


@pytest.fixture(scope="module")
def echo_url():
    ctx = AppContext(SessionStore(None), Settings(device="cpu"), Engine())
    with gr.Blocks() as demo:
        box, out = gr.Textbox(), gr.Textbox()
        gr.Button().click(handler(ctx, on_echo), box, out, api_name="echo")
        gr.Button().click(handler(ctx, on_echo_async), box, out, api_name="echo_async")
        top_k = gr.Slider(1, 10, step=1, label="Top-k")
        gr.Button().click(handler(ctx, lambda visitor, k: str(k)), top_k, out, api_name="top_k")
    refuse_non_finite_numbers(demo)
    url = launch(demo)
    yield url
    demo.close()


@pytest.fixture
def sent(echo_url, caplog, capfd):
    """`sent(text)` sends `text` to the app and returns the bertdemo log records it made, what
    Gradio printed to stderr meanwhile, and the message the visitor got."""
    client = Client(echo_url, verbose=False)

    def send(text, api: str) -> tuple[list[logging.LogRecord], str, str]:
        capfd.readouterr()
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="bertdemo"), pytest.raises(AppError) as refused:
            client.predict(text, api_name=api)
        # the handlers' logger; other tests' background work (an engine measuring its forwards)
        # logs under bertdemo.* meanwhile
        records = [r for r in caplog.records if r.name == "bertdemo"]
        return records, capfd.readouterr().err, str(refused.value)
    return send


HANDLERS = pytest.mark.parametrize("api", ["/echo", "/echo_async"])  # run in a worker thread, awaited on the loop


@HANDLERS
def test_bad_input_is_one_log_line_and_no_traceback(sent, api):
    records, stderr, message = sent("", api)
    assert "Type a sentence with [MASK] in it." in message  # the visitor reads the fix
    assert len(records) == 1 and records[0].levelno == logging.INFO and records[0].exc_info is None
    assert api[1:] in records[0].getMessage() and "Type a sentence with [MASK]" in records[0].getMessage()
    assert "Traceback" not in stderr


@HANDLERS
def test_a_real_fault_logs_its_traceback_once(sent, api):
    records, stderr, message = sent("crash", api)
    assert "Something went wrong on the server" in message and "a bug" not in message
    assert len(records) == 1 and records[0].levelno == logging.ERROR
    assert records[0].exc_info and records[0].exc_info[0] is RuntimeError  # the traceback, in our log
    assert "Traceback" not in stderr  # and not a second time from Gradio


@pytest.mark.parametrize("value, said", [(0, "Value 0 is less than minimum value 1."),
                                          (11, "Value 11 is greater than maximum value 10.")])
def test_a_number_out_of_range_is_one_log_line_and_no_traceback(sent, value, said):
    """A script can send a slider any number: Gradio's range check answers, the log says so once."""
    records, stderr, message = sent(value, "/top_k")
    assert said in message
    assert len(records) == 1 and records[0].levelno == logging.INFO and said in records[0].getMessage()
    assert "Traceback" not in stderr


@pytest.mark.skipif(not bundled.available(), reason="the bundled model's files are not there")
def test_the_offline_fallback_is_one_warning_saying_what_is_served_and_why(monkeypatch, caplog):
    engine = Engine()
    real = engine.load_allowed

    def hub_down(name, *args, **kwargs):
        if name == DEFAULT_MODEL:
            raise ValueError("Could not load a masked-LM model from 'bert-base-uncased', tried as a Hugging "
                             "Face Hub id, in this machine's cache (the hub did not answer): We couldn't "
                             "connect to 'https://huggingface.co' to load the files.")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(engine, "load_allowed", hub_down)
    with caplog.at_level(logging.INFO, logger="bertdemo"):
        store = app.load_store(Settings(device="cpu"), engine)
    assert store.base.name == bundled.BUNDLED
    said = [r for r in caplog.records if r.name.startswith("bertdemo") and r.levelno >= logging.WARNING]
    assert [r.levelno for r in said] == [logging.WARNING]  # one line, and no ERROR
    line = said[0].getMessage()
    assert "\n" not in line and said[0].exc_info is None
    assert line.startswith("Serving the bundled model") and "instead of bert-base-uncased" in line
    assert "the Hugging Face Hub did not answer" in line and "--model" in line


@pytest.mark.skipif(not onnx_engine.available(), reason="onnxruntime is not installed")
def test_the_onnx_export_prints_no_tracer_or_optimizer_noise(tiny_bert, tmp_path, caplog):
    # what earlier tests left in cycles (a client's event loop: "unclosed event loop"), finalized
    # now rather than by a collection the export's allocations happen to start, inside the record
    gc.collect()
    with warnings.catch_warnings(record=True) as warned, caplog.at_level(logging.INFO):
        warnings.simplefilter("always")
        # hidden by Python unless asked for; the TorchScript exporter is chosen on purpose (dynamo=False)
        warnings.simplefilter("ignore", DeprecationWarning)
        onnx_engine.export(tiny_bert.model, tmp_path / "model.onnx")
    assert (tmp_path / "model.onnx").is_file()
    assert [str(w.message)[:80] for w in warned] == []
    assert [r.name for r in caplog.records] == ["bertdemo.forward.onnx_engine"]  # one line: the export and its fusions
    with warnings.catch_warnings(record=True) as after:  # only around the export: others still warn
        warnings.simplefilter("always")
        warnings.warn("still shown", UserWarning)
    assert len(after) == 1
