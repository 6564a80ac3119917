"""Examples cached lazily, per model: the first click on an example runs it, later clicks (any
visitor's, after a restart too) read the cache; a visitor on another model, or on their tuned
model, gets that model's answer, never the served model's."""
import copy
import dataclasses
from types import SimpleNamespace

import gradio as gr
import pytest
import torch

import bertdemo
from bertdemo.config import Settings
from bertdemo.disk import DiskCache
from bertdemo.sessions import SessionStore
from bertdemo.ui.parts.cached_examples import ModelExamples
from bertdemo.ui.parts.context import AppContext, Visitor, handler

CALLS = []


def on_echo(visitor: Visitor, sentence):
    """What the visitor's model makes of the sentence (here: its name and one weight)."""
    CALLS.append(visitor.session)
    weight = float(visitor.lm.model.bert.encoder.layer[0].output.dense.weight[0, 0])
    return f"{visitor.lm.name}:{weight:.6f}:{sentence}"


def make_examples(ctx):
    with gr.Blocks():
        text, out = gr.Textbox(), gr.Textbox()
        return ModelExamples(ctx, [["first"], ["second"]], [text], [out], handler(ctx, on_echo), "echo")


def click(examples, n, session):
    return examples.load_from_cache(n, SimpleNamespace(session_hash=session, headers={}, query_params={}))


@pytest.fixture
def ctx(tiny_bert, tmp_path):
    CALLS.clear()
    return AppContext(SessionStore(tiny_bert), Settings(), bertdemo.Engine(disk=DiskCache(tmp_path)))


def test_an_example_runs_once_then_everyone_reads_the_cache_even_after_a_restart(ctx):
    examples = make_examples(ctx)
    first = click(examples, 0, "alice")
    weight = float(ctx.store.base.model.bert.encoder.layer[0].output.dense.weight[0, 0])
    assert first == [f"{ctx.store.base.name}:{weight:.6f}:first"]
    assert click(examples, 0, "bob") == first and CALLS == ["alice"]
    assert click(examples, 1, "bob")[0].endswith(":second") and CALLS == ["alice", "bob"]
    assert [p.name for p in ctx.engine.disk.folder("examples").rglob("log.csv")] == ["log.csv"]  # in the budget
    restarted = make_examples(ctx)  # a new process: the same examples, the same model, files on disk
    assert click(restarted, 0, "carol") == first and CALLS == ["alice", "bob"]


def test_another_model_or_a_tuned_one_gets_its_own_answer(ctx):
    examples = make_examples(ctx)
    served = click(examples, 0, "alice")
    model = copy.deepcopy(ctx.store.base.model)
    with torch.no_grad():
        model.bert.encoder.layer[0].output.dense.weight.add_(1.0)
    other = dataclasses.replace(ctx.store.base, model=model, name="other")
    ctx.store.choose_base("bob", other)
    picked = click(examples, 0, "bob")
    assert picked != served and picked[0].startswith("other:") and CALLS == ["alice", "bob"]
    assert click(examples, 0, "alice") == served  # the served model's cache is untouched
    ctx.store.put_model("carol", "tuned", dataclasses.replace(other, name="tuned"))
    ctx.store.use_tuned("carol")
    tuned = click(examples, 0, "carol")
    assert tuned[0].startswith("tuned:") and CALLS[-1] == "carol"
    assert examples.folder_for(SimpleNamespace(session_hash="carol")).is_relative_to(examples._temp)
