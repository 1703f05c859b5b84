"""The ``opbridge`` command line. Each subcommand is a thin module over the Python API.

Exit codes: 0 success, 1 a check failed (mismatch, lint error, build failed),
2 a usage or load error.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from opbridge import __version__
from opbridge.errors import OpbridgeError

__all__ = ["COMMANDS", "main"]

# Subcommand modules under opbridge.cli; each defines ``add_parser(subparsers)``
# which registers its parser with ``set_defaults(run=callable(args) -> int)``.
COMMANDS: tuple[str, ...] = (
    "demo",
    "export",
    "verify",
    "inspect",
    "lint",
    "compat",
    "rewrite",
    "view",
    "trt-build",
    "plugins",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="opbridge", description="Custom ops across PyTorch, ONNX and runtimes.")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"opbridge.cli.{name.replace('-', '_')}").add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):
        # a terminal or pipe that is not UTF-8 (PYTHONIOENCODING=ascii, a C locale): a name or attribute it
        # cannot show is escaped, not a UnicodeEncodeError ending the command with exit code 1
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=(logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)],
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        return int(args.run(args))
    except OpbridgeError as exc:
        print(f"opbridge {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (opbridge inspect m.onnx | head): stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
