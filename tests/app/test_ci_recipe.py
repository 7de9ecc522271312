"""The README's CI recipes, run exactly as written against a live server: they pass when the
run fits and fail for every other outcome (does not fit, bad body, server down, server 5xx)."""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from service_support import free_port

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
CHECK_JSON = json.loads((ROOT / "examples" / "ci" / "check.json").read_text())

pytestmark = pytest.mark.skipif(
    shutil.which("curl") is None or shutil.which("jq") is None, reason="needs curl and jq"
)


def _snippet(marker: str) -> str:
    m = re.search(rf"<!-- {marker} -->\n```bash\n(.*?)```", README, re.S)
    assert m, f"README has no {marker} block"
    return m.group(1)


def _env(url: str) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "TRAINFIT_URL": url, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def _curl(url: str, body: dict[str, object], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    (tmp_path / "check.json").write_text(json.dumps(body))
    return subprocess.run(
        ["bash", "-c", _snippet("ci-curl")],
        cwd=tmp_path,
        env=_env(url),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _cli(url: str, gpu: str) -> subprocess.CompletedProcess[str]:
    script = _snippet("ci-cli").rstrip() + f" --gpu {gpu}"
    return subprocess.run(
        ["bash", "-c", script], env=_env(url), capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def failing_server() -> Iterator[str]:
    """A server that answers every POST with HTTP 500."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(500)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(b"Internal Server Error")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_curl_recipe_passes_when_it_fits_and_fails_when_it_does_not(
    live_server: str, tmp_path: Path
) -> None:
    fits = _curl(live_server, {**CHECK_JSON, "gpu": "h200"}, tmp_path)
    assert (fits.returncode, fits.stdout.strip()) == (0, "true")
    no = _curl(live_server, {**CHECK_JSON, "gpu": "16gib"}, tmp_path)
    assert (no.returncode, no.stdout.strip()) == (1, "false")


def test_curl_recipe_fails_on_a_bad_body_and_shows_why(live_server: str, tmp_path: Path) -> None:
    bad = _curl(live_server, {**CHECK_JSON, "gpu": "h300"}, tmp_path)
    assert bad.returncode == 5  # jq: the 422 answer has no verdict
    assert "no verdict" in bad.stderr and "h300" in bad.stdout + bad.stderr


def test_curl_recipe_fails_when_the_server_is_down_or_failing(
    failing_server: str, tmp_path: Path
) -> None:
    down = _curl(f"http://127.0.0.1:{free_port()}", CHECK_JSON, tmp_path)
    assert down.returncode == 5 and "Failed to connect" in down.stderr
    failing = _curl(failing_server, CHECK_JSON, tmp_path)
    assert failing.returncode == 5 and "500" in failing.stderr


def test_cli_recipe_has_distinct_exit_codes(live_server: str, failing_server: str) -> None:
    assert _cli(live_server, "h200").returncode == 0
    assert _cli(live_server, "16gib").returncode == 1
    assert _cli(live_server, "h300").returncode == 2
    assert _cli(f"http://127.0.0.1:{free_port()}", "h200").returncode == 3
    assert _cli(failing_server, "h200").returncode == 3


def test_the_github_actions_example_runs_the_readme_recipe() -> None:
    workflow = (ROOT / "examples" / "ci" / "github-actions.yml").read_text()
    flat = " ".join(workflow.replace("\\\n", " ").split())
    for line in _snippet("ci-curl").replace("\\\n", " ").splitlines():
        assert " ".join(line.replace("check.json", "examples/ci/check.json").split()) in flat
