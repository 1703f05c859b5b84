"""Small ONNX models built in code for the graph-tool tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def make_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[tuple[str, int, Sequence[Any] | None]],
    outputs: Sequence[tuple[str, int, Sequence[Any] | None]],
    *,
    initializers: Sequence[tuple[str, np.ndarray]] = (),
    domains: dict[str, int] | None = None,
    functions: Sequence[onnx.FunctionProto] = (),
    opset: int = OPSET,
) -> onnx.ModelProto:
    """A model from nodes, (name, elem_type, shape) inputs/outputs, numpy initializers and extra opset imports."""
    graph = helper.make_graph(
        list(nodes),
        "test",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        [numpy_helper.from_array(a, name=n) for n, a in initializers],
    )
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in (domains or {}).items()]
    model = helper.make_model(graph, opset_imports=imports, functions=list(functions))
    model.ir_version = 8
    return model


def custom_node_model(
    op_type: str = "Foo", domain: str = "acme", *, with_import: bool = True, **attrs: Any
) -> onnx.ModelProto:
    """x -> Relu -> domain::op_type(attrs) -> y."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node(op_type, ["a"], ["y"], domain=domain, name="custom", **attrs),
    ]
    domains = {domain: 1} if with_import and domain not in ("", "ai.onnx") else {}
    return make_model(nodes, [("x", TensorProto.FLOAT, [2, 3])], [("y", TensorProto.FLOAT, [2, 3])], domains=domains)


def legacy_model(op_type: str, opset: int, domain: str = "") -> onnx.ModelProto:
    """One ``op_type`` node of ``domain`` (a default-domain op of a legacy export by default) in a model of
    default opset ``opset``: float32 x[2] -> y[2]."""
    graph = helper.make_graph(
        [helper.make_node(op_type, ["x"], ["y"], name="legacy0", domain=domain)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(graph, opset_imports=imports)


def swish_function(domain: str, name: str) -> onnx.FunctionProto:
    """A model-local function ``domain::name(x) = x * sigmoid(x)``."""
    return helper.make_function(
        domain,
        name,
        ["x"],
        ["y"],
        [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])],
        [helper.make_opsetid("", OPSET)],
    )


def resize_model(
    mode: str = "cubic",
    *,
    scales: str = "initializer",
    coord: str = "half_pixel",
    scale_values: Sequence[float] = (1.0, 1.0, 2.0, 2.0),
    shape: Sequence[Any] = ("N", 3, "H", "W"),
) -> onnx.ModelProto:
    """X -> Resize(mode, scales) -> Y, with scales given as:

    * ``initializer``: an initializer;
    * ``constant``: a Constant node;
    * ``folded-chain``: Mul of two Constant nodes (constant-computable, not an initializer);
    * ``input``: computed at run time from a graph input ``s`` (float [1]): Concat([1, 1], s, s);
    * ``sizes-runtime``: sizes = Shape(X) * [1, 1, 2, 2] (computed at run time).
    """
    nodes: list[onnx.NodeProto] = []
    inputs: list[tuple[str, int, Any]] = [("X", TensorProto.FLOAT, list(shape))]
    inits: list[tuple[str, np.ndarray]] = []
    values = np.array(scale_values, np.float32)
    resize_inputs = ["X", "", "scales"]
    if scales == "initializer":
        inits.append(("scales", values))
    elif scales == "constant":
        nodes.append(
            helper.make_node("Constant", [], ["scales"], value=numpy_helper.from_array(values), name="scales_const")
        )
    elif scales == "folded-chain":
        nodes += [
            helper.make_node(
                "Constant", [], ["ones"], value=numpy_helper.from_array(np.ones(4, np.float32)), name="c1"
            ),
            helper.make_node("Constant", [], ["raw"], value=numpy_helper.from_array(values), name="c2"),
            helper.make_node("Mul", ["ones", "raw"], ["scales"], name="scales_mul"),
        ]
    elif scales == "input":
        inputs.append(("s", TensorProto.FLOAT, [1]))
        inits.append(("one_one", np.ones(2, np.float32)))
        nodes.append(helper.make_node("Concat", ["one_one", "s", "s"], ["scales"], axis=0, name="scales_concat"))
    elif scales == "sizes-runtime":
        inits.append(("factor", np.array([1, 1, 2, 2], np.int64)))
        nodes += [
            helper.make_node("Shape", ["X"], ["xshape"], name="shape"),
            helper.make_node("Mul", ["xshape", "factor"], ["sizes"], name="sizes_mul"),
        ]
        resize_inputs = ["X", "", "", "sizes"]
    else:
        raise ValueError(scales)
    attrs: dict[str, Any] = {"mode": mode, "coordinate_transformation_mode": coord}
    if mode == "cubic":
        attrs["cubic_coeff_a"] = -0.75
    nodes.append(helper.make_node("Resize", resize_inputs, ["Y"], name="resize", **attrs))
    return make_model(nodes, inputs, [("Y", TensorProto.FLOAT, None)], initializers=inits)


def seed003_srcnn() -> Any:
    """Seed 003's super-resolution model: bicubic ``interpolate(scale_factor=upscale_factor.item())``.

    ``.item()`` turns the scale tensor into a Python number while tracing, so the
    exported Resize holds a constant scale (with a TracerWarning as the only sign).
    """
    import torch
    import torch.nn.functional as F
    from torch import nn

    class SRCNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(3)
            self.conv1 = nn.Conv2d(3, 8, kernel_size=9, padding=4)
            self.conv2 = nn.Conv2d(8, 4, kernel_size=1, padding=0)
            self.conv3 = nn.Conv2d(4, 3, kernel_size=5, padding=2)
            self.relu = nn.ReLU()

        def forward(self, x: torch.Tensor, upscale_factor: torch.Tensor) -> torch.Tensor:
            x = F.interpolate(x, scale_factor=upscale_factor.item(), mode="bicubic", align_corners=False)
            out = self.relu(self.conv1(x))
            out = self.relu(self.conv2(out))
            return self.conv3(out)

    return SRCNN().eval()


def export_seed003(path: Any, scale: float = 3.0) -> Any:
    """Export :func:`seed003_srcnn` with ``torch.onnx.export(..., dynamo=False)`` at ``scale``; returns (model, path)."""
    import warnings

    import torch

    model = seed003_srcnn()
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (x, torch.tensor([scale])),
            str(path),
            dynamo=False,
            opset_version=OPSET,
            input_names=["input", "factor"],
            output_names=["output"],
            dynamic_axes={"input": {2: "height", 3: "width"}},
        )
    return model, path


def one_op_model(op: str, elem: int, opset: int, inputs: int = 1) -> onnx.ModelProto | None:
    """One ``op`` node (named "n") on ``inputs`` inputs of type ``elem``, its output typed by strict shape
    inference; None where inference or the full check refuses it."""
    names = [f"x{i}" for i in range(inputs)]
    graph = helper.make_graph(
        [helper.make_node(op, names, ["y"], name="n")],
        "g",
        [helper.make_tensor_value_info(n, elem, [2, 3]) for n in names],
        [],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True).graph.value_info
        typed = [v for v in inferred if v.name == "y" and v.type.tensor_type.elem_type]
        if not typed:
            return None
        model.graph.output.append(typed[0])
        onnx.checker.check_model(model, full_check=True)
    except Exception:
        return None
    return model
