"""ReferenceSession: the ONNX reference evaluator with opbridge's custom ops, driven like ONNX Runtime."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from _graph_models import legacy_model
from conftest import EXPORTERS, SEED_IDS, SEED_TOLERANCE, SHAPE_IDS, seed_by_name
from conftest import seed_case as shared_seed_case
from onnx import TensorProto, helper

import opbridge
from opbridge.backends.base import InputError
from opbridge.functions import ref_attr
from opbridge.reference import ReferenceSession

TOLERANCE = SEED_TOLERANCE


def seed_case(name: str, which: int) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    return shared_seed_case(name, which, seed=200)


def one_node_model(
    nodes: list[onnx.NodeProto],
    inputs: list[tuple[str, int, list]],
    outputs: list[tuple[str, int, list]],
    domains: dict[str, int],
    functions: list[onnx.FunctionProto] | None = None,
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(*i) for i in inputs],
        [helper.make_tensor_value_info(*o) for o in outputs],
    )
    imports = [helper.make_opsetid("", 18)] + [helper.make_opsetid(d, v) for d, v in domains.items()]
    return helper.make_model(graph, opset_imports=imports, functions=functions or [])


# --------------------------------------------------------------------------- seed models


@pytest.mark.parametrize("functions", [True, False], ids=["with_bodies", "without_bodies"])
@pytest.mark.parametrize("which", [0, 1, 2], ids=SHAPE_IDS)
@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", SEED_IDS)
def test_seed_models_match_eager(seed_export, name: str, exporter: str, which: int, functions: bool) -> None:
    """The spec path (the ops' PyTorch references; DynamicResize's torch kernel, the same PyTorch op)
    runs every seed, with or without bodies in the model."""
    result = seed_export(name, exporter, functions=functions)
    assert bool(result.model.functions) == functions
    model, inputs = seed_case(name, which)
    with torch.no_grad():
        expected = model(*inputs).numpy()
    session = ReferenceSession(result.path)
    want = {"torch kernel"} if name == "super_resolution" else {"PyTorch reference"}
    assert set(session.implementations.values()) == want
    feed = {n: t.numpy() for n, t in zip(seed_by_name(name).input_names, inputs)}
    rtol, atol = TOLERANCE.get(name, (1e-3, 1e-5))
    np.testing.assert_allclose(session.run(None, feed)[0], expected, rtol=rtol, atol=atol)


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", SEED_IDS)
def test_inputs_and_outputs_describe_like_onnxruntime(seed_export, name: str, exporter: str) -> None:
    path = str(seed_export(name, exporter).path)
    ours = ReferenceSession(path)
    theirs = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for mine, other in [(ours.get_inputs(), theirs.get_inputs()), (ours.get_outputs(), theirs.get_outputs())]:
        assert [(v.name, list(v.shape), v.type) for v in mine] == [(v.name, list(v.shape), v.type) for v in other]


def test_prefer_function_without_bodies_falls_back_to_the_spec(seed_export) -> None:
    session = ReferenceSession(seed_export("strange_net", "dynamo", functions=False).path, prefer="function")
    assert session.implementations == {("opbridge", "MyStrangeOp"): "PyTorch reference"}


def test_accepts_path_bytes_and_proto(seed_export) -> None:
    result = seed_export("myselu", "torchscript")
    x = np.random.default_rng(0).standard_normal((1, 1, 4, 4)).astype(np.float32)
    outs = [
        ReferenceSession(m).run(["output"], {"image": x})[0]
        for m in (result.path, str(result.path), result.path.read_bytes(), result.model)
    ]
    for out in outs[1:]:
        np.testing.assert_array_equal(out, outs[0])


# --------------------------------------------------------------------------- kernels and attributes


@opbridge.op("tests.reference::Affine", outputs=("scaled", "shifted"))
def affine(
    x: torch.Tensor,
    scale: float = 1.0,
    shift: list[int] = [0, 0],  # noqa: B006
    label: str = "",
    negate: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x * scale * len(label), x + sum(shift)), negated when ``negate``."""
    sign = -1.0 if negate else 1.0
    return sign * x * scale * len(label), sign * (x + sum(shift))


def _affine_model(**attrs: object) -> onnx.ModelProto:
    node = helper.make_node("Affine", ["x"], ["a", "b"], domain="tests.reference", **attrs)
    return one_node_model(
        [node],
        [("x", TensorProto.FLOAT, [3])],
        [("a", TensorProto.FLOAT, [3]), ("b", TensorProto.FLOAT, [3])],
        {"tests.reference": 1},
    )


def test_spec_attributes_are_typed_and_defaulted() -> None:
    x = np.array([1.0, 2.0, -3.0], np.float32)
    session = ReferenceSession(_affine_model(scale=0.5, shift=[1, 2], label="日本語", negate=1))
    assert session.implementations == {("tests.reference", "Affine"): "PyTorch reference"}
    scaled, shifted = session.run(None, {"x": x})
    np.testing.assert_allclose(scaled, -x * 0.5 * 3)
    np.testing.assert_allclose(shifted, -(x + 3))
    scaled, shifted = ReferenceSession(_affine_model(label="ab")).run(None, {"x": x})
    np.testing.assert_allclose(scaled, x * 2)
    np.testing.assert_allclose(shifted, x)


@opbridge.op("tests.reference::Cube")
def cube(x: torch.Tensor, offset: float = 0.0) -> torch.Tensor:
    """x ** 3 + offset."""
    return x**3 + offset


def _cube_model() -> onnx.ModelProto:
    node = helper.make_node("Cube", ["x"], ["y"], domain="tests.reference", offset=1.5)
    return one_node_model(
        [node], [("x", TensorProto.FLOAT, [2])], [("y", TensorProto.FLOAT, [2])], {"tests.reference": 1}
    )


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_spec_kernel_runs_instead_of_the_reference(kind: str) -> None:
    seen: list[type] = []

    def kernel(x, offset):
        seen.append(type(x))
        return x * x * x + offset

    cube.register_kernel(kernel, kind=kind)
    try:
        session = ReferenceSession(_cube_model())
        out = session.run(None, {"x": np.array([2.0, -1.0], np.float32)})[0]
    finally:
        cube.kernel, cube.kernel_kind = None, None
    assert session.implementations == {("tests.reference", "Cube"): f"{kind} kernel"}
    assert seen == [np.ndarray if kind == "numpy" else torch.Tensor]
    np.testing.assert_allclose(out, [9.5, 0.5])
    assert out.dtype == np.float32


def test_torch_inputs_share_memory_with_numpy() -> None:
    seen: list[int] = []
    feed = np.array([1.0, 2.0], np.float32)

    def kernel(x, offset):
        seen.append(x.data_ptr())
        return x + offset

    cube.register_kernel(kernel, kind="torch")
    try:
        ReferenceSession(_cube_model()).run(None, {"x": feed})
    finally:
        cube.kernel, cube.kernel_kind = None, None
    assert seen == [feed.ctypes.data]


@opbridge.kernel("tests.reference.nospec::Clamp01", kind="numpy")
def clamp01(x, *, low=0.0, names=()):
    assert names == ["a", "ü"]
    return np.clip(x, low, 1.0)


@opbridge.kernel("tests.reference.nospec::Twice", kind="torch", outputs=2)
def twice_torch(x):
    return x * 2, x + x


