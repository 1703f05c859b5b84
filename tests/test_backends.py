"""Each backend runs each seed model (both exporters) at its export shape and its other shapes."""

from __future__ import annotations

import dataclasses
import logging
import threading
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx
import pytest
import torch
from conftest import EXPORTERS, SEED_IDS, seed_by_name
from onnx import TensorProto, helper

import opbridge
from opbridge.backends import BACKENDS, InputError, TensorMeta, available_backends, backend_names, get_backend
from opbridge.backends.base import BackendRunError, check_feed, onnx_io_meta
from opbridge.backends.onnxruntime_backend import OnnxRuntimeRunner
from opbridge.backends.openvino_backend import OpenVINORunner
from opbridge.backends.torch_backend import TorchRunner
from opbridge.compare import compare_arrays
from opbridge.spec import Tolerance
from opbridge.verify import make_inputs, resolve_shape_sets

TIGHT = Tolerance(rtol=1e-3, atol=1e-5)


def _needs(backend: str) -> None:
    """Skip when the backend's runtime is not installed."""
    cls = BACKENDS[backend]
    if not cls.available():
        pytest.skip(cls.unavailable_reason() or f"{backend} not installed")


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", SEED_IDS)
@pytest.mark.parametrize(
    ("backend", "functions"),
    [
        ("openvino", True),
        ("openvino", False),
        ("onnxruntime", True),
        ("onnxruntime", False),
        ("reference", True),
        ("reference", False),
    ],
    ids=["openvino", "openvino-python-ops", "onnxruntime", "onnxruntime-bridge", "reference", "reference-kernels"],
)
def test_backend_runs_seed_model(seed_export, backend: str, functions: bool, name: str, exporter: str) -> None:
    """``functions=False`` exports the seed ops without ONNX bodies, so OpenVINO must run them as Python ops."""
    _needs(backend)
    seed = seed_by_name(name)
    result = seed_export(name, exporter, functions=functions)
    meta, outs = onnx_io_meta(result.model)
    with TorchRunner(seed.reference, meta, [o.name for o in outs]) as ref, get_backend(backend)(result.path) as runner:
        assert [m.name for m in runner.input_metadata()] == list(seed.input_names)
        assert runner.output_names() == list(seed.output_names)
        example = {m.name: tuple(t.shape) for m, t in zip(meta, ref.example_inputs)}
        sets = resolve_shape_sets(meta, [example, *seed.shapes], example)
        for i, shapes in enumerate(sets):
            feed = make_inputs(meta, shapes, seed=i)
            got, want = runner.infer(feed), ref.infer(feed)
            assert sorted(got) == sorted(want)
            for out_name in want:
                cmp = compare_arrays(got[out_name], want[out_name], TIGHT, out_name)
                assert cmp.passed, f"{backend} {name}/{exporter} set {shapes}: {cmp.reason}"
                assert cmp.shape == tuple(want[out_name].shape)


def test_openvino_runs_seed_ops_through_their_references(seed_export) -> None:
    """Without bodies and numpy kernels, OpenVINO runs the seed ops' PyTorch references (DynamicResize:
    its torch kernel, the same PyTorch op), one op class each."""
    _needs("openvino")
    for name in SEED_IDS:
        want = {"torch kernel"} if name == "super_resolution" else {"PyTorch reference"}
        with OpenVINORunner(seed_export(name, "dynamo", functions=False).path) as runner:
            assert runner.kernels and {k.source for k in runner.kernels} == want
    with OpenVINORunner(seed_export("strange_net", "torchscript", functions=False).path) as runner:
        assert [k.qualname for k in runner.kernels] == ["opbridge::MyStrangeOp"] * 2


def test_openvino_dynamic_resize_follows_the_shape_only_input(seed_export) -> None:
    _needs("openvino")
    with OpenVINORunner(seed_export("super_resolution", "torchscript", functions=False).path) as runner:
        feed = {
            "input": np.random.default_rng(0).random((1, 3, 10, 12), dtype=np.float32),
            "size_tensor": np.zeros((1, 1, 23, 7), np.float32),
        }
        assert runner.infer(feed)["output"].shape == (1, 3, 23, 7)


# --------------------------------------------------------------------------- ops defined here


@opbridge.op("tests.backends::ScaleShift")
def scale_shift(x: torch.Tensor, scale: float = 2.0, names: list[str] = ["a", "b"]) -> torch.Tensor:  # noqa: B006
    """x * scale + len(names)."""
    return x * scale + len(names)


@scale_shift.register_kernel
def _scale_shift_numpy(x: np.ndarray, scale: float, names: tuple[str, ...]) -> np.ndarray:
    return x * np.float32(scale) + np.float32(len(names))


@opbridge.op("tests.backends::Twice")
def twice(x: torch.Tensor) -> torch.Tensor:
    """2 x."""
    return 2 * x


@twice.register_function
def _twice_body(spec: opbridge.OpSpec) -> onnx.FunctionProto:
    return helper.make_function(
        spec.domain,
        spec.name,
        ["x"],
        ["output"],
        [helper.make_node("Add", ["x", "x"], ["output"])],
        [helper.make_opsetid("", 17)],
    )


