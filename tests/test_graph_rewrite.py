"""opbridge rewrite: each rule rewrites a positive case (op types, ONNX Runtime parity, full check) and
says why it skipped a negative one. Seed 003's frozen bicubic scale becomes dynamic again."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from _graph_models import OPSET, custom_node_model, export_seed003, make_model, resize_model, swish_function
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

import opbridge
import opbridge.ops
from opbridge.cli import main
from opbridge.graph import rewrite_model
from opbridge.graph.rewrite import RewriteError, rewrite_file
from opbridge.model_io import walk_nodes

RTOL, ATOL = 1e-3, 1e-5
RNG = np.random.default_rng(0)


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def run_rewritten(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Plain ONNX Runtime: the rewritten model carries DynamicResize's function body."""
    assert any(f.name == "DynamicTRTResize" for f in model.functions), "the rewrite attaches the body"
    return run_ort(model, feeds)


def op_types(model: onnx.ModelProto) -> list[str]:
    return [f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in model.graph.node]


def full_check(model: onnx.ModelProto) -> None:
    opbridge.register_onnx_schemas()
    onnx.checker.check_model(model, full_check=True)


def test_dynamic_resize_body_is_attached() -> None:
    report = rewrite_model(resize_model("cubic", scales="input"), ["resize-cubic-to-dynamic-resize"])
    (body,) = [f for f in report.model.functions if f.name == "DynamicTRTResize"]
    assert (body.domain, list(body.input), [(a.name, a.i) for a in body.attribute_proto]) == (
        "Test",
        ["input", "size_tensor"],
        [("align_corners", 0)],  # declared with the op's default
    )
    assert sum(n.op_type == "Resize" for n in walk_nodes(body.node)) == 2, "one Resize per align_corners value"


# ---------------------------------------------------------------- resize-cubic-to-dynamic-resize


@pytest.mark.parametrize(
    ("scales", "feeds_extra", "coord"),
    [
        ("input", {"s": np.array([2.0], np.float32)}, "half_pixel"),
        ("input", {"s": np.array([3.0], np.float32)}, "align_corners"),
        ("sizes-runtime", {}, "pytorch_half_pixel"),
    ],
    ids=["runtime-scales", "runtime-scales-align-corners", "runtime-sizes"],
)
def test_resize_to_dynamic_resize(scales: str, feeds_extra: dict, coord: str) -> None:
    original = resize_model("cubic", scales=scales, coord=coord, shape=(1, 2, "H", "W"))
    report = rewrite_model(original, ["resize-cubic-to-dynamic-resize"])
    (outcome,) = report.outcomes
    assert outcome.applied and "computed at run time" in outcome.reason
    # a scale that is not whole on the input's size samples other points: the report says so
    assert ("WARNING: exact where height and width times the scale are whole" in outcome.reason) == (scales == "input")
    types = op_types(report.model)
    assert "Resize" not in types and types.count("Test::DynamicTRTResize") == 1 and "ConstantOfShape" in types
    resize = next(n for n in report.model.graph.node if n.op_type == "DynamicTRTResize")
    assert helper.get_attribute_value(resize.attribute[0]) == int(coord == "align_corners")
    full_check(report.model)
    feeds = {"X": RNG.standard_normal((1, 2, 5, 6)).astype(np.float32), **feeds_extra}
    (expected,) = run_ort(original, feeds)
    (got,) = run_rewritten(report.model, feeds)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)


def test_resize_to_dynamic_resize_of_a_bfloat16_input_before_opset_20() -> None:
    """The size tensor's ConstantOfShape was filled with the input's dtype, which it makes in bfloat16 only from
    opset 20: the rewrite of a valid bfloat16 model failed the checker on a node the rule built."""
    graph = helper.make_graph(
        [
            helper.make_node("Shape", ["R"], ["sizes"], name="shape"),
            helper.make_node("Resize", ["X", "", "", "sizes"], ["Y"], mode="cubic", name="resize"),
        ],
        "g",
        [
            helper.make_tensor_value_info("X", TensorProto.BFLOAT16, [1, 1, 4, 4]),
            helper.make_tensor_value_info("R", TensorProto.FLOAT, [1, 1, "H", "W"]),
        ],
        [helper.make_tensor_value_info("Y", TensorProto.BFLOAT16, [1, 1, "H", "W"])],
    )
    report = rewrite_model(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]), ["resize-cubic-to-dynamic-resize"]
    )
    assert report.outcomes[0].applied, report.outcomes[0].reason
    full_check(report.model)
    (fill,) = [n for n in report.model.graph.node if n.op_type == "ConstantOfShape"]
    assert helper.get_attribute_value(fill.attribute[0]).data_type == TensorProto.FLOAT
    import ml_dtypes

    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    feeds = {"X": x.astype(ml_dtypes.bfloat16), "R": np.zeros((1, 1, 6, 6), np.float32)}
    (got,) = opbridge.ReferenceSession(report.model).run(None, feeds)
    assert got.dtype == ml_dtypes.bfloat16 and got.shape == (1, 1, 6, 6)


@pytest.mark.parametrize(
    ("model", "options", "reason"),
    [
        (lambda: resize_model("linear", scales="input"), {}, "mode is 'linear', not 'cubic'"),
        (lambda: resize_model("cubic", scales="initializer"), {}, "nothing computes them at run time"),
        (lambda: resize_model("cubic", scales="input", coord="asymmetric"), {}, "'asymmetric' has no DynamicResize"),
        (lambda: resize_model("cubic", scale_values=(1, 1, 2, 3)), {"scale_input": "k"}, "one factor for H and W"),
        (lambda: custom_node_model(), {}, "no Resize node in the graph"),
        (
            lambda: resize_model("cubic", scales="initializer"),
            {"scale_input": "scales"},
            "scale_input 'scales' names an initializer (read by other nodes), which a new graph input",
        ),
        (
            lambda: resize_model("cubic", scales="initializer"),
            {"scale_input": "Y"},
            "scale_input 'Y' names a value computed in the graph (a graph output), which a new graph input",
        ),
        (
            lambda: resize_model("cubic", scales="initializer", shape=(1, 3, 4, 4)),
            {"scale_input": "X"},
            "scale_input 'X' is a graph input of shape [1, 3, 4, 4], not one scale factor",
        ),
    ],
    ids=[
        "linear",
        "constant-scales",
        "asymmetric",
        "unequal-frozen-scales",
        "no-resize",
        "scale-input-taken",
        "scale-input-an-output",
        "scale-input-not-a-factor",
    ],
)
def test_resize_to_dynamic_resize_negative(model, options: dict, reason: str) -> None:
    report = rewrite_model(model(), ["resize-cubic-to-dynamic-resize"], options)
    assert not report.changed
    assert reason in report.outcomes[0].reason


def test_seed003_frozen_scale_made_dynamic(tmp_path: Path) -> None:
    """Seed 003: exported at x3, linted, rewritten to DynamicResize, then matches PyTorch at x4."""
    torch_model, path = export_seed003(tmp_path / "srcnn.onnx", scale=3.0)
    exported = onnx.load(path)
    assert [i.name for i in exported.graph.input] == ["input"], "the traced .item() dropped the scale input"
    out = tmp_path / "srcnn_dynamic.onnx"
    assert (
        main(
            [
                "rewrite",
                str(path),
                "-o",
                str(out),
                "--rule",
                "resize-cubic-to-dynamic-resize",
                "--option",
                "scale_input=factor",
            ]
        )
        == 0
    )
    rewritten = onnx.load(out)
    assert "Resize" not in op_types(rewritten) and "Test::DynamicTRTResize" in op_types(rewritten)
    assert [i.name for i in rewritten.graph.input] == ["input", "factor"]
    full_check(rewritten)
    x = torch.randn(1, 3, 7, 9, generator=torch.Generator().manual_seed(1))
    for scale in (4.0, 2.0):
        with torch.no_grad():
            expected = torch_model(x, torch.tensor([scale])).numpy()
        (got,) = run_rewritten(rewritten, {"input": x.numpy(), "factor": np.array([scale], np.float32)})
        assert got.shape == expected.shape == (1, 3, int(7 * scale), int(9 * scale))
        np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)
    # the unrewritten export is stuck at x3, whatever scale is asked for
    (frozen,) = run_ort(exported, {"input": x.numpy()})
    assert frozen.shape == (1, 3, 21, 27)


def test_seed003_frozen_scale_takes_a_size_input_exact_at_any_size(tmp_path: Path) -> None:
    """size_input: the output size from a graph input's shape, as seed 001's model takes it. Exact at any
    size (scale_input samples with 1/scale, as Resize does), and no float shape tensor for TensorRT,
    which refuses the scale_input form ("Network input factor is a shape tensor and must have type Int32")."""
    import torch.nn.functional as F

    torch_model, path = export_seed003(tmp_path / "srcnn.onnx", scale=3.0)
    report = rewrite_model(onnx.load(path), ["resize-cubic-to-dynamic-resize"], {"size_input": "out_size"})
    assert (
        report.changed and "replaced by the shape of graph input 'out_size' (1, 1, H, W)" in report.outcomes[0].reason
    )
    rewritten = report.model
    assert [i.name for i in rewritten.graph.input] == ["input", "out_size"]
    full_check(rewritten)
    x = torch.randn(1, 3, 7, 9, generator=torch.Generator().manual_seed(1))
    for size in ((16, 21), (5, 6)):  # x2.3 and down: not whole multiples
        got = run_rewritten(rewritten, {"input": x.numpy(), "out_size": np.zeros((1, 1, *size), np.float32)})[0]
        with torch.no_grad():  # (seed 003: the resize, then conv1, conv2, conv3)
            m = torch_model
            resized = F.interpolate(x, size=size, mode="bicubic", align_corners=False)
            expected = m.conv3(m.relu(m.conv2(m.relu(m.conv1(resized))))).numpy()
        np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)
    from opbridge.graph import check_compat

    trt = check_compat(rewritten, "tensorrt", real=False)
    assert trt.ok and not [n for n in trt.nodes if "trt-float-input-shape-tensor" in n.rules]
    scaled = rewrite_model(onnx.load(path), ["resize-cubic-to-dynamic-resize"], {"scale_input": "factor"}).model
    assert not check_compat(scaled, "tensorrt", real=False).ok  # the float factor, a shape tensor
    both = rewrite_model(onnx.load(path), ["resize-cubic-to-dynamic-resize"], {"scale_input": "f", "size_input": "s"})
    assert not both.changed and "scale_input and size_input both given" in both.outcomes[0].reason


# ---------------------------------------------------------------- fold-resize-scales


def test_fold_resize_scales() -> None:
    original = resize_model("linear", scales="folded-chain", shape=(1, 1, 4, 4))
    report = rewrite_model(original, ["fold-resize-scales"])
    (outcome,) = report.outcomes
    assert outcome.applied and "-> initializer" in outcome.reason
    assert op_types(report.model) == ["Resize"]
    resize = report.model.graph.node[0]
    assert resize.input[2] in {i.name for i in report.model.graph.initializer}
    full_check(report.model)
    feeds = {"X": RNG.standard_normal((1, 1, 4, 4)).astype(np.float32)}
    np.testing.assert_allclose(run_ort(report.model, feeds)[0], run_ort(original, feeds)[0], rtol=RTOL, atol=ATOL)
    from opbridge.graph import check_compat

    before = check_compat(original, "tensorrt", trt_version="8.6", real=False).nodes[-1]
    after = check_compat(report.model, "tensorrt", trt_version="8.6", real=False).nodes[-1]
    assert before.verdict == "fail" and after.verdict == "native"  # (TensorRT before 10 takes initializers only)


