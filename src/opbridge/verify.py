"""``opbridge.verify``: run an exported model on every backend and compare it with PyTorch.

For each shape set, inputs are made once (seeded random data, or the arrays of
an ``.npz``), the PyTorch reference runs on them, then every backend runs the
ONNX model on the same values (each run gets its own copy of the arrays, so a
kernel that writes into its input cannot change what the next backend sees)
and each output is compared
(:func:`opbridge.compare.compare_arrays`). The result is a :class:`VerifyRecord`:
per backend and shape set, per output statistics, tolerance and verdict.

Shape sets: each is a dict ``{input name: dims}``. Inputs a set does not name
take the reference's example shape, with every dynamic dim whose ONNX name
(``dim_param``) a named input fixed taking that value (``batch`` given for one
input applies to every input whose dim is called ``batch``; two named inputs
that give one such dim different sizes are an error). Without shape sets or
input arrays, the example inputs' shapes are the first set, and (``vary_dims``)
the same with every dynamic dim larger the second (one larger; named dims of one size at the
example by one, two, three... so that they differ; an unnamed one each on its own; one the
model writes as an expression of others, ``2*n``, following them). A dim written as such an
expression is checked against the dims it reads, in a shape set and in the outputs.

Random values: floats from a standard normal, integers in [0, 10), bools at random; ``ranges``
gives an input its own interval ``[lo, hi)`` (uniform floats, or the whole numbers in it).

Tolerance of an output, first that applies: ``tolerances[output]``; ``rtol`` /
``atol`` given; the loosest tolerance that the custom ops it is computed from
declare (``OpSpec.tolerances``), with the default too where other ops round on the
way; the default (rtol 1e-3, atol 1e-5; looser for float16 and bfloat16, see ``_DEFAULTS``).

Exit code (:attr:`VerifyRecord.exit_code`): 0 when every comparison passed, 1
on a mismatch, 2 when a backend could not load or run the model (the other
backends still run), or when nothing was compared (no backend ran, or with no
PyTorch reference only one did).

Example:
    >>> import opbridge
    >>> record = opbridge.verify("model.onnx", reference="opbridge.examples.seeds:myselu_model",
    ...                          backends=["openvino"], shapes=[{"image": (1, 1, 5, 7)}])  # doctest: +SKIP
    >>> record.exit_code   # doctest: +SKIP
    0
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import logging
import math
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from opbridge._files import read_files
from opbridge.backends.base import ReferenceMismatchError, TensorMeta, format_shape, onnx_io_meta
from opbridge.compare import OutputComparison, compare_arrays, ml_float
from opbridge.errors import BackendUnavailableError, OpbridgeError, OpDefinitionError
from opbridge.model_io import load_model
from opbridge.spec import Tolerance, valid_tolerance

__all__ = [
    "BackendReport",
    "RunReport",
    "VerifyRecord",
    "make_inputs",
    "onnx_input_types",
    "resolve_shape_sets",
    "verify",
    "write_json_atomic",
]

logger = logging.getLogger(__name__)

ShapeSet = Mapping[str, Sequence[int]]
InputArrays = str | os.PathLike[str] | Mapping[str, Any]
Progress = Callable[[str], None]


@dataclass
class RunReport:
    """One backend on one shape set: its status and the comparison of each output."""

    backend: str
    shape_set: int
    status: str  # "pass" | "fail" | "error" | "reference" (the first backend when there is no PyTorch reference)
    outputs: list[OutputComparison] = field(default_factory=list)
    error: str = ""
    seconds: float = 0.0

    @property
    def max_abs(self) -> float | None:
        values = [o.abs.max for o in self.outputs if o.abs.max is not None]
        return max(values) if values else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "shape_set": self.shape_set,
            "status": self.status,
            "error": self.error,
            "seconds": round(self.seconds, 6),
            "outputs": [o.to_dict() for o in self.outputs],
        }


@dataclass
class BackendReport:
    """A backend's state.

    ``ran`` (``message``: a note on the paths it took, if any); ``error`` (unknown name, or it could
    not load the model, e.g. a custom op it cannot run); ``unavailable`` (requested but not installed);
    ``not installed`` (not requested, listed for information only). ``custom_ops``: how each custom op
    ran, e.g. ``"acme::Op (function body)"``, ``"acme::Op (numpy kernel)"``.
    """

    name: str
    status: str
    message: str = ""
    custom_ops: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "message": self.message, "custom_ops": self.custom_ops}


@dataclass
class VerifyRecord:
    """Everything :func:`verify` found; ``to_dict()`` is what ``--json`` writes."""

    model: str
    reference: str
    seed: int
    inputs: list[TensorMeta]
    shape_sets: list[dict[str, tuple[int, ...]]]
    tolerances: dict[str, tuple[Tolerance, str]]
    backends: list[BackendReport] = field(default_factory=list)
    runs: list[RunReport] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    set_origins: list[str] = field(default_factory=list)
    #: ``{input: (lo, hi)}``: the intervals the random values of those inputs were drawn from
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: the files verify read (model, input arrays, factory source, op files): never written over
    read_files: list[str] = field(default_factory=list, repr=False, compare=False)

    @property
    def passed(self) -> bool:
        return self.exit_code == 0

    @property
    def exit_code(self) -> int:
        """0 all passed, 1 a mismatch, 2 a backend error or nothing ran."""
        if (
            self.errors
            or not any(r.status in ("pass", "fail") for r in self.runs)
            or any(r.status == "error" for r in self.runs)
            or any(b.status in ("error", "unavailable") for b in self.backends)
        ):
            return 2
        if any(r.status == "fail" for r in self.runs):
            return 1
        return 0

    def failures(self) -> list[tuple[RunReport, OutputComparison]]:
        """Every (run, output) pair that did not pass."""
        return [(r, o) for r in self.runs for o in r.outputs if not o.passed]

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "reference": self.reference,
            "seed": self.seed,
            "passed": self.passed,
            "exit_code": self.exit_code,
            "inputs": [
                {"name": m.name, "dtype": str(m.dtype) if m.dtype is not None else None, "shape": list(m.shape or [])}
                for m in self.inputs
            ],
            "shape_sets": [{k: list(v) for k, v in s.items()} for s in self.shape_sets],
            "set_origins": list(self.set_origins),
            "ranges": {k: [lo, hi] for k, (lo, hi) in self.ranges.items()},
            "tolerances": {
                k: {"rtol": t.rtol, "atol": t.atol, "source": src} for k, (t, src) in self.tolerances.items()
            },
            "backends": [b.to_dict() for b in self.backends],
            "runs": [r.to_dict() for r in self.runs],
            "errors": list(self.errors),
            "notes": list(self.notes),
        }

    def write_json(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`to_dict` to ``path`` atomically (a temporary file renamed into place); a file
        verify read (the model, input arrays, the factory's source) is refused as ``path``."""
        return write_json_atomic(path, self.to_dict(), protected=self.read_files)

    def set_label(self, index: int) -> str:
        return ",".join(f"{k}:{format_shape(v)}" for k, v in self.shape_sets[index].items())

    def table(self) -> str:
        """A plain-text report: one row per backend, shape set and output, then the verdict."""
        lines = [f"model:     {self.model}", f"reference: {self.reference} (seed {self.seed})"]
        if self.ranges:
            lines.append("ranges:    " + " ".join(f"{k}:{lo},{hi}" for k, (lo, hi) in self.ranges.items()))
        for i in range(len(self.shape_sets)):
            origin = f"  ({self.set_origins[i]})" if i < len(self.set_origins) else ""
            lines.append(f"set {i + 1}:     {self.set_label(i)}{origin}")
        header = ("backend", "set", "output", "max abs", "mean abs", "p99 abs", "max rel", "rtol/atol", "result")
        rows: list[tuple[str, ...]] = []
        notes: list[str] = []
        for run in self.runs:
            if run.status == "reference":
                rows.append((run.backend, str(run.shape_set + 1), "-", "", "", "", "", "", "REFERENCE"))
                continue
            if run.status == "error" or (run.status == "fail" and not run.outputs):
                rows.append((run.backend, str(run.shape_set + 1), "-", "", "", "", "", "", run.status.upper()))
                notes.append(f"{run.backend} set {run.shape_set + 1}: {run.error}")
                continue
            for o in run.outputs:
                rows.append(
                    (
                        run.backend,
                        str(run.shape_set + 1),
                        o.name,
                        _num(o.abs.max),
                        _num(o.abs.mean),
                        _num(o.abs.p99),
                        _num(o.rel.max),
                        f"{o.rtol:g}/{o.atol:g}",
                        "PASS" if o.passed else "FAIL",
                    )
                )
                if o.note:
                    notes.append(f"{run.backend} set {run.shape_set + 1} {o.name}: {o.note}")
        lines.append("")
        lines.extend(_columns(header, rows))
        for b in self.backends:
            if b.status in ("error", "unavailable"):
                lines.append(f"error: {b.name}: {b.message}")
            elif b.status != "ran":
                lines.append(f"{b.name}: {b.status}" + (f" ({b.message})" if b.message else ""))
            elif b.message:  # a note on the paths it took
                lines.append(f"note: {b.name}: {b.message}")
            by_reference = [
                c.removesuffix(" (PyTorch reference)") for c in b.custom_ops if c.endswith("(PyTorch reference)")
            ]
            if b.status == "ran" and by_reference:
                lines.append(
                    f"note: {b.name} ran the PyTorch reference of {', '.join(by_reference)} as the kernel: its "
                    "numbers check the export and the runtime around the op, not a kernel of the op"
                )
        for note in notes:
            lines.append(f"  {note}")
        for note in self.notes:
            lines.append(f"note: {note}")
        for err in self.errors:
            lines.append(f"error: {err}")
        total = sum(len(r.outputs) for r in self.runs)
        failed = len(self.failures())
        verdict = {0: "PASS", 1: "FAIL", 2: "ERROR"}[self.exit_code]
        errors = (
            sum(r.status == "error" for r in self.runs)
            + len(self.errors)
            + sum(b.status in ("error", "unavailable") for b in self.backends)
        )
        # runs whose kernel result had another dtype or shape than the node's: failed, with no output compared
        refused = sum(r.status == "fail" and not r.outputs for r in self.runs)
        parts = [
            f"{total - failed} of {total} output comparison(s) within tolerance" if total else "no output compared"
        ]
        if refused:
            parts.append(f"{refused} run(s) whose kernel returned another dtype or shape than the node's")
        if errors:
            parts.append(f"{errors} error(s)")
        lines.append(f"{verdict}: " + ", ".join(parts))
        from opbridge._text import printable

        return "\n".join(printable(line) for line in lines)