class _Model(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return twice(scale_shift(x, scale=0.5, names=["p", "q", "r"]))


class _BodyOnly(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return twice(x) + 1.0


def _export(tmp_path, module: torch.nn.Module, name: str) -> str:
    path = tmp_path / f"{name}.onnx"
    opbridge.export(
        module,
        (torch.randn(2, 3),),
        path,
        exporter="torchscript",
        input_names=["x"],
        output_names=["y"],
        dynamic_axes={"x": {0: "n"}, "y": {0: "n"}},
    )
    return str(path)


def test_openvino_runs_numpy_kernel_with_string_list_attribute_and_inlined_body(tmp_path) -> None:
    _needs("openvino")
    path = _export(tmp_path, _Model(), "kernel_and_body")
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    with OpenVINORunner(path) as runner:
        assert [k.source for k in runner.kernels] == ["numpy kernel"]  # Twice was inlined: standard ops
        y = runner.infer({"x": x})["y"]
    np.testing.assert_allclose(y, 2 * (x * 0.5 + 3), rtol=1e-6)


@pytest.mark.parametrize("backend", ["onnxruntime", "reference"])
def test_onnx_backends_run_custom_nodes_with_function_bodies(tmp_path, backend: str) -> None:
    cls = BACKENDS[backend]
    if not cls.available():
        pytest.skip(cls.unavailable_reason() or "not installed")
    path = _export(tmp_path, _BodyOnly(), "body_only")
    x = np.linspace(-1, 1, 15, dtype=np.float32).reshape(5, 3)
    with cls(path) as runner:
        meta = runner.input_metadata()
        assert meta[0].name == "x" and meta[0].dtype == np.float32 and meta[0].shape[1] == 3
        y = runner.infer({"x": x})["y"]
    np.testing.assert_allclose(y, 2 * x + 1, rtol=1e-6)


def _default_domain_model() -> onnx.ModelProto:
    node = helper.make_node("LegacySquare", ["x"], ["y"], shift=1.5)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@opbridge.kernel("LegacySquare", domain="")
def _legacy_square(x: np.ndarray, *, shift: float = 0.0) -> np.ndarray:
    return x * x + np.float32(shift)


def test_openvino_repairs_default_domain_custom_ops() -> None:
    _needs("openvino")
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    with OpenVINORunner(_default_domain_model()) as runner:
        assert [k.qualname for k in runner.kernels] == ["<default>::LegacySquare"]
        np.testing.assert_allclose(runner.infer({"x": x})["y"], x * x + 1.5)


def test_openvino_names_a_custom_op_it_cannot_run() -> None:
    _needs("openvino")
    model = _default_domain_model()
    model.graph.node[0].domain = "nowhere"
    model.opset_import.append(helper.make_opsetid("nowhere", 1))
    with pytest.raises(opbridge.UnknownOpError, match=r"nowhere::LegacySquare has no opbridge definition.*--ops FILE"):
        OpenVINORunner(model).load()


@pytest.mark.parametrize("backend", ["onnxruntime", "reference", "openvino"])
def test_a_default_domain_node_without_a_kernel_gets_a_hint_that_works(backend: str) -> None:
    """The hint named @opbridge.op("mydomain::Op") (or "opbridge.legacy::Op"), which cannot run a node of
    ONNX's default domain: it now names the default domain's kernel, or moving the node into a domain."""
    _needs(backend)
    model = _default_domain_model()
    model.graph.node[0].op_type = "NoKernelHere"
    with pytest.raises(opbridge.OpbridgeError) as caught:
        get_backend(backend)(model).load()
    text = str(caught.value)
    assert '@opbridge.kernel("NoKernelHere", domain="")' in text
    assert "--rule legacy-domain --option domain=mydomain" in text and "mydomain::NoKernelHere" in text
    assert 'opbridge.legacy::NoKernelHere")' not in text


@pytest.mark.parametrize("backend", ["onnxruntime-kernels", "reference", "openvino"])
def test_the_default_domain_kernel_runs_nodes_the_legacy_domain_rewrite_moved(backend: str) -> None:
    """lint's fix for a default-domain node is `opbridge rewrite --rule legacy-domain`, which moves it to
    opbridge.legacy in the file; the kernel registered for the default domain then went unfound, and the
    error asked for exactly that kernel. It now runs the moved nodes; an unknown one gets a hint for them."""
    _needs(backend)
    from opbridge.graph import rewrite_model

    moved = rewrite_model(_default_domain_model(), ["legacy-domain"]).model
    assert moved.graph.node[0].domain == "opbridge.legacy"
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    with get_backend(backend)(moved) as runner:
        np.testing.assert_array_equal(next(iter(runner.infer({"x": x}).values())), x * x + np.float32(1.5))
    moved.graph.node[0].op_type = "NoKernelHere"
    with pytest.raises(opbridge.UnknownOpError) as caught:
        get_backend(backend)(moved).load()
    assert '@opbridge.kernel("NoKernelHere", domain="") (it also runs the nodes the legacy-domain' in str(caught.value)
    assert 'or an op definition @opbridge.op("opbridge.legacy::NoKernelHere")' in str(caught.value)


def test_threads_that_start_a_runner_together_load_it_once() -> None:
    """Four threads' first infer() loaded the model four times (OpenVINO converted and compiled it four
    times), each load replacing the state another thread was running with."""
    import threading
    import time

    from opbridge.backends.base import Runner

    class Slow(Runner):
        name = "slow"
        loads = 0

        def _load(self) -> None:
            time.sleep(0.05)
            Slow.loads += 1

        def _inputs(self) -> list[TensorMeta]:
            return [TensorMeta("x", np.dtype("float32"), (2,))]

        def _outputs(self) -> list[str]:
            return ["y"]

        def _infer(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            return {"y": feed["x"] + 1}

    runner = Slow()
    threads = [threading.Thread(target=runner.infer, args=({"x": np.ones(2, np.float32)},)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert Slow.loads == 1


@opbridge.op("tests.backends::Times")
def _times(x: torch.Tensor, k: int = 1) -> torch.Tensor:
    return x * k


def _times_model(inputs: list[str], **attrs: object) -> onnx.ModelProto:
    node = helper.make_node("Times", inputs, ["y"], domain="tests.backends", name="t", **attrs)
    value = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in inputs]
    graph = helper.make_graph([node], "g", value, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("tests.backends", 1)]
    return helper.make_model(graph, opset_imports=opsets)


@pytest.mark.parametrize("backend", ["onnxruntime-kernels", "reference", "openvino"])
@pytest.mark.parametrize(
    ("inputs", "attrs", "message"),
    [
        (["x"], {"kk": 2}, r"attribute\(s\) \['kk'\] that the op does not declare \(it takes \['k'\]\)"),
        (["x", "z"], {}, r"has 2 inputs; the op takes at most 1 \(x\)"),
    ],
    ids=["misspelt-attribute", "extra-input"],
)
def test_every_backend_refuses_a_node_that_does_not_fit_its_op(
    backend: str, inputs: list[str], attrs: dict, message: str
) -> None:
    """A misspelt attribute ran with the op's default (k=1) on the reference evaluator and OpenVINO,
    and verify passed them; an extra input reached the op as its attribute. Each backend refuses the
    node when it loads the model, as ONNX Runtime's bridge does."""
    _needs(backend)
    with pytest.raises(opbridge.OpDefinitionError, match=message):
        get_backend(backend)(_times_model(inputs, **attrs)).load()


# --------------------------------------------------------------------------- shared checks and registry

META = [TensorMeta("x", np.dtype("float32"), ("batch", 3, None)), TensorMeta("k", np.dtype("int64"), (2,))]


@pytest.mark.parametrize(
    ("feed", "message"),
    [
        ({"x": np.zeros((1, 3, 2), np.float32)}, r"input 'k' is missing; the model takes \['x', 'k'\]"),
        ({"x": np.zeros((1, 3, 2)), "k": np.zeros(2, np.int64)}, r"'x' has dtype float64, the model expects float32"),
        (
            {"x": np.zeros((1, 4, 2), np.float32), "k": np.zeros(2, np.int64)},
            r"dim 1 is static 3 in the model \(batchx3x\?\)",
        ),
        ({"x": np.zeros((1, 3), np.float32), "k": np.zeros(2, np.int64)}, r"rank 2\), the model expects rank 3"),
        ({"x": np.zeros((1, 3, 2), np.float32), "k": np.zeros(2, np.int64), "z": np.zeros(1)}, r"no input 'z'"),
    ],
    ids=["missing", "dtype", "static-dim", "rank", "extra"],
)
def test_feed_checks(feed: dict, message: str) -> None:
    with pytest.raises(InputError, match=message):
        check_feed(META, feed, "demo")


def test_feed_check_accepts_dynamic_dims() -> None:
    check_feed(META, {"x": np.zeros((7, 3, 11), np.float32), "k": np.zeros(2, np.int64)}, "demo")


def test_registry() -> None:
    assert backend_names()[:4] == ["onnxruntime", "onnxruntime-kernels", "reference", "openvino"]
    assert set(available_backends()) <= set(backend_names())
    with pytest.raises(opbridge.OpbridgeError, match=r"unknown backend 'tensorrtt'; choose from onnxruntime"):
        get_backend("tensorrtt")


def test_unavailable_backend_is_reported_not_raised() -> None:
    class Missing(OpenVINORunner):
        name = "missing"
        requires = ("opbridge_no_such_runtime_module",)

    assert not Missing.available()
    assert "not installed" in (Missing.unavailable_reason() or "")


def test_torch_runner_checks_the_factory_against_the_model() -> None:
    meta = [TensorMeta("a", np.dtype("float32"), None), TensorMeta("b", np.dtype("float32"), None)]
    with pytest.raises(opbridge.OpbridgeError, match=r"takes 1 example input\(s\), the model has 2 input\(s\)"):
        TorchRunner("opbridge.examples.seeds:myselu_model", meta).load()


# --------------------------------------------------------------------------- kernels that misbehave


@opbridge.op("tests.backends::Explodes")
def explodes(x: torch.Tensor) -> torch.Tensor:
    """x + 1."""
    return x + 1


@explodes.register_kernel
def _explodes_numpy(x: np.ndarray) -> np.ndarray:
    raise ValueError("kernel exploded on purpose")


@opbridge.op("tests.backends::Grows", shape=lambda x: opbridge.TensorInfo(x.shape, x.dtype))
def grows(x: torch.Tensor) -> torch.Tensor:
    """x + 1, but the numpy kernel returns twice as many rows as the rule says."""
    return x + 1


@grows.register_kernel
def _grows_numpy(x: np.ndarray) -> np.ndarray:
    return np.concatenate([x, x])


@opbridge.op("tests.backends::WritesInput")
def writes_input(x: torch.Tensor) -> torch.Tensor:
    """x + 1, but the numpy kernel writes into its input."""
    return x + 1


@writes_input.register_kernel
def _writes_input_numpy(x: np.ndarray) -> np.ndarray:
    x += 1
    return x


@opbridge.op("tests.backends::ReturnsNone")
def returns_none(x: torch.Tensor) -> torch.Tensor:
    """x + 1, but the numpy kernel returns None."""
    return x + 1


returns_none.register_kernel(lambda x: None)


@opbridge.op("tests.backends::Interrupted")
def interrupted(x: torch.Tensor) -> torch.Tensor:
    """x + 1, but the numpy kernel is interrupted (Ctrl-C)."""
    return x + 1


@interrupted.register_kernel
def _interrupted_numpy(x: np.ndarray) -> np.ndarray:
    raise KeyboardInterrupt


class _Wrap(torch.nn.Module):
    def __init__(self, fn: opbridge.OpDef) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x) * 2


@pytest.mark.parametrize(
    ("op", "message"),
    [
        (
            explodes,
            r"^openvino: tests.backends::Explodes node '/Explodes': the numpy kernel raised ValueError: "
            r"kernel exploded on purpose$",
        ),
        (
            grows,
            r"^openvino: tests.backends::Grows node '/Grows': the numpy kernel returned shape 4x3 for output 0, "
            r"but its shape rule",
        ),
        (
            writes_input,
            r"^openvino: tests.backends::WritesInput node '/WritesInput': the numpy kernel raised ValueError: .*read-only",
        ),
        (
            returns_none,
            r"^openvino: tests.backends::ReturnsNone: the numpy kernel returned a NoneType for output 0, not an array",
        ),
    ],
    ids=["raises", "wrong-shape", "writes-input", "returns-none"],
)
def test_openvino_reports_a_failing_kernel(tmp_path, op: opbridge.OpDef, message: str) -> None:
    _needs("openvino")
    path = tmp_path / "m.onnx"
    opbridge.export(_Wrap(op), (torch.randn(2, 3),), path, exporter="torchscript", input_names=["x"])
    with OpenVINORunner(path) as runner:
        with pytest.raises(opbridge.OpbridgeError, match=message):
            runner.infer({"x": np.ones((2, 3), np.float32)})
        with pytest.raises(opbridge.OpbridgeError, match=message):  # the request survives and fails again
            runner.infer({"x": np.ones((2, 3), np.float32)})


def test_openvino_ir_keeps_the_seed_attributes(seed_export, tmp_path) -> None:
    """Generated ops serialize their attributes (float lists, UTF-8 strings, int lists) into an IR."""
    _needs("openvino")
    import openvino as ov

    xml = {}
    for name in ("myselu", "strange_net"):
        with OpenVINORunner(seed_export(name, "torchscript", functions=False).path) as runner:
            ov.save_model(runner.ov_model, str(tmp_path / f"{name}.xml"))
        xml[name] = (tmp_path / f"{name}.xml").read_text(encoding="utf-8")
    assert 'attr1="这是字符串属性" attr2="1, 2, 3" attr3="222"' in xml["myselu"]
    assert 'float_attr="0.1, 0.5" int_attr="2, 2"' in xml["strange_net"]
    assert 'float_attr="0.5, 0.5" int_attr="3, 3"' in xml["strange_net"]


def test_openvino_results_survive_the_next_request(seed_export) -> None:
    _needs("openvino")
    with OpenVINORunner(seed_export("myselu", "torchscript", functions=False).path) as runner:
        first = runner.infer({"image": np.ones((1, 1, 4, 4), np.float32)})["output"]
        kept = first.copy()
        second = runner.infer({"image": np.full((1, 1, 4, 4), -3.0, np.float32)})["output"]
    np.testing.assert_array_equal(first, kept)
    assert not np.array_equal(first, second)


# --------------------------------------------------------------------------- kernel dtypes under OpenVINO

# What the Retype kernel returns, set per test: "ok" or the name of a wrong dtype for one output.
_RETYPE: dict[str, str] = {"mode": "ok"}
_RETYPE_SEEN: list[tuple[str, ...]] = []


@opbridge.op("tests.backends::Retype")
def retype(x: torch.Tensor, idx: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x * mask + idx, idx + 1): a float32 and an int64 output."""
    return x * mask.to(x.dtype) + idx.to(x.dtype), idx + 1


@retype.register_kernel
def _retype_numpy(x: np.ndarray, idx: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    _RETYPE_SEEN.append((str(x.dtype), str(idx.dtype), str(mask.dtype)))
    y = (x * mask + idx).astype(np.float32)
    nxt = (idx + 1).astype(np.int64)
    mode = _RETYPE["mode"]
    if mode == "float64":
        return y.astype(np.float64), nxt
    if mode == "int32":
        return y, nxt.astype(np.int32)
    if mode == "float-for-int":
        return y, nxt + 0.4
    return y, nxt


class _RetypeModel(torch.nn.Module):
    def forward(self, x: torch.Tensor, idx: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return retype(x, idx, mask)


@pytest.fixture
def retype_runner(tmp_path, monkeypatch: pytest.MonkeyPatch):
    _needs("openvino")
    monkeypatch.setitem(_RETYPE, "mode", "ok")
    path = tmp_path / "retype.onnx"
    args = (torch.randn(2, 3), torch.randint(0, 10, (2, 3)), torch.rand(2, 3) < 0.5)
    opbridge.export(_RetypeModel(), args, path, exporter="torchscript", input_names=["x", "idx", "mask"])
    feed = {
        "x": np.full((2, 3), 0.5, np.float32),
        "idx": np.array([[1, 2, 3], [4, 5, 6]], np.int64),
        "mask": np.array([[True, False, True], [False, True, False]]),
    }
    with OpenVINORunner(path) as runner:
        yield runner, feed


def test_openvino_kernel_gets_its_inputs_in_the_model_dtypes(retype_runner) -> None:
    """The CPU plugin runs int64 as int32 and bool as uint8 inside; the kernel still sees the model's dtypes."""
    runner, feed = retype_runner
    _RETYPE_SEEN.clear()
    out = list(runner.infer(feed).values())
    assert _RETYPE_SEEN == [("float32", "int64", "bool")]
    np.testing.assert_array_equal(out[1], feed["idx"] + 1)
    assert out[1].dtype == np.int64 and out[0].dtype == np.float32


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("float64", "returned dtype float64 for output 0, but the node's output type is float32; return an array of "
         r"dtype float32 \(e.g. result.astype\(np.float32\)\)"),
        ("int32", "returned dtype int32 for output 1, but the node's output type is int64; return an array of "
         r"dtype int64 \(e.g. result.astype\(np.int64\)\)"),
        ("float-for-int", "returned dtype float64 for output 1, but the node's output type is int64"),
    ],
    ids=["float64", "int32", "float-for-int"],
)  # fmt: skip
def test_openvino_refuses_a_kernel_result_of_another_dtype(retype_runner, monkeypatch, mode: str, message: str) -> None:
    runner, feed = retype_runner
    monkeypatch.setitem(_RETYPE, "mode", mode)
    prefix = r"^openvino: tests.backends::Retype node '/Retype': the numpy kernel "
    with pytest.raises(opbridge.OpbridgeError, match=prefix + message):
        runner.infer(feed)
    monkeypatch.setitem(_RETYPE, "mode", "ok")  # the request survives
    assert list(runner.infer(feed).values())[1].dtype == np.int64


# --------------------------------------------------------------------------- the reference evaluator's feed


@opbridge.op("tests.backends::Scribble")
def scribble(x: torch.Tensor) -> torch.Tensor:
    """2 * x, but the numpy kernel also writes into its input."""
    return 2 * x


@scribble.register_kernel
def _scribble_numpy(x: np.ndarray) -> np.ndarray:
    y = 2 * x
    x[...] = 0
    return y


def test_reference_session_kernels_cannot_write_into_the_callers_input() -> None:
    from opbridge.reference import ReferenceSession

    graph = helper.make_graph(
        [helper.make_node("Scribble", ["x"], ["y"], domain="tests.backends")],
        "scribble",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("tests.backends", 1)]
    )
    x = np.array([1.0, 2.0, 3.0], np.float32)
    with pytest.raises(
        opbridge.OpbridgeError, match=r"tests.backends::Scribble .* wrote into one of its inputs \(.*read-only"
    ):
        ReferenceSession(model).run(None, {"x": x})
    np.testing.assert_array_equal(x, [1.0, 2.0, 3.0])


