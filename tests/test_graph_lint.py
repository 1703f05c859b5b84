"""opbridge lint: each finding has a model that triggers it and one that does not."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Literal

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from _graph_models import (
    OPSET,
    custom_node_model,
    export_seed003,
    make_model,
    resize_model,
    seed003_srcnn,
    swish_function,
)
from onnx import TensorProto, helper, numpy_helper

import opbridge
from opbridge.cli import main
from opbridge.export import CapturedWarning
from opbridge.graph import has_errors, lint_model
from opbridge.graph.lint import LINT_CODES

TRACER = CapturedWarning(
    "TracerWarning",
    "Converting a tensor to a Python number might cause the trace to be incorrect.",
    "/src/model.py",
    42,
)


def codes(model: onnx.ModelProto, **kw) -> list[str]:
    return [f.code for f in lint_model(model, **kw)]


def _default_domain_model() -> onnx.ModelProto:
    return custom_node_model("MYSELU", "")


def _int64_tensor_attr() -> onnx.ModelProto:
    return custom_node_model("Foo", "acme", table=numpy_helper.from_array(np.array([1, 2], np.int64)))


def _float_tensor_attr() -> onnx.ModelProto:
    return custom_node_model("Foo", "acme", table=numpy_helper.from_array(np.array([1, 2], np.float32)))


_NEWEST = onnx.defs.onnx_opset_version()


def _named_twice(name: str) -> onnx.ModelProto:
    """Two Relu nodes named ``name`` (ONNX Runtime refuses two of one name; two without are fine)."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name=name), helper.make_node("Relu", ["a"], ["y"], name=name)]
    return make_model(nodes, [("x", TensorProto.FLOAT, [2])], [("y", TensorProto.FLOAT, [2])])


def _relu(opset: int) -> onnx.ModelProto:
    node = helper.make_node("Relu", ["x"], ["y"], name="relu")
    return make_model([node], [("x", TensorProto.FLOAT, [2])], [("y", TensorProto.FLOAT, [2])], opset=opset)


def _calls(body: list[onnx.NodeProto], domains: dict[str, int] | None = None) -> onnx.ModelProto:
    """x -> acme::Outer(x) -> y, where Outer calls acme::Inner, whose body is ``body`` (x -> y)."""
    imports = [helper.make_opsetid("", 17), *(helper.make_opsetid(d, v) for d, v in (domains or {}).items())]
    inner = helper.make_function("acme", "Inner", ["x"], ["y"], body, [*imports, helper.make_opsetid("acme", 1)])
    outer = helper.make_function(
        "acme",
        "Outer",
        ["x"],
        ["y"],
        [helper.make_node("Inner", ["x"], ["y"], domain="acme")],
        imports + [helper.make_opsetid("acme", 1)],
    )
    return make_model(
        [helper.make_node("Outer", ["x"], ["y"], domain="acme", name="outer")],
        [("x", TensorProto.FLOAT, [2])],
        [("y", TensorProto.FLOAT, [2])],
        domains={"acme": 1, **(domains or {})},
        functions=[outer, inner],
    )


def _swish_call(function_opset: int) -> onnx.ModelProto:
    """acme::Swish with its body importing ``function_opset``, in a model of opset ``OPSET``."""
    body = swish_function("acme", "Swish")
    body.opset_import[0].version = function_opset
    return make_model(
        [helper.make_node("Swish", ["x"], ["y"], domain="acme", name="s")],
        [("x", TensorProto.FLOAT, [2])],
        [("y", TensorProto.FLOAT, [2])],
        domains={"acme": 1},
        functions=[body],
    )


# (code, severity, triggering model, clean model)
def _sum_of(*inputs: str) -> onnx.ModelProto:
    return make_model(
        [helper.make_node("Sum", list(inputs), ["y"], name="sum")],
        [("x", TensorProto.FLOAT, [2])],
        [("y", TensorProto.FLOAT, [2])],
    )


def _roi_align(spatial_scale: float, mode: str = "avg") -> onnx.ModelProto:
    """One mmdeploy::MMCVRoiAlign node (opbridge's RoIAlign) with ``spatial_scale`` and ``mode`` as written."""
    node = helper.make_node(
        "MMCVRoiAlign",
        ["f", "r"],
        ["y"],
        domain="mmdeploy",
        name="roi",
        output_height=2,
        output_width=2,
        spatial_scale=spatial_scale,
        sampling_ratio=2,
        mode=mode,
        aligned=1,
    )
    return make_model(
        [node],
        [("f", TensorProto.FLOAT, [1, 4, 8, 8]), ("r", TensorProto.FLOAT, [3, 5])],
        [("y", TensorProto.FLOAT, [3, 4, 2, 2])],
        domains={"mmdeploy": 1},
    )


