"""Both PyTorch exporters emit each detection op as one typed ``mmdeploy`` custom node."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def _invalid_detection_calls() -> list[tuple[str, Any, tuple, dict, str]]:
    """Calls of the detection ops that their references refuse: (id, op, args, attrs, the refusal)."""
    import torch

    from opbridge.ops import detection as d

    return [
        (
            "dcn-offset-of-another-stride",  # stride 2 on 6 x 6 gives 3 x 3, not offset's 6 x 6
            d.ModulatedDeformConv2d,
            (torch.randn(1, 4, 6, 6), torch.randn(1, 18, 6, 6), torch.rand(1, 9, 6, 6), torch.randn(4, 4, 3, 3), None),
            {"stride": [2, 2], "padding": [1, 1]},
            r"expected offset \(1, 18, 3, 3\)",
        ),
        (
            "nms-num-classes",
            d.BatchedNMS,
            (torch.rand(1, 6, 1, 4), torch.rand(1, 6, 3)),
            {"num_classes": 5, "keep_topk": 4},
            "scores' last dim must equal num_classes",
        ),
        (
            "roi-rois-of-4",
            d.RoIAlign,
            (torch.randn(1, 2, 8, 8), torch.rand(3, 4)),
            {},
            r"rois must be \(num_rois, 5\)",
        ),
        (
            "mlroi-strides",
            d.MultiLevelRoiAlign,
            (torch.tensor([[0, 0, 0, 30, 30.0]]), torch.randn(1, 2, 16, 16), torch.randn(1, 2, 8, 8)),
            {"featmap_strides": [4.0, 8.0, 16.0]},
            "give one stride per feature map",
        ),
    ]


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("case", _invalid_detection_calls(), ids=lambda c: c[0])
def test_an_invalid_call_is_refused_by_either_exporter(case: tuple, exporter: str, tmp_path: Path) -> None:
    """The shape rules run the references' checks on the sizes they know. torch.export traces the op by its
    shape rule, which took offset's dims for the output (a DCNv2 file declared 6 x 6 where 3 x 3 comes) and
    checked none of the other calls: the dynamo export wrote files that fail in every runtime."""
    _, opdef, args, attrs, refusal = case
    target = tmp_path / "m.onnx"
    with pytest.raises(opbridge.ExportError, match=refusal):
        opbridge.export(_Call(opdef, attrs).eval(), args, target, exporter=exporter)
    assert not target.exists()


def test_the_shape_rules_leave_symbolic_sizes_unjudged() -> None:
    """With dynamic dims (ONNX's named ones here) the rules check what they know and give the sizes."""
    import torch

    from opbridge import SymDim, TensorInfo
    from opbridge.ops import detection as d
    from opbridge.shape import output_infos

    n, h = SymDim("n"), SymDim("h")
    f32 = torch.float32
    dcn = output_infos(
        d.ModulatedDeformConv2d.spec,
        d.ModulatedDeformConv2d.shape_rule,
        d.ModulatedDeformConv2d.reference,
        [
            TensorInfo((n, 4, h, h), f32),
            TensorInfo((n, 18, h, h), f32),
            TensorInfo((n, 9, h, h), f32),
            TensorInfo((8, 4, 3, 3), f32),
            None,
        ],
        d.ModulatedDeformConv2d.spec.bind_attributes({"padding": [1, 1]}),
    )
    assert dcn[0].shape == (n, 8, h, h)
    nms = d.BatchedNMS
    dets, labels = output_infos(
        nms.spec,
        nms.shape_rule,
        nms.reference,
        [TensorInfo((n, SymDim("boxes"), 1, 4), f32), TensorInfo((n, SymDim("boxes"), 3), f32)],
        nms.spec.bind_attributes({"num_classes": 3, "keep_topk": 7}),
    )
    assert dets.shape == (n, 7, 5) and labels.shape == (n, 7)
    with pytest.raises(ValueError, match="return_index=1"):
        output_infos(
            nms.spec,
            nms.shape_rule,
            nms.reference,
            [TensorInfo((n, 6, 1, 4), f32), TensorInfo((n, 6, 3), f32)],
            nms.spec.bind_attributes({"num_classes": 3, "return_index": True}),
        )
