"""Large results copied into ONNX Runtime's outputs: every copy route gives exact bytes.

From 1 MiB the bridge copies a fresh result (made by the kernel, referenced by
nothing else) on the calling thread with streaming stores, and any other result
(an input returned as is, a view, a cached array) on ONNX Runtime's intra-op
thread pool. ``_set_copy_mode`` forces one route for every large copy, so each
test runs through all of them.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import opbridge
from opbridge.onnxruntime.session import InferenceSession

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
from opbridge.onnxruntime import _bridge as native  # noqa: E402 - built by `pip install -e .`

DOMAIN = "test.ortcopy"
MODES = ["auto", "serial", "parallel", "stream"]
MIB = 1 << 20
F = TensorProto.FLOAT


def make_model(op_type: str, n_in: int, outputs: list[int], *, elem: int = F, **attrs: object) -> onnx.ModelProto:
    """One custom node with inputs x0.. of type elem and outputs y0.. of the given types, all of any shape."""
    ins = [f"x{i}" for i in range(n_in)]
    outs = [f"y{i}" for i in range(len(outputs))]
    node = helper.make_node(op_type, ins, outs, domain=DOMAIN, **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, elem, None) for n in ins],
        [helper.make_tensor_value_info(n, t, None) for n, t in zip(outs, outputs, strict=True)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])


@pytest.fixture(params=MODES)
def copy_mode(request: pytest.FixtureRequest) -> Iterator[str]:
    """Force one copy route for the test, then restore the default."""
    previous = native._set_copy_mode(request.param)
    try:
        yield request.param
    finally:
        native._set_copy_mode(previous)


def _counts() -> dict[str, int]:
    return dict(native.abi_report()["large_copies"])


def _random(shape: tuple[int, ...], dtype: type, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if np.dtype(dtype) == np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    return (rng.standard_normal(shape) * 100).astype(dtype)


# --------------------------------------------------------------------------- kernels


CACHED: dict[str, np.ndarray] = {}


@opbridge.kernel("Fresh", domain=DOMAIN)
def fresh(x):
    return x.copy()  # a new array that only the bridge holds once returned


@opbridge.kernel("Same", domain=DOMAIN)
def same(x):
    return x  # ONNX Runtime's own input buffer: not fresh


@opbridge.kernel("Cached", domain=DOMAIN)
def cached(x):
    CACHED["last"] = x.copy()  # owns its memory, but the cache still refers to it: not fresh
    return CACHED["last"]


@opbridge.kernel("Strided", domain=DOMAIN)
def strided(x):
    return x.T.copy().T if x.ndim == 2 else x[::-1]  # Fortran order, or a reversed view


@opbridge.kernel("Swapped", domain=DOMAIN)
def swapped(x):
    return x.astype(x.dtype.newbyteorder())  # same values, foreign byte order


@opbridge.kernel("Both", domain=DOMAIN, outputs=3)
def both(x):
    return x.copy(), x, x.T.copy().T


@opbridge.kernel("Explode", domain=DOMAIN)
def explode(x):
    big = x * 2  # a large array alive at the raise
    raise RuntimeError(f"exploded after making {big.nbytes} bytes")


def _same_shape(x, *_, **__):
    return opbridge.TensorInfo(x.shape, x.dtype)


@opbridge.op(f"{DOMAIN}::OutOrFresh", shape=_same_shape)
def out_or_fresh(x: torch.Tensor, mode: str = "in-place") -> torch.Tensor:
    return x * 3


@out_or_fresh.register_kernel
def _out_or_fresh_numpy(x, out=None, mode="in-place"):
    if mode == "in-place":
        return np.multiply(x, 3, out=out)
    return x * 3  # ignores out=: the bridge copies the fresh result into it


# --------------------------------------------------------------------------- exact bytes, every route

DTYPES = [np.float32, np.float64, np.float16, np.int8, np.uint16, np.int32, np.int64, np.bool_]


@pytest.mark.parametrize("op", ["Fresh", "Same", "Cached"])
@pytest.mark.parametrize("dtype", DTYPES, ids=[np.dtype(d).name for d in DTYPES])
def test_large_results_copy_exactly(copy_mode: str, op: str, dtype: type) -> None:
    itemsize = np.dtype(dtype).itemsize
    n = (MIB + 3 * 4096 + 7) // itemsize + 5  # over 1 MiB, not a whole number of pieces or 64-byte lines
    x = _random((n,), dtype, seed=n)
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    sess = InferenceSession(make_model(op, 1, [elem], elem=elem))
    before = _counts()
    (y,) = sess.run(None, {"x0": x})
    after = _counts()
    assert y.dtype == x.dtype and y.shape == x.shape
    np.testing.assert_array_equal(y, x)
    # The route taken: auto streams only fresh results; forced modes take theirs
    # (parallel falls back to one thread only when the runtime lacks the pool API).
    parallel = "parallel" if native.abi_report()["parallel_copy"] else "serial"
    expected = {
        "auto": "stream" if op == "Fresh" else parallel,
        "serial": "serial",
        "parallel": parallel,
        "stream": "stream",
    }[copy_mode]
    assert after[expected] == before[expected] + 1, (before, after)


def test_small_results_take_no_large_route() -> None:
    sess = InferenceSession(make_model("Fresh", 1, [F]))
    x = _random((MIB // 4 - 1,), np.float32, seed=1)  # one element short of 1 MiB
    before = _counts()
    (y,) = sess.run(None, {"x0": x})
    np.testing.assert_array_equal(y, x)
    assert _counts() == before


@pytest.mark.parametrize("shape", [(700, 600), (700 * 600,)], ids=["fortran-order", "reversed-view"])
def test_large_non_contiguous_results(copy_mode: str, shape: tuple[int, ...]) -> None:
    x = _random(shape, np.float32, seed=2)
    (y,) = InferenceSession(make_model("Strided", 1, [F])).run(None, {"x0": x})
    np.testing.assert_array_equal(y, x if len(shape) == 2 else x[::-1])


@pytest.mark.parametrize("n", [5, 700_001], ids=["small", "large"])
def test_byte_swapped_results_keep_their_values(copy_mode: str, n: int) -> None:
    x = _random((n,), np.float32, seed=3)
    (y,) = InferenceSession(make_model("Swapped", 1, [F])).run(None, {"x0": x})
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, x)


def test_large_multi_output_mixes_routes(copy_mode: str) -> None:
    x = _random((800, 500), np.float32, seed=4)
    outs = InferenceSession(make_model("Both", 1, [F, F, F])).run(None, {"x0": x})
    for y in outs:
        np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize("mode", ["in-place", "fresh"])
def test_large_out_kernel(copy_mode: str, mode: str) -> None:
    x = _random((600, 700), np.float32, seed=5)
    (y,) = InferenceSession(make_model("OutOrFresh", 1, [F], mode=mode)).run(None, {"x0": x})
    np.testing.assert_array_equal(y, x * 3)


def test_output_bound_at_an_odd_address(copy_mode: str) -> None:
    """Streaming stores must handle a destination that is not 16-byte aligned."""
    x = _random((MIB + 77,), np.int8, seed=6)
    sess = InferenceSession(make_model("Fresh", 1, [TensorProto.INT8], elem=TensorProto.INT8))
    backing = np.zeros(x.size + 1, np.int8)
    out = backing[1:]  # contiguous, one byte past an aligned start
    binding = sess.session.io_binding()
    binding.bind_cpu_input("x0", x)
    binding.bind_output("y0", "cpu", 0, np.int8, list(out.shape), out.ctypes.data)
    sess.session.run_with_iobinding(binding)
    np.testing.assert_array_equal(out, x)
    assert backing[0] == 0  # nothing written before the output


# --------------------------------------------------------------------------- threads and errors


@pytest.mark.parametrize("execution_mode", ["sequential", "parallel"])
def test_concurrent_runs_with_large_outputs(copy_mode: str, execution_mode: str) -> None:
    """Several Python threads run one session while its copies use the intra-op pool."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    if execution_mode == "parallel":
        options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
        options.inter_op_num_threads = 2
    sess = InferenceSession(make_model("Both", 1, [F, F, F]), sess_options=options)
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            for i in range(4):
                x = _random((300 + 7 * seed, 1000 + i), np.float32, seed=seed * 10 + i)
                for y in sess.run(None, {"x0": x}):
                    np.testing.assert_array_equal(y, x)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a run hung"
    assert not errors, errors