CASES = [
    ("attribute-type", "warning", lambda: _roi_align(1), lambda: _roi_align(1.0)),
    ("attribute-value", "error", lambda: _roi_align(1.0, "mean"), lambda: _roi_align(1.0, "max")),
    ("custom-op-default-domain", "error", _default_domain_model, lambda: custom_node_model("MYSELU", "legacy")),
    ("domain-without-opset", "error", lambda: custom_node_model(with_import=False), lambda: custom_node_model()),
    (
        "unknown-custom-op",
        "warning",
        lambda: custom_node_model("Unknown", "acme"),
        lambda: make_model(
            [helper.make_node("Swish", ["x"], ["y"], domain="acme", name="s")],
            [("x", TensorProto.FLOAT, [2])],
            [("y", TensorProto.FLOAT, [2])],
            domains={"acme": 1},
            functions=[swish_function("acme", "Swish")],
        ),
    ),
    (
        "frozen-resize-scale",
        "info",
        lambda: resize_model("cubic", scales="initializer"),
        lambda: resize_model("cubic", scales="input"),
    ),
    (
        "trt-int-attr-overflow",
        "warning",
        lambda: custom_node_model(big=2**40),
        lambda: custom_node_model(big=2**31 - 1),
    ),
    ("trt-tensor-attr-dtype", "warning", _int64_tensor_attr, _float_tensor_attr),
    ("duplicate-node-name", "error", lambda: _named_twice("twin"), lambda: _named_twice("")),
    ("omitted-variadic-input", "error", lambda: _sum_of("x", ""), lambda: _sum_of("x", "x")),
    ("opset-too-new", "error", lambda: _relu(_NEWEST + 1), lambda: _relu(_NEWEST)),
    ("function-opset-mismatch", "error", lambda: _swish_call(OPSET - 1), lambda: _swish_call(OPSET)),
]


@pytest.mark.parametrize(("code", "severity", "bad", "good"), CASES, ids=[c[0] for c in CASES])
def test_finding_triggers_and_not(code: str, severity: str, bad, good) -> None:
    findings = [f for f in lint_model(bad()) if f.code == code]
    assert findings, f"{code} not reported"
    assert findings[0].severity == severity
    assert findings[0].node and findings[0].message and findings[0].hint
    assert code not in codes(good())


def test_every_code_is_tested() -> None:
    tested = {c[0] for c in CASES} | {"traced-python-value", "invalid-model"}
    assert tested == set(LINT_CODES)


def test_ints_attribute_overflow_names_the_value() -> None:
    (finding,) = [f for f in lint_model(custom_node_model(dims=[1, -(2**33)])) if f.code == "trt-int-attr-overflow"]
    assert f"INTS attribute 'dims' holds {-(2**33)}, outside int32" in finding.message


def test_linear_resize_with_constant_scales_is_not_flagged_without_export_context() -> None:
    assert "frozen-resize-scale" not in codes(resize_model("linear", scales="initializer"))


def test_tracer_warning_is_reported_against_the_resize_it_froze() -> None:
    (finding,) = [f for f in lint_model(resize_model("linear", scales="constant"), warnings=[TRACER])]
    assert (finding.code, finding.severity, finding.node) == ("frozen-resize-scale", "warning", "resize")
    assert "model.py:42" in finding.message and "[1.0, 1.0, 2.0, 2.0]" in finding.message


