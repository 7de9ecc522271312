"""Re-run the README's examples whose output is shown, and check (or rewrite) that output.

    PYTHONPATH=. python scripts/readme_outputs.py            # check: exit 1 and a diff if stale
    PYTHONPATH=. python scripts/readme_outputs.py --write    # rewrite the shown outputs

A block is re-run when the line before it is a marker:
- `<!-- readme-output: python -->` before a ```python block: the code runs (stdout captured)
  and the ``` block right after it is its output;
- `<!-- readme-output: console -->` before a ```console block: each `$ trainfit ...` line (a
  trailing `\\` continues it) runs through `trainfit.cli.main` in-process, and the lines up to
  the next `$` are its stdout then stderr; `$ echo $?` shows the previous exit code. Add
  `stderr` (`<!-- readme-output: console stderr -->`) to show only stderr;
- `<!-- readme-output: markdown -->` before a ```console block: its stdout is shown as markdown
  (not in a code block) up to `<!-- /readme-output -->`; `python-markdown` the same for a
  ```python block.
Commands run from the repository root with an empty `TRAINFIT_CACHE_DIR`, shown as
`~/.cache/trainfit`, so that cache paths and "counted" read the same on every machine.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import os
import re
import shlex
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MARKER = re.compile(
    r"^<!-- readme-output: (python|console|markdown|python-markdown)( stderr)? -->$"
)
END_MARKER = "<!-- /readme-output -->"
SHOWN_CACHE = "~/.cache/trainfit"


@contextlib.contextmanager
def _environment(cache: str) -> Iterator[None]:
    old_cwd, old_cache = Path.cwd(), os.environ.get("TRAINFIT_CACHE_DIR")
    os.environ["TRAINFIT_CACHE_DIR"] = cache
    os.chdir(ROOT)
    try:
        yield
    finally:
        os.chdir(old_cwd)
        if old_cache is None:
            os.environ.pop("TRAINFIT_CACHE_DIR", None)
        else:
            os.environ["TRAINFIT_CACHE_DIR"] = old_cache


def run_python(code: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {"__name__": "__readme__"})
    return out.getvalue()


def _commands(lines: list[str]) -> list[tuple[list[str], str]]:
    """The `$ ...` commands of a console block: (the lines as written, the joined command)."""
    commands: list[tuple[list[str], str]] = []
    written: list[str] = []
    for line in lines:
        if written or line.startswith("$ "):
            written.append(line)
            if not line.rstrip().endswith("\\"):
                joined = " ".join(w.rstrip().rstrip("\\").strip() for w in written)
                commands.append((written, joined[2:].strip()))
                written = []
    return commands


def run_console(lines: list[str], stderr_only: bool, cache: str) -> str:
    from trainfit.cli import main

    shown: list[str] = []
    code = 0
    for written, command in _commands(lines):
        shown.extend(written)
        if command == "echo $?":
            shown.append(str(code))
            continue
        argv = shlex.split(command)
        if argv[0] != "trainfit":
            raise SystemExit(f"README console blocks run only trainfit: {command!r}")
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv[1:])
            except SystemExit as done:  # --help, --version
                code = int(done.code or 0)
        text = err.getvalue() if stderr_only else out.getvalue() + err.getvalue()
        shown.extend(text.replace(cache, SHOWN_CACHE).splitlines())
    return "\n".join(shown) + "\n"


def regenerate(text: str) -> str:
    """The README with every marked block's output re-computed."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    with tempfile.TemporaryDirectory() as tmp, _environment(tmp):
        while i < len(lines):
            match = MARKER.match(lines[i])
            out.append(lines[i])
            i += 1
            if match is None:
                continue
            kind, stderr_only = match[1], bool(match[2])
            start = i
            end = lines.index("```", start + 1)
            body = lines[start + 1 : end]
            if kind == "python":
                out.extend(lines[start : end + 1])
                i = end + 1
                assert lines[i] == "```", f"line {i + 1}: the output block follows the code"
                close = lines.index("```", i + 1)
                out.append("```")
                out.extend(run_python("\n".join(body)).rstrip("\n").split("\n"))
                out.append("```")
                i = close + 1
            elif kind in ("markdown", "python-markdown"):
                out.extend(lines[start : end + 1])
                close = lines.index(END_MARKER, end + 1)
                if kind == "markdown":  # the console output without its echoed commands
                    shown = "\n".join(run_console(body, stderr_only, tmp).split("\n")[len(body) :])
                else:
                    shown = run_python("\n".join(body))
                out.append("")
                out.extend(shown.strip("\n").split("\n"))
                out.append(END_MARKER)
                i = close + 1
            else:
                out.append(lines[start])
                out.extend(run_console(body, stderr_only, tmp).rstrip("\n").split("\n"))
                out.append("```")
                i = end + 1
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite README.md")
    args = parser.parse_args(argv)
    old = README.read_text()
    new = regenerate(old)
    if new == old:
        print("README outputs are current")
        return 0
    if args.write:
        README.write_text(new)
        print("README outputs rewritten")
        return 0
    sys.stdout.writelines(
        difflib.unified_diff(
            old.splitlines(True), new.splitlines(True), "README.md", "README.md (re-run)"
        )
    )
    print("README outputs are stale: run `PYTHONPATH=. python scripts/readme_outputs.py --write`")
    return 1


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
