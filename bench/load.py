"""Load test on loopback: N concurrent clients for S seconds on a mix of reads, estimates,
memtest uploads, quote creations and approvals, against `python -m app.server` (what
`trainfit serve` runs) on SQLite and on PostgreSQL.

    .venv/bin/python bench/load.py                       # 500 clients, 60 s, both databases
    .venv/bin/python bench/load.py --quick               # 50 clients, 5 s (what the test runs)
    .venv/bin/python bench/load.py --db sqlite --clients 200 --seconds 30 --json load.json

Each client loops: 35% reads (a quote, the memtest list, the GPU catalog), 20% estimate or
check, 15% memtest upload, 15% quote creation (requester token), 10% approve/reject of a pending
quote (approver token, content hash; two clients may race: one 200, one 409), 5% /healthz.
Printed per database: requests, 5xx other than the deliberate 503 (must be 0), 503s (with
Retry-After: the service shedding load), transport errors (timeouts, resets), other 4xx than
the expected 409, and p50/p99 latency per kind and overall. The load generator runs in this
process (asyncio + httpx) and takes CPU from the server: on a small machine read the figures
as relative. Client timeout 60 s, longer than any the server applies (10 s slot wait).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
for extra in (ROOT, ROOT / "tests" / "app"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from bench.harness import (  # noqa: E402
    APPROVER_TOKEN,
    REQUESTER_TOKEN,
    UPLOAD_TOKEN,
    Server,
    free_port,
    pg_schema,
)

CLIENT_TIMEOUT_S = 60.0
KINDS = ("read", "estimate", "upload", "quote", "decide", "healthz")
WEIGHTS = (35, 20, 15, 15, 10, 5)
PRESETS = ["qwen3.5-27b", "llama-3.1-8b", "llama-3.1-70b", "mistral-7b", "qwen3-30b-a3b"]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _estimate_body() -> tuple[str, dict[str, Any]]:
    model = {"preset": random.choice(PRESETS)}
    setup = {"method": "lora", "lora_rank": 16, "lora_targets": ["all-linear"]}
    if random.random() < 0.5:
        return "/v1/check", {"model": model, "setup": setup, "seq_lens": [16000], "gpu": "h200"}
    body = {"model": model, "setup": setup, "seq_lens": [4096, 32000], "gpus": ["h200", "2xh200"]}
    return "/v1/estimate", body


def _memtest() -> bytes:
    from service_support import memtest_doc

    doc = memtest_doc()
    doc["tool"]["command"] = f"load {uuid.uuid4().hex}"
    return json.dumps(doc).encode()


class Load:
    def __init__(self, url: str, fresh: bool = False) -> None:
        self.url = url
        self.fresh = fresh
        self.latency: dict[str, list[float]] = {k: [] for k in KINDS}
        self.statuses: dict[str, int] = {}
        self.server_errors = 0  # 5xx other than 503
        self.shed = 0  # 503
        self.retry_after_missing = 0
        self.transport_errors: dict[str, int] = {}
        self.unexpected_4xx = 0
        self.quotes: list[str] = []  # ids to read
        self.pending: dict[str, str] = {}  # id -> content_hash, to decide

    async def one(self, http: httpx.AsyncClient) -> None:
        kind = random.choices(KINDS, WEIGHTS)[0]
        if kind == "decide" and not self.pending:
            kind = "quote"
        t0 = time.perf_counter()
        try:
            response = await self._request(http, kind)
        except httpx.HTTPError as exc:
            name = type(exc).__name__
            self.transport_errors[name] = self.transport_errors.get(name, 0) + 1
            return
        self.latency[kind].append(time.perf_counter() - t0)
        self._tally(kind, response)

    async def _request(self, http: httpx.AsyncClient, kind: str) -> httpx.Response:
        if kind == "read":
            roll = random.random()
            if roll < 0.6 and self.quotes:
                return await http.get(f"/v1/quotes/{random.choice(self.quotes[-500:])}")
            return await http.get("/v1/memtests" if roll < 0.8 else "/v1/gpus")
        if kind == "estimate":
            path, body = _estimate_body()
            return await http.post(path, json=body)
        if kind == "upload":
            headers = {
                "Authorization": f"Bearer {UPLOAD_TOKEN}",
                "Content-Type": "application/json",
            }
            return await http.post("/v1/memtests", content=_memtest(), headers=headers)
        if kind == "quote":
            headers = {
                "Authorization": f"Bearer {REQUESTER_TOKEN}",
                "Idempotency-Key": uuid.uuid4().hex,
            }
            path, body = _estimate_body()
            request = body if path == "/v1/estimate" else {**body, "gpus": ["h200"]}
            request.pop("gpu", None)
            response = await http.post(
                "/v1/quotes", json={"request": request, "title": "load"}, headers=headers
            )
            if response.status_code == 201:
                doc = response.json()
                self.quotes.append(doc["id"])
                self.pending[doc["id"]] = doc["content_hash"]
            return response
        if kind == "decide":
            quote_id = random.choice(list(self.pending)[-50:])
            action = random.choice(("approve", "reject"))
            body = {"content_hash": self.pending[quote_id]}
            headers = {"Authorization": f"Bearer {APPROVER_TOKEN}"}
            response = await http.post(
                f"/v1/quotes/{quote_id}/{action}", json=body, headers=headers
            )
            if response.status_code in (200, 409):
                self.pending.pop(quote_id, None)
            return response
        return await http.get("/healthz")

    def _tally(self, kind: str, response: httpx.Response) -> None:
        code = response.status_code
        self.statuses[str(code)] = self.statuses.get(str(code), 0) + 1
        if code == 503:
            self.shed += 1
            if "retry-after" not in response.headers:
                self.retry_after_missing += 1
        elif code >= 500:
            self.server_errors += 1
        elif code >= 400 and not (code == 409 and kind == "decide"):
            self.unexpected_4xx += 1

    async def drive(self, seconds: float, clients: int) -> float:
        # kept-alive connections, as real clients use (`fresh=True`: a new one per request)
        keep = 0 if self.fresh else clients
        limits = httpx.Limits(max_connections=clients, max_keepalive_connections=keep)
        async with httpx.AsyncClient(
            base_url=self.url, timeout=CLIENT_TIMEOUT_S, limits=limits
        ) as http:
            path, body = _estimate_body()  # warm-up (imports, caches) outside the window
            (await http.post(path, json=body)).raise_for_status()
            start = time.monotonic()
            deadline = start + seconds

            async def client() -> None:
                while time.monotonic() < deadline:
                    await self.one(http)

            await asyncio.gather(*(client() for _ in range(clients)))
            return time.monotonic() - start

    def summary(self, database: str, clients: int, elapsed: float) -> dict[str, Any]:
        every = [v for values in self.latency.values() for v in values]
        return {
            "database": database,
            "clients": clients,
            "seconds": elapsed,
            "requests": len(every),
            "rps": len(every) / elapsed,
            "p50_ms": 1000 * percentile(every, 0.50),
            "p99_ms": 1000 * percentile(every, 0.99),
            "server_errors_not_503": self.server_errors,
            "shed_503": self.shed,
            "503_without_retry_after": self.retry_after_missing,
            "transport_errors": self.transport_errors,
            "unexpected_4xx": self.unexpected_4xx,
            "statuses": self.statuses,
            "kinds": {
                kind: {
                    "requests": len(values),
                    "p50_ms": 1000 * percentile(values, 0.50),
                    "p99_ms": 1000 * percentile(values, 0.99),
                }
                for kind, values in self.latency.items()
            },
        }


@contextlib.contextmanager
def _database(database: str) -> Iterator[str]:
    if database == "sqlite":
        with tempfile.TemporaryDirectory(prefix="tf-load-") as tmp:
            yield f"sqlite:///{tmp}/trainfit.db"
    else:
        with pg_schema() as url:
            yield url


def run(
    database: str, seconds: float, clients: int, workers: int = 1, fresh: bool = False
) -> dict[str, Any]:
    with _database(database) as url:
        server = Server(url, free_port(), workers=workers)
        server.start()
        try:
            load = Load(server.url, fresh)
            elapsed = asyncio.run(load.drive(seconds, clients))
        finally:
            server.stop()
    return load.summary(database, clients, elapsed) | {"workers": workers}


def ok(result: dict[str, Any]) -> bool:
    return (
        result["server_errors_not_503"] == 0
        and result["503_without_retry_after"] == 0
        and not result["transport_errors"]
        and result["unexpected_4xx"] == 0
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument("--clients", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="50 clients, 5 s")
    parser.add_argument("--fresh", action="store_true", help="a new connection per request")
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--largest", action="store_true", help="only: CPU time of the largest accepted requests"
    )
    args = parser.parse_args(argv)
    if args.largest:
        for row in largest_requests():
            print(
                f"{row['request']:48s} body {row['body_bytes'] / 2**20:6.2f} MiB  "
                f"-> {row['status']}  CPU {row['cpu_s']:6.2f} s  wall {row['wall_s']:6.2f} s  "
                f"response {row['response_bytes'] / 2**10:8.1f} KiB"
            )
        return 0
    if args.quick:
        args.clients, args.seconds = 50, 5.0
    results = []
    for database in ("sqlite", "postgresql") if args.db == "both" else (args.db,):
        r = run(database, args.seconds, args.clients, args.workers, args.fresh)
        results.append(r)
        print(
            f"{database:10s} clients={r['clients']} workers={r['workers']} {r['seconds']:.0f}s "
            f"requests {r['requests']} ({r['rps']:.0f}/s)  p50 {r['p50_ms']:.0f} ms  "
            f"p99 {r['p99_ms']:.0f} ms  5xx other than 503: {r['server_errors_not_503']}  "
            f"503: {r['shed_503']}  transport errors: {r['transport_errors']}  "
            f"other 4xx: {r['unexpected_4xx']}  -> {'OK' if ok(r) else 'FAIL'}"
        )
        for kind, s in r["kinds"].items():
            print(
                f"  {kind:9s} {s['requests']:7d}  p50 {s['p50_ms']:8.1f} ms  "
                f"p99 {s['p99_ms']:8.1f} ms"
            )
        print(f"  statuses {r['statuses']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0 if all(ok(r) for r in results) else 1


def largest_requests() -> list[dict[str, Any]]:
    """CPU seconds (this process: the app in process, no network) of the largest requests the
    caps accept: every list at its cap, bodies up to the 16 MiB limit."""
    import copy
    import resource

    from fastapi.testclient import TestClient
    from service_support import make_settings, memtest_doc, upload_headers

    from app.factory import create_app

    gpus = [f"{n}xh200" for n in range(1, 33)] + [f"{n}xa100-80gb" for n in range(1, 33)]
    seq_lens = [1024 * n for n in range(1, 257)]
    names = ["q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z", "out_proj"]
    names += ["in_proj_b", "in_proj_a", "gate_proj", "up_proj", "down_proj"]
    setup = {"method": "lora", "lora_rank": 16, "lora_targets": names}
    model = {"preset": "qwen3.5-27b"}
    # the estimator takes at most 1024 cells (lengths x GPU options) per request
    estimate = {"model": model, "setup": setup, "seq_lens": seq_lens, "gpus": gpus[:4]}
    lengths = {**estimate, "seq_lens": [4096], "dataset_lengths": [4000] * 2_000_000}
    recommend = {"model": model, "setup": setup, "seq_len": 32000, "gpus": gpus}
    memtest = memtest_doc()
    result = memtest["results"][0]
    memtest["results"] = [
        {**copy.deepcopy(result), "seq_len": 1000 + i, "steps": 1500, "step_seconds": [1.5] * 1500}
        for i in range(1000)
    ]
    memtest["sweep"] = [r["seq_len"] for r in memtest["results"]]
    cases = [
        ("POST /v1/estimate 256 seq_lens x 4 GPU options", "/v1/estimate", estimate, {}),
        ("POST /v1/estimate 2,000,000 dataset_lengths", "/v1/estimate", lengths, {}),
        ("POST /v1/recommend 64 GPU options", "/v1/recommend", recommend, {}),
        ("POST /v1/memtests 1000 results x 1500 steps", "/v1/memtests", memtest, upload_headers()),
    ]
    out = []
    with tempfile.TemporaryDirectory(prefix="tf-largest-") as tmp:
        settings = make_settings(f"sqlite:///{tmp}/db.sqlite")
        with TestClient(create_app(settings)) as client:
            for name, path, body, headers in cases:
                raw = json.dumps(body).encode()
                cpu0 = resource.getrusage(resource.RUSAGE_SELF)
                wall0 = time.perf_counter()
                r = client.post(
                    path, content=raw, headers={"Content-Type": "application/json", **headers}
                )
                wall = time.perf_counter() - wall0
                cpu1 = resource.getrusage(resource.RUSAGE_SELF)
                cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
                out.append(
                    {
                        "request": name,
                        "body_bytes": len(raw),
                        "status": r.status_code,
                        "cpu_s": cpu,
                        "wall_s": wall,
                        "response_bytes": len(r.content),
                    }
                )
    return out


if __name__ == "__main__":
    raise SystemExit(main())
