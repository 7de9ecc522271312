"""Runs schemathesis' CLI (arguments as given) with one workaround for CPython 3.11.7.

CPython before 3.11.8 can raise `SystemError: AST constructor recursion depth mismatch` from
`ast.parse` when it is called deep in the stack (python/cpython#106905, the ast module's
recursion bookkeeping). Hypothesis calls `ast.parse` only to *describe* a lambda strategy for
its reports (hypothesis/internal/lambda_sources.py `_lambda_description`); when that raises,
the description falls back to hypothesis' own "<unknown>" form instead of aborting the run.
Nothing about the generated cases or the checks changes."""

from __future__ import annotations

import sys
from typing import Any


def _describe_lambdas_safely() -> None:
    from hypothesis.internal import lambda_sources

    describe = lambda_sources._lambda_description

    def safe(f: Any, *args: Any, **kwargs: Any) -> str:
        try:
            return str(describe(f, *args, **kwargs))
        except SystemError:
            return "lambda: <unknown>"

    lambda_sources._lambda_description = safe


if __name__ == "__main__":
    sys.setrecursionlimit(5000)
    _describe_lambdas_safely()
    from schemathesis.cli import schemathesis

    schemathesis()
