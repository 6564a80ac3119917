"""The bad-input groups' server and client: one per test module (its GROUP), so the groups run
side by side."""
import pytest
from gradio_client import Client

from bad_input_cases import suite_app


@pytest.fixture(scope="module")
def app(request, tmp_path_factory):
    with suite_app(tmp_path_factory.mktemp(f"bad-input-{request.module.GROUP}")) as served:
        yield served


@pytest.fixture(scope="module")
def client(app):
    return Client(app[0], verbose=False)
