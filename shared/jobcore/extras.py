"""The services' commands without the `server` extra: one clear line instead of a traceback.

`pip install jobqueue` brings the client, the `jobqueue` command line and transactional
enqueue; the services (`jobqueue-api`, `jobqueue-worker`) and the migrations need the
`server` extra. Their console scripts are installed either way, so each starts with
`require("server", command)`, which reads the extra's requirements from the installed
distribution's own metadata (the one list, pyproject.toml's) and exits 2 naming what is
missing. Run from a source tree without installed metadata, nothing is checked.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata

DISTRIBUTION = "jobqueue"
# `name[extras] >=1.0 ; extra == "server"`: the distribution's name, and the extra it is for.
_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_EXTRA = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


def requirements(extra: str) -> list[str] | None:
    """The names of the distributions `extra` requires, or None when jobqueue's metadata is
    not installed (a source tree on sys.path)."""
    try:
        declared = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return None
    names = []
    for requirement in declared:
        marker = _EXTRA.search(requirement.partition(";")[2])
        name = _NAME.match(requirement)
        if marker and marker.group(1) == extra and name and name.group(1) != DISTRIBUTION:
            names.append(name.group(1))
    return names


def missing(extra: str) -> list[str]:
    """The distributions of `extra` that are not installed."""
    absent = []
    for name in requirements(extra) or []:
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            absent.append(name)
    return absent


def require(extra: str, command: str) -> None:
    """Exit 2 with one line on stderr when `extra` is not installed."""
    absent = missing(extra)
    if absent:
        print(
            f"{command}: the {extra} dependencies are not installed (missing "
            f"{', '.join(absent)}): install {DISTRIBUTION}[{extra}]",
            file=sys.stderr,
        )
        sys.exit(2)
