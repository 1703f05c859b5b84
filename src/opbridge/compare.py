"""Numerical comparison of one backend's output with the reference's.

:func:`compare_arrays` returns an :class:`OutputComparison`: the verdict, the
tolerance used and statistics (max / mean / median / p99) of the absolute and
relative errors. The rules:

* **Pass criterion** (per element, as ``numpy.isclose``):
  ``|actual - expected| <= atol + rtol * |expected|``. Every element must pass.
* **Shapes and dtypes** must be equal; a difference fails with its reason.
* **Integer and bool outputs** are compared exactly (rtol = atol = 0), in
  integer arithmetic: int64 / uint64 values beyond 2**53 that differ by 1 fail.
* **Complex outputs**: the error is the modulus ``|actual - expected|``, so the
  real and the imaginary part both count. NaN is placed per part: ``nan+0j``
  against ``0+nanj`` fails; where the NaN parts match, the other part is
  compared on its own (``nan+1j`` against ``nan+2j`` fails).
* **String outputs** are compared by value, element by element; numpy's
  ``<U`` strings and object arrays of ``str`` compare equal when their values do.
* **Tolerances** are finite (see :class:`~opbridge.spec.Tolerance`); an element
  whose bound is not a number (NaN) fails.
* **NaN**: NaN on one side only always fails. NaN on both sides at the same
  position counts as agreement (the reference produced it too), is left out of
  the statistics, and is reported in ``nan_both`` and in the table's note, so it
  never passes unseen.
* **inf**: an infinity must be matched by an infinity of the same sign at the
  same position; matched infinities are left out of the statistics and counted
  in ``inf_both``.
* **Relative error** is ``|actual - expected| / |expected|``; where the
  reference is 0 it is undefined, so those positions are left out of the
  relative statistics (their count is ``zero_reference``) and only ``atol``
  decides them. Statistics over no element are ``None``.

Example:
    >>> import numpy as np
    >>> from opbridge.compare import compare_arrays
    >>> r = compare_arrays(np.array([1.0, 2.001]), np.array([1.0, 2.0]))
    >>> r.passed, round(r.abs.max, 6)
    (True, 0.001)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from opbridge.spec import Tolerance

__all__ = ["ErrorStats", "OutputComparison", "compare_arrays", "jsonable", "ml_float"]


@dataclass(frozen=True)
class ErrorStats:
    """Summary of an error array; every field is ``None`` when no element was measured."""

    max: float | None = None
    mean: float | None = None
    median: float | None = None
    p99: float | None = None

    @classmethod
    def of(cls, values: np.ndarray) -> ErrorStats:
        if values.size == 0:
            return cls()
        v = values.astype(np.float64, copy=False)
        # (an error that overflows to inf, -max against max: interpolating next to it gives inf - inf, NaN)
        if np.isfinite(v).all():
            median, p99 = np.quantile(v, [0.5, 0.99])
        else:
            median, p99 = np.quantile(v, [0.5, 0.99], method="higher")
        return cls(float(v.max()), float(v.mean()), float(median), float(p99))


@dataclass(frozen=True)
class OutputComparison:
    """The comparison of one output: verdict, tolerance, error statistics and counts."""

    name: str
    passed: bool
    reason: str
    rtol: float
    atol: float
    shape: tuple[int, ...]
    actual_shape: tuple[int, ...]
    dtype: str
    actual_dtype: str
    abs: ErrorStats = field(default_factory=ErrorStats)
    rel: ErrorStats = field(default_factory=ErrorStats)
    total: int = 0
    mismatched: int = 0
    nan_both: int = 0
    nan_mismatched: int = 0
    inf_both: int = 0
    inf_mismatched: int = 0
    zero_reference: int = 0
    worst_index: tuple[int, ...] | None = None
    worst_actual: float | int | complex | str | None = None
    worst_expected: float | int | complex | str | None = None

    @property
    def note(self) -> str:
        """A short note for tables: the failure reason, or what passed only by rule (NaN)."""
        if not self.passed:
            return self.reason
        if self.nan_both:
            return f"{self.nan_both} NaN in both (counted as equal)"
        return ""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (NaN/inf floats written as strings)."""
        return jsonable(asdict(self))


def jsonable(value: Any) -> Any:
    """``value`` (dicts, lists, tuples, scalars) with NaN and infinite floats as the strings "nan",
    "inf" and "-inf", and complex numbers as strings ("(1+2j)"): JSON has no such numbers.

    >>> jsonable({"e": [float("nan"), 1.0]})
    {'e': ['nan', 1.0]}
    """
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, complex):
        return str(value)
    return value


def _fmt(v: float | int | complex | str) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, complex):
        return f"({v.real:.6g}{v.imag:+.6g}j)"
    return repr(v) if isinstance(v, str) else str(v)


