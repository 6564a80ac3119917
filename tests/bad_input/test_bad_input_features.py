"""Bad input to the Features and Circuits tabs' endpoints (training dictionaries and transcoders included): every input, every bad value of its
kind, against a server of this module's own (the table and the calls: bad_input_cases.py)."""
import pytest

from bad_input_cases import cases, check_case, client, served  # noqa: F401 - fixtures

GROUP = "features"  # its server: bad_input_cases.served


@pytest.mark.slow
@pytest.mark.parametrize("api_name, index, value", cases(GROUP))
def test_bad_input_gets_a_clear_message_and_the_next_good_request_succeeds(served, client, api_name, index, value):
    check_case(client, served, api_name, index, value)
