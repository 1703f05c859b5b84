"""ONNX function bodies of the built-in ops (see :mod:`opbridge.functions`).

Each builder takes the op's spec and the model's default opset and returns a
FunctionProto written with standard ops for that opset. The elementwise bodies
(Sigmoid, Mul, Add, Sub) are valid in every opset; the resize body is built for
opsets 11 and later (the node list below is the one for opset 15+; earlier
opsets slice the shapes with Slice, pass empty roi/scales to Resize-11, and in
opset 11, whose Constant has no int attribute, read the flag from
``EyeLike(k=@align_corners)``). :func:`~opbridge.functions.make_body` declares each
op's attributes with the op's defaults, so a node that omits one (a hand-written
file, another exporter) runs the body with the op's default, e.g.
``align_corners=False`` selects the ``half_pixel`` branch.

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


def _cubic_resize(output: str, mode: str, opset: int) -> onnx.NodeProto:
    from onnx import helper

    # Resize-11/12 take roi and scales as inputs (empty tensors here); from 13 on they may be omitted.
    inputs = ["input", "", "", "sizes"] if opset >= 13 else ["input", "empty_roi", "empty_scales", "sizes"]
    return helper.make_node(
        "Resize",
        inputs,
        [output],
        mode="cubic",
        cubic_coeff_a=RESIZE_CUBIC_COEFF,
        coordinate_transformation_mode=mode,
        exclude_outside=0,
        nearest_mode="round_prefer_floor",
    )


def _int64s(name: str, values: list[int]) -> onnx.NodeProto:
    from onnx import TensorProto, helper

    return helper.make_node(
        "Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64, [len(values)], values)
    )


def _sizes_nodes(opset: int) -> list[onnx.NodeProto]:
    """``sizes = Concat(input.shape[:2], size_tensor.shape[-2:])``."""
    from onnx import helper

    concat = helper.make_node("Concat", ["nc", "hw"], ["sizes"], axis=0)
    if opset >= 15:  # Shape with start/end
        return [
            helper.make_node("Shape", ["input"], ["nc"], start=0, end=2),
            helper.make_node("Shape", ["size_tensor"], ["hw"], start=-2),
            concat,
        ]
    return [
        helper.make_node("Shape", ["input"], ["input_shape"]),
        helper.make_node("Shape", ["size_tensor"], ["size_shape"]),
        _int64s("first", [0]),
        _int64s("second", [2]),
        _int64s("minus_two", [-2]),
        _int64s("last", [2**62]),
        helper.make_node("Slice", ["input_shape", "first", "second"], ["nc"]),
        helper.make_node("Slice", ["size_shape", "minus_two", "last"], ["hw"]),
        concat,
    ]


def _flag_nodes(opset: int) -> list[onnx.NodeProto]:
    """``align = bool(@align_corners)`` as a one-element tensor."""
    import onnx
    from onnx import helper

    if opset >= 12:  # Constant value_int
        flag = helper.make_node("Constant", [], ["align_flag"])
        flag.attribute.append(ref_attr("value_int", "align_corners", onnx.AttributeProto.INT))
        return [flag, helper.make_node("Cast", ["align_flag"], ["align"], to=onnx.TensorProto.BOOL)]
    # Opset 11's Constant takes no int attribute: EyeLike(zeros(1, 2), k=@align_corners)
    # puts its one 1 at column align_corners (0 or 1); column 1 is the flag.
    eye = helper.make_node("EyeLike", ["probe"], ["eye"])  # ONNX Runtime has no bool EyeLike
    eye.attribute.append(ref_attr("k", "align_corners", onnx.AttributeProto.INT))
    probe = helper.make_tensor("probe", onnx.TensorProto.FLOAT, [1, 2], [0.0, 0.0])
    return [
        helper.make_node("Constant", [], ["probe"], value=probe),
        eye,
        _int64s("column", [1]),
        _int64s("column_end", [2]),
        _int64s("axis1", [1]),
        helper.make_node("Slice", ["eye", "column", "column_end", "axis1"], ["align_flag"]),
        helper.make_node("Cast", ["align_flag"], ["align"], to=onnx.TensorProto.BOOL),
    ]


def dynamic_resize_body(spec: OpSpec, opset: int) -> onnx.FunctionProto:
    """Bicubic Resize of ``input`` to ``size_tensor``'s last two dims (see the module doc).

    Built for ``opset`` 11 (cubic Resize) and later; earlier opsets raise
    :class:`~opbridge.errors.OpDefinitionError`.
    """
    import onnx
    from onnx import helper

    from opbridge.errors import OpDefinitionError

    if opset < 11:
        raise OpDefinitionError(
            f"{spec.qualname}: the function body needs ONNX opset 11 or later (cubic Resize), the model uses "
            f"opset {opset}; export with opset_version >= 11, or with functions=False."
        )
    branch_out = onnx.TypeProto()  # the branches' output type follows from Resize
    then_branch = helper.make_graph(
        [_cubic_resize("resized_ac", "align_corners", opset)],
        "align_corners",
        [],
        [helper.make_value_info("resized_ac", branch_out)],
    )
    else_branch = helper.make_graph(
        [_cubic_resize("resized_hp", "half_pixel", opset)],
        "half_pixel",
        [],
        [helper.make_value_info("resized_hp", branch_out)],
    )
    nodes = _sizes_nodes(opset) + _flag_nodes(opset)
    if opset < 13:
        empty = onnx.TensorProto.FLOAT
        nodes += [
            helper.make_node("Constant", [], ["empty_roi"], value=helper.make_tensor("empty_roi", empty, [0], [])),
            helper.make_node(
                "Constant", [], ["empty_scales"], value=helper.make_tensor("empty_scales", empty, [0], [])
            ),
        ]
    nodes.append(helper.make_node("If", ["align"], ["output"], then_branch=then_branch, else_branch=else_branch))
    return make_body(spec, nodes, opset)
