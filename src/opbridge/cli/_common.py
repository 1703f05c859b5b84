"""Argument groups shared by subcommands."""

from __future__ import annotations

import argparse
import contextlib
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from opbridge.errors import OpbridgeError

__all__ = [
    "add_ops_argument",
    "arguments_as_flags",
    "json_for_stdout",
    "parse_dims",
    "print_json_and_table",
    "user_files",
]

# (a pattern of the API's wording, and what the command line says instead: a string or a function of the match)
FlagRule = tuple[str, str | Callable[[re.Match[str]], str]]


@contextlib.contextmanager
def arguments_as_flags(rules: Sequence[FlagRule]) -> Iterator[None]:
    """Within it, an OpbridgeError's message names the command's flags where the Python API named its
    arguments: each rule's pattern is replaced, in order (the API's errors name its arguments, as a Python
    caller reads them; a command that calls it names the flags that set them)."""
    try:
        yield
    except OpbridgeError as exc:
        text = str(exc)
        for pattern, replacement in rules:
            text = re.sub(pattern, replacement, text)
        exc.args = (text, *exc.args[1:])
        raise


def add_ops_argument(parser: argparse.ArgumentParser) -> None:
    """``--ops FILE_OR_MODULE`` (repeatable): import user code that defines ops or kernels."""
    parser.add_argument(
        "--ops",
        action="append",
        default=[],
        metavar="FILE_OR_MODULE",
        help="a .py file or module defining @opbridge.op / @opbridge.kernel (repeatable)",
    )


def parse_dims(text: str, what: str = "shape") -> tuple[int, ...]:
    """``"1x3x256x256"`` or ``"1,3,256,256"`` -> ``(1, 3, 256, 256)``; ``"scalar"`` -> ``()`` (rank 0,
    as the tables print it)."""
    if text == "scalar":
        return ()
    parts = text.replace(",", "x").split("x")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        raise OpbridgeError(
            f"{what} {text!r}: write dims as integers like 1x3x256x256 (a scalar, rank 0: scalar)"
        ) from None
    if any(d < 0 for d in dims):
        raise OpbridgeError(f"{what} {text!r}: dims must be >= 0")
    return dims


def user_files(args: argparse.Namespace) -> list[str]:
    """The files a command reads that its outputs must never replace: the model, the factory's
    source, ``--ops`` files and the ``--inputs`` arrays (whichever the command takes)."""
    from opbridge._files import read_files

    return read_files(
        getattr(args, "model", None),
        getattr(args, "reference", None),
        getattr(args, "inputs", None),
        getattr(args, "ops", None),
    )


def json_for_stdout(text: str) -> str:
    """JSON text as stdout can carry it: where stdout is not UTF-8 (``LC_ALL=C``), every non-ASCII
    character as a ``\\u`` escape (the stream's own escapes would make it invalid JSON)."""
    import codecs
    import json
    import sys

    encoding = getattr(sys.stdout, "encoding", None) or "ascii"
    try:
        utf8 = codecs.lookup(encoding).name == "utf-8"
    except LookupError:
        utf8 = False
    return text if utf8 else json.dumps(json.loads(text), indent=2, ensure_ascii=True)


def print_json_and_table(data: Any, table: str) -> None:
    """``--json -``: ``data`` as JSON on stdout (a pipe's whole content), the text report on stderr."""
    import json
    import sys

    print(table, file=sys.stderr)
    print(json_for_stdout(json.dumps(data, indent=2, ensure_ascii=False)))
