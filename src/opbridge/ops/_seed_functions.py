"""ONNX function bodies of the built-in ops (see :mod:`opbridge.functions`).

Each builder takes the op's spec and the model's default opset and returns a
FunctionProto written with standard ops. The ops used (Sigmoid, Mul, Add, Sub,
Shape with start/end, Concat, Cast, Constant, If, Resize) exist with the
semantics used here in every opset from 15 on.

``Test::DynamicTRTResize`` decomposes into::

    nc    = Shape(input, start=0, end=2)
    hw    = Shape(size_tensor, start=-2)
    sizes = Concat(nc, hw, axis=0)
    flag  = Cast(Constant(value_int <- @align_corners), to=BOOL)
    output = If(flag,
                then: Resize(input, , , sizes, mode=cubic, cubic_coeff_a=-0.75,
                             coordinate_transformation_mode=align_corners),
                else: Resize(..., coordinate_transformation_mode=half_pixel))

A function body cannot turn an INT attribute into a string attribute, so the
``align_corners`` attribute picks one of two Resize nodes through a Constant
that references it and an If; only the chosen branch runs (a Where over two
Resize nodes would compute both).

``half_pixel`` rather than ``pytorch_half_pixel``: both map output index x to
``(x + 0.5) * in / out - 0.5``, which is PyTorch's rule for
``align_corners=False``, except that ``pytorch_half_pixel`` maps every index of
an output dim of length 1 to 0, where PyTorch (and ``half_pixel``) take the
centre ``in / 2 - 0.5``. With ``half_pixel`` the body matches PyTorch for
output dims of length 1 too (see docs/functions_and_reference.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from opbridge.functions import make_body, ref_attr

if TYPE_CHECKING:
    import onnx

    from opbridge.spec import OpSpec

__all__ = [
    "RESIZE_CUBIC_COEFF",
    "dynamic_resize_body",
    "myselu_body",
    "strange_op2_body",
    "strange_op_body",
]

#: PyTorch's bicubic uses Keys' cubic convolution with a = -0.75.
RESIZE_CUBIC_COEFF = -0.75


def myselu_body(spec: OpSpec, opset: int) -> onnx.FunctionProto:
    """``output = x * Sigmoid(x)``; ``p``, ``c`` and the attributes are not used."""
    from onnx import helper

    nodes = [
        helper.make_node("Sigmoid", ["x"], ["sig"]),
        helper.make_node("Mul", ["x", "sig"], ["output"]),
    ]
    return make_body(spec, nodes, opset)


def strange_op_body(spec: OpSpec, opset: int) -> onnx.FunctionProto:
    """``sum = x + weight``, ``affine = x * weight + bias``."""
    from onnx import helper

    nodes = [
        helper.make_node("Add", ["x", "weight"], ["sum"]),
        helper.make_node("Mul", ["x", "weight"], ["prod"]),
        helper.make_node("Add", ["prod", "bias"], ["affine"]),
    ]
    return make_body(spec, nodes, opset)


def strange_op2_body(spec: OpSpec, opset: int) -> onnx.FunctionProto:
    """``output = input1 + input2 - bias``."""
    from onnx import helper

    nodes = [
        helper.make_node("Add", ["input1", "input2"], ["total"]),
        helper.make_node("Sub", ["total", "bias"], ["output"]),
    ]
    return make_body(spec, nodes, opset)


def _cubic_resize(output: str, mode: str) -> onnx.NodeProto:
    from onnx import helper

    return helper.make_node(
        "Resize",
        ["input", "", "", "sizes"],
        [output],
        mode="cubic",
        cubic_coeff_a=RESIZE_CUBIC_COEFF,
        coordinate_transformation_mode=mode,
        exclude_outside=0,
        nearest_mode="round_prefer_floor",
    )


def dynamic_resize_body(spec: OpSpec, opset: int) -> onnx.FunctionProto:
    """Bicubic Resize of ``input`` to ``size_tensor``'s last two dims (see the module doc)."""
    import onnx
    from onnx import helper

    flag = helper.make_node("Constant", [], ["align_flag"])
    flag.attribute.append(ref_attr("value_int", "align_corners", onnx.AttributeProto.INT))
    branch_out = onnx.TypeProto()  # the branches' output type follows from Resize
    then_branch = helper.make_graph(
        [_cubic_resize("resized_ac", "align_corners")],
        "align_corners",
        [],
        [helper.make_value_info("resized_ac", branch_out)],
    )
    else_branch = helper.make_graph(
        [_cubic_resize("resized_hp", "half_pixel")],
        "half_pixel",
        [],
        [helper.make_value_info("resized_hp", branch_out)],
    )
    nodes = [
        helper.make_node("Shape", ["input"], ["nc"], start=0, end=2),
        helper.make_node("Shape", ["size_tensor"], ["hw"], start=-2),
        helper.make_node("Concat", ["nc", "hw"], ["sizes"], axis=0),
        flag,
        helper.make_node("Cast", ["align_flag"], ["align"], to=onnx.TensorProto.BOOL),
        helper.make_node("If", ["align"], ["output"], then_branch=then_branch, else_branch=else_branch),
    ]
    return make_body(spec, nodes, opset)
