"""`encode(doc)`: the exact bytes of `json.dumps(doc, ensure_ascii=False, allow_nan=False,
separators=(",", ":")).encode()`, written by pydantic-core's serialiser (Rust, already a
dependency through pydantic). The 165 KB document of 100 cells (issue 17), CPU in one run:
json.dumps 1.43 ms, this 0.64 ms (0.35 of it the serialiser, ~0.17 the marker scans below;
those less now, see below).

`doc` holds plain JSON values as the estimator builds them: dicts with str (or int) keys,
lists, tuples, str, int, float, bool, None. For those the two encoders write the same bytes
(strings, escapes, ints of any size, key order, floats' shortest round-trip digits) except
(fuzzed over 2 M doubles, tests/app/test_document_json.py):
- a float with 1e-9 <= |x| < 1e-4: `0.00001` and `1e-7` where Python writes `1e-05` and
  `1e-07` (from 1e-4 up and below 1e-9 they agree);
- NaN and ±Infinity: `NaN`/`Infinity` (inf_nan_mode="constants") where json.dumps raises.
Each such number token is found from its markers (`0.0000`; `e-` and one digit; `NaN`;
`Infinity`) and rewritten as `repr(float(token))` (the digits are the same, so the float is
too), or refused with json's ValueError. A marker inside a string (an odd number of quotes
before it) is text, written alike by both. Quotes are counted only in a document without a
backslash escape; one with both a marker and an escape is written by json.dumps instead (the
rare slow case, never a different byte).

The `e-` and `0.0000` markers are found with numpy from the positions of `-` and `.` (~3,300
in the 165 KB document, checked all at once), and quotes counted with numpy: a regex or a
`bytes.find` of a several-byte needle, and `bytes.count`, step through every byte one at a
time (in one run: the marker scan 0.23 -> 0.14 ms, the encoding 0.63 -> 0.54 ms).
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
from pydantic_core import SchemaSerializer, core_schema

# `pydantic_core.to_json(doc, inf_nan_mode="constants")`, the same serialiser (any value, its
# type inferred) built once: to_json builds one per call (~30 us of the 100-cell document)
_SERIALIZER = SchemaSerializer(
    core_schema.any_schema(), core_schema.CoreConfig(ser_json_inf_nan="constants")
)

# (marker, what it is searched by): a one-byte search is a memchr, fast for the rare N and I
_MARKERS = ((b"NaN", b"N"), (b"Infinity", b"I"))
_DASH, _DOT, _ZERO, _NINE, _E, _QUOTE = b'-.09e"'
_DASH_U8 = np.uint8(_DASH)  # `.` is `-` + 1
_PAD = b"    "  # no marker byte, no digit: a marker's look-ahead past the end sees text
_TOKEN_CHARS = b"-+.0123456789eNaIfinty"
_NUMBER = re.compile(rb"-?(?:\d+(?:\.\d+)?(?:e[-+]?\d+)?|NaN|Infinity)")


def reference(doc: Any) -> bytes:
    """What the document's answer was before (and is, where `encode` defers to it)."""
    return json.dumps(
        doc, ensure_ascii=False, allow_nan=False, separators=(",", ":"), check_circular=False
    ).encode("utf-8")


def _is_digit(codes: Any) -> Any:
    return (codes >= _ZERO) & (codes <= _NINE)


def _marker_positions(out: bytes) -> list[int]:
    """Where a marker starts, ascending: `e-` and one digit not followed by a digit (`1e-7`:
    Python writes `1e-07`), `0.0000` (overlapping ones too), `NaN`, `Infinity`."""
    codes = np.frombuffer(out, dtype=np.uint8)
    flags = np.subtract(codes, _DASH_U8)  # `-` -> 0, `.` -> 1 (`.` is `-` + 1; wraps below)
    dash_or_dot = flags.view(np.bool_)
    np.less_equal(flags, 1, out=dash_or_dot)  # in place: one temporary the document's size
    at = np.flatnonzero(dash_or_dot)
    if at.size and at[0] == 0:
        at = at[1:]  # both markers have a byte before the `-` or `.`
    if at.size and at[-1] + 4 >= codes.size:  # a look-ahead past the end reads the pad
        codes = np.frombuffer(out + _PAD, dtype=np.uint8)
    before, one, two = codes[at - 1], codes[at + 1], codes[at + 2]
    # `e` + (`-`) + digit + not a digit, or `0` + (`.`) + `00`: a few numbers in a document
    exponent = (before == _E) & _is_digit(one) & ~_is_digit(two)
    zeros = (before == _ZERO) & (one == _ZERO) & (two == _ZERO)
    hits: list[int] = []
    for i in at[exponent | zeros].tolist():  # the few left: their middle byte, last two zeros
        if out[i - 1] == _E:
            marker = out[i] == _DASH
        else:
            marker = out[i] == _DOT and out[i + 3 : i + 5] == b"00"
        if marker:
            hits.append(i - 1)
    for marker, first in _MARKERS:
        i = out.find(first)
        while i >= 0:
            if out.startswith(marker, i):
                hits.append(i)
            i = out.find(first, i + 1)
    return sorted(hits)


def encode(doc: Any) -> bytes:
    out = _SERIALIZER.to_json(doc)
    hits = _marker_positions(out)
    if not hits:
        return out
    if b"\\" in out:
        return reference(doc)
    codes = np.frombuffer(out, dtype=np.uint8)
    parts: list[bytes] = []
    done = quotes = counted = 0  # bytes copied to parts; `"` counted in out[:counted]
    for at in hits:
        if at < done:
            continue  # a second marker in a token already rewritten
        quotes += int(np.count_nonzero(codes[counted:at] == _QUOTE))
        counted = at
        if quotes % 2:
            continue  # text inside a string: written as json writes it
        start = at
        while start > 0 and out[start - 1] in _TOKEN_CHARS:
            start -= 1
        token = _NUMBER.match(out, start)
        if token is None or token.end() <= at:
            return reference(doc)  # not a number token after all: no guessing
        if token.group().lstrip(b"-") in (b"NaN", b"Infinity"):
            raise ValueError("Out of range float values are not JSON compliant")
        parts += (out[done:start], repr(float(token.group())).encode("ascii"))
        done = token.end()
    parts.append(out[done:])
    return b"".join(parts)
