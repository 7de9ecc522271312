"""A local Hub for the tests: an HTTP endpoint on 127.0.0.1 that serves config files as the Hub
does, and a Hub cache directory per test (used by tests/estimator/test_hub.py and the service's
tests). Never the internet."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

COMMIT = "0123456789abcdef0123456789abcdef01234567"
TOKEN = "hf_test_token_for_the_gated_repo"
TINY = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "vocab_size": 1000,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
REPOS = {
    "acme/tiny-llama": (TINY, False),
    "acme/gated-llama": ({**TINY, "hidden_size": 512}, True),
    "acme/tiny-tokenizer": (TINY, False),
}
DATASET = Path(__file__).resolve().parents[2] / "examples" / "dataset"
# files besides config.json: a tokenizer repo (the small tokenizer built for the tests)
FILES: dict[str, dict[str, bytes]] = {
    "acme/tiny-tokenizer": {
        name: (DATASET / name).read_bytes() for name in ("tokenizer.json", "tokenizer_config.json")
    }
}


class HubHandler(BaseHTTPRequestHandler):
    """Answers `/{org}/{name}/resolve/{revision}/{file}` as the Hub does for a small non-LFS file:
    ETag and X-Repo-Commit on HEAD and GET (huggingface_hub/file_download.py,
    `get_hf_file_metadata` and `_get_metadata_or_catch_error` require both), errors with the
    `X-Error-Code` header that `utils/_http.py::hf_raise_for_status` maps to its exceptions."""

    requests: list[str] = []

    def log_message(self, *args: object) -> None:  # keep pytest output clean
        pass

    def _answer(self, body: bool) -> None:
        HubHandler.requests.append(f"{self.command} {self.path}")
        parts = self.path.split("?")[0].strip("/").split("/")
        if len(parts) != 5 or parts[2] != "resolve":
            return self._error(404, "RepoNotFound")
        repo, revision, filename = f"{parts[0]}/{parts[1]}", parts[3], parts[4]
        if repo not in REPOS:
            return self._error(404, "RepoNotFound", "Repository not found")
        config, gated = REPOS[repo]
        if gated and self.headers.get("authorization") != f"Bearer {TOKEN}":
            return self._error(401, "GatedRepo", f"Access to model {repo} is restricted.")
        if revision not in ("main", COMMIT):
            return self._error(404, "RevisionNotFound", "Invalid rev id")
        extra = FILES.get(repo, {})
        if filename != "config.json" and filename not in extra:
            return self._error(404, "EntryNotFound", "Entry not found")
        data = extra[filename] if filename in extra else json.dumps(config).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
        self.send_header("X-Repo-Commit", COMMIT)
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _error(self, status: int, code: str, message: str = "") -> None:
        data = json.dumps({"error": message or code}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message or code)
        if code != "RepoNotFound":
            self.send_header("X-Repo-Commit", COMMIT)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def do_HEAD(self) -> None:  # noqa: N802 (http.server's naming)
        self._answer(body=False)

    def do_GET(self) -> None:  # noqa: N802
        self._answer(body=True)


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), HubHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def hub_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, endpoint: str) -> Path:
    cache = tmp_path / "hub-cache"
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HF_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    # huggingface_hub reads HF_HUB_OFFLINE once, at its import (constants.py): a test that
    # imported it with the variable set (an offline test) would leave every later one offline
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    HubHandler.requests.clear()
    return cache


def write_snapshot(cache: Path, repo: str, config: dict[str, object]) -> None:
    """The hub cache layout (huggingface_hub/file_download.py `hf_hub_download` docstring):
    models--ORG--NAME/refs/main holds the commit; snapshots/<commit>/config.json the file."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(COMMIT)
    snap = folder / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(config))
