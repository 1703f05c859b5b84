"""opbridge compat: each TensorRT rule has a model that triggers it and one that does not; ORT and OpenVINO
verdicts come from the installed runtimes themselves."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from _graph_models import custom_node_model, make_model, resize_model, swish_function
from onnx import TensorProto, helper, numpy_helper

import opbridge
from opbridge.cli import main
from opbridge.errors import OpbridgeError
from opbridge.graph import check_compat
from opbridge.graph.compat.tensorrt import TRT_RULES


@opbridge.op("test.compat::Scale")
def compat_scale(x: torch.Tensor, k: float = 2.0) -> torch.Tensor:
    return x * k


def trt(model: onnx.ModelProto, version: str | None = None):
    return check_compat(model, "tensorrt", trt_version=version, real=False)


def verdict(model: onnx.ModelProto, name: str, version: str | None = None):
    return next(n for n in trt(model, version).nodes if n.node == name)


def _function_model(domain: str = "acme") -> onnx.ModelProto:
    return make_model(
        [helper.make_node("MySwish", ["x"], ["y"], domain=domain, name="custom")],
        [("x", TensorProto.FLOAT, [2, 3])],
        [("y", TensorProto.FLOAT, [2, 3])],
        domains={domain: 1},
        functions=[swish_function(domain, "MySwish")],
    )


def _tensor_attr(dtype) -> onnx.ModelProto:
    return custom_node_model(table=numpy_helper.from_array(np.array([1, 0], dtype)))


def _constant(**attrs) -> onnx.ModelProto:
    node = helper.make_node("Constant", [], ["y"], name="const", **attrs)
    elem = TensorProto.STRING if "value_strings" in attrs else TensorProto.FLOAT
    return make_model([node], [], [("y", elem, [2])])


def _nested_function_model(innermost: onnx.NodeProto, domains: dict[str, int]) -> onnx.ModelProto:
    """x -> acme::Outer -> y; Outer calls acme::Inner, whose body is ``innermost``."""
    imports = [helper.make_opsetid("", 17), helper.make_opsetid("acme", 1)]
    inner = helper.make_function(
        "acme", "Inner", ["x"], ["y"], [innermost], imports + [helper.make_opsetid(d, v) for d, v in domains.items()]
    )
    outer = helper.make_function(
        "acme", "Outer", ["x"], ["y"], [helper.make_node("Inner", ["x"], ["y"], domain="acme")], imports
    )
    return make_model(
        [helper.make_node("Outer", ["x"], ["y"], domain="acme", name="outer")],
        [("x", TensorProto.FLOAT, [2])],
        [("y", TensorProto.FLOAT, [2])],
        domains={"acme": 1, **domains},
        functions=[outer, inner],
    )


# (rule code, version, triggering model, node, expected verdict, text in reason, clean model)
TRT_CASES = [
    (
        "trt-resize-cubic-unsupported",
        "8.4",
        lambda: resize_model("cubic"),
        "resize",
        "fail",
        "does not support cubic interpolation",
        lambda: resize_model("linear"),
    ),
    (
        "trt-resize-cubic-outer-dims",
        "10.8",
        lambda: resize_model("cubic", scale_values=(1, 2, 2, 2)),
        "resize",
        "fail",
        "change dims other than the last two",
        lambda: resize_model("cubic", scale_values=(1, 1, 2, 2)),
    ),
    (
        "trt-resize-scales-not-initializer",
        "10.8",
        lambda: resize_model("linear", scales="input"),
        "resize",
        "fail",
        "Resize scales must be an initializer!",
        lambda: resize_model("linear", scales="constant"),
    ),
    (
        "trt-plugin-path",
        "10.10",
        lambda: custom_node_model("Unknown"),
        "custom",
        "fail",
        "creator 'Unknown' version '1' namespace 'acme'",
        lambda: custom_node_model("Relu", ""),
    ),
    (
        "trt-plugin-namespace",
        "10.4",
        lambda: custom_node_model("Unknown"),
        "custom",
        "fail",
        "plugin_namespace='acme'",
        lambda: custom_node_model("Unknown", plugin_namespace="acme"),
    ),
    (
        "trt-plugin-int-narrowing",
        "10.8",
        lambda: custom_node_model(big=2**40),
        "custom",
        "fail",
        "does not fit the int32",
        lambda: custom_node_model(big=2**31 - 1),
    ),
    (
        "trt-plugin-tensor-attr-dtype",
        "10.8",
        lambda: _tensor_attr(np.int64),
        "custom",
        "fail",
        "of int64 is rejected",
        lambda: _tensor_attr(np.int32),
    ),
    (
        "trt-constant-attribute",
        "10.8",
        lambda: _constant(value_strings=["a", "b"]),
        "const",
        "fail",
        "Constant with 'value_strings'",
        lambda: _constant(value_floats=[1.0, 2.0]),
    ),
    (
        "trt-op-type-shadows-importer",
        "10.8",
        lambda: custom_node_model("Resize", "acme"),
        "custom",
        "fail",
        "built-in Resize importer",
        lambda: custom_node_model("ResizeX", "acme"),
    ),
]


@pytest.mark.parametrize(
    ("code", "version", "bad", "node", "expected", "text", "good"), TRT_CASES, ids=[c[0] for c in TRT_CASES]
)
def test_trt_rule_triggers_and_not(code, version, bad, node, expected, text, good) -> None:
    v = verdict(bad(), node, version)
    assert code in v.rules and v.verdict == expected and text in v.reason, v
    assert code not in verdict(good(), node, version).rules


def test_a_node_named_like_an_onnx_op_is_not_also_sent_down_the_plugin_path() -> None:
    """acme::Resize goes to the built-in Resize importer: only that rule fires (the plugin-path rules said
    "no importer; plugin path looks up creator 'Resize'" beside it)."""
    (node,) = [n for n in trt(custom_node_model("Resize", "acme"), "10.0").nodes if n.node == "custom"]
    assert node.rules == ("trt-op-type-shadows-importer",)


def test_every_trt_rule_is_tested_and_documented() -> None:
    assert {c[0] for c in TRT_CASES} == {r.code for r in TRT_RULES}
    for rule in TRT_RULES:
        assert rule.doc and rule.source and rule.versions


@pytest.mark.parametrize(
    ("version", "fires"), [("8.4", True), ("8.5", False), ("10.8", False)], ids=["8.4", "8.5", "10.8"]
)
def test_cubic_rule_version_range(version: str, fires: bool) -> None:
    assert ("trt-resize-cubic-unsupported" in verdict(resize_model("cubic"), "resize", version).rules) is fires


def test_seed001_both_errors_on_old_parser() -> None:
    """Seed 001: a cubic Resize with dynamic scales fails twice on TensorRT 8.x."""
    v = verdict(resize_model("cubic", scales="input"), "resize", "8.4")
    assert set(v.rules) == {"trt-resize-cubic-unsupported", "trt-resize-scales-not-initializer"}
    assert "computed at run time" in v.reason


def test_foldable_scales_hint_and_sizes_pass() -> None:
    assert "fold-resize-scales" in verdict(resize_model("linear", scales="folded-chain"), "resize").reason
    assert verdict(resize_model("linear", scales="sizes-runtime"), "resize").verdict == "native"


def test_plugin_lookup_reads_plugin_attributes() -> None:
    v = verdict(custom_node_model("Unknown", plugin_version="2", plugin_namespace="ns"), "custom")
    assert "creator 'Unknown' version '2' namespace 'ns'" in v.reason


@pytest.mark.parametrize(("version", "expected"), [("8.6", "fail"), ("10.8", "function")], ids=["8.6", "10.8"])
def test_local_function_preferred_over_plugin_from_trt10(version: str, expected: str) -> None:
    assert verdict(_function_model(), "custom", version).verdict == expected


def test_opbridge_op_goes_to_opbridge_plugin_and_unsupported_standard_op_fails() -> None:
    assert verdict(custom_node_model("Scale", "test.compat"), "custom").verdict == "opbridge"
    unique = make_model(
        [helper.make_node("Unique", ["x"], ["y"], name="u")],
        [("x", TensorProto.FLOAT, [4])],
        [("y", TensorProto.FLOAT, None)],
    )
    assert verdict(unique, "u", "8.6").verdict == "fail"
    assert verdict(unique, "u", "10.8").verdict == "native"


def test_real_parser_column_without_opbridge_tensorrt(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where opbridge.tensorrt cannot be imported, the real-parser column says so; the static rules still run."""
    monkeypatch.setitem(sys.modules, "opbridge.tensorrt", None)  # makes `import opbridge.tensorrt` fail
    report = check_compat(resize_model("cubic"), "tensorrt")
    assert report.real_backend == "not available" and report.real_ok is None
    assert all(n.real == "not available" for n in report.nodes)
    assert any("opbridge.tensorrt" in note for note in report.notes)


