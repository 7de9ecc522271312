"""What an approval is bound to: a content hash over a quote's request, its estimate and the
versions of the GPU catalog and the assumption profile it was priced with.

Versions are content digests (sha256 of the canonical JSON of the loaded catalog / profile), so
any change to a price, a capacity or an assumption gives a new version without anyone having to
bump a number. Canonical JSON: keys sorted, no spaces, ASCII only (`\\uXXXX` escapes), no NaN.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import gpu_catalog
from estimator.profile import load_profile


def canonical_json(value: Any) -> bytes:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode("ascii")


def sha256_hex(value: Any) -> str:
    return hashlib.sha256(canonical_json(value)).hexdigest()


# digests of the loaded (cached, immutable) catalog and profile objects, keyed by identity
_DIGESTS: dict[int, tuple[object, str]] = {}


def _digest_of(loaded: object, as_json: Any) -> str:
    known = _DIGESTS.get(id(loaded))
    if known is not None and known[0] is loaded:
        return known[1]
    digest = sha256_hex(as_json())
    _DIGESTS[id(loaded)] = (loaded, digest)
    return digest


def catalog_version() -> str:
    catalog = gpu_catalog.load_catalog()
    return _digest_of(catalog, lambda: catalog.model_dump(mode="json"))


def profile_version(name: str) -> str:
    """Raises the estimator's input error (422) for an unknown profile."""
    profile = load_profile(name)
    return _digest_of(profile, profile.as_dict)


@dataclass(frozen=True)
class Versions:
    catalog: str
    profile: str


def current_versions(profile: str) -> Versions:
    return Versions(catalog=catalog_version(), profile=profile_version(profile))


def content_hash(request: dict[str, Any], estimate: dict[str, Any], versions: Versions) -> str:
    return sha256_hex(
        {
            "request": request,
            "estimate": estimate,
            "catalog_version": versions.catalog,
            "profile_version": versions.profile,
        }
    )
