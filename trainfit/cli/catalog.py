"""`trainfit presets`: the model presets shipped with the estimator."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from trainfit.cli.common import EXIT_OK, add_command


def cmd_presets(args: argparse.Namespace) -> int:
    from estimator.document import list_presets

    for p in list_presets():
        read = f" (read from {p['transcribed_from']})" if p["transcribed_from"] else ""
        sys.stdout.write(
            f"{p['id']:<16} {p['model_type']:<12} {p['params_total']:>16,}  {p['source']}{read}\n"
        )
    return EXIT_OK


def register(sub: Any) -> None:
    pre = add_command(sub, "presets", "list the model presets", "trainfit presets")
    pre.set_defaults(func=cmd_presets)