def test_fold_scales_from_static_shape() -> None:
    """Scales computed from Shape of a statically shaped input fold too."""
    nodes = [
        helper.make_node("Shape", ["X"], ["sh"], name="shape"),
        helper.make_node("Cast", ["sh"], ["shf"], to=TensorProto.FLOAT, name="cast"),
        helper.make_node("Div", ["target", "shf"], ["scales"], name="div"),
        helper.make_node("Resize", ["X", "", "scales"], ["Y"], mode="nearest", name="resize"),
    ]
    model = make_model(
        nodes,
        [("X", TensorProto.FLOAT, [1, 1, 2, 2])],
        [("Y", TensorProto.FLOAT, None)],
        initializers=[("target", np.array([1, 1, 4, 6], np.float32))],
    )
    report = rewrite_model(model, ["fold-resize-scales"])
    assert report.changed and op_types(report.model) == ["Resize"]
    scales = next(i for i in report.model.graph.initializer if i.name == report.model.graph.node[0].input[2])
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(scales), [1, 1, 2, 3])


@pytest.mark.parametrize(
    ("scales", "reason"),
    [
        ("input", "depends on graph input 's'"),
        ("initializer", "already an initializer"),
        ("sizes-runtime", "run-time shape of 'X'"),
    ],
    ids=["runtime", "initializer", "dynamic-shape"],
)
def test_fold_resize_scales_negative(scales: str, reason: str) -> None:
    report = rewrite_model(resize_model("linear", scales=scales), ["fold-resize-scales"])
    assert not report.changed and reason in report.outcomes[0].reason


# ---------------------------------------------------------------- replace-op


class OldSwish(OpRun):
    op_domain = "legacy"

    def _run(self, x, beta=1.0):
        return (x / (1 + np.exp(-beta * x)),)


class NewSwish(OpRun):
    op_domain = "test.rewrite"

    def _run(self, x, alpha=1.0):
        return (x / (1 + np.exp(-alpha * x)),)


@opbridge.op("test.rewrite::SpecSwish")
def spec_swish(x: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    return x * torch.sigmoid(alpha * x)


def test_replace_op_with_rename() -> None:
    original = custom_node_model("OldSwish", "legacy", beta=1.7)
    report = rewrite_model(
        original, ["replace-op"], {"map": ["legacy::OldSwish=test.rewrite::NewSwish"], "rename": ["beta=alpha"]}
    )
    assert report.changed and op_types(report.model) == ["Relu", "test.rewrite::NewSwish"]
    assert {o.domain: o.version for o in report.model.opset_import}["test.rewrite"] == 1
    full_check(report.model)
    feeds = {"x": RNG.standard_normal((2, 3)).astype(np.float32)}
    (expected,) = ReferenceEvaluator(original, new_ops=[OldSwish]).run(None, feeds)
    (got,) = ReferenceEvaluator(report.model, new_ops=[NewSwish]).run(None, feeds)
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)


def test_replace_op_checks_the_opbridge_signature() -> None:
    model = custom_node_model("OldSwish", "legacy", beta=1.7)
    report = rewrite_model(model, ["replace-op"], {"map": ["legacy::OldSwish=test.rewrite::SpecSwish"]})
    assert not report.changed and "has no attribute(s) ['beta']" in report.outcomes[0].reason
    assert "--rename beta=NEW" in report.outcomes[0].reason
    report = rewrite_model(
        model, ["replace-op"], {"map": ["legacy::OldSwish=test.rewrite::SpecSwish"], "rename": ["beta=alpha"]}
    )
    assert report.changed and "matches test.rewrite::SpecSwish's signature" in report.outcomes[0].reason
    attrs = {a.name: a.f for a in report.model.graph.node[1].attribute}
    assert attrs == {"alpha": pytest.approx(1.7)}
    # a node missing an input the op requires is skipped with the reason (it failed the final check)
    report = rewrite_model(
        custom_node_model("MYSELU", "legacy"), ["replace-op"], {"map": ["legacy::MYSELU=opbridge::MySELU"]}
    )
    assert not report.changed
    assert "the node gives no ['p', 'c'] input(s), which opbridge::MySELU requires" in report.outcomes[0].reason


def test_replace_op_checks_the_values_an_opbridge_op_s_attribute_takes() -> None:
    """A node whose attribute holds a value the new op does not take (MMCVRoiAlign takes "avg" or "max") was
    moved, and every backend then refused the rewritten model at load."""
    import opbridge.ops.detection  # noqa: F401 - MMCVRoiAlign

    def roi(how: str) -> onnx.ModelProto:
        node = helper.make_node("RoiAlignLegacy", ["x", "r"], ["y"], domain="legacy", name="roi", pool=how)
        return make_model(
            [node],
            [("x", TensorProto.FLOAT, [1, 2, 8, 8]), ("r", TensorProto.FLOAT, [3, 5])],
            [("y", TensorProto.FLOAT, [3, 2, 7, 7])],
            domains={"legacy": 1},
        )

    options = {"map": ["legacy::RoiAlignLegacy=mmdeploy::MMCVRoiAlign"], "rename": ["pool=mode"]}
    report = rewrite_model(roi("mean"), ["replace-op"], options)
    assert not report.changed
    assert (
        "attribute 'pool' holds 'mean', where mmdeploy::MMCVRoiAlign's 'mode' takes ['avg', 'max']"
        in report.outcomes[0].reason
    )
    report = rewrite_model(roi("max"), ["replace-op"], options)
    assert report.changed and report.model.graph.node[0].op_type == "MMCVRoiAlign"


def test_replace_op_names_the_nodes_inside_function_bodies_it_leaves() -> None:
    """Nodes of the op inside a model-local function's body were passed over without a word ("no node of
    type ... in the graph", where inspect lists them)."""
    inner = helper.make_node("OldSwish", ["x"], ["y"], domain="legacy", name="in_body", beta=1.0)
    body = helper.make_function("wrap", "Outer", ["x"], ["y"], [inner], [helper.make_opsetid("legacy", 1)])
    value = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [2])  # noqa: E731
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("wrap", 1), helper.make_opsetid("legacy", 1)]
    only_body = helper.make_model(
        helper.make_graph([helper.make_node("Outer", ["x"], ["y"], domain="wrap")], "g", [value("x")], [value("y")]),
        opset_imports=opsets,
        functions=[body],
    )
    options = {"map": ["legacy::OldSwish=test.rewrite::NewSwish"]}
    report = rewrite_model(only_body, ["replace-op"], options)
    assert not report.changed
    assert report.outcomes[0].reason == (
        "no node of type legacy::OldSwish in the graph: the 1 node(s) of that type sit in the bodies of model-local "
        "functions (wrap::Outer), which replace-op does not enter; export the model without function bodies "
        "(functions=False, --no-functions) to rewrite them"
    )
    both = helper.make_model(
        helper.make_graph(
            [
                helper.make_node("Outer", ["x"], ["t"], domain="wrap"),
                helper.make_node("OldSwish", ["t"], ["y"], domain="legacy", name="in_graph"),
            ],
            "g",
            [value("x")],
            [value("y")],
        ),
        opset_imports=opsets,
        functions=[body],
    )
    report = rewrite_model(both, ["replace-op"], options)
    assert report.changed
    assert [(o.node, o.applied) for o in report.outcomes] == [("in_graph", True), ("in_body", False)]
    assert report.outcomes[1].reason == "sits in the body of function wrap::Outer, which replace-op does not enter"


def test_replace_op_negative_and_bad_options() -> None:
    report = rewrite_model(custom_node_model(), ["replace-op"], {"map": ["Sigmoid=acme::Fast"]})
    assert not report.changed and report.outcomes[0].reason == "no node of type Sigmoid in the graph"
    # a node that is the map's target already: said so, not "no node of type"
    report = rewrite_model(
        custom_node_model("MYSELU", "legacy"), ["replace-op"], {"map": ["MYSELU=legacy::MYSELU"], "rename": ["a=b"]}
    )
    assert not report.changed
    assert report.outcomes[0].reason == (
        "no node of type MYSELU to move in the graph: its nodes of that name are legacy::MYSELU already, which "
        "replace-op leaves as they are (--rename renames the attributes of the nodes a map moves)"
    )
    with pytest.raises(opbridge.OpbridgeError, match="write Old=domain::New"):
        rewrite_model(custom_node_model(), ["replace-op"], {"map": ["Relu=Fast"]})


def test_replace_op_does_not_move_the_domains_other_nodes_to_another_version() -> None:
    """--option version=2 into a domain the model imports at 1 raised the import to 2 without a word:
    the domain's other node then resolved to a version of its op that does not exist."""
    nodes = [
        helper.make_node("Keep", ["x"], ["t"], domain="acme", name="keep"),
        helper.make_node("Relu", ["t"], ["y"], name="relu"),
    ]
    model = make_model(nodes, [("x", 1, [3])], [("y", 1, [3])], domains={"acme": 1})
    report = rewrite_model(model, ["replace-op"], {"map": ["Relu=acme::MyRelu"], "version": 2})
    assert not report.changed
    assert "imports domain 'acme' at version 1, which 1 other node(s)" in report.outcomes[0].reason
    assert "give --option version=1" in report.outcomes[0].reason
    same = rewrite_model(model, ["replace-op"], {"map": ["Relu=acme::MyRelu"], "version": 1})
    assert same.changed and {(o.domain, o.version) for o in same.model.opset_import} == {("", OPSET), ("acme", 1)}
    alone = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", 1, [3])], [("y", 1, [3])], domains={"acme": 3})
    moved = rewrite_model(alone, ["replace-op"], {"map": ["Relu=acme::MyRelu"], "version": 2})
    assert moved.changed and ("acme", 2) in {(o.domain, o.version) for o in moved.model.opset_import}
    # every node of the domain moved by the same map: nothing is left at the old version
    both = make_model(
        [helper.make_node("Old", ["x"], ["t"], domain="acme"), helper.make_node("Old", ["t"], ["y"], domain="acme")],
        [("x", 1, [3])],
        [("y", 1, [3])],
        domains={"acme": 1},
    )
    renamed = rewrite_model(both, ["replace-op"], {"map": ["acme::Old=acme::New"], "version": 2})
    assert [o.applied for o in renamed.outcomes] == [True, True]
    assert ("acme", 2) in {(o.domain, o.version) for o in renamed.model.opset_import}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"map": ["Relu=acme::A", "Relu=acme::B"]}, "Relu is mapped twice"),
        ({"map": ["Relu=a::b::c"]}, "write Old=domain::New"),
        ({"map": ["Relu=ai.onnx::Sigmoid"], "version": 3}, "an ONNX op runs at the model's ONNX opset"),
    ],
    ids=["mapped-twice", "two-separators", "version-of-onnx-op"],
)
def test_replace_op_refuses_maps_it_would_apply_silently_otherwise(options: dict, message: str) -> None:
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", 1, [3])], [("y", 1, [3])])
    with pytest.raises(opbridge.OpbridgeError, match=message):
        rewrite_model(model, ["replace-op"], options)


# ---------------------------------------------------------------- legacy-domain


def test_legacy_domain() -> None:
    original = custom_node_model("MYSELU", "")
    with pytest.raises(Exception, match="MYSELU"):
        run_ort(original, {"x": np.zeros((2, 3), np.float32)})
    report = rewrite_model(original, ["legacy-domain"], {"domain": "acme.legacy"})
    assert report.changed and op_types(report.model) == ["Relu", "acme.legacy::MYSELU"]
    full_check(report.model)
    report.model.functions.append(swish_function("acme.legacy", "MYSELU"))
    feeds = {"x": RNG.standard_normal((2, 3)).astype(np.float32)}
    (got,) = run_ort(report.model, feeds)
    relu = np.maximum(feeds["x"], 0)
    np.testing.assert_allclose(got, relu / (1 + np.exp(-relu)), rtol=RTOL, atol=ATOL)


