"""Generated TensorRT plugin creators: registration and exact attribute round trips (CPU, no engine)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

import opbridge
from opbridge.ops import builtin_ops
from opbridge.tensorrt import backend_name
from opbridge.tensorrt._fields import decode_fields, encode_attrs
from opbridge.tensorrt._plugin import recorded_errors

pytestmark = pytest.mark.skipif(
    backend_name() is None, reason="neither tensorrt nor tensorrt_rtx is installed (pip install tensorrt-rtx-cu13)"
)


@opbridge.op("trt_test::AllAttrs")
def all_attrs(
    x: torch.Tensor,
    alpha: float = 0.1,
    steps: int = -3,
    flip: bool = True,
    tag: str = "größe 日本",
    weights: list[float] = [0.5, 1e-7],  # noqa: B006
    dims: list[int] = [1, -2, 2**31 - 1],  # noqa: B006
    names: list[str] = ["a", "", "ü"],  # noqa: B006
) -> torch.Tensor:
    return x


# Non-default values that only survive exact serialization: 0.1 and 1/3 are not float32 values,
# 2**40 is not an int32, "" and "\0"-free UTF-8 strings.
EXACT = {
    "alpha": 1 / 3,
    "steps": 2**40,
    "flip": False,
    "tag": "",
    "weights": [0.1, -0.0, 3.4028234663852886e38],  # float64 values up to float32's largest
    "dims": [],
    "names": ["", "x", "日本語"],
}


def _trt() -> Any:
    from opbridge.tensorrt import load_tensorrt, register_plugins

    trt, _ = load_tensorrt()
    register_plugins()
    return trt


def _collection(trt: Any, fields: list[tuple[str, str, np.ndarray]]) -> tuple[Any, list[Any]]:
    keep = [trt.PluginField(n, d, getattr(trt.PluginFieldType, t)) for n, t, d in fields]
    return trt.PluginFieldCollection(keep), keep


def _fields_of(collection: Any) -> list[tuple[str, str, np.ndarray]]:
    return [(f.name, f.type.name, np.array(f.data, copy=True)) for f in collection]


def _parser_style(spec: opbridge.OpSpec, attrs: dict[str, Any]) -> list[tuple[str, str, np.ndarray]]:
    """Fields as TensorRT's ONNX parser makes them: INT(S)/BOOL int32, FLOAT(S) float32, strings char + NUL."""
    out = []
    for a in spec.attributes:
        v = attrs[a.name]
        t = a.type
        if t in (opbridge.AttrType.INT, opbridge.AttrType.BOOL):
            out.append((a.name, "INT32", np.array([int(v)], np.int32)))
        elif t is opbridge.AttrType.INTS:
            out.append((a.name, "INT32", np.array(list(v), np.int32)))
        elif t is opbridge.AttrType.FLOAT:
            out.append((a.name, "FLOAT32", np.array([v], np.float32)))
        elif t is opbridge.AttrType.FLOATS:
            out.append((a.name, "FLOAT32", np.array(list(v), np.float32)))
        elif t is opbridge.AttrType.STRING:
            out.append((a.name, "CHAR", np.frombuffer(v.encode() + b"\0", np.int8).copy()))
        else:
            out.append((a.name, "CHAR", np.frombuffer(b"".join(s.encode() + b"\0" for s in v), np.int8).copy()))
    return out


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal, with floats compared bit for bit (sign of zero included)."""
    if a.keys() != b.keys():
        return False
    for k, x in a.items():
        y = b[k]
        xs, ys = (x, y) if isinstance(x, tuple) else ((x,), (y,))
        if len(xs) != len(ys):
            return False
        for p, q in zip(xs, ys):
            if type(p) is not type(q):
                return False
            if isinstance(p, float) and (math.copysign(1, p) != math.copysign(1, q) or p != q):
                return False
            if p != q:
                return False
    return True


OPS = [*builtin_ops(), all_attrs]


@pytest.mark.parametrize("opdef", OPS, ids=lambda o: o.spec.name)
def test_registered_under_empty_namespace_and_domain(opdef: opbridge.OpDef) -> None:
    trt = _trt()
    registry = trt.get_plugin_registry()
    for namespace in ("", opdef.spec.domain):
        creator = registry.get_creator(opdef.spec.name, str(opdef.spec.version), namespace)
        assert creator is not None, namespace
        assert creator.name == opdef.spec.name
        assert creator.plugin_namespace == namespace
        assert [f.name for f in creator.field_names] == [a.name for a in opdef.spec.attributes]


def test_register_plugins_is_idempotent() -> None:
    from opbridge.tensorrt import list_plugins, register_plugins

    first = register_plugins()
    second = register_plugins()
    assert first == second
    listed = [(p.name, p.version, p.namespace) for p in list_plugins()]
    assert len(listed) == len(set(listed)), "one creator per name, version and namespace"
    assert ("DynamicTRTResize", "1", "Test") in listed and ("DynamicTRTResize", "1", "") in listed


@pytest.mark.parametrize("opdef", OPS, ids=lambda o: o.spec.name)
def test_parser_fields_then_serialize_round_trip(opdef: opbridge.OpDef) -> None:
    """create_plugin (parser-style fields) -> get_fields_to_serialize -> create_plugin gives equal attributes."""
    trt = _trt()
    creator = trt.get_plugin_registry().get_creator(opdef.spec.name, str(opdef.spec.version), opdef.spec.domain)
    defaults = opdef.spec.bind_attributes({})
    collection, _keep = _collection(trt, _parser_style(opdef.spec, defaults))
    plugin = creator.create_plugin("node0", collection, trt.TensorRTPhase.BUILD)
    # What the parser delivers is float32: the plugin holds float32-rounded floats, nothing else changes.
    expected = {
        k: (
            float(np.float32(v))
            if isinstance(v, float)
            else tuple(float(np.float32(x)) for x in v)
            if isinstance(v, tuple) and v and isinstance(v[0], float)
            else v
        )
        for k, v in defaults.items()
    }
    assert _same(plugin.attrs, expected)
    serialized = _fields_of(plugin.get_fields_to_serialize())
    again_collection, _keep2 = _collection(trt, serialized)
    again = creator.create_plugin("node0", again_collection, trt.TensorRTPhase.RUNTIME)
    assert _same(again.attrs, plugin.attrs)
    assert again.plugin_name == opdef.spec.name and again.num_outputs == len(opdef.spec.outputs)


def test_exact_round_trip_of_values_the_parser_cannot_carry() -> None:
    """float64, int64, empty strings and lists, UTF-8 survive serialization bit for bit."""
    trt = _trt()
    creator = trt.get_plugin_registry().get_creator("AllAttrs", "1", "trt_test")
    values = all_attrs.spec.bind_attributes(EXACT)
    collection, _keep = _collection(trt, encode_attrs(all_attrs.spec, values))
    plugin = creator.create_plugin("n", collection, trt.TensorRTPhase.RUNTIME)
    assert _same(plugin.attrs, values)
    again_collection, _keep2 = _collection(trt, _fields_of(plugin.get_fields_to_serialize()))
    again = creator.create_plugin("n", again_collection, trt.TensorRTPhase.RUNTIME)
    assert _same(again.attrs, values)
    assert again.attrs["alpha"] == 1 / 3 and again.attrs["steps"] == 2**40
    assert again.attrs["weights"][1] == 0.0 and math.copysign(1, again.attrs["weights"][1]) == -1


def test_decode_without_tensorrt_fills_defaults_and_names_bad_fields() -> None:
    spec = all_attrs.spec
    assert decode_fields(spec, []) == spec.bind_attributes({})
    assert decode_fields(spec, [("plugin_version", "CHAR", np.frombuffer(b"1\0", np.int8))]) == spec.bind_attributes({})
    with pytest.raises(opbridge.OpDefinitionError, match=r"attribute 'bogus', which the op does not declare"):
        decode_fields(spec, [("bogus", "INT32", np.array([1], np.int32))])
    # an INT attribute where the op declares a float one: taken, as ONNX shape inference and the bridge take it
    assert decode_fields(spec, [("alpha", "INT32", np.array([3], np.int32))])["alpha"] == 3.0
    with pytest.raises(opbridge.OpDefinitionError, match=r"'alpha' expects float but its plugin field has type CHAR"):
        decode_fields(spec, [("alpha", "CHAR", np.frombuffer(b"x\0", np.int8))])
    with pytest.raises(opbridge.OpDefinitionError, match=r"'steps' is a single int but its plugin field holds 2"):
        decode_fields(spec, [("steps", "INT32", np.array([1, 2], np.int32))])
    with pytest.raises(opbridge.OpDefinitionError, match="not valid UTF-8"):
        decode_fields(spec, [("tag", "CHAR", np.frombuffer(b"\xff\xfe\0", np.int8))])


def test_decode_refuses_a_value_outside_the_attribute_s_choices() -> None:
    from opbridge.ops.detection import RoIAlign

    assert decode_fields(RoIAlign.spec, [("mode", "CHAR", np.frombuffer(b"max\0", np.int8))])["mode"] == "max"
    with pytest.raises(opbridge.OpDefinitionError, match=r"attribute 'mode' = 'mean' is not one of the values it"):
        decode_fields(RoIAlign.spec, [("mode", "CHAR", np.frombuffer(b"mean\0", np.int8))])


def test_create_plugin_with_bad_field_fails_with_message() -> None:
    trt = _trt()
    creator = trt.get_plugin_registry().get_creator("MySELU", "1", "")
    collection, _keep = _collection(trt, [("attr3", "CHAR", np.frombuffer(b"x\0", np.int8).copy())])
    with pytest.raises(Exception, match="'attr3' expects float"):
        creator.create_plugin("bad", collection, trt.TensorRTPhase.BUILD)


def test_kernel_launcher_refuses_undeclared_dtypes_and_missing_kernels() -> None:
    from opbridge.tensorrt import KernelLauncher

    launcher = KernelLauncher(opbridge.ops.MySELU, opbridge.ops.MySELU.spec.bind_attributes({}))
    with pytest.raises(
        opbridge.OpDefinitionError,
        match=r"input 'x' is bfloat16, but the op's GPU kernel supports only float32, float16",
    ):
        launcher.on_shape_change([((2,), "bfloat16")] * 3, [((2,), "bfloat16")])
    launcher.on_shape_change([((2, 3), "float16")] * 3, [((2, 3), "float16")])
    assert launcher.shapes == ([((2, 3), "float16")] * 3, [((2, 3), "float16")])
    # integer tensors (NMS's int32 labels) pass a kernel that declares floating-point dtypes only
    from opbridge.ops.detection import BatchedNMS

    nms = KernelLauncher(BatchedNMS, BatchedNMS.spec.bind_attributes({"num_classes": 3}))
    nms.on_shape_change(
        [((1, 5, 1, 4), "float16"), ((1, 5, 3), "float16")], [((1, 5, 5), "float16"), ((1, 5), "int32")]
    )
    with pytest.raises(opbridge.OpDefinitionError, match=r"output 'dets' is float64"):
        nms.on_shape_change([((1, 5, 1, 4), "float32")] * 2, [((1, 5, 5), "float64"), ((1, 5), "int32")])
    # (an op without a GPU kernel runs its reference on the GPU: tests/gpu/test_trt_kernels_gpu.py)


@opbridge.op("trt_test::Doubled64")
def doubled64(x: torch.Tensor) -> torch.Tensor:
    return x.double() * 2


doubled64.register_gpu_kernel(lambda i, o, a, s: o[0].copy_(i[0] * 2), dtypes=("float32", "float64"))


def test_dtypes_tensorrt_has_no_tensors_of_are_refused_by_name() -> None:
    """A kernel declaring float64 made float64 look supported, and the build then failed on a bare
    KeyError 'float64'; an op without a kernel was told to register one for float64."""
    from opbridge.tensorrt import KernelLauncher
    from opbridge.tensorrt._runtime import dtype_supported

    assert not dtype_supported(doubled64, "float64", output=True)
    assert not dtype_supported(all_attrs, "float64")
    launcher = KernelLauncher(doubled64, {})
    with pytest.raises(
        opbridge.OpDefinitionError,
        match=r"trt_test::Doubled64: output 'output' is float64, and TensorRT has no float64 tensors .*; make the "
        r"op return float32 for TensorRT",
    ):
        launcher.check_dtypes(["float64"], "output")
    with pytest.raises(opbridge.OpDefinitionError, match=r"input 'x' is float64, and TensorRT has no float64 tensors"):
        KernelLauncher(all_attrs, {}).check_dtypes(["float64"], "input")
    launcher.check_dtypes(["float32"], "output")


def _desc(trt: Any, dims: tuple[int, ...], dtype: Any) -> Any:
    desc = trt.PluginTensorDesc()
    desc.dims, desc.type, desc.format = trt.Dims(list(dims)), dtype, trt.TensorFormat.LINEAR
    return desc


def test_runtime_callbacks_translate_tensorrt_descriptions() -> None:
    """on_shape_change/enqueue turn PluginTensorDesc into the plain values the GPU path takes (no GPU needed)."""
    trt = _trt()
    creator = trt.get_plugin_registry().get_creator("MySELU", "1", "")
    plugin = creator.create_plugin("n", trt.PluginFieldCollection([]), trt.TensorRTPhase.RUNTIME)
    half = _desc(trt, (2, 3, 4), trt.DataType.HALF)
    vec = _desc(trt, (3,), trt.DataType.HALF)
    plugin.on_shape_change([half, vec, vec], [half])
    assert plugin.launcher.shapes == (
        [((2, 3, 4), "float16"), ((3,), "float16"), ((3,), "float16")],
        [((2, 3, 4), "float16")],
    )
    ints = _desc(trt, (2, 3, 4), trt.DataType.INT32)
    with pytest.raises(opbridge.OpDefinitionError, match=r"input 'x' is int32, but the op's GPU kernel supports only"):
        plugin.on_shape_change([ints, vec, vec], [half])
    no_kernel = (
        trt.get_plugin_registry()
        .get_creator("AllAttrs", "1", "")
        .create_plugin("m", trt.PluginFieldCollection([]), trt.TensorRTPhase.RUNTIME)
    )
    f32 = _desc(trt, (2, 3), trt.DataType.FLOAT)
    with pytest.raises(AssertionError, match="not compiled with CUDA"):  # (no kernel: the reference, on CUDA)
        no_kernel.enqueue([f32], [f32], [0], [0], 0, 0)
    assert ("m", "AllAttrs") in [(n, o) for n, o, _ in recorded_errors()]


def test_deserialize_engine_quotes_tensorrt_and_registers_the_plugins_first() -> None:
    """TensorRT's own deserialize only returns None; the helper registers opbridge's plugins, then raises
    with TensorRT's error. (Here, without a GPU, TensorRT fails on the bytes before any plugin lookup.)"""
    from opbridge.tensorrt import deserialize_engine, list_plugins

    with pytest.raises(opbridge.OpbridgeError) as caught:
        deserialize_engine(b"not a TensorRT engine" * 8)
    message = str(caught.value)
    assert message.startswith(f"{backend_name()} could not deserialize the engine: ")
    assert "Serialization" in message  # TensorRT's own error, quoted
    assert "register_plugins" not in message  # no plugin is named missing: no plugin hint
    assert {"opbridge::MySELU", "trt_test::AllAttrs"} <= {p.op for p in list_plugins()}


