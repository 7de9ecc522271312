"""`trainfit serve` (the web service), `trainfit db backup|restore` (its database) and
`trainfit token create` (a bearer token for it)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from trainfit.cli.common import EXIT_OK, InputError, add_command


def _service_missing(command: str, err: ImportError) -> InputError:
    return InputError(f"{command}: the service is not installed ({err}); pip install '.[service]'")


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from app.server import serve
    except ImportError as err:
        raise _service_missing("serve", err) from None
    serve(host=args.host, port=args.port, database_url=args.database_url)
    return EXIT_OK


def cmd_db(args: argparse.Namespace) -> int:
    """`trainfit db backup FILE` / `trainfit db restore FILE [--replace]` (app.backup)."""
    try:
        from app.backup import BackupError, backup, restore
    except ImportError as err:
        raise _service_missing("db", err) from None
    url = args.database_url or os.environ.get("TRAINFIT_DATABASE_URL") or "sqlite:///trainfit.db"
    try:
        if args.action == "backup":
            summary = backup(url, args.file)
        else:
            summary = restore(url, args.file, replace=args.replace)
    except BackupError as err:
        raise InputError(f"db {args.action}: {err}") from None
    counts = ", ".join(f"{k} {v}" for k, v in summary.counts.items())
    sys.stdout.write(f"{args.action}: {summary.path} ({counts})\n")
    return EXIT_OK


TOKEN_ROLES = ("approver", "requester", "uploader")  # app.tokens.ROLE_VARIABLES


def cmd_token(args: argparse.Namespace) -> int:
    """Print a new token once, and the `name=sha256:...` entry for the role's variable."""
    try:
        from app.tokens import create_token
    except ImportError as err:
        raise _service_missing("token", err) from None
    try:
        token = create_token(args.name, args.role)
    except ValueError as err:
        raise InputError(f"token --name: {err}") from None
    sys.stdout.write(f"token (shown once, give it to {token.name}): {token.secret}\n")
    sys.stdout.write(f"add to {token.variable}: {token.entry}\n")
    return EXIT_OK


def register(sub: Any) -> None:
    tok = add_command(
        sub,
        "token",
        "create a bearer token for the service (the service keeps only its sha256)",
        "trainfit token create --role approver --name kral",
    )
    tok.add_argument("action", choices=["create"], help="what to do")
    tok.add_argument("--role", required=True, choices=TOKEN_ROLES, help="what the token may do")
    tok.add_argument("--name", required=True, help="recorded as the actor in the audit trail")
    tok.set_defaults(func=cmd_token)

    db = add_command(
        sub,
        "db",
        "back up or restore the service's database",
        "trainfit db backup trainfit-backup.jsonl.gz --database-url sqlite:///trainfit.db",
    )
    db.add_argument("action", choices=["backup", "restore"])
    db.add_argument("file", help="backup file (gzip'd JSON lines)")
    db.add_argument("--database-url", default=None, help="default $TRAINFIT_DATABASE_URL")
    db.add_argument("--replace", action="store_true", help="restore: empty the tables first")
    db.set_defaults(func=cmd_db)

    srv = add_command(
        sub, "serve", "run the web service", "trainfit serve --host 127.0.0.1 --port 8000"
    )
    srv.add_argument("--host", default="127.0.0.1", help="address to listen on")
    srv.add_argument("--port", type=int, default=8000, help="TCP port")
    srv.add_argument("--database-url", default=None, help="default sqlite:///trainfit.db")
    srv.set_defaults(func=cmd_serve)