def write_json_atomic(
    path: str | os.PathLike[str], data: Any, *, protected: Iterable[str | os.PathLike[str]] = ()
) -> Path:
    """Write ``data`` as JSON to ``path`` through a temporary file renamed into place (an
    :class:`~opbridge.errors.OutputPathError` names a path that cannot be written, or one of ``protected``)."""
    from opbridge._files import write_atomic

    text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    try:
        encoded = text.encode("utf-8")
    except UnicodeEncodeError:  # (a path whose bytes are not UTF-8 text: written as JSON escapes)
        encoded = (json.dumps(data, indent=2) + "\n").encode("ascii")
    return write_atomic(path, lambda fh: fh.write(encoded), protected=protected)


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def _columns(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*header).rstrip(), *(fmt.format(*r).rstrip() for r in rows)]


# --------------------------------------------------------------------------- shapes and inputs


def _argument_value(argument: str, value: str) -> str:
    """An argument and the value given for it as the errors name them: ``inputs='a.npz'``,
    ``inputs[1] = 'b.npz'`` (the command line's errors name its flag: ``--inputs a.npz``)."""
    return f"{argument}={value!r}" if "[" not in argument else f"{argument} = {value!r}"


def _whole_dims(name: str, given: Any) -> tuple[int, ...]:
    """``given`` (a shape set's dims for input ``name``) as ints >= 0, or an OpbridgeError saying how
    to write them."""
    import numbers

    ok = isinstance(given, (tuple, list)) and all(
        isinstance(d, numbers.Integral) and not isinstance(d, bool) and int(d) >= 0 for d in given
    )
    if not ok:
        raise OpbridgeError(
            f"shape set for {name!r}: {given!r}; give its dims as whole numbers >= 0, e.g. {{{name!r}: (1, 3, 64, 64)}} "
            "(on the command line: --shape NAME:1x3x64x64)."
        )
    return tuple(int(d) for d in given)


_DIM_CALLS: dict[str, Callable[..., Any]] = {
    "Min": min,
    "Max": max,
    "min": min,
    "max": max,
    "floor": math.floor,
    "ceiling": math.ceil,
    "FloorDiv": lambda a, b: a // b,
    "Mod": lambda a, b: a % b,
}


def _dim_expression(text: str) -> Any:
    """``text`` (a ``dim_param``) parsed, where it is an expression of other dims that torch.export writes
    (``2*n``, ``n + 1``, ``floor(n/2)``, ``Min(8192, seq)``); None where it is a plain name or no such
    expression."""
    import ast

    if text.isidentifier():
        return None
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError):
        return None
    allowed = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Name, ast.Load, ast.Call, ast.Constant)
    allowed_ops = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.USub, ast.UAdd)
    for node in ast.walk(tree):
        if isinstance(node, (ast.operator, ast.unaryop)):
            if not isinstance(node, allowed_ops):
                return None
        elif not isinstance(node, allowed):
            return None
        elif isinstance(node, ast.Call) and (
            not isinstance(node.func, ast.Name) or node.func.id not in _DIM_CALLS or node.keywords
        ):
            return None
        elif isinstance(node, ast.Constant) and (isinstance(node.value, bool) or not isinstance(node.value, int)):
            return None
    return tree


def _dim_names(tree: Any) -> set[str]:
    """The dims an expression of :func:`_dim_expression` reads."""
    import ast

    calls = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in calls}


def _dim_value(tree: Any, values: Mapping[str, int]) -> int | None:
    """An expression of :func:`_dim_expression` at ``values``; None where a dim it reads has no value, or
    its value is no whole number >= 0."""
    import ast
    from fractions import Fraction

    binary: dict[type, Callable[[Any, Any], Any]] = {
        ast.Add: lambda a, b: a + b,
        ast.Sub: lambda a, b: a - b,
        ast.Mult: lambda a, b: a * b,
        ast.Div: lambda a, b: Fraction(a) / b,
        ast.FloorDiv: lambda a, b: a // b,
        ast.Mod: lambda a, b: a % b,
        ast.Pow: lambda a, b: a**b if isinstance(b, int) and 0 <= b <= 64 else None,
    }

    def value(node: Any) -> Any:
        if isinstance(node, ast.Expression):
            return value(node.body)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return values.get(node.id)
        if isinstance(node, ast.UnaryOp):
            operand = value(node.operand)
            return None if operand is None else -operand if isinstance(node.op, ast.USub) else operand
        if isinstance(node, ast.BinOp):
            left, right = value(node.left), value(node.right)
            if left is None or right is None or (right == 0 and isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod))):
                return None
            return binary[type(node.op)](left, right)
        args = [value(a) for a in node.args]
        if any(a is None for a in args) or not args:
            return None
        return _DIM_CALLS[node.func.id](*args)

    try:
        result = value(tree)
    except (TypeError, ValueError, OverflowError, ZeroDivisionError):
        return None
    if result is None or result != int(result) or result < 0:
        return None
    return int(result)


def _solve_dims(pairs: Iterable[tuple[str, int]], values: dict[str, int]) -> None:
    """Bind in ``values`` the dims that expressions of one unbound dim (``2*n`` of size 8: ``n`` 4) give,
    from ``pairs`` (a ``dim_param``, its size); an expression with no whole solution binds nothing."""
    pending = [(tree, size) for text, size in pairs if (tree := _dim_expression(text)) is not None]
    progress = True
    while progress:
        progress = False
        for tree, size in pending:
            unknown = _dim_names(tree) - set(values)
            if len(unknown) != 1:
                continue
            (name,) = unknown
            for guess in range(1 << 16):  # (the smallest: floor(n/4) of 5 gives n 20)
                if _dim_value(tree, {**values, name: guess}) == size:
                    values[name] = guess
                    progress = True
                    break


def resolve_shape_sets(
    meta: Sequence[TensorMeta],
    sets: Sequence[ShapeSet] | None,
    example: Mapping[str, Sequence[int]] | None = None,
    *,
    given_as: str = "shapes:",
) -> list[dict[str, tuple[int, ...]]]:
    """Complete each shape set to every input (see the module doc); raise on a violated static dim.
    ``given_as`` names where the sets come from in the errors (``shapes: NAME:DIMS: ...``)."""
    by_name = {m.name: m for m in meta}
    out: list[dict[str, tuple[int, ...]]] = []
    for given in sets or [{}]:
        unknown = [n for n in given if n not in by_name]
        if unknown:
            raise OpbridgeError(
                f"{given_as} {unknown[0]}:...: the model has no input {unknown[0]!r}; its inputs are {list(by_name)}."
            )
        bound: dict[str, int] = {}
        bound_by: dict[str, str] = {}
        for name, given_dims in given.items():
            dims = _whole_dims(name, given_dims)
            m = by_name[name]
            if m.shape is not None:
                if len(dims) != len(m.shape):
                    raise OpbridgeError(
                        f"{given_as} {name}:{format_shape(dims)}: the model's input {name!r} has rank {len(m.shape)} "
                        f"({format_shape(m.shape)}); give {len(m.shape)} dims"
                        + (f" (on the command line: --shape {name}:scalar)." if not m.shape else ".")
                    )
                for axis, (d, want) in enumerate(zip(dims, m.shape)):
                    if isinstance(want, int) and d != want:
                        raise OpbridgeError(
                            f"{given_as} {name}:{format_shape(dims)}: dim {axis} of {name!r} is static {want} "
                            "in the model "
                            f"({format_shape(m.shape)}); only dynamic dims may change."
                        )
                    if isinstance(want, str):
                        if want in bound and bound[want] != d:
                            other = bound_by[want]
                            raise OpbridgeError(
                                f"{given_as} {name}:{format_shape(dims)}: dim {axis} of {name!r} is the named dim "
                                f"{want!r}, which {other}:{format_shape(tuple(given[other]))} sets to {bound[want]}; "
                                f"inputs that share a named dim must give it one size (make {want!r} {bound[want]} "
                                f"or {d} in both)."
                            )
                        bound.setdefault(want, d)
                        bound_by.setdefault(want, name)
        # dims the model writes as expressions of others (2*n): solved for the dims they read, then checked
        plain = {k: v for k, v in bound.items() if k.isidentifier()}
        _solve_dims(bound.items(), plain)
        for want, d in bound.items():
            tree = _dim_expression(want)
            should = None if tree is None else _dim_value(tree, plain)
            unknown_dims = set() if tree is None else _dim_names(tree) - set(plain)
            if len(unknown_dims) == 1:  # (_solve_dims found no whole size for it)
                name = bound_by[want]
                raise OpbridgeError(
                    f"{given_as} {name}:{format_shape(tuple(given[name]))}: the model declares a dim of {name!r} as "
                    f"{want!r}, and no whole {next(iter(unknown_dims))} makes it {d}; give it a size it can take."
                )
            if should is not None and should != d:
                name = bound_by[want]
                reads = ", ".join(f"{k} {plain[k]}" for k in sorted(_dim_names(tree)))
                raise OpbridgeError(
                    f"{given_as} {name}:{format_shape(tuple(given[name]))}: the model declares a dim of {name!r} as "
                    f"{want!r}, which is {should} with {reads}; give it {should}, or sizes of the dims it reads "
                    "that make it this size."
                )
        full: dict[str, tuple[int, ...]] = {}
        for m in meta:
            if m.name in given:
                full[m.name] = tuple(int(d) for d in given[m.name])
                continue
            start = list(example[m.name]) if example and m.name in example else None
            if m.shape is None:
                if start is None:
                    raise OpbridgeError(
                        f"input {m.name!r} has an unknown shape; give it with shapes=[{{{m.name!r}: DIMS}}]."
                    )
                full[m.name] = tuple(start)
                continue
            resolved: list[int] = []
            for axis, want in enumerate(m.shape):
                if isinstance(want, int):
                    resolved.append(want)
                elif isinstance(want, str) and want in bound:
                    resolved.append(bound[want])
                elif isinstance(want, str) and want in plain:
                    resolved.append(plain[want])
                elif (
                    isinstance(want, str)
                    and (tree := _dim_expression(want)) is not None
                    and (size := _dim_value(tree, plain)) is not None
                ):
                    resolved.append(size)
                elif start is not None and axis < len(start):
                    resolved.append(int(start[axis]))
                else:
                    example_dims = tuple(d if isinstance(d, int) else 4 for d in m.shape)
                    raise OpbridgeError(
                        f"input {m.name!r} dim {axis} ({want or '?'}) is dynamic and has no size; give it with "
                        f"shapes=[{{{m.name!r}: DIMS}}] (the model declares {format_shape(m.shape)}: e.g. "
                        f"shapes=[{{{m.name!r}: {example_dims!r}}}])."
                    )
            full[m.name] = tuple(resolved)
        _check_expressions_against_filled(meta, given, full, given_as)
        out.append(full)
    return out


