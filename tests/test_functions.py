"""Function bodies: the built-in ops' decompositions, DynamicResize parity with PyTorch, user bodies."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from conftest import EXPORTERS, SEED_IDS, SEED_TOLERANCE, SHAPE_IDS, seed_by_name
from conftest import seed_case as shared_seed_case
from onnx import TensorProto, helper
from onnxscript import opset18 as op
from onnxscript import script

import opbridge
from opbridge.functions import function_proto, make_body, ref_attr
from opbridge.ops import DynamicResize
from opbridge.reference import ReferenceSession

TOLERANCE = SEED_TOLERANCE


def seed_case(name: str, which: int) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    return shared_seed_case(name, which, seed=100)


def eager(model: torch.nn.Module, inputs: list[torch.Tensor]) -> np.ndarray:
    with torch.no_grad():
        return model(*inputs).numpy()


def ort_session(model: onnx.ModelProto | str) -> ort.InferenceSession:
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"])


# --------------------------------------------------------------------------- seed models


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", SEED_IDS)
def test_seed_export_carries_bodies(seed_export, name: str, exporter: str) -> None:
    result = seed_export(name, exporter)
    model = result.model
    functions = {(f.domain, f.name): f for f in model.functions}
    custom = {(n.domain, n.op_type) for n in result.custom_nodes}
    assert custom and custom <= set(functions)
    default_opset = next(o.version for o in model.opset_import if o.domain == "")
    assert default_opset == (17 if exporter == "torchscript" else 20)
    for domain, name_ in custom:
        fn, spec = functions[domain, name_], opbridge.find_op(domain, name_).spec
        assert list(fn.input) == [p.name for p in spec.inputs]
        assert list(fn.output) == [o.name for o in spec.outputs]
        assert list(fn.attribute) == [a.name for a in spec.attributes]
        assert [(o.domain, o.version) for o in fn.opset_import] == [("", default_opset)]
        assert all(n.domain == "" for n in fn.node)
    onnx.checker.check_model(str(result.path), full_check=True)


def test_dynamic_resize_body_structure(seed_export) -> None:
    fn = next(f for f in seed_export("super_resolution", "dynamo").model.functions if f.name == "DynamicTRTResize")
    assert fn.domain == "Test"
    assert [n.op_type for n in fn.node] == ["Shape", "Shape", "Concat", "Constant", "Cast", "If"]
    assert [n.op_type for n in function_proto(DynamicResize, 11).node].count("EyeLike") == 1
    constant = fn.node[3].attribute[0]
    assert (constant.name, constant.ref_attr_name) == ("value_int", "align_corners")
    branches = {a.name: a.g for a in fn.node[5].attribute}
    modes = {k: {a.name: helper.get_attribute_value(a) for a in g.node[0].attribute} for k, g in branches.items()}
    assert modes["then_branch"]["coordinate_transformation_mode"] == b"align_corners"
    assert modes["else_branch"]["coordinate_transformation_mode"] == b"half_pixel"
    for attrs in modes.values():
        assert attrs["mode"] == b"cubic" and attrs["cubic_coeff_a"] == pytest.approx(-0.75)
        assert attrs["exclude_outside"] == 0


@pytest.mark.parametrize("which", [0, 1, 2], ids=SHAPE_IDS)
@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", SEED_IDS)
def test_seed_bodies_match_eager(seed_export, name: str, exporter: str, which: int) -> None:
    """Plain ONNX Runtime (no registration) and the reference evaluator run the bodies."""
    result = seed_export(name, exporter)
    model, inputs = seed_case(name, which)
    expected = eager(model, inputs)
    feed = {n: t.numpy() for n, t in zip(seed_by_name(name).input_names, inputs)}
    rtol, atol = TOLERANCE.get(name, (1e-3, 1e-5))
    got_ort = ort_session(str(result.path)).run(None, feed)[0]
    np.testing.assert_allclose(got_ort, expected, rtol=rtol, atol=atol)
    session = ReferenceSession(result.path, prefer="function")
    assert set(session.implementations.values()) == {"function"}
    np.testing.assert_allclose(session.run(None, feed)[0], expected, rtol=rtol, atol=atol)


# --------------------------------------------------------------------------- DynamicResize parity


def resize_model(opset: int, align_corners: bool, mode: str | None = None, **resize_attrs: int) -> onnx.ModelProto:
    """One Test::DynamicTRTResize node with its body, or (``mode``) one plain cubic Resize for comparison."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "C", "H", "W"])
    s = helper.make_tensor_value_info("s", TensorProto.FLOAT, ["N", 1, "h", "w"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "C", "h", "w"])
    if mode is None:
        nodes = [
            helper.make_node("DynamicTRTResize", ["x", "s"], ["y"], domain="Test", align_corners=int(align_corners))
        ]
        functions = [function_proto(DynamicResize, opset)]
    else:
        nodes = [
            helper.make_node("Shape", ["x"], ["nc"], start=0, end=2),
            helper.make_node("Shape", ["s"], ["hw"], start=-2),
            helper.make_node("Concat", ["nc", "hw"], ["sizes"], axis=0),
            helper.make_node(
                "Resize",
                ["x", "", "", "sizes"],
                ["y"],
                mode="cubic",
                cubic_coeff_a=-0.75,
                coordinate_transformation_mode=mode,
                **resize_attrs,
            ),
        ]
        functions = []
    graph = helper.make_graph(nodes, "resize", [x, s], [y])
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("Test", 1)], functions=functions
    )
    model.ir_version = 8
    opbridge.register_onnx_schemas([DynamicResize])
    onnx.checker.check_model(model, full_check=True)
    return model