def test_tracer_warning_names_the_scales_of_a_resize_10() -> None:
    """Resize-10 takes (X, scales): its frozen scales (input 1) were not seen, read as Resize-11's slots."""
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32))
    model = make_model(
        [
            helper.make_node("Constant", [], ["s"], value=scales, name="scales_const"),
            helper.make_node("Resize", ["X", "s"], ["Y"], mode="linear", name="resize"),
        ],
        [("X", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [("Y", TensorProto.FLOAT, None)],
        opset=10,
    )
    (finding,) = [f for f in lint_model(model, warnings=[TRACER]) if f.code == "frozen-resize-scale"]
    assert "constant scales [1.0, 1.0, 2.0, 2.0]" in finding.message


def test_tracer_warning_without_a_resize_is_kept() -> None:
    (finding,) = [f for f in lint_model(custom_node_model(), warnings=[TRACER]) if f.code == "traced-python-value"]
    assert finding.severity == "warning" and "model.py:42" in finding.message
    assert "traced-python-value" not in codes(custom_node_model())


@opbridge.op("test.lint::OnlyLater", version=2)
def _only_later(x: torch.Tensor) -> torch.Tensor:
    return x


def test_an_op_defined_only_at_a_later_version_is_said_so() -> None:
    """A node of an op this process defines only at a later version than the model imports was reported as
    an op with no definition, with "load the op's definition with --ops" (it was loaded); the sessions'
    error asked for @opbridge.op too."""
    note = (
        "test.lint::OnlyLater is defined here at version 2 only, but the model imports test.lint at opset 1: "
        "export the model again with this definition"
    )
    model = custom_node_model("OnlyLater", "test.lint")
    (finding,) = [f for f in lint_model(model) if f.code == "unknown-custom-op"]
    assert finding.message.startswith(note) and finding.hint.startswith("export the model again")
    with pytest.raises(opbridge.UnknownOpError, match=re.escape(note)):
        opbridge.ReferenceSession(model)


def test_kernel_and_op_cover_custom_nodes() -> None:
    assert "unknown-custom-op" in codes(custom_node_model("LintCovered", "test.lint"))

    @opbridge.kernel("test.lint::LintCovered")
    def _covered(x):
        return x

    assert "unknown-custom-op" not in codes(custom_node_model("LintCovered", "test.lint"))

    @opbridge.op("test.lint::LintSpec")
    def _spec(x: torch.Tensor) -> torch.Tensor:
        return x

    assert "unknown-custom-op" not in codes(custom_node_model("LintSpec", "test.lint"))


def test_cli_exit_codes_and_ops_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad, clean, unknown = tmp_path / "bad.onnx", tmp_path / "clean.onnx", tmp_path / "unknown.onnx"
    onnx.save(_default_domain_model(), bad)
    onnx.save(resize_model("linear"), clean)
    onnx.save(custom_node_model("FromOpsFile", "test.lintcli"), unknown)
    assert main(["lint", str(bad)]) == 1
    out = capsys.readouterr().out
    assert "error: custom-op-default-domain [custom]" in out and "1 error(s)" in out
    assert main(["lint", str(clean), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert main(["lint", str(unknown)]) == 0
    assert "unknown-custom-op" in capsys.readouterr().out
    ops = tmp_path / "my_ops.py"
    ops.write_text(
        "import opbridge\n\n@opbridge.kernel('test.lintcli::FromOpsFile')\ndef k(x):\n    return x\n", encoding="utf-8"
    )
    assert main(["lint", str(unknown), "--ops", str(ops)]) == 0
    assert "unknown-custom-op" not in capsys.readouterr().out
    assert has_errors(lint_model(bad)) and not has_errors(lint_model(clean))


def test_seed003_file_is_flagged(tmp_path: Path) -> None:
    _, path = export_seed003(tmp_path / "srcnn.onnx")
    (finding,) = [f for f in lint_model(path) if f.code == "frozen-resize-scale"]
    assert finding.severity == "info" and "[1.0, 1.0, 3.0, 3.0]" in finding.message


def test_export_runs_lint_with_tracer_warnings(tmp_path: Path) -> None:
    model = seed003_srcnn()
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    result = opbridge.export(
        model,
        (x, torch.tensor([3.0])),
        tmp_path / "srcnn.onnx",
        exporter="torchscript",
        input_names=["input", "factor"],
        output_names=["output"],
    )
    assert any(w.category == "TracerWarning" for w in result.warnings)
    frozen = [f for f in result.findings if f.code == "frozen-resize-scale"]
    assert len(frozen) == 1 and frozen[0].severity == "warning"
    assert "TracerWarning" in frozen[0].message and "Python number" in frozen[0].message
    assert frozen[0].node == next(n.name for n in result.model.graph.node if n.op_type == "Resize")


@pytest.mark.parametrize("defect", ["cycle", "dangling-input", "ir-version", "named-deserializer"])
def test_invalid_model_is_an_error(defect: str) -> None:
    """What every runtime refuses (a cycle, a value nothing produces, an IR version ONNX does not
    know) is an error, where lint reported nothing before; and where the node's name holds "serialize"
    (the checker's message quotes it, and lint took it for the >2 GiB message)."""
    if defect == "named-deserializer":
        nodes = [helper.make_node("Add", ["x", "ghost"], ["y"], name="/deserializer/Add")]
        model = make_model(nodes, [("x", TensorProto.FLOAT, [2])], [("y", TensorProto.FLOAT, [2])])
    elif defect == "cycle":
        nodes = [helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Relu", ["a"], ["b"])]
        model = make_model(nodes, [("x", TensorProto.FLOAT, [2])], [("a", TensorProto.FLOAT, [2])])
    elif defect == "dangling-input":
        nodes = [helper.make_node("Add", ["x", "ghost"], ["y"])]
        model = make_model(nodes, [("x", TensorProto.FLOAT, [2])], [("y", TensorProto.FLOAT, [2])])
    else:
        model = custom_node_model()
        model.ir_version = 99
    (finding,) = [f for f in lint_model(model) if f.code == "invalid-model"]
    assert finding.severity == "error" and finding.message.startswith("onnx.checker refuses the model: ")
    if defect == "dangling-input":  # the checker's message, over several lines, whole (it ended at "of node: ")
        assert "input 'ghost' of node: name: OpType: Add is not output of any previous nodes" in finding.message
    assert "invalid-model" not in codes(custom_node_model())  # a valid model passes


def _dangling_relu_in(where: str) -> onnx.ModelProto:
    """A Relu named "Relu_3" reading a value nothing produces, in the then-branch of If "cond_1" (``if``), of
    If "inner_if" inside that branch (``nested``), or in the body of function acme::F (``function``)."""
    relu = helper.make_node("Relu", ["ghost"], ["t"], name="Relu_3")
    if where == "function":
        body = helper.make_function("acme", "F", ["x"], ["t"], [relu], [helper.make_opsetid("", OPSET)])
        node = helper.make_node("F", ["x"], ["y"], domain="acme", name="call")
        return make_model([node], [("x", TensorProto.FLOAT, [2])], [("y", TensorProto.FLOAT, [2])],
                          domains={"acme": 1}, functions=[body])  # fmt: skip

    def branch(nodes: list[onnx.NodeProto], out: str) -> onnx.GraphProto:
        return helper.make_graph(nodes, "branch", [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, [2])])

    other = branch([helper.make_node("Neg", ["x"], ["e"], name="neg")], "e")
    then = branch([relu], "t")
    if where == "nested":
        then = branch([helper.make_node("If", ["c"], ["t"], then_branch=then, else_branch=other, name="inner_if")], "t")
    node = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="cond_1")
    return make_model(
        [node], [("c", TensorProto.BOOL, []), ("x", TensorProto.FLOAT, [2])], [("y", TensorProto.FLOAT, [2])]
    )


@pytest.mark.parametrize(
    ("where", "label", "place"),
    [
        ("if", "cond_1/then_branch/Relu_3", "(at If node 'cond_1' then_branch > node 'Relu_3')"),
        (
            "nested",
            "cond_1/then_branch/inner_if/then_branch/Relu_3",
            "(at If node 'cond_1' then_branch > If node 'inner_if' then_branch > node 'Relu_3')",
        ),
        ("function", "acme::F/Relu_3", "(at function acme::F > node 'Relu_3')"),
    ],
    ids=["if", "nested", "function"],
)
def test_invalid_model_names_where_a_body_node_lives(where: str, label: str, place: str) -> None:
    """The checker names a subgraph's node by its own name and only the outermost If: the finding named
    "node: name: Relu_3" and "Name: cond_1 OpType: If", not the branch (nor the inner If) that holds it."""
    (finding,) = [f for f in lint_model(_dangling_relu_in(where)) if f.code == "invalid-model"]
    assert "input 'ghost' of node: " in finding.message and finding.message.endswith(place), finding.message
    assert finding.node == label


def test_function_bodies_are_linted() -> None:
    """Nodes inside model-local functions (and functions they call) are checked like the graph's: an op no
    one covers two calls deep, and a default-domain custom op in a body."""
    unknown = _calls([helper.make_node("Baz", ["x"], ["y"], domain="zzz")], {"zzz": 1})
    found = [(f.code, f.node) for f in lint_model(unknown)]
    assert ("unknown-custom-op", "acme::Inner/Baz#0") in found
    legacy = _calls([helper.make_node("MYSELU", ["x"], ["y"])])
    assert ("custom-op-default-domain", "acme::Inner/MYSELU#0") in [(f.code, f.node) for f in lint_model(legacy)]
    clean = _calls([helper.make_node("Relu", ["x"], ["y"])])
    assert not lint_model(clean)


def _default_domain_function() -> onnx.ModelProto:
    neg = helper.make_function(
        "", "MyNeg", ["x"], ["y"], [helper.make_node("Neg", ["x"], ["y"])], [helper.make_opsetid("", 13)]
    )
    graph = helper.make_graph(
        [helper.make_node("MyNeg", ["x"], ["y"], name="call")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], functions=[neg])


def test_a_local_function_in_the_default_domain_is_an_error_the_sessions_run() -> None:
    """The checker, ONNX Runtime and onnx.reference look up no function in the default domain: lint said
    nothing. opbridge's sessions move the function with its calls, as they move default-domain custom ops."""
    from opbridge.reference import ReferenceSession

    model = _default_domain_function()
    assert [(f.code, f.node) for f in lint_model(model)] == [("custom-op-default-domain", "::MyNeg")]
    with pytest.raises(Exception, match="No Op registered for MyNeg"):
        ort.InferenceSession(model.SerializeToString())
    x = np.array([1.5, -2.0], np.float32)
    for session in (opbridge.InferenceSession(model), ReferenceSession(model)):
        np.testing.assert_array_equal(session.run(None, {"x": x})[0], -x)


def test_an_onnx_op_of_a_later_opset_is_a_custom_node_of_an_older_model() -> None:
    """Gelu is ONNX's from opset 20 on: at opset 11 it is a custom op (a TorchScript-era g.op("Gelu")), which
    the sessions move and run with its kernel; inspect counted it as a standard op."""
    from opbridge.graph import inspect_model

    def gelu(opset: int) -> onnx.ModelProto:
        graph = helper.make_graph(
            [helper.make_node("Gelu", ["x"], ["y"], name="g")],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])

    assert [n.op_type for n in inspect_model(gelu(11)).custom_nodes] == ["Gelu"]
    assert inspect_model(gelu(20)).custom_nodes == []
    (finding,) = lint_model(gelu(11))
    assert finding.code == "invalid-model" and "--rule legacy-domain" in finding.hint, finding
    assert finding.node == "g"
    assert not lint_model(gelu(20))


def test_onnxruntime_contrib_ops_are_known() -> None:
    """com.microsoft ops run in ONNX Runtime without a plugin: not an unknown op."""
    node = helper.make_node("FusedMatMul", ["x", "x"], ["y"], domain="com.microsoft", name="fmm")
    model = make_model(
        [node], [("x", TensorProto.FLOAT, [2, 2])], [("y", TensorProto.FLOAT, [2, 2])], domains={"com.microsoft": 1}
    )
    assert "unknown-custom-op" not in codes(model)


def test_a_model_file_is_linted_without_reading_its_weights(tmp_path: Path) -> None:
    """From a file, lint reads the small tensors it evaluates (a Resize's scales) and leaves the weights in
    their data file; the checker checks the file itself. A model of a few GiB took several times its size
    in memory."""
    from opbridge.graph._model import SMALL_TENSOR_BYTES, load_model

    model = resize_model(scales="initializer", scale_values=(1.0, 1.0, 2.0, 2.0))
    big = numpy_helper.from_array(np.ones(SMALL_TENSOR_BYTES // 4 + 1, np.float32), "weights")
    model.graph.initializer.append(big)
    path = tmp_path / "model.onnx"
    onnx.save(
        model, path, save_as_external_data=True, all_tensors_to_one_file=True, location="model.data", size_threshold=0
    )
    loaded = load_model(path, external_data=SMALL_TENSOR_BYTES)
    location = {t.name: t.data_location for t in loaded.graph.initializer}
    assert location == {"scales": TensorProto.DEFAULT, "weights": TensorProto.EXTERNAL}
    assert [f.code for f in lint_model(path)] == [f.code for f in lint_model(onnx.load(path))]
    assert "frozen-resize-scale" in [f.code for f in lint_model(path)]
    # a ModelProto whose data was not read: named as the sessions name it (it was an invalid-model error, and
    # check_compat named a temporary folder of its own)
    unread = onnx.load(path, load_external_data=False)
    for check in (lint_model, lambda m: opbridge.graph.check_compat(m, "tensorrt", real=False)):
        with pytest.raises(
            opbridge.ModelLoadError,
            match=r"the given model keeps tensor 'scales' in the external data file 'model.data'",
        ):
            check(unread)
    (tmp_path / "model.data").unlink()  # the data file gone: the tensors lint reads are named
    with pytest.raises(
        opbridge.ModelLoadError, match=r"tensor 'scales' is kept in .*model.data, which does not hold it"
    ):
        lint_model(path)


@opbridge.kernel("LintLegacyOp", domain="")
def _lint_legacy_op(x: np.ndarray) -> np.ndarray:
    return x * 2


def test_a_node_the_legacy_domain_rewrite_moved_is_covered_by_its_default_domain_kernel() -> None:
    """lint's fix for a default-domain custom node moves it to opbridge.legacy; lint and compat then
    called it unrunnable (and asked for the kernel the user had registered), while every backend runs
    it with that kernel."""
    from opbridge.graph import check_compat, rewrite_model

    moved = rewrite_model(custom_node_model("LintLegacyOp", ""), ["legacy-domain"]).model
    assert {n.domain for n in moved.graph.node if n.op_type == "LintLegacyOp"} == {"opbridge.legacy"}
    assert "unknown-custom-op" not in codes(moved)
    (verdict,) = [n for n in check_compat(moved, "onnxruntime", real=False).nodes if n.op_type == "LintLegacyOp"]
    assert verdict.verdict == "opbridge"
    moved.graph.node[1].op_type = "LintLegacyOther"  # no kernel anywhere: still unknown
    assert "unknown-custom-op" in codes(moved)


def _relu_function_call(function_imports: list[tuple[str, int]]) -> onnx.ModelProto:
    """acme::Outer (a Relu body importing ``function_imports``) in a model of opset ``OPSET``."""
    body = helper.make_function(
        "acme",
        "Outer",
        ["a"],
        ["b"],
        [helper.make_node("Relu", ["a"], ["b"])],
        [helper.make_opsetid(*i) for i in function_imports],
    )
    return make_model(
        [helper.make_node("Outer", ["x"], ["y"], domain="acme", name="o")],
        [("x", TensorProto.FLOAT, [2])],
        [("y", TensorProto.FLOAT, [2])],
        domains={"acme": 1},
        functions=[body],
    )


def test_a_function_without_an_onnx_import_gets_one_finding_and_the_models_opset_as_fix() -> None:
    """The fix said version 1 for ONNX's domain (following it gave two new errors), and the checker's own
    message for the same problem came as a second finding."""
    found = lint_model(_relu_function_call([]))
    assert [f.code for f in found] == ["domain-without-opset"], found
    assert f"add opset_import {{domain: '', version: {OPSET}}} to function acme::Outer" in found[0].hint
    old_relu = lint_model(_relu_function_call([("", 1)]))  # (Relu changed since opset 1: the checker refuses)
    assert [f.code for f in old_relu] == ["function-opset-mismatch"], old_relu
    assert "the checker refuses it only where an op of the body changed" in old_relu[0].message


def test_a_sparse_initializer_that_onnx_runtime_runs_is_a_warning() -> None:
    """onnx's shape inference types a sparse initializer as sparse_tensor and the checker refuses the model,
    which ONNX Runtime runs: an error said "runtimes refuse what the checker refuses"."""
    values = numpy_helper.from_array(np.array([1.0], np.float32), "sp")
    sparse = helper.make_sparse_tensor(values, numpy_helper.from_array(np.array([1], np.int64), "spi"), [2])
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "sp"], ["y"], name="a")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        sparse_initializer=[sparse],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    got = ort.InferenceSession(model.SerializeToString()).run(None, {"x": np.zeros(2, np.float32)})[0]
    np.testing.assert_array_equal(got, [0.0, 1.0])
    (finding,) = lint_model(model)
    assert (finding.severity, finding.code) == ("warning", "invalid-model") and "sparse_tensor" in finding.message
    assert not has_errors([finding])


def _unshaped_output_model(node: onnx.NodeProto, ir_version: int | None = None) -> onnx.ModelProto:
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    if ir_version is not None:
        model.ir_version = ir_version
    return model


@pytest.mark.parametrize(
    ("node", "ir_version", "message"),
    [
        (helper.make_node("Add", ["x", "ghost"], ["y"], name="add"), None, r"input 'ghost' of node: name: add"),
        (helper.make_node("Relu", ["x"], ["y"], name="r"), 1, r"IR version < 3 cannot have opset_import specified"),
    ],
    ids=["undefined-input", "ir-version-1"],
)
def test_an_output_without_a_shape_hides_no_other_checker_error(
    node: onnx.NodeProto, ir_version: int | None, message: str
) -> None:
    """The checker stops at its first error, and its demand for a shape on a graph output (which ONNX
    Runtime does not make, and lint leaves alone) came first: a model reading an undefined value was
    clean. An IR version before 3 with opset imports was taken for a missing import and left out."""
    findings = [f for f in lint_model(_unshaped_output_model(node, ir_version)) if f.code == "invalid-model"]
    assert len(findings) == 1 and findings[0].severity == "error"
    assert re.search(message, findings[0].message), findings[0].message
    assert codes(_unshaped_output_model(helper.make_node("Relu", ["x"], ["y"], name="r"))) == []


def test_an_initializer_of_an_unknown_data_type_is_an_error() -> None:
    """The checker let a tensor of data type 999 pass, and lint with it; ONNX Runtime refuses the model."""
    tensor = TensorProto(name="u", data_type=999, dims=[3], raw_data=b"abc")
    model = make_model(
        [helper.make_node("Relu", ["x"], ["y"])], [("x", TensorProto.FLOAT, [2])], [("y", TensorProto.FLOAT, [2])]
    )
    model.graph.initializer.append(tensor)
    with pytest.raises(Exception, match="valid data type"):
        ort.InferenceSession(model.SerializeToString())
    (finding,) = lint_model(model)
    assert (finding.severity, finding.code, finding.node) == ("error", "invalid-model", "u")
    assert "has data type 999, which ONNX does not define" in finding.message


def test_a_variadic_input_left_out_is_an_error() -> None:
    """Sum(x, "") passes onnx.checker and ends ONNX Runtime's process: lint said nothing, in the graph or
    in a function body that reads an optional input a call leaves out."""
    value = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [2])  # noqa: E731
    plain = helper.make_graph([helper.make_node("Sum", ["x", ""], ["y"], name="s")], "g", [value("x")], [value("y")])
    body = helper.make_function(
        "acme", "Add2", ["a", "b"], ["c"], [helper.make_node("Sum", ["a", "b"], ["c"])], [helper.make_opsetid("", 18)]
    )
    call = helper.make_graph(
        [helper.make_node("Add2", ["x", ""], ["y"], domain="acme")], "g", [value("x")], [value("y")]
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("acme", 1)]
    for model, message in [
        (
            helper.make_model(plain, opset_imports=opsets[:1]),
            "Sum node 's' leaves out its input 1, one of its variadic",
        ),
        (
            helper.make_model(call, opset_imports=opsets, functions=[body]),
            "Sum node 'acme::Add2/Sum#0' leaves out its input 1, one of its variadic 'data_0', which cannot be left "
            "out where 'Add2#0' calls acme::Add2 without its input 'b'",
        ),
    ]:
        (finding,) = [f for f in lint_model(model) if f.code == "omitted-variadic-input"]
        assert finding.severity == "error" and finding.message.startswith(message), finding.message


def test_a_variadic_input_left_out_is_named_by_its_label() -> None:
    """The finding named a node by its name or op type as onnx's inliner left it: two unnamed Sum nodes were
    both "Sum", a node of an If branch had its bare name, and a body node a name the inliner made up."""
    value = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [2])  # noqa: E731
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("acme", 1)]
    then_branch = helper.make_graph([helper.make_node("Sum", ["x", ""], ["t"], name="s")], "then", [], [value("t")])
    else_branch = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [], [value("e")])
    inner = helper.make_function(
        "acme", "Inner", ["p", "q"], ["r"], [helper.make_node("Sum", ["p", "q"], ["r"])], opsets[:1]
    )
    outer = helper.make_function(
        "acme",
        "Outer",
        ["a", "b"],
        ["c"],
        [helper.make_node("Inner", ["a", "b"], ["c"], domain="acme", name="in")],
        opsets,
    )
    nodes = [
        helper.make_node("Sum", ["x", "x"], ["a"]),
        helper.make_node("Sum", ["a", ""], ["y0"]),
        helper.make_node("If", ["c"], ["y1"], name="cond", then_branch=then_branch, else_branch=else_branch),
        helper.make_node("Outer", ["x"], ["y2"], domain="acme", name="call"),
        helper.make_node("Outer", ["x", "x"], ["y3"], domain="acme", name="full"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [value("x"), helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [value(f"y{i}") for i in range(4)],
    )
    model = helper.make_model(graph, opset_imports=opsets, functions=[outer, inner])
    found = {f.node: f.message for f in lint_model(model) if f.code == "omitted-variadic-input"}
    assert set(found) == {"Sum#1", "cond/then_branch/s", "acme::Inner/Sum#0"}, found
    assert "where 'acme::Outer/in' calls acme::Inner without its input 'q'" in found["acme::Inner/Sum#0"]


def test_an_int_attribute_where_the_op_declares_float_is_a_warning_the_backends_run() -> None:
    """MMDeploy's hand-made files hold spatial_scale=1 (INT) where the op declares FLOAT: the checker refuses
    it, opbridge's sessions take it as 1.0. lint called it an invalid model, an error, and the checker's
    refusal hid every error after it."""
    from opbridge.reference import ReferenceSession

    model = _roi_align(1)
    (finding,) = lint_model(model)
    assert (finding.severity, finding.code, finding.node) == ("warning", "attribute-type", "roi")
    assert "'spatial_scale' of mmdeploy::MMCVRoiAlign is INT where the op declares FLOAT" in finding.message
    assert "float(value)" in finding.hint
    rng = np.random.default_rng(0)
    feeds = {"f": rng.random((1, 4, 8, 8), np.float32), "r": np.array([[0, 1, 1, 5, 5]] * 3, np.float32)}
    expected = opbridge.InferenceSession(_roi_align(1.0)).run(None, feeds)[0]
    for session in (opbridge.InferenceSession(model), ReferenceSession(model)):
        np.testing.assert_allclose(session.run(None, feeds)[0], expected, rtol=1e-6, atol=1e-6)
    model.graph.node.append(helper.make_node("Add", ["y", "ghost"], ["z"], name="add"))
    model.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [3, 4, 2, 2]))
    errors = [f for f in lint_model(model) if f.severity == "error"]
    assert [f.code for f in errors] == ["invalid-model"] and "'ghost'" in errors[0].message, errors


