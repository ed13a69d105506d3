"""`python -m jobcore.queries [--check]`: write `queries.sql` (or only say whether it is
up to date: exit 1 when it is stale)."""

from __future__ import annotations

import sys

from jobcore.queries import listing


def main(argv: list[str]) -> int:
    wanted = listing.text()
    if "--check" in argv:
        current = listing.PATH.read_text() if listing.PATH.exists() else ""
        if current != wanted:
            print(f"{listing.PATH} is stale: run python -m jobcore.queries", file=sys.stderr)
            return 1
        return 0
    listing.PATH.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
