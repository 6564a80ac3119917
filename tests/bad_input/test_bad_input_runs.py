"""Bad input to the runs' endpoints (fine-tuning, the article's fine-tune, probes, the classifier): every input, every bad value of its
kind, against a server of this module's own (the table and the calls: bad_input_cases.py)."""
from bad_input_cases import client, group_test, served  # noqa: F401 - fixtures

GROUP = "runs"  # its server: bad_input_cases.served

test_bad_input_gets_a_clear_message_and_the_next_good_request_succeeds = group_test(GROUP)