def _check_expressions_against_filled(
    meta: Sequence[TensorMeta], given: ShapeSet, full: Mapping[str, tuple[int, ...]], given_as: str
) -> None:
    """An error where a given input's dim that the model writes as an expression (``2*n``) disagrees with
    the dims it reads as the completed set has them (``n`` from another input left at the example's size)."""
    sizes: dict[str, int] = {}
    for m in meta:
        for want, d in zip(m.shape or (), full.get(m.name, ())):
            if isinstance(want, str) and want.isidentifier():
                sizes.setdefault(want, int(d))
    for m in meta:
        if m.name not in given or m.shape is None:
            continue
        for want, d in zip(m.shape, full[m.name]):
            tree = _dim_expression(want) if isinstance(want, str) else None
            should = None if tree is None else _dim_value(tree, sizes)
            if should is not None and should != d:
                reads = ", ".join(f"{k} {sizes[k]}" for k in sorted(_dim_names(tree)))
                raise OpbridgeError(
                    f"{given_as} {m.name}:{format_shape(tuple(given[m.name]))}: the model declares a dim of "
                    f"{m.name!r} as {want!r}, which is {should} with {reads} (the inputs this set leaves out keep "
                    "the example's sizes); give it "
                    f"{should}, or give the inputs holding {', '.join(sorted(_dim_names(tree)))} sizes that make it {d}."
                )


