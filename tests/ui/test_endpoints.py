"""The public API (what gradio_client and a hosted Space expose) is the committed list in
tests/endpoints.json: every named endpoint, its parameters' names and components, in order, and
its outputs' components. A change to the API shows here as a diff; to add an endpoint on purpose,
regenerate the file (`python tests/ui/test_endpoints.py`) and review the diff."""
import difflib
import json
import sys
from pathlib import Path

import pytest

ENDPOINTS = Path(__file__).resolve().parents[1] / "endpoints.json"
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
def test_without_a_model_the_app_adds_only_the_bundled_button(no_model_client):
    assert_same_api(endpoint_list(no_model_client), committed(with_no_model_extras=True))


def test_a_changed_endpoint_fails_with_a_diff_that_names_it():
    expected = committed(with_no_model_extras=False)
    renamed = json.loads(json.dumps(expected))
    renamed["/fill_mask"]["parameters"][1] = "k: Slider"
    with pytest.raises(pytest.fail.Exception) as failure:
        assert_same_api(renamed, expected)
    lines = str(failure.value).splitlines()
    assert any(line.startswith("-") and '"top_k: Slider"' in line for line in lines)
    assert any(line.startswith("+") and '"k: Slider"' in line for line in lines)


def write_endpoints() -> None:
    """Regenerate tests/endpoints.json from the app (with no model: that lists every endpoint)."""
    sys.path[:0] = [str(ENDPOINTS.parent), str(ENDPOINTS.parent.parent)]
    import conftest  # offline, no analytics

    with conftest.app_without_a_model() as client:
        ENDPOINTS.write_text(json.dumps(endpoint_list(client), indent=1) + "\n")


if __name__ == "__main__":
    write_endpoints()
