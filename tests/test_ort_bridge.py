"""The ONNX Runtime kernel bridge: attributes, inputs/outputs, dtypes, errors, threads, the C ABI."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from conftest import run_script
from onnx import TensorProto, helper

import opbridge
from opbridge.onnxruntime.session import InferenceSession

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
from opbridge.onnxruntime import _bridge as native  # noqa: E402 - built by `pip install -e .`

DOMAIN = "test.ortbridge"


def make_model(
    op_type: str,
    inputs: list[tuple[str, int, list | None]],
    outputs: list[tuple[str, int, list | None]],
    *,
    node_inputs: list[str] | None = None,
    domain: str = DOMAIN,
    name: str = "",
    **attrs: object,
) -> onnx.ModelProto:
    """A model with one custom node; graph inputs/outputs given as (name, elem_type, shape)."""
    node = helper.make_node(
        op_type,
        node_inputs if node_inputs is not None else [i[0] for i in inputs],
        [o[0] for o in outputs],
        domain=domain,
        name=name,
        **attrs,
    )
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(*i) for i in inputs],
        [helper.make_tensor_value_info(*o) for o in outputs],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)], ir_version=9
    )


F = TensorProto.FLOAT
RNG = np.random.default_rng(1234)

# --------------------------------------------------------------------------- ops under test

SEEN: dict[str, dict] = {}


@opbridge.op(f"{DOMAIN}::AttrProbe")
def attr_probe(
    x: torch.Tensor,
    f: float = 0.0,
    i: int = 0,
    b: bool = False,
    s: str = "",
    fs: list[float] = [],  # noqa: B006
    is_: list[int] = [],  # noqa: B006
    ss: list[str] = [],  # noqa: B006
) -> torch.Tensor:
    return x.clone()


@attr_probe.register_kernel
def _attr_probe_kernel(x, **attrs):
    SEEN["AttrProbe"] = attrs
    return x


@opbridge.kernel("RawAttrProbe", domain=DOMAIN)
def raw_attr_probe(x, **attrs):
    SEEN["RawAttrProbe"] = attrs
    return x


@opbridge.kernel("Split2", domain=DOMAIN, outputs=2)
def split2(x, y):
    return x + y, x * y


@opbridge.op(f"{DOMAIN}::MaybeAdd")
def maybe_add(x: torch.Tensor, y: torch.Tensor | None = None, scale: float = 1.0) -> torch.Tensor:
    """x * scale (+ y when given): runs as the torch reference."""
    return x * scale if y is None else x * scale + y


@opbridge.kernel("Identity2", domain=DOMAIN)
def identity2(x):
    SEEN["Identity2"] = {
        "writeable": x.flags.writeable,
        "owndata": x.flags.owndata,
        "aligned": x.flags.aligned,
        "ptr": x.ctypes.data,
    }
    return x


@opbridge.kernel("Boom", domain=DOMAIN)
def boom(x):
    if float(x.reshape(-1)[0]) < 0:
        raise ValueError(f"boom: negative input {float(x.reshape(-1)[0])}")
    return x


@opbridge.kernel("LongBoom", domain=DOMAIN)
def long_boom(x):
    raise ValueError("输入无效 " * int(x.reshape(-1)[0]))  # (repeats: where the buffers cut it, mid-character)


@opbridge.kernel("WrongDtype", domain=DOMAIN)
def wrong_dtype(x):
    return x.astype(np.float64)


@opbridge.kernel("WrongCount", domain=DOMAIN)
def wrong_count(x):
    return x, x, x


@opbridge.kernel("NotArray", domain=DOMAIN)
def not_array(x):
    return "not an array"


@opbridge.op(f"{DOMAIN}::ShapeChecked", shape=lambda x, **_: opbridge.TensorInfo(x.shape, x.dtype))
def shape_checked(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@shape_checked.register_kernel
def _shape_checked_kernel(x):
    return x[:1]  # wrong: drops rows


@opbridge.op(f"{DOMAIN}::ShapeDerived")
def shape_derived(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@shape_derived.register_kernel
def _shape_derived_kernel(x):
    return x[:1]  # wrong: drops rows; the op has no rule, its reference gives the shape


@opbridge.op(f"{DOMAIN}::Silu")
def silu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


@silu.register_kernel
def _silu_numpy(x):
    return x / (np.float32(1) + np.exp(-x))


@opbridge.op(f"{DOMAIN}::Transposed")
def transposed(x: torch.Tensor) -> torch.Tensor:
    return x.t().contiguous()


@transposed.register_kernel
def _transposed_numpy(x):
    return x.T  # a strided view: the bridge must copy it correctly


# --------------------------------------------------------------------------- attributes


ATTRS = {
    "f": 0.123456789,
    "i": 2**40 + 7,
    "b": 1,
    "s": "这是字符串属性",
    "fs": [0.1, -2.5e-8, 3.0],
    "is_": [2**40, -3, 0],
    "ss": ["a", "这是", ""],
}


def test_attributes_exact_values_and_types() -> None:
    model = make_model("AttrProbe", [("x", F, [2])], [("y", F, [2])], **ATTRS)
    sess = InferenceSession(model)
    x = np.array([1.0, 2.0], np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x)
    seen = SEEN["AttrProbe"]
    assert seen["f"] == float(np.float32(0.123456789)) and type(seen["f"]) is float
    assert seen["i"] == 2**40 + 7 and type(seen["i"]) is int
    assert seen["b"] is True
    assert seen["s"] == "这是字符串属性"
    assert seen["fs"] == tuple(float(np.float32(v)) for v in ATTRS["fs"])
    assert seen["is_"] == (2**40, -3, 0)
    assert seen["ss"] == ("a", "这是", "")
    assert sess.kernels[next(iter(sess.kernels))].path == "kernel"


@pytest.mark.parametrize(
    ("attrs", "match"),
    [
        ({"b": "false"}, r"attribute 'b' is STRING in the node; the op declares it bool \(ONNX INT\)"),
        ({"b": 0.5}, r"attribute 'b' is FLOAT in the node; the op declares it bool"),
        ({"is_": 3}, r"attribute 'is_' is INT in the node; the op declares it list\[int\] \(ONNX INTS\)"),
        ({"s": b"\xff\xfe"}, "attribute 's' holds bytes that are not UTF-8 text"),
    ],
    ids=["bool-as-string", "bool-as-float", "ints-as-int", "string-not-utf8"],
)
def test_attribute_of_another_type_is_named(attrs: dict, match: str) -> None:
    """An attribute whose ONNX type is not the declared one is refused when the session is created
    (a BOOL read as the truth of a string or a float before), naming the node and the attribute."""
    model = make_model("AttrProbe", [("x", F, [1])], [("y", F, [1])], name="probe", **attrs)
    with pytest.raises(opbridge.OpDefinitionError, match=r"node 'probe': .*" + match):
        InferenceSession(model)


def test_attribute_defaults_fill_in() -> None:
    model = make_model("AttrProbe", [("x", F, [1])], [("y", F, [1])], s="only this")
    InferenceSession(model).run(None, {"x": np.ones(1, np.float32)})
    seen = SEEN["AttrProbe"]
    assert seen == {"f": 0.0, "i": 0, "b": False, "s": "only this", "fs": (), "is_": (), "ss": ()}


def test_attributes_without_spec_are_exact() -> None:
    model = make_model("RawAttrProbe", [("x", F, [1])], [("y", F, [1])], **ATTRS)
    sess = InferenceSession(model)
    sess.run(None, {"x": np.ones(1, np.float32)})
    seen = SEEN["RawAttrProbe"]
    assert seen["f"] == float(np.float32(0.123456789))
    assert seen["i"] == 2**40 + 7
    assert seen["s"] == "这是字符串属性"
    assert seen["fs"] == [float(np.float32(v)) for v in ATTRS["fs"]]
    assert seen["is_"] == [2**40, -3, 0]
    assert seen["ss"] == ["a", "这是", ""]
    assert "__opbridge_node" not in seen
    assert next(iter(sess.kernels.values())).path == "registered"


# --------------------------------------------------------------------------- inputs and outputs


def test_multi_output() -> None:
    model = make_model("Split2", [("x", F, ["n"]), ("y", F, ["n"])], [("s", F, ["n"]), ("p", F, ["n"])])
    x, y = RNG.standard_normal(5).astype(np.float32), RNG.standard_normal(5).astype(np.float32)
    s, p = InferenceSession(model).run(None, {"x": x, "y": y})
    np.testing.assert_array_equal(s, x + y)
    np.testing.assert_array_equal(p, x * y)


@pytest.mark.parametrize(
    ("op_type", "inputs", "outputs", "match"),
    [
        ("AttrProbe", ["x", "x"], ["y"], r"has 2 inputs; the op takes at most 1 \(x\)"),
        ("PairOut", ["x", "x"], ["", "d"], r"lists outputs \['', 'd'\]; the op has 2 \(s, d\)"),
        ("PairOut", ["x", "x"], ["s"], r"lists outputs \['s'\]; the op has 2 \(s, d\)"),
    ],
    ids=["extra-input", "omitted-output", "missing-output"],
)
def test_node_arity_is_checked_when_the_session_is_created(
    op_type: str, inputs: list[str], outputs: list[str], match: str
) -> None:
    """A node with more inputs than its op, or without one of its outputs, is named when the session
    is created (an extra input ran silently in the native kernel; an omitted output failed each run)."""
    node = helper.make_node(op_type, inputs, outputs, domain=DOMAIN, name="n")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", F, [3])],
        [helper.make_tensor_value_info(o, F, [3]) for o in outputs if o],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])
    with pytest.raises(opbridge.OpDefinitionError, match=r"node 'n' " + match):
        InferenceSession(model)


@pytest.mark.parametrize("given", [False, True], ids=["omitted", "given"])
def test_optional_input(given: bool) -> None:
    inputs = [("x", F, [3]), ("y", F, [3])] if given else [("x", F, [3])]
    model = make_model("MaybeAdd", inputs, [("z", F, [3])], node_inputs=["x", "y"] if given else ["x", ""], scale=2.0)
    x = np.array([1.0, 2.0, 3.0], np.float32)
    feed = {"x": x, "y": np.full(3, 10.0, np.float32)} if given else {"x": x}
    sess = InferenceSession(model)
    (z,) = sess.run(None, feed)
    np.testing.assert_allclose(z, 2 * x + (10.0 if given else 0.0), rtol=1e-6)
    assert next(iter(sess.kernels.values())).path == "reference"


DTYPES = [
    (np.float32, TensorProto.FLOAT),
    (np.float16, TensorProto.FLOAT16),
    (np.float64, TensorProto.DOUBLE),
    (np.int64, TensorProto.INT64),
    (np.int32, TensorProto.INT32),
    (np.int8, TensorProto.INT8),
    (np.uint8, TensorProto.UINT8),
    (np.bool_, TensorProto.BOOL),
]


@pytest.mark.parametrize(("dtype", "elem"), DTYPES, ids=[np.dtype(d).name for d, _ in DTYPES])
def test_dtypes_roundtrip_exactly(dtype: type, elem: int) -> None:
    model = make_model("Identity2", [("x", elem, ["a", "b"])], [("y", elem, ["a", "b"])])
    x = (RNG.standard_normal((3, 4)) * 50).astype(dtype)
    (y,) = InferenceSession(model).run(None, {"x": x})
    assert y.dtype == x.dtype
    np.testing.assert_array_equal(y, x)


def test_inputs_are_zero_copy_read_only_views() -> None:
    model = make_model("Identity2", [("x", F, ["n"])], [("y", F, ["n"])])
    x = np.arange(1000, dtype=np.float32)
    InferenceSession(model).run(None, {"x": x})
    seen = SEEN["Identity2"]
    assert seen["writeable"] is False  # ONNX Runtime's buffer: the kernel must not write it
    assert seen["owndata"] is False  # a view over ONNX Runtime's memory, not a copy


def _at_offset(a: np.ndarray, offset: int) -> np.ndarray:
    """A copy of ``a`` starting ``offset`` bytes into a buffer (misaligned for offsets not a multiple
    of its item size)."""
    raw = np.zeros(a.nbytes + 16, np.uint8)
    out = np.frombuffer(raw.data, dtype=a.dtype, count=a.size, offset=offset).reshape(a.shape)
    out[...] = a
    return out


def test_a_misaligned_feed_is_an_unaligned_array_for_the_kernel() -> None:
    """ONNX Runtime hands a caller's feed over at whatever address it starts: the kernel's array says
    whether it is aligned (numpy then reads it element by element), it does not claim it is."""
    model = make_model("Identity2", [("x", F, ["n"])], [("y", F, ["n"])])
    x = np.arange(7, dtype=np.float32)
    sess = InferenceSession(model)
    for offset, aligned in ((0, True), (1, False), (4, True)):
        (y,) = sess.run(None, {"x": _at_offset(x, offset)})
        assert SEEN["Identity2"]["aligned"] is aligned, offset
        np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize(
    "shape", [(1,), (2, 3), (4, 1, 5, 6), (0, 3), ()], ids=lambda s: "x".join(map(str, s)) or "scalar"
)
def test_dynamic_shapes_in_one_session(shape: tuple[int, ...]) -> None:
    model = make_model("Silu", [("x", F, None)], [("y", F, None)])
    sess = _cached_session("silu", model)
    x = RNG.standard_normal(shape).astype(np.float32)
    (y,) = sess.run(None, {"x": x})
    assert y.shape == shape
    np.testing.assert_allclose(y, x / (1 + np.exp(-x)), rtol=1e-6, atol=1e-7)


def test_strided_result_is_copied_correctly() -> None:
    model = make_model("Transposed", [("x", F, [3, 4])], [("y", F, [4, 3])])
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    (y,) = InferenceSession(model).run(None, {"x": x})
    np.testing.assert_array_equal(y, x.T)


_SESSIONS: dict[str, InferenceSession] = {}


def _cached_session(key: str, model: onnx.ModelProto) -> InferenceSession:
    if key not in _SESSIONS:
        _SESSIONS[key] = InferenceSession(model)
    return _SESSIONS[key]


# --------------------------------------------------------------------------- errors


def _fail_type() -> type[BaseException]:
    return ort.capi.onnxruntime_pybind11_state.Fail


def test_kernel_exception_carries_python_message_and_process_survives() -> None:
    model = make_model("Boom", [("x", F, [2])], [("y", F, [2])], name="boom_node")
    sess = InferenceSession(model)
    with pytest.raises(_fail_type()) as err:
        sess.run(None, {"x": np.array([-1.5, 0.0], np.float32)})
    text = str(err.value)
    assert "ValueError: boom: negative input -1.5" in text
    assert f"{DOMAIN}::Boom node 'boom_node'" in text
    assert "test_ort_bridge.py" in text  # where the kernel raised
    (y,) = sess.run(None, {"x": np.array([1.0, 2.0], np.float32)})  # the session still works
    np.testing.assert_array_equal(y, [1.0, 2.0])


def test_a_long_message_cut_inside_a_character_still_reaches_the_caller() -> None:
    """The bridge cuts a message to its buffers, and a cut inside a multi-byte character made ONNX Runtime's
    strict UTF-8 decoding raise UnicodeDecodeError in place of the kernel's error."""
    model = make_model("LongBoom", [("x", F, [1])], [("y", F, [1])], name="long_boom")
    sess = InferenceSession(model)
    for repeats in range(300, 310):  # (cuts at every byte of a character)
        with pytest.raises(_fail_type()) as err:
            sess.run(None, {"x": np.array([repeats], np.float32)})
        text = str(err.value)
        assert f"{DOMAIN}::LongBoom node 'long_boom': kernel raised ValueError: 输入无效 输入无效" in text


