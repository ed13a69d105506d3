"""`python -m jobcore.client`: the `jobqueue` command line."""

from __future__ import annotations

import sys

from jobcore.client.cli import main

if __name__ == "__main__":
    sys.exit(main())