def test_legacy_domain_negative() -> None:
    report = rewrite_model(custom_node_model(), ["legacy-domain"])
    assert not report.changed and report.outcomes[0].reason == "no custom op in the default domain"


def test_legacy_domain_refuses_to_move_a_function_onto_one_of_the_same_name() -> None:
    """A default-domain function named as one the target domain has already failed with the checker's
    "multiple local functions with the same implementation id", without the fix."""
    opsets = [helper.make_opsetid("", OPSET)]
    old = helper.make_function("", "MyAct", ["a"], ["b"], [helper.make_node("Relu", ["a"], ["b"])], opsets)
    new = helper.make_function(
        "opbridge.legacy", "MyAct", ["a"], ["b"], [helper.make_node("Neg", ["a"], ["b"])], opsets
    )
    graph = helper.make_graph(
        [helper.make_node("MyAct", ["x"], ["y"]), helper.make_node("MyAct", ["y"], ["z"], domain="opbridge.legacy")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(
        graph, opset_imports=[*opsets, helper.make_opsetid("opbridge.legacy", 1)], functions=[old, new]
    )
    with pytest.raises(
        RewriteError, match=r"function\(s\) \['MyAct'\] in domain 'opbridge.legacy' already.*--option domain=NAME"
    ):
        rewrite_model(model, ["legacy-domain"])
    report = rewrite_model(model, ["legacy-domain"], {"domain": "acme"})
    feeds = {"x": np.array([1.0, -2.0], np.float32)}
    np.testing.assert_array_equal(run_ort(report.model, feeds)[0], [-1.0, 0.0])


@pytest.mark.parametrize(
    ("domain", "message"),
    [
        ("", "names no domain; give the target domain"),
        ("  ", "names no domain; give the target domain"),
        ("ai.onnx", "one of ONNX's own domains"),
        ("ai.onnx.ml", "one of ONNX's own domains"),
    ],
    ids=["empty", "blank", "ai.onnx", "ai.onnx.ml"],
)
def test_legacy_domain_refuses_no_domain_and_onnxs_own(domain: str, message: str, tmp_path: Path) -> None:
    """An empty --option domain= is refused, not taken as the default domain, and nothing is written."""
    with pytest.raises(RewriteError, match=message):
        rewrite_model(custom_node_model("MYSELU", ""), ["legacy-domain"], {"domain": domain})
    src, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(custom_node_model("MYSELU", ""), src)
    assert main(["rewrite", str(src), "-o", str(out), "--rule", "legacy-domain", "--option", f"domain={domain}"]) == 2
    assert not out.exists()


# ---------------------------------------------------------------- files and CLI


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_input_is_never_overwritten_without_in_place(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "m.onnx"
    onnx.save(resize_model("linear", scales="folded-chain"), src)
    before = _digest(src)
    assert main(["rewrite", str(src), "-o", str(src), "--rule", "fold-resize-scales"]) == 2
    assert "is the input file" in capsys.readouterr().err and _digest(src) == before
    out = tmp_path / "out.onnx"
    assert main(["rewrite", str(src), "-o", str(out), "--rule", "fold-resize-scales"]) == 0
    assert _digest(src) == before and op_types(onnx.load(out)) == ["Resize"]
    assert main(["rewrite", str(src), "--in-place", "--rule", "fold-resize-scales"]) == 0
    assert op_types(onnx.load(src)) == ["Resize"]
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_no_match_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(resize_model("linear"), src)
    assert main(["rewrite", str(src), "-o", str(out), "--rule", "resize-cubic-to-dynamic-resize"]) == 1
    assert "mode is 'linear', not 'cubic'" in capsys.readouterr().out and not out.exists()


def test_invalid_result_is_refused(tmp_path: Path) -> None:
    src, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(custom_node_model(), src)
    with pytest.raises(RewriteError, match="not valid, nothing was written"):
        rewrite_file(src, out, ["replace-op"], {"map": ["Relu=ai.onnx.ml::NoSuchOp"]})
    assert not out.exists()


def test_unknown_rule() -> None:
    with pytest.raises(RewriteError, match="unknown rule.*'nope'.*fold-resize-scales"):
        rewrite_model(custom_node_model(), ["nope"])


def test_opset_of_model_is_kept() -> None:
    report = rewrite_model(resize_model("cubic", scales="input"), ["resize-cubic-to-dynamic-resize"])
    assert {o.domain: o.version for o in report.model.opset_import}[""] == OPSET


def _legacy_model_with_external_data(folder: Path) -> Path:
    """A MatMul whose weight lives in model.onnx.data, then a custom op in the default domain."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("MYSELU", ["a"], ["y"])]
    model = make_model(
        nodes,
        [("x", TensorProto.FLOAT, [1, 8])],
        [("y", TensorProto.FLOAT, [1, 8])],
        initializers=[("w", np.arange(64, dtype=np.float32).reshape(8, 8))],
    )
    path = folder / "model.onnx"
    onnx.save_model(model, path, save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    return path


def test_output_paths_that_cannot_be_used_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The input's external data file, an empty path, a folder, a path under a file, a write-protected
    file (also to root, whose access() passed it: it was replaced): each refused (exit 2) before anything
    is written, the input's files unchanged."""
    src = _legacy_model_with_external_data(tmp_path)
    data = tmp_path / "model.onnx.data"
    before = (_digest(src), _digest(data))
    (tmp_path / "folder").mkdir()
    kept = tmp_path / "kept.onnx"
    kept.write_bytes(b"keep me")
    kept.chmod(0o444)
    for output, message in (
        (str(data), "is one of the input's own files"),
        ("", "the output path is empty"),
        (str(tmp_path / "folder"), "is a folder; give a file path inside it"),
        (str(src / "x.onnx"), "is a file, not a folder"),
        (str(kept), "kept.onnx is write-protected; remove it or choose another path"),
    ):
        assert main(["rewrite", str(src), "-o", output, "--rule", "legacy-domain"]) == 2
        assert message in capsys.readouterr().err
    assert (_digest(src), _digest(data)) == before
    assert kept.read_bytes() == b"keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "kept.onnx", "model.onnx", "model.onnx.data"]


def test_written_files_get_the_usual_permissions_and_links_are_written_through(tmp_path: Path) -> None:
    """A new file gets 0666 less the umask (not tempfile's private 0600), a replaced file keeps its
    mode, and --in-place on a symbolic link rewrites the model it points to, keeping the link."""
    import os
    import stat

    src = _legacy_model_with_external_data(tmp_path)
    out = tmp_path / "out.onnx"
    umask = os.umask(0o022)
    try:
        assert main(["rewrite", str(src), "-o", str(out), "--rule", "legacy-domain"]) == 0
        assert stat.S_IMODE(out.stat().st_mode) == 0o644
        out.chmod(0o640)
        assert main(["rewrite", str(src), "-o", str(out), "--rule", "legacy-domain"]) == 0
        assert stat.S_IMODE(out.stat().st_mode) == 0o640
    finally:
        os.umask(umask)
    real = tmp_path / "real.onnx"
    onnx.save(make_model([helper.make_node("MYSELU", ["x"], ["y"])], [("x", 1, [2])], [("y", 1, [2])]), real)
    link = tmp_path / "link.onnx"
    link.symlink_to(real)
    assert main(["rewrite", str(link), "--in-place", "--rule", "legacy-domain"]) == 0
    assert link.is_symlink() and onnx.load(real).graph.node[0].domain == "opbridge.legacy"


def test_an_output_given_as_a_link_keeps_its_data_beside_the_file_it_leads_to(tmp_path: Path) -> None:
    """-o through a link into another folder wrote the model there and its data file named after the
    link (models/out.onnx.data, which the model named): it loaded by neither path."""
    from onnx import numpy_helper

    src = tmp_path / "in.onnx"
    weights = numpy_helper.from_array(np.arange(2048, dtype=np.float32).reshape(1024, 2), "w")
    model = make_model(
        [helper.make_node("MYSELU", ["x"], ["s"]), helper.make_node("Add", ["s", "w"], ["y"])],
        [("x", 1, [1024, 2])],
        [("y", 1, [1024, 2])],
    )
    model.graph.initializer.append(weights)
    onnx.save(model, src, save_as_external_data=True, location="in.onnx.data", size_threshold=0)
    (tmp_path / "models").mkdir()
    real = tmp_path / "models" / "real.onnx"
    real.write_bytes(b"old")
    link = tmp_path / "out.onnx"
    link.symlink_to(real)
    assert main(["rewrite", str(src), "-o", str(link), "--rule", "legacy-domain"]) == 0
    assert link.is_symlink() and not (tmp_path / "models" / "out.onnx.data").exists()
    written = onnx.load(real)
    assert written.graph.node[0].domain == "opbridge.legacy"
    np.testing.assert_array_equal(numpy_helper.to_array(written.graph.initializer[0]), numpy_helper.to_array(weights))


def test_replace_op_into_onnx_and_bad_versions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A map into ai.onnx:: keeps the model's default opset (no 'ai.onnx' import at version 1), and
    the version option must be a whole number from 1."""
    src, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", 1, [3])], [("y", 1, [3])]), src)
    assert main(["rewrite", str(src), "-o", str(out), "--rule", "replace-op", "--map", "Relu=ai.onnx::Sigmoid"]) == 0
    model = onnx.load(out)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", OPSET)]
    x = np.array([-1.0, 0.0, 2.0], np.float32)
    got = ort.InferenceSession(out.as_posix()).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, 1 / (1 + np.exp(-x)), rtol=1e-6)
    for version in ("abc", "-5", "99999999999999999999"):
        args = ["rewrite", str(src), "-o", str(out), "--rule", "replace-op", "--map", "Relu=acme::Swish"]
        assert main([*args, "--option", f"version={version}"]) == 2
        assert "the opset version is a whole number from 1" in capsys.readouterr().err


def test_dynamic_resize_output_shape_follows_the_run_time_size() -> None:
    """A frozen x2 Resize of a static 4x4 input, declared 8x8, made dynamic with a scale input: the
    declared 8x8 would be stale (x3 gives 12x12), so the output's height and width become symbolic."""
    model = resize_model("cubic", scales="initializer", shape=(1, 3, 4, 4))
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 3, 8, 8]))
    report = rewrite_model(model, ["resize-cubic-to-dynamic-resize"], {"scale_input": "factor"})
    dims = report.model.graph.output[0].type.tensor_type.shape.dim
    assert [d.dim_value for d in dims[:2]] == [1, 3]
    assert all(d.HasField("dim_param") and not d.HasField("dim_value") for d in dims[2:])
    x = np.random.default_rng(2).standard_normal((1, 3, 4, 4)).astype(np.float32)
    (y,) = opbridge.InferenceSession(report.model).run(None, {"X": x, "factor": np.array([3.0], np.float32)})
    assert y.shape == (1, 3, 12, 12)