def make_inputs(
    meta: Sequence[TensorMeta],
    shapes: Mapping[str, Sequence[int]],
    seed: int,
    onnx_types: Mapping[str, str] | None = None,
    ranges: Mapping[str, tuple[float, float]] | None = None,
) -> dict[str, np.ndarray]:
    """Seeded random arrays for ``meta`` at ``shapes``: normal floats, ints in [0, 10), random bools.

    ``ranges`` (``{input: (lo, hi)}``) draws an input's values from ``[lo, hi)`` instead: uniform
    floats, or the whole numbers there, uniformly.

    An input whose ``dtype`` is None is float32, unless ``onnx_types`` names its ONNX type
    (e.g. ``{"s": "string"}``, see :func:`onnx_input_types`): such an input is refused,
    its values must come from ``--inputs FILE.npz``.
    """
    ranges = _value_ranges(meta, ranges, onnx_types)
    rng = np.random.default_rng(seed)
    feed: dict[str, np.ndarray] = {}
    for m in meta:
        shape = tuple(shapes[m.name])
        if m.dtype is None and onnx_types and onnx_types.get(m.name) == "bfloat16":
            raise OpbridgeError(_bfloat16_refusal(m.name))
        if m.dtype is None and onnx_types and m.name in onnx_types:
            raise OpbridgeError(
                f"input {m.name!r} has ONNX type {onnx_types[m.name]}, which verify cannot fill with random values; "
                f"give its values with --inputs FILE.npz (inputs=), e.g. numpy.savez(path, {m.name}=numpy.array(...))."
            )
        dtype = m.dtype if m.dtype is not None else np.dtype(np.float32)
        _check_size(m.name, shape, dtype)
        span = ranges.get(m.name)
        if dtype.kind == "f" and span is not None:
            bottom, top = _float_span(dtype, *span)
            feed[m.name] = np.clip(rng.uniform(span[0], span[1], size=shape).astype(dtype), bottom, top)
        elif dtype.kind == "f":
            feed[m.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind in "iu" and span is not None:
            feed[m.name] = rng.integers(math.ceil(span[0]), math.ceil(span[1]), size=shape, dtype=dtype)
        elif dtype.kind in "iu":
            feed[m.name] = rng.integers(0, 10, size=shape).astype(dtype)
        elif dtype.kind == "b":
            feed[m.name] = rng.random(shape) < 0.5
        else:
            raise OpbridgeError(
                f"input {m.name!r} has dtype {dtype}; give its values with inputs={{{m.name!r}: array, ...}}."
            )
    return feed


_TORCH_IS_THE_REFERENCE = (
    "backend 'torch' is the PyTorch reference (--reference, reference=) that every backend is compared with, not "
    "a backend to compare: leave it out of --backend (backends=)."
)

# the largest random input verify makes (a shape set's typo, 99999999999x3, failed with numpy's MemoryError)
_MAX_INPUT_BYTES = 16 << 30


def _check_size(name: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
    """An OpbridgeError where the input's random values would take more than :data:`_MAX_INPUT_BYTES`."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > _MAX_INPUT_BYTES:
        raise OpbridgeError(
            f"input {name!r} at {format_shape(shape)} would take {nbytes / 2**30:.3g} GiB of random {dtype} values, "
            f"more than verify makes ({_MAX_INPUT_BYTES >> 30} GiB): give a smaller shape (shapes=[{{{name!r}: DIMS}}]), "
            f"or its values with inputs={{{name!r}: array, ...}}."
        )


def _value_ranges(
    meta: Sequence[TensorMeta],
    ranges: Mapping[str, Any] | None,
    onnx_types: Mapping[str, str] | None = None,
) -> dict[str, tuple[float, float]]:
    """``ranges`` (``{input: (lo, hi)}``) checked against the model's inputs, or an OpbridgeError naming
    the range at fault: finite bounds, ``lo < hi``, a numeric input, and values of its dtype in
    ``[lo, hi)`` (an integer input needs a whole number there). Whole-number bounds stay ints."""
    import numbers

    if ranges is None:
        return {}
    if not isinstance(ranges, Mapping):
        raise OpbridgeError(
            f"ranges={ranges!r}: give a dict of input name to (lo, hi), e.g. ranges={{'idx': (0, 4)}} "
            "(on the command line: --range idx:0,4)."
        )
    by_name = {m.name: m for m in meta}
    out: dict[str, tuple[float, float]] = {}
    for name, given in ranges.items():
        pair = list(given) if isinstance(given, (tuple, list)) else []
        if len(pair) != 2 or not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in pair):
            raise OpbridgeError(
                f"ranges[{name!r}] = {given!r}: give a pair (lo, hi) of numbers, e.g. ranges={{{name!r}: (0, 4)}} "
                f"(on the command line: --range {name}:0,4)."
            )
        lo, hi = (int(v) if isinstance(v, numbers.Integral) else float(v) for v in pair)
        flag = f"ranges[{name!r}] = ({lo!r}, {hi!r})"
        if name not in by_name:
            raise OpbridgeError(f"{flag}: the model has no input {name!r}; its inputs are {list(by_name)}.")
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise OpbridgeError(f"{flag}: give finite bounds, e.g. ranges={{{name!r}: (-1, 1)}}.")
        if not lo < hi:
            raise OpbridgeError(
                f"{flag}: values are drawn from [LO, HI), so LO must be below HI, e.g. ranges={{{name!r}: ({lo!r}, {lo + 1!r})}}."
            )
        m = by_name[name]
        dtype = m.dtype
        if dtype is None and not (onnx_types and name in onnx_types):
            dtype = np.dtype(np.float32)  # (as make_inputs fills it)
        if dtype is None or dtype.kind not in "fiu":
            raise OpbridgeError(
                f"{flag}: input {name!r} is {dtype if dtype is not None else onnx_types[name]}"  # type: ignore[index]
                "; a range applies to integer and floating-point inputs only."
            )
        if dtype.kind in "iu":
            first, end = math.ceil(lo), math.ceil(hi)
            if first >= end:
                raise OpbridgeError(
                    f"{flag}: input {name!r} is {dtype}, and [{lo}, {hi}) holds no whole number; give a range that "
                    f"does, e.g. ranges={{{name!r}: ({math.floor(lo)}, {math.floor(lo) + 1})}}."
                )
            info = np.iinfo(dtype)
            if first < info.min or end - 1 > info.max:
                raise OpbridgeError(
                    f"{flag}: input {name!r} is {dtype}, which holds {info.min} to {info.max}; give a range inside it."
                )
        else:
            limit = float(np.finfo(dtype).max)
            if max(abs(lo), abs(hi)) > limit:
                raise OpbridgeError(
                    f"{flag}: input {name!r} is {dtype}, whose values reach +-{limit:g}; give a range inside it."
                )
            if not math.isfinite(float(hi) - float(lo)):  # (numpy's uniform draws lo + (hi - lo) * u)
                raise OpbridgeError(
                    f"{flag}: its width, {hi} - {lo}, is beyond float64's range, in which verify draws the values; "
                    f"give a range of width up to {np.finfo(np.float64).max:g}, e.g. "
                    f"ranges={{{name!r}: ({lo / 2:g}, {hi / 2:g})}}."
                )
            bottom, top = _float_span(dtype, lo, hi)
            if float(bottom) > float(top):
                raise OpbridgeError(f"{flag}: no {dtype} value lies in [{lo}, {hi}); give a wider range.")
        out[name] = (lo, hi)
    return out


def _float_span(dtype: np.dtype[Any], lo: float, hi: float) -> tuple[np.floating[Any], np.floating[Any]]:
    """The smallest and the largest ``dtype`` values in ``[lo, hi)`` (values drawn in float64 are clipped
    to them: rounding to ``dtype`` must not reach ``hi``)."""
    kind = dtype.type
    bottom, top = kind(lo), kind(hi)
    if float(bottom) < lo:
        bottom = np.nextafter(bottom, kind(np.inf))
    if float(top) >= hi:
        top = np.nextafter(top, kind(-np.inf))
    return bottom, top


def onnx_input_types(model: Any, meta: Sequence[TensorMeta]) -> dict[str, str]:
    """``{input: ONNX type name}`` for the inputs of ``meta`` that have no numpy dtype but a known
    ONNX type (``"string"``, ``"bfloat16"``, ``"sequence"``...); undefined types are left out."""
    import onnx

    graph_inputs = {vi.name: vi.type for vi in model.graph.input}
    out: dict[str, str] = {}
    for m in meta:
        if m.dtype is not None or m.name not in graph_inputs:
            continue
        tp = graph_inputs[m.name]
        kind = tp.WhichOneof("value")
        if kind == "tensor_type":
            if tp.tensor_type.elem_type:
                out[m.name] = onnx.TensorProto.DataType.Name(tp.tensor_type.elem_type).lower()
        elif kind:
            out[m.name] = kind.removesuffix("_type")
    return out


def _bfloat16_refusal(name: str) -> str:
    return (
        f"input {name!r} is bfloat16, which verify does not feed (numpy has no bfloat16, and neither the PyTorch "
        "reference nor the backends take its arrays from numpy): export the model in float32 (or float16), or cast "
        "the input to bfloat16 inside the model."
    )


def load_npz(
    source: str | os.PathLike[str] | Mapping[str, Any], meta: Sequence[TensorMeta], *, given_as: str = "inputs"
) -> dict[str, np.ndarray]:
    """Arrays for every input from an ``.npz`` (or a dict); raise naming a missing or mistyped input.
    ``given_as``: how the errors name it (the Python argument, e.g. ``inputs[1]``; a file's path follows)."""
    if isinstance(source, Mapping):
        arrays = {k: np.asarray(v) for k, v in source.items()}
        where = given_as
        missing_fix = "Give one array per input, e.g. {%r: array, ...}."
    else:
        where = _argument_value(given_as, str(source))
        if not os.path.exists(source):
            raise OpbridgeError(f"{where}: no such file; give the path of an .npz file of the inputs.")
        import zipfile

        unreadable = (OSError, ValueError, EOFError, zipfile.BadZipFile)
        try:
            loaded = np.load(source, allow_pickle=False)
        except PermissionError as exc:
            raise OpbridgeError(f"{where}: cannot read it ({exc.strerror}); fix its permissions.") from None
        except unreadable as exc:
            raise OpbridgeError(
                f"{where}: cannot read it as .npz (not a numpy archive: {type(exc).__name__}); save the "
                "arrays with numpy.savez(path, NAME=array, ...)."
            ) from None
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise OpbridgeError(
                f"{where}: a single array (.npy), not an archive of arrays by input name; save them with "
                "numpy.savez(path, NAME=array, ...)."
            )
        with loaded as data:
            arrays = {}
            for k in data.files:
                try:
                    arrays[k] = data[k]
                except unreadable as exc:  # a damaged member, or one of Python objects (pickled)
                    raise OpbridgeError(
                        f"{where}: cannot read its array {k!r} ({type(exc).__name__}: {_one_line(exc)}); save "
                        "numeric arrays with numpy.savez(path, NAME=array, ...) (no object arrays)."
                    ) from None
        missing_fix = "Save one array per input, e.g. numpy.savez(path, %s=...)."
    for m in meta:
        if m.name not in arrays:
            held = "the dict holds" if isinstance(source, Mapping) else "it holds"
            raise OpbridgeError(
                f"{where}: no array named {m.name!r}; {held} {sorted(arrays)}, the model takes "
                f"{[x.name for x in meta]}. {missing_fix % (m.name,)}"
            )
        if arrays[m.name].dtype.name == "bfloat16":  # (ml_dtypes' numpy dtype)
            raise OpbridgeError(_bfloat16_refusal(m.name))
        if m.dtype is not None and arrays[m.name].dtype != m.dtype:
            if isinstance(source, Mapping):
                raise OpbridgeError(
                    f"{where}[{m.name!r}] is {arrays[m.name].dtype}, the model expects {m.dtype}; give it as "
                    f"{m.dtype} (array.astype(numpy.{m.dtype}))."
                )
            raise OpbridgeError(f"{where}: array {m.name!r} is {arrays[m.name].dtype}, the model expects {m.dtype}.")
    extra = sorted(set(arrays) - {m.name for m in meta})
    if extra:
        # (the file's path or the Python argument: a warning the command line shows too)
        logger.warning(
            "%s: ignoring arrays %s that are not model inputs",
            given_as if isinstance(source, Mapping) else source,
            extra,
        )
    return {m.name: arrays[m.name] for m in meta}


# --------------------------------------------------------------------------- tolerances


# Standard ops that only move, select or compare values: a backend gives them bit for bit what
# their inputs hold, so they add no rounding of their own to an output's tolerance (a Cast to a
# narrower floating-point dtype excepted: _narrows).
_EXACT_OPS = frozenset(
    {
        "Abs", "And", "ArgMax", "ArgMin", "Cast", "CastLike", "Ceil", "Clip", "Concat", "Constant",
        "ConstantOfShape", "DepthToSpace", "Dropout", "Equal", "Expand", "Flatten", "Floor", "Gather",
        "GatherElements", "GatherND", "Greater", "GreaterOrEqual", "Identity", "If", "Less", "LessOrEqual",
        "Loop", "Max", "Min", "Neg", "NonZero", "Not", "Or", "Pad", "Relu", "Reshape", "Round", "Scan", "Shape",
        "Sign", "Size", "Slice", "SpaceToDepth", "Split", "Squeeze", "Tile", "TopK", "Transpose", "Unsqueeze",
        "Where", "Xor",
    }
)  # fmt: skip


# The bytes of each floating-point dtype (numpy's names, ml_dtypes' for bfloat16 and the float8 types).
_FLOAT_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}


def _float_bytes(dtype: str) -> int | None:
    return _FLOAT_BYTES.get(dtype, 1 if dtype.startswith("float8") else None)


def _narrows(source: str, target: str) -> bool:
    """Whether a cast from ``source`` to ``target`` rounds floating-point values to fewer bits (float32 to
    float16, say): an error within the wider dtype's tolerance may then flip the last bit of the narrower
    one."""
    wide = _float_bytes(source)
    return wide is not None and (_float_bytes(target) or wide) < wide


# Inputs whose values do not reach the values of the op's output (None: every input): an op that
# reads only its input's shape (Shape, Size, EyeLike, the random ...Like ops), a shape given as a tensor
# (Reshape, Expand, Tile, ConstantOfShape), a condition (Where, If, Compress), which picks whole elements
# or a branch, indices (Gather*, Scatter*, OneHot), which pick whole elements, and an op whose output is
# an index (ArgMax, ArgMin, NonZero): a wrong one is no rounding that a tolerance describes. Their
# upstream ops' tolerances stay there.
_NO_VALUE_INPUTS: dict[str, frozenset[int] | None] = {
    # every input: shapes only, or indices computed from the inputs' values
    **dict.fromkeys(
        ("Shape", "Size", "EyeLike", "RandomNormalLike", "RandomUniformLike", "ConstantOfShape", "ArgMax", "ArgMin",
         "NonZero"),
        None,
    ),
    # input 1: a shape, a condition or indices
    **dict.fromkeys(
        ("Reshape", "Expand", "Tile", "Compress", "Gather", "GatherElements", "GatherND", "Scatter", "ScatterElements",
         "ScatterND"),
        frozenset({1}),
    ),
    "Where": frozenset({0}),  # the condition
    "If": frozenset({0}),
    "OneHot": frozenset({0, 1}),  # indices and depth
}  # fmt: skip

# Outputs that are indices (a position, not a value computed from the inputs' values): their values
# take no upstream op's tolerance, as a wrong index is no rounding; the op's other outputs keep theirs.
_INDEX_OUTPUTS: dict[str, frozenset[int]] = {"TopK": frozenset({1}), "Unique": frozenset({1, 2, 3})}

# The default tolerance per dtype (any other: Tolerance()): for the low-precision floats, rtol twice their
# epsilon (2 to 4 units in the last place) and atol one unit in the last place at 1.0 (float16's epsilon
# is 2**-10 ~ 9.8e-4, bfloat16's 2**-7 ~ 7.8e-3).
_DEFAULTS: dict[str, Tolerance] = {
    "float16": Tolerance(rtol=2e-3, atol=1e-3),
    "bfloat16": Tolerance(rtol=1.6e-2, atol=8e-3),
}


def _default_tolerance(dtypes: Iterable[str]) -> tuple[Tolerance, str]:
    """The loosest default of ``dtypes`` (see ``_DEFAULTS``) and the dtype it is for ("" for Tolerance())."""
    best, which = Tolerance(), ""
    for dtype in dtypes:
        tol = _DEFAULTS.get(dtype)
        if tol is not None and (tol.rtol, tol.atol) > (best.rtol, best.atol):
            best, which = tol, dtype
    return best, which


@dataclass
class _Upstream:
    """What computes one model output: the custom ops whose declared tolerance covers it (qualname ->
    that tolerance) and whether anything else rounds on the way (standard arithmetic, or a custom op
    that declares no tolerance for its dtype), in which case the default tolerance applies too
    (``rounds_in``: the dtypes of those ops' outputs; ``dtype``: the output's own)."""

    declared: dict[str, Tolerance] = field(default_factory=dict)
    other: list[str] = field(default_factory=list)
    rounds_in: set[str] = field(default_factory=set)
    dtype: str = "float32"

    def add(self, part: _Upstream) -> None:
        """Take in what computes ``part`` (a declared tolerance met twice: the loosest)."""
        for qualname, tol in part.declared.items():
            had = self.declared.get(qualname)
            self.declared[qualname] = (
                tol if had is None else Tolerance(max(had.rtol, tol.rtol), max(had.atol, tol.atol))
            )
        self.other.extend(part.other)
        self.other = list(dict.fromkeys(self.other))[:4]  # (reports name three, then "...")
        self.rounds_in |= part.rounds_in


def _upstream(model: Any, outputs: Sequence[TensorMeta]) -> dict[str, _Upstream]:
    """Per model output, the ops it depends on (:class:`_Upstream`), found by walking the graph back
    from it: through If/Loop/Scan bodies and into calls of model-local functions that are not an
    opbridge op's own body; from each op output to the inputs whose values it is computed from
    (``_NO_VALUE_INPUTS``)."""
    from opbridge.backends._custom import STANDARD_DOMAINS, domain_versions
    from opbridge.definition import find_op
    from opbridge.model_io import elem_types, walk_nodes

    graph = model.graph
    versions = domain_versions(model)
    functions = {(f.domain, f.name): f for f in model.functions}
    producer = {name: node for node in graph.node for name in node.output if name}
    custom_outputs = [
        name for n in walk_nodes(graph.node) if n.domain not in STANDARD_DOMAINS for name in n.output if name
    ]
    types = elem_types(model, custom_outputs)

    def dtype_of(value: str, fallback: str) -> str:
        import onnx

        code = types.get(value)
        if not code:
            return fallback
        try:
            return str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(code)))
        except Exception:
            return fallback

    def classify(
        node: Any, fallback: str, found: _Upstream, seen_functions: frozenset[Any], which: Sequence[int] | None = None
    ) -> None:
        """``node``'s own part in ``found``: for its outputs ``which`` (None: all of them)."""
        key = (node.domain, node.op_type)
        for inner in (n for a in node.attribute for n in _subgraph_nodes(a)):  # (classify walks their own)
            classify(inner, fallback, found, seen_functions)
        names = [node.output[i] for i in which] if which is not None else [o for o in node.output if o]
        dtypes = list(dict.fromkeys(dtype_of(name, fallback) for name in names)) or [fallback]
        if node.domain in STANDARD_DOMAINS and key not in functions:
            from opbridge.legacy_domain import is_standard_op

            if is_standard_op(node.op_type):
                if node.op_type not in _EXACT_OPS:
                    found.other.append(node.op_type)
                    found.rounds_in.update(dtypes)
                return
        opdef = find_op(node.domain, node.op_type, versions.get(node.domain)) if node.domain else None
        if opdef is None and key in functions and key not in seen_functions:  # a plain model-local function
            for inner in functions[key].node:
                classify(inner, fallback, found, seen_functions | {key})
            return
        for dtype in dtypes:
            if opdef is not None and dtype in opdef.spec.tolerances:
                found.add(_Upstream({opdef.spec.qualname: opdef.spec.tolerances[dtype]}))
            else:
                found.other.append(f"{node.domain}::{node.op_type}" if node.domain else node.op_type)
                found.rounds_in.add(dtype)

    def _narrowing_cast(node: Any, value: str, fallback: str) -> bool:
        return (
            node.domain in STANDARD_DOMAINS
            and node.op_type in ("Cast", "CastLike")
            and _narrows(dtype_of(node.input[0], fallback), dtype_of(value, fallback))
        )

    def value_inputs(node: Any) -> list[str]:
        """The inputs of ``node`` whose values reach its outputs' values."""
        skipped = _NO_VALUE_INPUTS.get(node.op_type, frozenset()) if node.domain in STANDARD_DOMAINS else frozenset()
        if skipped is None:
            return []
        return [v for i, v in enumerate(node.input) if i not in skipped]

    def reads(node: Any) -> list[str]:
        """The values ``node`` is computed from, its If/Loop/Scan bodies' reads from outside included."""
        names = [
            *value_inputs(node),
            *(i for n in itertools.islice(walk_nodes([node]), 1, None) for i in value_inputs(n)),
        ]
        return [v for v in dict.fromkeys(names) if v in producer]

    # What computes each node's inputs (once per node: walking back from every output anew was quadratic
    # where a model exposes many blocks' outputs), and each value (its producer's own part for that output)
    inputs_of: dict[tuple[int, str], _Upstream] = {}
    values: dict[tuple[str, str], _Upstream] = {}

    def of_value(value: str, fallback: str) -> _Upstream:
        key = (value, fallback)
        if key not in values:
            node = producer[value]
            found = _Upstream()
            index = list(node.output).index(value)
            classify(node, fallback, found, frozenset(), [index])
            if not (node.domain in STANDARD_DOMAINS and index in _INDEX_OUTPUTS.get(node.op_type, ())):
                upstream = inputs_of.get((id(node), fallback), _Upstream())  # (absent only in a cycle)
                if (upstream.declared or upstream.other) and _narrowing_cast(node, value, fallback):
                    # an error within the wider dtype's tolerance may flip the narrower one's last bit (a cast
                    # of exact values rounds alike everywhere)
                    found.other.append(node.op_type)
                    found.rounds_in.add(dtype_of(value, fallback))
                found.add(upstream)
            values[key] = found
        return values[key]

    def summary(root: str, fallback: str) -> _Upstream:
        stack, busy = [(producer[root], False)], set()
        while stack:
            node, ready = stack.pop()
            key = (id(node), fallback)
            if key in inputs_of:
                continue
            deps = [producer[v] for v in reads(node)]
            if not ready:
                busy.add(id(node))
                stack.append((node, True))
                stack.extend((d, False) for d in deps if (id(d), fallback) not in inputs_of and id(d) not in busy)
                continue
            found = _Upstream()
            for value in reads(node):
                if (id(producer[value]), fallback) in inputs_of:  # (absent only in a cycle, which the checker refuses)
                    found.add(of_value(value, fallback))
            inputs_of[key] = found
        return of_value(root, fallback)

    out: dict[str, _Upstream] = {}
    for o in outputs:
        fallback = dtype_of(o.name, str(o.dtype) if o.dtype is not None else "float32")
        found = _Upstream() if o.name not in producer else summary(o.name, fallback)
        out[o.name] = dataclasses.replace(found, dtype=fallback)
    return out