def test_reference_session_outputs_are_not_views_of_the_input() -> None:
    from opbridge.reference import ReferenceSession

    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],  # numpy's reshape: a view of x
        "reshape",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6])],
        [helper.make_tensor("shape", TensorProto.INT64, [1], [6])],
    )
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (y,) = ReferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])).run(None, {"x": x})
    assert y.flags.writeable and not np.shares_memory(x, y)
    np.testing.assert_array_equal(y, np.arange(6, dtype=np.float32))


def test_openvino_explains_a_kernel_only_op_the_model_does_not_type() -> None:
    """A kernel-only op (no spec) whose output has no value_info: OpenVINO is given its first input's
    type and rank, and a result of another dtype is explained with the fix."""
    _needs("openvino")

    @opbridge.kernel("ArgMaxLast", domain="tests.backends.untyped")
    def arg_max_last(x: np.ndarray) -> np.ndarray:
        return np.argmax(x, axis=-1)

    nodes = [
        helper.make_node("ArgMaxLast", ["x"], ["i"], domain="tests.backends.untyped"),
        helper.make_node("Cast", ["i"], ["y"], to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("tests.backends.untyped", 1)]
    )
    with (
        OpenVINORunner(model) as runner,
        pytest.raises(
            opbridge.OpbridgeError,
            match=r"ArgMaxLast: the numpy kernel returned (shape 2|dtype int64) for output 0, .*no value_info.*"
            r"define the op with @opbridge.op",
        ),
    ):
        runner.infer({"x": np.ones((2, 3), np.float32)})


@opbridge.op("tests.backends::Count", shape=lambda x, k=0: opbridge.TensorInfo(x.shape, torch.int64))
def count_plus(x: torch.Tensor, k: int = 0) -> torch.Tensor:
    return torch.full(x.shape, x.numel() + k, dtype=torch.int64)


class _Counts(torch.nn.Module):
    def __init__(self, k: int) -> None:
        super().__init__()
        self.k = k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return count_plus(x, k=self.k) + count_plus(x, k=2)