def test_fold_resize_10_scales() -> None:
    """Resize-10's scales (its second input) from a Constant fold into an initializer."""
    values = onnx.numpy_helper.from_array(np.array([1.0, 1.0, 2.0, 2.0], np.float32))
    nodes = [
        helper.make_node("Constant", [], ["scales"], value=values, name="c"),
        helper.make_node("Resize", ["x", "scales"], ["y"], mode="nearest", name="r10"),
    ]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [1, 1, 2, 2])], [("y", TensorProto.FLOAT, None)], opset=10)
    report = rewrite_model(model, ["fold-resize-scales"])
    assert report.changed and op_types(report.model) == ["Resize"]
    init = {i.name: onnx.numpy_helper.to_array(i) for i in report.model.graph.initializer}
    assert [a.tolist() for a in init.values()] == [[1.0, 1.0, 2.0, 2.0]]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["domain=a", "domain=b"], "--option domain= is given twice (domain=a and domain=b); give each option once."),
        (["scale_input="], "--option 'scale_input=' gives scale_input no value; give one"),
        (["domain= "], "--option 'domain= ' gives domain no value"),
    ],
    ids=["twice", "empty", "blank"],
)
def test_cli_options_given_twice_or_empty_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: list[str], message: str
) -> None:
    """The last of two values was kept silently, and an empty one read as the option left out."""
    src, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(custom_node_model("MYSELU", ""), src)
    argv = ["rewrite", str(src), "-o", str(out), "--rule", "legacy-domain"]
    for option in options:
        argv += ["--option", option]
    assert main(argv) == 2
    assert message in capsys.readouterr().err and not out.exists()


def test_an_input_the_checker_refuses_is_blamed_not_the_rewrite() -> None:
    """A model the checker refused before any rule ran (IR version 1 with opset imports) failed as "the
    rewritten model is not valid": the rewrite's fault, read the message."""
    model = resize_model("linear", scales="folded-chain")
    model.ir_version = 1
    with pytest.raises(
        RewriteError, match=r"the input model is not valid, before any rule ran \(model with IR version < 3"
    ) as err:
        rewrite_model(model, ["fold-resize-scales"])
    assert "The rewritten model: " in str(err.value)


def test_legacy_domain_names_its_results_fault_not_the_legacy_input() -> None:
    """legacy-domain repairs an input the checker refuses (custom ops in the default domain): a result that
    failed too (a node of one output moved onto opbridge::MyStrangeOp, which has two) was blamed on the input
    ("fix the input first"), the rewrite's own error hidden behind it."""
    import opbridge.ops  # noqa: F401 - opbridge::MyStrangeOp

    value = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 3]) for n in ("x", "w", "b", "y")]
    node = helper.make_node("MyStrangeOp", ["x", "w", "b"], ["y"], float_attr=[0.1, 0.5], int_attr=[2, 2])
    model = helper.make_model(
        helper.make_graph([node], "g", value[:3], value[3:]), opset_imports=[helper.make_opsetid("", 13)]
    )
    with pytest.raises(RewriteError, match=r"the rewritten model is not valid.*output size 1 not in range") as err:
        rewrite_model(model, ["legacy-domain"], {"domain": "opbridge"})
    assert "before any rule ran" not in str(err.value)


def test_an_option_no_rule_reads_is_refused() -> None:
    """A misspelt option (scale_inputs for scale_input) would be dropped silently."""
    with pytest.raises(RewriteError, match=r"option\(s\) \['scale_inputs'\] are not read by rule\(s\)"):
        rewrite_model(resize_model("cubic"), ["resize-cubic-to-dynamic-resize"], {"scale_inputs": "factor"})


def test_a_path_ending_in_a_slash_names_a_folder(tmp_path: Path) -> None:
    """ "out/" would become a file named out (pathlib drops the slash): it is refused."""
    from opbridge._files import prepare_output

    with pytest.raises(opbridge.OutputPathError, match=r"names a folder; give a file path"):
        prepare_output(f"{tmp_path}/report/")
    assert not (tmp_path / "report").exists()


def test_folders_are_created_when_the_file_is_written_not_before(tmp_path: Path) -> None:
    """A command that fails after checking its output path leaves no new folders behind."""
    src = tmp_path / "m.onnx"
    onnx.save(resize_model("cubic", scales="input"), src)
    deep = tmp_path / "a" / "b" / "out.onnx"
    bad_option = ["--option", "scale_inputs=factor"]  # refused once the rules run, after the path check
    assert main(["rewrite", str(src), "-o", str(deep), "--rule", "resize-cubic-to-dynamic-resize", *bad_option]) == 2
    assert not (tmp_path / "a").exists()
    assert main(["rewrite", str(src), "-o", str(deep), "--rule", "resize-cubic-to-dynamic-resize"]) == 0
    assert deep.is_file()


def test_output_paths_that_are_not_regular_files_or_are_the_factory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A FIFO (or a device) would be replaced by a file; export -o onto the factory's own source, an
    empty verify --json path and demo --keep on a file are named too."""
    import os

    src = _legacy_model_with_external_data(tmp_path)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert main(["rewrite", str(src), "-o", str(fifo), "--rule", "legacy-domain"]) == 2
    assert "is not a regular file" in capsys.readouterr().err and fifo.exists() and not fifo.is_file()
    factory = tmp_path / "factory.py"
    factory.write_text("def build():\n    raise RuntimeError('unused')\n")
    assert main(["export", f"{factory}:build", "-o", str(factory)]) == 2
    assert "is one of the input's own files" in capsys.readouterr().err
    assert factory.read_text().startswith("def build")
    assert main(["verify", str(src), "--reference", f"{factory}:build", "--json", ""]) == 2
    assert "the output path is empty" in capsys.readouterr().err
    assert main(["demo", "--keep", str(factory), "-q"]) == 2
    assert "is a file; give --keep a folder" in capsys.readouterr().err


def test_rewrite_keeps_the_weights_in_an_external_data_file(tmp_path: Path) -> None:
    """A model whose weights are in an external data file is written the same way: the graph in the
    output, the weights in <output>.data beside it; the input's files are left as they were."""
    from onnx.external_data_helper import uses_external_data

    weight = np.arange(32 * 32, dtype=np.float32).reshape(32, 32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("MYSELU", ["a"], ["y"])]
    model = make_model(
        nodes, [("x", TensorProto.FLOAT, [1, 32])], [("y", TensorProto.FLOAT, [1, 32])], initializers=[("w", weight)]
    )
    src = tmp_path / "model.onnx"
    onnx.save_model(model, src, save_as_external_data=True, location="weights.bin", size_threshold=0)
    before = (_digest(src), _digest(tmp_path / "weights.bin"))
    out = tmp_path / "out" / "rewritten.onnx"
    assert main(["rewrite", str(src), "-o", str(out), "--rule", "legacy-domain"]) == 0
    assert (_digest(src), _digest(tmp_path / "weights.bin")) == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["rewritten.onnx", "rewritten.onnx.data"]
    light = onnx.load(out, load_external_data=False)
    assert uses_external_data(light.graph.initializer[0])
    assert out.stat().st_size < weight.nbytes
    full = onnx.load(out)
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(full.graph.initializer[0]), weight)
    assert full.graph.node[1].domain == "opbridge.legacy"
    # in place: the weights stay in the model's one data file; a file named <model>.data beside it,
    # which is not the model's, is left alone
    notes = tmp_path / "model.onnx.data"
    notes.write_text("the user's notes")
    assert main(["rewrite", str(src), "--in-place", "--rule", "legacy-domain"]) == 0
    again = onnx.load(src)
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(again.graph.initializer[0]), weight)
    light = onnx.load(src, load_external_data=False)
    assert [e.value for e in light.graph.initializer[0].external_data if e.key == "location"] == ["weights.bin"]
    assert notes.read_text() == "the user's notes"


def test_rewrite_with_external_data_from_the_models_own_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """onnx's conversion to external data looks its file name up in the current folder: run there, an
    in-place rewrite and a second -o rewrite to one output failed with FileExistsError."""
    weight = np.arange(32 * 32, dtype=np.float32).reshape(32, 32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("MYSELU", ["a"], ["y"])]
    model = make_model(
        nodes, [("x", TensorProto.FLOAT, [1, 32])], [("y", TensorProto.FLOAT, [1, 32])], initializers=[("w", weight)]
    )
    onnx.save_model(model, tmp_path / "e.onnx", save_as_external_data=True, location="e.onnx.data", size_threshold=0)
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        assert main(["rewrite", "e.onnx", "-o", "out.onnx", "--rule", "legacy-domain"]) == 0
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(onnx.load("out.onnx").graph.initializer[0]), weight)
    assert main(["rewrite", "e.onnx", "--in-place", "--rule", "legacy-domain"]) == 0
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(onnx.load("e.onnx").graph.initializer[0]), weight)


def test_in_place_rewrite_of_a_model_with_several_data_files_keeps_other_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Weights in one file per tensor: an in-place rewrite writes them to <model>.data, and refuses where
    a file of that name, not the model's, is there."""
    weights = {n: np.full((16, 16), k, np.float32) for k, n in enumerate(("w1", "w2"))}
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["a"]),
        helper.make_node("MatMul", ["a", "w2"], ["b"]),
        helper.make_node("MYSELU", ["b"], ["y"]),
    ]
    model = make_model(
        nodes,
        [("x", TensorProto.FLOAT, [1, 16])],
        [("y", TensorProto.FLOAT, [1, 16])],
        initializers=list(weights.items()),
    )
    src = tmp_path / "model.onnx"
    onnx.save_model(model, src, save_as_external_data=True, all_tensors_to_one_file=False, size_threshold=0)
    notes = tmp_path / "model.onnx.data"
    notes.write_text("the user's notes")
    assert main(["rewrite", str(src), "--in-place", "--rule", "legacy-domain"]) == 2
    assert "model.onnx.data exists and is not one of model.onnx's data files" in capsys.readouterr().err
    assert notes.read_text() == "the user's notes"
    assert onnx.load(src).graph.node[2].domain == ""  # not rewritten
    notes.unlink()
    assert main(["rewrite", str(src), "--in-place", "--rule", "legacy-domain"]) == 0
    again = onnx.load(src)
    assert again.graph.node[2].domain == "opbridge.legacy"
    for init in again.graph.initializer:
        np.testing.assert_array_equal(onnx.numpy_helper.to_array(init), weights[init.name])


def test_two_resize_nodes_without_names_get_names_of_their_own() -> None:
    """Two cubic Resize nodes without names: the values each rewrite adds are named apart (they collided:
    "Data for input 0 already exists")."""
    model = resize_model("cubic", scales="input", shape=(1, 2, "H", "W"))
    first = model.graph.node[-1]
    first.name = ""
    second = onnx.NodeProto()
    second.CopyFrom(first)
    second.input[0], second.output[0] = "Y", "Z"
    model.graph.node.append(second)
    model.graph.output[0].name = "Z"
    report = rewrite_model(model, ["resize-cubic-to-dynamic-resize"])
    assert [o.applied for o in report.outcomes] == [True, True]
    full_check(report.model)
    feeds = {"X": RNG.standard_normal((1, 2, 3, 4)).astype(np.float32), "s": np.array([2.0], np.float32)}
    (expected,) = run_ort(model, feeds)
    (got,) = run_rewritten(report.model, feeds)
    assert got.shape == expected.shape == (1, 2, 12, 16)
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)


def test_rewrite_keeps_idle_initializers_and_training_info() -> None:
    """The clean-up after a rewrite removes what the rewrite left unused, not the user's initializers that no
    node read before, nor the model's training_info (onnx-ir does not carry it)."""
    model = resize_model("nearest", scales="constant")
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.arange(3, dtype=np.float32), "idle"))
    model.training_info.add().algorithm.name = "kept"
    report = rewrite_model(model, ["fold-resize-scales"])
    assert report.changed
    assert "idle" in {i.name for i in report.model.graph.initializer}
    assert "scales_const" not in {n.name for n in report.model.graph.node}  # the folded Constant is gone
    assert [t.algorithm.name for t in report.model.training_info] == ["kept"]


