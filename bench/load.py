"""Load test on loopback: `POST /v1/estimate` and `POST /v1/check` with mixed models, next to
`GET /healthz` in the same run, against `uvicorn app.main:app --workers N` (SQLite).

    .venv/bin/python bench/load.py                      # 1 and 2 workers, 20 s each, 32 clients
    .venv/bin/python bench/load.py --quick              # 1 worker, 4 s (what CI calls)
    .venv/bin/python bench/load.py --workers 1,2,4 --seconds 30 --clients 64 --json load.json

Every client picks a request at random (40% estimate, 40% check, 20% healthz), so the three
share the machine and the p99 ratio estimate/healthz is measured under the same load.
The load generator runs in this process (asyncio + httpx) and takes CPU from the server: on
2 cores read the figures as relative, not absolute.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.harness import Server, free_port  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
CONFIGS = Path(__file__).resolve().parent.parent / "tests" / "data" / "configs"


def request_bodies() -> dict[str, list[dict[str, Any]]]:
    presets = ["qwen3.5-27b", "llama-3.1-8b", "llama-3.1-70b", "mistral-7b", "qwen3-30b-a3b"]
    llama = json.loads((CONFIGS / "Llama-3.1-8B.json").read_text())
    estimate = []
    check = []
    for preset in presets:
        model: dict[str, Any] = {"preset": preset}
        setup = {"method": "lora", "lora_rank": 16, "lora_targets": ["all-linear"]}
        estimate.append(
            {
                "model": model,
                "setup": setup,
                "seq_lens": [4096, 16000, 32000],
                "gpus": ["a100-80gb", "h200", "2xh200"],
            }
        )
        check.append({"model": model, "setup": setup, "seq_lens": [16000], "gpu": "h200"})
    estimate.append(
        {
            "model": {"config": llama},
            "setup": {"method": "full"},
            "seq_lens": [8192],
            "gpus": ["h200"],
        }
    )
    check.append(
        {
            "model": {"config": llama},
            "setup": {"lora_targets": TARGETS, "method": "lora"},
            "seq_lens": [8192],
            "gpu": "a100-80gb",
        }
    )
    return {"estimate": estimate, "check": check}


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def _drive(url: str, seconds: float, clients: int) -> dict[str, dict[str, Any]]:
    bodies = request_bodies()
    latencies: dict[str, list[float]] = {"estimate": [], "check": [], "healthz": []}
    errors: dict[str, int] = {k: 0 for k in latencies}
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as http:
        for kind in ("estimate", "check"):  # warm-up (caches, imports) outside the window
            for body in bodies[kind]:
                r = await http.post(f"/v1/{kind}", json=body)
                r.raise_for_status()
        start = time.monotonic()
        deadline = start + seconds

        async def client() -> None:
            while time.monotonic() < deadline:
                roll = random.random()
                kind = "estimate" if roll < 0.4 else "check" if roll < 0.8 else "healthz"
                t0 = time.perf_counter()
                try:
                    if kind == "healthz":
                        r = await http.get("/healthz")
                    else:
                        r = await http.post(f"/v1/{kind}", json=random.choice(bodies[kind]))
                    ok = r.status_code == 200
                except httpx.HTTPError:
                    ok = False
                latencies[kind].append(time.perf_counter() - t0)
                if not ok:
                    errors[kind] += 1

        await asyncio.gather(*(client() for _ in range(clients)))
        elapsed = time.monotonic() - start
    return {
        kind: {
            "requests": len(values),
            "rps": len(values) / elapsed,
            "p50_ms": 1000 * percentile(values, 0.50),
            "p99_ms": 1000 * percentile(values, 0.99),
            "errors": errors[kind],
        }
        for kind, values in latencies.items()
    }


def run(workers: int, seconds: float, clients: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tf-load-") as tmp:
        server = Server(f"sqlite:///{tmp}/trainfit.db", free_port(), workers=workers)
        server.start(timeout=60)
        try:
            stats = asyncio.run(_drive(server.url, seconds, clients))
        finally:
            server.stop()
    total = sum(s["rps"] for s in stats.values())
    ratio = stats["estimate"]["p99_ms"] / stats["healthz"]["p99_ms"]
    return {
        "workers": workers,
        "clients": clients,
        "seconds": seconds,
        "total_rps": total,
        "estimate_p99_over_healthz_p99": ratio,
        **stats,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--quick", action="store_true", help="1 worker, 4 s, 16 clients")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.quick:
        args.workers, args.seconds, args.clients = "1", 4.0, 16
    results = []
    for workers in [int(w) for w in args.workers.split(",")]:
        r = run(workers, args.seconds, args.clients)
        results.append(r)
        print(
            f"workers={workers} clients={r['clients']} {r['seconds']:.0f}s "
            f"total {r['total_rps']:.0f} req/s"
            f"  estimate/healthz p99 ratio {r['estimate_p99_over_healthz_p99']:.2f}"
        )
        for kind in ("estimate", "check", "healthz"):
            s = r[kind]
            print(
                f"  {kind:9s} {s['rps']:7.1f} req/s  p50 {s['p50_ms']:7.1f} ms  "
                f"p99 {s['p99_ms']:7.1f} ms  errors {s['errors']}"
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return (
        0
        if all(r[k]["errors"] == 0 for r in results for k in ("estimate", "check", "healthz"))
        else 1
    )


if __name__ == "__main__":
    raise SystemExit(main())
