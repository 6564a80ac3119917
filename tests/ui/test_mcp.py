"""`--mcp`: the demo's quick tools served to agents at Gradio's MCP endpoint, driven here by the
`mcp` package's own client over streamable HTTP."""
import ast
import asyncio
import concurrent.futures
import socket

import pytest

import bertdemo
from bertdemo.config import Settings

SENTENCE = "Paris is the [MASK] of France."
EXPECTED_TOOLS = {"fill_mask", "fill_jointly", "score_candidates", "sentence_score", "mask_sample",
                  "layer_predictions", "saliency", "neuron_view", "head_importance", "embedding_map",
                  "search_corpus", "sentence_features", "feature_card", "steer_feature", "prediction_features",
                  "feature_quality", "find_features", "similar_features", "feature_map", "circuit_graph",
                  "circuit_intervene", "circuit_json"}


def test_mcp_is_off_by_default_on_with_the_env_var_and_in_a_space():
    import app

    assert Settings.from_env({}).mcp is False
    assert Settings.from_env({"BERTDEMO_MCP": "1"}).mcp is True
    assert Settings.from_env({"SPACE_ID": "someone/bertdemo"}).mcp is True
    assert Settings.from_env({"SPACE_ID": "someone/bertdemo", "BERTDEMO_MCP": "0"}).mcp is False
    assert app.parse_args(["--mcp"]).mcp is True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mcp_url(tiny_bert_dir):
    """The whole app started as `app.py --model TINY --mcp`; yields its MCP endpoint."""
    import app
    from bertdemo.ui.serving import lifecycle

    settings = app.parse_args(["--model", str(tiny_bert_dir), "--device", "cpu", "--mcp",
                               "--port", str(free_port())])
    demo = app.build_demo(settings)
    url, _ = lifecycle.serve(demo, settings, block=False)
    yield url.rstrip("/") + "/gradio_api/mcp/"
    demo.close()


def session_call(url: str, work):
    """Run `await work(session)` in an initialised MCP client session; returns its result."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async def run():
        async with streamable_http_client(url) as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return await work(session)
    # Its own thread: Playwright's sync API (the browser tests' session fixture) keeps an event
    # loop running in the main thread for the rest of the session, where asyncio.run refuses.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, run()).result()


def test_tools_are_the_quick_stateless_ones(mcp_url):
    tools = session_call(mcp_url, lambda s: s.list_tools()).tools
    assert {tool.name for tool in tools} == EXPECTED_TOOLS  # no fine-tune, stop, download, choice
    schema = next(t for t in tools if t.name == "fill_mask").inputSchema
    assert set(schema["properties"]) == {"sentence", "top_k"}


def test_fill_mask_tool_gives_the_python_apis_predictions(mcp_url, tiny_bert):
    async def call(session):
        return await session.call_tool("fill_mask", {"sentence": SENTENCE, "top_k": 4})
    result = session_call(mcp_url, call)
    assert not result.isError
    # Gradio sends a multi-output endpoint's result as the text of its Python list of outputs.
    _plot, predictions, model_line = ast.literal_eval(result.content[0].text)
    assert predictions == bertdemo.fill_mask(tiny_bert, SENTENCE, 4)
    assert model_line.startswith("Model: ")


def test_the_heads_tools_give_the_python_apis_numbers(mcp_url, tiny_bert):
    async def call(session):
        neuron = await session.call_tool("neuron_view", {"sentence": SENTENCE, "second_sentence": "",
                                                         "layer": 2, "head": 1, "token": 4})  # the second layer
        importance = await session.call_tool("head_importance", {"sentence": SENTENCE, "mask_number": 1,
                                                                 "target": "", "heads": ""})
        return neuron, importance
    neuron, importance = session_call(mcp_url, call)
    assert not neuron.isError and not importance.isError
    _plot, _tokens, numbers = ast.literal_eval(neuron.content[0].text)
    expected = bertdemo.neuron_view(tiny_bert, SENTENCE, layer=1, head=0, token=4)  # the API counts from 0
    assert numbers["weights"] == pytest.approx(expected["weights"], abs=1e-6) and numbers["layer"] == 2
    assert numbers["head"] == 1  # the page's and the tool's: the first head
    _note, _grid, numbers = ast.literal_eval(importance.content[0].text)
    expected = bertdemo.head_importance(tiny_bert, SENTENCE)["delta"]
    assert [d for row in numbers["delta"] for d in row] == pytest.approx([d for row in expected for d in row], abs=1e-5)


def test_a_bad_input_is_a_tool_error_with_the_message(mcp_url):
    async def call(session):
        return await session.call_tool("fill_mask", {"sentence": "no mask here", "top_k": 4})
    result = session_call(mcp_url, call)
    assert result.isError and "[MASK]" in result.content[0].text


def test_long_actions_cannot_be_called_as_tools(mcp_url):
    async def call(session):
        return await session.call_tool("finetune", {"text": "hello"})
    result = session_call(mcp_url, call)
    assert result.isError and "Unknown tool" in result.content[0].text



def test_every_tool_describes_itself_and_each_argument(mcp_url):
    """Gradio builds the descriptions from the handlers' docstrings ("Args:" lines)."""
    tools = session_call(mcp_url, lambda s: s.list_tools()).tools
    for tool in tools:
        assert len(tool.description) > 40, tool.name
        for name, spec in tool.inputSchema["properties"].items():
            assert spec.get("description"), f"{tool.name}: argument {name} has no description"
