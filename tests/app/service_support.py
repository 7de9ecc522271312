"""Helpers for the service tests (a uniquely named module: `conftest` names collide across
test folders). Fixtures are in conftest.py."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

from app.settings import Settings

PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
UPLOAD_TOKEN = "upload-secret-0123"
APPROVER_TOKEN = "approve-secret-4567"
REQUESTER_TOKEN = "request-secret-8901"  # alice
OTHER_REQUESTER_TOKEN = "request-secret-2345"  # bob


def postgres_unreachable() -> str | None:
    try:
        import psycopg

        with psycopg.connect(PG_ADMIN_URL, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        return f"PostgreSQL at 127.0.0.1:5432 (user postgres, db test) unreachable: {exc}"
    return None


def make_settings(database_url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "database_url": database_url,
        "upload_tokens": f"ci={UPLOAD_TOKEN}",
        "approver_tokens": f"kral={APPROVER_TOKEN}",
        "requester_tokens": f"alice={REQUESTER_TOKEN},bob={OTHER_REQUESTER_TOKEN}",
        "secret_key": "test-secret-key",
    }
    values.update(overrides)
    return Settings(**values)


def upload_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {UPLOAD_TOKEN}", "Content-Type": "application/json"}


def approver_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {APPROVER_TOKEN}"}


def requester_headers(token: str = REQUESTER_TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


SEED_TARGETS = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "in_proj_qkv",
    "in_proj_z",
    "out_proj",
]

SEED_SETUP: dict[str, Any] = {
    "method": "lora",
    "lora_rank": 16,
    "lora_alpha": None,
    "lora_targets": SEED_TARGETS,
    "adapter_dtype": "fp32",
    "optimizer": "adamw-8bit",
    "precision": "mixed",
    "checkpointing": "offload",
    "loss": "chunked",
    "loss_chunk": 4096,
    "batch": 1,
    "sharding": "none",
    "num_gpus": 1,
    "attention": "sdpa",
}

_MEMTEST: dict[str, Any] = {
    "schema": "trainfit.memtest/1",
    "created_at": "2026-10-07T09:30:00Z",
    "tool": {"name": "trainfit-probe", "version": "0.1.0", "command": "trainfit-probe ..."},
    "environment": {
        "device": "cuda",
        "gpu_name": "NVIDIA H200",
        "total_memory_bytes": 150_754_820_096,
        "gpu_count": 1,
        "torch": "2.13.0",
        "cuda": "13.0",
        "transformers": "5.24.0",
        "peft": "0.21.0",
        "bitsandbytes": None,
        "memory_counter": "torch.cuda.max_memory_allocated",
        "attention_kernel": "sdpa",
        "linear_attention_kernel": None,
    },
    "model": {
        "name": "qwen3.5-27b",
        "model_type": "qwen3_5",
        "config": {"model_type": "qwen3_5", "hidden_size": 5120},
        "params_total": 27_800_000_000,
        "params_trainable": 107_000_000,
    },
    "setup": SEED_SETUP,
    "sweep": [16000, 32000, 48000],
    "results": [
        {
            "seq_len": 16000,
            "batch": 1,
            "status": "ok",
            "steps": 3,
            "peak_allocated_bytes": 62_000_000_000,
            "peak_reserved_bytes": 64_000_000_000,
            "step_seconds": [40.1, 38.2, 38.0],
            "tokens_per_second": 420.5,
            "error": None,
            "components": None,
        },
        {
            "seq_len": 32000,
            "batch": 1,
            "status": "ok",
            "steps": 3,
            "peak_allocated_bytes": 66_000_000_000,
            "peak_reserved_bytes": 68_000_000_000,
            "step_seconds": [80.0, 79.0, 79.5],
            "tokens_per_second": 402.0,
            "error": None,
            "components": None,
        },
        {
            "seq_len": 48000,
            "batch": 1,
            "status": "oom",
            "steps": 0,
            "peak_allocated_bytes": None,
            "peak_reserved_bytes": None,
            "step_seconds": [],
            "tokens_per_second": None,
            "error": "CUDA out of memory",
            "components": None,
        },
    ],
}


def memtest_doc(**changes: Any) -> dict[str, Any]:
    doc = copy.deepcopy(_MEMTEST)
    doc.update(changes)
    return doc


def seed_case_memtest(
    components: Callable[[dict[str, Any]], dict[str, int]], **result_changes: Any
) -> dict[str, Any]:
    """A memtest of the seed case (qwen3.5-27b's config) whose ok results carry the probe's
    components at the peak, `components(result)` each, and `result_changes`."""
    from estimator.presets import preset_config

    doc = memtest_doc()
    doc["model"] = dict(doc["model"], config=preset_config("qwen3.5-27b"))
    for result in doc["results"]:
        if result["status"] == "ok":
            result["components"] = components(result)
            result.update(result_changes)
    return doc


def memtest_bytes(**changes: Any) -> bytes:
    return json.dumps(memtest_doc(**changes), indent=2).encode()


# ---------------------------------------------------------------------------------------------
# A stand-in for the estimator library with the documented shapes, so that page, quote and
# memtest tests do not depend on the estimator's numbers (the estimate tests use the real one).

GIB = 2**30
FAKE_GPUS = [
    {
        "id": "a100-80gb",
        "name": "NVIDIA A100 80GB",
        "capacity_bytes": 85_899_345_920,
        "bf16_dense_tflops": 312.0,
        "price_usd_per_hour": 2.5,
    },
    {
        "id": "h200",
        "name": "NVIDIA H200",
        "capacity_bytes": 150_754_820_096,
        "bf16_dense_tflops": 989.0,
        "price_usd_per_hour": 5.0,
    },
]


def fake_estimate(req: Any) -> dict[str, Any]:
    caps = {g["id"]: g["capacity_bytes"] for g in FAKE_GPUS}
    rows = []
    for seq in req.seq_lens:
        comps = {
            "weights": 52 * GIB,
            "trainable_states": 1 * GIB,
            "checkpoints": 0 if req.setup.checkpointing == "offload" else seq * 5120 * 2 * 64,
            "recompute_peak": 9 * GIB,
            "logits": 3 * GIB if req.setup.loss == "chunked" else seq * 248320 * 6,
            "overhead": 1 * GIB,
        }
        peak = sum(comps.values())
        fit = {}
        for gpu in req.gpus:
            cards = int(gpu.split("x")[0]) if "x" in gpu[:3] else 1
            capacity = caps.get(gpu.split("x")[-1], 100 * GIB)
            usable = int(capacity * req.usable_fraction)
            per_device = peak // cards
            verdict = (
                "fits" if per_device <= usable else "tight" if per_device <= capacity else "no"
            )
            fit[gpu] = {
                "verdict": verdict,
                "capacity_bytes": capacity,
                "usable_bytes": usable,
                "peak_bytes": per_device,
                "margin_bytes": usable - per_device,
            }
        rows.append(
            {
                "seq_len": seq,
                "batch": req.setup.batch,
                "components": comps,
                "host_bytes": 0,
                "peak_bytes": peak,
                "flops_per_step": 6 * 27e9 * seq,
                "fit": fit,
            }
        )
    name = req.model.preset or req.model.name or "custom"
    return {
        "model": {"name": name, "params_total": 27_800_000_000, "params_trainable": 107_000_000},
        "rows": rows,
        "assumptions": {"usable_fraction": req.usable_fraction},
    }


def fake_compare(doc: dict[str, Any], profile: str = "default") -> dict[str, Any]:
    rows = []
    for r in doc["results"]:
        measured = r["peak_allocated_bytes"]
        estimated = 60 * GIB
        error = None if measured is None else estimated - measured
        rows.append(
            {
                "seq_len": r["seq_len"],
                "status": r["status"],
                "measured_peak_bytes": measured,
                "estimated_peak_bytes": estimated,
                "error_bytes": error,
                "error_pct": None if measured is None else 100 * error / measured,
            }
        )
    return {"profile": profile, "rows": rows}


def install_fake_library(monkeypatch: Any) -> None:
    from app.services import estimates

    monkeypatch.setattr(estimates, "estimate", fake_estimate)
    monkeypatch.setattr(estimates, "compare_memtest", fake_compare)
    monkeypatch.setattr(estimates, "list_gpus", lambda: [dict(g) for g in FAKE_GPUS])
    monkeypatch.setattr(
        estimates,
        "list_presets",
        lambda: [
            {
                "id": "qwen3.5-27b",
                "name": "Qwen3.5 27B <b>",
                "model_type": "qwen3_5",
                "params_total": 27_800_000_000,
            }
        ],
    )
    monkeypatch.setattr(estimates, "list_profiles", lambda: ["default", "seed-000"])


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_live_server(settings: Settings) -> tuple[Any, Any, str]:
    import threading
    import time

    import uvicorn

    from app.factory import create_app

    port = free_port()
    config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    return server, thread, f"http://127.0.0.1:{port}"