@opbridge.op("tests.lint.choices::Pick")
def _pick(x: torch.Tensor, rows: list[Literal[0, 1]] = [0]) -> torch.Tensor:  # noqa: B006
    return x[list(rows)]


def test_an_attribute_value_the_op_does_not_take_is_an_error_where_a_call_binds_it() -> None:
    """mode="mean" where MMCVRoiAlign takes "avg" or "max" passed lint (and compat): the checker knows no
    choices, and the backends refused it only when they ran the node. A body's node taking the value from
    its call is named with the call that binds it; a list attribute names the element."""
    body = [helper.make_node("MMCVRoiAlign", ["f", "r"], ["y"], domain="mmdeploy", name="roi")]
    body[0].attribute.append(helper.make_attribute_ref("mode", onnx.AttributeProto.STRING))
    imports = [helper.make_opsetid("", OPSET), helper.make_opsetid("mmdeploy", 1)]
    wrap = helper.make_function("acme", "Wrap", ["f", "r"], ["y"], body, imports, attributes=["mode"])
    calls = [
        helper.make_node("Wrap", ["f", "r"], ["y1"], domain="acme", name="good", mode="max"),
        helper.make_node("Wrap", ["f", "r"], ["y2"], domain="acme", name="bad", mode="mean"),
        helper.make_node("Pick", ["f"], ["y3"], domain="tests.lint.choices", name="pick", rows=[1, 2]),
    ]
    model = make_model(
        calls,
        [("f", TensorProto.FLOAT, [1, 4, 8, 8]), ("r", TensorProto.FLOAT, [3, 5])],
        [(f"y{i}", TensorProto.FLOAT, None) for i in (1, 2, 3)],
        domains={"acme": 1, "mmdeploy": 1, "tests.lint.choices": 1},
        functions=[wrap],
    )
    found = {f.node: f for f in lint_model(model) if f.code == "attribute-value"}
    assert set(found) == {"acme::Wrap/roi", "pick"}, found
    assert found["acme::Wrap/roi"].severity == "error"
    assert (
        "attribute 'mode' of mmdeploy::MMCVRoiAlign is 'mean' (from call bad) where the op takes ['avg', 'max']"
        in found["acme::Wrap/roi"].message
    )
    assert "attribute 'rows' of tests.lint.choices::Pick is [1, 2], holding 2, where the op takes [0, 1]" in (
        found["pick"].message
    )


