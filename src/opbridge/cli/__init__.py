"""The ``opbridge`` command line. Each subcommand is a thin module over the Python API.

Exit codes: 0 success, 1 a check failed (mismatch, lint error, build failed),
2 a usage or load error.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import signal
import sys
from collections.abc import Sequence

from opbridge import __version__
from opbridge._terminate import sigterm_unwinds
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
    for command in sub.choices.values():  # -v after the command too (opbridge -v export ... -v): added up in main
        command.add_argument(
            "-v",
            "--verbose",
            action="count",
            dest="verbose_after",
            default=0,
            help="more log output (-vv for debug)",
        )
    return parser


def _verbosity(args: argparse.Namespace) -> int:
    """How many -v the command line gives, before the command and after it together."""
    return int(args.verbose) + int(getattr(args, "verbose_after", 0))


def _unknown_arguments(
    parser: argparse.ArgumentParser, command: str | None, extra: list[str], argv: Sequence[str] | None
) -> None:
    """Exit with the command's usage and ``unrecognized arguments``, naming the option meant where one is
    close (``--shapes``: did you mean --shape?)."""
    import difflib

    commands = next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})
    target = commands.get(command, parser) if command else parser
    words = list(sys.argv[1:] if argv is None else argv)
    before = words[: words.index(command)] if command in words else []
    if any(arg in before for arg in extra):  # given before the command: the top level's
        target = parser
    message = f"unrecognized arguments: {' '.join(extra)}"
    options = [o for action in target._actions for o in action.option_strings if o.startswith("--")]
    for arg in extra:
        close = (
            difflib.get_close_matches(arg.split("=", 1)[0], options, n=1, cutoff=0.75) if arg.startswith("--") else []
        )
        if close:
            message += f" (did you mean {close[0]}?)"
            break
    target.error(message)


def main(argv: Sequence[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):
        # a terminal or pipe that is not UTF-8 (PYTHONIOENCODING=ascii, a C locale): a name or attribute it
        # cannot show is escaped, not a UnicodeEncodeError ending the command with exit code 1
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # named by the command's own parser, with its usage and the closest option
        _unknown_arguments(parser, getattr(args, "command", None), extra, argv)
    logging.basicConfig(
        level=(logging.WARNING, logging.INFO, logging.DEBUG)[min(_verbosity(args), 2)],
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        # (a SIGTERM unwinds the command: the temporary files of a write beside the user's output, a
        # session's copy of a model over 2 GiB and a TensorRT worker's folder are removed; exit code 143)
        with sigterm_unwinds(exit_code=128 + signal.SIGTERM):
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
    except Exception as exc:
        if isinstance(exc, OSError) and exc.errno in _FULL:  # (the writes go through temporary files)
            # (the failed write may be standard output, which carries no file name: lint m.onnx > /dev/full)
            where = f" writing {exc.filename}" if exc.filename else " writing the output"
            print(
                f"opbridge {args.command}: error: {exc.strerror or exc}{where}; an output file is replaced whole or "
                "not at all, so any file it would replace is unchanged. Free space (or raise the file-size limit), "
                "or write elsewhere.",
                file=sys.stderr,
            )
            return 2
        invalid = _invalid_model(getattr(args, "model", None))
        if invalid is None:  # a valid model: opbridge's own failure, with its traceback
            raise
        print(
            f"opbridge {args.command}: error: {args.model} is not a valid ONNX model, and reading it failed with "
            f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}. onnx.checker says: {invalid} Fix the model "
            "(or export it again).",
            file=sys.stderr,
        )
        return 2


# The errors of a write that ran out of room: a full disk, a quota, the file-size limit
_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def _invalid_model(path: str | None) -> str | None:
    """What ``onnx.checker`` (full check) finds wrong with the model file at ``path``, or None where it
    finds nothing or the file cannot be read as a model."""
    if not isinstance(path, str) or not os.path.isfile(path):
        return None
    try:
        import onnx

        model = onnx.load(path, load_external_data=False)
    except Exception:
        return None
    try:
        names = [n.name for n in model.graph.node]  # names that are not UTF-8 come back as bytes
        if any(isinstance(n, bytes) for n in names):
            return "node names are not UTF-8, which ONNX requires of every name."
        onnx.checker.check_model(model, full_check=True)
    except Exception as exc:
        return " ".join(str(exc).split())[:400]
    return None


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
