"""`--train-config FILE [--train-config DS.json]` on the command line: the file's values become
the defaults of the command's options; options given on the command line win. (The library
side — reading and mapping the files — is `estimator.train_config`.)

Setup fields the current `TrainingSetup` does not accept (or values it does not allow) and
fields the command has no option for are reported as ignored, with the reason, on stderr and
in the JSON (`setup.ignored`, plus the whole mapping under `train_config`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from estimator.train_config.result import Ignored, TrainConfigMapping

# setup field -> argparse dest where the two differ
CLI_DEST: dict[str, str] = {}
# estimator/parallel's layout fields: they win over `sharding` when `parallel` is set
LAYOUT_FIELDS = ("parallel", "reshard_after_forward", "offload", "fsdp_wrap")


def given_options(parser: argparse.ArgumentParser, argv: Sequence[str]) -> set[str]:
    """The dests of the options written on the command line (exact or unique-prefix spelling,
    `--opt value` and `--opt=value`)."""
    by_option = {o: a.dest for a in parser._actions for o in a.option_strings}
    given: set[str] = set()
    for token in argv:
        if not token.startswith("--"):
            continue
        opt = token.split("=", 1)[0]
        if opt in by_option:
            given.add(by_option[opt])
            continue
        matches = {d for o, d in by_option.items() if o.startswith(opt)}
        if len(matches) == 1:
            given |= matches
    return given


def command_parser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            sub: argparse.ArgumentParser = action.choices[command]
            return sub
    return parser


def _cli_value(name: str, value: Any) -> Any:
    if name == "lora_targets":
        return ",".join(value)
    if name == "reshard_after_forward":  # the option takes true|false
        return "true" if value else "false"
    return value


def overlay_namespace(
    args: argparse.Namespace, mapping: TrainConfigMapping, given: set[str]
) -> list[Ignored]:
    """Set the mapping's values on `args` where the option was not given; returns what could not
    be applied (no such setup field, value not allowed, no option in this command)."""
    from estimator.setup import TrainingSetup
    from estimator.train_config.result import Ignored, split_supported

    accepted, rejected = split_supported(mapping.setup, TrainingSetup.model_fields)
    legacy = "sharding" in given and "parallel" not in given  # --sharding replaces the layout
    for name, value in accepted.items():
        dest = CLI_DEST.get(name, name)
        if legacy and name in LAYOUT_FIELDS:
            rejected.append(Ignored(name, "--sharding on the command line replaces the layout"))
        elif not hasattr(args, dest):
            rejected.append(Ignored(name, "this command has no option for it"))
        elif dest not in given:
            setattr(args, dest, _cli_value(name, value))
    if mapping.model and "model" not in given and "params" not in given:
        args.model = next(iter(mapping.model.values()))
    if mapping.seq_lens and hasattr(args, "seq") and "seq" not in given:
        args.seq = ",".join(str(s) for s in mapping.seq_lens)
    for name, value in mapping.run.items():
        if hasattr(args, name) and name not in given:
            setattr(args, name, value)
    return rejected


def apply_train_config(
    args: argparse.Namespace,
    argv: Sequence[str],
    parser: argparse.ArgumentParser,
    stderr: TextIO | None = None,
) -> TrainConfigMapping:
    """Read `args.train_config` (a list of files) and `args.adapter_config` (a PEFT adapter
    config, filling what they do not state), overlay them on `args`, print what was ignored and
    the warnings, and keep the report on `args.train_config_report` for the JSON output."""
    from estimator.train_config.load import read_train_configs  # only with a config file

    mapping = read_train_configs(
        getattr(args, "train_config", None) or [], getattr(args, "adapter_config", None)
    )
    given = given_options(command_parser(parser, getattr(args, "command", "")), argv)
    mapping.ignored.extend(overlay_namespace(args, mapping, given))
    out = stderr or sys.stderr
    for item in mapping.ignored:
        out.write(f"trainfit: train-config: ignored {item.key}: {item.reason}\n")
    for warning in mapping.warnings:
        out.write(f"trainfit: train-config: warning: {warning}\n")
    args.train_config_report = mapping.as_dict()
    return mapping


def attach_report(doc: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Add `setup.ignored` and `train_config` to an output document when a config was read."""
    report = getattr(args, "train_config_report", None)
    if report is not None:
        doc.setdefault("setup", {})["ignored"] = report["ignored"]
        doc["train_config"] = report
    return doc