@opbridge.kernel("test.lint.body::Negate")
def _lint_negate(x: np.ndarray) -> np.ndarray:
    return -x


def _call_of_a_custom_body(after: str) -> onnx.ModelProto:
    """x -> acme::F (a body of one test.lint.body::Negate node, a kernel without a schema) -> c -> Relu -> y,
    then a Relu reading ``after`` where given."""
    imports = [helper.make_opsetid("", OPSET), helper.make_opsetid("test.lint.body", 1)]
    body = helper.make_function(
        "acme", "F", ["x"], ["y"], [helper.make_node("Negate", ["x"], ["y"], domain="test.lint.body")], imports
    )
    nodes = [
        helper.make_node("F", ["x"], ["c"], domain="acme", name="f"),
        helper.make_node("Relu", ["c"], ["y"], name="r"),
    ]
    if after:
        nodes.append(helper.make_node("Relu", [after], ["z"], name="late"))
    outputs = [("y", TensorProto.FLOAT, [2])] + ([("z", TensorProto.FLOAT, [2])] if after else [])
    return make_model(
        nodes, [("x", TensorProto.FLOAT, [2])], outputs, domains={"acme": 1, "test.lint.body": 1}, functions=[body]
    )


def test_a_standard_op_reading_a_call_of_a_body_with_a_custom_node_is_valid() -> None:
    """The checker types the output of a call whose body holds a custom node "null", and refuses a Relu
    reading it (a custom node outside a body leaves its output untyped, which it takes): lint called the
    model invalid, and it runs. An error after that node is still found."""
    model = _call_of_a_custom_body("")
    assert codes(model) == []
    x = np.array([1.5, -2.0], np.float32)
    np.testing.assert_array_equal(opbridge.InferenceSession(model).run(None, {"x": x})[0], np.maximum(-x, 0))
    findings = [f for f in lint_model(_call_of_a_custom_body("ghost")) if f.code == "invalid-model"]
    assert len(findings) == 1 and "input 'ghost' of node: name: late" in findings[0].message, findings


