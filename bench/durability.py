"""Kill test: clients write through the API only (memtest uploads with the upload token, quotes
created with a requester token and an Idempotency-Key, approvals/rejections with the approver
token and the quote's content hash) while, in turn, the app is SIGKILLed and restarted and the
database is killed and restarted:

- PostgreSQL: a private cluster that this benchmark starts under a temp dir (initdb, pg_ctl),
  killed with `pg_ctl stop -m immediate` (the app stays up and must reconnect);
- SQLite: a checkpointer process runs `PRAGMA wal_checkpoint` back to back and is SIGKILLed
  together with the app right after it starts a checkpoint.

After every kill and restart the round is verified: everything acknowledged (2xx) before the
kill must be in the database, exactly once; the round's line reports acknowledged vs present.
A slow restart is waited for (up to 120 s), never a reason to skip a round. Client timeouts
(60 s) are longer than any the server applies (5 s database slot wait, 5 s SQLite busy
timeout), so a slow answer is never mistaken for a lost one. Unanswered writes are retried
with the same body and Idempotency-Key; each key must give at most one quote.

    .venv/bin/python bench/durability.py                  # 100 clients, 30 s, both databases
    .venv/bin/python bench/durability.py --quick          # 16 clients, 10 s (what the test runs)
    .venv/bin/python bench/durability.py --db sqlite --clients 200 --seconds 60 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import random
import signal
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

from bench.harness import (  # noqa: E402
    APPROVER_TOKEN,
    PG_ADMIN_URL,
    REQUESTER_TOKEN,
    UPLOAD_TOKEN,
    PrivatePostgres,
    Server,
    free_port,
    pg_schema,
    private_postgres,
    server_env,
    wait_ready,
)

__all__ = [
    "APPROVER_TOKEN",
    "PG_ADMIN_URL",
    "REQUESTER_TOKEN",
    "UPLOAD_TOKEN",
    "Outcome",
    "Round",
    "Server",
    "free_port",
    "pg_schema",
    "run",
    "server_env",
]

CLIENT_TIMEOUT_S = 60.0
SERVER_ENV = {"TRAINFIT_DB_SLOT_WAIT_S": "5", "TRAINFIT_SQLITE_BUSY_TIMEOUT_MS": "5000"}
REQUEST = {"model": {"preset": "qwen3.5-27b"}, "seq_lens": [4096], "gpus": ["h200"]}
MIN_KILLS_CAP_S = 60.0  # how long past the deadline the killer may go on to reach min_kills
RETRY_FOR_S = 60.0  # an unanswered write is retried (same body, same key) this long after the end


@dataclass
class Round:
    number: int
    killed: str  # "app", "database" (PostgreSQL) or "app+checkpoint" (SQLite)
    restart_s: float
    uploads_acknowledged: int
    uploads_present: int
    quotes_acknowledged: int
    quotes_present: int
    decisions_acknowledged: int
    decisions_present: int
    missing: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            not self.missing
            and self.uploads_present == self.uploads_acknowledged
            and self.quotes_present == self.quotes_acknowledged
            and self.decisions_present == self.decisions_acknowledged
        )


@dataclass
class Outcome:
    database: str
    clients: int
    seconds: float
    rounds: list[Round] = field(default_factory=list)
    uploads_sent: int = 0
    quotes_sent: int = 0
    decisions_sent: int = 0
    retries: int = 0
    gave_up: int = 0  # writes never answered within RETRY_FOR_S (not acknowledged)
    statuses: dict[str, int] = field(default_factory=dict)
    server_errors: int = 0  # 5xx other than the deliberate 503
    duplicate_quotes: int = 0  # an Idempotency-Key that made two quotes
    audit_problems: list[str] = field(default_factory=list)
    final: Round | None = None

    @property
    def kills(self) -> int:
        return len(self.rounds)

    @property
    def ok(self) -> bool:
        return (
            all(r.ok for r in self.rounds)
            and self.final is not None
            and self.final.ok
            and not self.audit_problems
            and self.server_errors == 0
            and self.duplicate_quotes == 0
        )


@dataclass
class Acks:
    """What the clients were told (2xx), by what identifies it in the database."""

    uploads: dict[str, str] = field(default_factory=dict)  # sha256 -> memtest id
    quotes: dict[str, tuple[str, str]] = field(default_factory=dict)  # key -> (id, hash)
    decisions: dict[str, str] = field(default_factory=dict)  # quote id -> status
    pending: list[str] = field(default_factory=list)  # acknowledged quote ids to decide

    def snapshot(self) -> Acks:
        return Acks(dict(self.uploads), dict(self.quotes), dict(self.decisions))


def unique_memtest(client_id: int, n: int) -> bytes:
    from service_support import memtest_doc

    doc = memtest_doc()
    doc["tool"]["command"] = f"durability client {client_id} #{n} {uuid.uuid4().hex}"
    return json.dumps(doc, indent=1).encode()


def present(database_url: str, acks: Acks) -> tuple[Round, dict[str, int]]:
    """How many of the acknowledged writes the database holds exactly once (number, killed
    and restart_s are filled in by the caller), and the quote count per idempotency title."""
    from sqlalchemy import func, select

    from app.db.engine import make_engine
    from app.db.models import AuditEntry, Memtest, Quote

    engine = make_engine(database_url)
    missing: list[str] = []
    try:
        with engine.connect() as conn:
            uploads = {
                sha: (count, memtest_id)
                for sha, count, memtest_id in conn.execute(
                    select(Memtest.content_sha256, func.count(), func.min(Memtest.id)).group_by(
                        Memtest.content_sha256
                    )
                ).all()
            }
            quotes = {q.id: q for q in conn.execute(select(Quote)).all()}
            titles: dict[str, int] = {}
            for q in quotes.values():
                titles[q.title] = titles.get(q.title, 0) + 1
            decided: dict[str, int] = {}
            for quote_id, _status in conn.execute(
                select(AuditEntry.quote_id, AuditEntry.to_status).where(
                    AuditEntry.to_status.in_(("approved", "rejected")), AuditEntry.outcome == "ok"
                )
            ).all():
                decided[quote_id] = decided.get(quote_id, 0) + 1
    finally:
        engine.dispose()
    uploads_present = 0
    for sha, memtest_id in acks.uploads.items():
        if uploads.get(sha) == (1, memtest_id):
            uploads_present += 1
        else:
            missing.append(f"memtest {memtest_id}: acknowledged, stored {uploads.get(sha)}")
    quotes_present = 0
    for key, (quote_id, _hash) in acks.quotes.items():
        if quote_id in quotes and titles.get(_title(key)) == 1:
            quotes_present += 1
        else:
            missing.append(f"quote {quote_id}: acknowledged, stored {titles.get(_title(key), 0)}x")
    decisions_present = 0
    for quote_id, status in acks.decisions.items():
        row = quotes.get(quote_id)
        if row is not None and row.status == status and decided.get(quote_id) == 1:
            decisions_present += 1
        else:
            missing.append(f"quote {quote_id}: acknowledged {status}, stored {row and row.status}")
    tally = Round(
        0,
        "",
        0.0,
        len(acks.uploads),
        uploads_present,
        len(acks.quotes),
        quotes_present,
        len(acks.decisions),
        decisions_present,
        missing[:20],
    )
    return tally, titles


def audit_problems(database_url: str) -> list[str]:
    """Every quote's audit trail is a chain ending in its status; decided quotes name their
    approver."""
    from sqlalchemy import select

    from app.db.engine import make_engine
    from app.db.models import AuditEntry, Quote

    engine = make_engine(database_url)
    problems: list[str] = []
    try:
        with engine.connect() as conn:
            quotes = conn.execute(select(Quote)).all()
            trail: dict[str, list[Any]] = {}
            for entry in conn.execute(select(AuditEntry).order_by(AuditEntry.id)).all():
                if entry.outcome != "ok":  # refused attempts and re-pricings change no status
                    continue
                trail.setdefault(entry.quote_id, []).append(entry)
    finally:
        engine.dispose()
    for quote in quotes:
        previous = None
        for entry in trail.get(quote.id, []):
            if entry.from_status != previous:
                problems.append(f"{quote.id}: {entry.from_status} after {previous}")
            previous = entry.to_status
        if previous != quote.status:
            problems.append(f"{quote.id}: status {quote.status}, audit ends {previous}")
        if quote.status in ("approved", "rejected") and quote.approver is None:
            problems.append(f"{quote.id}: {quote.status} without approver")
    return problems


def _title(key: str) -> str:
    return f"durability {key}"


class Checkpointer:
    """SQLite only: a process running `PRAGMA wal_checkpoint(PASSIVE)` back to back; it writes
    one byte to its stdout as each checkpoint starts, so the killer can strike mid-checkpoint."""

    CODE = (
        "import sqlite3, sys, time\n"
        "c = sqlite3.connect(sys.argv[1], timeout=5, isolation_level=None)\n"
        "while True:\n"
        "    sys.stdout.write('c'); sys.stdout.flush()\n"
        "    c.execute('PRAGMA wal_checkpoint(PASSIVE)').fetchall()\n"
        "    time.sleep(0.002)\n"
    )

    def __init__(self, path: Path) -> None:
        self.path = path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", self.CODE, str(self.path)], stdout=subprocess.PIPE
        )

    def kill_mid_checkpoint(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        self.proc.stdout.read(1)  # it is starting a checkpoint now
        self.proc.kill()
        self.proc.wait(timeout=10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None


class Bench:
    def __init__(
        self,
        database: str,
        database_url: str,
        server: Server,
        outcome: Outcome,
        *,
        cluster: PrivatePostgres | None = None,
        checkpointer: Checkpointer | None = None,
    ) -> None:
        self.database = database
        self.database_url = database_url
        self.server = server
        self.outcome = outcome
        self.cluster = cluster
        self.checkpointer = checkpointer
        self.acks = Acks()
        self.keys: set[str] = set()  # every Idempotency-Key sent
        self.hashes: dict[str, str] = {}  # quote id -> content_hash when acknowledged
        self.killing = True  # the load runs past its deadline until the killer is done

    def _status(self, response: httpx.Response) -> None:
        key = str(response.status_code)
        self.outcome.statuses[key] = self.outcome.statuses.get(key, 0) + 1
        if response.status_code >= 500 and response.status_code != 503:
            self.outcome.server_errors += 1

    async def _send(
        self, http: httpx.AsyncClient, deadline: float, method: str, path: str, **kw: Any
    ) -> httpx.Response | None:
        """The first answer other than 503 to the same request, retried over kills; None when
        it was never answered (not acknowledged, so nothing is expected of it)."""
        attempt = 0
        while attempt == 0 or time.monotonic() < deadline + RETRY_FOR_S:
            if attempt:
                self.outcome.retries += 1
                await asyncio.sleep(0.25)
            attempt += 1
            try:
                response = await http.request(method, path, **kw)
            except httpx.HTTPError:
                continue
            self._status(response)
            if response.status_code != 503:
                return response
        self.outcome.gave_up += 1
        return None

    async def client(self, http: httpx.AsyncClient, cid: int, deadline: float) -> None:
        n = 0
        while time.monotonic() < deadline or self.killing:
            n += 1
            pick = random.random()
            if pick < 0.4:
                await self._upload(http, cid, n, deadline)
            elif pick < 0.7 or not self.acks.pending:
                await self._quote(http, deadline)
            else:
                await self._decide(http, deadline)

    async def _upload(self, http: httpx.AsyncClient, cid: int, n: int, deadline: float) -> None:
        body = unique_memtest(cid, n)
        self.outcome.uploads_sent += 1
        headers = {"Authorization": f"Bearer {UPLOAD_TOKEN}", "Content-Type": "application/json"}
        r = await self._send(http, deadline, "POST", "/v1/memtests", content=body, headers=headers)
        if r is not None and r.status_code in (200, 201):
            self.acks.uploads[hashlib.sha256(body).hexdigest()] = r.json()["id"]

    async def _quote(self, http: httpx.AsyncClient, deadline: float) -> None:
        key = uuid.uuid4().hex
        self.keys.add(key)
        self.outcome.quotes_sent += 1
        headers = {"Authorization": f"Bearer {REQUESTER_TOKEN}", "Idempotency-Key": key}
        body = {"request": REQUEST, "title": _title(key)}
        r = await self._send(http, deadline, "POST", "/v1/quotes", json=body, headers=headers)
        if r is not None and r.status_code in (200, 201):
            doc = r.json()
            self.acks.quotes[key] = (doc["id"], doc["content_hash"])
            self.acks.pending.append(doc["id"])
            self.hashes[doc["id"]] = doc["content_hash"]

    async def _decide(self, http: httpx.AsyncClient, deadline: float) -> None:
        # two clients may pick the same quote: exactly one may win, the other gets 409
        quote_id = random.choice(self.acks.pending[-50:])
        decision = random.choice(("approve", "reject"))
        self.outcome.decisions_sent += 1
        body = {"comment": "durability", "content_hash": self.hashes[quote_id]}
        headers = {"Authorization": f"Bearer {APPROVER_TOKEN}"}
        r = await self._send(
            http, deadline, "POST", f"/v1/quotes/{quote_id}/{decision}", json=body, headers=headers
        )
        if r is None:
            return
        if r.status_code == 200:
            self.acks.decisions[quote_id] = r.json()["status"]
        if r.status_code in (200, 409):
            with contextlib.suppress(ValueError):
                self.acks.pending.remove(quote_id)

    async def kill_and_verify(self, number: int, kind: str) -> None:
        loop = asyncio.get_running_loop()
        told = self.acks.snapshot()  # everything acknowledged before the kill
        started = time.monotonic()
        if kind == "database":
            assert self.cluster is not None
            await loop.run_in_executor(None, self.cluster.kill)
            await asyncio.sleep(0.3)  # the app answers 503 meanwhile
            await loop.run_in_executor(None, self.cluster.start)
        else:
            if self.checkpointer is not None:
                await loop.run_in_executor(None, self.checkpointer.kill_mid_checkpoint)
            self.server.kill(signal.SIGKILL)
            if self.checkpointer is not None:
                self.checkpointer.start()
            await loop.run_in_executor(None, self.server.start)
        await loop.run_in_executor(None, wait_ready, self.server.url)
        restart_s = time.monotonic() - started
        tally, _ = await loop.run_in_executor(None, present, self.database_url, told)
        tally.number, tally.killed, tally.restart_s = number, kind, restart_s
        self.outcome.rounds.append(tally)

    async def killer(self, deadline: float, kill_every: float, min_kills: int) -> None:
        """Kills every ~`kill_every` s until the deadline, and past it until `min_kills` rounds
        are done (a loaded machine restarts slowly: the count, not the clock, is the contract),
        never past MIN_KILLS_CAP_S after the deadline."""
        kinds = ["app", "database"] if self.cluster is not None else ["app+checkpoint"]
        number = 0
        try:
            while True:
                await asyncio.sleep(kill_every * random.uniform(0.8, 1.2))
                now = time.monotonic()
                enough = number >= min_kills or now > deadline + MIN_KILLS_CAP_S
                if now + 0.5 > deadline and enough:
                    return
                number += 1
                await self.kill_and_verify(number, kinds[(number - 1) % len(kinds)])
        finally:
            self.killing = False

    async def drive(self, seconds: float, kill_every: float, min_kills: int = 0) -> None:
        deadline = time.monotonic() + seconds
        limits = httpx.Limits(max_connections=self.outcome.clients, max_keepalive_connections=0)
        async with httpx.AsyncClient(
            base_url=self.server.url, timeout=CLIENT_TIMEOUT_S, limits=limits
        ) as http:
            await asyncio.gather(
                self.killer(deadline, kill_every, min_kills),
                *(self.client(http, i, deadline) for i in range(self.outcome.clients)),
            )


@contextlib.contextmanager
def _database(database: str) -> Iterator[tuple[str, PrivatePostgres | None, Path | None]]:
    if database == "sqlite":
        with tempfile.TemporaryDirectory(prefix="tf-durability-") as tmp:
            path = Path(tmp) / "trainfit.db"
            yield f"sqlite:///{path}", None, path
    else:
        with private_postgres() as cluster:
            yield cluster.url, cluster, None


def run(
    database: str,
    *,
    clients: int = 100,
    seconds: float = 30.0,
    kill_every: float = 3.0,
    min_kills: int = 0,
    log_dir: Path | None = None,
) -> Outcome:
    """One kill test on `database` ("sqlite" or "postgresql"); returns the tallies."""
    outcome = Outcome(database=database, clients=clients, seconds=seconds)
    log = (log_dir or Path(tempfile.gettempdir())) / f"durability-{database}-{os.getpid()}.log"
    with contextlib.ExitStack() as stack:
        database_url, cluster, sqlite_path = stack.enter_context(_database(database))
        server = Server(database_url, free_port(), log=log, env=SERVER_ENV)
        server.start()
        stack.callback(server.stop)
        checkpointer = None
        if sqlite_path is not None:
            checkpointer = Checkpointer(sqlite_path)
            checkpointer.start()
            stack.callback(checkpointer.stop)
        bench = Bench(
            database, database_url, server, outcome, cluster=cluster, checkpointer=checkpointer
        )
        asyncio.run(bench.drive(seconds, kill_every, min_kills))
        server.kill(signal.SIGKILL)  # the last word is a kill, too
        if cluster is not None:
            cluster.kill()
            cluster.start()
        started = time.monotonic()
        server.start()
        wait_ready(server.url)
        final, titles = present(database_url, bench.acks)
        final.killed, final.restart_s = "final", time.monotonic() - started
        outcome.final = final
        outcome.duplicate_quotes = sum(1 for k in bench.keys if titles.get(_title(k), 0) > 1)
        outcome.audit_problems = audit_problems(database_url)[:20]
    return outcome


def _print(o: Outcome) -> None:
    print(
        f"{o.database:10s} clients={o.clients} {o.seconds:.0f}s kills={o.kills}  sent: "
        f"uploads {o.uploads_sent}, quotes {o.quotes_sent}, decisions {o.decisions_sent}; "
        f"retries {o.retries}, never answered {o.gave_up}; statuses {o.statuses}"
    )
    for r in [*o.rounds, *([o.final] if o.final else [])]:
        print(
            f"  round {r.number:2d} killed {r.killed:15s} back in {r.restart_s:5.1f} s  "
            f"acknowledged/present: uploads {r.uploads_acknowledged}/{r.uploads_present}, "
            f"quotes {r.quotes_acknowledged}/{r.quotes_present}, "
            f"decisions {r.decisions_acknowledged}/{r.decisions_present}"
            f"  {'OK' if r.ok else 'LOST'}"
        )
        for line in r.missing[:10]:
            print("     ", line)
    print(
        f"  5xx other than 503: {o.server_errors}, duplicate quotes per key: "
        f"{o.duplicate_quotes}, audit problems: {len(o.audit_problems)} -> "
        f"{'OK' if o.ok else 'FAIL'}"
    )
    for line in o.audit_problems[:10]:
        print("     ", line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--kill-every", type=float, default=3.0)
    parser.add_argument(
        "--min-kills", type=int, default=0, help="go on past --seconds until this many kills"
    )
    parser.add_argument("--quick", action="store_true", help="16 clients, 10 s, kill every 2 s")
    parser.add_argument("--json", type=Path, help="write the tallies here")
    args = parser.parse_args(argv)
    if args.quick:
        args.clients, args.seconds, args.kill_every = 16, 10.0, 2.0
    databases = ("sqlite", "postgresql") if args.db == "both" else (args.db,)
    results = []
    for database in databases:
        outcome = run(
            database,
            clients=args.clients,
            seconds=args.seconds,
            kill_every=args.kill_every,
            min_kills=args.min_kills,
        )
        _print(outcome)
        results.append(outcome)
    if args.json:
        args.json.write_text(
            json.dumps([asdict(r) | {"ok": r.ok, "kills": r.kills} for r in results], indent=2)
        )
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
