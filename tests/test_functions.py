"""Function bodies: the built-in ops' decompositions, DynamicResize parity with PyTorch, user bodies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from conftest import EXPORTERS, SEED_IDS, SEED_TOLERANCE, SHAPE_IDS, run_script, seed_by_name
from conftest import seed_case as shared_seed_case
from onnx import TensorProto, helper
from onnxscript import opset18 as op
from onnxscript import script

import opbridge
from opbridge.functions import attach_functions, function_proto, make_body, ref_attr
from opbridge.ops import DynamicResize
from opbridge.ops.detection import GridSample
from opbridge.reference import ReferenceSession
from opbridge.spec import AttrSpec, AttrType

TOLERANCE = SEED_TOLERANCE


def seed_case(name: str, which: int) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    return shared_seed_case(name, which, seed=100)


def eager(model: torch.nn.Module, inputs: list[torch.Tensor]) -> np.ndarray:
    with torch.no_grad():
        return model(*inputs).numpy()


def ort_session(model: onnx.ModelProto | str) -> ort.InferenceSession:
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"])


def _onnx_default(attr: AttrSpec) -> object:
    """``attr``'s default as ``helper.get_attribute_value`` reads it back (strings as bytes)."""
    value = attr.to_onnx_value(attr.default)
    if attr.type is AttrType.FLOAT:
        return float(np.float32(value))
    if attr.type is AttrType.FLOATS:
        return [float(np.float32(v)) for v in value]
    if attr.type is AttrType.STRING:
        return value.encode()
    if attr.type is AttrType.STRINGS:
        return [v.encode() for v in value]
    return value


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
        assert list(fn.attribute) == [a.name for a in spec.attributes if a.required]
        assert {a.name: helper.get_attribute_value(a) for a in fn.attribute_proto} == {
            a.name: _onnx_default(a) for a in spec.attributes if not a.required
        }
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
    "output_never_produced": (
        lambda spec: _body([helper.make_node("Add", ["a", "b"], ["outptu"])], ["a", "b"], ["output"], ["gain"]),
        (
            "tests.functions::Pair: function body output(s) ['output'] are never produced: no node writes them "
            "(values computed but never read: ['outptu']); name the output of the node that computes it after the "
            "body's output."
        ),
    ),
    "undefined_input": (
        lambda spec: _body([helper.make_node("Add", ["a", "c"], ["output"])], ["a", "b"], ["output"], ["gain"]),
        (
            "tests.functions::Pair: function body node Add (unnamed) reads 'c', which is neither a function input "
            "['a', 'b'] nor the output of an earlier node; write the nodes in order and name the value as the node "
            "that computes it does (or '' for an omitted optional input)."
        ),
    ),
    "nodes_out_of_order": (
        lambda spec: _body(
            [helper.make_node("Neg", ["ab"], ["output"], name="neg"), helper.make_node("Add", ["a", "b"], ["ab"])],
            ["a", "b"],
            ["output"],
            ["gain"],
        ),
        "function body node Neg (neg) reads 'ab', which is neither a function input ['a', 'b'] nor the output",
    ),
    "undefined_in_subgraph": (
        lambda spec: _body(
            [
                helper.make_node("Constant", [], ["flag"], value=helper.make_tensor("f", TensorProto.BOOL, [], [True])),
                helper.make_node(
                    "If",
                    ["flag"],
                    ["output"],
                    then_branch=_branch(helper.make_node("Add", ["a", "b"], ["sum"]), "sum"),
                    else_branch=_branch(helper.make_node("Sub", ["a", "bb"], ["diff"]), "diff"),
                ),
            ],
            ["a", "b"],
            ["output"],
            ["gain"],
        ),
        "function body node Sub (unnamed) reads 'bb', which is neither a function input ['a', 'b'] nor the output",
    ),
}