def test_registered_kernels_run_ops_without_spec() -> None:
    nodes = [
        helper.make_node("Clamp01", ["x"], ["c"], domain="tests.reference.nospec", low=-0.5, names=["a", "ü"]),
        helper.make_node("Twice", ["c"], ["d", "e"], domain="tests.reference.nospec"),
    ]
    model = one_node_model(
        nodes,
        [("x", TensorProto.FLOAT, [4])],
        [("d", TensorProto.FLOAT, [4]), ("e", TensorProto.FLOAT, [4])],
        {"tests.reference.nospec": 1},
    )
    session = ReferenceSession(model)
    assert set(session.implementations.values()) == {"kernel"}
    d, e = session.run(None, {"x": np.array([-2.0, -0.25, 0.5, 3.0], np.float32)})
    np.testing.assert_allclose(d, [-1.0, -0.5, 1.0, 2.0])
    np.testing.assert_array_equal(d, e)


def test_custom_node_inside_a_function_gets_referenced_attributes() -> None:
    """A body calling a spec'd op with an attribute reference: the evaluator's function support feeds it."""
    inner = helper.make_node("Cube", ["u"], ["v"], domain="tests.reference")
    inner.attribute.append(ref_attr("offset", "bias", onnx.AttributeProto.FLOAT))
    body = helper.make_function(
        "tests.reference.fn",
        "CubePlus",
        ["u"],
        ["v"],
        [inner],
        [helper.make_opsetid("", 18), helper.make_opsetid("tests.reference", 1)],
        attributes=["bias"],
    )
    node = helper.make_node("CubePlus", ["x"], ["y"], domain="tests.reference.fn", bias=-2.0)
    model = one_node_model(
        [node],
        [("x", TensorProto.FLOAT, [2])],
        [("y", TensorProto.FLOAT, [2])],
        {"tests.reference": 1, "tests.reference.fn": 1},
        [body],
    )
    session = ReferenceSession(model)
    assert session.implementations == {
        ("tests.reference", "Cube"): "PyTorch reference",
        ("tests.reference.fn", "CubePlus"): "function",
    }
    np.testing.assert_allclose(session.run(None, {"x": np.array([1.0, 2.0], np.float32)})[0], [-1.0, 6.0])


FN = "tests.reference.fn"


def _function(name: str, nodes: list[onnx.NodeProto], k: float | None) -> onnx.FunctionProto:
    """``FN::name(u) -> v`` with attribute ``k`` (its default, or required when None)."""
    return helper.make_function(
        FN,
        name,
        ["u"],
        ["v"],
        nodes,
        [helper.make_opsetid("", 18), helper.make_opsetid(FN, 1)],
        attributes=["k"] if k is None else [],
        attribute_protos=[] if k is None else [helper.make_attribute("k", k)],
    )


def _call(op_type: str, inputs: list[str], outputs: list[str], pass_k: bool) -> onnx.NodeProto:
    node = helper.make_node(op_type, inputs, outputs, domain=FN)
    if pass_k:
        node.attribute.append(ref_attr("k", "k", onnx.AttributeProto.FLOAT))
    return node


def _nested_functions(pass_k: bool) -> list[onnx.FunctionProto]:
    """Outer(u; k=3) = Inner(u; k) + 1 and Inner(u; k=2) = u * k, the caller listed first.

    Without ``pass_k`` Outer calls Inner without k, so Inner's default applies.
    """
    kk = helper.make_node("Constant", [], ["kk"])
    kk.attribute.append(ref_attr("value_float", "k", onnx.AttributeProto.FLOAT))
    inner = _function("Inner", [kk, helper.make_node("Mul", ["u", "kk"], ["v"])], 2.0)
    outer = _function(
        "Outer",
        [
            _call("Inner", ["u"], ["t"], pass_k),
            helper.make_node("Constant", [], ["one"], value_float=1.0),
            helper.make_node("Add", ["t", "one"], ["v"]),
        ],
        3.0,
    )
    return [outer, inner]


def _function_model(node: onnx.NodeProto, functions: list[onnx.FunctionProto]) -> onnx.ModelProto:
    model = one_node_model([node], [("x", TensorProto.FLOAT, [3])], [("y", TensorProto.FLOAT, [3])], {FN: 1}, functions)
    onnx.checker.check_model(model, full_check=True)
    return model


X3 = np.array([1.0, 2.0, -3.0], np.float32)


@pytest.mark.parametrize("order", ["caller_first", "callee_first"])
def test_nested_functions_run_in_either_order(order: str) -> None:
    """ONNX Runtime accepts a function listed before the functions it calls; so does the session."""
    functions = _nested_functions(pass_k=True)
    if order == "callee_first":
        functions.reverse()
    model = _function_model(helper.make_node("Outer", ["x"], ["y"], domain=FN, k=5.0), functions)
    session = ReferenceSession(model, prefer="function")
    assert session.implementations == {(FN, "Outer"): "function", (FN, "Inner"): "function"}
    got = session.run(None, {"x": X3})[0]
    np.testing.assert_array_equal(got, X3 * 5 + 1)
    np.testing.assert_array_equal(got, ort.InferenceSession(model.SerializeToString()).run(None, {"x": X3})[0])


@pytest.mark.parametrize(("pass_k", "factor"), [(True, 3.0), (False, 2.0)], ids=["outer_default", "inner_default"])
def test_nodes_omitting_an_attribute_get_the_function_default(pass_k: bool, factor: float) -> None:
    """A node without k gets Outer's default 3; Outer's call of Inner without k gets Inner's default 2."""
    model = _function_model(helper.make_node("Outer", ["x"], ["y"], domain=FN), _nested_functions(pass_k))
    got = ReferenceSession(model, prefer="function").run(None, {"x": X3})[0]
    np.testing.assert_array_equal(got, X3 * factor + 1)
    np.testing.assert_array_equal(got, ort.InferenceSession(model.SerializeToString()).run(None, {"x": X3})[0])


def test_spec_default_applies_when_the_spec_runs_the_node() -> None:
    """A model's function may default an attribute otherwise than the op: each path applies its own."""
    offset = helper.make_node("Constant", [], ["off"])
    offset.attribute.append(ref_attr("value_float", "offset", onnx.AttributeProto.FLOAT))
    body = helper.make_function(
        "tests.reference",
        "Cube",
        ["x"],
        ["y"],
        [
            helper.make_node("Mul", ["x", "x"], ["x2"]),
            helper.make_node("Mul", ["x2", "x"], ["x3"]),
            offset,
            helper.make_node("Add", ["x3", "off"], ["y"]),
        ],
        [helper.make_opsetid("", 18)],
        attribute_protos=[helper.make_attribute("offset", 7.0)],
    )
    node = helper.make_node("Cube", ["x"], ["y"], domain="tests.reference")
    model = one_node_model(
        [node], [("x", TensorProto.FLOAT, [3])], [("y", TensorProto.FLOAT, [3])], {"tests.reference": 1}, [body]
    )
    np.testing.assert_array_equal(ReferenceSession(model).run(None, {"x": X3})[0], X3**3)
    np.testing.assert_array_equal(ReferenceSession(model, prefer="function").run(None, {"x": X3})[0], X3**3 + 7)


def test_functions_calling_each_other_in_a_cycle_are_reported() -> None:
    ping = _function("Ping", [_call("Pong", ["u"], ["v"], pass_k=False)], 1.0)
    pong = _function("Pong", [_call("Ping", ["u"], ["v"], pass_k=False)], 1.0)
    model = one_node_model(
        [helper.make_node("Ping", ["x"], ["y"], domain=FN)],
        [("x", TensorProto.FLOAT, [3])],
        [("y", TensorProto.FLOAT, [3])],
        {FN: 1},
        [ping, pong],
    )
    with pytest.raises(opbridge.ModelLoadError) as info:
        ReferenceSession(model, prefer="function")
    assert str(info.value) == (
        "the ONNX reference evaluator cannot load the model: the model's local functions call each other in a "
        f"cycle ({FN}::Ping -> {FN}::Pong -> {FN}::Ping); ONNX functions cannot recurse: remove the call that "
        "closes the cycle."
    )