def test_real_parser_column(tmp_path: Path) -> None:
    good = tmp_path / "good.onnx"
    onnx.save(resize_model("linear"), good)
    report = check_compat(good, "tensorrt")
    if report.real_backend == "not available":
        pytest.skip("opbridge.tensorrt found no TensorRT library: " + "; ".join(report.notes))
    assert report.real_ok is True and all(n.real == "ok" for n in report.nodes)
    bad = tmp_path / "bad.onnx"
    onnx.save(custom_node_model("NoSuchPlugin"), bad)
    report = check_compat(bad, "tensorrt")
    assert report.real_ok is False
    assert next(n for n in report.nodes if n.node == "custom").real.startswith("fail")


@opbridge.op("tests.compat::TopThree")
def _top_three(x: torch.Tensor) -> torch.Tensor:
    """No shape rule, and an output dim computed from a dynamic dim (which a plugin without a rule cannot give)."""
    return torch.cat((x, x))[..., :3] * 1


def test_real_parser_failure_gives_opbridges_reason_and_the_summary_counts_it(tmp_path: Path) -> None:
    """The real parser's column kept only TensorRT's generic last message for a node, and the summary
    said 0 fail while the header said FAILED."""
    path = tmp_path / "top3.onnx"
    model = make_model(
        [helper.make_node("TopThree", ["x"], ["y"], domain="tests.compat", name="top3")],
        [("x", TensorProto.FLOAT, ["n", 5])],
        [("y", TensorProto.FLOAT, None)],
        domains={"tests.compat": 1},
    )
    onnx.save(model, path)
    report = check_compat(path, "tensorrt")
    if report.real_backend == "not available":
        pytest.skip("opbridge.tensorrt found no TensorRT library: " + "; ".join(report.notes))
    node = next(n for n in report.nodes if n.node == "top3")
    assert node.real is not None and node.real.startswith("fail: opbridge: get_output_shapes: ")
    assert "declares no shape rule" in node.real and " / " in node.real  # then TensorRT's own message
    assert report.format_text().splitlines()[-1].endswith("; real backend: FAILED on 1 node(s)")


