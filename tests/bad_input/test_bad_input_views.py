"""Bad input to the views' endpoints (Fill mask, Attention, Mask sampling, Inside a prediction, Embeddings, Corpus search): every input, every bad value of its
kind, against a server of this module's own (the table and the calls: bad_input_cases.py)."""
import pytest

from bad_input_cases import ENDPOINTS, GROUPS, KINDS, client, group_test, served  # noqa: F401 - fixtures

GROUP = "views"  # its server: bad_input_cases.served


@pytest.mark.slow
def test_the_suite_covers_every_endpoint_and_input(client):
    info = client.view_api(print_info=False, return_format="dict")
    assert not info["unnamed_endpoints"]
    served = {name: [KINDS.get(p["component"], p["component"]) for p in endpoint["parameters"]]
              for name, endpoint in info["named_endpoints"].items()}
    described = {name: [kind for kind, _ in inputs] for name, inputs in ENDPOINTS.items()}
    assert served == described, "an endpoint or input changed: describe it in ENDPOINTS"
    grouped = [name for names in GROUPS.values() for name in names]
    assert sorted(grouped) == sorted(ENDPOINTS), "each endpoint in exactly one of GROUPS"


test_bad_input_gets_a_clear_message_and_the_next_good_request_succeeds = group_test(GROUP)
