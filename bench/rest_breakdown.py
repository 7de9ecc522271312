"""Where a fresh 100-cell `POST /v1/estimate` spends its time beyond `GET /healthz` (issue 17),
measured inside the request as `bench/speed.py`'s `rest_estimate_100_fresh` sends it (fastapi
TestClient, a new body every call). Prints, asserts nothing. Run from the repository root:

    OPENBLAS_NUM_THREADS=1 python bench/rest_breakdown.py [--calls 300]

Per request, the CPU seconds of the thread that serves it (`time.thread_time`) in the route's
handler and in its three parts: the strict check of the body (`check_json_body`: parse and
validate), the estimate document (`app.services.estimates.estimate`) and its encoding
(`app.document_json.encode`); what the handler spends outside them (the body read, the answer
kept, the document freed) is `handler - parts`. Beside them, the whole request in this
process's CPU seconds (both threads: the test client's and the server's) for `/healthz` and for
the fresh estimate: `fresh - healthz` is the estimate's own cost, which issue 17 wants at most
`healthz` (the ratio <= 2). Medians, and the 10 % quantile (the least disturbed calls).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.speed import CELLS_GPUS, PRESET  # noqa: E402

BODY: dict[str, Any] = {
    "model": {"preset": PRESET},
    "setup": {"method": "lora"},
    "seq_lens": [2048 * i for i in range(1, 11)],
    "gpus": CELLS_GPUS[:10],  # bench/speed.py's ten options of rest_estimate_100_fresh
}


def _timed(spent: dict[str, list[float]], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent.setdefault(name, []).append(time.thread_time() - start)

    return timed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300, help="requests of each kind")
    args = parser.parse_args(argv)

    from fastapi.testclient import TestClient

    from app import document_json
    from app.api import strict
    from app.api.routes import estimates as route
    from app.factory import create_app
    from app.services import estimates as service
    from app.settings import Settings

    spent: dict[str, list[float]] = {}
    # the names the route calls, wrapped where it looks them up
    vars(route)["check_json_body"] = _timed(spent, "check", strict.check_json_body)
    vars(service)["estimate"] = _timed(spent, "estimate", service.estimate)
    vars(document_json)["encode"] = _timed(spent, "encode", document_json.encode)
    route_handler = route.CachedDocumentRoute.get_route_handler

    def timed_handler(self: Any) -> Callable[[Any], Coroutine[Any, Any, Any]]:
        inner = route_handler(self)

        async def handler(request: Any) -> Any:
            start = time.thread_time()
            try:
                return await inner(request)
            finally:
                spent.setdefault("handler", []).append(time.thread_time() - start)

        return handler

    route.CachedDocumentRoute.get_route_handler = timed_handler  # type: ignore[method-assign]

    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            database_url=f"sqlite:///{Path(tmp) / 'bench.db'}", secret_key="bench-secret-key"
        )
        with TestClient(create_app(settings)) as client:
            shift = iter(range(1, 10**9))

            def fresh() -> None:
                k = next(shift)
                body = {**BODY, "seq_lens": [2048 * i + k for i in range(1, 11)]}
                assert client.post("/v1/estimate", json=body).status_code == 200

            def health() -> None:
                client.get("/healthz")

            for _ in range(50):  # warm: imports, caches, the first answers
                fresh()
                health()
            spent.clear()
            for _ in range(args.calls):
                for name, call in (("request: healthz", health), ("request: fresh", fresh)):
                    start = time.process_time()
                    call()
                    spent.setdefault(name, []).append(time.process_time() - start)

    def figures(name: str) -> tuple[float, float]:
        values = sorted(spent[name])
        return statistics.median(values) * 1e3, values[len(values) // 10] * 1e3

    parts = ("check", "estimate", "encode")
    for name in (*parts, "handler", "request: healthz", "request: fresh"):
        median, p10 = figures(name)
        print(f"{name}: {median:.3f} ms CPU median, {p10:.3f} p10")
    outside = [
        h - sum(p) for h, *p in zip(spent["handler"], *(spent[n] for n in parts), strict=True)
    ]
    print(f"handler - parts: {statistics.median(outside) * 1e3:.3f} ms CPU median")
    (fresh_ms, _), (health_ms, _) = figures("request: fresh"), figures("request: healthz")
    print(f"fresh - healthz: {fresh_ms - health_ms:.3f} ms CPU median (goal: <= healthz)")
    print(f"ratio: {fresh_ms / health_ms:.3f} x /healthz (medians; goal <= 2)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