@pytest.mark.parametrize(
    ("domain", "op_type", "version", "code", "runs"),
    [
        ("ai.onnx.ml", "Foo", 3, "custom-op-default-domain", False),
        ("ai.onnx.preview", "Foo", 1, "custom-op-default-domain", False),
        ("ai.onnx.preview.training", "Foo", 1, "custom-op-default-domain", False),
        ("ai.onnx.ml", "TreeEnsemble", 3, "invalid-model", False),
        ("ai.onnx.ml", "Binarizer", 3, None, True),
        ("ai.onnx.ml", "Binarizer", 99, "opset-too-new", False),
    ],
    ids=["ml-unknown", "preview-unknown", "training-unknown", "ml-later-opset", "ml-known", "ml-opset-too-new"],
)
def test_onnx_own_domains_hold_only_onnx_ops(
    domain: str, op_type: str, version: int, code: str | None, runs: bool
) -> None:
    """Ops ONNX does not define in ai.onnx.ml and the preview domains, and ops of a later ai.onnx.ml opset,
    passed lint (the checker skips the preview domains; lint dropped its "No Op registered" as a custom op's
    and looked for later opsets in the default domain only); ONNX Runtime refuses all of them."""
    node = helper.make_node(op_type, ["x"], ["y"], domain=domain, name="n")
    model = make_model(
        [node], [("x", TensorProto.FLOAT, [2])], [("y", TensorProto.FLOAT, [2])], domains={domain: version}
    )
    found = lint_model(model)
    if code is None:
        assert found == []
    else:
        assert [(f.severity, f.code) for f in found] == [("error", code)], found
        assert found[0].node == ("opset_import ai.onnx.ml" if code == "opset-too-new" else "n") and found[0].hint
    if runs:
        ort.InferenceSession(model.SerializeToString())
    else:
        state = ort.capi.onnxruntime_pybind11_state
        with pytest.raises((state.Fail, state.InvalidGraph)):
            ort.InferenceSession(model.SerializeToString())