def _branch(node: onnx.NodeProto, output: str) -> onnx.GraphProto:
    return helper.make_graph([node], "branch", [], [helper.make_value_info(output, onnx.TypeProto())])


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


def _resize_node(*inputs: str) -> onnx.NodeProto:
    return helper.make_node("Resize", list(inputs), ["output"], mode="cubic")


# (nodes, opset written for, model opset, message)
REFUSED_MOVES = {
    "softmax_up": (
        [helper.make_node("Softmax", ["a"], ["output"], axis=1)],
        11,
        13,
        (
            "tests.functions::Pair: the function body is written for ONNX opset 11, but the model uses opset 13, and "
            "Softmax means something else there (version 11 vs 13): it changed at version 13: it normalises along "
            "'axis' alone, no longer over all dims from 'axis' on. Register a builder with an 'opset' parameter "
            "that builds the body for the model's opset, or export with opset_version=11."
        ),
    ),
    "softmax_down": (
        [helper.make_node("Softmax", ["a"], ["output"], axis=1)],
        13,
        12,
        "Softmax means something else there (version 13 vs 11): it changed at version 13",
    ),
    "logsoftmax_up": (
        [helper.make_node("LogSoftmax", ["a"], ["output"])],
        12,
        18,
        "LogSoftmax means something else there (version 11 vs 13): it changed at version 13",
    ),
    "hardmax_down": (
        [helper.make_node("Hardmax", ["a"], ["output"], axis=-1)],
        17,
        11,
        "Hardmax means something else there (version 13 vs 11): it changed at version 13",
    ),
    "group_norm_down": (
        [helper.make_node("GroupNormalization", ["a", "b", "b"], ["output"], num_groups=2)],
        21,
        20,
        "GroupNormalization means something else there (version 21 vs 18): it changed at version 21: scale and "
        "bias are per channel, no longer per group",
    ),
    "deprecated_version": (
        [helper.make_node("Upsample", ["a", "b"], ["output"])],
        9,
        10,
        "Upsample means something else there (version 9 vs 10): version 10 is deprecated in onnx's schema history",
    ),
    "default_changed": (
        [helper.make_node("Selu", ["a"], ["output"])],
        5,
        6,
        "Selu means something else there (version 1 vs 6): the node leaves attribute 'alpha' unset, whose default "
        "is 1.673200011253357 in version 1 and 1.6732631921768188 in version 6",
    ),
    "required_input_left_empty": (
        [_resize_node("a", "", "", "b")],
        13,
        11,
        "and Resize is defined differently there (version 13 vs 11)",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED_MOVES))
def test_body_is_not_moved_across_a_change_of_meaning(case: str) -> None:
    nodes, written, opset, message = REFUSED_MOVES[case]
    pair.register_function(lambda spec: _body(nodes, ["a", "b"], ["output"], ["gain"], opset=written))
    try:
        with pytest.raises(opbridge.OpDefinitionError) as info:
            function_proto(pair, opset=opset)
    finally:
        pair.function_builder = None
    assert message in str(info.value)


# (nodes, opset written for, model opset)
ACCEPTED_MOVES = {
    "softmax_same_version": ([helper.make_node("Softmax", ["a"], ["output"], axis=1)], 13, 20),
    "softmax_negative_axes_added": ([helper.make_node("Softmax", ["a"], ["output"], axis=1)], 9, 12),
    "resize_new_optional_attributes": ([_resize_node("a", "", "", "b")], 13, 19),
    "resize_down": ([_resize_node("a", "", "", "b")], 19, 13),
    "add_down": ([helper.make_node("Add", ["a", "b"], ["output"])], 18, 13),
}


@pytest.mark.parametrize("case", list(ACCEPTED_MOVES))
def test_body_is_moved_up_or_down_when_its_ops_mean_the_same(case: str) -> None:
    nodes, written, opset = ACCEPTED_MOVES[case]
    pair.register_function(lambda spec: _body(nodes, ["a", "b"], ["output"], ["gain"], opset=written))
    try:
        assert [o.version for o in function_proto(pair, opset=opset).opset_import] == [opset]
    finally:
        pair.function_builder = None