_INTERRUPTED_KERNEL = """
import os, signal, numpy as np, opbridge
from onnx import helper, TensorProto as T

# Python's Ctrl-C handler, also where this process started with SIGINT ignored (a background job of a
# non-interactive shell, as a CI script may run the tests), in which case Python installs none
signal.signal(signal.SIGINT, signal.default_int_handler)

@opbridge.kernel("Interrupted", domain="test.interrupt")
def interrupted(x):
    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the kernel runs
    for _ in range(10**7):  # Python delivers it inside the kernel, at its next instructions
        pass
    return x

node = helper.make_node("Interrupted", ["x"], ["y"], domain="test.interrupt")
graph = helper.make_graph(
    [node], "g", [helper.make_tensor_value_info("x", T.FLOAT, [1])], [helper.make_tensor_value_info("y", T.FLOAT, [1])]
)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("test.interrupt", 1)])
sess = opbridge.InferenceSession(model)
try:
    sess.run(None, {"x": np.ones(1, np.float32)})
except KeyboardInterrupt:  # raised from run() itself
    print("interrupted in run")
    raise
except Exception as exc:  # the run's own error must not swallow Ctrl-C
    print("failed:", type(exc).__name__)
print("not interrupted")
"""


def test_ctrl_c_inside_a_kernel_still_interrupts() -> None:
    """KeyboardInterrupt raised inside a Python kernel fails the run (ONNX Runtime cannot carry it)
    and is raised again once the run returns: an ``except Exception`` around run() does not swallow it."""
    proc = subprocess.run([sys.executable, "-c", _INTERRUPTED_KERNEL], capture_output=True, text=True, timeout=120)
    assert "interrupted in run" in proc.stdout and "not interrupted" not in proc.stdout, proc.stdout + proc.stderr
    assert "KeyboardInterrupt" in proc.stderr
    assert proc.returncode != 0


