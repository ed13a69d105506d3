"""The migrations ship inside the distribution (docs/operations.md#migrations) as the package
`jobqueue_migrations`, listed with the others. That the installed wheel migrates a database
with `jobqueue migrate` is tests/e2e/test_your_application.py's first step."""

from __future__ import annotations

import tomllib

from tests import pg


def test_every_package_of_the_tree_is_in_the_distribution():
    """pyproject.toml lists the packages (the migrations are one under another name): a
    package added to the tree must be listed too."""
    with open(pg.ROOT / "pyproject.toml", "rb") as f:
        listed = set(tomllib.load(f)["tool"]["setuptools"]["packages"])
    found = {"jobqueue_migrations"}
    for where in ("shared", "services/api", "services/worker"):
        for init in (pg.ROOT / where).rglob("__init__.py"):
            found.add(".".join(init.parent.relative_to(pg.ROOT / where).parts))
    assert listed == found