def _gelu_of_sum(spec: object, opset: int) -> onnx.FunctionProto:
    nodes = [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Gelu", ["s"], ["output"])]
    return _body(nodes, ["a", "b"], ["output"], ["gain"], opset=opset)


# (builder, model opset, message): ops (or inputs) that ONNX added after the model's opset
NEWER_THAN_THE_MODEL = {
    "op_built_for_the_opset": (
        _gelu_of_sum,
        19,
        "tests.functions::Pair: the function body uses ONNX op Gelu, which exists from opset 20 on (Gelu-20), but "
        "the model uses opset 19. Export at opset_version=20 or later, or write the body without Gelu-20 (the "
        "builder is given the opset: below 20 it may build the body otherwise).",
    ),
    "op_of_a_body_to_move": (
        lambda spec: _gelu_of_sum(spec, 20),
        17,
        "tests.functions::Pair: the function body uses ONNX op Gelu, which exists from opset 20 on (Gelu-20), but "
        "the model uses opset 17. Export at opset_version=20 or later, or write the body without Gelu-20.",
    ),
    "input_added_later": (
        lambda spec, opset: _body(
            [helper.make_node("ReduceMax", ["a", "b"], ["output"])], ["a", "b"], ["output"], ["gain"], opset=opset
        ),
        17,
        "the function body uses ONNX op ReduceMax as ReduceMax-18 (opset 18 on) defines it, which ReduceMax-13 "
        "does not accept (the node has 2 input(s)), but the model uses opset 17. Export at opset_version=18 or later",
    ),
}


@pytest.mark.parametrize("case", list(NEWER_THAN_THE_MODEL))
def test_body_op_newer_than_the_model_opset_names_the_opset_it_needs(case: str) -> None:
    builder, opset, message = NEWER_THAN_THE_MODEL[case]
    pair.register_function(builder)
    try:
        with pytest.raises(opbridge.OpDefinitionError) as info:
            function_proto(pair, opset=opset)
        assert message in str(info.value)
        function_proto(pair, opset=20)  # valid where the op exists
    finally:
        pair.function_builder = None


def test_a_body_op_onnx_does_not_define_is_named_with_its_op() -> None:
    """A misspelt op type in a body reached the checker ("No Op registered for Reul"), which names
    neither the op whose body it is nor a fix."""
    pair.register_function(
        lambda spec, opset: _body(
            [helper.make_node("Reul", ["a"], ["output"])], ["a", "b"], ["output"], ["gain"], opset=opset
        )
    )
    try:
        with pytest.raises(opbridge.OpDefinitionError) as info:
            function_proto(pair, opset=18)
    finally:
        pair.function_builder = None
    assert str(info.value).startswith(
        "tests.functions::Pair: the function body has a node of op type 'Reul' in ONNX's domain, where ONNX defines "
        "no such op (did you mean 'Relu'?)"
    ), info.value


def test_a_body_taking_an_attribute_as_another_type_is_named() -> None:
    """A FLOAT attribute referred to as an INT (Constant value_int <- @gain) passed the body's checks, and
    export failed on the inlined model ("Mismatched attribute type in ' : value_int'")."""
    constant = helper.make_node("Constant", [], ["k"])
    constant.attribute.append(ref_attr("value_int", "gain", onnx.AttributeProto.INT))
    nodes = [constant, helper.make_node("Mul", ["a", "k"], ["output"])]
    pair.register_function(lambda spec, opset: _body(nodes, ["a", "b"], ["output"], ["gain"], opset=opset))
    try:
        with pytest.raises(opbridge.OpDefinitionError) as info:
            function_proto(pair, opset=18)
    finally:
        pair.function_builder = None
    assert (
        "function body node Constant (unnamed) takes the op's attribute 'gain' as its value_int (INT), but the "
        "op declares it FLOAT"
    ) in str(info.value), info.value


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_export_names_a_body_op_newer_than_the_model_opset(tmp_path, exporter: str) -> None:
    pair.register_function(_gelu_of_sum)
    target = tmp_path / "gelu.onnx"
    try:
        with pytest.raises(opbridge.OpDefinitionError, match=r"Pair: .* Gelu, which exists from opset 20 on"):
            opbridge.export(_PairModel(), (torch.ones(2), torch.ones(2)), target, exporter=exporter, opset_version=19)
    finally:
        pair.function_builder = None
    assert not target.exists()


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


@script()
def _swish_part(x, beta: float):
    return op.Mul(x, op.Sigmoid(op.Mul(x, op.CastLike(beta, x))))


@script()
def _swish_plus_one_body(x, beta: float = 1.0):
    return op.Add(_swish_part(x, beta=beta), op.CastLike(1.0, x))


@opbridge.op("tests.functions::SwishPlusOne")
def swish_plus_one(x: torch.Tensor, beta: float = 1.0) -> torch.Tensor:
    return x * torch.sigmoid(beta * x) + 1


swish_plus_one.register_function(_swish_plus_one_body)


def test_an_onnxscript_body_calling_another_script_function(tmp_path: Path) -> None:
    """onnxscript writes the call of another @script function as a node of its own domain ("this"), whose
    body to_function_proto leaves out: the model called a function it did not hold, and no runtime ran it
    (export warned of an unknown custom op this::_swish_part). The callee is inlined into the body."""

    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return swish_plus_one(x, beta=1.5)

    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(2))
    result = opbridge.export(Model(), (x,), tmp_path / "nested.onnx", exporter="torchscript", input_names=["x"])
    (fn,) = result.model.functions
    assert {n.domain for n in fn.node} == {""} and {o.domain for o in fn.opset_import} == {""}
    got = ort_session(str(result.path)).run(None, {"x": x.numpy()})[0]
    np.testing.assert_allclose(got, Model()(x).numpy(), rtol=1e-5, atol=1e-6)


