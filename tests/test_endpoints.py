"""The public API (what gradio_client and a hosted Space expose) is the committed list in
tests/endpoints.json: every named endpoint, its parameters' names and components, in order, and
its outputs' components. A change to the API shows here as a diff; to add an endpoint on purpose,
regenerate the file (`python tests/test_endpoints.py`) and review the diff."""
import difflib
import json
import sys
from pathlib import Path

import pytest

ENDPOINTS = Path(__file__).with_name("endpoints.json")
ONLY_WITHOUT_A_MODEL = {"/use_bundled"}  # the model banner's button


def endpoint_list(client) -> dict:
    """{"/name": {"parameters": ["name: Component", ...], "returns": ["Component", ...]}}."""
    info = client.view_api(return_format="dict", print_info=False)
    return {name: {"parameters": [f"{p['parameter_name']}: {p['component']}" for p in spec["parameters"]],
                   "returns": [r["component"] for r in spec["returns"]]}
            for name, spec in sorted(info["named_endpoints"].items())}


def committed(with_no_model_extras: bool) -> dict:
    listed = json.loads(ENDPOINTS.read_text())
    return {name: spec for name, spec in listed.items()
            if with_no_model_extras or name not in ONLY_WITHOUT_A_MODEL}


def assert_same_api(actual: dict, expected: dict) -> None:
    if actual != expected:
        diff = difflib.unified_diff(json.dumps(expected, indent=1).splitlines(),
                                    json.dumps(actual, indent=1).splitlines(),
                                    "tests/endpoints.json", "the running app", lineterm="")
        pytest.fail("The app's endpoints differ from tests/endpoints.json (existing endpoints must "
                    "not change; a new one is added by regenerating the file):\n" + "\n".join(diff),
                    pytrace=False)


def test_the_apps_endpoints_are_the_committed_list(client):
    assert_same_api(endpoint_list(client), committed(with_no_model_extras=False))


@pytest.mark.slow
def test_without_a_model_the_app_adds_only_the_bundled_button(no_model_app):
    assert_same_api(endpoint_list(no_model_app), committed(with_no_model_extras=True))


def test_a_changed_endpoint_fails_with_a_diff_that_names_it():
    expected = committed(with_no_model_extras=False)
    renamed = json.loads(json.dumps(expected))
    renamed["/fill_mask"]["parameters"][1] = "k: Slider"
    with pytest.raises(pytest.fail.Exception) as failure:
        assert_same_api(renamed, expected)
    lines = str(failure.value).splitlines()
    assert any(line.startswith("-") and '"top_k: Slider"' in line for line in lines)
    assert any(line.startswith("+") and '"k: Slider"' in line for line in lines)


@pytest.fixture(scope="module")
def no_model_app():
    import app
    from gradio_client import Client

    from bertdemo.config import Settings

    settings = Settings(model="bertdemo-tests/no-such-model", device="cpu", port=None)
    demo = app.build_demo(settings)
    url, _ = app.serve(demo, settings, block=False)
    yield Client(url, verbose=False)
    demo.close()


def write_endpoints() -> None:
    """Regenerate tests/endpoints.json from the app (with no model: that lists every endpoint)."""
    sys.path[:0] = [str(ENDPOINTS.parent), str(ENDPOINTS.parent.parent)]
    import conftest  # noqa: F401 - offline, no analytics
    import app
    from gradio_client import Client

    from bertdemo.config import Settings

    settings = Settings(model="bertdemo-tests/no-such-model", device="cpu", port=None)
    demo = app.build_demo(settings)
    url, _ = app.serve(demo, settings, block=False)
    ENDPOINTS.write_text(json.dumps(endpoint_list(Client(url, verbose=False)), indent=1) + "\n")
    demo.close()


if __name__ == "__main__":
    write_endpoints()
