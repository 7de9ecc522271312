"""The front door itself: --version, every command registered, exit codes of bad input."""

from __future__ import annotations

import subprocess
import sys

import pytest

from trainfit.cli import COMMAND_GROUPS, build_parser, main

COMMANDS = {
    "estimate",
    "check",
    "max-seq",
    "max-batch",
    "min-gpus",
    "recommend",
    "compare",
    "presets",
    "db",
    "serve",
}


def test_version_prints_the_distribution_version() -> None:
    from importlib.metadata import version

    out = subprocess.run(
        [sys.executable, "-m", "trainfit", "--version"], capture_output=True, text=True
    )
    assert out.returncode == 0
    assert out.stdout.strip() == f"trainfit {version('trainfit')}"


def test_every_command_group_registers_its_commands() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, type(parser._subparsers._actions[-1])))
    assert set(sub.choices) == COMMANDS
    assert len(COMMAND_GROUPS) == 5


@pytest.mark.parametrize("command", ["max-seq", "max-batch", "min-gpus"])
def test_solver_table_rows_answer_and_exit_like_before(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            command,
            "--model",
            "llama-3.1-8b",
            "--gpu",
            "h200",
            "--seq",
            "4096",
            "--method",
            "lora",
            "--format",
            "json",
        ]
    )
    assert code == 0
    assert '"gpu": "h200"' in capsys.readouterr().out


def test_a_solver_without_an_answer_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["max-seq", "--model", "llama-3.1-8b", "--gpu", "1gib"])
    assert code == 1
    assert "nothing fits on 1gib" in capsys.readouterr().out
