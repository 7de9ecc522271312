"""Every README command block whose output is shown is re-run by scripts/readme_outputs.py
(tests/front/test_readme_outputs.py compares them): a `$ trainfit ...` block without a
`readme-output` marker would be a figure nobody re-checks. The probe's blocks are the
exception: they print wall-clock tokens/s and today's date (their peaks are covered by
tests/probe)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
MARKER = re.compile(r"^<!-- readme-output: (python|console|markdown)( stderr)? -->$")


def _fenced_blocks(lines: list[str]) -> list[tuple[int, list[str]]]:
    blocks, start = [], None
    for n, line in enumerate(lines):
        if line.startswith("```"):
            if start is None:
                start = n
            else:
                blocks.append((start, lines[start + 1 : n]))
                start = None
    return blocks


def test_every_trainfit_command_block_is_re_run() -> None:
    lines = README.read_text().splitlines()
    unmarked = [
        f"line {start + 1}: {body[0][:70]}"
        for start, body in _fenced_blocks(lines)
        if any(b.startswith("$ trainfit ") for b in body)
        and not (start > 0 and MARKER.match(lines[start - 1]))
    ]
    assert not unmarked, unmarked


def test_markdown_outputs_are_closed() -> None:
    text = README.read_text()
    opened = text.count("<!-- readme-output: markdown -->")
    opened += text.count("<!-- readme-output: python-markdown -->")
    assert opened == text.count("<!-- /readme-output -->")
    assert text.count("<!-- readme-output: markdown -->") >= 2  # the seed table, recommend
    assert "<!-- readme-output: python-markdown -->" in text  # seed-000 vs default
