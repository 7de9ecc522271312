"""The probe run with TRL 1.8.0's files first on its path, in one subprocess per test module.

`.venv` holds TRL 1.16; TRL 1.0-1.9's preference trainers (1.8.0 is axolotl 067b021c's pin) take
their log-probabilities from the full logits, which `--loss full` prices. `scripts/setup.sh`
installs TRL 1.8.0 in `.trl-1.8`; without it the tests that use this module are skipped. A
module's runs share one interpreter (`probe_runs`): torch, transformers and TRL are imported
once, and each run builds its own model and trainer, as a separate process would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRL_18 = ROOT / ".trl-1.8"

needs_trl_1_8 = pytest.mark.skipif(
    not (TRL_18 / "trl" / "__init__.py").is_file(),
    reason="TRL 1.8.0 is not in .trl-1.8 (scripts/setup.sh installs it)",
)

VOCAB = 32768  # the configs' vocabulary in these runs: the logits dominate the step
LORA = ("--method", "lora", "--lora-rank", "8")
BF16 = ("--precision", "bf16", "--no-autocast")

# runs each probe CLI command of argv[1] (a JSON list of argument lists); prints their exit codes
_SCRIPT = """
import json, sys
from probe.cli import main
print(json.dumps([main(argv) for argv in json.loads(sys.argv[1])]))
"""


class Run(NamedTuple):
    """One probe command: TRL 1.8.0's `objective` trainer with `--loss full` and checkpointing
    on (unless `args` say otherwise), two steps a length of `seqs`, on `device`, on
    bench/configs/`name`.json with `vocab` tokens."""

    objective: str
    args: tuple[str, ...]
    seqs: str
    name: str = "small-llama"
    vocab: int = VOCAB
    device: str = "fake"


def _argv(directory: Path, key: str, run: Run) -> list[str]:
    config = json.loads((ROOT / "bench" / "configs" / f"{run.name}.json").read_text())
    config_path = directory / f"{key}-config.json"
    config_path.write_text(json.dumps({**config, "vocab_size": run.vocab}))
    out = directory / f"{key}.json"
    argv = ["--config", str(config_path), "--stack", "hf", "--objective", run.objective]
    argv += ["--loss", "full", "--checkpointing", "gpu", *run.args, "--sweep", run.seqs]
    return argv + ["--steps", "2", "--device", run.device, "--out", str(out), "--no-progress"]


def run_probes(directory: Path, runs: dict[str, Run]) -> tuple[list[int], str]:
    """The exit code of every run (in order) and the subprocess's stderr."""
    argvs = [_argv(directory, key, run) for key, run in runs.items()]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TRL_18), str(ROOT)]),
        "TRL_EXPERIMENTAL_SILENCE": "1",
    }
    command = [sys.executable, "-c", _SCRIPT, json.dumps(argvs)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    codes: list[int] = json.loads(done.stdout.strip().splitlines()[-1])
    return codes, done.stderr


def probe_runs(directory: Path, runs: dict[str, Run]) -> dict[str, dict[str, Any]]:
    """Every run's memtest by its key, every length measured."""
    codes, stderr = run_probes(directory, runs)
    assert codes == [0] * len(runs), (codes, stderr[-3000:])
    docs: dict[str, dict[str, Any]] = {}
    for key in runs:
        doc = json.loads((directory / f"{key}.json").read_text())
        for res in doc["results"]:
            assert res["status"] == "ok", (key, res["error"])
        docs[key] = doc
    return docs


def compared_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The estimate-vs-measured row of each length of `doc` (default profile)."""
    from estimator.document import compare_memtest

    rows: list[dict[str, Any]] = compare_memtest(doc, "default")["rows"]
    return rows
