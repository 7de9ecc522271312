"""The wheel ships what an installed (non-editable) service needs: the top-level `templates`
package and the front door, and the app finds its pages there, not in the source tree."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

RENDER = """
import sys
from fastapi.testclient import TestClient
from app.factory import create_app
from app.settings import Settings
import app.templating, trainfit.cli
site = sys.argv[1]
assert app.templating.TEMPLATES_DIR.as_posix().startswith(site), app.templating.TEMPLATES_DIR
assert trainfit.cli.__file__.startswith(site), trainfit.cli.__file__
settings = Settings(database_url="sqlite:///" + sys.argv[2])
with TestClient(create_app(settings)) as client:
    page = client.get("/")
    assert page.status_code == 200, page.status_code
    assert "<form" in page.text
print("rendered", len(page.text))
"""


@pytest.mark.slow
def test_installed_wheel_renders_a_page_from_its_own_templates(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    source = tmp_path / "source"  # a copy: building writes build/ and *.egg-info into the tree
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    wheels = tmp_path / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*build, "-w", str(wheels), str(source)], check=True, capture_output=True)
    (wheel,) = wheels.glob("trainfit-*.whl")
    site = tmp_path / "site"
    install = [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site)]
    subprocess.run([*install, str(wheel)], check=True, capture_output=True)
    assert (site / "templates" / "index.html").is_file()
    out = subprocess.run(
        [sys.executable, "-c", RENDER, site.as_posix(), str(tmp_path / "db.sqlite")],
        cwd=tmp_path,  # not the source tree: only the installed copy can be found
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("rendered")
