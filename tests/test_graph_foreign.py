"""The graph tools on files other tools wrote: overridable and random values, overloaded functions,
ops of later opsets, nodes opbridge's op does not fit, invalid files and non-UTF-8 terminals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from _graph_models import make_model
from onnx import TensorProto, helper

from opbridge.cli import main
from opbridge.graph import check_compat, lint_model, rewrite_model

F = TensorProto.FLOAT


def _scaled_resize(
    scales_node: onnx.NodeProto, extra: list[onnx.NodeProto] = (), **inits: np.ndarray
) -> onnx.ModelProto:
    """x -> Resize(cubic, scales from ``scales_node``'s output "sc") -> y."""
    model = make_model(
        [*extra, scales_node, helper.make_node("Resize", ["x", "", "sc"], ["y"], name="rs", mode="cubic")],
        [("x", F, [1, 1, 4, 4])],
        [("y", F, None)],
        initializers=list(inits.items()),
    )
    return model


def test_fold_resize_scales_leaves_values_a_feed_or_a_draw_decides() -> None:
    """An initializer that is also a graph input is only a default (a feed replaces it), and a random op
    draws anew on every run: folding either froze a value the model computes at run time."""
    overridable = _scaled_resize(
        helper.make_node("Mul", ["s", "two"], ["sc"]),
        s=np.array([1, 1, 1, 1], np.float32),
        two=np.array([1, 1, 2, 2], np.float32),
    )
    overridable.graph.input.append(helper.make_tensor_value_info("s", F, [4]))
    report = rewrite_model(overridable, ["fold-resize-scales"])
    assert not report.changed
    assert "it depends on graph input 's'" in report.outcomes[0].reason
    session = ort.InferenceSession(overridable.SerializeToString(), providers=["CPUExecutionProvider"])
    fed = session.run(None, {"x": np.zeros((1, 1, 4, 4), np.float32), "s": np.array([1, 1, 1.5, 1.5], np.float32)})
    assert fed[0].shape == (1, 1, 12, 12)  # (what folding would have fixed at 8 x 8)

    drawn = _scaled_resize(helper.make_node("RandomUniform", [], ["sc"], name="draw", shape=[4], low=1.0, high=3.0))
    report = rewrite_model(drawn, ["fold-resize-scales"])
    assert not report.changed and "drawn at random by 'draw'" in report.outcomes[0].reason


def test_fold_resize_scales_keeps_nodes_that_were_dead_before() -> None:
    """The clean-up removed every unused node, also those the rewrite did not touch: only what the
    rewrite leaves unread goes."""
    model = _scaled_resize(
        helper.make_node("Identity", ["sc0"], ["sc"], name="idn"),
        [
            helper.make_node("Constant", [], ["sc0"], name="c", value=helper.make_tensor("v", F, [4], [1, 1, 2, 2])),
            helper.make_node("Neg", ["x"], ["unused"], name="dead_neg"),
        ],
    )
    report = rewrite_model(model, ["fold-resize-scales"])
    assert report.changed
    assert [n.name for n in report.model.graph.node] == ["dead_neg", "rs"]


def test_resize_to_dynamic_resize_skips_a_kept_aspect_ratio() -> None:
    model = make_model(
        [helper.make_node("Resize", ["x", "", "", "sz"], ["y"], mode="cubic", keep_aspect_ratio_policy="not_larger")],
        [("x", F, [1, 1, 4, 8]), ("sz", TensorProto.INT64, [4])],
        [("y", F, None)],
        opset=18,
    )
    report = rewrite_model(model, ["resize-cubic-to-dynamic-resize"])
    assert not report.changed
    assert "keep_aspect_ratio_policy is 'not_larger'" in report.outcomes[0].reason


def test_lint_names_a_standard_op_of_a_later_opset() -> None:
    """The checker's "No Op registered for Gelu with domain_version of 17" was dropped as a custom op's,
    which another code names; Gelu is ONNX's from opset 20, and no runtime runs it at 17."""
    model = make_model([helper.make_node("Gelu", ["x"], ["y"])], [("x", F, [2])], [("y", F, [2])], opset=17)
    findings = lint_model(model)
    assert [(f.severity, f.code) for f in findings] == [("error", "invalid-model")]
    assert "Gelu is an ONNX op from opset 20 on, but the model imports opset 17" in findings[0].message


def _overloaded(bad_last: bool) -> onnx.ModelProto:
    """Two overloads of acme::Act, one of them calling an op nothing defines; a node calls each."""

    def body(overload: str, op: str) -> onnx.FunctionProto:
        fn = helper.make_function(
            "acme", "Act", ["x"], ["y"], [helper.make_node(op, ["x"], ["y"], name="n", domain="" if op == "Relu" else "acme")],
            [helper.make_opsetid("", 17), helper.make_opsetid("acme", 1)],
        )  # fmt: skip
        fn.overload = overload
        return fn

    functions = [body("good", "Relu"), body("bad", "Nope")]
    calls = [
        helper.make_node("Act", ["x"], ["a"], name="a1", domain="acme"),
        helper.make_node("Act", ["a"], ["y"], name="a2", domain="acme"),
    ]
    calls[0].overload, calls[1].overload = "good", "bad"
    return make_model(
        calls,
        [("x", F, [2])],
        [("y", F, [2])],
        domains={"acme": 1},
        functions=functions[::-1] if bad_last else functions,
    )


@pytest.mark.parametrize("bad_last", [False, True], ids=["good-last", "bad-last"])
def test_overloads_of_a_function_are_told_apart(bad_last: bool) -> None:
    """Every call was judged by the overload declared last, and the two overloads' nodes of one name were a
    duplicate node name."""
    model = _overloaded(bad_last)
    assert not [f for f in lint_model(model) if f.code == "duplicate-node-name"]
    verdicts = {
        n.node: n.verdict for n in check_compat(model, "onnxruntime", real=False).nodes if n.node in ("a1", "a2")
    }
    assert verdicts == {"a1": "function", "a2": "fail"}


def test_compat_does_not_run_a_node_opbridges_op_does_not_fit() -> None:
    """MMDeploy's TRTBatchedNMS with return_index=1 has a third output, which opbridge's op does not have:
    compat said opbridge runs it, and opbridge's session refuses it."""
    node = helper.make_node(
        "TRTBatchedNMS", ["b", "s"], ["dets", "labels", "index"], name="nms", domain="mmdeploy",
        num_classes=3, return_index=1,
    )  # fmt: skip
    model = make_model(
        [node],
        [("b", F, [1, 10, 1, 4]), ("s", F, [1, 10, 3])],
        [("dets", F, None), ("labels", TensorProto.INT32, None), ("index", TensorProto.INT32, None)],
        domains={"mmdeploy": 1},
    )
    for target in ("onnxruntime", "openvino", "tensorrt"):
        (verdict,) = [n for n in check_compat(model, target, real=False).nodes if n.node == "nms"]
        assert verdict.verdict == "fail", target
        assert (
            "opbridge's mmdeploy::TRTBatchedNMS v1 does not run it: the node lists outputs ['dets', 'labels', "
            "'index']; the op has 2 (dets, labels)" in verdict.reason
        )


def test_an_invalid_file_is_named_with_the_checkers_words(tmp_path: Path, capsys) -> None:
    """A Constant with a misspelled attribute, feeding a Resize's scales, made lint and compat end in a
    traceback (exit 1)."""
    model = _scaled_resize(
        helper.make_node("Constant", [], ["sc"], name="c", valu=helper.make_tensor("v", F, [4], [1, 1, 2, 2]))
    )
    path = tmp_path / "bad_constant.onnx"
    onnx.save(model, path)
    for argv in (["lint", str(path)], ["compat", str(path), "--target", "tensorrt", "--no-real"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"{path} is not a valid ONNX model" in err and "Unsupported attribute 'valu'" in err


def test_json_stays_json_on_a_terminal_that_is_not_utf8(tmp_path: Path) -> None:
    """stdout escapes what it cannot encode (\\xf6), which made --json output invalid JSON."""
    twice = [helper.make_node("Relu", ["xö"], ["r"], name="nöde"), helper.make_node("Relu", ["r"], ["y"], name="nöde")]
    model = make_model(twice, [("xö", F, [1])], [("y", F, [1])])  # (lint names the duplicate name)
    path = tmp_path / "names.onnx"
    onnx.save(model, path)
    env = {**os.environ, "LC_ALL": "C", "PYTHONIOENCODING": "ascii"}
    for command in (["lint", "--json"], ["inspect", "--json"], ["compat", "--json", "--target", "onnxruntime"]):
        done = subprocess.run(
            [sys.executable, "-m", "opbridge", *command, str(path)], capture_output=True, env=env, timeout=300
        )
        text = done.stdout.decode("ascii")
        assert "ö" in json.dumps(json.loads(text), ensure_ascii=False), command


def test_inspect_reads_no_weights(tmp_path: Path) -> None:
    """inspect read every external tensor to print its dims (a 300 MB model took 660 MB), and refused a
    model whose data file was missing."""
    from opbridge.graph import inspect_model

    model = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        [("x", F, [1, 64])],
        [("y", F, [1, 64])],
        initializers=[("w", np.ones((64, 64), np.float32))],
    )
    path = tmp_path / "ext.onnx"
    onnx.save(model, path, save_as_external_data=True, location="ext.onnx.data", size_threshold=0)
    (tmp_path / "ext.onnx.data").unlink()
    report = inspect_model(path)
    assert [(i.name, i.shape, i.nbytes) for i in report.initializers] == [("w", [64, 64], 64 * 64 * 4)]


def test_names_from_the_file_are_shown_not_obeyed(tmp_path: Path, capsys) -> None:
    """A name holding a terminal escape (ESC [2J clears the screen) or a newline reached the terminal as
    it was: the text reports now write such characters as escapes."""
    nodes = [helper.make_node("Relu", ["in\nput"], ["r"], name="clear\x1b[2J"), helper.make_node("Relu", ["r"], ["y"])]
    model = make_model(nodes, [("in\nput", F, [1])], [("y", F, [1])])
    model.graph.node.append(helper.make_node("Relu", ["r"], ["z"], name="clear\x1b[2J"))  # (a duplicate name: lint)
    model.graph.output.append(helper.make_tensor_value_info("z", F, [1]))
    path = tmp_path / "escapes.onnx"
    onnx.save(model, path)
    for argv in (
        ["inspect", str(path)],
        ["lint", str(path)],
        ["compat", str(path), "--target", "onnxruntime", "--all"],
    ):
        main(argv)
        out = capsys.readouterr().out
        assert "\x1b" not in out and "in\nput" not in out, argv
        assert "\\x1b[2J" in out or "in\\nput" in out, argv
