"""bench/load.py at a small size (the 500-client, 60 s run is the benchmark): a mix of reads,
estimates, uploads, quote creations and approvals against a live server on each database must
give no 5xx other than a deliberate 503 (with Retry-After), no transport error and no 4xx
other than the 409 of a lost approval race."""

from __future__ import annotations

import pytest

from bench import load

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    "database", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def test_mixed_load_has_no_server_errors(database: str, pg_skip_reason: str | None) -> None:
    if database == "postgresql" and pg_skip_reason:
        pytest.skip(pg_skip_reason)
    result = load.run(database, seconds=4, clients=60)
    assert result["requests"] > 0
    for kind in ("read", "estimate", "upload", "quote"):
        assert result["kinds"][kind]["requests"] > 0, kind
    assert result["server_errors_not_503"] == 0, result["statuses"]
    assert result["503_without_retry_after"] == 0
    assert result["transport_errors"] == {}
    assert result["unexpected_4xx"] == 0, result["statuses"]