# TensorRT 10's log lines for an engine whose plugin creator is not registered (NVIDIA/TensorRT#1913 and
# laugh12321/TensorRT-YOLO#118 quote them): they cannot be produced here, as no engine runs on this machine.
MISSING = (
    "IPluginRegistry::getCreator: Error Code 4: API Usage Error (Cannot find plugin: {name}, version: 1, "
    "namespace:{domain}.)"
)
NO_CREATOR = (
    "IRuntime::deserializeCudaEngine: Error Code 1: Serialization (Serialization assertion creator failed.Cannot "
    "deserialize plugin since corresponding IPluginCreator not found in Plugin Registry)"
)


def test_deserialize_failure_names_the_op_of_a_missing_plugin() -> None:
    """A missing creator named in TensorRT's log becomes the op to import and the call that registers it."""
    from opbridge.tensorrt._runtime import _deserialize_failure

    unknown = _deserialize_failure(
        "m.engine", "tensorrt", [MISSING.format(name="Blend", domain="acme"), NO_CREATOR], ["opbridge::MySELU"]
    )
    assert unknown.startswith("tensorrt could not deserialize m.engine: IPluginRegistry::getCreator")
    assert (
        "Plugin Blend v1 (namespace 'acme') belongs to no opbridge op defined in this process: import the module "
        "that defines the acme::Blend op (or pass its file in ops=...) so that "
        "opbridge.tensorrt.register_plugins() registers its plugin"
    ) in unknown
    known = _deserialize_failure(
        "m.engine", "tensorrt", [MISSING.format(name="AllAttrs", domain="trt_test")], ["trt_test::AllAttrs"]
    )
    assert "Plugin AllAttrs v1 (namespace 'trt_test') is trt_test::AllAttrs's, which opbridge registered" in known
    unnamed = _deserialize_failure("m.engine", "tensorrt", [NO_CREATOR], ["opbridge::MySELU"])
    assert "registered now: opbridge::MySELU. Import the modules that define the engine's other ops" in unnamed