def test_kernel_exception_with_large_data_leaves_session_usable(copy_mode: str) -> None:
    sess = InferenceSession(make_model("Explode", 1, [F]))
    x = _random((MIB,), np.float32, seed=7)
    with pytest.raises(
        ort.capi.onnxruntime_pybind11_state.Fail,
        match=r"RuntimeError: exploded after making "
        r"4194304 bytes \(in explode, .*test_ort_copy.py:\d+\)",
    ):
        sess.run(None, {"x0": x})
    # The same process runs a large copy correctly right after.
    (y,) = InferenceSession(make_model("Fresh", 1, [F])).run(None, {"x0": x})
    np.testing.assert_array_equal(y, x)


def test_large_result_with_wrong_dtype_is_reported(copy_mode: str) -> None:
    sess = InferenceSession(make_model("Fresh", 1, [TensorProto.DOUBLE]))
    with pytest.raises(
        ort.capi.onnxruntime_pybind11_state.Fail,
        match=r"output 0 has dtype float32, but the "
        r"node's output type is float64",
    ):
        sess.run(None, {"x0": np.zeros(MIB, np.float32)})


# --------------------------------------------------------------------------- the switch itself


def test_copy_mode_switch_rejects_unknown_modes() -> None:
    with pytest.raises(
        ValueError,
        match=r"copy mode must be 'auto' \(the default\), 'serial', 'parallel' or "
        r"'stream'",
    ):
        native._set_copy_mode("fast")
    assert native._set_copy_mode("auto") == "auto"  # unchanged by the bad call, and the default