def test_resize_scales_frozen_in_a_branch_or_a_function_body_are_named_there() -> None:
    """frozen-resize-scale looked at the main graph's Resize nodes only; its hint named scale_input for
    frozen sizes (size_input takes them) and the cubic-only rewrite for a nearest Resize."""
    x4 = [1, 1, 4, 4]

    def const(name: str, values: list[float], dtype: type) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(values, dtype)))

    def resize(mode: str, scales: bool, name: str) -> onnx.NodeProto:
        return helper.make_node("Resize", ["x", "", *(["sc"] if scales else ["", "sz"])], [name], name=name, mode=mode)

    then_branch = helper.make_graph(
        [const("sc", [1, 1, 2, 2], np.float32), resize("cubic", True, "up")],
        "then",
        [],
        [helper.make_tensor_value_info("up", TensorProto.FLOAT, None)],
    )
    else_branch = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)],
    )
    body = helper.make_function(
        "acme",
        "Up",
        ["x"],
        ["out"],
        [const("sz", [1, 1, 8, 8], np.int64), resize("cubic", False, "out")],
        [helper.make_opsetid("", OPSET)],
    )
    nodes = [
        helper.make_node("If", ["c"], ["y1"], name="cond", then_branch=then_branch, else_branch=else_branch),
        helper.make_node("Up", ["x"], ["y2"], domain="acme", name="call"),
        const("sc", [1, 1, 2, 2], np.float32),
        resize("nearest", True, "near"),
    ]
    model = make_model(
        nodes,
        [("x", TensorProto.FLOAT, x4), ("c", TensorProto.BOOL, [])],
        [("y1", TensorProto.FLOAT, None), ("y2", TensorProto.FLOAT, None), ("near", TensorProto.FLOAT, None)],
        domains={"acme": 1},
        functions=[body],
    )
    info = {f.node: f.hint for f in lint_model(model) if f.code == "frozen-resize-scale"}
    assert set(info) == {"cond/then_branch/up", "acme::Up/out"}  # (no info for a nearest Resize)
    assert "--option scale_input=NAME (or size_input=NAME)" in info["cond/then_branch/up"]
    assert "rewrite" not in info["acme::Up/out"]  # (rewrite rules do not enter function bodies)
    warned = {f.node: f for f in lint_model(model, warnings=[TRACER]) if f.code == "frozen-resize-scale"}
    assert set(warned) == {"cond/then_branch/up", "acme::Up/out", "near"}
    assert "constant sizes [1, 1, 8, 8]" in warned["acme::Up/out"].message
    assert "rewrite" not in warned["near"].hint and "keep the scale a tensor" in warned["near"].hint
    flat = resize_model("cubic", scales="initializer")
    sizes = flat.graph.node[-1]
    del sizes.input[2:]
    sizes.input.extend(["", "sizes"])
    flat.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.array([1, 3, 8, 8], np.int64), "sizes"))
    (finding,) = [f for f in lint_model(flat) if f.code == "frozen-resize-scale"]
    assert "constant sizes" in finding.message and "--option size_input=NAME" in finding.hint, finding