def compare_arrays(
    actual: Any, expected: Any, tolerance: Tolerance | None = None, name: str = "output"
) -> OutputComparison:
    """Compare ``actual`` with ``expected`` (the reference) under ``tolerance`` (see module doc)."""
    a = np.asarray(actual)
    e = np.asarray(expected)
    tol = tolerance or Tolerance()
    exact = e.dtype.kind in "biu" and a.dtype.kind in "biu"
    rtol, atol = (0.0, 0.0) if exact else (float(tol.rtol), float(tol.atol))
    base: dict[str, Any] = dict(
        name=name,
        rtol=rtol,
        atol=atol,
        shape=tuple(int(d) for d in e.shape),
        actual_shape=tuple(int(d) for d in a.shape),
        dtype=str(e.dtype),
        actual_dtype=str(a.dtype),
        total=int(e.size),
    )
    if a.shape != e.shape:
        return OutputComparison(passed=False, reason=f"shape {_shape(a.shape)} != reference {_shape(e.shape)}", **base)
    if _is_text(a) and _is_text(e):
        return _compare_text(a, e, base)
    if a.dtype != e.dtype:
        return OutputComparison(passed=False, reason=f"dtype {a.dtype} != reference {e.dtype}", **base)
    if ml_float(a.dtype):  # bfloat16 (ml_dtypes', as onnx and the backends give it): by value, as floats are
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            return _compare_values(a.astype(np.float64), e.astype(np.float64), rtol, atol, base)
    if a.dtype.kind not in "biufc":
        equal = np.array_equal(a, e)
        return OutputComparison(
            passed=bool(equal), reason="" if equal else "values differ", mismatched=0 if equal else int(e.size), **base
        )
    if exact:
        return _compare_integers(a, e, base)
    wide = np.complex128 if e.dtype.kind == "c" else np.float64
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        return _compare_values(a.astype(wide), e.astype(wide), rtol, atol, base)


def ml_float(dtype: np.dtype) -> bool:
    """Whether ``dtype`` is one of ml_dtypes' floating-point types (bfloat16, float8...).

    Example:
        >>> import ml_dtypes, numpy as np
        >>> ml_float(np.dtype(ml_dtypes.bfloat16)), ml_float(np.dtype(np.float32))
        (True, False)
    """
    if dtype.kind != "V" or dtype.names is not None:
        return False
    try:
        import ml_dtypes

        ml_dtypes.finfo(dtype)
    except Exception:
        return False
    return True


def _is_text(x: np.ndarray) -> bool:
    """Whether ``x`` holds strings: a ``<U``/``S`` array, or an object array of ``str``/``bytes``."""
    if x.dtype.kind in "US":
        return True
    return x.dtype.kind == "O" and all(isinstance(v, (str, bytes)) for v in x.flat)


def _compare_text(a: np.ndarray, e: np.ndarray, base: dict[str, Any]) -> OutputComparison:
    """String arrays, element by element by value (``<U`` and object arrays alike)."""
    bad = np.array([x != y for x, y in zip(a.flat, e.flat)], dtype=bool).reshape(e.shape)
    mismatched = int(bad.sum())
    if not mismatched:
        return OutputComparison(passed=True, reason="", **base)
    flat = int(np.flatnonzero(bad)[0])
    index = tuple(int(i) for i in np.unravel_index(flat, e.shape))
    got, want = (v.item() if isinstance(v, np.generic) else v for v in (a.flat[flat], e.flat[flat]))
    return OutputComparison(
        passed=False,
        reason=f"{mismatched} of {e.size} string(s) differ; first at {list(index)}: {got!r} vs reference {want!r}",
        mismatched=mismatched,
        worst_index=index,
        worst_actual=str(got),
        worst_expected=str(want),
        **base,
    )


def _compare_integers(a: np.ndarray, e: np.ndarray, base: dict[str, Any]) -> OutputComparison:
    """Integer or bool arrays of one dtype: exact, in integer arithmetic (no float64 rounding)."""
    bad = a != e
    # |a - e| exactly: the difference of the two's-complement uint64 images, taken the right way round.
    au = a.astype(np.int64 if a.dtype.kind == "b" else a.dtype).astype(np.uint64)
    eu = e.astype(np.int64 if e.dtype.kind == "b" else e.dtype).astype(np.uint64)
    diff = np.where(a >= e, au - eu, eu - au)
    ref_abs = np.abs(e.astype(np.float64))
    nonzero = ref_abs > 0
    rel_err = diff[nonzero].astype(np.float64) / ref_abs[nonzero]
    mismatched = int(bad.sum())
    worst_index: tuple[int, ...] | None = None
    worst_a: int | None = None
    worst_e: int | None = None
    reason = ""
    if mismatched:
        flat = int(np.argmax(diff))
        worst_index = tuple(int(i) for i in np.unravel_index(flat, e.shape))
        worst_a, worst_e = a.flat[flat].item(), e.flat[flat].item()
        which = "first" if e.dtype.kind == "b" else "worst"
        reason = (
            f"{mismatched} of {e.size} element(s) differ ({e.dtype} is compared exactly); {which} at "
            f"{list(worst_index)}: {worst_a} vs reference {worst_e}"
        )
    return OutputComparison(
        passed=mismatched == 0,
        reason=reason,
        abs=ErrorStats.of(diff),
        rel=ErrorStats.of(rel_err),
        mismatched=mismatched,
        zero_reference=int((~nonzero).sum()),
        worst_index=worst_index,
        worst_actual=worst_a,
        worst_expected=worst_e,
        **base,
    )


