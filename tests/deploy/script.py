"""scripts/validate_deploy.py loaded as a module, so tests use the same rendering and parsing."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_spec = importlib.util.spec_from_file_location(
    "validate_deploy", ROOT / "scripts" / "validate_deploy.py"
)
assert _spec and _spec.loader
validate_deploy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(validate_deploy)