def test_a_parser_failure_inside_a_function_body_goes_to_the_call(tmp_path: Path) -> None:
    """TensorRT imports a model-local function's body; a body node it has no importer for failed with no
    node name, and compat put it in an unattributed note while the call read "no error reported", and
    advised defining an op named after the standard one."""
    body = helper.make_function(
        "acme",
        "Deform",
        ["x", "w", "o"],
        ["y"],
        [helper.make_node("DeformConv", ["x", "w", "o"], ["y"], kernel_shape=[2, 2])],
        [helper.make_opsetid("", 19)],
    )
    model = make_model(
        [helper.make_node("Deform", ["x", "w", "o"], ["y"], domain="acme", name="call")],
        [("x", TensorProto.FLOAT, [1, 1, 3, 3]), ("w", TensorProto.FLOAT, [1, 1, 2, 2]),
         ("o", TensorProto.FLOAT, [1, 8, 2, 2])],
        [("y", TensorProto.FLOAT, [1, 1, 2, 2])],
        domains={"acme": 1},
        functions=[body],
        opset=19,
    )  # fmt: skip
    path = tmp_path / "deform.onnx"
    onnx.save(model, path)
    report = check_compat(path, "tensorrt")
    if report.real_backend == "not available":
        pytest.skip("opbridge.tensorrt found no TensorRT library: " + "; ".join(report.notes))
    if report.real_ok:
        pytest.skip(f"{report.real_backend} imports DeformConv")
    call = next(n for n in report.nodes if n.node == "call")
    assert call.real is not None and call.real.startswith("fail: its function body's DeformConv: ")
    assert "export with functions=False (--no-functions)" in call.real
    assert not any("DeformConv" in note for note in report.notes)