def _shape_sets_argument(shapes: Any) -> list[ShapeSet] | None:
    """``shapes`` as a list of sets (one dict is one set), or an OpbridgeError showing the form."""
    if shapes is None:
        return None
    sets = [shapes] if isinstance(shapes, Mapping) else shapes
    if isinstance(sets, (str, bytes)) or not all(isinstance(s, Mapping) for s in sets):
        raise OpbridgeError(
            f"shapes={shapes!r}: give a list of sets, each a dict of input name to dims, e.g. "
            "shapes=[{'x': (1, 3, 64, 64)}] (on the command line: --shape x:1x3x64x64)."
        )
    return list(sets)


def _check_inputs_argument(inputs: Any) -> None:
    """An OpbridgeError where ``inputs`` is not an .npz path, a dict of arrays, or a list of them."""
    for item in inputs if isinstance(inputs, (list, tuple)) else [inputs]:
        if item is not None and not isinstance(item, (str, os.PathLike, Mapping)):
            raise OpbridgeError(
                f"inputs: a {type(item).__name__} is neither an .npz path nor a dict of arrays by input name; "
                "give e.g. inputs={'x': array} (or a list of such, one per input set)."
            )


def _subgraph_nodes(attr: Any) -> list[Any]:
    """The nodes of an attribute's graph(s): an If/Loop/Scan body (none for other attributes)."""
    graphs = [attr.g] if attr.HasField("g") else list(attr.graphs)
    return [n for g in graphs for n in g.node]