def torch_bicubic(x: np.ndarray, size: tuple[int, int], align_corners: bool, antialias: bool = False) -> np.ndarray:
    return F.interpolate(
        torch.from_numpy(x), size=size, mode="bicubic", align_corners=align_corners, antialias=antialias
    ).numpy()


RESIZE_CASES = {
    "up_x2": ((16, 16), (32, 32)),
    "up_odd": ((7, 5), (19, 12)),
    "down_x2": ((16, 16), (8, 8)),
    "down_x12": ((64, 48), (5, 4)),
    "down_uneven": ((17, 13), (9, 12)),
    "mixed": ((17, 13), (40, 9)),
    "same_size": ((6, 6), (6, 6)),
    "out_1x1": ((16, 16), (1, 1)),
    "out_1_row": ((16, 16), (1, 8)),
    "in_1x1": ((1, 1), (4, 3)),
    "tiny": ((2, 3), (5, 7)),
}


@pytest.mark.parametrize("case", list(RESIZE_CASES))
@pytest.mark.parametrize("align_corners", [False, True], ids=["half_pixel", "align_corners"])
@pytest.mark.parametrize("opset", [11, 13, 17, 20])
def test_dynamic_resize_body_matches_torch(opset: int, align_corners: bool, case: str) -> None:
    (H, W), (h, w) = RESIZE_CASES[case]
    x = np.random.default_rng(7).standard_normal((2, 3, H, W)).astype(np.float32)
    s = np.zeros((2, 1, h, w), np.float32)
    expected = torch_bicubic(x, (h, w), align_corners)
    reference = DynamicResize.run_reference(torch.from_numpy(x), torch.from_numpy(s), align_corners=align_corners)
    np.testing.assert_array_equal(reference.numpy(), expected)
    model = resize_model(opset, align_corners)
    got = ort_session(model).run(None, {"x": x, "s": s})[0]
    assert got.shape == (2, 3, h, w)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=2e-5)
    got_ref = ReferenceSession(model, prefer="function").run(None, {"x": x, "s": s})[0]
    np.testing.assert_allclose(got_ref, expected, rtol=1e-4, atol=2e-5)


