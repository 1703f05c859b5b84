"""Both PyTorch exporters emit each detection op as one typed ``mmdeploy`` custom node."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from _detection_cases import CASES, _Call

import opbridge
from opbridge.onnx_schema import attribute_values

EXPORTERS = ("dynamo", "torchscript")


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_export_emits_typed_custom_node(case: tuple, exporter: str, tmp_path: Path) -> None:
    name, opdef, args, attrs = case
    model = _Call(opdef, attrs).eval()
    result = opbridge.export(model, args, tmp_path / f"{name}.onnx", exporter=exporter)
    nodes = [n for n in result.custom_nodes if (n.domain, n.op_type) == ("mmdeploy", name)]
    assert len(nodes) == 1, [(n.domain, n.op_type) for n in result.custom_nodes]
    values = attribute_values(opdef.spec, nodes[0])
    expected = opdef.spec.bind_attributes(attrs)
    for key, value in expected.items():
        assert values[key] == pytest.approx(value), key
    by_name = {a.name: a for a in nodes[0].attribute}
    for key in attrs:
        want = opdef.spec.attribute(key).type.onnx_name
        assert onnx.AttributeProto.AttributeType.Name(by_name[key].type) == want, key
    assert any(o.domain == "mmdeploy" for o in result.model.opset_import)
    # the graph's outputs carry the shapes the op's shape rule gives
    eager = model(*args)
    eager = eager if isinstance(eager, tuple) else (eager,)
    for out, tensor in zip(result.model.graph.output, eager):
        dims = [dim.dim_value for dim in out.type.tensor_type.shape.dim]
        assert dims == list(tensor.shape), out.name


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_export_of_nms_keeps_int32_labels(exporter: str, tmp_path: Path) -> None:
    _, opdef, args, attrs = CASES[-1]
    result = opbridge.export(_Call(opdef, attrs).eval(), args, tmp_path / "nms.onnx", exporter=exporter)
    types = [o.type.tensor_type.elem_type for o in result.model.graph.output]
    assert types == [onnx.TensorProto.FLOAT, onnx.TensorProto.INT32]


@pytest.mark.parametrize("which", ["grid_sampler-bilinear", "grid_sampler-bicubic", "DynamicTRTResize"])
def test_float16_models_pass_verify_with_the_declared_tolerances(which: str, tmp_path: Path) -> None:
    """float16 models of the resampling ops pass verify on every installed backend: the declared
    float16 tolerances cover runtimes that compute in float32 against PyTorch's float16 CPU ops (whose
    grid_sample rounds intermediates: 0.0117 / 0.0155 from float32 here, one element)."""
    import torch

    from opbridge.ops import DynamicResize
    from opbridge.ops import detection as d

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 8, 10, generator=g).half()
    if which == "DynamicTRTResize":
        model, args = _Call(DynamicResize, {"align_corners": False}), (x, torch.zeros(2, 1, 16, 12).half())
    else:
        mode = 0 if which.endswith("bilinear") else 2
        grid = (torch.rand(2, 6, 5, 2, generator=g) * 2 - 1).half()
        attrs = {"interpolation_mode": mode, "padding_mode": 1, "align_corners": True}
        model, args = _Call(d.GridSample, attrs), (x, grid)
    path = tmp_path / "half.onnx"
    opbridge.export(model, args, path, exporter="dynamo")
    record = opbridge.verify(path, (model, args))
    assert record.exit_code == 0, record.table()
    assert all(tol.rtol == 1e-2 for tol, _ in record.tolerances.values()), record.tolerances