@opbridge.op("tests.functions::Scale")
def scale(x: torch.Tensor, factor: float, offset: float = 0.25, names: list[str] = []) -> torch.Tensor:  # noqa: B006
    """x * factor + offset (``factor`` has no default)."""
    return x * factor + offset


def test_make_body_declares_the_spec() -> None:
    fn = make_body(pair.spec, [helper.make_node("Add", ["a", "b"], ["output"])], 17)
    assert (fn.domain, fn.name, list(fn.input), list(fn.output), list(fn.attribute)) == (
        "tests.functions",
        "Pair",
        ["a", "b"],
        ["output"],
        [],
    )
    assert [(a.name, a.type, a.f) for a in fn.attribute_proto] == [("gain", onnx.AttributeProto.FLOAT, 1.0)]


def test_make_body_declares_defaults_and_keeps_required_attributes_required() -> None:
    fn = make_body(scale.spec, [helper.make_node("Identity", ["x"], ["output"])], 18)
    assert list(fn.attribute) == ["factor"]
    assert [(a.name, a.type) for a in fn.attribute_proto] == [
        ("offset", onnx.AttributeProto.FLOAT),
        ("names", onnx.AttributeProto.STRINGS),
    ]
    assert fn.attribute_proto[0].f == 0.25 and list(fn.attribute_proto[1].strings) == []