def test_kernel_with_wrong_output_count_is_reported() -> None:
    cube.register_kernel(lambda x, offset: (x, x), kind="numpy")
    try:
        session = ReferenceSession(_cube_model())
        with pytest.raises(Exception, match=r"tests.reference::Cube .* returned 2 output\(s\) for a node with 1"):
            session.run(None, {"x": np.ones(2, np.float32)})
    finally:
        cube.kernel, cube.kernel_kind = None, None


# --------------------------------------------------------------------------- legacy default domain


@opbridge.kernel("LegacySwishForTests", domain="")
def legacy_swish(x, p, *, alpha=1.0):
    return x / (1.0 + np.exp(-alpha * x))


def test_default_domain_custom_op_is_repaired_on_a_copy(caplog: pytest.LogCaptureFixture) -> None:
    node = helper.make_node("LegacySwishForTests", ["x", "x"], ["y"], alpha=2.0)
    model = one_node_model([node], [("x", TensorProto.FLOAT, [3])], [("y", TensorProto.FLOAT, [3])], {})
    original = model.SerializeToString()
    with caplog.at_level(logging.WARNING, logger="opbridge.reference"):
        session = ReferenceSession(model)
    warnings = [r for r in caplog.records if r.name == "opbridge.reference"]
    assert len(warnings) == 1 and "LegacySwishForTests" in warnings[0].getMessage()
    assert "opbridge.legacy" in warnings[0].getMessage()
    assert model.SerializeToString() == original
    x = np.array([-1.0, 0.0, 2.0], np.float32)
    np.testing.assert_allclose(session.run(None, {"x": x})[0], x / (1 + np.exp(-2 * x)), rtol=1e-6)


@opbridge.kernel("LegacyScaleForTests", domain="", since_version=1)
def _legacy_scale_v1(x):
    return x * np.float32(2)


@opbridge.kernel("LegacyScaleForTests", domain="", since_version=13)
def _legacy_scale_v13(x):
    return x * np.float32(3)


@opbridge.kernel("RMSNormalization", domain="")
def _legacy_rms(x):
    return x * np.float32(0.5)


@pytest.mark.parametrize(
    ("opset", "domain", "factor"),
    [(11, "", 2.0), (17, "", 3.0), (11, "opbridge.legacy", 2.0), (17, "opbridge.legacy", 3.0)],
    ids=["opset11", "opset17", "rewritten-opset11", "rewritten-opset17"],
)
def test_default_domain_kernel_is_the_one_for_the_model_opset(opset: int, domain: str, factor: float) -> None:
    """The kernel registered since version 13 ran at opset 11 too, where ONNX Runtime's bridge ran version
    1's: both sessions take the kernel of the model's opset."""
    x = np.array([1.0, -2.0], np.float32)
    model = legacy_model("LegacyScaleForTests", opset, domain)
    for session in (ReferenceSession(model), opbridge.InferenceSession(model)):
        np.testing.assert_array_equal(session.run(None, {"x": x})[0], x * np.float32(factor))


def test_a_default_domain_kernel_only_for_later_opsets_is_refused_with_the_reason() -> None:
    @opbridge.kernel("LegacyOnlyNewForTests", domain="", since_version=13)
    def only_new(x):
        return x

    with pytest.raises(opbridge.UnknownOpError) as info:
        ReferenceSession(legacy_model("LegacyOnlyNewForTests", 11))
    text = str(info.value)
    assert "<default>::LegacyOnlyNewForTests (opset 11)" in text
    assert "registered only from opset version 13 on" in text and "the model imports opset 11" in text
    assert "since_version=11 or lower" in text


def test_an_onnx_op_name_of_a_later_opset_is_a_custom_op_of_an_older_model() -> None:
    """ONNX has RMSNormalization from opset 23 on: in an opset-11 model it is a legacy custom op."""
    from opbridge.legacy_domain import default_domain_custom_nodes, is_standard_op

    model = legacy_model("RMSNormalization", 11)
    assert [n.op_type for n in default_domain_custom_nodes(model)] == ["RMSNormalization"]
    assert not is_standard_op("RMSNormalization", 11) and is_standard_op("RMSNormalization", 23)
    assert is_standard_op("RMSNormalization") and not default_domain_custom_nodes(legacy_model("RMSNormalization", 23))
    x = np.array([1.0, -2.0], np.float32)
    (y,) = ReferenceSession(model).run(None, {"x": x})
    np.testing.assert_array_equal(y, x * np.float32(0.5))


@pytest.mark.parametrize("since_version", ["13", 0, True, 1.0])
def test_kernel_since_version_is_checked_at_registration(since_version: Any) -> None:
    with pytest.raises(opbridge.OpDefinitionError, match=r"since_version must be an int >= 1.*got"):
        opbridge.kernel("tests.reference.nospec::BadVersion", since_version=since_version)(lambda x: x)
    assert opbridge.find_kernel("tests.reference.nospec", "BadVersion", 17) is None


# --------------------------------------------------------------------------- errors


def test_unknown_ops_are_listed_with_the_fix() -> None:
    nodes = [
        helper.make_node("Mystery", ["x"], ["a"], domain="acme.unknown", name="first_mystery"),
        helper.make_node("Enigma", ["a"], ["y"], domain="other.unknown"),
    ]
    model = one_node_model(
        nodes, [("x", TensorProto.FLOAT, [1])], [("y", TensorProto.FLOAT, [1])], {"acme.unknown": 3, "other.unknown": 1}
    )
    with pytest.raises(opbridge.UnknownOpError) as info:
        ReferenceSession(model)
    text = str(info.value)
    assert "2 custom node(s)" in text
    assert "acme.unknown::Mystery (opset 3), node(s) 'first_mystery'" in text
    assert "other.unknown::Enigma (opset 1), node(s) '<unnamed>'" in text
    assert '@opbridge.op("acme.unknown::Mystery")' in text
    assert '@opbridge.kernel("Mystery", domain="acme.unknown")' in text and "functions=True" in text


def test_corrupt_file_is_a_model_load_error(tmp_path, seed_export) -> None:
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x08\x07\xff\xff\xff this is not protobuf" * 8)
    with pytest.raises(opbridge.ModelLoadError, match=r"garbage.onnx: not a valid ONNX model .*truncated or corrupt"):
        ReferenceSession(garbage)
    truncated = tmp_path / "truncated.onnx"
    data = seed_export("myselu", "dynamo").path.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(opbridge.ModelLoadError, match=r"truncated.onnx: not a (valid|usable) ONNX model"):
        ReferenceSession(truncated)
    with pytest.raises(opbridge.ModelLoadError, match=r"missing.onnx: no such file; give the path of an .onnx model"):
        ReferenceSession(tmp_path / "missing.onnx")
    with pytest.raises(opbridge.ModelLoadError, match="the given bytes are not a valid ONNX model"):
        ReferenceSession(b"\xff\xff\xff\xff")
    with pytest.raises(
        opbridge.ModelLoadError, match="ReferenceSession takes a path, bytes or onnx.ModelProto, got int"
    ):
        ReferenceSession(42)


