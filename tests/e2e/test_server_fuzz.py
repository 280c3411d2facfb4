"""Property-based fuzzing of the server's own OpenAPI schema: no input may produce a 5xx.
A fixed number of examples per operation keeps the CI share bounded; derandomized, so CI sees the same examples
every run (run with derandomize off locally to explore)."""
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from atomlite import LLM
from atomlite.server.app import make_app
from random_model import build_random_model
from server_utils import running


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "tiny"
    build_random_model(path)
    llm = LLM(str(path), dtype="float32", device="cpu", max_model_len=64, max_num_seqs=8)
    with running(make_app(llm.engine, "tiny")) as base:
        yield base


def test_no_input_produces_a_server_error(base_url):
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/completions", "/v1/chat/completions", "/tokenize"}
    for operation in operations:
        @given(case=operation.as_strategy())
        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None,
                  derandomize=True)
        def fuzz(case):
            response = case.call(base_url=base_url, timeout=30)
            case.validate_response(response, checks=[not_a_server_error])

        fuzz()