def test_bodies_declaring_names_only_get_the_op_defaults() -> None:
    """A builder that declares attributes by name (helper.make_function) gets the spec's defaults."""
    pair.register_function(
        lambda spec: _body([helper.make_node("Add", ["a", "b"], ["output"])], ["a", "b"], ["output"], ["gain"])
    )
    try:
        fn = function_proto(pair, opset=18)
    finally:
        pair.function_builder = None
    assert list(fn.attribute) == []
    assert [(a.name, a.type, a.f) for a in fn.attribute_proto] == [("gain", onnx.AttributeProto.FLOAT, 1.0)]
    grid = function_proto(GridSample, opset=20)
    assert list(grid.attribute) == []
    assert {a.name: (a.type, a.i) for a in grid.attribute_proto} == {
        "interpolation_mode": (onnx.AttributeProto.INT, 0),
        "padding_mode": (onnx.AttributeProto.INT, 0),
        "align_corners": (onnx.AttributeProto.INT, 0),
    }


def test_body_default_must_be_the_op_default() -> None:
    pair.register_function(
        lambda spec: helper.make_function(
            "x",
            "y",
            ["a", "b"],
            ["output"],
            [helper.make_node("Add", ["a", "b"], ["output"])],
            [helper.make_opsetid("", 18)],
            attribute_protos=[helper.make_attribute("gain", 2.0)],
        )
    )
    try:
        with pytest.raises(opbridge.OpDefinitionError) as info:
            function_proto(pair, opset=18)
    finally:
        pair.function_builder = None
    assert str(info.value) == (
        "tests.functions::Pair: the function body declares attribute 'gain' with default 2.0, the op's default "
        "is 1.0 (float); give the body the op's default, or none."
    )


# --------------------------------------------------------------------------- nodes that omit attributes


@opbridge.op("tests.functions::Leaky")
def leaky(x: torch.Tensor, alpha: float = 0.5) -> torch.Tensor:
    """leaky_relu(x, alpha); ONNX's LeakyRelu defaults alpha to 0.01."""
    return F.leaky_relu(x, alpha)


@leaky.register_function
def _leaky_body(spec: object, opset: int) -> onnx.FunctionProto:
    node = helper.make_node("LeakyRelu", ["x"], ["output"])
    node.attribute.append(ref_attr("alpha", "alpha", onnx.AttributeProto.FLOAT))
    return make_body(leaky.spec, [node], opset)


def custom_node_model(
    opdef: opbridge.OpDef, feed: dict[str, np.ndarray], opset: int, *, check: bool = True, **attrs: object
) -> onnx.ModelProto:
    """One node of ``opdef`` setting only ``attrs``, its body attached as a model file would get it
    (``check``: the full checker passes it, which with opbridge's schemas registered runs the shape rule)."""
    spec = opdef.spec
    node = helper.make_node(spec.name, list(feed), ["y"], domain=spec.domain, **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, list(v.shape)) for name, v in feed.items()],
        [
            helper.make_tensor_value_info(
                "y", TensorProto.FLOAT, [f"d{i}" for i in range(next(iter(feed.values())).ndim)]
            )
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(spec.domain, 1)]
    )
    assert attach_functions(model, [opdef]) == [spec.qualname]
    if check:
        onnx.checker.check_model(model, full_check=True)
    return model


def test_omitted_attribute_takes_the_op_default_in_onnxruntime() -> None:
    x = np.array([-2.0, -1.0, 1.0, 2.0], np.float32)
    got = ort_session(custom_node_model(leaky, {"x": x}, 18)).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, [-1.0, -0.5, 1.0, 2.0])
    got = ort_session(custom_node_model(leaky, {"x": x}, 18, alpha=0.25)).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, [-0.5, -0.25, 1.0, 2.0])


def _builtin_feed(name: str) -> tuple[opbridge.OpDef, dict[str, np.ndarray]]:
    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, 2, 5, 4)).astype(np.float32)
    if name == "DynamicTRTResize":
        return DynamicResize, {"input": x, "size_tensor": np.zeros((1, 1, 8, 7), np.float32)}
    return GridSample, {"input": x, "grid": rng.uniform(-1.1, 1.1, (1, 3, 6, 2)).astype(np.float32)}