def _output_tolerances(
    model: Any,
    outputs: Sequence[TensorMeta],
    tolerances: Mapping[str, Any] | None,
    rtol: float | None,
    atol: float | None,
    *,
    checks_only: bool = False,
    low_defaults: dict[str, str] | None = None,
) -> dict[str, tuple[Tolerance, str]]:
    """Each output's tolerance and where it comes from; ``checks_only``: only refuse bad arguments (the
    graph walk, which runs shape inference, is left out); ``low_defaults`` (filled where given): each
    output whose tolerance is, in part, the default of a low-precision dtype, and that dtype."""
    import numbers

    given: dict[str, Tolerance] = {}
    for k, v in (tolerances or {}).items():
        if not isinstance(v, Tolerance) and not (isinstance(v, (tuple, list)) and len(v) == 2):
            raise OpbridgeError(
                f"tolerances[{k!r}] = {v!r}: give a Tolerance or a pair (rtol, atol), e.g. "
                f"tolerances={{{k!r}: (1e-3, 1e-5)}} (on the command line: --tol {k}:1e-3,1e-5)."
            )
        try:
            given[k] = v if isinstance(v, Tolerance) else Tolerance(*v)
        except (TypeError, ValueError) as exc:
            shown = tuple(v) if isinstance(v, (tuple, list)) else v  # (a list reads as the pair it is)
            raise OpbridgeError(f"tolerances[{k!r}] = {shown!r}: {exc}") from None
    for value, keyword in ((rtol, "rtol"), (atol, "atol")):
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
            raise OpbridgeError(  # (only the Python API passes a non-number)
                f"{keyword}={value!r}: give a number, e.g. {keyword}=1e-3 (on the command line: --{keyword} 1e-3)."
            )
        if value is not None and not valid_tolerance(value):
            raise OpbridgeError(
                f"{keyword}={value!r}: a tolerance must be a finite number >= 0 (an infinite one would pass any "
                f"value), e.g. {keyword}=1e-3"
            )
    unknown = sorted(set(given) - {o.name for o in outputs})
    if unknown:
        raise OpbridgeError(
            f"tolerances[{unknown[0]!r}]: the model has no output {unknown[0]!r}; "
            f"its outputs are {[o.name for o in outputs]}."
        )
    upstream = {} if checks_only else _upstream(model, outputs)
    out: dict[str, tuple[Tolerance, str]] = {}
    for o in outputs:
        if o.dtype is not None and o.dtype.kind in "biuUSO":  # compared exactly, whatever was asked
            if o.name in given:
                raise OpbridgeError(
                    f"tolerances[{o.name!r}] = {(given[o.name].rtol, given[o.name].atol)!r}: output {o.name!r} is "
                    f"{o.dtype}, which verify compares "
                    "exactly; tolerances apply to floating-point outputs."
                )
            out[o.name] = (Tolerance(0.0, 0.0), f"exact ({o.dtype} output)")
            continue
        if o.name in given:
            out[o.name] = (given[o.name], "--tol")
            continue
        if checks_only:
            continue
        found = upstream[o.name]
        hits = sorted(found.declared.items())
        # the default of the output's dtype, or of a lower precision that an op on the way rounds in
        default, low = _default_tolerance([found.dtype, *sorted(found.rounds_in)])
        base, source = default, f"default for {low}" if low else "default"
        if hits:
            # the loosest of the ops on the way; the default too where anything else rounds there
            tols = [t for _, t in hits] + ([default] if found.other else [])
            base = Tolerance(max(t.rtol for t in tols), max(t.atol for t in tols))
            source = "declared by " + ", ".join(q for q, _ in hits)
            if found.other:
                others = list(dict.fromkeys(found.other))
                named = f"{', '.join(others[:3])}{', ...' if len(others) > 3 else ''}"
                source += f"; default for {low} ({named})" if low else f"; default for {named}"
        if low and (not hits or found.other) and low_defaults is not None and (rtol is None or atol is None):
            low_defaults[o.name] = low
        if rtol is not None and atol is not None:
            out[o.name] = (Tolerance(rtol, atol), "--rtol/--atol")
        elif rtol is not None:  # the other one stays what would apply without the flag
            out[o.name] = (Tolerance(rtol, base.atol), f"--rtol; atol {source}")
        elif atol is not None:
            out[o.name] = (Tolerance(base.rtol, atol), f"--atol; rtol {source}")
        else:
            out[o.name] = (base, source)
    return out


# --------------------------------------------------------------------------- the run


def _describe_reference(reference: Any) -> str:
    if reference is None:
        return "the first backend"
    if isinstance(reference, str):
        return reference
    return type(reference[0]).__name__ if isinstance(reference, tuple) else type(reference).__name__


def verify(
    model: Any,
    reference: str | tuple[Any, Any] | None = None,
    *,
    backends: Sequence[str] | None = None,
    shapes: Sequence[ShapeSet] | ShapeSet | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    tolerances: Mapping[str, Tolerance | tuple[float, float]] | None = None,
    inputs: InputArrays | Sequence[InputArrays] | None = None,
    ranges: Mapping[str, tuple[float, float]] | None = None,
    seed: int = 0,
    ops: Sequence[str] | None = None,
    progress: Progress | None = None,
    vary_dims: bool = True,
) -> VerifyRecord:
    """Run ``model`` on ``backends`` and compare every output with the PyTorch reference.

    Args:
        model: ONNX model (path, bytes or ModelProto).
        reference: model factory ``file.py:fn`` / ``module:fn`` returning ``(model, example_inputs)``,
            or such a pair; ``None`` compares every backend with the first one that runs.
        backends: backend names (``backend_names()``); default every installed ONNX backend.
        shapes: shape sets, each ``{input: dims}`` (see the module doc); one dict is one set.
        rtol, atol: tolerance for every output (overrides declared tolerances).
        tolerances: per-output ``Tolerance`` or ``(rtol, atol)``; overrides the rest.
        inputs: ``.npz`` path or dict of arrays, or a list of them: the first input sets, in order.
        ranges: ``{input: (lo, hi)}``: draw that input's random values from ``[lo, hi)`` (uniform floats,
            or the whole numbers there) instead of a standard normal (floats) or ``[0, 10)`` (integers).
        seed: seed of the random inputs (set ``i`` uses ``[seed, i]``).
        ops: ``--ops`` targets to import first (files or modules defining ops/kernels).
        progress: called with a short message as each backend and set starts.
        vary_dims: with a PyTorch reference and neither ``shapes`` nor ``inputs``, add a second set
            with every dynamic dim of the model larger than in the example (one larger, 2 where it is 1;
            named dims the example makes equal grow by one, two... so that they differ).

    Returns:
        The :class:`VerifyRecord`. Raises :class:`~opbridge.errors.OpbridgeError` for
        usage errors that stop everything (unreadable model, factory that fails,
        bad shape, missing input array); backend failures are recorded instead.

    Example:
        >>> import os, tempfile, torch, opbridge
        >>> @opbridge.op("doc.verify::Halve")
        ... def halve(x: torch.Tensor) -> torch.Tensor:
        ...     return x / 2
        >>> class Model(torch.nn.Module):
        ...     def forward(self, x):
        ...         return halve(x)
        >>> x = torch.randn(2, 3)
        >>> path = os.path.join(tempfile.mkdtemp(), "model.onnx")
        >>> _ = opbridge.export(Model(), (x,), path, exporter="torchscript")
        >>> record = opbridge.verify(path, (Model(), (x,)), backends=["reference"])
        >>> record.passed, [r.status for r in record.runs if r.backend == "reference"]
        (True, ['pass'])
    """
    from opbridge._loading import load_ops
    from opbridge.backends import BACKENDS, available_backends, backend_names, get_backend
    from opbridge.backends.torch_backend import TorchRunner

    say = progress or (lambda _msg: None)
    import numbers

    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or int(seed) < 0:
        raise OpbridgeError(f"seed={seed!r}: the seed is a whole number >= 0, e.g. seed=0")
    seed = int(seed)
    if isinstance(backends, str):  # one backend by name, not its letters
        backends = [backends]
    if backends is not None and not backends:  # (None is every installed one; an unknown name is reported)
        raise OpbridgeError(
            f"backends=[] names no backend; choose from {backend_names()}, or None for every installed one."
        )
    if backends is not None and "torch" in backends:
        raise OpbridgeError(_TORCH_IS_THE_REFERENCE)
    if isinstance(ops, str):  # one target, not its letters
        ops = [ops]
    shapes = _shape_sets_argument(shapes)
    _check_inputs_argument(inputs)
    load_ops(list(ops) if ops else None)
    proto = load_model(model)
    meta, out_meta = onnx_io_meta(proto)
    # each output's dims as the file declares them: a size, a name (bound by the inputs' dims of that name at
    # each set), or None (unknown)
    declared = {m.name: tuple(m.shape) for m in out_meta if m.shape is not None}
    model_name = str(model) if isinstance(model, (str, os.PathLike)) else f"<{type(model).__name__}>"
    _output_tolerances(proto, out_meta, tolerances, rtol, atol, checks_only=True)  # named before anything runs
    onnx_types = onnx_input_types(proto, meta)
    value_ranges = _value_ranges(meta, ranges, onnx_types)

    torch_ref: TorchRunner | None = None
    example: dict[str, tuple[int, ...]] | None = None
    if reference is not None:
        say("loading the PyTorch reference")
        torch_ref = TorchRunner(reference, meta, [o.name for o in out_meta])
        try:
            torch_ref.load()
        except OpbridgeError:
            raise
        except Exception as exc:  # the user's factory or model constructor raised
            raise OpbridgeError(
                f"reference {_describe_reference(reference)}: building the PyTorch model raised "
                f"{type(exc).__name__}: {_one_line(exc)}"
            ) from exc
        # (a Python number given for a graph input is a scalar of it)
        example = {
            m.name: tuple(int(d) for d in getattr(t, "shape", ())) for m, t in zip(meta, torch_ref.example_inputs)
        }
    # (after the reference's factory ran: the ops it defines declare their tolerances)
    low_defaults: dict[str, str] = {}
    tol = _output_tolerances(proto, out_meta, tolerances, rtol, atol, low_defaults=low_defaults)

    feeds: list[dict[str, np.ndarray]] = []
    sets: list[dict[str, tuple[int, ...]]] = []
    origins: list[str] = []
    given_arrays = [] if inputs is None else list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
    for k, source in enumerate(given_arrays):
        # (named as the Python argument, a file with its path: the command line names its flag)
        label = f"inputs[{k}]" if isinstance(inputs, (list, tuple)) else "inputs"
        feed = load_npz(source, meta, given_as=label)
        where = str(source) if isinstance(source, (str, os.PathLike)) else "arrays"
        # the arrays' shapes against the model's, as --shape sets are
        resolve_shape_sets(
            meta,
            [{m.name: tuple(feed[m.name].shape) for m in meta}],
            example,
            given_as=f"{_argument_value(label, where)}: array" if where != "arrays" else f"{label}: array",
        )
        feeds.append(feed)
        sets.append({k: tuple(v.shape) for k, v in feed.items()})
        origins.append(f"--inputs {where}" if where != "arrays" else "the arrays given")
    varied: dict[str, tuple[int, int]] = {}
    unnamed: list[str] = []  # the varied dims that have no name in the model, each varied on its own
    if shapes or not given_arrays:
        wanted = list(shapes or [])
        if not wanted and example is not None and vary_dims:
            grown, varied = _varied_dims(meta, example)
            wanted = [{}, grown] if varied else []
            named = {d for m in meta for d in m.shape or () if isinstance(d, str) and d}
            unnamed = [d for d in varied if d not in named]
        for full in resolve_shape_sets(meta, wanted or None, example):
            feeds.append(make_inputs(meta, full, _set_seed(seed, len(feeds)), onnx_types, value_ranges))
            sets.append(full)
            origins.append(f"random (seed {seed}, set {len(feeds)})")
        if varied:
            origins[-1] += ": the example's dynamic dims varied, " + ", ".join(
                f"{d}{' (unnamed)' if d in unnamed else ''} {a}->{b}" for d, (a, b) in varied.items()
            )

    names = list(dict.fromkeys(backends)) if backends else None  # each backend once, in the order given
    record = VerifyRecord(
        model_name, _describe_reference(reference), seed, meta, sets, tol, set_origins=origins, ranges=value_ranges
    )
    drawn = len(feeds) - len(given_arrays)  # the random sets, after the arrays' own
    if value_ranges and not drawn:
        record.notes.append(
            f"--range {', '.join(value_ranges)}: every set comes from --inputs, so no value was drawn at random "
            "and the ranges changed nothing"
        )
    record.read_files = read_files(model, reference, given_arrays, ops)
    out_names = [o.name for o in out_meta]
    for out_name in dict.fromkeys(n for n in out_names if out_names.count(n) > 1):
        places = [i for i, n in enumerate(out_names) if n == out_name]
        record.notes.append(
            f"output {out_name!r} is listed at positions {places} of the model's outputs: one value, compared once"
        )
    if names is None:
        installed = available_backends()
        for n in backend_names():
            if n not in installed:
                record.backends.append(BackendReport(n, "not installed", BACKENDS[n].unavailable_reason() or ""))
        names = installed
    if not names:
        record.errors.append(f"no backend to run; install one of {backend_names()}.")
        return record

    expected: list[dict[str, np.ndarray] | str] = []
    for i, feed in enumerate(feeds):
        if torch_ref is None:
            expected.append({})
            continue
        say(f"torch reference, set {i + 1}/{len(feeds)}")
        try:
            expected.append(torch_ref.infer(_copy_feed(feed)))
        except Exception as exc:
            failure = f"the PyTorch reference failed: {type(exc).__name__}: {_one_line(exc)}"
            expected.append(failure)
            # (float values drawn as an earlier random set's were, on which the reference ran, are less suspect)
            floats_too = all(isinstance(expected[j], str) for j in range(len(given_arrays), i))
            # (an op that disagrees with its own definition, its shape rule with its reference say, or a reference
            # that does not match the file, is wrong at any shape and whatever the values)
            definition = isinstance(exc, (OpDefinitionError, ReferenceMismatchError))
            hint = (
                _range_hint(meta, value_ranges, floats=floats_too) if i >= len(given_arrays) and not definition else ""
            )
            where = f"set {i + 1} ({record.set_label(i)})"
            # (a set the caller did not ask for: said, not an error)
            if varied and i == len(feeds) - 1 and not definition:
                # the reference failed on the example's shapes too: the random values are at fault, not the dims
                values_at_fault = i > 0 and isinstance(expected[i - 1], str)
                record.notes.append(
                    f"{where}, the example's dynamic dims varied: {failure.rstrip('.')}; not compared "
                    + (
                        f"(the reference failed on set {i} too, at the example's shapes: the random values are at "
                        "fault, not the shapes)."
                        if values_at_fault
                        else "(where the model does not take these shapes, give the ones it takes with --shape, or "
                        "leave this set out with --export-shape-only; the random values may be at fault instead)."
                    )
                    + (
                        f" The model names no dim for {', '.join(unnamed)}, so each grew on its own; where some must "
                        "be equal, give shapes that keep them so with --shape, or name the dims at export "
                        "(dynamic_shapes=, dynamic_axes=)."
                        if unnamed and not values_at_fault
                        else ""
                    )
                    + hint
                )
            else:
                record.errors.append(f"{where}: {failure.rstrip('.')}; no backend was compared on it." + hint)
            continue
        _check_reference_values(record, i, expected[-1], tol)  # type: ignore[arg-type]

    bound = [_bound_declarations(declared, meta, feed) for feed in feeds]  # (the same for every backend)
    for name in names:
        try:
            if name == "torch":
                raise OpbridgeError(_TORCH_IS_THE_REFERENCE)
            runner_cls: Any = get_backend(name)  # an ONNX runner: takes the model
        except OpbridgeError as exc:
            record.backends.append(BackendReport(name, "error", str(exc)))
            continue
        say(f"{name}: loading")
        try:
            runner = runner_cls(proto)
            runner.load()
        except BackendUnavailableError as exc:
            # Named by the caller: an error. Picked by default: only listed, like an uninstalled one.
            status = "not installed" if backends is None else "unavailable"
            record.backends.append(BackendReport(name, status, _strip(name, exc)))
            continue
        except Exception as exc:
            record.backends.append(BackendReport(name, "error", _strip(name, exc)))
            continue
        used = getattr(runner, "custom_ops", None)
        if used is None:
            used = [f"{k.qualname} ({k.source})" for k in getattr(runner, "kernels", [])]
        notes = list(getattr(runner, "notes", []))
        record.backends.append(BackendReport(name, "ran", "; ".join(notes), custom_ops=sorted(set(used))))
        try:
            for i, feed in enumerate(feeds):
                if isinstance(expected[i], str):  # the reference failed on this set: said once, above
                    continue
                say(f"{name}: set {i + 1}/{len(feeds)} {record.set_label(i)}")
                record.runs.append(_run_one(runner, name, i, feed, expected, tol, bound[i], low_defaults))
                if record.runs[-1].status == "reference":  # (the first backend's outputs are the reference)
                    _check_reference_values(record, i, expected[i], tol, f"the reference ({name}'s output)")  # type: ignore[arg-type]
        finally:
            runner.close()
    if torch_ref is not None:
        try:
            _check_reference_repeats(record, torch_ref, feeds, expected, tol, say)
        finally:
            torch_ref.close()
    ran = [b.name for b in record.backends if b.status == "ran"]
    if torch_ref is None and len(ran) == 1 and any(r.status == "reference" for r in record.runs):
        record.errors.append(
            f"nothing to compare against: with no PyTorch reference the first backend to run ({ran[0]}) only gives "
            "the reference outputs; pass reference=(model, example_inputs) or a factory, or name a second backend."
        )
    return record


