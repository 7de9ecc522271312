"""Kill test: concurrent memtest uploads and quote approvals while the server is SIGKILLed and
restarted, on SQLite and on PostgreSQL. Afterwards every upload answered 201/200 and every
approval answered 200 must be in the database exactly once, and the audit log consistent.

    .venv/bin/python bench/durability.py                  # 200 clients, 30 s, both databases
    .venv/bin/python bench/durability.py --quick          # 40 clients, 8 s (what CI runs)
    .venv/bin/python bench/durability.py --db sqlite --clients 200 --seconds 60 --json out.json

Everything runs on 127.0.0.1: the server is `uvicorn app.main:app` on a free port in its own
process group; PostgreSQL gets a uniquely named schema that is dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
for extra in (ROOT, ROOT / "tests" / "app"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
UPLOAD_TOKEN = "durability-upload-0123"
APPROVER_TOKEN = "durability-approve-4567"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def pg_schema() -> Iterator[str]:
    """A fresh PostgreSQL schema (search_path in the URL), dropped on exit."""
    import psycopg

    schema = f"tf_rel_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/test?options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def server_env(database_url: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        TRAINFIT_DATABASE_URL=database_url,
        TRAINFIT_UPLOAD_TOKENS=f"ci={UPLOAD_TOKEN}",
        TRAINFIT_APPROVER_TOKENS=f"kral={APPROVER_TOKEN}",
        TRAINFIT_SECRET_KEY="durability-secret",
        PYTHONPATH=str(ROOT),
    )
    env.update(extra)
    return env


class Server:
    """`uvicorn app.main:app` in its own process group on 127.0.0.1."""

    def __init__(self, database_url: str, port: int, workers: int = 1, log: Path | None = None):
        self.database_url = database_url
        self.port = port
        self.workers = workers
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"http://127.0.0.1:{port}"

    def start(self, timeout: float = 30.0) -> None:
        cmd = [sys.executable, "-m", "app.server", "--host", "127.0.0.1"]
        cmd += ["--port", str(self.port), "--log-level", "warning"]
        if self.workers > 1:
            cmd += ["--workers", str(self.workers)]
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=server_env(self.database_url),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode} (log: {self.log})")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.kill()
        raise RuntimeError("server did not become healthy")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        self.proc = None

    def stop(self) -> None:
        self.kill(signal.SIGTERM)


@dataclass
class Outcome:
    database: str
    clients: int
    seconds: float
    kills: int = 0
    uploads_sent: int = 0
    uploads_acknowledged: int = 0
    uploads_acknowledged_present_once: int = 0
    uploads_unanswered: int = 0
    uploads_unanswered_present: int = 0
    approvals_sent: int = 0
    approvals_acknowledged: int = 0
    approvals_acknowledged_present_once: int = 0
    approvals_conflict_409: int = 0
    approvals_unanswered: int = 0
    other_statuses: dict[str, int] = field(default_factory=dict)
    server_errors: int = 0
    audit_problems: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            not self.lost
            and not self.audit_problems
            and self.server_errors == 0
            and self.uploads_acknowledged == self.uploads_acknowledged_present_once
            and self.approvals_acknowledged == self.approvals_acknowledged_present_once
        )


def unique_memtest(client_id: int, n: int) -> bytes:
    from service_support import memtest_doc

    doc = memtest_doc()
    doc["tool"]["command"] = f"durability client {client_id} #{n} {uuid.uuid4().hex}"
    return json.dumps(doc, indent=1).encode()


def seed_quotes(database_url: str, count: int) -> list[str]:
    """Pending quotes to approve (written directly: the estimate itself is not under test)."""
    from app.db.engine import make_engine, make_session_factory
    from app.db.migrate import upgrade_head
    from app.db.repository import add_quote

    engine = make_engine(database_url)
    upgrade_head(engine)
    ids = []
    with make_session_factory(engine)() as session:
        for i in range(count):
            quote = add_quote(
                session,
                title=f"durability {i}",
                request={"model": {"preset": "qwen3.5-27b"}},
                estimate={"rows": []},
                created_by="durability",
            )
            ids.append(quote.id)
    engine.dispose()
    return ids


async def _load(
    server: Server, outcome: Outcome, quote_ids: list[str], deadline: float, kill_every: float
) -> tuple[dict[str, str], set[str], dict[str, str], set[str]]:
    acked_uploads: dict[str, str] = {}  # sha256 -> id
    unanswered_uploads: set[str] = set()  # sha256 of uploads whose answer was lost
    acked_approvals: dict[str, str] = {}  # quote id -> status
    unanswered_approvals: set[str] = set()
    queue = list(quote_ids)
    random.shuffle(queue)
    limits = httpx.Limits(max_connections=outcome.clients, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=server.url, timeout=10, limits=limits) as http:

        async def client(cid: int) -> None:
            import hashlib

            n = 0
            while time.monotonic() < deadline:
                n += 1
                if random.random() < 0.5 or not queue:
                    body = unique_memtest(cid, n)
                    sha = hashlib.sha256(body).hexdigest()
                    outcome.uploads_sent += 1
                    try:
                        r = await http.post(
                            "/v1/memtests",
                            content=body,
                            headers={
                                "Authorization": f"Bearer {UPLOAD_TOKEN}",
                                "Content-Type": "application/json",
                            },
                        )
                    except httpx.HTTPError:
                        unanswered_uploads.add(sha)
                        await asyncio.sleep(0.2)
                        continue
                    if r.status_code in (200, 201):
                        acked_uploads[sha] = r.json()["id"]
                    else:
                        _other(outcome, r)
                else:
                    # two clients may pick the same quote: exactly one may win
                    quote_id = random.choice(queue[:50])
                    decision = random.choice(("approve", "reject"))
                    outcome.approvals_sent += 1
                    try:
                        r = await http.post(
                            f"/v1/quotes/{quote_id}/{decision}",
                            json={"comment": f"client {cid}"},
                            headers={"Authorization": f"Bearer {APPROVER_TOKEN}"},
                        )
                    except httpx.HTTPError:
                        unanswered_approvals.add(quote_id)
                        await asyncio.sleep(0.2)
                        continue
                    if r.status_code == 200:
                        status = r.json()["status"]
                        if quote_id in acked_approvals:
                            outcome.lost.append(f"quote {quote_id} decided twice (200 twice)")
                        acked_approvals[quote_id] = status
                        with contextlib.suppress(ValueError):
                            queue.remove(quote_id)
                    elif r.status_code == 409:
                        outcome.approvals_conflict_409 += 1
                        with contextlib.suppress(ValueError):
                            queue.remove(quote_id)
                    else:
                        _other(outcome, r)

        async def killer() -> None:
            loop = asyncio.get_running_loop()
            while True:
                await asyncio.sleep(kill_every * random.uniform(0.8, 1.2))
                if time.monotonic() + 0.5 > deadline:
                    return
                server.kill(signal.SIGKILL)
                outcome.kills += 1
                await loop.run_in_executor(None, server.start)

        await asyncio.gather(killer(), *(client(i) for i in range(outcome.clients)))
    return acked_uploads, unanswered_uploads, acked_approvals, unanswered_approvals


def _other(outcome: Outcome, response: httpx.Response) -> None:
    key = str(response.status_code)
    outcome.other_statuses[key] = outcome.other_statuses.get(key, 0) + 1
    if response.status_code >= 500:
        outcome.server_errors += 1


def verify(
    database_url: str,
    outcome: Outcome,
    acked_uploads: dict[str, str],
    unanswered_uploads: set[str],
    acked_approvals: dict[str, str],
) -> None:
    """Compare what the clients were told with what the database holds."""
    import hashlib

    from sqlalchemy import func, select

    from app.db.engine import make_engine
    from app.db.models import AuditEntry, Memtest, Quote

    engine = make_engine(database_url)
    with engine.connect() as conn:
        counts = dict(
            conn.execute(
                select(Memtest.content_sha256, func.count()).group_by(Memtest.content_sha256)
            ).all()
        )
        raw = dict(conn.execute(select(Memtest.content_sha256, Memtest.raw_json)).all())
        ids = dict(conn.execute(select(Memtest.content_sha256, Memtest.id)).all())
        for sha, memtest_id in acked_uploads.items():
            stored_once = counts.get(sha) == 1 and ids[sha] == memtest_id
            if stored_once and hashlib.sha256(raw[sha].encode()).hexdigest() == sha:
                outcome.uploads_acknowledged_present_once += 1
                continue
            outcome.lost.append(
                f"memtest {memtest_id}: acknowledged, present {counts.get(sha, 0)}x"
            )
        outcome.uploads_unanswered = len(unanswered_uploads - acked_uploads.keys())
        outcome.uploads_unanswered_present = sum(
            1 for sha in unanswered_uploads - acked_uploads.keys() if sha in counts
        )
        quotes = {q.id: q for q in conn.execute(select(Quote)).all()}
        trail: dict[str, list[Any]] = {}
        for entry in conn.execute(select(AuditEntry).order_by(AuditEntry.id)).all():
            trail.setdefault(entry.quote_id, []).append(entry)
    engine.dispose()
    for quote_id, status in acked_approvals.items():
        quote = quotes.get(quote_id)
        decisions = [e for e in trail.get(quote_id, []) if e.to_status == status]
        decided = quote is not None and quote.status == status and len(decisions) == 1
        if decided and quote.approver == "kral" and quote.decided_at is not None:
            outcome.approvals_acknowledged_present_once += 1
            continue
        outcome.lost.append(
            f"quote {quote_id}: acknowledged {status}, stored {quote and quote.status}"
        )
    for quote_id, quote in quotes.items():
        entries = trail.get(quote_id, [])
        previous = None
        for entry in entries:
            if entry.from_status != previous:
                outcome.audit_problems.append(f"{quote_id}: {entry.from_status} after {previous}")
            previous = entry.to_status
        if previous != quote.status:
            outcome.audit_problems.append(
                f"{quote_id}: status {quote.status}, audit ends {previous}"
            )
        if quote.status in ("approved", "rejected") and (quote.approver is None):
            outcome.audit_problems.append(f"{quote_id}: {quote.status} without approver")


def run(
    database: str,
    *,
    clients: int = 200,
    seconds: float = 30.0,
    kill_every: float = 3.0,
    quotes: int = 600,
    log_dir: Path | None = None,
) -> Outcome:
    """One kill test on `database` ("sqlite" or "postgresql"); returns the tallies."""
    outcome = Outcome(database=database, clients=clients, seconds=seconds)
    with contextlib.ExitStack() as stack:
        if database == "sqlite":
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tf-durability-")))
            database_url = f"sqlite:///{tmp / 'trainfit.db'}"
        else:
            database_url = stack.enter_context(pg_schema())
        log = (log_dir or Path(tempfile.gettempdir())) / f"durability-{database}-{os.getpid()}.log"
        quote_ids = seed_quotes(database_url, quotes)
        server = Server(database_url, free_port(), log=log)
        server.start()
        stack.callback(server.stop)
        deadline = time.monotonic() + seconds
        acked_u, unanswered_u, acked_a, unanswered_a = asyncio.run(
            _load(server, outcome, quote_ids, deadline, kill_every)
        )
        outcome.approvals_unanswered = len(unanswered_a - acked_a.keys())
        outcome.uploads_acknowledged = len(acked_u)
        outcome.approvals_acknowledged = len(acked_a)
        server.kill(signal.SIGKILL)  # the last word is a kill, too
        server.start()
        verify(database_url, outcome, acked_u, unanswered_u, acked_a)
    return outcome


def _print(outcome: Outcome) -> None:
    o = outcome
    print(
        f"{o.database:10s} clients={o.clients} {o.seconds:.0f}s kills={o.kills}  "
        f"uploads: sent {o.uploads_sent}, acknowledged {o.uploads_acknowledged}, "
        f"present once {o.uploads_acknowledged_present_once}, unanswered {o.uploads_unanswered} "
        f"(of which stored {o.uploads_unanswered_present})  "
        f"approvals: sent {o.approvals_sent}, acknowledged {o.approvals_acknowledged}, "
        f"present once {o.approvals_acknowledged_present_once}, 409 {o.approvals_conflict_409}, "
        f"unanswered {o.approvals_unanswered}  other={o.other_statuses} "
        f"audit problems={len(o.audit_problems)} lost={len(o.lost)} -> "
        f"{'OK' if o.ok else 'FAIL'}"
    )
    for line in (o.lost + o.audit_problems)[:20]:
        print("   ", line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--kill-every", type=float, default=3.0)
    parser.add_argument("--quick", action="store_true", help="40 clients, 8 s, kill every 2 s")
    parser.add_argument("--json", type=Path, help="write the tallies here")
    args = parser.parse_args(argv)
    if args.quick:
        args.clients, args.seconds, args.kill_every = 40, 8.0, 2.0
    databases = ("sqlite", "postgresql") if args.db == "both" else (args.db,)
    results = []
    for database in databases:
        outcome = run(
            database, clients=args.clients, seconds=args.seconds, kill_every=args.kill_every
        )
        _print(outcome)
        results.append(outcome)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) | {"ok": r.ok} for r in results], indent=2))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