def test_sparse_initializers_are_named_not_misread() -> None:
    """onnx-ir drops sparse initializers; a rule over it said "not topologically sorted"."""
    model = custom_node_model("MYSELU", "")
    values = onnx.numpy_helper.from_array(np.array([5.0], np.float32), "sp")
    indices = onnx.numpy_helper.from_array(np.array([1], np.int64))
    model.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [2]))
    with pytest.raises(RewriteError, match=r"does not read sparse initializers \(sp\); make them dense"):
        rewrite_model(model, ["replace-op"], {"map": ["MYSELU=acme::MySelu"]})


def test_legacy_domain_reaches_subgraphs_and_function_bodies() -> None:
    """Default-domain custom nodes inside a Loop body and inside a model-local function move too, with the
    opset import in the function; lint then finds nothing."""
    from opbridge.graph import lint_model

    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("MYSELU", ["x"], ["inner"])],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("inner", TensorProto.FLOAT, [2]),
        ],
    )
    fn = helper.make_function(
        "acme", "Wrap", ["a"], ["b"], [helper.make_node("MYSELU", ["a"], ["b"])], [helper.make_opsetid("", OPSET)]
    )
    nodes = [
        helper.make_node("Loop", ["n", "c"], ["scan"], body=body, name="loop"),
        helper.make_node("Wrap", ["x"], ["y"], domain="acme", name="wrap"),
    ]
    model = make_model(
        nodes,
        [("x", TensorProto.FLOAT, [2]), ("n", TensorProto.INT64, []), ("c", TensorProto.BOOL, [])],
        [("y", TensorProto.FLOAT, [2]), ("scan", TensorProto.FLOAT, [None, 2])],
        domains={"acme": 1},
        functions=[fn],
    )
    assert [f.node for f in lint_model(model) if f.code == "custom-op-default-domain"] == [
        "loop/body/MYSELU#1",
        "acme::Wrap/MYSELU#0",
    ]
    report = rewrite_model(model, ["legacy-domain"])
    assert [o.applied for o in report.outcomes] == [True, True]
    moved = [
        n for n in walk_nodes([*report.model.graph.node, *report.model.functions[0].node]) if n.op_type == "MYSELU"
    ]
    assert [n.domain for n in moved] == ["opbridge.legacy", "opbridge.legacy"]
    assert "opbridge.legacy" in {o.domain for o in report.model.functions[0].opset_import}
    assert not [f for f in lint_model(report.model) if f.severity == "error"]


def test_rules_reach_nodes_inside_if_branches() -> None:
    """fold-resize-scales and replace-op rewrite the nodes of If branches too (they looked at the main
    graph only), and the result runs like the original."""
    scales = onnx.numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32))

    def branch(name: str, mode: str) -> onnx.GraphProto:
        return helper.make_graph(
            [
                helper.make_node("Constant", [], [f"{name}_s"], value=scales, name=f"{name}_const"),
                helper.make_node("Resize", ["X", "", f"{name}_s"], [f"{name}_y"], mode=mode, name=f"{name}_resize"),
                helper.make_node("Relu", [f"{name}_y"], [f"{name}_out"], name=f"{name}_relu"),
            ],
            name,
            [],
            [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [1, 1, 6, 6])],
        )

    node = helper.make_node(
        "If", ["c"], ["Y"], then_branch=branch("then", "nearest"), else_branch=branch("else", "linear"), name="if"
    )
    model = make_model(
        [node], [("X", TensorProto.FLOAT, [1, 1, 3, 3]), ("c", TensorProto.BOOL, [])], [("Y", TensorProto.FLOAT, None)]
    )
    folded = rewrite_model(model, ["fold-resize-scales"])
    assert sorted((o.node, o.applied) for o in folded.outcomes) == [("else_resize", True), ("then_resize", True)]
    branches = [a.g for a in folded.model.graph.node[0].attribute]
    assert all(n.op_type != "Constant" for g in branches for n in g.node)
    assert all(len(g.initializer) == 1 for g in branches)
    x = RNG.standard_normal((1, 1, 3, 3)).astype(np.float32)
    for cond in (True, False):
        feeds = {"X": x, "c": np.array(cond)}
        np.testing.assert_array_equal(run_ort(folded.model, feeds)[0], run_ort(model, feeds)[0])
    replaced = rewrite_model(model, ["replace-op"], {"map": ["Relu=acme::R"]})
    assert sorted(o.node for o in replaced.outcomes if o.applied) == ["else_relu", "then_relu"]
    assert {n.domain for n in walk_nodes(replaced.model.graph.node) if n.op_type == "R"} == {"acme"}


@opbridge.op("test.rewrite::BodyRelu")
def _body_relu(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x)


@_body_relu.register_function
def _body_relu_body(spec: Any, opset: int) -> onnx.FunctionProto:
    from opbridge.functions import make_body

    return make_body(spec, [helper.make_node("Relu", ["x"], ["output"])], opset)


def test_ops_a_rule_puts_inside_a_branch_get_their_function_bodies() -> None:
    """replace-op into an op with a function body, inside an If branch: the body is attached (it was for
    the main graph's nodes only), so a plain ONNX Runtime loads and runs the result."""
    relu = helper.make_node("Relu", ["X"], ["t"], name="then_relu")
    then = helper.make_graph([relu], "then", [], [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])])
    other = helper.make_graph(
        [helper.make_node("Neg", ["X"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])],
    )
    node = helper.make_node("If", ["c"], ["Y"], then_branch=then, else_branch=other, name="if")
    model = make_model(
        [node], [("X", TensorProto.FLOAT, [2]), ("c", TensorProto.BOOL, [])], [("Y", TensorProto.FLOAT, None)]
    )
    report = rewrite_model(model, ["replace-op"], {"map": ["Relu=test.rewrite::BodyRelu"]})
    assert [o.node for o in report.outcomes if o.applied] == ["then_relu"]
    assert [(f.domain, f.name) for f in report.model.functions] == [("test.rewrite", "BodyRelu")]
    feeds = {"X": np.array([-1.0, 2.0], np.float32), "c": np.array(True)}
    np.testing.assert_array_equal(run_ort(report.model, feeds)[0], [0.0, 2.0])


def test_models_too_large_for_one_message_are_checked_as_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rewritten model of 2 GiB or more cannot be serialized in one piece for the checker: it is checked
    through a file with external data, and keeps its tensors (the limit lowered here to run that path)."""
    import opbridge.graph.rewrite as rewrite
    import opbridge.model_io as model_io

    monkeypatch.setattr(model_io, "PROTO_LIMIT", 1024)
    weight = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("MYSELU", ["a"], ["y"])]
    model = make_model(
        nodes, [("x", TensorProto.FLOAT, [1, 64])], [("y", TensorProto.FLOAT, [1, 64])], initializers=[("w", weight)]
    )
    report = rewrite_model(model, ["legacy-domain"])
    assert report.model.graph.node[1].domain == "opbridge.legacy"
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(report.model.graph.initializer[0]), weight)
    assert not report.model.graph.initializer[0].external_data
    assert {v.name for v in report.model.graph.value_info} == {"a"}  # the inferred value infos
    broken = onnx.ModelProto()
    broken.CopyFrom(report.model)
    broken.graph.node[0].input[1] = "missing"
    with pytest.raises(RewriteError, match="the rewritten model is not valid"):
        rewrite.check_rewritten(broken)
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(broken.graph.initializer[0]), weight)


def test_a_large_rewritten_model_is_checked_through_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """From CHECK_AS_FILES_BYTES on, the result is checked through files (in memory, inference and the
    checker each held copies of every tensor): the same model and value infos come back."""
    from opbridge.graph import rewrite as rewrite_module

    model = resize_model(scales="folded-chain")
    in_memory = rewrite_model(model, ["fold-resize-scales"]).model
    monkeypatch.setattr(rewrite_module, "CHECK_AS_FILES_BYTES", 0)
    through_files = rewrite_model(model, ["fold-resize-scales"]).model
    assert through_files.graph.node == in_memory.graph.node
    assert through_files.graph.initializer == in_memory.graph.initializer
    assert {v.name for v in through_files.graph.value_info} == {v.name for v in in_memory.graph.value_info}


def _resize_10(mode: str, *, runtime_scales: bool) -> onnx.ModelProto:
    """X -> Resize-10(X, scales) -> Y at opset 10: scales Concat([1, 1], s, s) from graph input ``s``, or an
    x2 initializer."""
    nodes, inits = [], []
    inputs: list[tuple[str, int, Any]] = [("X", TensorProto.FLOAT, [1, 2, "H", "W"])]
    if runtime_scales:
        inputs.append(("s", TensorProto.FLOAT, [1]))
        inits.append(("one_one", np.ones(2, np.float32)))
        nodes.append(helper.make_node("Concat", ["one_one", "s", "s"], ["scales"], axis=0, name="scales_concat"))
    else:
        inits.append(("scales", np.array([1, 1, 2, 2], np.float32)))
    nodes.append(helper.make_node("Resize", ["X", "scales"], ["Y"], mode=mode, name="resize"))
    return make_model(nodes, inputs, [("Y", TensorProto.FLOAT, None)], initializers=inits, opset=10)


def test_cubic_resize_10_is_refused_for_its_asymmetric_coordinates() -> None:
    """Resize-10 (X, scales) was read as Resize-11's (X, roi, scales, sizes): "neither scales nor sizes". ONNX
    defines cubic from Resize-11 on; ONNX Runtime runs Resize-10's cubic as asymmetric, which DynamicResize
    (half_pixel or align_corners) cannot reproduce, so the rule refuses and says why."""
    original = _resize_10("cubic", runtime_scales=True)
    assert set(onnx.defs.get_schema("Resize", 10).attributes) == {"mode"}
    x = RNG.standard_normal((1, 2, 5, 6)).astype(np.float32)
    feeds = {"X": x, "s": np.array([2.5], np.float32)}
    (got,) = run_ort(original, feeds)
    ort13 = {}
    for coord in ("asymmetric", "half_pixel"):  # the refusal's premise: ORT samples asymmetric, not half_pixel
        later = resize_model("cubic", scales="input", coord=coord, shape=(1, 2, "H", "W"))
        ort13[coord] = run_ort(later, feeds)[0]
    np.testing.assert_allclose(got, ort13["asymmetric"], rtol=1e-6, atol=1e-6)
    assert np.abs(got - ort13["half_pixel"]).max() > 0.1
    for model, options in ((original, {}), (_resize_10("cubic", runtime_scales=False), {"size_input": "out_size"})):
        report = rewrite_model(model, ["resize-cubic-to-dynamic-resize"], options)
        assert not report.changed
        reason = report.outcomes[0].reason
        assert "a Resize-10 node (opset 10)" in reason and "asymmetric coordinates (x_in = x_out / scale)" in reason
    linear = rewrite_model(_resize_10("linear", runtime_scales=True), ["resize-cubic-to-dynamic-resize"])
    assert linear.outcomes[0].reason == "mode is 'linear', not 'cubic'"


def _in_an_opset_10_branch(*nodes: onnx.NodeProto) -> onnx.ModelProto:
    """An opset-10 model Y = If(c, then: ``nodes`` computing y from the outer X, else: X)."""
    branch = helper.make_graph(list(nodes), "then", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    other = helper.make_graph(
        [helper.make_node("Identity", ["X"], ["z"])],
        "else",
        [],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
    )
    node = helper.make_node("If", ["c"], ["Y"], then_branch=branch, else_branch=other, name="if")
    return make_model(
        [node],
        [("X", TensorProto.FLOAT, [1, 1, "H", "W"]), ("c", TensorProto.BOOL, [])],
        [("Y", TensorProto.FLOAT, None)],
        opset=10,
    )


def test_fold_resize_10_scales_inside_a_branch() -> None:
    """A subgraph imports no opset of its own: a Resize-10 in an If branch runs under the model's opset 10,
    and its scales (input 1) fold (they were read as Resize-11's: "neither scales nor sizes")."""
    scales = onnx.numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32))
    model = _in_an_opset_10_branch(
        helper.make_node("Constant", [], ["s"], value=scales, name="const"),
        helper.make_node("Resize", ["X", "s"], ["y"], mode="nearest", name="r10"),
    )
    report = rewrite_model(model, ["fold-resize-scales"])
    assert [(o.node, o.applied) for o in report.outcomes] == [("r10", True)]
    assert "scales 's' -> initializer" in report.outcomes[0].reason
    assert all(n.op_type != "Constant" for n in report.model.graph.node[0].attribute[0].g.node)
    feeds = {"X": RNG.standard_normal((1, 1, 2, 3)).astype(np.float32), "c": np.array(True)}
    (got,) = run_ort(report.model, feeds)
    assert got.shape == (1, 1, 4, 6)
    np.testing.assert_array_equal(got, run_ort(model, feeds)[0])


