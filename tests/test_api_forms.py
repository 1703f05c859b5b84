"""The public functions take the forms a Python caller writes: one name where a list of names is
typed, a tensor where an array is, a dict where the command line takes ``A=B`` items; a value of
the wrong kind is named with the form to write, before any work is done."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import opbridge
from opbridge.errors import OpbridgeError, OpDefinitionError
from opbridge.graph import check_compat, lint_model
from opbridge.graph.lint import has_errors
from opbridge.graph.rewrite import RewriteError, rewrite_file, rewrite_model


@opbridge.op("tests.forms::Shift")
def shift(x: torch.Tensor, by: float = 1.0) -> torch.Tensor:
    return x + by


def _relu_model() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["out"], name="relu")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", 18)])


@pytest.mark.parametrize("session", ["InferenceSession", "ReferenceSession"])
def test_sessions_take_one_output_name_and_tensors(session: str) -> None:
    sess = getattr(opbridge, session)(_relu_model())
    x = torch.tensor([-1.0, 2.0], requires_grad=True)
    (out,) = sess.run("out", {"x": x})
    np.testing.assert_array_equal(out, np.array([0.0, 2.0], np.float32))
    with pytest.raises(ValueError, match=r"input_feed is a NoneType; give a dict of input name to array"):
        sess.run(None, None)  # type: ignore[arg-type]


def test_op_facets_are_functions_and_gpu_dtypes_are_names() -> None:
    @opbridge.op("tests.forms::Facets")
    def facets(x: torch.Tensor) -> torch.Tensor:
        return x

    with pytest.raises(OpDefinitionError, match=r"register_shape takes a function rule\(\*inputs, \*\*attrs\)"):
        facets.register_shape(3)  # type: ignore[arg-type]
    with pytest.raises(OpDefinitionError, match=r"register_function takes a function builder\(spec, opset\)"):
        facets.register_function(3)  # type: ignore[call-overload]
    with pytest.raises(OpDefinitionError, match=r"register_gpu_kernel dtypes \('float33',\): give torch dtype names"):
        facets.register_gpu_kernel(lambda *a: None, dtypes=("float33",))
    facets.register_gpu_kernel(lambda *a: None, dtypes="float16")
    assert facets.gpu_kernel_dtypes == ("float16",)
    with pytest.raises(OpDefinitionError, match=r"opbridge.kernel takes the op's name first, got function"):
        opbridge.kernel(lambda x: x)  # type: ignore[arg-type]  # (written as a bare @opbridge.kernel)


def test_schemas_and_plugins_take_one_op_or_its_qualified_name() -> None:
    assert opbridge.register_onnx_schemas(shift) == ["tests.forms::Shift"]
    assert opbridge.register_onnx_schemas("tests.forms::Shift") == ["tests.forms::Shift"]
    with pytest.raises(OpDefinitionError, match=r"register_onnx_schemas: no op 'Shift' is defined; give an op"):
        opbridge.register_onnx_schemas(["Shift"])
    with pytest.raises(OpDefinitionError, match=r"register_onnx_schemas: 3 is a int; give op definitions"):
        opbridge.register_onnx_schemas([3])  # type: ignore[list-item]


def test_export_takes_one_name_and_refuses_a_missing_path_first(tmp_path: Path) -> None:
    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return shift(x, by=2.0)

    result = opbridge.export(Model(), torch.zeros(3), tmp_path / "m.onnx", exporter="torchscript", input_names="image")
    assert [i.name for i in result.model.graph.input] == ["image"]
    with pytest.raises(opbridge.ExportError, match=r"input_names \['a', 'b'\] name 2 inputs, and the example gives 1"):
        opbridge.export(
            Model(), (torch.zeros(3),), tmp_path / "m2.onnx", exporter="torchscript", input_names=["a", "b"]
        )
    with pytest.raises(opbridge.OutputPathError, match=r"the output path is a NoneType; give a file path"):
        opbridge.export(Model(), (torch.zeros(3),), None, exporter="torchscript")  # type: ignore[arg-type]


def test_graph_tools_take_python_forms(tmp_path: Path) -> None:
    myselu = helper.make_graph(
        [helper.make_node("MYSELU", ["x"], ["y"], name="act")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(myselu, opset_imports=[helper.make_operatorsetid("", 18)])
    for form in ({"MYSELU": "acme::Selu"}, "MYSELU=acme::Selu", ["MYSELU=acme::Selu"]):
        report = rewrite_model(model, "replace-op", {"map": form, "version": 1})
        assert [(n.domain, n.op_type) for n in report.model.graph.node] == [("acme", "Selu")], form
    with pytest.raises(RewriteError, match=r"options is a list; give a dict of option name to value"):
        rewrite_model(model, "replace-op", ["map=MYSELU=acme::Selu"])  # type: ignore[arg-type]
    with pytest.raises(RewriteError, match=r"rewrite_file rewrites a file, got a ModelProto; .*rewrite_model\(\)"):
        rewrite_file(model, tmp_path / "out.onnx", ["legacy-domain"])  # type: ignore[arg-type]
    assert check_compat(_relu_model(), "tensorrt", trt_version=10, real=False).nodes[0].verdict == "native"
    assert has_errors(lint_model(_relu_model())) is False
    with pytest.raises(TypeError, match=r"has_errors takes lint_model\(\)'s findings, got a str"):
        has_errors(["x"])  # type: ignore[list-item]


def test_tensorrt_builds_name_their_argument_forms(tmp_path: Path) -> None:
    pytest.importorskip("opbridge.tensorrt")
    from opbridge.tensorrt import build_engine

    path = tmp_path / "relu.onnx"
    onnx.save(_relu_model(), path)
    with pytest.raises(OpbridgeError, match=r"TensorRT builds from a file, got a ModelProto; save the model first"):
        build_engine(_relu_model(), isolate=False)  # type: ignore[arg-type]
    with pytest.raises(OpbridgeError, match=r"profiles is a str; give a dict of input name to \(min, opt, max\)"):
        build_engine(path, profiles="x:2,2,2", isolate=False)  # type: ignore[arg-type]
    with pytest.raises(OpbridgeError, match=r"profile of 'x': \('2', '2', '2'\); give three shapes of whole numbers"):
        build_engine(path, profiles={"x": ("2", "2", "2")}, isolate=False)  # type: ignore[dict-item]