@pytest.mark.parametrize(
    ("name", "opset"), [("DynamicTRTResize", 11), ("DynamicTRTResize", 18), ("grid_sampler", 16), ("grid_sampler", 20)]
)
def test_builtin_bodies_apply_the_op_defaults(name: str, opset: int) -> None:
    """A node that omits every attribute runs the body as the node that sets the op's defaults does."""
    opdef, feed = _builtin_feed(name)
    defaults = {a.name: a.to_onnx_value(a.default) for a in opdef.spec.attributes}
    bare = custom_node_model(opdef, feed, opset)
    got = ort_session(bare).run(None, feed)[0]
    np.testing.assert_array_equal(
        got, ort_session(custom_node_model(opdef, feed, opset, **defaults)).run(None, feed)[0]
    )
    expected = opdef.run_reference(*(torch.from_numpy(v) for v in feed.values())).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=2e-5)
    if name == "DynamicTRTResize" or opset >= 20:  # the evaluator's GridSample knows opset 20's mode names only
        got_ref = ReferenceSession(bare, prefer="function").run(None, feed)[0]
        np.testing.assert_allclose(got_ref, expected, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("opset", [16, 20])
def test_grid_sampler_body_gives_nan_for_codes_the_kernels_refuse_and_reads_align_as_a_bool(opset: int) -> None:
    """The body picked its branch by mode * 6 + padding * 2 + align: a mode or padding out of range fell
    through to bicubic with reflection (the last branch), and align_corners=2 aliased bilinear with border
    padding, where the kernels refuse the first and read the second as true. Plain ONNX Runtime now gives
    NaN for the first and the kernels' numbers for the second."""
    _, feed = _builtin_feed("grid_sampler")
    for attrs in ({"interpolation_mode": 3}, {"padding_mode": -1}, {"padding_mode": 7}):
        # (a model from a file: the checker with opbridge's schemas refuses these, through the shape rule)
        got = ort_session(custom_node_model(GridSample, feed, opset, check=False, **attrs)).run(None, feed)[0]
        assert got.shape == (1, 2, 3, 6) and np.isnan(got).all(), attrs
    got = ort_session(custom_node_model(GridSample, feed, opset, align_corners=2)).run(None, feed)[0]
    expected = GridSample.run_reference(*(torch.from_numpy(v) for v in feed.values()), align_corners=True).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=2e-5)


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


@opbridge.op("tests.nested::Inner")
def nested_inner(x: torch.Tensor, k: float = 2.0) -> torch.Tensor:
    return x * k


@nested_inner.register_function
def _nested_inner_body(spec, opset):  # type: ignore[no-untyped-def]
    k = helper.make_node("Constant", [], ["kk"])
    k.attribute.extend([ref_attr("value_float", "k", onnx.AttributeProto.FLOAT)])
    return make_body(spec, [k, helper.make_node("Mul", ["x", "kk"], ["output"])], opset)


@opbridge.op("tests.nested::Outer")
def nested_outer(x: torch.Tensor, k: float = 3.0) -> torch.Tensor:
    return nested_inner(x, k=k) + 1


@nested_outer.register_function
def _nested_outer_body(spec, opset):  # type: ignore[no-untyped-def]
    inner = helper.make_node("Inner", ["x"], ["t"], domain="tests.nested")
    inner.attribute.extend([ref_attr("k", "k", onnx.AttributeProto.FLOAT)])
    one = helper.make_node("Constant", [], ["one"], value_float=1.0)
    nodes = [inner, one, helper.make_node("Add", ["t", "one"], ["output"])]
    return make_body(spec, nodes, opset, extra_opsets={"tests.nested": 1})


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_op_whose_reference_calls_another_op_exports_with_both_bodies(tmp_path, exporter: str) -> None:
    """The inner call belongs to the outer op's reference, not to the graph: the export keeps one
    node, and attaches the inner op's body too, which plain ONNX Runtime needs."""

    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return nested_outer(x, k=5.0)

    x = torch.tensor([1.0, 2.0, 3.0])
    result = opbridge.export(Model(), (x,), tmp_path / "nested.onnx", exporter=exporter, input_names=["x"])
    assert [(n.domain, n.op_type) for n in result.custom_nodes] == [("tests.nested", "Outer")]
    assert sorted(f.name for f in result.model.functions) == ["Inner", "Outer"]
    got = ort.InferenceSession(str(result.path)).run(None, {"x": x.numpy()})[0]
    np.testing.assert_array_equal(got, [6.0, 11.0, 16.0])