def test_fold_computes_branch_constants_under_the_model_opset() -> None:
    """Constants computed inside a branch run under the model's opset: Clip-6's min and max attributes (inputs
    from Clip-11 on) fold in an opset-10 model (a later opset's Clip could not be evaluated)."""
    table = onnx.numpy_helper.from_array(np.array([1, 1, 2, 5], np.float32))
    model = _in_an_opset_10_branch(
        helper.make_node("Constant", [], ["t"], value=table, name="const"),
        helper.make_node("Clip", ["t"], ["s"], min=0.0, max=3.0, name="clip"),
        helper.make_node("Resize", ["X", "s"], ["y"], mode="nearest", name="r10"),
    )
    report = rewrite_model(model, ["fold-resize-scales"])
    assert [(o.node, o.applied) for o in report.outcomes] == [("r10", True)], report.outcomes
    assert "= [1.0, 1.0, 2.0, 3.0]" in report.outcomes[0].reason
    feeds = {"X": RNG.standard_normal((1, 1, 2, 3)).astype(np.float32), "c": np.array(True)}
    (got,) = run_ort(report.model, feeds)
    assert got.shape == (1, 1, 4, 9)
    np.testing.assert_array_equal(got, run_ort(model, feeds)[0])


def _sizes_beside_empty_scales(sizes: str) -> onnx.ModelProto:
    """Resize-17(X, "", scales, sizes) as exporters write it: scales an empty Constant (shape [0]), sizes
    Shape(X) * [1, 1, 2, 2] (``runtime``) or [1, 2, 3, 4] * [1, 1, 2, 2] from Constants (``constant``)."""
    empty = onnx.numpy_helper.from_array(np.zeros(0, np.float32))
    nodes = [helper.make_node("Constant", [], ["scales"], value=empty, name="scales_const")]
    if sizes == "runtime":
        nodes.append(helper.make_node("Shape", ["X"], ["base"], name="shape"))
    else:
        base = onnx.numpy_helper.from_array(np.array([1, 2, 3, 4], np.int64))
        nodes.append(helper.make_node("Constant", [], ["base"], value=base, name="base_const"))
    nodes += [
        helper.make_node("Mul", ["base", "factor"], ["sizes"], name="sizes_mul"),
        helper.make_node("Resize", ["X", "", "scales", "sizes"], ["Y"], mode="linear", name="resize"),
    ]
    inits = [("factor", np.array([1, 1, 2, 2], np.int64))]
    x_shape = [1, 2, "H", "W"] if sizes == "runtime" else [1, 2, 3, 4]
    return make_model(nodes, [("X", TensorProto.FLOAT, x_shape)], [("Y", TensorProto.FLOAT, None)], initializers=inits)


def test_fold_resize_scales_an_empty_placeholder_is_not_a_fold() -> None:
    """Folding only the empty scales beside run-time sizes was reported as a rewrite, while the sizes stayed
    unfoldable (TensorRT still refuses them); beside folded sizes, the placeholder folds too and is named so."""
    report = rewrite_model(_sizes_beside_empty_scales("runtime"), ["fold-resize-scales"])
    assert not report.changed
    assert report.outcomes[0].reason == (
        "sizes 'sizes' cannot be folded: it depends on the run-time shape of 'X' (via shape); "
        "scales 'scales' is an empty placeholder"
    )
    original = _sizes_beside_empty_scales("constant")
    report = rewrite_model(original, ["fold-resize-scales"])
    assert report.changed and op_types(report.model) == ["Resize"]
    assert report.outcomes[0].reason == (
        "sizes 'sizes' -> initializer 'resize_sizes' = [1, 2, 6, 8]; "
        "empty scales 'scales' (a placeholder, folded alongside) -> initializer 'resize_scales'"
    )
    full_check(report.model)
    feeds = {"X": RNG.standard_normal((1, 2, 3, 4)).astype(np.float32)}
    np.testing.assert_allclose(run_ort(report.model, feeds)[0], run_ort(original, feeds)[0], rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    ("scales", "options", "by"),
    [
        ("input", {"size_input": "out_size"}, "scales 'scales'"),
        ("sizes-runtime", {"scale_input": "factor2"}, "sizes 'sizes'"),
    ],
    ids=["size-input-runtime-scales", "scale-input-runtime-sizes"],
)
def test_an_option_a_run_time_resize_does_not_use_is_reported(scales: str, options: dict, by: str) -> None:
    """scale_input/size_input on a Resize whose scales/sizes are already computed at run time were dropped
    silently: the node's line says so, and a last line says no node used the option."""
    report = rewrite_model(resize_model("cubic", scales=scales), ["resize-cubic-to-dynamic-resize"], options)
    ((key, value),) = options.items()
    node, summary = report.outcomes
    assert node.applied and (
        f"option {key}={value!r} not used: the output size is already computed at run time by {by}" in node.reason
    )
    assert (summary.node, summary.applied) == ("", False)
    assert summary.reason.startswith(f"option {key}={value!r} used by no Resize node")
    assert value not in {i.name for i in report.model.graph.input}
    used = rewrite_model(resize_model("cubic"), ["resize-cubic-to-dynamic-resize"], {"size_input": "out_size"})
    assert [o.applied for o in used.outcomes] == [True]  # used: no summary line


def _resize_model_with_weights() -> tuple[onnx.ModelProto, np.ndarray]:
    """A cubic Resize with run-time sizes beside an idle 4 MiB initializer (kept by the rewrite)."""
    weight = np.random.default_rng(1).random((1024, 1024), dtype=np.float32)
    model = resize_model("cubic", scales="sizes-runtime")
    model.graph.initializer.insert(0, onnx.numpy_helper.from_array(weight, name="weight"))
    return model, weight


def test_rules_and_checks_do_not_read_or_copy_the_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rules' onnx-ir conversion and the checks get the graph without the data of tensors of 1 MiB or
    more; the written model holds the weights bit for bit, in their place, both as one file and with a
    data file (which the report's model then refers to)."""
    import onnx_ir as ir

    seen: list[int] = []
    to_ir = ir.from_proto

    def recording(model: onnx.ModelProto) -> Any:
        seen.extend(len(t.raw_data) for t in model.graph.initializer)
        return to_ir(model)

    monkeypatch.setattr(ir, "from_proto", recording)
    model, weight = _resize_model_with_weights()
    in_memory = rewrite_model(model, ["resize-cubic-to-dynamic-resize"]).model
    assert seen and max(seen) < 1 << 20, "the weight went through onnx-ir"
    assert [t.name for t in in_memory.graph.initializer][0] == "weight"
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(in_memory.graph.initializer[0]), weight)
    assert model.graph.node[-1].op_type == "Resize", "the caller's model is left as it was"
    src = tmp_path / "one.onnx"
    onnx.save_model(model, src)
    report = rewrite_file(src, tmp_path / "out" / "one.onnx", ["resize-cubic-to-dynamic-resize"])
    written = (tmp_path / "out" / "one.onnx").read_bytes()
    assert written == report.model.SerializeToString() == in_memory.SerializeToString()
    external = tmp_path / "external.onnx"
    onnx.save_model(model, external, save_as_external_data=True, location="external.onnx.data")
    report = rewrite_file(external, tmp_path / "out" / "ext.onnx", ["resize-cubic-to-dynamic-resize"])
    assert report.model.graph.initializer[0].data_location == TensorProto.EXTERNAL  # (not held twice)
    back = onnx.load(tmp_path / "out" / "ext.onnx")
    assert [t.name for t in back.graph.initializer] == [t.name for t in in_memory.graph.initializer]
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(back.graph.initializer[0]), weight)
    assert back.graph.node == in_memory.graph.node


def _dynamo_like_bicubic() -> onnx.ModelProto:
    """x -> Resize(cubic, frozen x2 scales 'val_4') -> Conv -> y, declared as torch.export writes it: the
    resized height and width (and the Conv's) as expressions of the input's."""
    hh, ww = "TruncToInt(2.0*ToFloat(h))", "TruncToInt(2.0*ToFloat(w))"
    nodes = [
        helper.make_node("Resize", ["x", "", "val_4"], ["up"], mode="cubic", name="node_upsample_bicubic2d"),
        helper.make_node("Conv", ["up", "w", "b"], ["y"], pads=[1, 1, 1, 1], name="node_conv2d"),
    ]
    model = make_model(
        nodes,
        [("x", TensorProto.FLOAT, ["batch", 2, "h", "w"])],
        [("y", TensorProto.FLOAT, ["batch", 3, hh, ww])],
        initializers=[
            ("val_4", np.array([1.0, 1.0, 2.0, 2.0], np.float32)),
            ("w", np.random.default_rng(4).standard_normal((3, 2, 3, 3)).astype(np.float32)),
            ("b", np.array([0.1, -0.2, 0.3], np.float32)),
        ],
    )
    model.graph.value_info.append(helper.make_tensor_value_info("up", TensorProto.FLOAT, ["batch", 2, hh, ww]))
    return model


def test_dynamic_resize_removes_the_frozen_scales_and_renames_downstream_dims() -> None:
    """The frozen scales no node reads after the rewrite are removed (ONNX Runtime warned "Removing initializer
    'val_4'" on every session), and the Resize's output and the graph output take the size input's H and W."""
    original = _dynamo_like_bicubic()
    report = rewrite_model(original, ["resize-cubic-to-dynamic-resize"], {"size_input": "size"})
    assert report.changed
    rewritten = report.model
    assert [i.name for i in rewritten.graph.initializer] == ["w", "b"]
    assert "val_4" not in {v.name for v in rewritten.graph.value_info}

    def dims(value: onnx.ValueInfoProto) -> list[Any]:
        return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]

    assert dims(rewritten.graph.input[1]) == [1, 1, "size_height", "size_width"]
    assert dims(rewritten.graph.output[0]) == ["batch", 3, "size_height", "size_width"]
    (up,) = [v for v in rewritten.graph.value_info if v.name == "up"]
    assert dims(up) == ["batch", 2, "size_height", "size_width"]
    full_check(rewritten)
    x = RNG.standard_normal((2, 2, 4, 5)).astype(np.float32)
    (expected,) = run_ort(original, {"x": x})
    (got,) = run_rewritten(rewritten, {"x": x, "size": np.zeros((1, 1, 8, 10), np.float32)})
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)
    (other,) = run_rewritten(rewritten, {"x": x, "size": np.zeros((1, 1, 7, 9), np.float32)})
    assert other.shape == (2, 3, 7, 9)


