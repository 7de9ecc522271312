"""`app.client.check_remote` against a live server: verdicts, 4xx -> RemoteInputError,
unreachable -> RemoteUnavailableError."""

from __future__ import annotations

import pytest
from service_support import SEED_TARGETS, free_port

from app.client import RemoteInputError, RemoteUnavailableError, check_remote

SEED_CHECK = {
    "model": {"preset": "qwen3.5-27b"},
    "setup": {
        "method": "lora",
        "lora_rank": 16,
        "lora_targets": SEED_TARGETS,
        "optimizer": "adamw-8bit",
        "checkpointing": "offload",
        "loss": "chunked",
    },
    "seq_lens": [48000],
    "gpu": "a100-80gb",
    "profile": "seed-000",
}


def test_check_remote_returns_the_verdict(live_server: str) -> None:
    result = check_remote(live_server, SEED_CHECK, timeout=30)
    assert (result["fits"], result["verdict"]) == (True, "fits")
    tight = check_remote(
        live_server + "/",
        {
            **SEED_CHECK,
            "gpu": "rtx-pro-6000",
            "setup": {**SEED_CHECK["setup"], "checkpointing": "gpu"},
        },
    )
    assert tight["verdict"] == "tight"


def test_bad_input_raises_remote_input_error(live_server: str) -> None:
    with pytest.raises(RemoteInputError) as info:
        check_remote(live_server, {**SEED_CHECK, "gpu": "no-such-gpu"})
    assert info.value.status_code == 422
    assert "gpu: unknown GPU" in str(info.value)


def test_unreachable_server_raises_remote_unavailable() -> None:
    with pytest.raises(RemoteUnavailableError):
        check_remote(f"http://127.0.0.1:{free_port()}", SEED_CHECK, timeout=2)
