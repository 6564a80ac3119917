"""Bad input to the Features and Circuits tabs' endpoints (training dictionaries and transcoders included): every input, every bad value of its
kind, against a server of this module's own (the table and the calls: bad_input_cases.py)."""
from bad_input_cases import client, group_test, served  # noqa: F401 - fixtures

GROUP = "features"  # its server: bad_input_cases.served

test_bad_input_gets_a_clear_message_and_the_next_good_request_succeeds = group_test(GROUP)
