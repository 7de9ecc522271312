"""schemathesis' CLI with `--checks all` (every check it has: server errors, status codes,
content types, headers and schemas of responses, positive and negative data, missing headers,
unsupported methods and their `Allow`, use after free, resource availability, ignored auth)
against a live server on SQLite, at a bounded example count: 0 failures, 0 errors. Exceptions
are documented in schemathesis.toml next to this file. `bench/fuzz_api.py` runs the same on
both databases with more examples."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from bench import fuzz_api, harness

pytestmark = pytest.mark.slow


def test_schemathesis_checks_all_find_nothing(tmp_path: Path) -> None:
    config = fuzz_api.CONFIG.read_text()
    assert f"Bearer {harness.APPROVER_TOKEN}" in config
    assert f"Bearer {harness.UPLOAD_TOKEN}" in config
    server = harness.Server(f"sqlite:///{tmp_path / 'fuzz.db'}", harness.free_port())
    server.start()
    try:
        result = fuzz_api.fuzz(server.url, examples=5, timeout=240)
    finally:
        server.stop()
    summary = result.text[-3000:]
    assert result.returncode == 0, summary
    assert result.generated > 1000, summary
    assert result.failures == 0 and result.errors == 0, summary
    assert re.search(r"\d+ generated, \d+ passed", result.text), summary
    assert sys.executable  # the CLI ran in this interpreter's environment (fuzz_api.ST)
