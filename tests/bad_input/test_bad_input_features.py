"""Bad input to the Features and Circuits tabs' endpoints (training dictionaries and transcoders included): every input, every bad value of its
kind, against a server of this module's own (the table and the calls: bad_input_cases.py)."""
import pytest
from gradio_client import Client

from bad_input_cases import cases, check_case, suite_app


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    with suite_app(tmp_path_factory.mktemp("bad-input-features")) as served:
        yield served


@pytest.fixture(scope="module")
def client(app):
    return Client(app[0], verbose=False)


@pytest.mark.slow
@pytest.mark.parametrize("api_name, index, value", cases("features"))
def test_bad_input_gets_a_clear_message_and_the_next_good_request_succeeds(app, client, api_name, index, value):
    check_case(client, app, api_name, index, value)