@opbridge.op("tests.fn.optional::ScaleAdd", shape=lambda x, b=None, **_: opbridge.TensorInfo(x.shape, x.dtype))
def scale_add(x: torch.Tensor, b: torch.Tensor | None = None, alpha: float = 1.0) -> torch.Tensor:
    y = x * alpha
    return y + b if b is not None else y


@scale_add.register_function
def _scale_add_body(spec, opset):  # type: ignore[no-untyped-def]
    alpha = helper.make_node("Constant", [], ["a"])
    alpha.attribute.extend([ref_attr("value_float", "alpha", onnx.AttributeProto.FLOAT)])
    nodes = [alpha, helper.make_node("Mul", ["x", "a"], ["y"]), helper.make_node("Add", ["y", "b"], ["output"])]
    return make_body(spec, nodes, opset)  # reads b whether the node gives it or not


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_body_reading_an_omitted_optional_input_is_refused_at_export(tmp_path, exporter: str) -> None:
    """Valid as written, the model breaks once ONNX Runtime inlines the body for the call without b."""

    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return scale_add(x, alpha=0.5)

    target = tmp_path / "omitted.onnx"
    with pytest.raises(
        opbridge.ExportError,
        match=r"not once the function body of tests.fn.optional::ScaleAdd is inlined.*optional input",
    ):
        opbridge.export(Model(), (torch.ones(2, 3),), target, exporter=exporter)
    assert not target.exists()


