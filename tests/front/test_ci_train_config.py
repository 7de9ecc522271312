"""The training-config CI job (examples/ci/github-actions-train-config.yml) runs the command the
README shows as the CI gate, and that command's exit code is the estimate's verdict."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from trainfit.cli import main

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "examples" / "ci" / "github-actions-train-config.yml"


def _check_command() -> list[str]:
    yaml = pytest.importorskip("yaml")
    steps = yaml.safe_load(JOB.read_text())["jobs"]["fits"]["steps"]
    runs = [s["run"] for s in steps if "trainfit check" in s.get("run", "")]
    assert len(runs) == 1
    return shlex.split(runs[0])


def test_the_job_runs_the_readme_ci_gate() -> None:
    argv = _check_command()
    readme = (ROOT / "README.md").read_text()
    assert f"$ {' '.join(argv)}\n" in readme  # the same command, shown with its output there


def test_the_jobs_exit_code_is_the_estimates_verdict(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(ROOT)
    argv = _check_command()[1:]
    code = main([*argv, "--format", "json"])
    verdict = json.loads(capsys.readouterr().out)
    assert code == (0 if verdict["fits"] else 1)
    # the same config on a card it cannot fit fails the job
    assert main([*argv[:-1], "rtx-4090", "--seq", "65536"]) == 1
