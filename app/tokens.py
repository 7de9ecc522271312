"""New bearer tokens for the service: `trainfit token create --role approver|requester|uploader
--name NAME` (the CLI's handler is `main`; also `python -m app.tokens create ...`).

The secret is printed once; the service only ever stores its sha256. The printed entry
`name=sha256:<hex>` goes into the role's environment variable (comma-separated with others)."""

from __future__ import annotations

import argparse
import secrets
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from app.settings import _NAME, hash_token

ROLE_VARIABLES = {
    "requester": "TRAINFIT_REQUESTER_TOKENS",
    "approver": "TRAINFIT_APPROVER_TOKENS",
    "uploader": "TRAINFIT_UPLOAD_TOKENS",
}


@dataclass(frozen=True)
class NewToken:
    name: str
    role: str
    secret: str
    variable: str

    @property
    def entry(self) -> str:
        """What to append to `variable`: the name and the hash, never the secret."""
        return f"{self.name}=sha256:{hash_token(self.secret)}"


def create_token(name: str, role: str) -> NewToken:
    """A fresh 256-bit token for `name` in `role`; ValueError for a bad name or role."""
    if role not in ROLE_VARIABLES:
        raise ValueError(f"role must be one of {', '.join(ROLE_VARIABLES)}")
    if not _NAME.match(name):
        raise ValueError("names may use letters, digits and _ . @ - (64 at most)")
    return NewToken(name, role, "tf_" + secrets.token_urlsafe(32), ROLE_VARIABLES[role])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["create"])
    parser.add_argument("--role", required=True, choices=sorted(ROLE_VARIABLES))
    parser.add_argument("--name", required=True, help="recorded as the actor (audit trail)")


def run(args: argparse.Namespace) -> int:
    try:
        token = create_token(args.name, args.role)
    except ValueError as exc:
        print(f"token create: {exc}", file=sys.stderr)
        return 2
    print(f"token (shown once, give it to {token.name}): {token.secret}")
    print(f"add to {token.variable}: {token.entry}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trainfit token", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