def _range_hint(meta: Sequence[TensorMeta], ranges: Mapping[str, tuple[float, float]], *, floats: bool = True) -> str:
    """Sentences naming the inputs drawn from the default distributions (integers from [0, 10), floats
    from a standard normal unless ``floats`` is False), for a reference that failed on random values (an
    index, a size or a box out of bounds, often); empty where there are none."""

    def which(names: list[str]) -> str:
        return f"input {names[0]!r} was" if len(names) == 1 else f"inputs {', '.join(map(repr, names))} were"

    def flag(names: list[str]) -> str:
        return names[0] if len(names) == 1 else "NAME"

    drawn = [m for m in meta if m.name not in ranges]
    ints = [m.name for m in drawn if m.dtype is not None and m.dtype.kind in "iu"]
    reals = [m.name for m in drawn if m.dtype is not None and m.dtype.kind == "f"] if floats else []
    parts = []
    if ints:
        parts.append(
            f" The integer {which(ints)} drawn from [0, 10): where one is an index or a size, give the values it "
            f"takes with --range {ints[0]}:LO,HI (ranges=)."
        )
    if reals:
        parts.append(
            f" The floating-point {which(reals)} drawn from a standard normal (negative values too): where one "
            f"holds indices, sizes or boxes, give the values it takes with --range {flag(reals)}:LO,HI (ranges=)."
        )
    if not parts:
        return ""
    return "".join(parts) + " Or give the inputs' values with --inputs FILE.npz (inputs=)."


def _varied_dims(
    meta: Sequence[TensorMeta], example: Mapping[str, Sequence[int]]
) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, int]]]:
    """The example's shapes with every dynamic dim one larger (2 where it is 1), and ``{dim: (example
    size, new size)}`` (empty where the model has no dynamic dim). A named dim grows alike in every
    input; named dims of one size at the example grow by 1, 2, 3... in the order met, so that no two stay
    equal (an op that mixes up ``h`` and ``w`` passes on a square example); one the model writes as an
    expression of others (``2*n``) follows them (``n`` 3 to 4: 6 to 8); an unnamed one (no ``dim_param``)
    grows by 1 on its own, keyed ``"NAME dim AXIS"``."""

    def larger(size: int) -> int:
        return size + 1 if size > 1 else 2

    shaped = [m for m in meta if m.shape is not None and m.name in example and len(example[m.name]) == len(m.shape)]
    named = [(d, int(n)) for m in shaped for d, n in zip(m.shape, example[m.name]) if isinstance(d, str) and d]  # type: ignore[arg-type]
    at_example: dict[str, int] = {}
    for d, n in named:
        if d.isidentifier():
            at_example.setdefault(d, n)
    _solve_dims(named, at_example)  # (a dim only expressions read: 2*n of 6, n 3)
    at_new: dict[str, int] = {}
    for d, n in at_example.items():  # (in the order met: inputs, then axes)
        at_new[d] = larger(n) + sum(1 for e in at_new if at_example[e] == n)
    varied: dict[str, tuple[int, int]] = {}
    grown: dict[str, tuple[int, ...]] = {}
    for m in shaped:
        dims = list(example[m.name])
        for axis, want in enumerate(m.shape):  # type: ignore[arg-type]
            if isinstance(want, int):
                continue
            key = want if isinstance(want, str) and want else f"{m.name} dim {axis}"
            if key not in varied:
                tree = _dim_expression(key) if key == want else None
                new: int | None
                if key == want and key in at_new and at_example[key] == dims[axis]:
                    new = at_new[key]
                elif tree is not None and _dim_value(tree, at_example) == dims[axis]:
                    new = _dim_value(tree, at_new)
                else:
                    new = None
                varied[key] = (dims[axis], larger(dims[axis]) if new is None else new)
            dims[axis] = varied[key][1]
        if dims != list(example[m.name]):
            grown[m.name] = tuple(dims)
    return grown, varied


