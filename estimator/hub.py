"""Hugging Face Hub model ids: fetch a model's `config.json` (and only that file).

`--model ORG/NAME[@revision]` is resolved as follows (first match wins):

1. an existing file, or a name ending in `.json` -> a local config.json (the CLI reads it);
2. an existing directory holding `config.json` -> that file (as transformers treats a local
   directory given to `from_pretrained`);
3. a preset id (`trainfit presets`, case-insensitive) -> the preset: **a preset id wins over a hub
   id**. Preset ids contain no `/`, and hub ids always do (`ORG/NAME`), so the two can only clash
   in (1)/(2), never with each other;
4. `ORG/NAME` naming the repo a preset's config.json was taken from (`presets.PRESET_SOURCES`,
   e.g. `meta-llama/Llama-3.1-8B`) -> that preset, offline; add `@main` to fetch from the Hub;
5. `ORG/NAME[@revision]` -> the Hub.

The download goes through `huggingface_hub.hf_hub_download` (imported lazily: the estimator imports
without it). The environment is read at call time, not at import time, so a long-running service
and the tests see changes: `HF_HUB_OFFLINE` (also `TRANSFORMERS_OFFLINE`, as huggingface_hub's
constants.py reads both) -> `local_files_only=True`; `HF_HUB_CACHE` (else `HF_HOME/hub`) ->
`cache_dir`; `HF_ENDPOINT` -> `endpoint`; `HF_TOKEN` -> `token`. What was fetched is cached twice:
on disk in the Hub cache (a later process reads the snapshot: huggingface_hub skips the download
when the ETag matches, or answers from the cache offline), and in this process (`fetch_config`):
a config fetched for a commit hash is kept for good (a commit never changes), one fetched for a
branch or tag for `CONFIG_TTL_S`, so a running service does not ask the Hub on every request.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from estimator.errors import EstimatorInputError

FIELD = "model.hub"
CONFIG_FILE = "config.json"
MAX_CONFIG_BYTES = 5 * 2**20
CONFIG_TTL_S = 300.0  # a branch's config.json is asked for again after this (a policy, not a fact)
CONFIG_CACHE_SIZE = 256
COMMIT = re.compile(r"^[0-9a-f]{40}$")
# huggingface_hub/utils/_validators.py (validate_repo_id): letters, digits, `-`, `_`, `.`; at most
# 96 characters; one `/` between namespace and name.
_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
HUB_ID = re.compile(rf"^(?P<repo>{_PART}/{_PART})(?:@(?P<revision>[A-Za-z0-9._/-]{{1,200}}))?$")
TRUE_VALUES = {"1", "on", "yes", "true"}  # huggingface_hub/constants.py `_is_true`
OFFLINE_HINT = (
    "download config.json once (e.g. `hf download {repo} config.json`) and pass its path with "
    "--model path/to/config.json (REST: model.config), or unset HF_HUB_OFFLINE"
)


@dataclass(frozen=True)
class HubId:
    repo: str
    revision: str | None = None

    def __str__(self) -> str:
        return self.repo + (f"@{self.revision}" if self.revision else "")


def parse_hub_id(text: str, field: str = FIELD) -> HubId:
    """`ORG/NAME` or `ORG/NAME@revision` (branch, tag or commit)."""
    match = HUB_ID.match(text.strip())
    if match is None:
        raise EstimatorInputError(
            field, f"{text!r} is not a Hub model id (expected ORG/NAME or ORG/NAME@revision)"
        )
    return HubId(match["repo"], match["revision"])


def looks_like_hub_id(text: str) -> bool:
    return HUB_ID.match(text.strip()) is not None


def model_source(text: str) -> dict[str, str]:
    """Classify a `--model` value (see the module docstring for the order): returns
    `{"file": path}`, `{"hub": id}` or else `{"preset": id}`. Does no network access."""
    path = Path(text)
    if path.is_file() or path.suffix == ".json":
        return {"file": text}
    if path.is_dir() and (path / CONFIG_FILE).is_file():
        return {"file": str(path / CONFIG_FILE)}
    return preset_or_hub(text)


def preset_or_hub(text: str) -> dict[str, str]:
    """Steps 3-5 of the module docstring, without looking at local files (what the service
    does with a model named in a request or in a training config sent to it)."""
    from estimator.presets import PRESET_SOURCES

    if text.strip().lower() not in PRESET_SOURCES and looks_like_hub_id(text):
        alias = preset_for_repo(text)
        return {"preset": alias} if alias else {"hub": text.strip()}
    return {"preset": text}  # an unknown one is refused by presets.preset_config, naming them


def preset_for_repo(text: str) -> str | None:
    """The preset shipped from that repo's config.json (`PRESET_SOURCES` says `ORG/NAME
    config.json`), for an id without `@revision`: answered from the package, no network."""
    from estimator.presets import PRESET_ALSO_FOR, PRESET_SOURCES

    hub = parse_hub_id(text)
    if hub.revision is not None:
        return None
    for repo, preset in PRESET_ALSO_FOR.items():
        if repo.lower() == hub.repo.lower():
            return preset
    for preset, source in PRESET_SOURCES.items():
        repo, _, rest = source.partition(" ")
        if rest == "config.json" and repo.lower() == hub.repo.lower():
            return preset
    return None


@dataclass(frozen=True)
class HubSettings:
    """The huggingface_hub environment variables, read when a download is made."""

    offline: bool
    cache_dir: str | None
    endpoint: str | None
    token: str | None

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> HubSettings:
        e = dict(os.environ) if env is None else env
        offline = (e.get("HF_HUB_OFFLINE") or e.get("TRANSFORMERS_OFFLINE") or "").strip()
        cache = e.get("HF_HUB_CACHE") or (
            str(Path(e["HF_HOME"]) / "hub") if e.get("HF_HOME") else None
        )
        return cls(
            offline=offline.lower() in TRUE_VALUES,
            cache_dir=cache,
            endpoint=(e.get("HF_ENDPOINT") or "").rstrip("/") or None,
            token=e.get("HF_TOKEN") or None,
        )


def hub_download(hub: HubId, filename: str, settings: HubSettings, field: str = FIELD) -> Path:
    """One file of a model repo through the Hub cache; every failure becomes an
    EstimatorInputError that says what to do."""
    try:
        import huggingface_hub
        from huggingface_hub import errors
    except ImportError:
        raise EstimatorInputError(
            field,
            f"Hub ids need huggingface_hub (pip install 'trainfit[inputs]'); or pass a "
            f"{filename} file instead of {hub}",
        ) from None
    where = f"{hub} ({filename})"
    try:
        path = huggingface_hub.hf_hub_download(
            hub.repo,
            filename,
            revision=hub.revision,
            cache_dir=settings.cache_dir,
            endpoint=settings.endpoint,
            token=settings.token,
            local_files_only=settings.offline,
        )
    except errors.GatedRepoError:
        site = settings.endpoint or "https://huggingface.co"
        raise EstimatorInputError(
            field,
            f"{where} is a gated repo: accept its terms at {site}/{hub.repo} and set HF_TOKEN "
            f"to a token of that account (or pass a config.json file)",
        ) from None
    except errors.RevisionNotFoundError:
        raise EstimatorInputError(
            field, f"{where}: revision {hub.revision or 'main'!r} not found"
        ) from None
    except errors.RepositoryNotFoundError:
        raise EstimatorInputError(
            field,
            f"{where}: no such model repo on the Hub (or it is private: set HF_TOKEN); "
            f"check the id, or pass its config.json with --model path/to/config.json "
            f"(REST: model.config)",
        ) from None
    except errors.RemoteEntryNotFoundError:
        raise EstimatorInputError(field, f"{where}: the repo has no {filename}") from None
    except errors.LocalEntryNotFoundError as err:
        reason = "HF_HUB_OFFLINE is set" if settings.offline else f"the Hub is unreachable ({err})"
        raise EstimatorInputError(
            field,
            f"{where} is not in the Hub cache and {reason}: "
            + OFFLINE_HINT.format(repo=hub.repo).replace("config.json", filename),
        ) from None
    except errors.HfHubHTTPError as err:
        status = err.response.status_code if err.response is not None else "?"
        raise EstimatorInputError(field, f"{where}: the Hub answered HTTP {status}") from None
    except Exception as err:  # network errors (httpx's, OSError): named, never a traceback
        raise EstimatorInputError(
            field, f"{where}: download failed ({type(err).__name__}: {err})"
        ) from None
    return Path(str(path))


_fetched: OrderedDict[tuple[object, ...], tuple[float, str]] = OrderedDict()


def fetch_config(model_id: str, settings: HubSettings | None = None) -> dict[str, Any]:
    """The `config.json` object of a Hub model id (`ORG/NAME[@revision]`), from this process's
    cache when it was fetched here before (see the module docstring)."""
    hub = parse_hub_id(model_id)
    settings = settings or HubSettings.from_env()
    import hashlib

    token = hashlib.sha256(settings.token.encode()).hexdigest() if settings.token else None
    key = (settings.endpoint, settings.cache_dir, token, hub.repo, hub.revision)
    now = time.monotonic()
    hit = _fetched.get(key)
    if hit is not None and (COMMIT.match(hub.revision or "") or now - hit[0] < CONFIG_TTL_S):
        _fetched.move_to_end(key)
        return dict(json.loads(hit[1]))
    config = _read_config(hub, settings)
    _fetched[key] = (now, json.dumps(config))
    if len(_fetched) > CONFIG_CACHE_SIZE:
        _fetched.popitem(last=False)
    return config


def _read_config(hub: HubId, settings: HubSettings) -> dict[str, Any]:
    path = hub_download(hub, CONFIG_FILE, settings)
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise EstimatorInputError(FIELD, f"{hub}: config.json is larger than 5 MiB")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise EstimatorInputError(FIELD, f"{hub}: config.json is not valid JSON ({err})") from None
    if not isinstance(config, dict):
        raise EstimatorInputError(FIELD, f"{hub}: config.json is not a JSON object")
    return config