def test_openvino_int64_output_of_custom_nodes_stays_int64(tmp_path) -> None:
    """OpenVINO's CPU plugin computes int64 in int32: the model's int64 output comes back as int64."""
    _needs("openvino")
    path = tmp_path / "counts.onnx"
    opbridge.export(_Counts(1), (torch.ones(2, 3),), path, exporter="torchscript", input_names=["x"])
    with OpenVINORunner(path) as runner:
        (out,) = runner.infer({"x": np.ones((2, 3), np.float32)}).values()
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, np.full((2, 3), 6 + 1 + 6 + 2))


@opbridge.op("tests.backends::Top2")
def top2(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    values, indices = torch.topk(x, 2, dim=-1)
    return values, indices


class _IndicesOnward(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        values, indices = top2(x)
        return torch.gather(x * 2, -1, indices) + values, indices + 1


@opbridge.op("tests.backends::Positive")
def _positive(x: torch.Tensor) -> torch.Tensor:
    return x > 0


class _MaskOnward(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mask = _positive(x)
        return torch.where(mask & (x < 1), x, -x), mask


@opbridge.op("tests.backends::ShiftAndSign")
def _shift_and_sign(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x + 2, x > 0


class _SignOnward(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shifted, sign = _shift_and_sign(x)
        return torch.where(sign, shifted, x), sign


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize(
    ("model", "dtype"),
    [(_IndicesOnward, np.int64), (_MaskOnward, np.bool_), (_SignOnward, np.bool_)],
    ids=["int64-indices", "bool-mask", "bool-after-float"],
)
def test_openvino_runs_standard_ops_on_lowered_outputs_of_custom_nodes(
    tmp_path, exporter: str, model: type[torch.nn.Module], dtype: type
) -> None:
    """The CPU plugin computes int64 in int32 and bool in uint8 while compiling, but not a custom op's
    output: ``indices + 1`` met int64 and int32 ("Arguments do not have the same element type"), And and
    Where met a boolean ("unsupported src_prc: boolean"). The model's own outputs keep their types. A bool
    output after a float one read output 0 (a Convert from uint8 to boolean there took the float output:
    x + 2 > 0, not x > 0)."""
    _needs("openvino")
    path = tmp_path / "onward.onnx"
    x = torch.randn(3, 5)
    opbridge.export(model(), (x,), path, exporter=exporter, input_names=["x"], output_names=["y", "k"])
    with OpenVINORunner(path) as runner:
        got = runner.infer({"x": x.numpy()})
    want = model()(x)
    assert got["k"].dtype == dtype
    np.testing.assert_array_equal(got["k"], want[1].numpy())
    np.testing.assert_array_equal(got["y"], want[0].numpy())


@opbridge.op("tests.backends::Opt", shape=lambda x, *_, **__: opbridge.TensorInfo(x.shape, x.dtype))
def optional_inputs(
    x: torch.Tensor,
    a: torch.Tensor | None = None,
    b: torch.Tensor | None = None,
    c: torch.Tensor | None = None,
) -> torch.Tensor:
    r = x + a if a is not None else x * 1
    r = r * b if b is not None else r
    return r - c if c is not None else r


@opbridge.op("tests.backends::OptBeforeRequired")
def optional_before_required(x: torch.Tensor, b: torch.Tensor | None, c: torch.Tensor) -> torch.Tensor:
    return x * c if b is None else x * c + b


class _Gaps(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (the last: a required input after the omitted one, which OpenVINO's node check missed once the
        # node's inputs were compacted)
        return (
            optional_inputs(x, None, x + 1, None) + optional_inputs(x, c=x * 3) + optional_before_required(x, None, x)
        )


def test_openvino_runs_optional_inputs_omitted_before_given_ones(tmp_path) -> None:
    _needs("openvino")
    path = tmp_path / "gaps.onnx"
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    opbridge.export(_Gaps(), (x,), path, exporter="torchscript", input_names=["x"])
    nodes = onnx.load(path).graph.node
    assert [list(n.input)[:3] for n in nodes if n.op_type == "Opt"][0][1] == ""
    assert [list(n.input)[1] for n in nodes if n.op_type == "OptBeforeRequired"] == [""]
    with OpenVINORunner(path) as runner:
        (out,) = runner.infer({"x": x.numpy()}).values()
    np.testing.assert_array_equal(out, _Gaps()(x).numpy())


def _kernel_node_model(node: onnx.NodeProto) -> onnx.ModelProto:
    """A model of ``node`` (of domain tests.backends.kernel), float x[3] -> y[3]."""
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("tests.backends.kernel", 1)]
    return helper.make_model(graph, opset_imports=opsets)


@opbridge.kernel("tests.backends.kernel::AddOptional")
def _add_optional(a: np.ndarray, b: np.ndarray | None, c: np.ndarray | None, *, scale: float = 1.0) -> np.ndarray:
    return (a + (0 if b is None else b) + (0 if c is None else c)) * np.float32(scale)


@pytest.mark.parametrize("backend", ["onnxruntime", "onnxruntime-kernels", "reference", "openvino"])
def test_a_registered_kernel_gets_none_for_optional_inputs_left_out_at_the_end(backend: str) -> None:
    """In ONNX, ``["x"]`` and ``["x", "", ""]`` both leave the last two inputs out: the kernel got
    ``(x, None, None)`` for the second spelling and ``(x,)`` for the first, which failed with "missing 2
    required positional arguments"."""
    _needs(backend)
    x = np.arange(3, dtype=np.float32)
    for inputs in (["x", "", ""], ["x"], ["x", "x"]):
        node = helper.make_node("AddOptional", inputs, ["y"], domain="tests.backends.kernel", scale=2.0)
        with get_backend(backend)(_kernel_node_model(node)) as runner:
            (y,) = runner.infer({"x": x}).values()
        np.testing.assert_array_equal(y, x * 2 * (2 if inputs == ["x", "x"] else 1), err_msg=str(inputs))


@opbridge.op("tests.backends.named::Triple")
def _triple_op(x: torch.Tensor) -> torch.Tensor:
    return x * 3


@opbridge.kernel("tests.backends.named::Triple")
def _triple_by_name(x: np.ndarray) -> np.ndarray:
    return (x * 3 + 1).astype(x.dtype)  # (told apart from the reference by its + 1)


@pytest.mark.parametrize("backend", ["onnxruntime", "onnxruntime-kernels", "reference", "openvino"])
def test_an_op_without_a_kernel_runs_the_kernel_registered_by_its_name_everywhere(backend: str) -> None:
    """An op with no kernel of its own and an @opbridge.kernel of its name: ONNX Runtime ran that kernel,
    the reference evaluator and OpenVINO the op's reference, so one node gave two answers."""
    _needs(backend)
    graph = helper.make_graph(
        [helper.make_node("Triple", ["x"], ["y"], domain="tests.backends.named")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("tests.backends.named", 1)]
    x = np.arange(3, dtype=np.float32)
    with get_backend(backend)(helper.make_model(graph, opset_imports=opsets)) as runner:
        (y,) = runner.infer({"x": x}).values()
    np.testing.assert_array_equal(y, x * 3 + 1)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_openvino_runs_a_model_over_the_protobuf_limit(
    seed_export, monkeypatch: pytest.MonkeyPatch, exporter: str
) -> None:
    """A model over protobuf's 2 GiB limit failed in the OpenVINO backend ("Failed to serialize proto"): the
    inliner, shape inference and the file OpenVINO reads all serialize it whole. With the limit lowered, the
    seed model with function bodies takes the path a large model takes: the graph without the weights' bytes
    for the inliner and shape inference, and a data file for OpenVINO."""
    _needs("openvino")
    import opbridge.model_io as model_io

    seed = seed_by_name("super_resolution")
    result = seed_export("super_resolution", exporter)
    assert result.model.functions  # (the DynamicResize body, which the backend inlines)
    meta, outs = onnx_io_meta(result.model)
    # the limit between the model's serialized size and its size without the weights' bytes
    light = model_io.strip_tensors(result.model, 1024)[0].ByteSize()
    assert result.model.ByteSize() > 4 * light
    monkeypatch.setattr(model_io, "PROTO_LIMIT", 2 * light)
    assert model_io.too_large(result.model)
    # what serializes a model refuses one over the (lowered) limit, as protobuf refuses one over 2 GiB
    import onnx.inliner
    import onnx.shape_inference

    def refusing(serializer: Any) -> Any:
        def call(model: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(model, onnx.ModelProto) and model.ByteSize() >= model_io.PROTO_LIMIT:
                raise ValueError("Failed to serialize proto (over the limit)")
            return serializer(model, *args, **kwargs)

        return call

    monkeypatch.setattr(onnx.inliner, "inline_local_functions", refusing(onnx.inliner.inline_local_functions))
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", refusing(onnx.shape_inference.infer_shapes))
    monkeypatch.setattr(onnx, "save", refusing(onnx.save))
    with TorchRunner(seed.reference, meta, [o.name for o in outs]) as ref, OpenVINORunner(result.path) as runner:
        feed = make_inputs(meta, {m.name: tuple(t.shape) for m, t in zip(meta, ref.example_inputs)}, seed=0)
        got, want = runner.infer(feed), ref.infer(feed)
        for name in want:
            assert compare_arrays(got[name], want[name], TIGHT, name).passed


@dataclasses.dataclass
class _Scaled:
    """A kernel object that cannot be hashed (a dataclass with eq: __hash__ None)."""

    factor: float

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return (x * self.factor).astype(x.dtype)


opbridge.kernel("tests.backends.kernel::Scaled")(_Scaled(2.0))


@pytest.mark.parametrize("backend", ["onnxruntime-kernels", "reference", "openvino"])
def test_a_kernel_object_that_cannot_be_hashed_runs(backend: str) -> None:
    """The optional-input padding looked the kernel's signature up in a cache keyed by the kernel: one that
    cannot be hashed failed every run with a bare TypeError."""
    _needs(backend)
    node = helper.make_node("Scaled", ["x"], ["y"], domain="tests.backends.kernel")
    with get_backend(backend)(_kernel_node_model(node)) as runner:
        (y,) = runner.infer({"x": np.ones(3, np.float32)}).values()
    np.testing.assert_array_equal(y, np.full(3, 2.0, np.float32))


@opbridge.op("tests.backends.versions::Inc")
def _inc_v1(x: torch.Tensor) -> torch.Tensor:
    return x + 1


@opbridge.op("tests.backends.versions::Inc", version=2)
def _inc_v2(x: torch.Tensor) -> torch.Tensor:
    return x + 2


def _calling_inc(model_version: int | None) -> onnx.ModelProto:
    """A function importing tests.backends.versions at 2 that calls its Inc, in a model importing the domain
    at ``model_version`` (None: not at all)."""
    domain = "tests.backends.versions"
    body = helper.make_function(
        "q",
        "F",
        ["x"],
        ["y"],
        [helper.make_node("Inc", ["x"], ["y"], domain=domain)],
        [helper.make_opsetid("", 17), helper.make_opsetid(domain, 2)],
    )
    graph = helper.make_graph(
        [helper.make_node("F", ["x"], ["y"], domain="q")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("q", 1)]
    if model_version is not None:
        opsets.append(helper.make_opsetid(domain, model_version))
    return helper.make_model(graph, opset_imports=opsets, functions=[body])


@pytest.mark.parametrize("backend", ["onnxruntime", "onnxruntime-kernels", "reference", "openvino"])
def test_a_node_in_a_function_runs_the_version_its_function_imports(backend: str) -> None:
    """A function's node ran its domain at the version the model imports (1 where the model imports none),
    not its function's: Inc v1 for Inc v2, and an op defined at 2 only was unknown. Two versions of one
    domain are refused: a session binds one kernel per op."""
    _needs(backend)
    x = np.array([1.0, 2.0], np.float32)
    for model_version in (None, 2):
        with get_backend(backend)(_calling_inc(model_version)) as runner:
            (y,) = runner.infer({"x": x}).values()
        np.testing.assert_array_equal(y, x + 2, err_msg=str(model_version))
    with pytest.raises(opbridge.ModelLoadError, match=r"imported at more than one version \(version 1 by the model"):
        get_backend(backend)(_calling_inc(1)).load()


def test_openvino_runs_kernels_where_bodies_do_not_convert(tmp_path) -> None:
    """DynamicResize's body at opset 11 (Resize-11 with empty roi and scales) does not convert in
    OpenVINO: the op runs through its kernel instead, and the model still matches PyTorch."""
    _needs("openvino")
    from opbridge.examples.seeds import super_resolution_net

    model, args = super_resolution_net()
    path = tmp_path / "sr11.onnx"
    result = opbridge.export(model, args, path, exporter="torchscript", opset_version=11)
    assert [f.name for f in result.model.functions] == ["DynamicTRTResize"]
    record = opbridge.verify(path, (model, args), backends=["openvino"])
    assert [r.status for r in record.runs] == ["pass"], record.table()


@opbridge.op("tests.backends.fallback::Double")
def _double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def _double_with_body(unconvertible: bool) -> onnx.ModelProto:
    """A Double node whose function body computes x * 2; ``unconvertible``: the body adds Bernoulli(x) * 0
    (OpenVINO has no conversion rule for Bernoulli)."""
    const = [
        helper.make_node("Constant", [], [n], value=helper.make_tensor(n, TensorProto.FLOAT, [], [v]))
        for n, v in (("two", 2.0), ("zero", 0.0))
    ]
    nodes = [*const, helper.make_node("Mul", ["x", "two"], ["y" if not unconvertible else "x2"])]
    if unconvertible:
        nodes += [
            helper.make_node("Bernoulli", ["x"], ["b"]),
            helper.make_node("Mul", ["b", "zero"], ["b0"]),
            helper.make_node("Add", ["x2", "b0"], ["y"]),
        ]
    domain = "tests.backends.fallback"
    body = helper.make_function(domain, "Double", ["x"], ["y"], nodes, [helper.make_opsetid("", 17)])
    graph = helper.make_graph(
        [helper.make_node("Double", ["x"], ["y"], domain=domain)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)]
    return helper.make_model(graph, opset_imports=opsets, functions=[body])


@pytest.mark.parametrize(
    ("failure", "reason"),
    [
        ("convert", "the bodies do not convert: FrontEnd API failed"),
        ("compile", "the model with the bodies does not compile: no kernel for the body's Mul"),
    ],
    ids=["convert", "compile"],
)
def test_openvino_warns_once_why_an_op_runs_through_its_kernel_not_its_body(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, failure: str, reason: str
) -> None:
    """An op whose function body did not convert (or compile) ran through its Python kernel, slower and
    with the kernel's numerics, and the reason was logged at INFO only, which nobody sees: now a WARNING
    with the reason, once per op (a later load of it logs at INFO), not on every call."""
    _needs("openvino")
    from opbridge.backends import openvino_backend

    monkeypatch.setattr(openvino_backend, "_FALLEN_BACK", set(), raising=False)  # (ops warned of: none yet)
    if failure == "compile":
        read = OpenVINORunner._read

        class _Core:
            """OpenVINO's Core, failing to compile a model where the op's body was inlined (no custom node)."""

            def __init__(self, core: Any, bodies: bool) -> None:
                self.core, self.bodies = core, bodies

            def compile_model(self, *args: Any) -> Any:
                if self.bodies:
                    raise RuntimeError("Exception from src/plugin.cpp:1:\nno kernel for the body's Mul")
                return self.core.compile_model(*args)

        def failing_read(self: OpenVINORunner, ov: Any, extension: Any, prepared: Any, nodes: list[Any]) -> Any:
            model = read(self, ov, extension, prepared, nodes)
            self._core = _Core(self._core, bodies=not nodes)
            return model

        monkeypatch.setattr(OpenVINORunner, "_read", failing_read)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    with caplog.at_level(logging.INFO, logger="opbridge.backends.openvino_backend"):
        for _ in range(2):  # two loads of the model, two calls each
            with OpenVINORunner(_double_with_body(unconvertible=failure == "convert")) as runner:
                for _ in range(2):
                    np.testing.assert_array_equal(runner.infer({"x": x})["y"], x * 2)
    said = [r for r in caplog.records if "through their kernels" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING, logging.INFO], [r.getMessage() for r in said]
    message = said[0].getMessage()
    assert message.startswith("openvino: tests.backends.fallback::Double run through their kernels (Python code")
    assert reason in message


@opbridge.op("tests.degenerate::Twice")
def _twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


_twice.register_kernel(lambda x: x * 2)


@opbridge.op("tests.degenerate::Thrice")
def _thrice(x: torch.Tensor) -> torch.Tensor:
    return x * 3  # no kernel: runtimes run this reference through torch


class _ThriceModel(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _thrice(x)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_scalar_inputs_pass_verify_on_every_backend(tmp_path: Path, exporter: str) -> None:
    """A 0-d input stays 0-d in every backend (the reference evaluator's torch path made it shape (1,))."""
    path = tmp_path / "scalar.onnx"
    opbridge.export(_ThriceModel(), (torch.tensor(1.5),), path, exporter=exporter)
    record = opbridge.verify(path, (_ThriceModel(), (torch.tensor(1.5),)))
    assert record.exit_code == 0, record.table()
    assert {r.backend for r in record.runs} >= {"onnxruntime", "reference"}


@opbridge.op("tests.degenerate::ScaleBy")
def _scale_by(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return x * s


@_scale_by.register_shape
def _scale_by_shape(x: torch.Tensor, s: torch.Tensor) -> opbridge.TensorInfo:
    return opbridge.TensorInfo(x.shape, x.dtype)


@opbridge.op("tests.degenerate::Total")
def _total(x: torch.Tensor) -> torch.Tensor:
    return x.sum()


@_total.register_shape
def _total_shape(x: torch.Tensor) -> opbridge.TensorInfo:
    return opbridge.TensorInfo((), x.dtype)


class _ScaleTotal(torch.nn.Module):
    def forward(self, x: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return _scale_by(x, s), _total(x)


def test_a_shape_rule_sees_scalar_inputs_and_outputs_as_scalars() -> None:
    """A 0-d input or output reached the rule's ONNX side with no shape at all (an unknown rank):
    OpenVINO typed the op's outputs as scalars and verify failed it, blaming the rule; a 0-d output's
    inferred type had no rank, so a Shape of it came out unknown."""
    from opbridge.shape import infer_onnx

    (scalar,) = infer_onnx(
        _total.spec, _total.shape_rule, _total.reference, [helper.make_tensor_type_proto(1, [2, 3])], {}
    )
    assert scalar.tensor_type.HasField("shape") and len(scalar.tensor_type.shape.dim) == 0
    f32 = TensorProto.FLOAT
    graph = helper.make_graph(
        [
            helper.make_node("ScaleBy", ["x", "s"], ["y"], domain="tests.degenerate"),
            helper.make_node("Total", ["x"], ["t"], domain="tests.degenerate"),
        ],
        "g",
        [helper.make_tensor_value_info("x", f32, [2, 3]), helper.make_tensor_value_info("s", f32, [])],
        [helper.make_tensor_value_info("y", f32, [2, 3]), helper.make_tensor_value_info("t", f32, [])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("tests.degenerate", 1)], ir_version=9
    )
    backends = [b for b in ("onnxruntime", "reference", "openvino") if BACKENDS[b].available()]
    record = opbridge.verify(model, (_ScaleTotal(), (torch.randn(2, 3), torch.tensor(1.5))), backends=backends)
    assert record.exit_code == 0, record.table()
    assert {r.backend for r in record.runs} == set(backends)


@pytest.mark.skipif(not BACKENDS["openvino"].available(), reason="openvino is not installed")
def test_openvino_refuses_bfloat16_custom_nodes(tmp_path: Path) -> None:
    """OpenVINO's Python API passes bfloat16 buffers to Python ops as float16: such a node is refused
    by name (its numbers came out wrong, silently)."""
    nodes = [
        helper.make_node("Cast", ["x"], ["xb"], to=TensorProto.BFLOAT16),
        helper.make_node("Twice", ["xb"], ["yb"], domain="tests.degenerate"),
        helper.make_node("Cast", ["yb"], ["y"], to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("tests.degenerate", 1)], ir_version=9
    )
    path = tmp_path / "bf16.onnx"
    onnx.save(model, str(path))
    # (named when the model is read where ONNX knows the op's output type, else when the node runs)
    with pytest.raises(Exception, match=r"tests.degenerate::Twice(: a| node '': output 'yb' is) bfloat16"):
        with get_backend("openvino")(path) as runner:
            runner.infer({"x": np.array([1.5, -2.25, 3.0], np.float32)})


def test_openvino_gives_ctrl_c_in_a_kernel_back_to_the_caller(tmp_path) -> None:
    """A KeyboardInterrupt inside a kernel reached the caller as an error of the node, and a loop went on."""
    _needs("openvino")
    path = tmp_path / "m.onnx"
    opbridge.export(_Wrap(interrupted), (torch.randn(2, 3),), path, exporter="torchscript", input_names=["x"])
    with OpenVINORunner(path) as runner, pytest.raises(KeyboardInterrupt):
        runner.infer({"x": np.ones((2, 3), np.float32)})


@opbridge.op("tests.backends::Terminating")
def terminating(x: torch.Tensor) -> torch.Tensor:
    """x + 1, but the numpy kernel gets a SIGTERM (opbridge's Terminated, as the CLI raises it)."""
    return x + 1


@terminating.register_kernel
def _terminating_numpy(x: np.ndarray) -> np.ndarray:
    from opbridge._terminate import Terminated

    raise Terminated


_RULE_INTERRUPTS = threading.Event()


@opbridge.op("tests.backends::RuleInterrupted")
def rule_interrupted(x: torch.Tensor) -> torch.Tensor:
    return x + 1


@rule_interrupted.register_shape
def _rule_interrupted_shape(x: Any) -> opbridge.TensorInfo:
    if _RULE_INTERRUPTS.is_set():  # (a Ctrl-C landing while OpenVINO converts the model calls the rule)
        raise KeyboardInterrupt
    return opbridge.TensorInfo(x.shape, x.dtype)


@pytest.mark.parametrize("backend", ["onnxruntime-kernels", "openvino"])
def test_a_sigterm_in_a_kernel_ends_the_run_not_as_the_nodes_error(tmp_path: Path, backend: str) -> None:
    """A SIGTERM inside a kernel (Terminated, which the CLI raises to unwind) came back as "kernel raised
    Terminated", an error of the node: verify recorded it and went on, exit code 2 instead of 143."""
    from opbridge._terminate import Terminated

    _needs(backend.split("-")[0])
    path = tmp_path / "m.onnx"
    opbridge.export(_Wrap(terminating), (torch.randn(2, 3),), path, exporter="torchscript", input_names=["x"])
    with get_backend(backend)(path) as runner, pytest.raises(Terminated):
        runner.infer({"x": np.ones((2, 3), np.float32)})


def test_openvino_gives_ctrl_c_while_converting_back_to_the_caller(tmp_path: Path) -> None:
    """A Ctrl-C landing in a Python op's callback while OpenVINO converted the model (its shape rule) came
    back as "openvino could not convert the model ... KeyboardInterrupt", or was dropped."""
    _needs("openvino")
    path = tmp_path / "m.onnx"
    opbridge.export(_Wrap(rule_interrupted), (torch.randn(2, 3),), path, exporter="torchscript", input_names=["x"])
    _RULE_INTERRUPTS.set()
    try:
        with pytest.raises(KeyboardInterrupt):
            OpenVINORunner(path).load()
    finally:
        _RULE_INTERRUPTS.clear()
    with OpenVINORunner(path) as runner:  # (and nothing is left over for the next load)
        (y,) = runner.infer({"x": np.ones((2, 3), np.float32)}).values()
    np.testing.assert_array_equal(y, _Wrap(rule_interrupted)(torch.ones(2, 3)).numpy())


def test_a_ctrl_c_during_a_backends_import_is_no_missing_package() -> None:
    """A Ctrl-C during an extension module's import comes back as ImportError("initialization failed")
    caused by it: the backend was reported "not installed; pip install ...", and verify went on without it."""
    from opbridge.errors import raise_interrupt_behind

    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as inner:
            raise ImportError("initialization failed") from inner
    except ImportError as exc:
        with pytest.raises(KeyboardInterrupt):
            raise_interrupt_behind(exc)
    raise_interrupt_behind(ImportError("No module named 'openvino'"))  # (a missing package: nothing raised)


def _square_model(elem: int) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", elem, ["n"])],
        [helper.make_tensor_value_info("y", elem, ["n"])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_openvino_runner_serves_several_threads() -> None:
    """One runner, four threads: calls overlapping on its one infer request failed as busy, or returned
    another call's result without an error."""
    import threading

    _needs("openvino")
    runner = OpenVINORunner(_square_model(TensorProto.FLOAT)).load()
    wrong: list[str] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(60):
            x = rng.standard_normal(int(rng.integers(1, 2000))).astype(np.float32)
            try:
                y = runner.infer({"x": x})["y"]
            except Exception as exc:  # counted: the test's verdict
                wrong.append(repr(exc)[:80])
                continue
            if y.shape != x.shape or not np.array_equal(y, x * x):
                wrong.append(f"{x.shape} -> {y.shape}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    runner.close()
    assert wrong == []


_REENTERING: list[Any] = []


@opbridge.kernel("tests.backends.nospec::Reenter")
def _reenter(x: np.ndarray) -> np.ndarray:
    return _REENTERING[0].infer({"x": x.copy()})["y"]


def test_openvino_refuses_a_kernel_calling_its_own_runner() -> None:
    """A kernel that called infer() of the runner running it waited for that runner's lock for ever."""
    import threading

    _needs("openvino")
    node = helper.make_node("Reenter", ["x"], ["y"], domain="tests.backends.nospec")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("tests.backends.nospec", 1)]
    )
    runner = OpenVINORunner(model).load()
    _REENTERING[:] = [runner]
    raised: list[BaseException] = []

    def call() -> None:
        try:
            runner.infer({"x": np.ones(3, np.float32)})
        except BaseException as exc:  # the test's verdict
            raised.append(exc)

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "infer() called from the runner's own kernel did not return"
    runner.close()
    assert len(raised) == 1 and isinstance(raised[0], BackendRunError)
    assert "a kernel called infer() of the runner that is running it" in str(raised[0])


@pytest.mark.parametrize(
    ("elem", "value", "message"),
    [
        (TensorProto.INT64, 2**40 + 1, r"input 'x' holds 1099511627777, beyond int32"),
        (TensorProto.INT64, -(2**31) - 1, r"input 'x' holds -2147483649, beyond int32"),
        (TensorProto.DOUBLE, 1e300, r"input 'x' holds 1e\+300, beyond float32"),
        (TensorProto.DOUBLE, -np.inf, r"input 'x' holds -inf, which .* turns into float32's largest finite value"),
    ],
    ids=["int64-high", "int64-low", "float64", "float64-inf"],
)
def test_openvino_refuses_inputs_its_cpu_plugin_would_narrow(elem: int, value: float, message: str) -> None:
    """OpenVINO's CPU plugin computes int64 in int32 and float64 in float32: such inputs arrived wrapped or
    clamped, silently."""
    _needs("openvino")
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    with OpenVINORunner(_square_model(elem)) as runner:
        with pytest.raises(opbridge.OpbridgeError, match=message):
            runner.infer({"x": np.array([value, 2], dtype)})
        assert runner.infer({"x": np.array([3, 2], dtype)})["y"].tolist() == [9, 4]


@pytest.mark.parametrize("backend", ["onnxruntime", "reference", "openvino"])
def test_every_backend_refuses_a_domain_the_model_does_not_import(backend: str) -> None:
    """OpenVINO and opbridge's ONNX Runtime session (whose bridge imports the domains it binds) ran a node of a
    domain without opset import, and the reference evaluator failed on it with its own words; plain ONNX
    Runtime refuses such a model ("No opset import for domain"). Each refuses it at load, naming the domain,
    the node and the import to add."""
    _needs(backend)
    model = _times_model(["x"], k=3)
    del model.opset_import[1]  # (the tests.backends import)
    message = (
        r"domain 'tests.backends' is used by node\(s\) 't' \(Times\) but the model has no opset import for it "
        r"\(add opset_import \{domain: 'tests.backends', version: 1\} to the model\)\. `opbridge lint MODEL`"
    )
    with pytest.raises(opbridge.ModelLoadError, match=message):
        get_backend(backend)(model).load()


def test_openvino_close_cuts_its_python_ops_loose_from_the_model() -> None:
    """OpenVINO never frees a Python op (its C++ node holds the Python object, which holds the node), and
    a node holds the graph upstream of it: closing the runner points the inputs of the ops made while it
    loaded at an empty Parameter, so they keep none of the model's weights (a copy per load)."""
    _needs("openvino")
    from onnx import numpy_helper

    w = np.arange(4, dtype=np.float32)
    nodes = [
        helper.make_node("Add", ["x", "w"], ["s"], name="add"),
        helper.make_node("Times", ["s"], ["y"], domain="tests.backends", name="t", k=3),
    ]
    value = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [4])  # noqa: E731
    graph = helper.make_graph(nodes, "g", [value("x")], [value("y")], [numpy_helper.from_array(w, "w")])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("tests.backends", 1)]
    runner = OpenVINORunner(helper.make_model(graph, opset_imports=opsets)).load()
    x = np.ones(4, np.float32)
    np.testing.assert_array_equal(runner.infer({"x": x})["y"], (x + w) * 3)
    ops = [op for op in runner.ov_model.get_ordered_ops() if type(op).__name__ == "opbridge_Times"]
    assert [op.input_value(0).get_node().get_type_name() for op in ops] == ["Add"]
    runner.close()
    sources = [op.input_value(0) for op in ops]
    assert [s.get_node().get_type_name() for s in sources] == ["Parameter"]
    assert [str(s.get_partial_shape()) for s in sources] == ["[0]"]


@opbridge.op("tests.backends::ToF64")
def _to_f64(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float64) / 3


class _Float64Onward(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _to_f64(x) * 2.0


def test_openvino_runs_standard_ops_on_a_float64_output_of_a_custom_node(tmp_path) -> None:
    """The CPU plugin computes float64 in float32, lowering the constant of ``* 2.0`` but not a custom op's
    output ("Arguments do not have the same element type (f64, f32)"): the model loads, its output stays
    float64 with float32's digits, and the runner's note names it."""
    _needs("openvino")
    path = tmp_path / "f64_onward.onnx"
    x = torch.tensor([[1.0, 2.0, 5.0]])
    opbridge.export(_Float64Onward(), (x,), path, exporter="torchscript", input_names=["x"], output_names=["y"])
    with OpenVINORunner(path) as runner:
        y = runner.infer({"x": x.numpy()})["y"]
        notes = list(runner.notes)
    assert y.dtype == np.float64
    want = (x.numpy().astype(np.float32) / np.float32(3)) * np.float32(2)
    np.testing.assert_array_equal(y, want.astype(np.float64))
    assert notes == [
        "float64 output 'y': OpenVINO's CPU plugin computes float64 in float32, so the comparison is at float32 "
        "precision (about 7 significant digits; magnitudes below float32's become 0)"
    ]


@opbridge.op("tests.backends::Exp64")
def _exp64(x: torch.Tensor) -> torch.Tensor:
    return torch.exp(x)


class _Exp64(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _exp64(x)


@pytest.fixture(scope="module")
def exp64_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("exp64") / "exp64.onnx"
    x = torch.zeros(2, dtype=torch.float64)
    opbridge.export(_Exp64(), (x,), path, exporter="torchscript", input_names=["x"], output_names=["y"])
    return path


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (100.0, r"output 0 holds values beyond float32 \(e.g. 2.68811714181613\d*e\+43\)"),
        (
            1000.0,
            r"output 0 holds inf, which OpenVINO's CPU plugin, computing float64 in float32, turns into float32's",
        ),
    ],
    ids=["beyond", "inf"],
)
def test_openvino_refuses_a_float64_result_its_cpu_plugin_would_narrow(
    exp64_model: Path, value: float, message: str
) -> None:
    """A custom op's float64 result past float32's range was refused, an infinite one came back as 3.4e38
    (the plugin's float32 lowering), silently: refused as an infinite input is."""
    _needs("openvino")
    with OpenVINORunner(exp64_model) as runner:
        with pytest.raises(opbridge.OpbridgeError, match=message):
            runner.infer({"x": np.array([0.0, value])})
        np.testing.assert_allclose(runner.infer({"x": np.array([0.0, 1.0])})["y"], [1.0, np.e], rtol=1e-6, atol=0)


@opbridge.kernel("tests.backends.defaults::Negate")
def _negate_kernel(x: np.ndarray) -> np.ndarray:
    return -x


def _resize_with_default_mode(custom: bool) -> onnx.ModelProto:
    """acme::Up(x): Resize(x, scales 2) with mode taken from the function's attribute, whose default is
    "cubic", called without it; with ``custom``, the body's result goes through a kernel-only custom node
    (which makes opbridge's session inline the bodies)."""
    resize = helper.make_node("Resize", ["x", "", "sc"], ["r" if custom else "y"])
    resize.attribute.append(helper.make_attribute_ref("mode", onnx.AttributeProto.STRING))
    nodes = [
        helper.make_node("Constant", [], ["sc"], value=helper.make_tensor("s", TensorProto.FLOAT, [4], [1, 1, 2, 2])),
        resize,
    ]
    if custom:
        nodes.append(helper.make_node("Negate", ["r"], ["y"], domain="tests.backends.defaults"))
    imports = [helper.make_opsetid("", 19), helper.make_opsetid("tests.backends.defaults", 1)]
    body = helper.make_function("acme", "Up", ["x"], ["y"], nodes, imports, attributes=[])
    body.attribute_proto.append(helper.make_attribute("mode", "cubic"))
    graph = helper.make_graph(
        [helper.make_node("Up", ["x"], ["y"], domain="acme", name="up")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 6, 6])],
    )
    return helper.make_model(
        graph, opset_imports=[*imports, helper.make_opsetid("acme", 1)], functions=[body], ir_version=10
    )


@pytest.mark.parametrize("custom", [False, True], ids=["standard-body", "body-with-custom-node"])
@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_a_function_attributes_default_survives_inlining(backend: str, custom: bool) -> None:
    """onnx's inliner drops the defaults of a function's attributes: OpenVINO (which runs inlined bodies) and
    opbridge's session (which inlines bodies holding a custom node) ran a Resize whose mode defaults to
    cubic as nearest."""
    _needs(backend)
    model = _resize_with_default_mode(custom)
    x = np.arange(9, dtype=np.float32).reshape(1, 1, 3, 3)
    import onnxruntime as ort

    plain = _resize_with_default_mode(False)  # (plain ONNX Runtime expands the body itself, with the default)
    want = ort.InferenceSession(plain.SerializeToString()).run(None, {"x": x})[0] * (-1 if custom else 1)
    with get_backend(backend)(model) as runner:
        got = runner.infer({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert not np.allclose(want, np.repeat(np.repeat(x, 2, axis=2), 2, axis=3) * (-1 if custom else 1))


def test_openvino_notes_that_it_computes_float64_in_float32() -> None:
    """A plain float64 model too: OpenVINO computes it in float32, where 1e-300 arrives as 0 (as the note
    says; such a value beside others is harmless, so it is not refused)."""
    _needs("openvino")
    value = lambda name: helper.make_tensor_value_info(name, TensorProto.DOUBLE, [3])  # noqa: E731
    graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"])], "g", [value("x")], [value("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with OpenVINORunner(model) as runner:
        assert runner.notes == [
            "float64 input 'x' and output 'y': OpenVINO's CPU plugin computes float64 in float32, so the comparison "
            "is at float32 precision (about 7 significant digits; magnitudes below float32's become 0)"
        ]
        np.testing.assert_array_equal(runner.infer({"x": np.array([0.0, -1e-300, 1.0])})["y"], [0.0, 0.0, 2.0])
        # float32's subnormals arrive as they are
        y = runner.infer({"x": np.array([0.0, 1e-45, 0.1])})["y"]
    np.testing.assert_array_equal(y, np.array([0.0, 2 * float(np.float32(1e-45)), float(np.float32(0.2))]))


@opbridge.op("tests.backends::TwiceSwapped", shape=lambda x: opbridge.TensorInfo(x.shape, x.dtype))
def _twice_swapped(x: torch.Tensor) -> torch.Tensor:
    return x + x


@_twice_swapped.register_kernel
def _twice_swapped_numpy(x: np.ndarray) -> np.ndarray:
    return (x + x).astype(np.dtype(">f4"))


def _one_node_model(op_type: str) -> onnx.ModelProto:
    """y = tests.backends::``op_type``(x), float32 (2, 3)."""
    graph = helper.make_graph(
        [helper.make_node(op_type, ["x"], ["y"], domain="tests.backends")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("tests.backends", 1)]
    )


@pytest.mark.parametrize("backend", ["onnxruntime", "reference", "openvino"])
def test_a_byte_swapped_kernel_result_runs_on_every_backend(backend: str) -> None:
    """A big-endian float32 result is the node's float32, in native order (OpenVINO refused it)."""
    _needs(backend)
    model = _one_node_model("TwiceSwapped")
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
    with get_backend(backend)(model) as runner:
        y = runner.infer({"x": x})["y"]
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, x + x)


@opbridge.op("tests.backends::TwiceListed", shape=lambda x: opbridge.TensorInfo(x.shape, x.dtype))
def _twice_listed(x: torch.Tensor) -> torch.Tensor:
    return x + x


@_twice_listed.register_kernel
def _twice_listed_numpy(x: np.ndarray) -> list:
    return (x + x).tolist()


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_a_kernel_returning_a_list_is_told_to_return_an_array(backend: str) -> None:
    """``.tolist()`` of a one-output kernel was read as one output per row ("returned 2 output(s), the node
    has 1"); the message names the list."""
    _needs(backend)
    model = _one_node_model("TwiceListed")
    with get_backend(backend)(model) as runner, pytest.raises(Exception, match=r"returned a list \(of list\), not an"):
        runner.infer({"x": np.ones((2, 3), np.float32)})


@opbridge.op("tests.backends.v2::Thrice", version=2)
def _thrice_v2(x: torch.Tensor) -> torch.Tensor:
    return x * 3


def test_a_missing_domain_import_is_named_with_the_version_of_its_ops() -> None:
    """The fix named version 1 whatever the domain's ops: a model of a version-2 op given that import
    still failed (its op at version 1 does not exist)."""
    graph = helper.make_graph(
        [helper.make_node("Thrice", ["x"], ["y"], domain="tests.backends.v2", name="t")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(opbridge.ModelLoadError, match=r"\{domain: 'tests.backends.v2', version: 2\}"):
        get_backend("reference")(model).load()
    model.opset_import.append(helper.make_opsetid("tests.backends.v2", 2))  # (the fix named)
    with get_backend("reference")(model) as runner:
        np.testing.assert_array_equal(runner.infer({"x": np.ones(2, np.float32)})["y"], [3.0, 3.0])


def test_onnxruntime_runner_raises_a_failing_kernel_without_logging_it(tmp_path, capfd) -> None:
    """The run's error is raised, with ONNX Runtime's message: ONNX Runtime does not also print it (in red,
    on stderr, where `opbridge verify -q` should be quiet)."""
    path = tmp_path / "m.onnx"
    opbridge.export(_Wrap(explodes), (torch.randn(2, 3),), path, exporter="torchscript", input_names=["x"])
    with OnnxRuntimeRunner(path) as runner:
        capfd.readouterr()
        with pytest.raises(Exception, match=r"Explodes node '/Explodes': kernel raised ValueError: kernel exploded"):
            runner.infer({"x": np.ones((2, 3), np.float32)})
    err = capfd.readouterr().err
    assert "onnxruntime" not in err and "kernel exploded" not in err, err


def test_openvino_names_a_default_domain_kernel_registered_only_for_later_opsets() -> None:
    """As the two sessions do: the kernel exists, from a later opset than the model's."""
    _needs("openvino")
    from onnx import TensorProto, helper

    @opbridge.kernel("LaterOnly", domain="", since_version=13)
    def _later_only(x: np.ndarray) -> np.ndarray:
        return x * 3

    graph = helper.make_graph(
        [helper.make_node("LaterOnly", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    with pytest.raises(opbridge.UnknownOpError, match=r"registered only from opset version 13 on .* imports opset 11"):
        with OpenVINORunner(model) as runner:
            runner.infer({"x": np.ones(2, np.float32)})


@opbridge.op("tests.mismatch::Shift")
def _shift(x: torch.Tensor, k: Literal[1, 2, 3] = 1) -> torch.Tensor:
    return x + k


def _shift_model(inputs: list[str], outputs: list[str], **attrs: Any) -> onnx.ModelProto:
    node = helper.make_node("Shift", inputs, outputs, domain="tests.mismatch", name="s", **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("x", "z")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("tests.mismatch", 1)]
    return helper.make_model(graph, opset_imports=opsets)


_MISMATCHES = {
    "attribute-type": (
        _shift_model(["x"], ["y"], k="one"),
        r"attribute 'k' is STRING in the node; the op declares it int",
    ),
    "float-for-int": (_shift_model(["x"], ["y"], k=1.5), r"attribute 'k' is FLOAT in the node"),
    "undeclared-attribute": (
        _shift_model(["x"], ["y"], q=1),
        r"has attribute\(s\) \['q'\] that the op does not declare",
    ),
    "extra-input": (_shift_model(["x", "z"], ["y"]), r"has 2 inputs; the op takes at most 1"),
    # (a value outside the op's Literal: the reference session ran the node and the reference's code met it)
    "attribute-value": (
        _shift_model(["x"], ["y"], k=7),
        r"has attribute 'k' = 7 where tests.mismatch::Shift takes \[1, 2, 3\]: set it to one of them",
    ),
}


@pytest.mark.parametrize("case", list(_MISMATCHES))
@pytest.mark.parametrize(
    "backend", ["InferenceSession", "ReferenceSession", "onnxruntime", "onnxruntime-kernels", "reference", "openvino"]
)
def test_every_backend_raises_node_mismatch_error_for_a_node_that_does_not_fit_its_op(backend: str, case: str) -> None:
    """A node of another attribute type than its op declares was an OpDefinitionError in opbridge's ONNX
    Runtime session, a ModelLoadError in the reference session and a bare ValueError in OpenVINO; every
    backend now raises the one NodeMismatchError, which both former classes still catch."""
    model, message = _MISMATCHES[case]
    with pytest.raises(opbridge.NodeMismatchError, match=r"tests\.mismatch::Shift node 's'.*" + message) as caught:
        if backend in ("InferenceSession", "ReferenceSession"):
            getattr(opbridge, backend)(model).run(None, {"x": np.ones(2, np.float32), "z": np.ones(2, np.float32)})
        else:
            _needs(backend)
            with get_backend(backend)(model) as runner:
                runner.infer({"x": np.ones(2, np.float32), "z": np.ones(2, np.float32)})
    assert isinstance(caught.value, opbridge.OpDefinitionError) and isinstance(caught.value, opbridge.ModelLoadError)
