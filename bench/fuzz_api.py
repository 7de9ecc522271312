"""Schemathesis CLI against a live server (its own /openapi.json), on SQLite and PostgreSQL.

    .venv/bin/python bench/fuzz_api.py                 # 100 examples per operation, both DBs
    .venv/bin/python bench/fuzz_api.py --quick         # 10 examples, SQLite only

Two passes per database, because the CLI sends one Authorization header to every operation:
all operations with the approver token, then `POST /v1/memtests` with the upload token.
Checks: not_a_server_error, status_code / content_type / response_schema conformance; phases
examples, coverage, fuzzing and stateful (links between operations). Prints the case counts
and failures; exit 1 on any failure.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.harness import APPROVER_TOKEN, UPLOAD_TOKEN, Server, free_port, pg_schema  # noqa: E402

CHECKS = ",".join(
    [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_schema_conformance",
    ]
)
ST = str(Path(sys.executable).with_name("schemathesis"))


def fuzz(url: str, examples: int) -> tuple[int, int, str]:
    generated = failures = 0
    text = ""
    passes = [
        (APPROVER_TOKEN, []),
        (UPLOAD_TOKEN, ["--include-path", "/v1/memtests", "--include-method", "POST"]),
    ]
    for token, extra in passes:
        cmd = [
            ST,
            "run",
            f"{url}/openapi.json",
            "--checks",
            CHECKS,
            "-H",
            f"Authorization: Bearer {token}",
            "--max-examples",
            str(examples),
            "-w",
            "2",
            "--request-timeout",
            "30",
            *extra,
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        text += out.stdout + out.stderr
        m = re.search(r"(\d+) generated", out.stdout)
        generated += int(m.group(1)) if m else 0
        f = re.search(r"(\d+) unique failures", out.stdout)
        failures += int(f.group(1)) if f else 0
        e = re.search(r"Runtime Error: (\d+)", out.stdout)  # schemathesis' own crashes
        if e:
            print(f"  (schemathesis runtime errors, not server failures: {e.group(1)})")
    return generated, failures, text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=100)
    parser.add_argument("--db", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.examples, args.db = 10, "sqlite"
    total_failures = 0
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
            generated, failures, text = fuzz(server.url, args.examples)
        print(f"{db:10s} cases generated {generated}, failures {failures}")
        if failures:
            print(text[-6000:])
        total_failures += failures
    return 1 if total_failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
