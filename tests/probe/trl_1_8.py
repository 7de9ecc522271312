"""The probe run with TRL 1.8.0's files first on its path, in a subprocess.

`.venv` holds TRL 1.16; TRL 1.0-1.9's preference trainers (1.8.0 is axolotl 067b021c's pin) take
their log-probabilities from the full logits, which `--loss full` prices. `scripts/setup.sh`
installs TRL 1.8.0 in `.trl-1.8`; without it the tests that use this module are skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRL_18 = ROOT / ".trl-1.8"

needs_trl_1_8 = pytest.mark.skipif(
    not (TRL_18 / "trl" / "__init__.py").is_file(),
    reason="TRL 1.8.0 is not in .trl-1.8 (scripts/setup.sh installs it)",
)


def run_trl_1_8(
    tmp_path: Path,
    objective: str,
    args: list[str],
    seqs: str,
    name: str = "small-llama",
    vocab: int = 32768,
    device: str = "fake",
) -> subprocess.CompletedProcess[str]:
    """The probe CLI on TRL 1.8.0's `objective` trainer (on `device`, the fake trace unless
    said, `--loss full` unless `args` say otherwise, checkpointing on, two steps a length) on
    bench/configs/`name`.json with `vocab` tokens, writing tmp_path/memtest.json."""
    config = json.loads((ROOT / "bench" / "configs" / f"{name}.json").read_text())
    config_path = tmp_path / f"{name}.json"
    config_path.write_text(json.dumps({**config, "vocab_size": vocab}))
    out = tmp_path / "memtest.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TRL_18), str(ROOT)]),
        "TRL_EXPERIMENTAL_SILENCE": "1",
    }
    command = [sys.executable, "-m", "probe", "--config", str(config_path), "--stack", "hf"]
    command += ["--objective", objective, "--loss", "full", "--checkpointing", "gpu", *args]
    command += ["--sweep", seqs, "--steps", "2", "--device", device, "--out", str(out)]
    command += ["--no-progress"]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def probe_trl_1_8(tmp_path: Path, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """The memtest of `run_trl_1_8(tmp_path, *args, **kwargs)`, every length measured."""
    done = run_trl_1_8(tmp_path, *args, **kwargs)
    assert done.returncode == 0, done.stderr[-2000:]
    doc: dict[str, Any] = json.loads((tmp_path / "memtest.json").read_text())
    for res in doc["results"]:
        assert res["status"] == "ok", res["error"]
    return doc