def _compare_values(af: np.ndarray, ef: np.ndarray, rtol: float, atol: float, base: dict[str, Any]) -> OutputComparison:
    """Float (float64) or complex (complex128) arrays under ``atol + rtol * |expected|``."""
    e = ef
    a_nan, e_nan = np.isnan(af), np.isnan(ef)
    nan_both = a_nan & e_nan
    nan_bad = a_nan ^ e_nan
    part_bad = np.zeros(e.shape, dtype=bool)
    if e.dtype.kind == "c":  # NaN placed per part: nan+0j is not 0+nanj; the other part of a match is compared
        halves = ((af.real, ef.real), (af.imag, ef.imag))
        for ap, ep in halves:
            nan_bad |= np.isnan(ap) ^ np.isnan(ep)
        nan_both &= ~nan_bad
        for ap, ep in halves:
            numbers = nan_both & ~np.isnan(ep)
            infinite = np.isinf(ap) | np.isinf(ep)  # (matched only by the same infinity: an inf bound passes all)
            part_bad |= numbers & ~((ap == ep) | (~infinite & (np.abs(ap - ep) <= atol + rtol * np.abs(ep))))
        nan_both &= ~part_bad
    a_inf, e_inf = np.isinf(af), np.isinf(ef)
    # An infinity matches only the same value (same sign; for complex, both parts equal).
    inf_bad = (a_inf | e_inf) & ~(af == ef) & ~(a_nan | e_nan)
    finite = ~(a_nan | e_nan | a_inf | e_inf)

    diff = np.abs(af - ef)
    bound = atol + rtol * np.abs(ef)
    bad_value = (finite & ~(diff <= bound)) | part_bad  # a NaN bound (inf * 0) never passes
    bad = bad_value | nan_bad | inf_bad

    abs_err = diff[finite]
    ref_abs = np.abs(ef[finite])
    nonzero = ref_abs > 0
    rel_err = abs_err[nonzero] / ref_abs[nonzero]

    mismatched = int(bad.sum())
    worst_index: tuple[int, ...] | None = None
    worst_a = worst_e = None
    reason = ""
    if mismatched:
        if nan_bad.any():
            flat = int(np.flatnonzero(nan_bad)[0])
        elif inf_bad.any():
            flat = int(np.flatnonzero(inf_bad)[0])
        else:
            excess = np.where(bad_value, np.nan_to_num(diff - bound, nan=np.inf), -np.inf)
            flat = int(np.argmax(excess))
        worst_index = tuple(int(i) for i in np.unravel_index(flat, e.shape))
        worst_a, worst_e = af.flat[flat].item(), ef.flat[flat].item()
        parts = []
        if int(nan_bad.sum()):
            parts.append(f"{int(nan_bad.sum())} NaN on one side only")
        if int(inf_bad.sum()):
            parts.append(f"{int(inf_bad.sum())} inf not matched")
        if int(bad_value.sum()):
            parts.append(f"{int(bad_value.sum())} beyond tolerance")
        shown_a, shown_e = _fmt(worst_a), _fmt(worst_e)
        if shown_a == shown_e:  # they differ past 6 digits: as many as tell them apart
            shown_a, shown_e = repr(worst_a), repr(worst_e)
        reason = (
            f"{mismatched} of {e.size} element(s) differ ({', '.join(parts)}); worst at "
            f"{list(worst_index)}: {shown_a} vs reference {shown_e}"
        )
    return OutputComparison(
        passed=mismatched == 0,
        reason=reason,
        abs=ErrorStats.of(abs_err),
        rel=ErrorStats.of(rel_err),
        mismatched=mismatched,
        nan_both=int(nan_both.sum()),
        nan_mismatched=int(nan_bad.sum()),
        inf_both=int(((a_inf | e_inf) & (af == ef)).sum()),
        inf_mismatched=int(inf_bad.sum()),
        zero_reference=int((~nonzero).sum()),
        worst_index=worst_index,
        worst_actual=worst_a,
        worst_expected=worst_e,
        **base,
    )


def _shape(shape: tuple[int, ...]) -> str:
    return "x".join(str(d) for d in shape) or "scalar"
