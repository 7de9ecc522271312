"""The Dockerfile: slim base, non-root, health check on /healthz, `trainfit serve`, and the same
install command as the README's service section."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
INSTALL = re.compile(r"""pip install (?:-[\w-]+ )*["']?\.\[service\]["']?""")


def test_base_user_healthcheck_and_command() -> None:
    assert re.search(r"^FROM python:3\.11-slim\b", DOCKERFILE, re.M)
    users = re.findall(r"^USER (\S+)", DOCKERFILE, re.M)
    assert users and users[-1] not in ("root", "0")
    assert re.search(r"^HEALTHCHECK .*\n?.*/healthz", DOCKERFILE, re.M)
    assert "TRAINFIT_DATABASE_URL" in DOCKERFILE
    assert re.search(r'^CMD \["trainfit", "serve", "--host", "0\.0\.0\.0"', DOCKERFILE, re.M)
    assert "torch" not in " ".join(re.findall(r"^RUN .*", DOCKERFILE, re.M))


def test_install_command_matches_the_readme() -> None:
    readme = ROOT / "README.md"
    lines = readme.read_text().splitlines() if readme.exists() else []
    documented = [m.group(0) for line in lines if (m := INSTALL.search(line))]
    if not documented:
        pytest.skip("README.md has no line with `pip install` and `.[service]` yet")
    in_docker = [m.group(0) for m in INSTALL.finditer(DOCKERFILE)]
    assert in_docker, "the Dockerfile does not install .[service]"
    assert in_docker[0] in documented, (in_docker[0], documented)