_SIGNAL_STORM = """
import signal, threading, time, _thread, numpy as np, opbridge
from onnx import helper, TensorProto as T

signal.signal(signal.SIGINT, signal.default_int_handler)

@opbridge.kernel("Busy", domain="test.storm")
def busy(x):
    s = 0
    for i in range(2000):
        s += i
    return x * 2

node = helper.make_node("Busy", ["x"], ["y"], domain="test.storm")
graph = helper.make_graph(
    [node], "g", [helper.make_tensor_value_info("x", T.FLOAT, [4])], [helper.make_tensor_value_info("y", T.FLOAT, [4])]
)
sess = opbridge.InferenceSession(
    helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("test.storm", 1)])
)

class Alarm(Exception):
    pass

armed = [False]

def on_alarm(signum, frame):
    if armed[0]:
        raise Alarm("tick")

signal.signal(signal.SIGALRM, on_alarm)
stop = [False]

def interrupter():
    while not stop[0]:
        time.sleep(0.003)
        if armed[0]:
            _thread.interrupt_main()

threading.Thread(target=interrupter, daemon=True).start()
signal.setitimer(signal.ITIMER_REAL, 0.002, 0.002)
counts = {"interrupted": 0, "lost": 0}
start = time.time()
while time.time() - start < 3:
    try:
        try:
            armed[0] = True
            sess.run(None, {"x": np.ones(4, np.float32)})
            armed[0] = False
        except KeyboardInterrupt:
            armed[0] = False
            counts["interrupted"] += 1
        except Exception as exc:
            armed[0] = False
            if "KeyboardInterrupt" in str(exc):
                counts["lost"] += 1
    except (KeyboardInterrupt, Alarm):  # (a signal landing in the handling above)
        armed[0] = False
signal.setitimer(signal.ITIMER_REAL, 0, 0)
stop[0] = True
print(counts["interrupted"], counts["lost"])
"""