def test_a_default_domain_node_finds_the_plugin_opbridge_registers_under_the_empty_namespace() -> None:
    """opbridge.tensorrt registers each op's plugin under namespace '' too, where TensorRT's parser looks up
    a node of the default domain by name: compat said such a node fails, and the real parser took it."""
    model = make_model(
        [helper.make_node("MySELU", ["x", "p", "c"], ["y"], name="legacy")],
        [("x", TensorProto.FLOAT, [1, 4]), ("p", TensorProto.FLOAT, [1]), ("c", TensorProto.FLOAT, [1])],
        [("y", TensorProto.FLOAT, [1, 4])],
    )
    (node,) = [n for n in check_compat(model, "tensorrt", real=False).nodes if n.node == "legacy"]
    assert node.verdict == "opbridge", node.reason
    assert "registers opbridge::MySELU's plugin under namespace '' too" in node.reason


# ---------------------------------------------------------------- onnxruntime


def ort(model: onnx.ModelProto):
    return {n.node: n for n in check_compat(model, "onnxruntime").nodes}


def test_ort_custom_node_without_body_fails_with_session_error() -> None:
    report = check_compat(custom_node_model("Unknown"), "onnxruntime")
    nodes = {n.node: n for n in report.nodes}
    assert nodes["relu"].verdict == "native"
    assert nodes["custom"].verdict == "fail" and "is not a registered function/op" in nodes["custom"].reason
    assert report.real_ok is False and "is not a registered function/op" in nodes["custom"].real


def test_ort_function_body_runs() -> None:
    report = check_compat(_function_model(), "onnxruntime")
    assert report.nodes[0].verdict == "function" and report.real_ok is True and report.ok


def test_ort_opbridge_op_and_opset_too_old() -> None:
    report = check_compat(custom_node_model("Scale", "test.compat"), "onnxruntime")
    scale = next(n for n in report.nodes if n.node == "custom")
    assert scale.verdict == "opbridge" and scale.real.startswith("fail")
    assert report.real_ok is False and report.ok, "a session without opbridge's bridge is expected to fail there"
    gelu = make_model(
        [helper.make_node("Gelu", ["x"], ["y"], name="g")],
        [("x", TensorProto.FLOAT, [2])],
        [("y", TensorProto.FLOAT, [2])],
        opset=17,
    )
    v = ort(gelu)["g"]
    assert v.verdict == "fail" and "only from opset 20" in v.reason


# ---------------------------------------------------------------- openvino


def test_openvino_verdicts_from_its_frontend() -> None:
    pytest.importorskip("openvino", reason="openvino is not installed")
    nodes = {n.node: n for n in check_compat(custom_node_model("Unknown"), "openvino").nodes}
    assert nodes["relu"].verdict == "native"
    assert nodes["custom"].verdict == "fail" and "No conversion rule found" in nodes["custom"].reason
    assert check_compat(_function_model(), "openvino").nodes[0].verdict == "function"
    scale = {n.node: n for n in check_compat(custom_node_model("Scale", "test.compat"), "openvino").nodes}
    assert scale["custom"].verdict == "opbridge"
    cubic = {n.node: n for n in check_compat(resize_model("cubic", scales="input"), "openvino").nodes}
    assert cubic["resize"].verdict == "native"


# ---------------------------------------------------------------- CLI


def test_cli_compat(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "cubic.onnx"
    onnx.save(resize_model("cubic"), path)
    assert main(["compat", str(path), "--target", "tensorrt", "--trt-version", "8.4", "--no-real"]) == 1
    assert "does not support cubic interpolation" in capsys.readouterr().out
    assert main(["compat", str(path), "--target", "tensorrt", "--no-real", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is True and data["nodes"][0]["verdict"] == "native"
    assert main(["compat", str(path), "--target", "tensorrt", "--trt-version", "ten"]) == 2
    assert "write it as MAJOR.MINOR" in capsys.readouterr().err
    with pytest.raises(OpbridgeError, match="unknown compat target 'tvm'"):
        check_compat(path, "tvm")


def _custom_node_in_if_branch() -> onnx.ModelProto:
    """An If whose then-branch holds acme::Foo; the else-branch negates."""
    then = helper.make_graph(
        [helper.make_node("Foo", ["x"], ["t"], domain="acme", name="inner_foo")],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [3])],
    )
    other = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e"], name="neg")],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [3])],
    )
    node = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="if")
    return make_model(
        [node],
        [("c", TensorProto.BOOL, []), ("x", TensorProto.FLOAT, [3])],
        [("y", TensorProto.FLOAT, [3])],
        domains={"acme": 1},
    )


