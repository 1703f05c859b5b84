"""``python -m opbridge``: the ``opbridge`` command line."""

from __future__ import annotations

import sys

from opbridge.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