def test_replace_op_options_are_checked() -> None:
    """A --rename of an attribute the node lacks is reported; --map/--rename without replace-op, a version
    of 0 and options of the wrong type are refused with RewriteError, not dropped or raised as TypeError."""
    model = custom_node_model("OldSwish", "legacy", beta=1.7)
    mapped = {"map": ["legacy::OldSwish=acme::NewSwish"]}
    report = rewrite_model(model, ["replace-op"], {**mapped, "rename": ["nope=x", "beta=alpha"]})
    assert report.changed
    assert "renamed beta->alpha, no attribute 'nope' to rename (--rename not applied)" in report.outcomes[0].reason
    with pytest.raises(RewriteError, match=r"option\(s\) \['map'\] are not read by rule\(s\) \['legacy-domain'\]"):
        rewrite_model(model, ["legacy-domain"], {"map": ["A=d::B"]})
    with pytest.raises(RewriteError, match=r"option\(s\) \['rename'\] are not read"):
        rewrite_model(model, ["legacy-domain"], {"rename": {"beta": "alpha"}})
    with pytest.raises(opbridge.OpbridgeError, match="version=0: the opset version is a whole number from 1"):
        rewrite_model(model, ["replace-op"], {**mapped, "version": 0})
    with pytest.raises(RewriteError, match=r"rules is a NoneType; give a rule name or a list of them"):
        rewrite_model(model, None)  # type: ignore[arg-type]
    with pytest.raises(RewriteError, match=r"option map is a int; give 'a=b' strings, a list of them or a dict"):
        rewrite_model(model, ["replace-op"], {"map": 5})
    with pytest.raises(RewriteError, match=r"option rename is a int"):
        rewrite_model(model, ["replace-op"], {**mapped, "rename": 5})


def test_replace_op_renames_swap_together_and_never_overwrite_an_attribute() -> None:
    """The renames ran one after another: alpha=beta, beta=alpha left one attribute, and alpha=beta on a node
    holding beta overwrote it, both silently."""
    model = custom_node_model("OldSwish", "legacy", alpha=1.0, beta=2.0)
    mapped = {"map": ["legacy::OldSwish=acme::NewSwish"]}

    def attributes(m: onnx.ModelProto) -> dict[str, float]:
        (node,) = [n for n in m.graph.node if n.name == "custom"]
        return {a.name: a.f for a in node.attribute}

    swapped = rewrite_model(model, ["replace-op"], {**mapped, "rename": ["alpha=beta", "beta=alpha"]})
    assert attributes(swapped.model) == {"beta": 1.0, "alpha": 2.0}
    # (the fix named: renaming the attribute that holds the name, or two renames to one name)
    for renames, fix in (
        (["alpha=beta"], "rename the attribute that holds that name already too (--rename beta=OTHER)"),
        (["alpha=gamma", "beta=gamma"], "would be lost; give each rename a name of its own"),
    ):
        report = rewrite_model(model, ["replace-op"], {**mapped, "rename": renames})
        assert not report.changed and attributes(report.model) == {"alpha": 1.0, "beta": 2.0}
        assert "the renames would give attributes ['alpha', 'beta'] of the node one name" in report.outcomes[0].reason
        assert fix in report.outcomes[0].reason
    with pytest.raises(opbridge.OpbridgeError, match=r"--rename 'alpha=c': 'alpha' is renamed to 'b' already"):
        rewrite_model(model, ["replace-op"], {**mapped, "rename": ["alpha=b", "alpha=c"]})


def test_cli_map_without_replace_op_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(custom_node_model("MYSELU", ""), src)
    args = ["rewrite", str(src), "-o", str(out), "--rule", "legacy-domain", "--map", "A=d::B"]
    assert main(args) == 2
    assert "option(s) ['map'] are not read by rule(s) ['legacy-domain']" in capsys.readouterr().err
    assert not out.exists()


def test_write_model_keeps_fields_this_onnx_does_not_know() -> None:
    """write_model builds its pieces field by field, which left out fields of a newer ONNX (unknown here)
    on the model and its graph; it gives SerializeToString's bytes with them too."""
    import io

    from opbridge.model_io import write_model

    model, _ = _resize_model_with_weights()
    unknown = bytes([0x98, 0x06, 0x01])  # (field 99, a varint 1: no field of ModelProto or GraphProto)
    graph = onnx.GraphProto.FromString(model.graph.SerializeToString() + unknown)
    raw = onnx.ModelProto.FromString(model.SerializeToString() + unknown)
    raw.graph.CopyFrom(graph)
    for case in (model, raw):
        out = io.BytesIO()
        write_model(case, out)
        assert out.getvalue() == case.SerializeToString()
    assert len(raw.SerializeToString()) == len(model.SerializeToString()) + 2 * len(unknown)


# ---------------------------------------------------------------- output sizes, shapes, IR versions


def _resize_to_the_size_of(coord: str, size: list[Any]) -> onnx.ModelProto:
    """X -> cubic Resize to the height and width of a second input R (sizes computed at run time)."""
    nodes = [
        helper.make_node("Shape", ["X"], ["xs"]),
        helper.make_node("Slice", ["xs", "zero", "two"], ["nc"]),
        helper.make_node("Shape", ["R"], ["rs"]),
        helper.make_node("Slice", ["rs", "two", "four"], ["hw"]),
        helper.make_node("Concat", ["nc", "hw"], ["sizes"], axis=0),
        helper.make_node("Resize", ["X", "", "", "sizes"], ["Y"], mode="cubic", coordinate_transformation_mode=coord),
    ]
    return make_model(
        nodes,
        [("X", TensorProto.FLOAT, ["N", 2, "H", "W"]), ("R", TensorProto.FLOAT, size)],
        [("Y", TensorProto.FLOAT, None)],
        initializers=[(n, np.array([v], np.int64)) for n, v in (("zero", 0), ("two", 2), ("four", 4))],
    )


@pytest.mark.parametrize(
    ("coord", "size", "caveat"),
    [
        ("pytorch_half_pixel", [1, 1, "h", "w"], True),
        ("pytorch_half_pixel", [1, 1, 1, 5], True),
        ("pytorch_half_pixel", [1, 1, 3, 2], False),
        ("half_pixel", [1, 1, "h", "w"], False),
    ],
)
def test_pytorch_half_pixel_is_rewritten_with_a_caveat_where_an_output_size_may_be_one(
    coord: str, size: list[Any], caveat: bool
) -> None:
    """ONNX's pytorch_half_pixel samples index 0 along an axis of output length 1, DynamicResize its centre:
    the report says so unless the output height and width are static sizes above 1, where the two agree."""
    original = _resize_to_the_size_of(coord, size)
    report = rewrite_model(original, ["resize-cubic-to-dynamic-resize"])
    (outcome,) = report.outcomes
    assert outcome.applied
    warned = "'pytorch_half_pixel' samples input index 0 where the output height or width is 1" in outcome.reason
    assert warned == caveat
    x = RNG.standard_normal((1, 2, 6, 7)).astype(np.float32)
    for hw in [tuple(size[2:])] if isinstance(size[2], int) else [(1, 5), (13, 4)]:
        feeds = {"X": x, "R": np.zeros((1, 1, *hw), np.float32)}
        (expected,), (got,) = run_ort(original, feeds), run_rewritten(report.model, feeds)
        if coord == "pytorch_half_pixel" and 1 in hw:
            assert np.abs(got - expected).max() > 0.1  # what the caveat is about
        else:
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("after", "declared", "renamed"),
    [
        ([helper.make_node("Relu", ["r"], ["Y"])], [1, 16, 16, 16], [1, 16, "size_height", "size_width"]),
        (
            [helper.make_node("Transpose", ["r"], ["Y"], perm=[0, 2, 3, 1])],
            [1, 16, 16, 3],
            [1, "size_height", "size_width", 3],
        ),
        (
            [helper.make_node("Transpose", ["r"], ["Y"], perm=[0, 2, 3, 1])],
            [1, 16, 16, 16],
            [1, "size_height", "size_width", 16],
        ),
    ],
    ids=["relu", "transpose", "transpose-channels-as-wide"],
)
def test_downstream_dims_are_renamed_where_the_resize_output_declares_no_shape(
    after: list[onnx.NodeProto], declared: list[int], renamed: list[Any]
) -> None:
    """A file from elsewhere declares no shape for the Resize's output: its old 16x16 comes from shape
    inference, and the graph output computed from it (through a Transpose too) does not keep a stale 16x16."""
    channels = declared[1] if after[0].op_type == "Relu" else declared[3]
    original = make_model(
        [helper.make_node("Resize", ["X", "", "sc"], ["r"], mode="cubic", name="rs"), *after],
        [("X", TensorProto.FLOAT, [1, channels, 8, 8])],
        [("Y", TensorProto.FLOAT, declared)],
        initializers=[("sc", np.array([1, 1, 2, 2], np.float32))],
    )
    assert not original.graph.value_info
    report = rewrite_model(original, ["resize-cubic-to-dynamic-resize"], {"size_input": "size"})
    output = report.model.graph.output[0]
    assert [d.dim_param or d.dim_value for d in output.type.tensor_type.shape.dim] == renamed
    x = RNG.standard_normal((1, channels, 8, 8)).astype(np.float32)
    (expected,) = run_ort(original, {"X": x})
    (got,) = run_rewritten(report.model, {"X": x, "size": np.zeros((1, 1, 16, 16), np.float32)})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    (other,) = run_rewritten(report.model, {"X": x, "size": np.zeros((1, 1, 10, 12), np.float32)})
    assert [d if isinstance(d, int) else other.shape[k] for k, d in enumerate(renamed)] == list(other.shape)
    assert other.shape[renamed.index("size_height")] == 10 and other.shape[renamed.index("size_width")] == 12


def _loop_model_without_output_shape() -> onnx.ModelProto:
    """X -> Resize(linear, scales from Constant nodes) -> r; Loop(trip) sums r each turn into Z, a graph
    output declared without a shape, which ONNX Runtime runs and the ONNX checker refuses."""
    scalar = []
    body = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["r"], ["s"], keepdims=0),
            helper.make_node("Add", ["acc", "s"], ["acc_out"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, scalar),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, scalar),
            helper.make_tensor_value_info("acc", TensorProto.FLOAT, scalar),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, scalar),
            helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, scalar),
        ],
    )
    nodes = [
        helper.make_node(
            "Constant", [], ["k"], value=onnx.numpy_helper.from_array(np.array([1, 1, 1.5, 2], np.float32))
        ),
        helper.make_node("Constant", [], ["one"], value=onnx.numpy_helper.from_array(np.ones(4, np.float32))),
        helper.make_node("Mul", ["k", "one"], ["sc"]),
        helper.make_node("Resize", ["X", "", "sc"], ["r"], mode="linear", name="rs"),
        helper.make_node("Loop", ["trip", "", "acc0"], ["Z"], body=body, name="loop"),
    ]
    model = make_model(
        nodes,
        [("X", TensorProto.FLOAT, ["N", 2, "H", "W"]), ("trip", TensorProto.INT64, [])],
        [("Z", TensorProto.FLOAT, [])],
        initializers=[("acc0", np.array(0, np.float32))],
    )
    model.graph.output[0].type.tensor_type.ClearField("shape")
    return model


