"""Two processes under torchrun shard a tiny model with FSDP2 (gloo on the CPU)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from memtest_schema import load_memtest  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "configs" / "tiny-llama.json"


@pytest.mark.slow
def test_two_process_fsdp_run_records_each_ranks_peak(tmp_path):
    out = tmp_path / "memtest.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "probe",
        "--config",
        str(TINY),
        "--device",
        "cpu",
        "--sweep",
        "32,64",
        "--steps",
        "1",
        "--out",
        str(out),
        "--no-progress",
    ]
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = load_memtest(out.read_bytes())
    assert doc["setup"]["sharding"] == "fsdp" and doc["setup"]["num_gpus"] == 2
    assert doc["environment"]["gpu_count"] == 2
    assert [r["status"] for r in doc["results"]] == ["ok", "ok"]
    ranks = {(r["rank"], r["seq_len"]) for r in doc["ranks"]}
    assert ranks == {(0, 32), (0, 64), (1, 32), (1, 64)}
    assert all(r["peak_allocated_bytes"] > 0 for r in doc["ranks"])
