"""``opbridge verify MODEL.onnx --reference FACTORY``: parity of every backend with PyTorch.

Shape sets (``--shape``): each occurrence is ``NAME:DIMS`` or several
``NAME:DIMS`` joined by commas (``--shape a:1x3x8x8,b:1x1x16x16``). Entries
accumulate into the current set; an occurrence that names an input already in
the current set starts a new set. So for a one-input model every ``--shape``
is a set of its own, and for two inputs ``--shape a:.. --shape b:.. --shape
a:.. --shape b:..`` gives two sets. Inputs a set leaves out take the
reference's example shape, with dynamic dims of the same ONNX name following
the inputs that were given.

Value ranges (``--range NAME:LO,HI``, or several joined by commas as for
``--shape``: ``--range idx:0,4,x:-1,1``): that input's random values are drawn
from [LO, HI), in every random set.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import os
import re
import sys
from collections.abc import Callable, Iterable

from opbridge.backends import backend_names
from opbridge.cli._common import (
    FlagRule,
    add_ops_argument,
    arguments_as_flags,
    parse_dims,
    print_json_and_table,
    user_files,
)
from opbridge.errors import OpbridgeError
from opbridge.spec import valid_tolerance

__all__ = ["add_parser", "parse_ranges", "parse_shape_sets", "parse_tolerances"]

_SHAPE_HELP = (
    "input shape NAME:DIMS, e.g. x:1x3x256x256; several inputs joined by commas "
    "(a:1x3x8x8,b:1x1x16x16). Repeat for more sets: a name repeated within the "
    "current set starts a new set (repeatable)"
)

_EPILOG = """\
examples:
  opbridge verify model.onnx --reference model.py:make_model
  opbridge verify model.onnx --reference pkg.models:build --backend openvino \\
      --shape x:1x3x64x64 --shape x:2x3x96x128 --json report.json
  opbridge verify sr.onnx --reference sr.py:build \\
      --shape input:1x3x12x20,size_tensor:1x1x48x40 --shape input:3x3x24x24,size_tensor:3x1x17x13
  opbridge verify roi.onnx --reference roi.py:build --shape feats:2x8x16x16,rois:5x4,batch_index:5 \\
      --range batch_index:0,2

exit codes: 0 every output within tolerance, 1 a mismatch, 2 a usage or load error
(a backend that cannot run the model is reported and the others still run).
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify",
        help="run an ONNX model on every backend and compare it with PyTorch",
        description="Run MODEL on each backend at one or more input shapes and compare every output "
        "with the PyTorch reference model.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", metavar="MODEL.onnx", help="the exported ONNX model")
    p.add_argument(
        "--reference",
        required=True,
        metavar="FACTORY",
        help="PyTorch model factory path/to/file.py:fn or package.module:fn returning (model, example_inputs); "
        "its example inputs follow the ONNX model's input order",
    )
    p.add_argument(
        "--backend",
        action="append",
        default=[],
        metavar="NAME",
        help=f"backend to run: {', '.join(backend_names())} (repeatable; default: every installed one)",
    )
    p.add_argument("--shape", action="append", default=[], metavar="NAME:DIMS[,NAME:DIMS]", help=_SHAPE_HELP)
    p.add_argument(
        "--rtol",
        type=float,
        default=None,
        help="relative tolerance for every output (default: the loosest the model's custom ops declare, else 1e-3; "
        "2e-3 for float16, 1.6e-2 for bfloat16)",
    )
    p.add_argument(
        "--atol",
        type=float,
        default=None,
        help="absolute tolerance for every output (default: the loosest the model's custom ops declare, else 1e-5; "
        "1e-3 for float16, 8e-3 for bfloat16)",
    )
    p.add_argument(
        "--tol",
        action="append",
        default=[],
        metavar="OUTPUT:RTOL,ATOL",
        help="tolerance of one output, e.g. --tol logits:1e-2,1e-4 (repeatable; overrides --rtol/--atol)",
    )
    p.add_argument(
        "--inputs",
        metavar="FILE.npz",
        action="append",
        default=[],
        help="input arrays (one per model input, named like the inputs) used as a set; repeatable, these sets "
        "come first",
    )
    p.add_argument(
        "--range",
        action="append",
        default=[],
        metavar="NAME:LO,HI[,NAME:LO,HI]",
        help="draw input NAME's random values from [LO, HI): uniform floats, or the whole numbers there, e.g. "
        "--range idx:0,4 for an index into a dim of 4; several inputs joined by commas (repeatable; default: "
        "floats from a standard normal, integers in [0, 10))",
    )
    p.add_argument(
        "--export-shape-only",
        action="store_true",
        help="without --shape or --inputs, check the example's shapes only (by default a second set makes "
        "every dynamic dim larger, named dims that the example makes equal by different amounts)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument(
        "--json",
        metavar="FILE",
        default=None,
        help="write the whole record as JSON to FILE ('-': stdout, the table to stderr)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress messages on stderr")
    add_ops_argument(p)
    p.set_defaults(run=run)