def test_parallel_copy_needs_api_17() -> None:
    InferenceSession(make_model("Fresh", 1, [F]))
    report = native.abi_report()
    assert report["parallel_copy"] == (report["api_version"] >= 17)
    assert report["large_copy"] == MIB


FALLBACK_SCRIPT = r"""
import ctypes, pathlib, sys
import onnxruntime
from opbridge.onnxruntime import _bridge as native

lib = next(pathlib.Path(onnxruntime.__file__).parent.joinpath("capi").glob("libonnxruntime.so*"))
ort = ctypes.CDLL(str(lib))
GetApi = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_uint32)
GetVersion = ctypes.CFUNCTYPE(ctypes.c_char_p)
class Base(ctypes.Structure):
    _fields_ = [("GetApi", GetApi), ("GetVersionString", GetVersion)]
ort.OrtGetApiBase.restype = ctypes.POINTER(Base)
real = ort.OrtGetApiBase().contents
newest = int(sys.argv[1])
fake = Base(GetApi(lambda v: real.GetApi(v) if v <= newest else None), GetVersion(lambda: b"1.16.0 (simulated)"))

table = ctypes.cast(real.GetApi(16), ctypes.POINTER(ctypes.c_void_p))
create_options = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p))(table[10])
options = ctypes.c_void_p()
assert create_options(ctypes.byref(options)) is None
native.set_pending([native.OpDescriptor("sim.domain", "Op", 1, [1], lambda node: None)])
bridge = ctypes.CDLL(native.__file__)
bridge.RegisterCustomOps.restype = ctypes.c_void_p
status = bridge.RegisterCustomOps(options, ctypes.byref(fake))
report = native.abi_report()
print(status is None, report["api_version"], report["parallel_copy"], report["selfcheck"], native.registration_error())
"""


@pytest.mark.parametrize(
    ("newest", "expected"),
    [
        (16, "True 16 False 1 None"),
        (
            15,
            "True 0 False 0 this onnxruntime (1.16.0 (simulated)) does not offer C API version 16; opbridge needs "
            "onnxruntime >= 1.16",
        ),
    ],
    ids=["runtime-1.16", "runtime-1.15"],
)
def test_older_runtime_falls_back(tmp_path: Path, newest: int, expected: str) -> None:
    """A runtime without C API 17 registers with table 16 (no parallel copy); one without 16 is refused.

    The older runtime is simulated in a child process: RegisterCustomOps gets an API base whose GetApi
    answers NULL above ``newest`` and hands out the real table otherwise.
    """
    if not list((Path(ort.__file__).parent / "capi").glob("libonnxruntime.so*")):
        pytest.skip("this onnxruntime wheel ships no libonnxruntime.so to simulate an older runtime with")
    script = tmp_path / "fallback.py"
    script.write_text(FALLBACK_SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script), str(newest)], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == expected