@opbridge.op("tests.fn.optional::SumAdd", shape=lambda x, b=None: opbridge.TensorInfo(x.shape, x.dtype))
def sum_add(x: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    return x + b if b is not None else x


@sum_add.register_function
def _sum_add_body(spec, opset):  # type: ignore[no-untyped-def]
    return make_body(spec, [helper.make_node("Sum", ["x", "b"], ["output"])], opset)  # reads b whether given or not


def test_a_body_giving_a_variadic_op_an_omitted_input_is_refused_at_export(tmp_path: Path) -> None:
    """onnx's checker takes Sum(x, "") once inlined (an empty name in a variadic input), and ONNX Runtime
    ended the process on it (a segmentation fault, in verify too)."""

    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return sum_add(x)

    target = tmp_path / "sum.onnx"
    with pytest.raises(
        opbridge.ExportError, match=r"function body of tests.fn.optional::SumAdd is inlined, as ONNX Run"
    ):
        opbridge.export(Model(), (torch.ones(2, 3),), target, exporter="torchscript")
    assert not target.exists()


def test_a_session_refuses_a_node_that_leaves_out_an_input_that_is_not_optional(tmp_path: Path) -> None:
    """A model with Sum(x, "") (the checker passes it) ended the process in ONNX Runtime: opbridge's session
    refuses it by name, in the graph and once a body is inlined (run in a process of its own)."""
    out = run_script(
        tmp_path,
        """
        import opbridge
        from onnx import TensorProto, helper

        value = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [2])
        plain = helper.make_graph([helper.make_node("Sum", ["x", ""], ["y"], name="s")], "g", [value("x")], [value("y")])
        body = helper.make_function("acme", "Add2", ["a", "b"], ["c"], [helper.make_node("Sum", ["a", "b"], ["c"])],
                                    [helper.make_opsetid("", 18)])
        call = helper.make_graph([helper.make_node("Add2", ["x", ""], ["y"], domain="acme")], "g", [value("x")], [value("y")])
        opsets = [helper.make_opsetid("", 18), helper.make_opsetid("acme", 1)]
        models = [helper.make_model(plain, opset_imports=opsets)]
        models.append(helper.make_model(call, opset_imports=opsets, functions=[body]))
        for model in models:
            try:
                opbridge.InferenceSession(model)
            except opbridge.ModelLoadError as exc:
                print(str(exc).split(";")[0])
        """,
    )
    assert out.splitlines()[:2] == [
        "InferenceSession: Sum node 's' leaves out its input 1, one of its variadic 'data_0', which cannot be left out",
        "InferenceSession: Sum node 'acme::Add2/Sum#0' leaves out its input 1, one of its variadic 'data_0', which "
        "cannot be left out where 'Add2_0' calls acme::Add2 without its input 'b'",
    ]


@opbridge.op("tests.fn.bad::StrayAttr")
def _stray_attr(x: torch.Tensor) -> torch.Tensor:
    return x * x


@_stray_attr.register_function
def _stray_attr_body(spec, opset):  # type: ignore[no-untyped-def]
    return make_body(spec, [helper.make_node("Mul", ["x", "x"], ["output"], foo=1)], opset)  # Mul has no foo


@opbridge.op("tests.fn.bad::BuilderBug")
def _builder_bug(x: torch.Tensor) -> torch.Tensor:
    return x


@_builder_bug.register_function
def _builder_bug_body(spec, opset):  # type: ignore[no-untyped-def]
    raise RuntimeError("a bug in the builder")


@pytest.mark.parametrize(
    ("op", "error", "message"),
    [
        (
            _stray_attr,
            opbridge.ExportError,
            r"fails onnx.checker \(full_check\) in the function body of tests.fn.bad::Stray",
        ),
        (
            _builder_bug,
            opbridge.OpDefinitionError,
            r"tests.fn.bad::BuilderBug: its function body's builder '_builder_b",
        ),
    ],
    ids=["checker", "builder"],
)
def test_a_faulty_body_is_named_by_its_op(tmp_path: Path, op: Any, error: type, message: str) -> None:
    """The checker's error on a body ("Unrecognized attribute: foo for operator Mul") did not say whose body
    it was; a builder that raised reached the user as its bare exception."""

    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return op(x)

    with pytest.raises(error, match=message):
        opbridge.export(Model(), (torch.ones(2),), tmp_path / "bad.onnx", exporter="torchscript")


@opbridge.op("tests.fn.versions::Inner", version=2)
def _inner_v2(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@opbridge.op("tests.fn.versions::Outer")
def _outer_of_v1(x: torch.Tensor) -> torch.Tensor:
    return _inner_v2(x) + 1


@_outer_of_v1.register_function
def _outer_of_v1_body(spec, opset):  # type: ignore[no-untyped-def]
    nodes = [
        helper.make_node("Inner", ["x"], ["t"], domain="tests.fn.versions"),
        helper.make_node("Constant", [], ["one"], value_float=1.0),
        helper.make_node("Add", ["t", "one"], ["output"]),
    ]
    return make_body(spec, nodes, opset, extra_opsets={"tests.fn.versions": 1})  # (the model calls version 2)


def test_a_body_importing_another_version_of_a_domain_than_the_model_is_named(tmp_path: Path) -> None:
    """The TorchScript export raised the model's import of the domain after attaching the body, and the
    checker's error ("Opset import for domain ... in function op Inneris not compatible") named another op."""

    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return _inner_v2(_outer_of_v1(x))

    with pytest.raises(
        opbridge.ExportError,
        match=r"the function body of tests.fn.versions::Outer imports domain 'tests.fn.versions' at version 1, and "
        r"the model at version 2",
    ):
        opbridge.export(Model(), (torch.ones(2),), tmp_path / "v.onnx", exporter="torchscript")
