"""Comparison statistics and rules on crafted arrays: NaN, inf, zeros, relative error at zero."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from opbridge.compare import ErrorStats, compare_arrays
from opbridge.spec import Tolerance

TOL = Tolerance(rtol=1e-3, atol=1e-5)
NAN, INF = np.nan, np.inf


def test_statistics_of_known_errors() -> None:
    expected = np.array([1.0, 2.0, 4.0, 8.0], np.float32)
    actual = expected + np.array([0.0, 0.001, 0.002, 0.004], np.float32)
    r = compare_arrays(actual, expected, TOL, "y")
    assert r.passed and r.mismatched == 0 and r.total == 4
    diff = np.abs(actual.astype(np.float64) - expected)
    assert r.abs.max == pytest.approx(diff.max())
    assert r.abs.mean == pytest.approx(diff.mean())
    assert r.abs.median == pytest.approx(np.median(diff))
    assert r.abs.p99 == pytest.approx(np.quantile(diff, 0.99))
    assert r.rel.max == pytest.approx((diff / expected).max())
    assert (r.rtol, r.atol) == (1e-3, 1e-5)


def test_beyond_tolerance_names_the_worst_element() -> None:
    expected = np.zeros((2, 3), np.float32) + 1.0
    actual = expected.copy()
    actual[1, 2] = 1.01
    actual[0, 0] = 1.0005  # within rtol 1e-3
    r = compare_arrays(actual, expected, TOL, "logits")
    assert not r.passed and r.mismatched == 1
    assert r.worst_index == (1, 2)
    assert "1 of 6 element(s) differ (1 beyond tolerance); worst at [1, 2]: 1.01 vs reference 1" in r.reason


def test_tolerance_boundary_is_inclusive() -> None:
    tol = Tolerance(rtol=0.5, atol=0.25)  # bound = 0.25 + 0.5 * 2 = 1.25, exact in binary
    expected = np.array([2.0])
    assert compare_arrays(expected + 1.25, expected, tol).passed
    assert not compare_arrays(expected + 1.25 + 2.0**-20, expected, tol).passed


@pytest.mark.parametrize(
    ("actual", "expected", "passed", "nan_both", "nan_bad"),
    [
        ([1.0, NAN], [1.0, NAN], True, 1, 0),
        ([1.0, NAN], [1.0, 2.0], False, 0, 1),
        ([1.0, 2.0], [1.0, NAN], False, 0, 1),
        ([NAN, NAN], [NAN, 1.0], False, 1, 1),
    ],
    ids=["nan-both", "nan-actual-only", "nan-reference-only", "mixed"],
)
def test_nan_rules(actual, expected, passed, nan_both, nan_bad) -> None:
    r = compare_arrays(np.array(actual), np.array(expected), TOL)
    assert (r.passed, r.nan_both, r.nan_mismatched) == (passed, nan_both, nan_bad)
    if nan_both and passed:
        assert r.note == "1 NaN in both (counted as equal)"  # reported, never silent
    if not passed:
        assert "NaN on one side only" in r.reason


@pytest.mark.parametrize(
    ("actual", "expected", "passed"),
    [
        ([INF, -INF, 1.0], [INF, -INF, 1.0], True),
        ([INF, 1.0], [-INF, 1.0], False),
        ([INF, 1.0], [1e30, 1.0], False),
        ([1e30, 1.0], [INF, 1.0], False),
    ],
    ids=["same-sign", "opposite-sign", "inf-vs-finite", "finite-vs-inf"],
)
def test_inf_must_match_position_and_sign(actual, expected, passed) -> None:
    r = compare_arrays(np.array(actual), np.array(expected), TOL)
    assert r.passed is passed
    if passed:
        assert r.abs.max == 0.0  # matched infinities are not measured, but counted
        assert r.inf_both == 2 and r.to_dict()["inf_both"] == 2
    else:
        assert r.inf_mismatched == 1 and "inf not matched" in r.reason


def test_relative_error_at_zero_is_left_out_and_atol_decides() -> None:
    expected = np.array([0.0, 0.0, 2.0])
    r = compare_arrays(np.array([5e-6, 0.0, 2.0]), expected, TOL)
    assert r.passed and r.zero_reference == 2
    assert r.rel.max == 0.0  # only the non-zero reference element is measured
    assert r.abs.max == pytest.approx(5e-6)
    r = compare_arrays(np.array([2e-5, 0.0, 2.0]), expected, TOL)
    assert not r.passed and r.worst_index == (0,)


def test_all_zero_reference_has_no_relative_statistics() -> None:
    r = compare_arrays(np.zeros(4), np.zeros(4), TOL)
    assert r.passed and r.rel == ErrorStats() and r.abs.max == 0.0


def test_an_error_that_overflows_keeps_its_statistics_numbers() -> None:
    """-max against +max differs by inf in float64: the p99 interpolated next to it was inf - inf, NaN."""
    big = np.finfo(np.float64).max
    r = compare_arrays(np.array([-big, 0.0, 1.0]), np.array([big, 0.0, 1.0]), TOL)
    assert not r.passed
    assert (r.abs.max, r.abs.p99, r.abs.median) == (np.inf, np.inf, 0.0)
    finite = ErrorStats.of(np.array([0.0, 1.0, 2.0, 3.0]))
    assert finite.median == 1.5 and finite.p99 == pytest.approx(2.97, rel=1e-12, abs=0)  # (interpolated)


def test_empty_arrays_pass_with_no_statistics() -> None:
    r = compare_arrays(np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32), TOL)
    assert r.passed and r.abs == ErrorStats() and r.total == 0


def test_shape_and_dtype_mismatches_fail_with_reason() -> None:
    r = compare_arrays(np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32), TOL)
    assert not r.passed and r.reason == "shape 2x3 != reference 3x2"
    r = compare_arrays(np.zeros(3, np.float64), np.zeros(3, np.float32), TOL)
    assert not r.passed and r.reason == "dtype float64 != reference float32"


def test_integers_compare_exactly() -> None:
    r = compare_arrays(np.array([1, 2, 3]), np.array([1, 2, 4]), Tolerance(rtol=0.5, atol=1.0))
    assert not r.passed and (r.rtol, r.atol) == (0.0, 0.0)
    assert r.reason == "1 of 3 element(s) differ (int64 is compared exactly); worst at [2]: 3 vs reference 4"
    assert compare_arrays(np.array([True, False]), np.array([True, False]), TOL).passed


def test_bools_name_their_first_difference_as_bools() -> None:
    r = compare_arrays(np.array([True, False, False]), np.array([True, True, False]), TOL, "mask")
    assert not r.passed and r.mismatched == 1
    assert r.reason == "1 of 3 element(s) differ (bool is compared exactly); first at [1]: False vs reference True"
    assert "tolerance" not in r.reason


def test_record_is_json_ready_with_nonfinite_values() -> None:
    r = compare_arrays(np.array([NAN, 1.0]), np.array([1.0, 1.0]), TOL, "y")
    text = json.dumps(r.to_dict(), allow_nan=False)
    assert '"worst_actual": "nan"' in text and '"name": "y"' in text


@pytest.mark.parametrize(
    ("actual", "expected", "dtype"),
    [
        ([2**53 + 1, 7], [2**53, 7], np.int64),
        ([2**63 + 1, 7], [2**63, 7], np.uint64),
        ([-(2**62) - 1, 7], [-(2**62), 7], np.int64),
    ],
    ids=["int64-above-2**53", "uint64-above-2**63", "int64-negative"],
)
def test_large_integers_differing_by_one_fail(actual, expected, dtype) -> None:
    r = compare_arrays(np.array(actual, dtype), np.array(expected, dtype), TOL, "idx")
    assert not r.passed and r.mismatched == 1 and r.worst_index == (0,)
    assert (r.worst_actual, r.worst_expected) == (actual[0], expected[0])  # exact, not rounded to float64
    assert r.reason.endswith(f"worst at [0]: {actual[0]} vs reference {expected[0]}")
    assert r.abs.max == 1.0
    assert compare_arrays(np.array(expected, dtype), np.array(expected, dtype), TOL).passed


def test_integer_error_spanning_the_whole_int64_range_is_exact() -> None:
    lo, hi = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    r = compare_arrays(np.array([lo, 0], np.int64), np.array([hi, 0], np.int64), TOL)
    assert not r.passed and r.mismatched == 1
    assert r.abs.max == float(2**64 - 1)  # no wrap-around in the statistics


def test_complex_compares_the_imaginary_part_too() -> None:
    expected = np.array([1 + 0j, 2 - 1j], np.complex64)
    r = compare_arrays(np.array([1 + 5j, 2 - 1j], np.complex64), expected, TOL, "z")
    assert not r.passed and r.mismatched == 1 and r.worst_index == (0,)
    assert r.abs.max == 5.0
    assert "worst at [0]: (1+5j) vs reference (1+0j)" in r.reason
    data = json.loads(json.dumps(r.to_dict(), allow_nan=False))
    assert (data["worst_actual"], data["worst_expected"]) == ("(1+5j)", "(1+0j)")
    tol = Tolerance(rtol=0.0, atol=2.0**-10)
    assert compare_arrays(expected + np.complex64(2.0**-11 * 1j), expected, tol).passed
    assert not compare_arrays(expected + np.complex64(2.0**-9 * 1j), expected, tol).passed


def test_complex_nan_and_inf_rules() -> None:
    inf_j = complex(0.0, INF)
    assert compare_arrays(np.array([inf_j]), np.array([inf_j]), TOL).passed
    assert compare_arrays(np.array([inf_j]), np.array([-inf_j]), TOL).inf_mismatched == 1
    r = compare_arrays(np.array([complex(1.0, NAN)]), np.array([1 + 0j]), TOL)
    assert not r.passed and r.nan_mismatched == 1
    # beside a NaN in the other part, an infinite part is matched only by the same infinity (its bound,
    # atol + rtol * inf, passed any value)
    nan_inf = np.array([complex(NAN, INF)])
    assert compare_arrays(nan_inf.copy(), nan_inf, TOL).passed
    for other in (complex(NAN, 5.0), complex(NAN, -INF)):
        assert not compare_arrays(np.array([other]), nan_inf, TOL).passed, other
    assert not compare_arrays(nan_inf, np.array([complex(NAN, 5.0)]), TOL).passed


def test_strings_compare_by_value_whatever_their_numpy_dtype() -> None:
    unicode = np.array([["a", "bc"], ["d", ""]])  # <U2, as the reference evaluator returns
    objects = np.array([["a", "bc"], ["d", ""]], dtype=object)  # as ONNX Runtime returns
    r = compare_arrays(unicode, objects, TOL, "s")
    assert r.passed and r.reason == "" and (r.dtype, r.actual_dtype) == ("object", "<U2")
    r = compare_arrays(np.array([["a", "bd"], ["d", "e"]]), objects, TOL, "s")
    assert not r.passed and r.mismatched == 2 and r.worst_index == (0, 1)
    assert r.reason == "2 of 4 string(s) differ; first at [0, 1]: 'bd' vs reference 'bc'"
    assert compare_arrays(unicode, objects[:1], TOL).reason == "shape 2x2 != reference 1x2"


@pytest.mark.parametrize(("rtol", "atol"), [(INF, 0.0), (0.0, INF), (NAN, 0.0), (0.0, -INF), (-1e-3, 0.0)], ids=str)
def test_non_finite_or_negative_tolerance_is_refused(rtol: float, atol: float) -> None:
    with pytest.raises(ValueError, match=r"tolerances must be finite numbers >= 0 \(an infinite one would pass"):
        Tolerance(rtol=rtol, atol=atol)


def test_nan_bound_never_passes() -> None:
    """inf * 0 is NaN: a bound that is not a number fails the element instead of passing it."""
    unchecked = SimpleNamespace(rtol=INF, atol=0.0)  # what Tolerance refuses, handed over unchecked
    r = compare_arrays(np.array([5.0, 1.0]), np.array([0.0, 1.0]), unchecked)
    assert not r.passed and r.mismatched == 1 and r.worst_index == (0,)