def test_links_that_lead_nowhere_are_named(tmp_path: Path) -> None:
    """A symbolic link loop was "no such file"; a dangling link did not say it was one."""
    (tmp_path / "loop.onnx").symlink_to("loop.onnx")
    with pytest.raises(opbridge.ModelLoadError, match=r"loop.onnx is a symbolic link that cannot be followed \("):
        ReferenceSession(tmp_path / "loop.onnx")
    (tmp_path / "dangling.onnx").symlink_to("gone.onnx")
    with pytest.raises(opbridge.ModelLoadError, match=r"dangling.onnx is a symbolic link to gone.onnx, which does not"):
        ReferenceSession(tmp_path / "dangling.onnx")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its permissions: nothing is unreadable")
def test_files_this_process_may_not_read_are_named(tmp_path: Path) -> None:
    """An unreadable model was "not a valid ONNX model ... truncated or corrupt. Export it again", an
    unreadable data file "put the model's data files beside it"."""
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        "g",
        [x],
        [x],
        [numpy_helper.from_array(np.ones(4, np.float32), "w")],
    )
    graph.output[0].name = "y"
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, tmp_path / "m.onnx", save_as_external_data=True, location="m.data", size_threshold=0)
    (tmp_path / "m.data").chmod(0)
    with pytest.raises(opbridge.ModelLoadError, match=r"m.data, which this process may not read \(permission denied\)"):
        ReferenceSession(tmp_path / "m.onnx")
    (tmp_path / "m.onnx").chmod(0)
    with pytest.raises(opbridge.ModelLoadError, match=r"m.onnx: cannot read it \(Permission denied\); fix its perm"):
        ReferenceSession(tmp_path / "m.onnx")


def test_bad_feeds_are_reported(seed_export) -> None:
    session = ReferenceSession(seed_export("myselu", "dynamo").path)
    with pytest.raises(ValueError, match=r"missing \['image'\], unknown \['img'\]"):
        session.run(None, {"img": np.zeros((1, 1, 4, 4), np.float32)})
    with pytest.raises(ValueError, match=r"input 'image' expects tensor\(float\) \(numpy float32\), got numpy float64"):
        session.run(None, {"image": np.zeros((1, 1, 4, 4))})
    with pytest.raises(ValueError, match=r"unknown output name\(s\) \['nope'\]"):
        session.run(["nope"], {"image": np.zeros((1, 1, 4, 4), np.float32)})


@pytest.mark.parametrize("session_type", ["InferenceSession", "ReferenceSession"])
def test_an_unknown_output_name_is_one_error_in_both_sessions(seed_export, session_type: str) -> None:
    """InferenceSession passed the names to ONNX Runtime, whose InvalidArgument ("Invalid output name:nope")
    is no ValueError and names none of the model's outputs, where ReferenceSession raised a ValueError."""
    from opbridge.backends.base import InputError

    path = seed_export("myselu", "dynamo").path
    session = getattr(opbridge, session_type)(path)
    outputs = [o.name for o in onnx.load(path, load_external_data=False).graph.output]
    feed = {"image": np.zeros((1, 1, 4, 4), np.float32)}
    with pytest.raises(
        InputError, match=re.escape(f"unknown output name(s) ['nope']; the model's outputs are {outputs}")
    ):
        session.run(["nope"], feed)
    with pytest.raises(InputError, match=re.escape("unknown output name(s) ['nope']")):
        session.run("nope", feed)
    assert session.run(outputs[0], feed)[0].shape == (1, 1, 4, 4)


