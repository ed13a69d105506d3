"""Where every setting is read from the environment: `NAME` or `JOBQUEUE_NAME`.

Each setting of docs/configuration.md may also be given with the prefix `JOBQUEUE_`
(`JOBQUEUE_WORKERS`), so an application that shares its environment with jobqueue can keep
jobqueue's variables apart from its own. When both names are set, the prefixed one wins,
even when it is empty (set means present). Names match case-insensitively, as the settings
always have. Errors name the variable actually read (`variable()`).

Not prefixed: the variables of other programs that jobqueue passes on as they define them
(OpenTelemetry's `OTEL_*`, prometheus-client's `PROMETHEUS_MULTIPROC_DIR`), and the client's
`JOBQUEUE_URL` and `JOBQUEUE_TOKEN`, which carry the prefix already.

This module imports nothing beyond the standard library: the client, the command line and
transactional enqueue read settings through it without the services' dependencies.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

PREFIX = "JOBQUEUE_"


def lookup(name: str, environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(the variable read, its text) for setting `name` (`WORKERS`), or None when neither
    `JOBQUEUE_WORKERS` nor `WORKERS` is set."""
    found = read([name], environ)
    return found.get(name.lower())


def read(
    names: Iterable[str], environ: Mapping[str, str] | None = None
) -> dict[str, tuple[str, str]]:
    """For each setting of `names` that is set: its lowercased name -> (the variable read, its
    text). One pass over the environment, prefixed names winning over bare ones."""
    source = os.environ if environ is None else environ
    wanted = {name.lower() for name in names}
    prefix = PREFIX.lower()
    found: dict[str, tuple[str, str]] = {}
    prefixed: set[str] = set()
    for variable, text in source.items():
        lowered = variable.lower()
        if lowered.startswith(prefix) and lowered[len(prefix) :] in wanted:
            setting = lowered[len(prefix) :]
            found[setting] = (variable, text)
            prefixed.add(setting)
        elif lowered in wanted and lowered not in prefixed:
            found[lowered] = (variable, text)
    return found


def getenv(
    name: str, default: str | None = None, environ: Mapping[str, str] | None = None
) -> str | None:
    """The text of setting `name` (`JOBQUEUE_<name>` first), else `default`."""
    found = lookup(name, environ)
    return default if found is None else found[1]


def variable(name: str, environ: Mapping[str, str] | None = None) -> str:
    """The variable that setting `name` is read from: `JOBQUEUE_<NAME>` when that is set,
    else `NAME` (what an error about the setting names)."""
    found = lookup(name, environ)
    return name.upper() if found is None else found[0].upper()
