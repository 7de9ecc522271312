"""Schemathesis CLI with `--checks all` against a live server (its own /openapi.json), on
SQLite and PostgreSQL.

    .venv/bin/python bench/fuzz_api.py                 # 100 examples per operation, both DBs
    .venv/bin/python bench/fuzz_api.py --quick         # 10 examples, SQLite only

Tokens per operation and the documented exceptions are in tests/reliability/schemathesis.toml.
Phases: examples, coverage, fuzzing and stateful (links between operations). Prints the case
counts, failures and schemathesis' own errors; exit 1 on any.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.harness import Server, free_port, pg_schema  # noqa: E402

CONFIG = ROOT / "tests" / "reliability" / "schemathesis.toml"
# schemathesis' CLI with a workaround for a CPython 3.11.7 `ast` bug (see the launcher)
LAUNCH = ROOT / "bench" / "schemathesis_launch.py"


@dataclass
class FuzzResult:
    returncode: int
    generated: int
    failures: int
    errors: int
    text: str


def fuzz(url: str, examples: int, timeout: float = 900) -> FuzzResult:
    cmd = [
        sys.executable,
        str(LAUNCH),
        "run",
        f"{url}/openapi.json",
        "--checks",
        "all",
        "--max-examples",
        str(examples),
        "--generation-deterministic",
        "--no-color",
        "-w",
        "2",
        "--request-timeout",
        "60",
    ]
    out = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, cwd=CONFIG.parent
    )  # the config file is found in the working directory
    text = out.stdout + out.stderr
    generated = re.search(r"(\d+) generated", text)
    failures = re.search(r"(\d+) unique failures?", text)
    errors = re.search(r"Runtime Error: (\d+)", text)
    return FuzzResult(
        out.returncode,
        int(generated.group(1)) if generated else 0,
        int(failures.group(1)) if failures else 0,
        int(errors.group(1)) if errors else 0,
        text,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=100)
    parser.add_argument("--db", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.examples, args.db = 10, "sqlite"
    bad = 0
    for db in ("sqlite", "postgresql") if args.db == "both" else (args.db,):
        with contextlib.ExitStack() as stack:
            if db == "sqlite":
                tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="tf-fuzz-"))
                url = f"sqlite:///{tmp}/trainfit.db"
            else:
                url = stack.enter_context(pg_schema())
            server = Server(url, free_port())
            server.start()
            stack.callback(server.stop)
            r = fuzz(server.url, args.examples)
        print(
            f"{db:10s} --checks all, {args.examples} examples: cases generated {r.generated}, "
            f"failures {r.failures}, schemathesis errors {r.errors}, exit {r.returncode}"
        )
        if r.returncode or r.failures or r.errors:
            print(r.text[-6000:])
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
