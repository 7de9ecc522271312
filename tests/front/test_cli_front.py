"""The front door itself: --version, every command registered, exit codes of bad input."""

from __future__ import annotations

import argparse
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
    "token",
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


def _leaf_commands() -> list[tuple[list[str], argparse.ArgumentParser]]:
    """Every (sub)command of the parser tree, nested ones (`token create`) included."""
    found: list[tuple[list[str], argparse.ArgumentParser]] = []

    def walk(path: list[str], parser: argparse.ArgumentParser) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if path and not subs:
            found.append((path, parser))
        for sub in subs:
            for name, child in sub.choices.items():
                walk([*path, name], child)

    walk([], build_parser())
    return found


LEAVES = _leaf_commands()


def test_the_help_walk_finds_every_command() -> None:
    assert {path[0] for path, _ in LEAVES} == COMMANDS


def test_the_top_level_help_has_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    assert "example:\n  trainfit estimate " in capsys.readouterr().out


@pytest.mark.parametrize(("path", "parser"), LEAVES, ids=[" ".join(p) for p, _ in LEAVES])
def test_every_help_shows_defaults_and_an_example(
    path: list[str], parser: argparse.ArgumentParser, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        main([*path, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "example:\n  trainfit " in out
    # every option with a default says it (argparse's "%(default)s" or the option's own words)
    flat = "".join(out.split())  # argparse wraps lines, also after a hyphen
    for action in parser._actions:
        if not action.option_strings or action.default in (None, False, argparse.SUPPRESS):
            continue
        if action.default == []:
            continue
        helped = parser.formatter_class(prog="x")._expand_help(action)
        assert "default" in helped, f"{path} {action.option_strings[0]}: {helped!r}"
        assert "".join(helped.split()) in flat


def test_num_gpus_has_the_old_name_as_an_alias(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["check", "--params", "8e9", "--sharding", "fsdp", "--gpu", "h100-80gb", "--format"]
    main([*base, "json", "--num-gpus", "8"])
    new = capsys.readouterr().out
    main([*base, "json", "--gpus", "8"])
    assert capsys.readouterr().out == new


def test_check_takes_a_list_and_fits_only_if_every_gpu_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = ["check", "--model", "llama-3.1-8b", "--method", "lora", "--seq", "4096"]
    assert main([*base, "--gpu", "h100-80gb,h200"]) == 0
    assert capsys.readouterr().out.count("fits: peak") == 2
    assert main([*base, "--gpu", "h200,8gib"]) == 1


def test_solvers_answer_each_gpu_of_a_list(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["max-seq", "--model", "llama-3.1-8b", "--method", "lora"]
    assert main([*args, "--gpu", "h100-80gb,h200"]) == 0
    out = capsys.readouterr().out
    assert "longest sequence on h100-80gb" in out and "longest sequence on h200" in out


def test_token_create_prints_the_secret_once_and_a_hashed_entry(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from app.settings import hash_token
    from app.tokens import ROLE_VARIABLES
    from trainfit.cli.service import TOKEN_ROLES

    assert set(TOKEN_ROLES) == set(ROLE_VARIABLES)
    assert main(["token", "create", "--role", "approver", "--name", "kral"]) == 0
    lines = capsys.readouterr().out.splitlines()
    secret = lines[0].rsplit(" ", 1)[1]
    assert lines[1] == f"add to TRAINFIT_APPROVER_TOKENS: kral=sha256:{hash_token(secret)}"
    assert main(["token", "create", "--role", "approver", "--name", "bad name!"]) == 2


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (["--parallel", "fsdp", "--pp-schedule", "gpipe"], "pp_schedule"),
        (["--parallel", "fsdp,pp=2", "--pp-virtual", "2"], "pp_virtual"),
        (
            ["--parallel", "pp=8", "--pp-schedule", "interleaved-1f1b", "--pp-virtual", "5"],
            "pp_virtual",
        ),
    ],
)
def test_bad_pipeline_schedule_exits_2_naming_the_field(
    capsys: pytest.CaptureFixture[str], extra: list[str], field: str
) -> None:
    argv = ["estimate", "--model", "llama-3.1-8b", "--method", "full", "--gpu", "8xh100"]
    assert main([*argv, *extra]) == 2
    assert field in capsys.readouterr().err


def test_pipeline_schedule_options_reach_the_estimate(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["estimate", "--model", "llama-3.1-8b", "--method", "full", "--gpu", "8xh100"]
    argv += ["--parallel", "fsdp,pp=4", "--pp-schedule", "interleaved-1f1b", "--format", "json"]
    assert main(argv) == 0
    assert "interleaved-1f1b" in capsys.readouterr().out