_SPLIT = re.compile(r",(?=[^,:]+:)")


def parse_shape_sets(items: list[str]) -> list[dict[str, tuple[int, ...]]]:
    """``--shape`` occurrences -> shape sets (grouping rule in the module doc)."""
    sets: list[dict[str, tuple[int, ...]]] = []
    current: dict[str, tuple[int, ...]] = {}
    for item in items:
        entries = _SPLIT.split(item)
        names = []
        parsed: list[tuple[str, tuple[int, ...]]] = []
        for entry in entries:
            name, sep, dims = entry.rpartition(":")
            if not sep or not name or not dims:
                raise OpbridgeError(f"--shape {item!r}: write NAME:DIMS, e.g. x:1x3x256x256")
            parsed.append((name, parse_dims(dims, f"--shape {name}")))
            names.append(name)
        if len(set(names)) != len(names):
            raise OpbridgeError(f"--shape {item!r}: an input is named twice in one occurrence")
        if any(n in current for n in names):
            sets.append(current)
            current = {}
        current.update(parsed)
    if current:
        sets.append(current)
    return sets


def _named_pairs(
    items: Iterable[str], flag: str, convert: Callable[[str, str], tuple[float, float]], usage: str
) -> dict[str, tuple[float, float]]:
    """``NAME:A,B`` items -> ``{name: convert(a, b)}``: the name split at the last colon, a ValueError of
    ``convert`` (or another form) an OpbridgeError with ``usage``, a name given twice with other values too."""
    out: dict[str, tuple[float, float]] = {}
    for item in items:
        name, sep, rest = item.rpartition(":")
        parts = rest.split(",")
        try:
            if not sep or not name or len(parts) != 2:
                raise ValueError
            pair = convert(parts[0], parts[1])
        except ValueError:
            raise OpbridgeError(f"{flag} {item!r}: {usage}") from None
        if name in out and out[name] != pair:
            raise OpbridgeError(
                f"{flag} {name}: given twice ({out[name][0]:g},{out[name][1]:g} and {rest}); give it once."
            )
        out[name] = pair
    return out


def parse_tolerances(items: list[str]) -> dict[str, tuple[float, float]]:
    """``--tol OUTPUT:RTOL,ATOL`` occurrences -> ``{output: (rtol, atol)}``."""

    def tolerance(rtol_text: str, atol_text: str) -> tuple[float, float]:
        rtol, atol = float(rtol_text), float(atol_text)
        if not (valid_tolerance(rtol) and valid_tolerance(atol)):
            raise ValueError
        return rtol, atol

    return _named_pairs(
        items, "--tol", tolerance, "write OUTPUT:RTOL,ATOL with finite numbers >= 0, e.g. out:1e-3,1e-5"
    )


def parse_ranges(items: list[str]) -> dict[str, tuple[float, float]]:
    """``--range NAME:LO,HI[,NAME:LO,HI]`` occurrences -> ``{input: (lo, hi)}`` (whole numbers stay ints;
    verify checks the values against the model's inputs)."""
    return _named_pairs(
        (entry for given in items for entry in _SPLIT.split(given)),
        "--range",
        lambda lo, hi: (_number(lo), _number(hi)),
        "write NAME:LO,HI with two numbers, e.g. idx:0,4 (values are drawn from [LO, HI))",
    )


def _number(text: str) -> float:
    """``"4"`` -> 4 (an int, kept exact), ``"0.5"`` -> 0.5; ValueError otherwise."""
    try:
        return int(text)
    except ValueError:
        return float(text)