def test_a_signal_while_a_kernel_is_interrupted_does_not_lose_the_interrupt() -> None:
    """A signal whose handler raised while the bridge handled a kernel's KeyboardInterrupt (the bridge ran
    Python code to ask whether it was on the main thread) lost both: run() failed with ONNX Runtime's plain
    error, "kernel raised KeyboardInterrupt", which ``except Exception`` swallows (about 14 runs a second
    under this storm of SIGALRM and Ctrl-C)."""
    proc = subprocess.run([sys.executable, "-c", _SIGNAL_STORM], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    interrupted, lost = map(int, proc.stdout.split())
    assert interrupted > 0 and lost == 0, (interrupted, lost)


_HANDLER = """
import os, signal, numpy as np, opbridge
from onnx import helper, TensorProto as T

calls = []

def handler(signum, frame):  # a program's own Ctrl-C handler: records, then interrupts
    calls.append(signum)
    raise KeyboardInterrupt("the handler's")

signal.signal(signal.SIGINT, handler)

@opbridge.kernel("Raises", domain="test.interrupt")
def raises(x):
    raise KeyboardInterrupt("the kernel's own")

@opbridge.kernel("Interrupted", domain="test.interrupt")
def interrupted(x):
    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the kernel runs
    for _ in range(10**7):
        pass
    return x

for op in ("Raises", "Interrupted"):
    node = helper.make_node(op, ["x"], ["y"], domain="test.interrupt")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", T.FLOAT, [1])], [helper.make_tensor_value_info("y", T.FLOAT, [1])]
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("test.interrupt", 1)]
    sess = opbridge.InferenceSession(helper.make_model(graph, opset_imports=opsets))
    try:
        sess.run(None, {"x": np.ones(1, np.float32)})
        print(op, "not interrupted")
    except KeyboardInterrupt as exc:
        print(op, "KeyboardInterrupt:", exc, "handler calls:", len(calls))
    except Exception as exc:
        print(op, "failed:", type(exc).__name__)
"""


def test_a_programs_own_sigint_handler_runs_once_per_ctrl_c() -> None:
    """With a SIGINT handler of the program's own, a KeyboardInterrupt in a kernel (the kernel's own, or one
    the handler raised on Ctrl-C) raised SIGINT again: the handler ran for a Ctrl-C never pressed (a
    server's graceful shutdown, say). run() now raises the KeyboardInterrupt itself."""
    proc = subprocess.run([sys.executable, "-c", _HANDLER], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "Raises KeyboardInterrupt: the kernel's own handler calls: 0",
        "Interrupted KeyboardInterrupt: the handler's handler calls: 1",
    ], proc.stdout + proc.stderr


def test_keyboard_interrupt_raised_by_a_kernel_off_the_main_thread_stays_in_its_run(tmp_path: Path) -> None:
    """Ctrl-C reaches the main thread only: a KeyboardInterrupt that a kernel raises on another thread
    fails that thread's run and is not raised again in the main thread."""
    out = run_script(
        tmp_path,
        """
        import threading, time, numpy as np, opbridge
        from onnx import helper, TensorProto as T

        @opbridge.kernel("Raises", domain="test.interrupt")
        def raises(x):
            raise KeyboardInterrupt

        node = helper.make_node("Raises", ["x"], ["y"], domain="test.interrupt")
        graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", T.FLOAT, [1])],
                                  [helper.make_tensor_value_info("y", T.FLOAT, [1])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("test.interrupt", 1)])
        sess = opbridge.InferenceSession(model)

        def worker():
            try:
                sess.run(None, {"x": np.ones(1, np.float32)})
            except Exception as exc:
                print("worker:", "KeyboardInterrupt" in str(exc))

        t = threading.Thread(target=worker)
        t.start()
        t.join()
        for _ in range(50):
            time.sleep(0.01)  # a stray SIGINT would be delivered here
        print("main thread not interrupted")
        """,
        timeout=120,
    )
    assert out.split("\n")[:2] == ["worker: True", "main thread not interrupted"], out


def test_wrong_dtype_is_reported() -> None:
    model = make_model("WrongDtype", [("x", F, [2])], [("y", F, [2])])
    with pytest.raises(
        _fail_type(),
        match=r"WrongDtype node .*output 0 has dtype float64, but the node's output "
        r"type is float32",
    ):
        InferenceSession(model).run(None, {"x": np.ones(2, np.float32)})


def test_wrong_output_count_is_reported() -> None:
    model = make_model("WrongCount", [("x", F, [2])], [("y", F, [2])])
    with pytest.raises(_fail_type(), match=r"WrongCount node .*returned 3 output\(s\), the node has 1"):
        InferenceSession(model).run(None, {"x": np.ones(2, np.float32)})


def test_non_array_result_is_reported() -> None:
    model = make_model("NotArray", [("x", F, [2])], [("y", F, [2])])
    with pytest.raises(_fail_type(), match=r"NotArray node .*output 0 is a str, not an array"):
        InferenceSession(model).run(None, {"x": np.ones(2, np.float32)})


@pytest.mark.parametrize(
    ("op_type", "source"),
    [("ShapeChecked", "op's shape rule gives"), ("ShapeDerived", r"op's reference gives \(on meta tensors\)")],
    ids=["rule", "derived"],
)
def test_wrong_shape_is_reported(op_type: str, source: str) -> None:
    """A kernel's result shapes are checked against the op's shape rule, or where it has none, against
    what its reference gives for the inputs' sizes."""
    model = make_model(op_type, [("x", F, ["n", 2])], [("y", F, ["n", 2])])
    with pytest.raises(
        _fail_type(), match=rf"{op_type} node .*output 0 \('output'\) has shape \(1, 2\), but the {source} \(3, 2\)"
    ):
        InferenceSession(model).run(None, {"x": np.ones((3, 2), np.float32)})


def test_missing_required_input_is_reported() -> None:
    """A required input left out is named when the session is created."""
    model = make_model("MaybeAdd", [("y", F, [2])], [("z", F, [2])], node_inputs=["", "y"])
    with pytest.raises(opbridge.OpDefinitionError, match=r"gives no 'x', which the op requires \(it takes x, y\)"):
        InferenceSession(model)


# --------------------------------------------------------------------------- threads


def test_concurrent_python_threads_and_intra_op_threads() -> None:
    """Several Python threads run one session at once, with ONNX Runtime's own threads on."""
    model = make_model("Silu", [("x", F, None)], [("y", F, None)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    sess = InferenceSession(model, sess_options=options)
    assert sess.session.get_session_options().intra_op_num_threads == 2
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(15):
                x = rng.standard_normal((2, 64, 33)).astype(np.float32)
                (y,) = sess.run(None, {"x": x})
                np.testing.assert_allclose(y, x / (1 + np.exp(-x)), rtol=1e-6, atol=1e-7)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a run hung"
    assert not errors, errors


def test_parallel_execution_mode_runs_kernels_off_the_calling_thread() -> None:
    """Two independent custom nodes under ORT_PARALLEL: kernels may run on ORT's inter-op threads."""
    nodes = [
        helper.make_node("Silu", ["x"], ["a"], domain=DOMAIN, name="left"),
        helper.make_node("MaybeAdd", ["x"], ["b"], domain=DOMAIN, name="right", scale=3.0),
        helper.make_node("Add", ["a", "b"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", F, [4])], [helper.make_tensor_value_info("y", F, [4])]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])
    options = ort.SessionOptions()
    options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    options.inter_op_num_threads = 2
    sess = InferenceSession(model, sess_options=options)
    x = np.array([-1.0, 0.0, 0.5, 2.0], np.float32)
    for _ in range(5):
        (y,) = sess.run(None, {"x": x})
        np.testing.assert_allclose(y, x / (1 + np.exp(-x)) + 3 * x, rtol=1e-6)
    assert {k.path for k in sess.kernels.values()} == {"kernel", "reference"}


# --------------------------------------------------------------------------- native side


def test_abi_self_check_passed() -> None:
    InferenceSession(make_model("Identity2", [("x", F, [1])], [("y", F, [1])]))
    report = native.abi_report()
    assert report["selfcheck"] == 1, report["selfcheck_error"]
    assert report["api_version"] in (16, 17) and report["registrations"] >= 1


def test_library_exports_register_custom_ops() -> None:
    import ctypes

    lib = ctypes.CDLL(native.__file__)
    assert hasattr(lib, "RegisterCustomOps")


def test_numpy_kernel_does_not_import_torch(tmp_path: Path) -> None:
    """A deployment with numpy kernels only never imports torch."""
    script = tmp_path / "no_torch.py"
    script.write_text(
        "import sys, numpy as np, opbridge\n"
        "from onnx import helper, TensorProto as T\n"
        "@opbridge.kernel('Neg', domain='nt')\n"
        "def neg(x):\n    return -x\n"
        "n = helper.make_node('Neg', ['x'], ['y'], domain='nt')\n"
        "g = helper.make_graph([n], 'g', [helper.make_tensor_value_info('x', T.FLOAT, [2])],"
        " [helper.make_tensor_value_info('y', T.FLOAT, [2])])\n"
        "m = helper.make_model(g, opset_imports=[helper.make_opsetid('', 17), helper.make_opsetid('nt', 1)])\n"
        "y = opbridge.InferenceSession(m).run(None, {'x': np.ones(2, np.float32)})[0]\n"
        "assert y.tolist() == [-1.0, -1.0], y\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


def test_session_options_are_not_modified() -> None:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    model = make_model("Identity2", [("x", F, [1])], [("y", F, [1])])
    InferenceSession(model, sess_options=options)
    InferenceSession(model, sess_options=options)  # the same options twice: no duplicate registration
    assert options.intra_op_num_threads == 1


def test_optimized_model_filepath_is_not_passed_on(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """ONNX Runtime would save a graph with opbridge's in-memory node tags, which nothing can load: the
    option is left out with a warning, and the session runs."""
    options = ort.SessionOptions()
    target = tmp_path / "optimized.onnx"
    options.optimized_model_filepath = str(target)
    model = make_model("Identity2", [("x", F, [1])], [("y", F, [1])])
    with caplog.at_level("WARNING", logger="opbridge.onnxruntime.session"):
        sess = InferenceSession(model, sess_options=options)
    assert "optimized_model_filepath is not used" in caplog.text
    np.testing.assert_array_equal(sess.run(None, {"x": np.ones(1, np.float32)})[0], np.ones(1, np.float32))
    assert not target.exists()


# --------------------------------------------------------------------------- results written in place (out=)


def _same(x, *_, **__):
    return opbridge.TensorInfo(x.shape, x.dtype)


@opbridge.op(f"{DOMAIN}::SiluOut", shape=_same)
def silu_out(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


@silu_out.register_kernel
def _silu_out_numpy(x, out=None):
    SEEN["SiluOut"] = {"out": None if out is None else (out.shape, out.flags.writeable, out.ctypes.data)}
    t = np.exp(-x)
    t += 1
    return np.divide(x, t, out=out)


@opbridge.op(f"{DOMAIN}::PairOut", outputs=("s", "d"), shape=lambda x, y, **_: (_same(x), _same(x)))
def pair_out(x: torch.Tensor, y: torch.Tensor, mode: str = "in-place") -> tuple[torch.Tensor, torch.Tensor]:
    return x + y, x - y


@pair_out.register_kernel
def _pair_out_numpy(x, y, out=None, mode="in-place"):
    s, d = out
    if mode == "in-place":
        return np.add(x, y, out=s), np.subtract(x, y, out=d)
    if mode == "fresh":  # ignores out: the bridge copies
        return x + y, x - y
    return x[:1] + y[:1], x - y  # wrong shape


def test_out_kernel_writes_into_onnxruntime_outputs() -> None:
    model = make_model("SiluOut", [("x", F, ["n"])], [("y", F, ["n"])])
    sess = InferenceSession(model)
    x = RNG.standard_normal(1000).astype(np.float32)
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(y, x / (1 + np.exp(-x)), rtol=1e-6, atol=1e-7)
    shape, writeable, _ = SEEN["SiluOut"]["out"]
    assert shape == (1000,) and writeable is True


@pytest.mark.parametrize("mode", ["in-place", "fresh"])
def test_out_kernel_with_two_outputs(mode: str) -> None:
    model = make_model("PairOut", [("x", F, [4]), ("y", F, [4])], [("s", F, [4]), ("d", F, [4])], mode=mode)
    x, y = np.arange(4, dtype=np.float32), np.full(4, 0.5, np.float32)
    s, d = InferenceSession(model).run(None, {"x": x, "y": y})
    np.testing.assert_array_equal(s, x + y)
    np.testing.assert_array_equal(d, x - y)


@opbridge.op(f"{DOMAIN}::SiluTorchOut", shape=_same)
def silu_torch_out(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


def _silu_torch_out(x, out=None):
    SEEN["SiluTorchOut"] = None if out is None else (type(out).__name__, tuple(out.shape), out.data_ptr())
    if out is None:
        return x * torch.sigmoid(x)
    return torch.mul(x, torch.sigmoid(x), out=out)


silu_torch_out.register_kernel(_silu_torch_out, kind="torch")


@opbridge.op(f"{DOMAIN}::PairTorchOut", outputs=("s", "d"), shape=lambda x, y, **_: (_same(x), _same(x)))
def pair_torch_out(x: torch.Tensor, y: torch.Tensor, mode: str = "in-place") -> tuple[torch.Tensor, torch.Tensor]:
    return x + y, x - y


def _pair_torch_out(x, y, out=None, mode="in-place"):
    s, d = out
    if mode == "in-place":
        return torch.add(x, y, out=s), torch.sub(x, y, out=d)
    if mode == "fresh":  # ignores out: the bridge copies
        return x + y, x - y
    return x[:1] + y[:1], x - y  # wrong shape


pair_torch_out.register_kernel(_pair_torch_out, kind="torch")


def test_torch_out_kernel_writes_into_onnxruntime_outputs() -> None:
    """A torch kernel with ``out`` gets ONNX Runtime's output as a CPU tensor over its memory."""
    model = make_model("SiluTorchOut", [("x", F, ["n"])], [("y", F, ["n"])])
    sess = InferenceSession(model)
    assert next(iter(sess.kernels.values())).writes_outputs
    x = RNG.standard_normal(1000).astype(np.float32)
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(y, x / (1 + np.exp(-x)), rtol=1e-6, atol=1e-7)
    kind, shape, _ = SEEN["SiluTorchOut"]
    assert (kind, shape) == ("Tensor", (1000,))


@pytest.mark.parametrize("mode", ["in-place", "fresh"])
def test_torch_out_kernel_with_two_outputs(mode: str) -> None:
    model = make_model("PairTorchOut", [("x", F, [4]), ("y", F, [4])], [("s", F, [4]), ("d", F, [4])], mode=mode)
    x, y = np.arange(4, dtype=np.float32), np.full(4, 0.5, np.float32)
    s, d = InferenceSession(model).run(None, {"x": x, "y": y})
    np.testing.assert_array_equal(s, x + y)
    np.testing.assert_array_equal(d, x - y)


@opbridge.op(f"{DOMAIN}::TorchRuleOut", shape=lambda x, **_: opbridge.TensorInfo((x.size(0),), x.dtype))
def torch_rule_out(x: torch.Tensor) -> torch.Tensor:
    return x * 3


def _torch_rule_out(x, out=None):
    SEEN["TorchRuleOut"] = out is not None
    return x * 3 if out is None else torch.mul(x, 3, out=out)


torch_rule_out.register_kernel(_torch_rule_out, kind="torch")


def test_torch_out_kernel_whose_rule_needs_tensors_returns_its_result() -> None:
    """A shape rule that does not run on numpy arrays (``x.size(0)``): the kernel runs without
    ``out`` and its result is copied."""
    model = make_model("TorchRuleOut", [("x", F, [5])], [("y", F, [5])])
    x = np.arange(5, dtype=np.float32)
    (y,) = InferenceSession(model).run(None, {"x": x})
    np.testing.assert_array_equal(y, 3 * x)
    assert SEEN["TorchRuleOut"] is False


def test_torch_out_kernel_wrong_shape_is_reported() -> None:
    model = make_model("PairTorchOut", [("x", F, [4]), ("y", F, [4])], [("s", F, [4]), ("d", F, [4])], mode="wrong")
    with pytest.raises(_fail_type(), match=r"PairTorchOut node .*output 0 has shape \(1,\), but the op's shape rule"):
        InferenceSession(model).run(None, {"x": np.ones(4, np.float32), "y": np.ones(4, np.float32)})


@opbridge.op(f"{DOMAIN}::OutChanged", shape=_same)
def out_changed(x: torch.Tensor, mode: str = "resized") -> torch.Tensor:
    return x * x


@out_changed.register_kernel(kind="torch")
def _out_changed_torch(x, out=None, mode="resized"):
    if out is None:
        return x * x
    if mode == "resized":  # a (1, 3) result into the (2, 3) out: torch resizes the tensor it was given
        return torch.sum(x, 0, keepdim=True, out=out)
    if mode == "retyped":  # int32 values through an int32 view of out
        view = out.view(torch.int32)
        view.copy_((x * x).to(torch.int32))
        return view
    return out.set_(x * x)  # re-pointed at other memory: copied as a result


@opbridge.op(f"{DOMAIN}::OutSwapped", shape=_same)
def out_swapped(x: torch.Tensor) -> torch.Tensor:
    return x * x


@out_swapped.register_kernel
def _out_swapped_numpy(x, out=None):
    if out is None:
        return x * x
    swapped = out.view(out.dtype.newbyteorder())  # the same memory, its bytes read the other way round
    swapped[...] = x * x
    return swapped


def test_out_kernels_returning_out_changed_are_checked_or_copied() -> None:
    """The torch adapter compared the returned tensor with the very tensor it handed over, which the kernel
    had resized or re-typed: ONNX Runtime's buffer came back unchecked (3 values unwritten; int32 bits read
    as float32). A byte-swapped view of a numpy out passed as out itself: its values, byte-swapped."""
    x = np.arange(1, 7, dtype=np.float32).reshape(2, 3)
    for mode, message in [
        ("resized", r"output 0 has shape \(1, 3\), but the op's shape rule gives \(2, 3\)"),
        ("retyped", r"output 0 has dtype int32, but the node's output type is float32"),
    ]:
        model = make_model("OutChanged", [("x", F, [2, 3])], [("y", F, [2, 3])], mode=mode)
        with pytest.raises(_fail_type(), match=message):
            InferenceSession(model).run(None, {"x": x})
    model = make_model("OutChanged", [("x", F, [2, 3])], [("y", F, [2, 3])], mode="repointed")
    np.testing.assert_array_equal(InferenceSession(model).run(None, {"x": x})[0], x * x)
    model = make_model("OutSwapped", [("x", F, [4])], [("y", F, [4])])
    (y,) = InferenceSession(model).run(None, {"x": np.arange(1, 5, dtype=np.float32)})
    np.testing.assert_array_equal(y, np.array([1, 4, 9, 16], np.float32))


def test_out_kernel_wrong_shape_is_reported() -> None:
    model = make_model("PairOut", [("x", F, [4]), ("y", F, [4])], [("s", F, [4]), ("d", F, [4])], mode="wrong")
    with pytest.raises(
        _fail_type(),
        match=r"PairOut node .*output 0 has shape \(1,\), but the op's shape rule "
        r"gives \(4,\)",
    ):
        InferenceSession(model).run(None, {"x": np.ones(4, np.float32), "y": np.ones(4, np.float32)})


def test_session_config_entries_are_copied() -> None:
    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "1")
    options.add_session_config_entry("session.set_denormal_as_zero", "1")
    sess = InferenceSession(make_model("Identity2", [("x", F, [1])], [("y", F, [1])]), sess_options=options)
    copied = sess.session.get_session_options()
    assert copied.get_session_config_entry("session.intra_op.allow_spinning") == "1", "the caller's choice wins"
    assert copied.get_session_config_entry("session.set_denormal_as_zero") == "1"


def test_bridged_sessions_do_not_spin_by_default() -> None:
    """Idle ORT workers spinning beside a Python kernel's threads slowed it 2-4x: off unless asked for."""
    sess = InferenceSession(make_model("Identity2", [("x", F, [1])], [("y", F, [1])]))
    options = sess.session.get_session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert options.get_session_config_entry("session.inter_op.allow_spinning") == "0"


def test_benchmark_quick_smoke_run() -> None:
    """The benchmark runs end to end (--quick: tiny tensor, few runs; no timing asserted)."""
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "ort_bridge.py"
    out = subprocess.run(
        [sys.executable, str(script), "--quick"], capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "| (c') bridge, numpy kernel (out=), bound |" in out.stdout
    for mode in ("serial", "stream", "auto"):
        assert f"bridge overhead per call (one copy, {mode}):" in out.stdout
    assert "| (c) bridge, numpy kernel (one copy), auto copy, bound |" in out.stdout


# --------------------------------------------------------------------------- kernels that keep or write views

KEPT: list = []


@opbridge.kernel("KeepInput", domain=DOMAIN)
def _keep_input(x: np.ndarray) -> np.ndarray:
    KEPT.append(x)  # the view of ONNX Runtime's buffer outlives the call
    return x.copy()


@opbridge.op(f"{DOMAIN}::KeepOut", shape=lambda x, **_: opbridge.TensorInfo(x.shape, x.dtype))
def keep_out(x: torch.Tensor) -> torch.Tensor:
    return 2 * x


@keep_out.register_kernel
def _keep_out_kernel(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    KEPT.append(out)  # a later write through it would change a result already returned
    return np.multiply(x, 2, out=out)


@opbridge.kernel("AddOneInPlace", domain=DOMAIN, kind="torch")
def _add_one_in_place(x: torch.Tensor) -> torch.Tensor:
    return x.view(-1).add_(1).view(x.shape)  # through a view: the same buffer


@pytest.mark.parametrize(
    ("op_type", "match"),
    [
        ("KeepInput", "the kernel kept its input 0 after returning; it views ONNX Runtime's memory"),
        ("KeepOut", "the kernel kept its out= array 0 after returning"),
    ],
    ids=["input", "out"],
)
def test_kernel_that_keeps_a_buffer_view_fails_the_run(op_type: str, match: str) -> None:
    """A kept view of ONNX Runtime's memory would read freed memory (or overwrite a returned result)
    later: the run fails naming it, instead of crashing later."""
    sess = InferenceSession(make_model(op_type, [("x", F, [4])], [("y", F, [4])]))
    KEPT.clear()
    with pytest.raises(Exception, match=match):
        sess.run(None, {"x": np.ones(4, np.float32)})
    KEPT.clear()


def test_kept_arrays_and_tensors_hold_copies_once_the_run_fails(tmp_path: Path) -> None:
    """The run failed naming the kept view, but the view still pointed at ONNX Runtime's memory: read after
    the session was gone (or, without the arena, once the run returned) it crashed the process. Kept numpy
    arrays and torch tensors, views of the tensors included, now hold copies of the values they had."""
    out = run_script(
        tmp_path,
        """
        import gc
        import numpy as np
        import onnxruntime as ort
        import torch
        from onnx import TensorProto, helper
        import opbridge

        kept = {}

        @opbridge.kernel("tests.kept::KeepNumpy")
        def keep_numpy(x):
            kept["numpy"] = x
            return x + 1

        @opbridge.kernel("tests.kept::KeepTorch", kind="torch")
        def keep_torch(x):
            kept["torch"], kept["torch view"] = x, x[1:]
            return x + 1

        @opbridge.kernel("tests.kept::KeepTorchAndRaise", kind="torch")
        def keep_torch_and_raise(x):
            kept["raised"] = x.view(-1)
            raise ValueError("the kernel's own failure")

        x = np.random.default_rng(0).standard_normal((1024, 4096)).astype(np.float32)  # 16 MiB
        for op in ("KeepNumpy", "KeepTorch", "KeepTorchAndRaise"):
            graph = helper.make_graph(
                [helper.make_node("Neg", ["x"], ["t"]), helper.make_node(op, ["t"], ["y"], domain="tests.kept")],
                "g",
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1024, 4096])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
            )
            model = helper.make_model(
                graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("tests.kept", 1)]
            )
            options = ort.SessionOptions()
            options.enable_cpu_mem_arena = False  # (freed memory goes back to the system at once)
            session = opbridge.InferenceSession(model, sess_options=options)
            try:
                session.run(None, {"x": x})
            except Exception as exc:
                print(op, "refused:", "kept its input 0 after returning" in str(exc) or "own failure" in str(exc))
            del session
            gc.collect()
        for name, value in kept.items():
            got = value.numpy() if isinstance(value, torch.Tensor) else value
            want = {"torch view": -x[1:]}.get(name, -x).reshape(got.shape)
            print(name, "equal:", bool(np.array_equal(got, want)))
        """,
    )
    assert out.split("\n")[:3] == [f"{op} refused: True" for op in ("KeepNumpy", "KeepTorch", "KeepTorchAndRaise")]
    assert sorted(out.split("\n")[3:7]) == sorted(
        f"{name} equal: True" for name in ("numpy", "torch", "torch view", "raised")
    ), out


@opbridge.kernel("RaiseWithNul", domain=DOMAIN)
def _raise_with_nul(x: np.ndarray) -> np.ndarray:
    raise ValueError("bad value\x00 at index 3")


def test_a_kernel_message_with_a_nul_reaches_the_caller_whole() -> None:
    """The message was cut at the NUL ("kernel raised ValueError: bad value"): C strings carry it."""
    sess = InferenceSession(make_model("RaiseWithNul", [("x", F, [4])], [("y", F, [4])]))
    with pytest.raises(Exception, match=r"kernel raised ValueError: bad value\\x00 at index 3"):
        sess.run(None, {"x": np.ones(4, np.float32)})


@opbridge.kernel("KeepInputAndRaise", domain=DOMAIN)
def _keep_input_and_raise(x: np.ndarray) -> np.ndarray:
    KEPT.append(x)
    raise ValueError("the kernel's own failure")


def test_a_kernel_that_fails_and_keeps_a_view_is_told_both() -> None:
    sess = InferenceSession(make_model("KeepInputAndRaise", [("x", F, [4])], [("y", F, [4])]))
    KEPT.clear()
    with pytest.raises(
        Exception, match=r"kernel raised ValueError: the kernel's own failure.*; and .*kept its input 0"
    ):
        sess.run(None, {"x": np.ones(4, np.float32)})
    KEPT.clear()


def test_a_kernel_result_list_and_a_shape_rule_are_read_from_copies() -> None:
    """The bridge reads a result list and a shape rule's dims from tuples of their items: a dim's
    ``__index__`` (Python code, run while the bridge reads) that empties the rule's list cannot make
    it read freed memory, nor can another thread that empties a result list while a large output is
    copied without the GIL."""
    from opbridge.onnxruntime.bridge import NODE_ATTRIBUTE, register_ops

    dims: list = []

    class EmptiesTheList:
        def __index__(self) -> int:
            dims.clear()
            return 3

    def shapes(*arrays: np.ndarray) -> list:
        dims[:] = [EmptiesTheList(), 4, 5]
        return [dims]

    def fn(*arrays: np.ndarray, out: np.ndarray | None = None) -> list:
        assert out is not None
        out[...] = 1.0
        return [out]  # a list, as a kernel may return its outputs

    opts = ort.SessionOptions()
    descriptors = register_ops(
        opts, [(DOMAIN, "ListRule", 1, [F])], lambda node_id: (fn, "ListRule", False, shapes, None, 1)
    )
    node = helper.make_node("ListRule", ["x"], ["y"], domain=DOMAIN)
    node.attribute.append(helper.make_attribute(NODE_ATTRIBUTE, 0))
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", F, None)], [helper.make_tensor_value_info("y", F, None)]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    for d in descriptors:
        d.release()
    (y,) = sess.run(None, {"x": np.ones(3, np.float32)})
    np.testing.assert_array_equal(y, np.ones((3, 4, 5), np.float32))


def test_torch_kernel_writing_its_input_fails_the_run() -> None:
    """torch kernels get writable tensors over ONNX Runtime's buffers; a kernel that writes one (here
    an initializer, through a view) fails the run naming the input."""
    node = helper.make_node("AddOneInPlace", ["w"], ["y"], domain=DOMAIN)
    graph = helper.make_graph(
        [node],
        "g",
        [],
        [helper.make_tensor_value_info("y", F, [3])],
        initializer=[helper.make_tensor("w", F, [3], [1.0, 2.0, 3.0])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])
    sess = InferenceSession(model)
    with pytest.raises(Exception, match="the kernel wrote input 0 in place"):
        sess.run(None, {})


def _rule_refusing_three_rows(x: object, **_: object) -> opbridge.TensorInfo:
    if x.shape[0] == 3:  # type: ignore[attr-defined]
        raise ValueError("this rule refuses 3 rows")
    return opbridge.TensorInfo(x.shape, x.dtype)  # type: ignore[attr-defined]


@opbridge.op(f"{DOMAIN}::RuleRefuses", shape=_rule_refusing_three_rows)
def rule_refuses(x: torch.Tensor) -> torch.Tensor:
    return 2 * x


@rule_refuses.register_kernel
def _rule_refuses_kernel(x: np.ndarray) -> np.ndarray:
    return np.zeros(1, np.float32) if x.shape[0] == 5 else 2 * x  # a wrong shape at 5 rows


def test_shape_check_survives_a_rule_that_refuses_one_call() -> None:
    """A shape rule that refuses one call's inputs (a ValueError) skips the check for that call only:
    a wrong result shape on a later call is still reported."""
    sess = InferenceSession(make_model("RuleRefuses", [("x", F, None)], [("y", F, None)]))
    np.testing.assert_array_equal(sess.run(None, {"x": np.ones((3, 2), np.float32)})[0], np.full((3, 2), 2.0))
    with pytest.raises(
        Exception, match=r"output 0 \('output'\) has shape \(1,\), but the op's shape rule gives \(5, 2\)"
    ) as err:
        sess.run(None, {"x": np.ones((5, 2), np.float32)})
    # the check's own words, once: not as an exception the kernel raised, with the check's source line
    message = str(err.value)
    assert "kernel raised" not in message and "shape.py" not in message, message
    assert message.count("::RuleRefuses node") == 1, message


@opbridge.kernel("KeepsAnException", domain=DOMAIN)
def _keeps_an_exception(x: np.ndarray) -> np.ndarray:
    err = None
    try:
        raise ValueError("a fallback path")
    except ValueError as exc:
        err = exc  # the traceback holds this frame, which holds x: a cycle, not a kept view
    assert err is not None
    return x * 2


def test_a_reference_cycle_in_the_kernel_is_not_a_kept_view() -> None:
    """A kernel frame held by a reference cycle (a stored exception) keeps its input until the
    collector runs; the bridge collects once before judging, and the run succeeds."""
    sess = InferenceSession(make_model("KeepsAnException", [("x", F, [3])], [("y", F, [3])]))
    np.testing.assert_array_equal(sess.run(None, {"x": np.ones(3, np.float32)})[0], np.full(3, 2.0))


def test_trailing_empty_optional_inputs_are_not_extra_inputs() -> None:
    """["x", "y", ""]: the empty name at the end is an optional input left out, not a third input."""
    model = make_model("MaybeAdd", [("x", F, [2])], [("z", F, [2])], node_inputs=["x", "", ""], scale=3.0)
    np.testing.assert_array_equal(InferenceSession(model).run(None, {"x": np.ones(2, np.float32)})[0], np.full(2, 3.0))


@opbridge.op("test.ortbridge.messages::WritesOut", shape=lambda x: opbridge.TensorInfo(x.shape, x.dtype))
def _writes_out(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_writes_out.register_kernel
def _(x: np.ndarray, out: np.ndarray | None = None) -> None:
    np.multiply(x, 2, out=out)  # writes `out` and forgets to return it


@opbridge.op("test.ortbridge.messages::Shrinks", shape=lambda x: opbridge.TensorInfo((x.shape[0] - 1,), x.dtype))
def _shrinks(x: torch.Tensor) -> torch.Tensor:
    return x[1:]


@_shrinks.register_kernel
def _(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    # takes `out`: the bridge allocates the outputs from the shape rule before the kernel runs
    if out is None:
        return x[1:]
    out[...] = x[1:]
    return out


def test_kernel_result_messages_say_what_to_return_and_which_dim_is_bad() -> None:
    x = np.ones(3, np.float32)
    sess = opbridge.InferenceSession(_op_model(_writes_out))
    with pytest.raises(
        _fail_type(), match=r"output 0 is a NoneType, not an array; .*a kernel that writes `out` returns it"
    ):
        sess.run(None, {"x": x})
    sess = opbridge.InferenceSession(_op_model(_shrinks))
    assert sess.run(None, {"x": x})[0].shape == (2,)
    with pytest.raises(
        _fail_type(), match=r"the shape rule gave output 0 a dim 0 of -1 for these inputs; sizes are >= 0"
    ):
        sess.run(None, {"x": np.ones(0, np.float32)})


def _op_model(opdef: opbridge.OpDef) -> onnx.ModelProto:
    spec = opdef.spec
    graph = helper.make_graph(
        [helper.make_node(spec.name, ["x"], ["y"], domain=spec.domain)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(spec.domain, 1)])


def test_registered_kernel_node_with_an_unnamed_output_is_named_at_load() -> None:
    """ONNX lets a node leave an output unnamed; the kernel produces every output, so the session names
    the node when it is created (ONNX Runtime said it "could not allocate output 1" at run time)."""
    model = make_model("Split2", [("x", F, [2]), ("y", F, [2])], [("s", F, [2])], name="split_node")
    model.graph.node[0].output.append("")
    with pytest.raises(opbridge.OpDefinitionError, match=r"Split2 node 'split_node' leaves output\(s\) \[1\] unnamed"):
        InferenceSession(model)


@opbridge.op(f"{DOMAIN}::TransposedOut", shape=_same)
def transposed_out(x: torch.Tensor) -> torch.Tensor:
    return x.T + 1


def _transposed_numpy(x, out=None):
    if out is None:
        return x.T + 1
    np.add(x, 1, out=out)
    return out.T  # a view of out in another layout: the result is x.T + 1


def _transposed_torch(x, out=None):
    if out is None:
        return x.T + 1
    torch.add(x, 1, out=out)
    return out.T


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_a_result_over_out_in_another_layout_is_copied_as_the_result(kind: str) -> None:
    """A result at out's address and of out's shape but with other strides (out.T of a square output) was
    taken as written in place: ONNX Runtime returned out, not the kernel's result."""
    transposed_out.register_kernel(_transposed_numpy if kind == "numpy" else _transposed_torch, kind=kind)
    model = make_model("TransposedOut", [("x", F, [3, 3])], [("y", F, [3, 3])])
    x = np.arange(9, dtype=np.float32).reshape(3, 3)
    (y,) = InferenceSession(model).run(None, {"x": x})
    np.testing.assert_array_equal(y, x.T + 1)


@opbridge.op(f"{DOMAIN}::MissingFile", shape=_same)
def missing_file(x: torch.Tensor) -> torch.Tensor:
    return x


@missing_file.register_kernel
def _missing_file(x):
    name = os.fsdecode(b"/data/calib_\xff.bin")  # a file name's undecodable byte: a lone surrogate
    raise FileNotFoundError(f"calibration table {name} is missing")


def test_a_message_utf8_cannot_hold_is_carried_escaped() -> None:
    """An exception message with a lone surrogate was lost whole ("message could not be read")."""
    sess = InferenceSession(make_model("MissingFile", [("x", F, [2])], [("y", F, [2])]))
    with pytest.raises(_fail_type(), match=r"FileNotFoundError: calibration table /data/calib_\\udcff.bin is missing"):
        sess.run(None, {"x": np.ones(2, np.float32)})


@opbridge.op(f"{DOMAIN}::Exits", shape=_same)
def exits(x: torch.Tensor) -> torch.Tensor:
    return x


EXITS: list[int | str] = [3]


@exits.register_kernel
def _exits(x):
    if EXITS:
        code = EXITS.pop()
        sys.exit(x if code == "input" else code)  # as a SIGTERM handler's graceful shutdown would, while it runs
    return x + 1


@pytest.mark.parametrize("mode", ["sequential", "parallel"])
def test_sys_exit_inside_a_kernel_ends_the_caller_too(mode: str, caplog: pytest.LogCaptureFixture) -> None:
    """A SystemExit in a kernel became an ONNX Runtime error, which a serving loop catching per-request
    exceptions survived (exit status 0). In ONNX Runtime's parallel execution mode, where the kernel runs
    on an inter-op thread, it still did. The SystemExit carries no traceback: the kernel's frames held
    its input, a view of memory ONNX Runtime frees (and read as an input the kernel kept)."""
    options = ort.SessionOptions()
    if mode == "parallel":
        options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    sess = InferenceSession(make_model("Exits", [("x", F, [2])], [("y", F, [2])]), sess_options=options)
    EXITS[:] = [3]
    with pytest.raises(SystemExit) as raised:
        sess.run(None, {"x": np.ones(2, np.float32)})
    frames, tb = [], raised.value.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    assert raised.value.code == 3 and "_exits" not in frames and frames[-1] == "run"  # (raised by run() itself)
    assert "kept its input" not in caplog.text
    # nothing is left over for the next run
    np.testing.assert_array_equal(sess.run(None, {"x": np.ones(2, np.float32)})[0], [2.0, 2.0])
    assert native.take_exit(True) is None
    # sys.exit(x) of the kernel's input, a view of memory ONNX Runtime frees: the code was that view, read after
    # the run (as the interpreter prints it) from freed memory; it is a copy
    EXITS[:] = ["input"]
    with pytest.raises(SystemExit) as raised:
        sess.run(None, {"x": np.full(2, 5.0, np.float32)})
    code = raised.value.code
    assert isinstance(code, np.ndarray) and code.flags.owndata and code.tolist() == [5.0, 5.0]


def test_a_failed_run_raises_only_its_own_kernels_exit() -> None:
    """A SystemExit kept from another thread's run (here through the raw ONNX Runtime session, whose
    caller never takes it) surfaced from the next failed run of a parallel-mode session on any thread,
    and on the same thread a sequential session's next failure raised it: each run now takes only the
    exits of its own kernels."""
    model = make_model("Exits", [("x", F, [2])], [("y", F, [2])])
    raw = InferenceSession(model)
    EXITS[:] = [5]

    def leave_an_exit() -> None:
        with pytest.raises(_fail_type()):
            raw.session.run(None, {"x": np.ones(2, np.float32)})

    other = threading.Thread(target=leave_an_exit)
    other.start()
    other.join()
    options = ort.SessionOptions()
    options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    for sess in (InferenceSession(model, sess_options=options), raw):
        with pytest.raises(Exception) as caught:  # a feed of the wrong shape: the run's own failure
            sess.run(None, {"x": np.ones(3, np.float32)})
        assert not isinstance(caught.value, SystemExit)
    EXITS[:] = [6]
    with pytest.raises(_fail_type()):
        raw.session.run(None, {"x": np.ones(2, np.float32)})  # (kept on this thread, never taken)
    with pytest.raises(Exception) as caught:
        raw.run(None, {"x": np.ones(3, np.float32)})
    assert not isinstance(caught.value, SystemExit)


def test_a_kernel_running_its_own_session_works_or_is_refused(tmp_path: Path) -> None:
    """A kernel calling run() of its own session in ONNX Runtime's parallel execution mode waited forever
    for the inter-op thread it ran on; it is refused by name there, and sequential runs nest (in a process
    of its own, with a time limit, should it hang again)."""
    stdout = run_script(
        tmp_path,
        """
        import numpy as np, onnxruntime as ort, torch
        from onnx import TensorProto, helper
        import opbridge

        @opbridge.op("test.nested::Nested")
        def nested(x: torch.Tensor) -> torch.Tensor:
            return x + 1

        box = {}

        @nested.register_kernel
        def _(x):
            if x.flat[0] > 0:  # the model once more on x - 1, in the kernel's own session
                return box["session"].run(None, {"x": x - np.float32(1)})[0] + np.float32(1)
            return x + np.float32(1)

        value = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [2])
        graph = helper.make_graph([helper.make_node("Nested", ["x"], ["y"], domain="test.nested")], "g",
                                  [value("x")], [value("y")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("test.nested", 1)])
        for mode in (ort.ExecutionMode.ORT_SEQUENTIAL, ort.ExecutionMode.ORT_PARALLEL):
            options = ort.SessionOptions()
            options.execution_mode = mode
            box["session"] = opbridge.InferenceSession(model, sess_options=options)
            try:
                print(mode.name, box["session"].run(None, {"x": np.full(2, 2.0, np.float32)})[0].tolist())
            except Exception as exc:
                print(mode.name, "refused:", "a kernel called run() of its own session, which runs in" in str(exc))
        """,
        timeout=120,
    )
    assert stdout.splitlines() == ["ORT_SEQUENTIAL [3.0, 3.0]", "ORT_PARALLEL refused: True"]


def test_dropped_sessions_free_their_bridged_ops() -> None:
    """A server that reloads models creates and drops sessions: the bridge's op entries (and their
    domains) go with the session and the options that received them, none is kept per session."""
    import gc

    model = make_model("Identity2", [("x", F, [2])], [("y", F, [2])])
    x = np.array([1.5, -2.0], np.float32)
    gc.collect()
    before = native.abi_report()["live_ops"]
    for _ in range(3):
        sess = InferenceSession(model)
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x)
        assert native.abi_report()["live_ops"] == before + 1
        del sess
        gc.collect()
        assert native.abi_report()["live_ops"] == before


def test_bridged_ops_live_as_long_as_their_options_and_kernels() -> None:
    """Options that received the bridge can still create sessions (which read its ops), and a session's
    kernels call their op: each keeps the ops, and they go with the last of them."""
    import gc

    model = make_model("Identity2", [("x", F, [2])], [("y", F, [2])])
    x = np.array([1.5, -2.0], np.float32)
    gc.collect()
    before = native.abi_report()["live_ops"]
    kept: list = []

    def make_options() -> object:
        kept.append(ort.SessionOptions())
        return kept[-1]

    sess = InferenceSession(model, sess_options=make_options)
    tagged = sess.model.SerializeToString()
    del sess
    gc.collect()
    assert native.abi_report()["live_ops"] == before + 1
    with pytest.raises(Exception, match="registered for a session that is gone"):
        ort.InferenceSession(tagged, sess_options=kept[0], providers=["CPUExecutionProvider"])
    kept.clear()
    gc.collect()
    assert native.abi_report()["live_ops"] == before

    inner = InferenceSession(model).session
    # (onnxruntime's own hold on the options: without it they go before the session)
    inner._sess_options_initial = inner._sess_options = None
    gc.collect()
    assert native.abi_report()["live_ops"] == before + 1
    np.testing.assert_array_equal(inner.run(None, {"x": x})[0], x)
    del inner
    gc.collect()
    assert native.abi_report()["live_ops"] == before


@opbridge.op("test.ortbridge::RuleSaysFloat", shape=lambda x: opbridge.TensorInfo(x.shape, x.dtype))
def _rule_says_float(x: torch.Tensor) -> torch.Tensor:
    return x.double() * 0.5


@opbridge.op("test.ortbridge::RowsAsList")
def _rows_as_list(x: torch.Tensor) -> torch.Tensor:
    return x + x


@_rows_as_list.register_kernel
def _rows_as_list_numpy(x: np.ndarray) -> object:
    return (x + x).tolist()


def test_a_reference_contradicting_its_rule_and_a_list_result_are_named() -> None:
    """The node's types come from the rule: a float64 reference read as a kernel returning the wrong dtype;
    a list of rows read as one output per row."""
    x = np.ones((2, 3), np.float32)
    model = make_model("RuleSaysFloat", [("x", F, [2, 3])], [("y", F, [2, 3])], name="n")
    with pytest.raises(_fail_type(), match=r"the shape rule declares output 0 \('output'\) as \[2, 3\] torch\.float32"):
        InferenceSession(model).run(None, {"x": x})
    model = make_model("RowsAsList", [("x", F, [2, 3])], [("y", F, [2, 3])], name="n")
    with pytest.raises(_fail_type(), match=r"the kernel returned a list \(of list\), not an array; return a numpy"):
        InferenceSession(model).run(None, {"x": x})


@opbridge.op(f"{DOMAIN}::PairNoReturn")
def _pair_no_return(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x + 1, x * 2


@_pair_no_return.register_shape
def _pair_no_return_shape(x):  # (a rule: ONNX Runtime's outputs are allocated and handed to the kernel as out)
    return opbridge.TensorInfo(x.shape, x.dtype), opbridge.TensorInfo(x.shape, x.dtype)


@_pair_no_return.register_kernel
def _pair_no_return_kernel(x, out=None):
    np.add(x, 1, out=out[0])  # (writes ONNX Runtime's buffers, and forgets to return them)
    np.multiply(x, 2, out=out[1])


def test_a_multi_output_out_kernel_returning_none_is_told_so() -> None:
    """The message said "the kernel returned 1 output, the node has 2" for a kernel that returned None."""
    model = make_model("PairNoReturn", [("x", F, [2])], [("a", F, [2]), ("b", F, [2])], name="pair")
    with pytest.raises(Exception, match=r"the kernel returned None, the node has 2 outputs; .*returns out"):
        InferenceSession(model).run(None, {"x": np.ones(2, np.float32)})


@opbridge.op(f"{DOMAIN}::MeanRows")
def _mean_rows(x: torch.Tensor) -> torch.Tensor:
    return x.float().mean(0)


@_mean_rows.register_shape
def _mean_rows_shape(x):  # (torch's dtype API: numpy arrays' dtypes fail it)
    return opbridge.TensorInfo(tuple(x.shape[1:]), torch.promote_types(x.dtype, torch.float32))


@_mean_rows.register_kernel
def _mean_rows_kernel(x):
    return x.astype(np.float32)  # (forgets the mean: shape (4, 3) where the rule says (3,))


def test_a_shape_rule_written_for_torch_dtypes_still_checks_the_kernel() -> None:
    """The rule raised on numpy arrays' dtypes, and the bridge turned the shape check off for the session
    without a word: the kernel's (4, 3) came back where the op gives (3,)."""
    model = make_model("MeanRows", [("x", F, [4, 3])], [("y", F, [3])], name="mean")
    with pytest.raises(
        Exception, match=r"output 0 \('output'\) has shape \(4, 3\), but the op's shape rule gives \(3,\)"
    ):
        InferenceSession(model).run(None, {"x": np.ones((4, 3), np.float32)})


@opbridge.op("tests.bridge::TwoOut", outputs=("a", "b"))
def _two_out(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x * 9, x * 2


@_two_out.register_shape
def _two_out_shape(x):
    return opbridge.TensorInfo(x.shape, x.dtype), opbridge.TensorInfo(x.shape, x.dtype)


def _in_other_buffer(x, out=None):
    """Output b computed in output a's buffer, returned as b; a new array for a."""
    out[0][...] = x * 2
    return x * 9, out[0]


def _swapped(x, out=None):
    """Each output computed in the other's buffer."""
    out[0][...] = x * 2
    out[1][...] = x * 9
    return out[1], out[0]


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("kernel", [_in_other_buffer, _swapped], ids=["in-other-buffer", "swapped"])
def test_a_result_in_another_outputs_buffer_is_delivered_whole(kernel, kind: str) -> None:
    """Results are copied into their outputs in order: a result lying in an earlier output's buffer was
    overwritten before it was copied, and that output came back with the other's values, silently."""
    if kind == "torch":
        numpy_kernel = kernel

        def kernel(x, out=None):  # (the same kernel over tensors)
            return numpy_kernel(x, out=out)

    _two_out.register_kernel(kernel, kind=kind)
    try:
        node = helper.make_node("TwoOut", ["x"], ["a", "b"], domain="tests.bridge")
        graph = helper.make_graph(
            [node],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in "ab"],
        )
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("tests.bridge", 1)]
        )
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        a, b = InferenceSession(model.SerializeToString()).run(None, {"x": x})
        np.testing.assert_array_equal(a, x * 9)
        np.testing.assert_array_equal(b, x * 2)
    finally:
        _two_out.kernel = None


@opbridge.kernel("Ident", domain="test.toobig")
def _ident(x: np.ndarray) -> np.ndarray:
    return x


def test_an_input_numpy_cannot_hold_is_named_with_the_node() -> None:
    """An empty input whose dims multiply past numpy's limit (0 x 2**32 x 2**32) failed with numpy's bare
    "array is too big", naming neither the node nor the input; the session stays usable."""
    nodes = [
        helper.make_node(
            "ConstantOfShape", ["shape"], ["z"], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0])
        ),
        helper.make_node("Ident", ["z"], ["y"], domain="test.toobig", name="wide"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("shape", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("test.toobig", 1)]
    sess = InferenceSession(helper.make_model(graph, opset_imports=opsets, ir_version=9))
    with pytest.raises(Exception, match=r"test.toobig::Ident node 'wide': input 0 cannot be given to the kernel as a "):
        sess.run(None, {"shape": np.array([0, 2**32, 2**32], np.int64)})
    assert sess.run(None, {"shape": np.array([0, 3, 4], np.int64)})[0].shape == (0, 3, 4)