def _optional_and_overridable() -> onnx.ModelProto:
    """y = x + w (w an initializer a feed may override), h = whether the optional input o has a value."""
    optional = helper.make_optional_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, [2]))
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"]), helper.make_node("OptionalHasElement", ["o"], ["h"])],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3]),
            helper.make_value_info("o", optional),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, [3]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3]),
            helper.make_tensor_value_info("h", TensorProto.BOOL, []),
        ],
        [helper.make_tensor("w", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize(
    "feed",
    [
        {"x": np.ones((2, 3), np.float32), "o": None},
        {"x": np.ones((2, 3), np.float32), "o": np.ones(2, np.float32), "w": np.full(3, 5, np.float32)},
        {"x": np.ones((2, 3), ">f4")},
        {"x": [[1.0, 2.0, 3.0], [4, 5, 6]]},
    ],
    ids=["optional-left-out", "initializer-overridden", "big-endian", "lists"],
)
def test_feeds_onnx_runtime_takes_run(feed: dict[str, Any]) -> None:
    """An optional input left out (or None) is an empty optional, an initializer that is also a graph input
    may be fed, as in ONNX Runtime; the reference refused both. Lists of numbers take the input's element
    type, as ONNX Runtime converts them (the reference refused a list of floats as float64)."""
    model = _optional_and_overridable()
    got = ReferenceSession(model).run(None, feed)
    want = opbridge.InferenceSession(model).run(None, feed)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
        assert g.dtype == w.dtype
    assert ReferenceSession(model).run(["h"], {"x": np.ones((1, 3), np.float32)})[0].item() is False


@pytest.mark.parametrize(
    "feed",
    [
        {"X": np.ones((2, 3), np.float32)},
        {"x": np.ones((2, 3), np.float32), "z": np.ones(1)},
        {"x": np.ones((2, 3))},
        {"x": np.ones((2, 3), np.float32), "w": np.ones(3, np.int64)},
        {"x": np.ones(3, np.float32)},
        {"x": np.ones((2, 4), np.float32)},
        {"x": np.ones((2, 3), np.float32), "o": np.ones(2, np.float16)},
    ],
    ids=["wrong-name", "extra", "dtype", "initializer-dtype", "rank", "fixed-dim", "optional-dtype"],
)
def test_a_bad_feed_gets_the_message_inference_session_gives(feed: dict[str, Any]) -> None:
    model = _optional_and_overridable()
    with pytest.raises(opbridge.OpbridgeError) as ours:
        ReferenceSession(model).run(None, feed)
    with pytest.raises(opbridge.OpbridgeError) as theirs:
        opbridge.InferenceSession(model).run(None, feed)
    assert isinstance(ours.value, ValueError)
    message = str(ours.value)
    assert message.startswith("ReferenceSession.run: input")
    assert message.removeprefix("ReferenceSession.run: ") == str(theirs.value).removeprefix("InferenceSession.run: ")


def test_importing_opbridge_does_not_load_the_evaluator() -> None:
    code = (
        "import sys, opbridge; assert 'onnx.reference' not in sys.modules and 'opbridge.reference' not in sys.modules; "
        "from opbridge.reference import ReferenceSession; assert opbridge.ReferenceSession is ReferenceSession"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_prefer_is_checked(seed_export) -> None:
    with pytest.raises(ValueError, match="prefer must be 'spec' or 'function', got 'body'"):
        ReferenceSession(seed_export("myselu", "dynamo").path, prefer="body")


def test_ops_sharing_a_name_across_domains(tmp_path) -> None:
    """onnx.reference refuses registered schemas that share a name across domains on its first import;
    opbridge's schemas step aside for that import (fresh process: the import happens once)."""
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "same_name.py"
    script.write_text(
        textwrap.dedent(
            """
            import numpy as np, onnx, torch, opbridge
            from onnx import TensorProto, helper

            @opbridge.op("a1::Swish")
            def s1(x: torch.Tensor) -> torch.Tensor:
                return x * torch.sigmoid(x)

            @opbridge.op("a2::Swish")
            def s2(x: torch.Tensor) -> torch.Tensor:
                return x * 2

            @opbridge.op("a3::Resize")
            def s3(x: torch.Tensor) -> torch.Tensor:
                return x + 1

            opbridge.register_onnx_schemas([s1, s2, s3])
            node = helper.make_node("Swish", ["x"], ["y"], domain="a2")
            graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("a2", 1)])
            (y,) = opbridge.ReferenceSession(model).run(None, {"x": np.ones(2, np.float32)})
            assert y.tolist() == [2.0, 2.0], y
            assert onnx.defs.has("Swish", "a1") and onnx.defs.has("Resize", "a3"), "schemas are back"
            print("ok")
            """
        )
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr


def _raises_type_error(x: np.ndarray) -> np.ndarray:
    raise TypeError("x must be float32, got something else")


@pytest.mark.parametrize(
    ("kernel", "message"),
    [
        (_raises_type_error, "raised TypeError: x must be float32"),
        (lambda x: None, "raised TypeError: output 0 is a NoneType, not an array"),
        (
            lambda x: (x + 1).astype(np.float64),
            r".*output 0 \('y'\) has dtype float64, but the node's output type is tensor\(float\); return an array "
            r"of dtype float32",
        ),
        (
            lambda x: (x + 1)[:1],
            r".*output 0 \('output'\) has shape \(1,\), but the op's reference gives \(on meta tensors\) \(2,\)",
        ),
    ],
    ids=["raises-TypeError", "returns-None", "wrong-dtype", "wrong-shape"],
)
def test_kernel_errors_name_the_node(kernel: Any, message: str) -> None:
    """onnx.reference reports a kernel's TypeError as "Issues with types ..." (and made None an object
    array), and took results of any dtype and shape: the session keeps the kernel's own message, checks
    the results as ONNX Runtime's bridge does, and names the node."""
    from onnx import TensorProto, helper

    @opbridge.op("tests.ref::FailingKernel")
    def failing(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    failing.register_kernel(kernel)
    graph = helper.make_graph(
        [helper.make_node("FailingKernel", ["x"], ["y"], domain="tests.ref", name="mynode")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("tests.ref", 1)])
    with pytest.raises((opbridge.OpbridgeError, ValueError), match=rf"node 'mynode'(:| ){message}"):
        opbridge.ReferenceSession(model).run(None, {"x": np.ones(2, np.float32)})


@opbridge.op("tests.reference::AddWeight")
def _add_weight(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x + w


def _add_weight_model() -> onnx.ModelProto:
    node = helper.make_node("AddWeight", ["x", "w"], ["y"], domain="tests.reference", name="add_w")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
        initializer=[onnx.numpy_helper.from_array(np.zeros(3, np.float32), "w")],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("tests.reference", 1)]
    )


def test_weights_and_inputs_are_safe_from_kernels_and_from_the_outputs() -> None:
    """A torch kernel that wrote the model's weight changed every later run; a kernel returning its input
    or a weight handed the caller an output over that memory (the next run saw what the caller wrote)."""
    x = np.ones(3, np.float32)
    _add_weight.register_kernel(lambda x, w: w.add_(x), kind="torch")
    try:
        session = ReferenceSession(_add_weight_model())
        with pytest.raises(
            opbridge.OpbridgeError, match=r"tests.reference::AddWeight node 'add_w' wrote input 1 in place"
        ):
            session.run(None, {"x": x})
        for kind, kernel in (("torch", lambda x, w: w[:]), ("numpy", lambda x, w: w)):
            _add_weight.register_kernel(kernel, kind=kind)
            session = ReferenceSession(_add_weight_model())
            (y,) = session.run(None, {"x": x})
            y += 100  # the caller's output is its own
            assert session.run(None, {"x": x})[0].tolist() == [0.0, 0.0, 0.0], kind
        _add_weight.register_kernel(lambda x, w: x[:], kind="torch")
        (y,) = ReferenceSession(_add_weight_model()).run(None, {"x": x})
        assert not np.shares_memory(y, x)
    finally:
        _add_weight.kernel, _add_weight.kernel_kind = None, None


@opbridge.kernel("tests.reference.nospec::Upper", kind="numpy")
def _upper(x):
    return np.array([s.upper() for s in x.flat], dtype=object).reshape(x.shape)


def test_a_kernel_may_return_strings_as_an_object_array() -> None:
    graph = helper.make_graph(
        [helper.make_node("Upper", ["x"], ["y"], domain="tests.reference.nospec")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.STRING, [2])],
        [helper.make_tensor_value_info("y", TensorProto.STRING, [2])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("tests.reference.nospec", 1)]
    )
    (y,) = ReferenceSession(model).run(None, {"x": np.array(["ab", "cd"], dtype=object)})
    assert y.tolist() == ["AB", "CD"]


@opbridge.op("tests.reference::BfScale", tolerances={"bfloat16": (2e-2, 1e-2)})
def _bf_scale(x: torch.Tensor, s: float = 1.5) -> torch.Tensor:
    return x * s + 1


def test_bfloat16_nodes_run_bit_for_bit() -> None:
    """A custom node on bfloat16 tensors: torch.from_numpy refused ml_dtypes' bfloat16 arrays."""
    import ml_dtypes

    graph = helper.make_graph(
        [helper.make_node("BfScale", ["x"], ["y"], domain="tests.reference", s=0.75)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [4])],
        [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [4])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("tests.reference", 1)]
    )
    x = np.array([1.0, -2.5, 3.25, 1e30], dtype=ml_dtypes.bfloat16)
    (y,) = ReferenceSession(model).run(None, {"x": x})
    want = _bf_scale.reference(torch.tensor([1.0, -2.5, 3.25, 1e30], dtype=torch.bfloat16), s=0.75)
    assert y.dtype == np.dtype(ml_dtypes.bfloat16)
    assert y.view(np.uint16).tolist() == want.view(torch.int16).numpy().view(np.uint16).tolist()
    # a float32 feed for the bfloat16 input was taken as it was (and came out float32)
    with pytest.raises(
        InputError, match=r"input 'x' expects tensor\(bfloat16\).*float32; cast it with \.astype\(ml_dtypes\.bfloat16\)"
    ):
        ReferenceSession(model).run(None, {"x": x.astype(np.float32)})


@opbridge.op("tests.refrt::Fragile")
def _fragile(x: torch.Tensor, k: int = 0) -> torch.Tensor:
    return x + k


@_fragile.register_kernel
def _fragile_kernel(x: np.ndarray, k: int = 0) -> np.ndarray:
    if k < 0:
        raise ValueError("k must not be negative")
    return x + k


@pytest.mark.parametrize(
    ("attrs", "error", "message"),
    [
        (
            {"k": -1},
            ValueError,
            r"tests.refrt::Fragile \(numpy kernel\) node 'f' raised ValueError: k must",
        ),
        ({"k": "one"}, opbridge.ModelLoadError, r"Fragile node 'f': .*attribute 'k' is STRING in the node"),
    ],
    ids=["kernel-raises", "attribute-type"],
)
def test_reference_session_names_the_node_of_a_failing_kernel_or_attribute(
    attrs: dict, error: type, message: str
) -> None:
    """A kernel's exception reached the caller bare ("ValueError: k must not be negative"), an attribute
    of the wrong type without its node; both now name op and node, as the other backends do."""
    node = helper.make_node("Fragile", ["x"], ["y"], domain="tests.refrt", name="f", **attrs)
    model = one_node_model([node], [("x", TensorProto.FLOAT, [2])], [("y", TensorProto.FLOAT, [2])], {"tests.refrt": 1})
    with pytest.raises(error, match=message) as caught:
        ReferenceSession(model).run(None, {"x": np.ones(2, np.float32)})
    assert isinstance(caught.value, opbridge.OpbridgeError)  # (a ValueError still, for except ValueError)


@pytest.mark.parametrize("inside_if", [False, True], ids=["main-graph", "if-branch"])
def test_reference_session_runs_a_loop_without_condition_its_trip_count_times(inside_if: bool) -> None:
    """Loop(M, "", ...) runs M times (ONNX: the condition is optional); onnx.reference ran it zero
    times, so verify blamed the custom ops of models from other tools."""
    vi = helper.make_tensor_value_info
    body = helper.make_graph(
        [helper.make_node("Add", ["y_in", "y_in"], ["y_out"]), helper.make_node("Identity", ["ci"], ["co"])],
        "b",
        [vi("i", TensorProto.INT64, []), vi("ci", TensorProto.BOOL, []), vi("y_in", TensorProto.FLOAT, [3])],
        [vi("co", TensorProto.BOOL, []), vi("y_out", TensorProto.FLOAT, [3])],
    )
    loop = helper.make_node("Loop", ["n", "", "x"], ["out"], body=body)
    if inside_if:
        then = helper.make_graph([loop], "t", [], [vi("out", TensorProto.FLOAT, [3])])
        other = helper.make_graph(
            [helper.make_node("Identity", ["x"], ["x2"])], "e", [], [vi("x2", TensorProto.FLOAT, [3])]
        )
        nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    else:
        nodes = [loop, helper.make_node("Identity", ["out"], ["y"])]
    inputs = [vi("x", TensorProto.FLOAT, [3]), vi("n", TensorProto.INT64, []), vi("c", TensorProto.BOOL, [])]
    model = helper.make_model(
        helper.make_graph(nodes, "m", inputs, [vi("y", TensorProto.FLOAT, [3])]),
        opset_imports=[helper.make_opsetid("", 18)],
    )
    feed = {"x": np.ones(3, np.float32), "n": np.array(3, np.int64), "c": np.array(True)}
    np.testing.assert_array_equal(ReferenceSession(model).run(None, feed)[0], np.full(3, 8.0, np.float32))
    from opbridge.model_io import walk_nodes

    loops = [n for n in walk_nodes(model.graph.node) if n.op_type == "Loop"]  # (the session filled its own copy)
    assert [n.input[1] for n in loops] == [""]
    assert "Constant" not in {n.op_type for n in walk_nodes(model.graph.node)}


def test_a_scalar_input_fed_an_array_is_told_to_take_a_0d_array() -> None:
    """The message said "feed an array of that shape (named dims may take any size)" for a scalar."""
    node = helper.make_node("Neg", ["k"], ["y"])
    model = one_node_model([node], [("k", TensorProto.INT64, [])], [("y", TensorProto.INT64, [])], {})
    with pytest.raises(ValueError, match=r"has shape \(1,\), but the model declares a scalar; feed a 0-d array"):
        ReferenceSession(model).run(None, {"k": np.array([3])})
    assert ReferenceSession(model).run(None, {"k": np.array(3)})[0].tolist() == -3


@pytest.mark.parametrize(
    ("shape", "message"),
    [((1, 3), r"input 'x' has shape \(1, 3\), but the model declares 2x3"), ((2, 3, 1), r"declares 2x3")],
    ids=["fixed-dim", "rank"],
)
def test_reference_session_refuses_a_feed_of_another_fixed_shape(shape: tuple[int, ...], message: str) -> None:
    """A (1, 3) feed into a [2, 3] input ran and returned (1, 3); ONNX Runtime refuses it, and so does
    the session with the same interface now. Named dims take any size."""
    node = helper.make_node("Relu", ["x"], ["y"])
    model = one_node_model([node], [("x", TensorProto.FLOAT, [2, 3])], [("y", TensorProto.FLOAT, [2, 3])], {})
    with pytest.raises(ValueError, match=message):
        ReferenceSession(model).run(None, {"x": np.ones(shape, np.float32)})
    named = one_node_model([node], [("x", TensorProto.FLOAT, ["n", 3])], [("y", TensorProto.FLOAT, ["n", 3])], {})
    assert ReferenceSession(named).run(None, {"x": np.ones((5, 3), np.float32)})[0].shape == (5, 3)


def _resize_model(op: str, opset: int, mode: str, scales: list[float]) -> onnx.ModelProto:
    """One Upsample or Resize node on a 1x2x3x4 input; Upsample before opset 9 takes scales as an attribute."""
    vi = helper.make_tensor_value_info
    attrs: dict[str, Any] = {"mode": mode}
    inputs, weights = ["x"], []
    if op == "Upsample" and opset < 9:
        attrs["scales"] = scales
    else:
        inputs.append("scales")
        weights.append(onnx.numpy_helper.from_array(np.array(scales, np.float32), "scales"))
    graph = helper.make_graph(
        [helper.make_node(op, inputs, ["y"], name="resize", **attrs)],
        "g",
        [vi("x", TensorProto.FLOAT, [1, 2, 3, 4])],
        [vi("y", TensorProto.FLOAT, None)],
        initializer=weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    return model


@pytest.mark.parametrize(("mode", "atol"), [("nearest", 0.0), ("linear", 1e-6), ("cubic", 2e-5)])
@pytest.mark.parametrize(
    ("op", "opset", "scales"),
    [
        ("Upsample", 7, [1.0, 1.0, 2.5, 1.5]),
        ("Upsample", 9, [1.0, 1.0, 2.0, 3.0]),
        ("Upsample", 9, [1.0, 1.0, 1.7, 2.2]),
        ("Resize", 10, [1.0, 1.0, 2.5, 1.5]),
        ("Resize", 10, [1.0, 1.0, 0.6, 0.8]),
        ("Resize", 10, [1.0, 1.0, 1.2, 1.1]),  # (the output keeps the input's shape)
    ],
    ids=["upsample7", "upsample9-whole", "upsample9", "resize10", "resize10-shrink", "resize10-same-shape"],
)
def test_reference_session_runs_old_resize_ops_as_onnxruntime(
    op: str, opset: int, scales: list, mode: str, atol: float
) -> None:
    """onnx.reference's Upsample took only whole nearest scales (and no scales attribute, Upsample-7's) and its
    Resize read Resize-10's scales as roi ("output_size is None and scale_factors is None"); the session runs
    them as ONNX Runtime does (cubic included, which ONNX Runtime runs beyond these opsets' two modes)."""
    model = _resize_model(op, opset, mode, scales)
    x = np.random.default_rng(3).standard_normal((1, 2, 3, 4)).astype(np.float32)
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    (got,) = ReferenceSession(model).run(None, {"x": x})
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=0, atol=atol)


@pytest.mark.parametrize(
    ("op", "opset", "mode", "message"),
    [
        ("Upsample", 10, "nearest", r"Upsample node 'resize' \(opset 10\): ONNX Runtime runs Upsample at opsets 7-9"),
        ("Resize", 10, "area", r"Resize node 'resize' \(opset 10\): mode 'area' is not one this opset defines"),
    ],
    ids=["deprecated-upsample", "resize10-unknown-mode"],
)
def test_reference_session_refuses_old_resize_nodes_onnxruntime_refuses(
    op: str, opset: int, mode: str, message: str
) -> None:
    model = _resize_model(op, opset, mode, [1.0, 1.0, 2.0, 2.0])
    with pytest.raises(Exception):  # noqa: B017  (each an error of ONNX Runtime's own)
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with pytest.raises(opbridge.ModelLoadError, match=message):
        ReferenceSession(model)


def test_reference_session_refuses_a_function_body_domain_the_function_does_not_import() -> None:
    """A body calling a custom op whose domain its function does not import: ONNX Runtime refuses the
    model ("No opset registered for domain"), and the session names the function and the import to add."""
    inner = helper.make_node("Cube", ["x"], ["y"], domain="tests.reference", name="inner")
    body = helper.make_function("tests.wrap", "Wrap", ["x"], ["y"], [inner], [helper.make_opsetid("", 18)])
    node = helper.make_node("Wrap", ["x"], ["y"], domain="tests.wrap", name="outer")
    model = one_node_model(
        [node],
        [("x", TensorProto.FLOAT, [2])],
        [("y", TensorProto.FLOAT, [2])],
        {"tests.wrap": 1, "tests.reference": 1},
        functions=[body],
    )
    message = (
        r"domain 'tests.reference' is used by node\(s\) 'inner' \(Cube\) but function tests.wrap::Wrap has no "
        r"opset import for it \(add opset_import \{domain: 'tests.reference', version: 1\} to function tests.wrap::Wrap\)"
    )
    with pytest.raises(opbridge.ModelLoadError, match=message):
        ReferenceSession(model)
    body.opset_import.append(helper.make_opsetid("tests.reference", 1))
    model.functions[0].CopyFrom(body)
    out = ReferenceSession(model).run(None, {"x": np.array([2.0, -1.0], np.float32)})[0]
    np.testing.assert_allclose(out, np.array([8.0, -1.0], np.float32), rtol=0, atol=0)


def _flatten_model(axis: int, rank: int) -> onnx.ModelProto:
    return one_node_model(
        [helper.make_node("Flatten", ["x"], ["y"], axis=axis, name="flat")],
        [("x", TensorProto.FLOAT, [None] * rank)],
        [("y", TensorProto.FLOAT, None)],
        {},
    )


@pytest.mark.parametrize(
    ("shape", "axis"),
    [((0, 16, 7, 7), 1), ((3, 0, 5), 2), ((3, 0, 5), -1), ((3, 0, 5), 3), ((0,), 1), ((3, 0, 5), 1), ((2, 3, 4), -2)],
)
def test_reference_session_flattens_zero_size_inputs_as_onnxruntime(shape: tuple[int, ...], axis: int) -> None:
    """onnx.reference's Flatten reshaped to (n, -1), which numpy cannot resolve where n is 0 ("cannot
    reshape array of size 0 into shape (0,newaxis)": a Flatten after MultiLevelRoiAlign with no RoIs);
    ONNX Runtime flattens (0, 16, 7, 7) to (0, 784)."""
    model = _flatten_model(axis, len(shape))
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    (got,) = ReferenceSession(model).run(None, {"x": x})
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_reference_session_names_the_standard_node_the_evaluator_fails_in() -> None:
    """A Reshape of a size-0 tensor to (0, -1), which ONNX Runtime refuses too: the evaluator's numpy
    error is named by op and node, and stays a ValueError."""
    model = one_node_model(
        [helper.make_node("Reshape", ["x", "s"], ["y"], name="to_rows")],
        [("x", TensorProto.FLOAT, [None, 16, 7, 7]), ("s", TensorProto.INT64, [2])],
        [("y", TensorProto.FLOAT, None)],
        {},
    )
    feed = {"x": np.zeros((0, 16, 7, 7), np.float32), "s": np.array([0, -1], np.int64)}
    with pytest.raises(Exception):  # noqa: B017  (an error of ONNX Runtime's own)
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
    with pytest.raises(opbridge.OpbridgeError, match=r"ai\.onnx::Reshape node 'to_rows' raised ValueError") as caught:
        ReferenceSession(model).run(None, feed)
    assert isinstance(caught.value, ValueError)


@opbridge.op("tests.reference::BigEndian")
def _big_endian(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def test_a_kernel_result_of_another_byte_order_is_returned_in_native_order() -> None:
    """A numpy kernel returning a >f4 array: the session returned it as it was, while ONNX Runtime's bridge
    gives the values in native byte order; both now return float32."""
    _big_endian.register_kernel(lambda x: (x * 2).astype(np.dtype(">f4")))
    model = one_node_model(
        [helper.make_node("BigEndian", ["x"], ["y"], domain="tests.reference", name="swap")],
        [("x", TensorProto.FLOAT, [2, 3])],
        [("y", TensorProto.FLOAT, [2, 3])],
        {"tests.reference": 1},
    )
    x = np.random.default_rng(5).standard_normal((2, 3)).astype(np.float32)
    (got,) = ReferenceSession(model).run(None, {"x": x})
    assert got.dtype == np.dtype(np.float32) and got.dtype.isnative
    np.testing.assert_array_equal(got, x * 2)


def test_reference_session_refuses_a_proto_without_outputs() -> None:
    """The run returned [] for a model with no graph outputs; a file of it was refused at load."""
    model = one_node_model([], [("x", TensorProto.FLOAT, [2])], [], {})
    with pytest.raises(opbridge.ModelLoadError, match=r"the given ModelProto: the model's graph has no outputs"):
        ReferenceSession(model)
    with pytest.raises(opbridge.ModelLoadError, match=r"the given ModelProto: not a usable ONNX model"):
        ReferenceSession(onnx.ModelProto())


def test_a_kernel_result_of_another_dtype_than_a_bfloat16_output_names_ml_dtypes() -> None:
    """numpy has no bfloat16: the fix named result.astype(np.bfloat16), which fails."""
    from onnx import TensorProto, helper

    @opbridge.kernel("HalfWidth", domain="tests.ref.bf16")
    def _half_width(x: np.ndarray) -> np.ndarray:
        return x.astype(np.float32)

    graph = helper.make_graph(
        [helper.make_node("HalfWidth", ["x"], ["y"], domain="tests.ref.bf16", name="hw")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [2])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("tests.ref.bf16", 1)]
    )
    with pytest.raises(opbridge.OpbridgeError, match=r"e\.g\. result\.astype\(ml_dtypes\.bfloat16\)"):
        ReferenceSession(model).run(None, {"x": np.ones(2, np.float32)})


@opbridge.op("tests.reference.names::Shifted")
def _shifted(
    x: torch.Tensor, run: float = 0.0, output: int = 1, domain: str = "a", onnx_node: float = 0.0
) -> torch.Tensor:
    return x * output + run + len(domain) + onnx_node


@pytest.mark.parametrize("ref", [False, True], ids=["direct", "in_function"])
def test_attributes_named_like_the_evaluators_own_members_reach_the_op(ref: bool) -> None:
    """The evaluator stores a node's attributes on its op object: an attribute named ``run`` replaced the
    method that runs the node, and ``output``, ``domain`` or ``onnx_node`` the evaluator's own fields."""
    attrs = {"run": 0.5, "output": 3, "domain": "abcd", "onnx_node": 0.25}
    given = [helper.make_attribute(name, value) for name, value in attrs.items()]
    node = helper.make_node("Shifted", ["x"], ["y"], domain="tests.reference.names")
    functions = []
    domains = {"tests.reference.names": 1}
    if ref:
        types = {"run": onnx.AttributeProto.FLOAT, "output": onnx.AttributeProto.INT}
        types.update(domain=onnx.AttributeProto.STRING, onnx_node=onnx.AttributeProto.FLOAT)
        node.attribute.extend(ref_attr(name, name, kind) for name, kind in types.items())
        body = helper.make_function(
            "tests.reference.fn",
            "Wrap",
            ["x"],
            ["y"],
            [node],
            [helper.make_opsetid("tests.reference.names", 1)],
            attributes=list(types),
        )
        node, functions = helper.make_node("Wrap", ["x"], ["y"], domain="tests.reference.fn"), [body]
        domains["tests.reference.fn"] = 1
    node.attribute.extend(given)
    model = one_node_model([node], [("x", TensorProto.FLOAT, [2])], [("y", TensorProto.FLOAT, [2])], domains, functions)
    x = np.array([1.0, -2.0], np.float32)
    (y,) = ReferenceSession(model).run(None, {"x": x})
    np.testing.assert_array_equal(y, x * 3 + 0.5 + 4 + 0.25)
    np.testing.assert_array_equal(opbridge.InferenceSession(model).run(None, {"x": x})[0], y)


@opbridge.op("tests.reference.leaky::Leaky")
def _leaky(x: torch.Tensor, alpha: float = 0.5) -> torch.Tensor:
    return torch.nn.functional.leaky_relu(x, alpha)


@_leaky.register_function
def _leaky_body(spec: Any, opset: int) -> onnx.FunctionProto:
    from opbridge.functions import make_body

    node = helper.make_node("LeakyRelu", ["x"], ["output"])
    node.attribute.append(ref_attr("alpha", "alpha", onnx.AttributeProto.FLOAT))
    return make_body(spec, [node], opset)


def test_a_body_whose_unary_op_takes_an_attribute_by_reference_runs() -> None:
    """onnx.reference hands a referenced attribute to the body's node as ``linked_attributes``, which its
    unary and binary ops (LeakyRelu, Elu, Mod) do not take: the README's LeakyRelu(alpha <- @alpha) body
    failed with a TypeError under prefer="function". Each set of values now runs a copy that holds them."""
    from opbridge.functions import attach_functions

    graph = helper.make_graph(
        [
            helper.make_node("Leaky", ["x"], ["y"], domain="tests.reference.leaky", alpha=0.25),
            helper.make_node("Leaky", ["x"], ["z"], domain="tests.reference.leaky"),  # (the default, 0.5)
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("y", "z")],
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("tests.reference.leaky", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    attach_functions(model, [_leaky])
    x = np.array([-2.0, 2.0], np.float32)
    session = ReferenceSession(model, prefer="function")
    assert session.implementations[("tests.reference.leaky", "Leaky")] == "function"
    for _ in range(2):  # (the second run takes the copies made by the first)
        y, z = session.run(None, {"x": x})
        np.testing.assert_array_equal(y, [-0.5, 2.0])
        np.testing.assert_array_equal(z, [-1.0, 2.0])


def test_a_reference_a_call_leaves_out_takes_the_callees_default() -> None:
    """Outer(k) calls Inner with k <- @k; a call of Outer without k leaves Inner's k out, so Inner's default
    (2) applies, as in ONNX Runtime. The evaluator got "linked attributes but None are given"."""
    kk = helper.make_node("Constant", [], ["kk"])
    kk.attribute.append(ref_attr("value_float", "k", onnx.AttributeProto.FLOAT))
    inner = _function("Inner", [kk, helper.make_node("Mul", ["u", "kk"], ["v"])], 2.0)
    one = helper.make_node("Constant", [], ["one"], value_float=1.0)
    outer = _function(
        "Outer", [_call("Inner", ["u"], ["t"], True), one, helper.make_node("Add", ["t", "one"], ["v"])], None
    )
    for given, factor in (({}, 2.0), ({"k": 5.0}, 5.0)):
        model = _function_model(helper.make_node("Outer", ["x"], ["y"], domain=FN, **given), [outer, inner])
        got = ReferenceSession(model, prefer="function").run(None, {"x": X3})[0]
        np.testing.assert_array_equal(got, X3 * factor + 1)
        np.testing.assert_array_equal(got, ort.InferenceSession(model.SerializeToString()).run(None, {"x": X3})[0])


@opbridge.kernel("tests.reference.wide::Widen")
def _widen(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64)  # (another dtype than the node's float output)


def test_a_kernel_of_another_dtype_inside_a_function_body_is_refused() -> None:
    """A kernel's result is checked against the type the model gives its node's output; inside a function
    body the model gives none, and a float64 result came out as the model's float32 output unchecked."""
    body = helper.make_function(
        "q",
        "F",
        ["x"],
        ["y"],
        [helper.make_node("Widen", ["x"], ["y"], domain="tests.reference.wide")],
        [helper.make_opsetid("", 18), helper.make_opsetid("tests.reference.wide", 1)],
    )
    graph = helper.make_graph(
        [helper.make_node("F", ["x"], ["y"], domain="q")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("q", 1), helper.make_opsetid("tests.reference.wide", 1)]
    session = ReferenceSession(helper.make_model(graph, opset_imports=opsets, functions=[body]))
    with pytest.raises(
        opbridge.KernelResultError, match=r"output 'y' came out float64, but the model declares it float32"
    ):
        session.run(None, {"x": np.ones(2, np.float32)})


def test_the_default_domain_spelt_ai_onnx_runs() -> None:
    """A model importing ONNX as "ai.onnx" (the checker and ONNX Runtime take it as "") was refused by the
    evaluator: "Domain '' (node type: 'Relu') is not specified. Known opsets: {'ai.onnx': 13}"."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("ai.onnx", 13)])
    onnx.checker.check_model(model, full_check=True)
    (y,) = ReferenceSession(model).run(None, {"x": np.array([-1.0, 2.0], np.float32)})
    np.testing.assert_array_equal(y, [0.0, -2.0])


def test_a_kernel_registered_after_the_session_runs_in_later_sessions_only() -> None:
    """ReferenceSession read the op's kernel at every run: one registered after the session was made ran
    there, unchecked (its result check was made when there was none) and under the old name in
    ``implementations``; ONNX Runtime's session keeps what it bound."""
    from onnx import TensorProto, helper

    @opbridge.op("tests.reference.late::Negate")
    def negate(x: torch.Tensor) -> torch.Tensor:
        return -x

    graph = helper.make_graph(
        [helper.make_node("Negate", ["x"], ["y"], domain="tests.reference.late")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("tests.reference.late", 1)]
    )
    x = np.ones((2, 3), np.float32)
    session = ReferenceSession(model)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], -x)
    negate.register_kernel(lambda x: (x * -1000).reshape(-1))  # (a wrong shape too)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], -x)
    assert session.implementations == {("tests.reference.late", "Negate"): "PyTorch reference"}
    with pytest.raises(opbridge.KernelResultError, match=r"has shape \(6,\), but the op's reference gives"):
        ReferenceSession(model).run(None, {"x": x})


def test_graphs_no_runtime_runs_are_refused_at_load() -> None:
    """A value two nodes write ran (the last writer won: verify then reported a mismatch, exit 1, where ONNX
    Runtime refuses the model); a cycle failed mid-run in the evaluator's words; an element type ONNX does
    not define raised "Enum DataType has no name"."""
    from onnx import TensorProto, helper

    def model(nodes: list, inputs: int = 1) -> onnx.ModelProto:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
        graph = helper.make_graph(
            nodes, "g", [x] * inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    relu = helper.make_node("Relu", ["x"], ["y"], name="a")
    cases = {
        "node 'b' (Neg) writes 'y', which node 'a' makes too": model(
            [relu, helper.make_node("Neg", ["x"], ["y"], name="b")]
        ),
        "node 'a' (Add) reads 'c', which a later node makes": model(
            [
                helper.make_node("Add", ["x", "c"], ["t"], name="a"),
                helper.make_node("Relu", ["t"], ["c"], name="b"),
                helper.make_node("Relu", ["t"], ["y"], name="o"),
            ]
        ),
        "the model has two graph inputs named 'x'": model([relu], inputs=2),
    }
    odd = model([relu])
    odd.graph.input[0].type.tensor_type.elem_type = 999
    cases["'x' has element type 999, which ONNX does not define"] = odd
    for message, case in cases.items():
        with pytest.raises(opbridge.ModelLoadError, match=re.escape(f"ReferenceSession: {message}")):
            ReferenceSession(case)