# How verify()'s errors name its arguments, and this command's flags for them: a key is a name's repr
# (tolerances['y']), a pair (lo, hi) or (rtol, atol) reads LO,HI and dims (1, 3) read 1x3 (() reads scalar).
_KEY = r"""(?P<key>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")"""
_PAIR = r"\((?P<a>[^,()]+), (?P<b>[^,()]+)\)"
_DIMS = r"(?P<dims>DIMS|\([^()]*\))"


def _key(match: re.Match[str]) -> str:
    return str(ast.literal_eval(match.group("key")))


def _dims(match: re.Match[str]) -> str:
    text = match.group("dims")
    if text == "DIMS":
        return text
    return "x".join(d.strip() for d in text.strip("()").split(",") if d.strip()) or "scalar"


def _pair(match: re.Match[str]) -> str:
    return f"{match.group('a')},{match.group('b')}" if match.group("a") is not None else ""


_VERIFY_FLAGS: list[FlagRule] = [
    (r"^shapes: ", "--shape "),
    (rf"shapes=\[\{{{_KEY}: {_DIMS}\}}\]", lambda m: f"--shape {_key(m)}:{_dims(m)}"),
    (r"^reference ", "--reference "),
    (rf"^inputs(?:\[\d+\])?(?:=| = ){_KEY}", lambda m: f"--inputs {_key(m)}"),
    (rf"inputs=\{{{_KEY}: array, \.\.\.\}}", "--inputs FILE.npz"),
    (rf"tolerances\[{_KEY}\](?: = {_PAIR})?", lambda m: f"--tol {_key(m)}" + (":" if m.group("a") else "") + _pair(m)),
    (rf"ranges\[{_KEY}\] = {_PAIR}", lambda m: f"--range {_key(m)}:{_pair(m)}"),
    (rf"ranges=\{{{_KEY}: {_PAIR}\}}", lambda m: f"--range {_key(m)}:{_pair(m)}"),
    (r"(?<![\w.(-])(?<!, )(?P<name>seed|rtol|atol)=", r"--\g<name> "),
]


class _Progress:
    """Progress messages on stderr: one updating line on a terminal, plain lines otherwise."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        # a terminal that takes the escape code that clears a line (not TERM=dumb)
        self.tty = sys.stderr.isatty() and os.environ.get("TERM", "") != "dumb"

    def __call__(self, message: str) -> None:
        if not self.enabled:
            return
        if self.tty:
            sys.stderr.write(f"\r\033[K... {message}")
        else:
            sys.stderr.write(f"... {message}\n")
        sys.stderr.flush()

    def done(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def run(args: argparse.Namespace) -> int:
    from opbridge._files import prepare_output
    from opbridge.verify import verify

    if args.json not in (None, "-"):  # a bad path (one of the files read, "") is named before the run
        prepare_output(args.json, protected=user_files(args))
    if args.export_shape_only and (args.shape or args.inputs):
        print("note: --export-shape-only changes nothing beside --shape or --inputs (no set is added)", file=sys.stderr)
    shapes = parse_shape_sets(args.shape)
    tolerances = parse_tolerances(args.tol)  # (--rtol and --atol are checked by verify itself)
    ranges = parse_ranges(args.range)  # (checked against the model's inputs by verify)
    progress = _Progress(not args.quiet)
    # with --json -, the pipe holds the JSON alone: what the user's modules print goes to stderr
    user_stdout = contextlib.redirect_stdout(sys.stderr) if args.json == "-" else contextlib.nullcontext()
    try:
        with user_stdout, arguments_as_flags(_VERIFY_FLAGS):  # verify()'s argument names, as this command's flags
            record = verify(
                args.model,
                args.reference,
                backends=args.backend or None,
                shapes=shapes or None,
                rtol=args.rtol,
                atol=args.atol,
                tolerances=tolerances or None,
                inputs=args.inputs or None,
                ranges=ranges or None,
                seed=args.seed,
                ops=args.ops,
                progress=progress,
                vary_dims=not args.export_shape_only,
            )
    finally:
        progress.done()
    if args.json == "-":
        print_json_and_table(record.to_dict(), record.table())
        return record.exit_code
    written = record.write_json(args.json) if args.json is not None else None  # before any output can fail
    print(record.table())
    if written is not None:
        print(f"record written to {written}", file=sys.stderr)
    return record.exit_code