@pytest.mark.parametrize("checked", ["in-memory", "through-files"])
def test_a_graph_output_the_input_declares_without_a_shape_is_not_refused(
    checked: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checker requires a shape for every graph output, ONNX Runtime does not: an output the input
    already declared without one (and inference gives none) does not refuse the rewrite, and stays so."""
    from opbridge.graph import rewrite as rewrite_module

    if checked == "through-files":
        monkeypatch.setattr(rewrite_module, "CHECK_AS_FILES_BYTES", 0)
    original = _loop_model_without_output_shape()
    with pytest.raises(onnx.checker.ValidationError, match="Field 'shape' of 'type' is required"):
        onnx.checker.check_model(original)
    report = rewrite_model(original, ["fold-resize-scales"])
    assert report.changed and [i.name for i in report.model.graph.initializer] == ["acc0", "rs_scales"]
    assert [o.name for o in report.model.graph.output] == ["Z"]
    assert not report.model.graph.output[0].type.tensor_type.HasField("shape")
    feeds = {"X": RNG.standard_normal((1, 2, 3, 4)).astype(np.float32), "trip": np.array(3, np.int64)}
    np.testing.assert_allclose(run_ort(report.model, feeds)[0], run_ort(original, feeds)[0], rtol=1e-6, atol=1e-6)


def test_a_graph_output_the_rewrite_leaves_without_a_shape_is_named() -> None:
    """Where the result itself has a graph output without a shape, the refusal names it."""
    from opbridge.graph.rewrite import check_rewritten

    model = custom_node_model()
    model.graph.output[0].type.tensor_type.ClearField("shape")
    with pytest.raises(
        RewriteError, match=r"graph output\(s\) \['y'\] declare no shape, which the input model declared"
    ):
        check_rewritten(model)
    check_rewritten(model, shapeless=["y"])  # one the input model already had


def _ir3(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` at IR version 3, where every initializer is also a graph input."""
    model.ir_version = 3
    for t in model.graph.initializer:
        model.graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return model


@pytest.mark.parametrize(
    ("model", "rule"),
    [
        (
            lambda: resize_model("cubic", scales="sizes-runtime", shape=(1, 2, "H", "W")),
            "resize-cubic-to-dynamic-resize",
        ),
        (lambda: resize_model("linear", scales="folded-chain", shape=(1, 2, "H", "W")), "fold-resize-scales"),
    ],
    ids=["dynamic-resize", "fold"],
)
def test_initializers_a_rule_adds_to_an_ir3_model_are_graph_inputs(model: Any, rule: str) -> None:
    """IR version 3 requires every initializer to be a graph input: those a rule adds are, and the
    result runs in ONNX Runtime with the original's outputs."""
    original = _ir3(model())
    report = rewrite_model(original, [rule])
    assert report.changed and report.model.ir_version == 3
    added = {t.name for t in report.model.graph.initializer} - {t.name for t in original.graph.initializer}
    assert added and added <= {i.name for i in report.model.graph.input}
    full_check(report.model)
    x = RNG.standard_normal((1, 2, 5, 7)).astype(np.float32)
    np.testing.assert_allclose(run_ort(report.model, {"X": x})[0], run_ort(original, {"X": x})[0], rtol=1e-6, atol=1e-6)


def test_in_place_rewrite_refuses_a_data_file_another_model_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two models keeping their weights in one data file: an in-place rewrite of one replaced the file
    with its own tensors, and the other then ran on them (no error)."""
    from onnx.external_data_helper import set_external_data

    a, b = np.full(256, 1.0, np.float32), np.full(256, 2.0, np.float32)
    (tmp_path / "weights.bin").write_bytes(b.tobytes() + a.tobytes())

    def model(nodes: list[onnx.NodeProto], name: str, offset: int) -> onnx.ModelProto:
        built = make_model(nodes, [("x", TensorProto.FLOAT, [256])], [("y", TensorProto.FLOAT, [256])])
        weight = built.graph.initializer.add()
        weight.name, weight.data_type = name, TensorProto.FLOAT
        weight.dims.append(256)
        weight.raw_data = b"\0" * 1024  # (replaced by the reference to the shared file)
        set_external_data(weight, location="weights.bin", offset=offset, length=1024)
        weight.ClearField("raw_data")
        weight.data_location = TensorProto.EXTERNAL
        return built

    onnx.save(
        model([helper.make_node("Add", ["x", "A"], ["a"]), helper.make_node("MYSELU", ["a"], ["y"])], "A", 1024),
        tmp_path / "a.onnx",
    )
    onnx.save(model([helper.make_node("Add", ["x", "B"], ["y"])], "B", 0), tmp_path / "b.onnx")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert main(["rewrite", str(tmp_path / "a.onnx"), "--in-place", "--rule", "legacy-domain"]) == 2
    err = capsys.readouterr().err
    assert "weights.bin is also the data file of" in err and "b.onnx" in err and "write the result elsewhere" in err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    (y,) = ort.InferenceSession(str(tmp_path / "b.onnx")).run(None, {"x": np.zeros(256, np.float32)})
    np.testing.assert_array_equal(y, b)


@pytest.mark.parametrize("how", ["in-place-two-data-files", "output-of-a-shared-file"])
def test_a_rewrite_never_replaces_a_data_file_another_model_reads(
    tmp_path: Path, how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The refusal above held for a model with one data file only: with tensors in two files, an in-place
    rewrite replaced ``<model>.data`` that another model read; ``-o OUT`` replaced ``OUT.data`` that
    another model read besides the one at OUT."""
    from onnx.external_data_helper import set_external_data

    def weight(name: str, values: np.ndarray, location: str, offset: int) -> onnx.TensorProto:
        tensor = numpy_helper.from_array(values, name)
        set_external_data(tensor, location=location, offset=offset, length=values.nbytes)
        tensor.ClearField("raw_data")
        tensor.data_location = TensorProto.EXTERNAL
        return tensor

    def model(names: list[str], locations: list[tuple[str, int]]) -> onnx.ModelProto:
        nodes = [helper.make_node("Add", ["x", names[0]], ["a"])]
        nodes += [helper.make_node("Add", ["a", n], [f"a{i}"]) for i, n in enumerate(names[1:])]
        nodes.append(helper.make_node("MYSELU", [nodes[-1].output[0]], ["y"]))
        built = make_model(nodes, [("x", TensorProto.FLOAT, [256])], [("y", TensorProto.FLOAT, [256])])
        for n, (location, offset) in zip(names, locations):
            built.graph.initializer.append(weight(n, np.full(256, 1.0, np.float32), location, offset))
        return built

    values = np.arange(512, dtype=np.float32)
    (tmp_path / "m.onnx.data").write_bytes(values.tobytes())
    (tmp_path / "extra.bin").write_bytes(values[:256].tobytes())
    if how == "in-place-two-data-files":  # m.onnx reads m.onnx.data and extra.bin; other.onnx m.onnx.data
        onnx.save(model(["A", "W"], [("m.onnx.data", 1024), ("extra.bin", 0)]), tmp_path / "m.onnx")
        argv = ["rewrite", str(tmp_path / "m.onnx"), "--in-place", "--rule", "legacy-domain"]
        said = "an in-place rewrite of m.onnx would replace it"
    else:  # out.onnx and other.onnx both read out.onnx.data; the input m.onnx has a file of its own
        (tmp_path / "out.onnx.data").write_bytes(values.tobytes())
        onnx.save(model(["A"], [("out.onnx.data", 0)]), tmp_path / "out.onnx")
        onnx.save(model(["A"], [("extra.bin", 0)]), tmp_path / "m.onnx")
        argv = ["rewrite", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "out.onnx"), "--rule", "legacy-domain"]
        said = "writing out.onnx would replace it"
    shared = "m.onnx.data" if how == "in-place-two-data-files" else "out.onnx.data"
    onnx.save(model(["A"], [(shared, 0)]), tmp_path / "other.onnx")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{shared} is also the data file of" in err and "other.onnx" in err and said in err, err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_legacy_domain_moves_a_local_function_of_the_default_domain() -> None:
    """A model-local function in the default domain is refused by the checker and ONNX Runtime: the rule
    said there was no custom op in the default domain."""
    neg = helper.make_function(
        "", "MyNeg", ["x"], ["y"], [helper.make_node("Neg", ["x"], ["y"])], [helper.make_opsetid("", OPSET)]
    )
    model = make_model(
        [helper.make_node("MyNeg", ["x"], ["y"], name="call")],
        [("x", TensorProto.FLOAT, [2])],
        [("y", TensorProto.FLOAT, [2])],
        functions=[neg],
    )
    report = rewrite_model(model, "legacy-domain")
    assert [o.node for o in report.outcomes if o.applied] == ["function MyNeg"]
    assert {(f.domain, f.name) for f in report.model.functions} == {("opbridge.legacy", "MyNeg")}
    (y,) = ort.InferenceSession(report.model.SerializeToString()).run(None, {"x": np.array([1, -2], np.float32)})
    np.testing.assert_array_equal(y, np.array([-1, 2], np.float32))


def test_a_sparse_initializer_the_checker_refuses_is_named_with_the_fix(tmp_path: Path) -> None:
    """legacy-domain on a model whose Add reads a sparse initializer: the checker's "unsupported type:
    sparse_tensor(float)" came alone, naming neither the initializer nor what to do."""
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "sp"),
        numpy_helper.from_array(np.array([0, 3], np.int64), "idx"),
        [4],
    )
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "sp"], ["y"]), helper.make_node("MYOP", ["y"], ["z"], name="legacy")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [4])],
        sparse_initializer=[sparse],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    with pytest.raises(opbridge.OpbridgeError, match=r"the sparse initializer\(s\) \['sp'\].* make them dense"):
        rewrite_model(model, ["legacy-domain"])


def test_replace_op_skips_a_version_the_functions_import_another_of() -> None:
    """The model does not import 'acme'; its function F does, at version 2: mapping to acme::MyRelu (version 1)
    wrote a model importing acme at 1 while F imports it at 2, which opbridge's session and ONNX Runtime refuse."""
    body = [helper.make_node("Neg", ["x"], ["y"])]
    g = helper.make_function("acme", "G", ["x"], ["y"], body, [helper.make_opsetid("", OPSET)])
    f = helper.make_function(
        "fdom",
        "F",
        ["x"],
        ["y"],
        [helper.make_node("G", ["x"], ["y"], domain="acme")],
        [helper.make_opsetid("", OPSET), helper.make_opsetid("acme", 2)],
    )
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["a"], name="relu"), helper.make_node("F", ["a"], ["y"], domain="fdom")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid("fdom", 1)]
    model = helper.make_model(graph, opset_imports=opsets, functions=[f, g])
    report = rewrite_model(model, ["replace-op"], {"map": ["Relu=acme::MyRelu"]})
    assert not report.changed
    assert "function(s) fdom::F import domain 'acme' at version 2; the new op is version 1" in str(report)
    report = rewrite_model(model, ["replace-op"], {"map": ["Relu=acme::MyRelu"], "version": 2})
    assert report.changed and [n.op_type for n in report.model.graph.node] == ["MyRelu", "F"]


def test_replace_op_without_a_map_names_both_forms() -> None:
    """The refusal named the command-line flag alone, where a Python caller passes options={"map": [...]}."""
    with pytest.raises(opbridge.OpbridgeError, match=r'needs --map Old=domain::New \(in Python: options=\{"map": '):
        rewrite_model(custom_node_model("OldSwish", "legacy"), ["replace-op"])