@pytest.mark.parametrize("target", ["tensorrt", "onnxruntime", "openvino"])
def test_nodes_inside_subgraphs_are_checked(target: str) -> None:
    """A custom node in an If branch is judged like any other (it was skipped: a model the runtime
    refuses passed), labelled with its place."""
    if target == "openvino":
        pytest.importorskip("openvino", reason="openvino is not installed")
    report = check_compat(_custom_node_in_if_branch(), target, real=False)
    nodes = {n.node: n for n in report.nodes}
    assert set(nodes) == {"if", "if/then_branch/inner_foo", "if/else_branch/neg"}
    assert nodes["if/then_branch/inner_foo"].verdict == "fail" and nodes["if/else_branch/neg"].verdict == "native"
    assert not report.ok


def test_trt_versions_before_the_rules_are_refused() -> None:
    with pytest.raises(OpbridgeError, match=r"TensorRT version '6.0': the rules cover TensorRT 7.0 and later"):
        check_compat(custom_node_model(), "tensorrt", trt_version="6.0", real=False)


def test_openvino_on_an_invalid_model_fails_instead_of_raising() -> None:
    """A graph the frontend cannot load (a cycle) is a failed conversion in the report, not a crash."""
    pytest.importorskip("openvino", reason="openvino is not installed")
    nodes = [
        helper.make_node("Add", ["x", "b"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["b"], name="relu"),
    ]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [2])], [("a", TensorProto.FLOAT, [2])])
    report = check_compat(model, "openvino")
    assert report.real_ok is False and not report.ok and report.notes[0].startswith("conversion raised")


def test_ort_blames_nodes_by_their_quoted_names_only() -> None:
    """A node named "error" is not blamed for ONNX Runtime's "Fatal error: ..." about another node."""
    model = custom_node_model("Unknown")
    model.graph.node[0].name = "error"
    nodes = {n.node: n for n in check_compat(model, "onnxruntime").nodes}
    assert nodes["error"].real == "no error reported"
    assert nodes["custom"].real.startswith("fail")


def test_resize_10_scales_are_its_second_input() -> None:
    """Resize-10 takes (X, scales): scales computed at run time fail the TensorRT rule there too."""
    nodes = [
        helper.make_node("Concat", ["one_one", "s", "s"], ["scales"], axis=0, name="cat"),
        helper.make_node("Resize", ["x", "scales"], ["y"], mode="nearest", name="r10"),
    ]
    model = make_model(
        nodes,
        [("x", TensorProto.FLOAT, [1, 1, 4, 4]), ("s", TensorProto.FLOAT, [1])],
        [("y", TensorProto.FLOAT, None)],
        initializers=[("one_one", np.ones(2, np.float32))],
        opset=10,
    )
    nodes_by_name = {n.node: n for n in check_compat(model, "tensorrt", real=False).nodes}
    assert nodes_by_name["r10"].verdict == "fail" and "trt-resize-scales-not-initializer" in nodes_by_name["r10"].rules


def test_ort_opbridge_op_inside_a_subgraph_is_bridged() -> None:
    """opbridge's session bridges the nodes of If branches too: an opbridge op there is "opbridge"."""
    import opbridge.ops.detection  # noqa: F401 - registers grid_sampler

    then = helper.make_graph(
        [helper.make_node("grid_sampler", ["x", "g"], ["t"], domain="mmdeploy", name="gs")],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, 1, 2, 2])],
    )
    other = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["e"], name="id")],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [1, 1, 2, 2])],
    )
    model = make_model(
        [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="if")],
        [("x", TensorProto.FLOAT, [1, 1, 2, 2]), ("g", TensorProto.FLOAT, [1, 2, 2, 2]), ("c", TensorProto.BOOL, [])],
        [("y", TensorProto.FLOAT, [1, 1, 2, 2])],
        domains={"mmdeploy": 1},
    )
    nodes = {n.node: n for n in check_compat(model, "onnxruntime", real=False).nodes}
    assert nodes["if/then_branch/gs"].verdict == "opbridge"  # the bridge serves If/Loop bodies too
    pytest.importorskip("openvino", reason="openvino is not installed")
    nodes = {n.node: n for n in check_compat(model, "openvino", real=False).nodes}
    assert nodes["if/then_branch/gs"].verdict == "opbridge"  # and so do opbridge's OpenVINO Python ops


