"""The wheel a user installs, and fresh virtualenvs with it: for the tests that check what
`pip install jobqueue[...]` gives, away from the repository's own environment."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
UV = ROOT / ".venv" / "bin" / "uv"
PYTHON = ROOT / ".venv" / "bin" / "python"


def _source_copy(into: Path) -> Path:
    """The project's files (tracked and new, as a clone would have them once committed),
    copied: a build writes `build/` and `*.egg-info` beside its sources."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    for name in listed:
        source = ROOT / name
        if source.is_file():
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return into


@cache
def wheel() -> Path:
    """The project's wheel, built once per test process."""
    work = Path(tempfile.mkdtemp(prefix="jq-wheel-"))
    source = _source_copy(work / "src")
    subprocess.run(
        [str(UV), "build", "--wheel", "--out-dir", str(work / "dist"), str(source)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    (built,) = (work / "dist").glob("jobqueue-*.whl")
    return built


def installed_venv(path: Path, extras: str = "", also: list[str] | None = None) -> Path:
    """A new virtualenv at `path` with the wheel installed (with `extras`, e.g. "server") and
    the requirements in `also`; returns `path`."""
    subprocess.run(
        [str(UV), "venv", "-q", "--python", str(PYTHON), str(path)], check=True, timeout=120
    )
    requirement = f"jobqueue[{extras}] @ {wheel().as_uri()}" if extras else str(wheel())
    subprocess.run(
        [str(UV), "pip", "install", "-q", "--python", str(path / "bin" / "python"), requirement]
        + (also or []),
        check=True,
        timeout=300,
    )
    return path