class _AlignedResize(torch.nn.Module):
    def forward(self, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return DynamicResize(x, s, align_corners=True)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_align_corners_attribute_reaches_the_body(tmp_path, exporter: str) -> None:
    """align_corners=True set in PyTorch selects the align_corners branch after export."""
    x, s = torch.rand(1, 2, 6, 6), torch.rand(1, 1, 11, 9)
    dims = {"x": {2: "H", 3: "W"}, "s": {2: "h", 3: "w"}}
    extra = (
        {"dynamic_axes": {**dims, "y": {2: "h", 3: "w"}}}
        if exporter == "torchscript"
        else {
            "dynamic_shapes": (
                {2: torch.export.Dim("H"), 3: torch.export.Dim("W")},
                {2: torch.export.Dim("h"), 3: torch.export.Dim("w")},
            )
        }
    )
    result = opbridge.export(
        _AlignedResize(),
        (x, s),
        tmp_path / "aligned.onnx",
        exporter=exporter,
        input_names=["x", "s"],
        output_names=["y"],
        **extra,
    )
    (node,) = result.custom_nodes
    assert helper.get_attribute_value(node.attribute[0]) == 1
    sess = ort_session(str(result.path))
    for (H, W), (h, w) in [((6, 6), (11, 9)), ((12, 10), (5, 3))]:
        xi = np.random.default_rng(H).random((1, 2, H, W), dtype=np.float32)
        si = np.zeros((1, 1, h, w), np.float32)
        np.testing.assert_allclose(
            sess.run(None, {"x": xi, "s": si})[0], torch_bicubic(xi, (h, w), True), rtol=1e-4, atol=1e-5
        )


# --------------------------------------------------------------------------- documented differences


def _run(model: onnx.ModelProto, x: np.ndarray, size: tuple[int, int], dtype: type = np.float32) -> np.ndarray:
    return ort_session(model).run(None, {"x": x, "s": np.zeros((1, 1, *size), dtype)})[0]


def test_pytorch_half_pixel_differs_from_torch_only_for_output_length_one() -> None:
    """ONNX's pytorch_half_pixel maps an output dim of length 1 to 0; PyTorch takes the centre."""
    x = np.random.default_rng(3).standard_normal((1, 2, 16, 16)).astype(np.float32)
    php, hp = resize_model(20, False, "pytorch_half_pixel"), resize_model(20, False, "half_pixel")
    for size in [(1, 1), (1, 8)]:
        expected = torch_bicubic(x, size, False)
        assert np.abs(_run(php, x, size) - expected).max() > 0.1
        np.testing.assert_allclose(_run(hp, x, size), expected, rtol=1e-4, atol=1e-5)
    for size in [(32, 32), (5, 7), (2, 2)]:
        np.testing.assert_allclose(_run(php, x, size), _run(hp, x, size), rtol=0, atol=1e-6)


def _inside(in_len: int, out_len: int) -> np.ndarray:
    """Output positions whose four cubic taps all fall inside the input (half_pixel mapping)."""
    src = (np.arange(out_len) + 0.5) * in_len / out_len - 0.5
    base = np.floor(src)
    return (base - 1 >= 0) & (base + 2 <= in_len - 1)


@pytest.mark.parametrize("size", [(32, 24), (9, 13)], ids=["up", "down"])
def test_exclude_outside_differs_from_torch_at_borders(size: tuple[int, int]) -> None:
    """PyTorch clamps taps to the edge (exclude_outside=0); exclude_outside=1 differs near borders only."""
    x = np.random.default_rng(4).standard_normal((1, 2, 16, 12)).astype(np.float32)
    expected = torch_bicubic(x, size, False)
    got = _run(resize_model(20, False, "half_pixel", exclude_outside=1), x, size)
    assert np.abs(got - expected).max() > 1e-2
    rows, cols = _inside(16, size[0]), _inside(12, size[1])
    assert rows.any() and cols.any()
    np.testing.assert_allclose(got[..., rows, :][..., cols], expected[..., rows, :][..., cols], rtol=1e-4, atol=1e-5)


def test_antialias_is_not_torchs_antialias() -> None:
    """Downsampling matches torch only without antialiasing; ONNX's antialias=1 is not torch's antialias=True."""
    x = np.random.default_rng(5).standard_normal((1, 2, 32, 32)).astype(np.float32)
    size = (9, 13)
    np.testing.assert_allclose(
        _run(resize_model(20, False, "half_pixel"), x, size), torch_bicubic(x, size, False), rtol=1e-4, atol=2e-5
    )
    aa = _run(resize_model(20, False, "half_pixel", antialias=1), x, size)
    assert np.abs(aa - torch_bicubic(x, size, False)).max() > 0.5
    assert np.abs(aa - torch_bicubic(x, size, False, antialias=True)).max() > 1e-2


def test_onnxruntime_has_no_double_cubic_resize() -> None:
    """PyTorch resizes float64; ONNX Runtime's CPU Resize has no float64 kernel, so the body cannot run it."""
    model = resize_model(20, False)
    for value in (*model.graph.input, *model.graph.output):
        value.type.tensor_type.elem_type = TensorProto.DOUBLE
    x = np.random.default_rng(6).random((1, 1, 4, 4))
    assert torch_bicubic(x, (8, 8), False).dtype == np.float64
    with pytest.raises(Exception, match="Could not find an implementation for Resize"):
        ort_session(model)


def test_float16_body_matches_torch_within_fp16_tolerance() -> None:
    model = resize_model(20, False)
    for value in (*model.graph.input, *model.graph.output):
        value.type.tensor_type.elem_type = TensorProto.FLOAT16
    x = np.random.default_rng(8).random((1, 2, 8, 8)).astype(np.float16)
    got = _run(model, x, (13, 5), np.float16)
    assert got.dtype == np.float16
    np.testing.assert_allclose(
        got.astype(np.float32), torch_bicubic(x.astype(np.float32), (13, 5), False), rtol=1e-2, atol=2e-3
    )


# --------------------------------------------------------------------------- bad bodies


@opbridge.op("tests.functions::Pair")
def pair(a: torch.Tensor, b: torch.Tensor, gain: float = 1.0) -> torch.Tensor:
    """a + b."""
    return a + b


def _body(nodes: list[onnx.NodeProto], inputs: list[str], outputs: list[str], attributes: list[str], opset: int = 18):
    return helper.make_function(
        "x", "y", inputs, outputs, nodes, [helper.make_opsetid("", opset)], attributes=attributes
    )


BAD_BODIES = {
    "too_few_inputs": (
        lambda spec: _body([helper.make_node("Identity", ["a"], ["output"])], ["a"], ["output"], []),
        "tests.functions::Pair: function body has 1 input(s) / 1 output(s), the op declares 2 / 1.",
    ),
    "too_many_outputs": (
        lambda spec: _body(
            [helper.make_node("Add", ["a", "b"], ["output"]), helper.make_node("Identity", ["a"], ["extra"])],
            ["a", "b"],
            ["output", "extra"],
            [],
        ),
        "tests.functions::Pair: function body has 2 input(s) / 2 output(s), the op declares 2 / 1.",
    ),
    "undeclared_attribute": (
        lambda spec: _body([helper.make_node("Add", ["a", "b"], ["output"])], ["a", "b"], ["output"], ["gain", "bias"]),
        "tests.functions::Pair: function body uses attribute(s) ['bias'] the op does not declare.",
    ),
    "undeclared_reference": (
        lambda spec: _body(
            [_constant_ref("bias"), helper.make_node("Add", ["a", "b"], ["output"])], ["a", "b"], ["output"], ["gain"]
        ),
        "refers to attribute 'bias', which the op does not declare",
    ),
    "not_a_function": (lambda spec: {"nodes": []}, "tests.functions::Pair: the registered function body gave dict"),
    "opset_mismatch": (
        lambda spec: _body(
            [helper.make_node("Add", ["a", "b"], ["ab"]), helper.make_node("ReduceSum", ["ab"], ["output"], axes=[0])],
            ["a", "b"],
            ["output"],
            ["gain"],
            opset=12,
        ),
        (
            "the function body is written for ONNX opset 12, but the model uses opset 17, and ReduceSum is defined "
            "differently there (version 11 vs 13)"
        ),
    ),
}


def _constant_ref(attr: str) -> onnx.NodeProto:
    node = helper.make_node("Constant", [], ["c"])
    node.attribute.append(ref_attr("value_float", attr, onnx.AttributeProto.FLOAT))
    return node


@pytest.mark.parametrize("case", list(BAD_BODIES))
def test_bad_body_is_rejected_with_its_reason(case: str) -> None:
    builder, message = BAD_BODIES[case]
    pair.register_function(builder)
    try:
        with pytest.raises(opbridge.OpDefinitionError) as info:
            function_proto(pair, opset=17)
        assert message in str(info.value)
    finally:
        pair.function_builder = None


class _PairModel(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return pair(a, b, gain=2.0)


def test_export_reports_a_bad_body(tmp_path) -> None:
    builder, message = BAD_BODIES["too_few_inputs"]
    pair.register_function(builder)
    target = tmp_path / "pair.onnx"
    try:
        with pytest.raises(opbridge.OpDefinitionError) as info:
            opbridge.export(_PairModel(), (torch.ones(2), torch.ones(2)), target, exporter="torchscript")
    finally:
        pair.function_builder = None
    assert message in str(info.value)
    assert not target.exists()


def test_body_moves_to_the_model_opset_when_its_ops_agree() -> None:
    pair.register_function(
        lambda spec: _body(
            [helper.make_node("Add", ["a", "b"], ["output"])], ["a", "b"], ["output"], ["gain"], opset=18
        )
    )
    try:
        assert [o.version for o in function_proto(pair, opset=17).opset_import] == [17]
        assert [o.version for o in function_proto(pair, opset=20).opset_import] == [20]
        assert [o.version for o in function_proto(pair).opset_import] == [18]
    finally:
        pair.function_builder = None


# --------------------------------------------------------------------------- a user's onnxscript body


@opbridge.op("tests.functions::ScaledSwish")
def scaled_swish(x: torch.Tensor, beta: float = 1.0) -> torch.Tensor:
    """x * sigmoid(beta * x)."""
    return x * torch.sigmoid(beta * x)


@script()
def scaled_swish_body(x, beta: float = 1.0):
    return x * op.Sigmoid(op.Mul(x, op.CastLike(beta, x)))


scaled_swish.register_function(scaled_swish_body)


class _SwishModel(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return scaled_swish(x, beta=1.7)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_user_onnxscript_body(tmp_path, exporter: str) -> None:
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(9))
    result = opbridge.export(_SwishModel(), (x,), tmp_path / "swish.onnx", exporter=exporter, input_names=["x"])
    (fn,) = result.model.functions
    assert (fn.domain, fn.name) == ("tests.functions", "ScaledSwish")
    assert [a.name for a in fn.attribute_proto] == ["beta"]
    assert fn.opset_import[0].version == (17 if exporter == "torchscript" else 20)
    expected = _SwishModel()(x).numpy()
    got = ort_session(str(result.path)).run(None, {"x": x.numpy()})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    session = ReferenceSession(result.path, prefer="function")
    np.testing.assert_allclose(session.run(None, {"x": x.numpy()})[0], expected, rtol=1e-5, atol=1e-6)


def test_make_body_declares_the_spec() -> None:
    fn = make_body(pair.spec, [helper.make_node("Add", ["a", "b"], ["output"])], 17)
    assert (fn.domain, fn.name, list(fn.input), list(fn.output), list(fn.attribute)) == (
        "tests.functions",
        "Pair",
        ["a", "b"],
        ["output"],
        ["gain"],
    )


def test_opset11_torchscript_export_runs_the_body(tmp_path) -> None:
    """MMDeploy-style exports use opset 11: the resize body is built for it (EyeLike reads the flag)."""
    seed = seed_by_name("super_resolution")
    model, args = seed.factory()
    result = opbridge.export(
        model,
        args,
        tmp_path / "sr11.onnx",
        exporter="torchscript",
        opset_version=11,
        input_names=seed.input_names,
        output_names=seed.output_names,
        dynamic_axes=seed.dynamic_axes(),
    )
    (fn,) = result.model.functions
    assert fn.opset_import[0].version == 11 and "EyeLike" in [n.op_type for n in fn.node]
    _, inputs = seed_case("super_resolution", 2)
    got = ort_session(str(result.path)).run(None, {n: t.numpy() for n, t in zip(seed.input_names, inputs)})[0]
    np.testing.assert_allclose(got, eager(model, inputs), rtol=1e-3, atol=1e-5)


def test_resize_body_refuses_opsets_before_cubic_resize() -> None:
    with pytest.raises(
        opbridge.OpDefinitionError, match=r"needs ONNX opset 11 or later \(cubic Resize\), the model uses opset 10"
    ):
        function_proto(DynamicResize, opset=10)
