"""Schemathesis against the service's own OpenAPI schema (in process, ASGI): every operation,
each with the right token, and the stateful phase (links). No 5xx, no response that violates
the documented status codes, content types or schemas. `bench/fuzz_api.py` runs the same
against a live server on SQLite and PostgreSQL with many more cases."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from service_support import APPROVER_TOKEN, UPLOAD_TOKEN, make_settings

from app.db.migrate import upgrade_head
from app.factory import create_app

_DB = Path(os.environ.get("TMPDIR", "/tmp")) / f"trainfit-fuzz-{os.getpid()}.db"
_APP = create_app(make_settings(f"sqlite:///{_DB}"))
upgrade_head(_APP.state.engine)  # no lifespan under the ASGI transport
schema = schemathesis.openapi.from_asgi("/openapi.json", _APP)

EXAMPLES = int(os.environ.get("TRAINFIT_FUZZ_EXAMPLES", "12"))
# positive_data_acceptance is left out: the schema cannot express the catalog (gpu ids, presets)
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def token_for(path: str, method: str) -> str | None:
    if path == "/v1/memtests" and method.upper() == "POST":
        return UPLOAD_TOKEN
    if path.endswith(("/approve", "/reject")):
        return APPROVER_TOKEN
    return None


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_every_operation(case: schemathesis.Case) -> None:
    token = token_for(case.path, case.method)
    headers = {"Authorization": f"Bearer {token}"} if token else None
    response = case.call_and_validate(headers=headers, checks=CHECKS)
    assert response.status_code < 500


StateMachine = schema.as_state_machine()


class _Stateful(StateMachine):  # type: ignore[misc,valid-type]
    def get_call_kwargs(self, case: schemathesis.Case) -> dict[str, object]:
        token = token_for(case.path, case.method)
        return {"headers": {"Authorization": f"Bearer {token}"}} if token else {}

    def validate_response(self, response, case, additional_checks=None, **kwargs):  # type: ignore[no-untyped-def]
        assert response.status_code < 500, (case.method, case.path, response.text[:300])
        case.validate_response(response, checks=CHECKS, transport_kwargs=kwargs or None)


TestStateful = _Stateful.TestCase
TestStateful.settings = settings(
    max_examples=int(os.environ.get("TRAINFIT_FUZZ_STATEFUL", "15")),
    stateful_step_count=6,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)


def teardown_module() -> None:
    _APP.state.engine.dispose()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{_DB}{suffix}").unlink(missing_ok=True)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
