"""Hub model ids: a local Hub cache and a local HTTP endpoint on 127.0.0.1, never the internet."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from estimator.errors import EstimatorInputError
from estimator.hub import HubSettings, fetch_config, model_source, parse_hub_id
from estimator.model_source import resolve_model
from estimator.request import ModelInput
from tests.estimator.hub_server import (
    COMMIT,
    TINY,
    TOKEN,
    HubHandler,
    write_snapshot,
)
from trainfit.cli import main

pytest.importorskip("huggingface_hub")


def test_served_by_the_local_endpoint_and_then_cached(hub_env: Path) -> None:
    assert fetch_config("acme/tiny-llama") == TINY
    url = "GET /acme/tiny-llama/resolve/main/config.json"
    assert any(r.startswith(url) for r in HubHandler.requests)
    assert (hub_env / "models--acme--tiny-llama" / "snapshots" / COMMIT / "config.json").is_file()
    # the service's cache: offline, the same id is answered from the snapshot just written
    served = len(HubHandler.requests)
    assert fetch_config("acme/tiny-llama", HubSettings(True, str(hub_env), None, None)) == TINY
    assert len(HubHandler.requests) == served


def test_cached_offline_needs_no_endpoint(hub_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    write_snapshot(hub_env, "acme/offline-only", {**TINY, "num_hidden_layers": 7})
    assert fetch_config("acme/offline-only")["num_hidden_layers"] == 7
    assert fetch_config(f"acme/offline-only@{COMMIT}")["num_hidden_layers"] == 7
    spec = resolve_model(ModelInput(hub="acme/offline-only"))
    assert spec.layers == 7 and spec.name == "acme/offline-only"
    assert HubHandler.requests == []


def test_offline_and_not_cached_says_how_to_pass_a_file(
    hub_env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(EstimatorInputError) as err:
        fetch_config("acme/tiny-llama")
    assert err.value.field == "model.hub"
    assert "HF_HUB_OFFLINE is set" in err.value.message
    assert "--model path/to/config.json" in err.value.message
    assert HubHandler.requests == []
    code = main(["check", "--model", "acme/tiny-llama", "--gpu", "h100-80gb"])
    assert code == 2
    assert "--model path/to/config.json" in capsys.readouterr().err


def test_gated_repo_401_is_a_clear_message_and_hf_token_opens_it(
    hub_env: Path, monkeypatch: pytest.MonkeyPatch, endpoint: str
) -> None:
    with pytest.raises(EstimatorInputError) as err:
        fetch_config("acme/gated-llama")
    assert "gated repo" in err.value.message
    assert f"{endpoint}/acme/gated-llama" in err.value.message
    assert "HF_TOKEN" in err.value.message
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert fetch_config("acme/gated-llama")["hidden_size"] == 512


def test_absent_repo_revision_and_file_are_clear_messages(hub_env: Path) -> None:
    with pytest.raises(EstimatorInputError, match="no such model repo") as err:
        fetch_config("acme/no-such-model")
    assert "--model path/to/config.json" in err.value.message
    with pytest.raises(EstimatorInputError, match="revision 'v9' not found"):
        fetch_config("acme/tiny-llama@v9")


def test_cli_estimates_a_hub_id_served_locally(
    hub_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["estimate", "--model", "acme/tiny-llama", "--gpu", "h100-80gb", "--format", "json"]
    code = main(argv)
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["model"]["name"] == "acme/tiny-llama"


def test_preset_ids_win_over_hub_ids_and_files_over_both(tmp_path: Path) -> None:
    assert model_source("llama-3.1-8b") == {"preset": "llama-3.1-8b"}
    assert model_source("Qwen/Qwen3-8B") == {"preset": "qwen3-8b"}  # the preset's source repo
    assert model_source("acme/Qwen3-8B") == {"hub": "acme/Qwen3-8B"}
    assert model_source("Qwen/Qwen3-8B@refs/pr/1") == {"hub": "Qwen/Qwen3-8B@refs/pr/1"}
    assert model_source("no-such-model") == {"preset": "no-such-model"}  # preset error names them
    local = tmp_path / "org" / "name"
    local.mkdir(parents=True)
    (local / "config.json").write_text("{}")
    assert model_source(str(local)) == {"file": str(local / "config.json")}
    assert parse_hub_id("a/b@main").revision == "main"
    with pytest.raises(EstimatorInputError):
        parse_hub_id("a/b/c")


def test_importing_the_estimator_does_not_import_huggingface_hub() -> None:
    import subprocess
    import sys

    code = (
        "import sys, trainfit.cli, estimator.hub, estimator.model_source; "
        "print('huggingface_hub' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_settings_follow_huggingface_hub_environment_names() -> None:
    s = HubSettings.from_env({"HF_HOME": "/h", "TRANSFORMERS_OFFLINE": "YES", "HF_TOKEN": "t"})
    assert (s.offline, s.cache_dir, s.token, s.endpoint) == (True, "/h/hub", "t", None)
    s = HubSettings.from_env(
        {"HF_HOME": "/h", "HF_HUB_CACHE": "/c", "HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://e/"}
    )
    assert (s.offline, s.cache_dir, s.endpoint) == (False, "/c", "http://e")