@pytest.mark.parametrize("target", ["tensorrt", "onnxruntime", "openvino"])
def test_a_function_body_two_calls_deep_decides_the_verdict(target: str) -> None:
    """A node whose local function calls another, whose body holds an op nothing runs, fails on every
    target (the body's nodes were not looked at: "function"); with a standard op there it is "function"."""
    if target == "openvino":
        pytest.importorskip("openvino", reason="openvino is not installed")
    bad = _nested_function_model(helper.make_node("Baz", ["x"], ["y"], domain="zzz"), {"zzz": 1})
    (node,) = check_compat(bad, target, real=False).nodes
    assert node.verdict == "fail" and "Baz" in node.reason
    good = _nested_function_model(helper.make_node("Relu", ["x"], ["y"]), {})
    assert [n.verdict for n in check_compat(good, target, real=False).nodes] == ["function"]
    # an opbridge op in the body: ONNX Runtime's bridge and TensorRT's plugins serve it where the body
    # is expanded; OpenVINO runs it as a Python op once the body is inlined
    bridged = _nested_function_model(helper.make_node("Scale", ["x"], ["y"], domain="test.compat"), {"test.compat": 1})
    expected = "opbridge" if target == "openvino" else "function"
    assert [n.verdict for n in check_compat(bridged, target, real=False).nodes] == [expected]
    if target != "tensorrt":  # and it runs so
        from opbridge.backends import get_backend

        x = np.array([1.5, -2.0], np.float32)
        runner = get_backend(target)(bridged)
        runner.load()
        np.testing.assert_array_equal(runner.infer({"x": x})["y"], x * 2)


@pytest.mark.parametrize("target", ["tensorrt", "onnxruntime", "openvino"])
def test_a_sparse_constant_gets_verdicts_not_a_traceback(target: str) -> None:
    """onnx-ir does not read sparse tensors: the rules that need it are skipped, the rest answer."""
    if target == "openvino":
        pytest.importorskip("openvino", reason="openvino is not installed")
    values = numpy_helper.from_array(np.array([5.0], np.float32))
    sparse = helper.make_sparse_tensor(values, numpy_helper.from_array(np.array([1], np.int64)), [2])
    nodes = [
        helper.make_node("Constant", [], ["c"], sparse_value=sparse, name="const"),
        helper.make_node("Add", ["x", "c"], ["y"], name="add"),
    ]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [2])], [("y", TensorProto.FLOAT, [2])])
    verdicts = {n.node: n.verdict for n in check_compat(model, target, real=False).nodes}
    assert verdicts == {"const": "fail" if target == "tensorrt" else "native", "add": "native"}


def _calling_functions(depth: int, calls: int) -> onnx.ModelProto:
    """f0 calls f1 ``calls`` times, f1 calls f2 ..., f<depth> holds a node no runtime knows; the main
    graph calls f0."""
    functions = []
    for level in range(depth):
        names = [f"v{k}" for k in range(calls)]
        nodes = [
            helper.make_node(f"f{level + 1}", ["x" if k == 0 else names[k - 1]], [names[k]], domain="deep")
            for k in range(calls)
        ]
        nodes.append(helper.make_node("Identity", [names[-1]], ["y"]))
        functions.append(
            helper.make_function(
                "deep", f"f{level}", ["x"], ["y"], nodes, [helper.make_opsetid("", 17), helper.make_opsetid("deep", 1)]
            )
        )
    functions.append(
        helper.make_function(
            "deep",
            f"f{depth}",
            ["x"],
            ["y"],
            [helper.make_node("Unknown", ["x"], ["y"], domain="nowhere", name="innermost")],
            [helper.make_opsetid("", 17), helper.make_opsetid("nowhere", 1)],
        )
    )
    graph = helper.make_graph(
        [helper.make_node("f0", ["x"], ["y"], domain="deep", name="call")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("deep", 1)], functions=functions
    )


@pytest.mark.parametrize(("depth", "calls"), [(24, 2), (1500, 1)], ids=["each-calls-the-next-twice", "a-long-chain"])
def test_functions_calling_functions_are_each_checked_once(depth: int, calls: int) -> None:
    """A function body is checked once per call from the graph, whatever calls it in turn: functions that
    call the next one twice listed 2**depth copies (minutes at depth 18), and a chain of 1500 calls ended
    in a RecursionError."""
    report = check_compat(_calling_functions(depth, calls), "tensorrt", real=False)
    (call,) = report.nodes
    assert call.verdict == "fail"
    assert "its body's node call/deep::f0/" in call.reason and f"deep::f{depth}/innermost fails" in call.reason