def _check_reference_values(
    record: VerifyRecord,
    index: int,
    want: Mapping[str, np.ndarray],
    tol: Mapping[str, tuple[Tolerance, str]],
    source: str = "the PyTorch reference",
) -> None:
    """Name the outputs of set ``index`` whose comparison proves nothing: every reference value NaN
    (an error: nothing compared), no element at all, or every value within atol of zero (notes: only
    the shape is compared; zeros would pass). ``source``: what gave the reference values, in words."""
    for name, value in want.items():
        array = np.asarray(value)
        where = f"set {index + 1} ({record.set_label(index)}) output {name!r}"
        if array.size == 0:
            record.notes.append(
                f"{where}: {source} is empty ({format_shape(array.shape)}), so only its shape "
                "and dtype are compared; give shapes at which it has elements with --shape (shapes=)."
            )
            continue
        if ml_float(array.dtype):  # (bfloat16, float8: numpy's nan and abs do not take them)
            array = array.astype(np.float32)
        if array.dtype.kind not in "fc":
            continue
        if np.isnan(array).all():
            record.errors.append(
                f"{where}: every value of {source} is NaN, so nothing of it is compared; give inputs "
                "in the ops' domain with --inputs FILE.npz (inputs=)."
            )
            continue
        rtol, atol = dataclasses.astuple(tol.get(name, (Tolerance(), ""))[0])
        largest = float(np.nanmax(np.abs(array)))
        if largest == 0.0 < atol:
            record.notes.append(
                f"{where}: every value of {source} is 0, so any value within atol {atol:g} of zero would pass; give "
                f"atol 0 to ask for zeros, e.g. --tol {name}:{rtol:g},0."
            )
        elif largest <= atol:
            record.notes.append(
                f"{where}: every value of {source} is within atol {atol:g} of zero (the largest {largest:.3g}), so zeros "
                f"would pass; give a smaller atol, e.g. --tol {name}:{rtol:g},{largest / 100:.1g}."
            )


def _check_reference_repeats(
    record: VerifyRecord,
    torch_ref: Any,
    feeds: Sequence[dict[str, np.ndarray]],
    expected: Sequence[dict[str, np.ndarray] | str],
    tol: Mapping[str, tuple[Tolerance, str]],
    say: Progress,
) -> None:
    """Where a backend failed on a set, run the PyTorch reference on it again: a reference that does
    not repeat its own numbers is named, since the failures may be its own."""
    failed_sets = sorted({r.shape_set for r in record.runs if r.status == "fail"})
    for i in failed_sets:
        first = expected[i]
        if isinstance(first, str) or not first:
            continue
        say(f"torch reference again, set {i + 1}")
        try:
            again = torch_ref.infer(_copy_feed(feeds[i]))
        except Exception as exc:
            record.notes.append(
                f"set {i + 1}: the PyTorch reference failed when run again ({type(exc).__name__}: {_one_line(exc)})"
            )
            continue
        for name, value in first.items():
            tolerance = tol.get(name, (Tolerance(), ""))[0]
            repeat = compare_arrays(again.get(name, np.asarray([])), value, tolerance, name)
            if not repeat.passed:
                record.notes.append(
                    f"set {i + 1} output {name!r}: the PyTorch reference gives other numbers when run again on the "
                    f"same inputs ({repeat.reason}): it is not deterministic, so the failures on this set may be "
                    "its own; make it deterministic (a fixed seed inside it, or eval mode) or compare it with a "
                    "tolerance that covers its spread."
                )


def _copy_feed(feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A copy of every array of ``feed``: each run gets arrays of its own to read (or scribble on)."""
    return {k: np.array(v, copy=True) for k, v in feed.items()}


def _set_seed(seed: int, index: int) -> int:
    return int(np.random.SeedSequence([seed, index]).generate_state(1)[0])


def _bound_declarations(
    declared: Mapping[str, tuple[Any, ...]], inputs: Sequence[Any], feed: Mapping[str, Any]
) -> dict[str, tuple[tuple[int | None, ...], str]]:
    """Each output's declared dims at ``feed``: a named dim takes the size the inputs' dims of that name
    have there (``seq`` of an input fed 9000 rows is 9000 in the outputs too); (sizes, the declaration in
    words)."""
    binding: dict[str, int] = {}
    for m in inputs:
        if m.shape is not None and m.name in feed:
            for dim, size in zip(m.shape, np.shape(feed[m.name])):
                if isinstance(dim, str):
                    binding.setdefault(dim, int(size))
    plain = {k: v for k, v in binding.items() if k.isidentifier()}
    _solve_dims(binding.items(), plain)
    for dims in declared.values():  # an output dim written as an expression of the inputs' (2*n, Min(8192, seq))
        for d in dims:
            if isinstance(d, str) and d not in binding and (tree := _dim_expression(d)) is not None:
                size = _dim_value(tree, plain)
                if size is not None:
                    binding[d] = size
    out: dict[str, tuple[tuple[int | None, ...], str]] = {}
    for name, dims in declared.items():
        sizes = tuple(d if isinstance(d, int) else binding.get(d) if isinstance(d, str) else None for d in dims)
        shown = "x".join(
            str(d) if isinstance(d, int) else f"{d}(={binding[d]})" if d in binding else str(d or "?") for d in dims
        )
        out[name] = (sizes, shown)
    return out


def _against_declared(comparison: OutputComparison, shape: tuple[int, ...], declared: Any) -> OutputComparison:
    """``comparison`` failed where the output's shape is not the one the model declares (static dims, and
    named dims the inputs bind)."""
    if declared is None or not comparison.passed:
        return comparison
    declared, shown = declared
    if len(declared) == len(shape) and all(d is None or d == n for d, n in zip(declared, shape)):
        return comparison
    return dataclasses.replace(
        comparison,
        passed=False,
        reason=(
            f"the model declares this output as {shown or 'a scalar'}, but it is {'x'.join(map(str, shape))} here: "
            "a runtime that trusts the declaration (TensorRT, say) sizes it wrong; declare the op's shape rule "
            "(register_shape) and export again"
        ),
    )


def _run_one(
    runner: Any,
    name: str,
    index: int,
    feed: dict[str, np.ndarray],
    expected: list[dict[str, np.ndarray] | str],
    tol: Mapping[str, tuple[Tolerance, str]],
    declared: Mapping[str, tuple[tuple[int | None, ...], str]] | None = None,
    low_defaults: Mapping[str, str] | None = None,
) -> RunReport:
    ref = expected[index]
    assert not isinstance(ref, str), "a set whose reference failed is not run"
    start = time.perf_counter()
    try:
        got = runner.infer(_copy_feed(feed))
    except Exception as exc:
        text = _strip(name, exc) if isinstance(exc, OpbridgeError) else f"{type(exc).__name__}: {_one_line(exc)}"
        # a kernel's result of another dtype or shape than the node's is a wrong result: a failure, not an error
        status = "fail" if _WRONG_RESULT.search(text) else "error"
        return RunReport(name, index, status, error=text, seconds=time.perf_counter() - start)
    seconds = time.perf_counter() - start
    if not ref:  # no PyTorch reference: the first backend to run becomes it
        # (copied: a kernel that hands back a buffer it keeps rewrites it in the next set's run)
        expected[index] = copy.deepcopy(got)
        return RunReport(name, index, "reference", seconds=seconds)
    outputs: list[OutputComparison] = []
    for out_name, want in ref.items():
        tolerance = tol.get(out_name, (Tolerance(), "default"))[0]
        if out_name not in got:
            outputs.append(
                OutputComparison(
                    out_name,
                    False,
                    f"output missing from {name}'s results {sorted(got)}",
                    tolerance.rtol,
                    tolerance.atol,
                    tuple(want.shape),
                    (),
                    str(want.dtype),
                    "",
                )
            )
            continue
        compared = compare_arrays(got[out_name], want, tolerance, out_name)
        compared = _against_declared(compared, tuple(np.shape(want)), (declared or {}).get(out_name))
        # (NaN in both counts as equal: where every element is, nothing was compared)
        if compared.passed and compared.total and compared.nan_both == compared.total:
            compared = dataclasses.replace(
                compared, passed=False, reason="every value of the reference is NaN: nothing compared"
            )
        low = (low_defaults or {}).get(out_name)
        if low and not compared.passed and compared.mismatched:
            compared = dataclasses.replace(
                compared,
                reason=f"{compared.reason}; the default for {low} applied: where this is the rounding of a "
                f"{low} op, declare its tolerance (@opbridge.op(..., tolerances={{{low!r}: Tolerance(rtol, "
                f"atol)}})) or give the output one with --tol {out_name}:RTOL,ATOL (tolerances=)",
            )
        outputs.append(compared)
    status = "pass" if all(o.passed for o in outputs) else "fail"
    return RunReport(name, index, status, outputs, seconds=seconds)


# How each backend's bridge refuses a kernel's result of another dtype or shape than the node's
# (ONNX Runtime's bridge and the reference session: "output 0 has dtype float64, but the node's output
# type is float32"; OpenVINO's ops: "returned shape 1x3x8 for output 0, but ...").
_WRONG_RESULT = re.compile(
    r"output \d+ (\([^)]*\) )?has (dtype|shape) .+, but |returned (dtype|shape) .+ for output \d+, but "
)


def _strip(name: str, exc: BaseException) -> str:
    text = _one_line(exc)
    return text[len(name) + 2 :] if text.startswith(f"{name}: ") else text


def _one_line(exc: BaseException, limit: int = 500) -> str:
    text = " ".join(str(exc).split())
    return text[:limit] if text else type(exc).__name__
