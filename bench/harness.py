"""What the service benchmarks share: a free loopback port, the service in its own process
group (`python -m app.server`), a throw-away PostgreSQL schema on the shared server, and a
private PostgreSQL cluster (initdb + pg_ctl under a temp dir) that a benchmark may kill."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
UPLOAD_TOKEN = "durability-upload-0123"
APPROVER_TOKEN = "durability-approve-4567"
REQUESTER_TOKEN = "durability-request-8901"
START_TIMEOUT_S = 120.0  # a slow restart is waited for, never a reason to skip a round


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def pg_schema() -> Iterator[str]:
    """A fresh schema on the shared PostgreSQL (search_path in the URL), dropped on exit."""
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
        TRAINFIT_REQUESTER_TOKENS=f"alice={REQUESTER_TOKEN}",
        TRAINFIT_SECRET_KEY="durability-secret",
        PYTHONPATH=str(ROOT),
    )
    env.update(extra)
    return env


class Server:
    """`python -m app.server` (what `trainfit serve` runs) in its own process group."""

    def __init__(
        self,
        database_url: str,
        port: int,
        workers: int = 1,
        log: Path | None = None,
        env: dict[str, str] | None = None,
    ):
        self.database_url = database_url
        self.port = port
        self.workers = workers
        self.log = log
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"http://127.0.0.1:{port}"

    def start(self, timeout: float = START_TIMEOUT_S) -> float:
        """Start and wait until /healthz answers (migrations ran); returns the seconds taken."""
        started = time.monotonic()
        cmd = [sys.executable, "-m", "app.server", "--host", "127.0.0.1"]
        cmd += ["--port", str(self.port), "--log-level", "warning"]
        if self.workers > 1:
            cmd += ["--workers", str(self.workers)]
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=server_env(self.database_url, **self.env),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        while time.monotonic() - started < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode} (log: {self.log})")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"server did not become healthy in {timeout:.0f} s")

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


def wait_ready(url: str, timeout: float = START_TIMEOUT_S) -> float:
    """Seconds until /readyz (a database round trip) answers 200."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                return time.monotonic() - started
        time.sleep(0.05)
    raise RuntimeError(f"{url} not ready after {timeout:.0f} s")


def postgres_bin() -> Path | None:
    """The newest /usr/lib/postgresql/<version>/bin holding initdb and pg_ctl, if any."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: (
            int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0
        ),
    )
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


class PrivatePostgres:
    """A PostgreSQL cluster of our own under a temp dir, on a free port (fsync on, the defaults
    otherwise), so that a benchmark can `pg_ctl stop -m immediate` it. Run as the `postgres`
    user when we are root (PostgreSQL refuses to run as root)."""

    def __init__(self, root: Path) -> None:
        bindir = postgres_bin()
        if bindir is None:
            raise RuntimeError("initdb/pg_ctl not found (apt-get install postgresql)")
        self.bin = bindir
        self.root = root
        self.data = root / "data"
        self.port = free_port()
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._as:
            shutil.chown(root, "postgres")

    def _run(self, *args: str, timeout: float = 120) -> None:
        subprocess.run(
            [*self._as, *args], check=True, capture_output=True, timeout=timeout, cwd=self.root
        )

    def init(self) -> None:
        self._run(
            str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres",
            "--auth=trust", "-E", "UTF8", "--no-sync",
        )  # fmt: skip
        self.start()

    def start(self) -> float:
        started = time.monotonic()
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1"
        self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", options,
            "-l", str(self.root / "postgres.log"), "-w", "-t", "120", "start",
        )  # fmt: skip
        return time.monotonic() - started

    def kill(self) -> None:
        """`pg_ctl stop -m immediate`: every server process quits at once, no checkpoint (the
        next start replays the WAL, as after a crash)."""
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")

    def stop(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError):
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "stop")


@contextlib.contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    with tempfile.TemporaryDirectory(prefix="tf-pg-") as tmp:
        cluster = PrivatePostgres(Path(tmp))
        cluster.init()
        try:
            yield cluster
        finally:
            cluster.stop()
