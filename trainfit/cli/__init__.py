"""`trainfit` command line: the front door of the product.

One module per command group, each with a `register(subparsers)`:
- `estimate` — `trainfit estimate`, `trainfit check`
- `solvers` — `trainfit max-seq`, `max-batch`, `min-gpus`, `recommend`
- `compare` — `trainfit compare memtest.json`
- `catalog` — `trainfit presets`
- `service` — `trainfit serve`, `trainfit db backup|restore`

Exit codes: 0 success (check: fits), 1 check: tight or no, 2 bad input (message names the
field), 3 `--server` unreachable, timed out or failing (5xx).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any, TypeGuard

from trainfit.cli import catalog, compare, estimate, service, solvers
from trainfit.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_UNREACHABLE,
    InputError,
    RawDescriptionFormatter,
    ServerUnavailable,
    validation_message,
)

if TYPE_CHECKING:
    from pydantic import ValidationError

COMMAND_GROUPS = (estimate, solvers, compare, catalog, service)
DESCRIPTION = """Will a fine-tuning run fit the GPU, how long does it take, what does it cost.

Exit codes: 0 success (check: fits), 1 check: tight or no, 2 bad input (the message names the
field), 3 --server unreachable, timed out or failing (5xx)."""


class _VersionAction(argparse.Action):
    """`--version`: the installed distribution's version, looked up only when asked."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        import trainfit

        sys.stdout.write(f"trainfit {trainfit.__version__}\n")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainfit",
        description=DESCRIPTION,
        formatter_class=RawDescriptionFormatter,
        epilog="example:\n  trainfit estimate --model llama-3.1-8b --method lora --gpu h100-80gb\n"
        "  (trainfit COMMAND --help: that command's options, defaults and an example)",
    )
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True)
    for group in COMMAND_GROUPS:
        group.register(sub)
    return parser


def _is_validation_error(err: Exception) -> TypeGuard[ValidationError]:
    """A pydantic `ValidationError` (pydantic is loaded only by a command that needed it)."""
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and isinstance(err, pydantic.ValidationError)


def main(argv: list[str] | None = None) -> int:
    # one BLAS thread: the estimator's numpy does no BLAS work, and OpenBLAS's thread pool
    # otherwise costs CPU time at start-up (set before numpy is first imported)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    parser = build_parser()
    args = parser.parse_args(argv)
    from estimator.errors import EstimatorInputError

    try:
        # estimator.train_config: the files' values, the options given on the command line win
        if getattr(args, "train_config", None) or getattr(args, "adapter_config", None):
            from trainfit.cli.train_config import apply_train_config

            apply_train_config(args, sys.argv[1:] if argv is None else argv, parser)
        return int(args.func(args))
    except ServerUnavailable as err:
        sys.stderr.write(f"trainfit: server unavailable: {err}\n")
        return EXIT_UNREACHABLE
    except InputError as err:
        message = str(err)
    except EstimatorInputError as err:
        message = f"{err.field}: {err.message}"
    except Exception as err:
        if _is_validation_error(err):
            message = validation_message(err)
        elif type(err).__module__.startswith(("app", "httpx")):  # the service client's errors
            message = str(err)
        else:
            raise
    sys.stderr.write(f"trainfit: error: {message}\n")
    return EXIT_BAD_INPUT


__all__ = ["build_parser", "main"]
