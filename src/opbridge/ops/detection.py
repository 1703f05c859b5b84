"""Detection and super-resolution ops, defined once for every runtime opbridge serves.

The ops carry MMDeploy's ONNX identities (domain ``mmdeploy``, MMDeploy's op
types and attribute names and types), so a model exported by MMDeploy's
TorchScript rewriters and a model exported by opbridge hold the same nodes:

* :data:`GridSample` (``mmdeploy::grid_sampler``): ``F.grid_sample``;
  ``interpolation_mode`` 0 bilinear, 1 nearest, 2 bicubic; ``padding_mode``
  0 zeros, 1 border, 2 reflection. Function body: ONNX ``GridSample`` for bilinear and
  bicubic, nearest written out in standard ops (ONNX's GridSample rounds before it
  reflects); models at opset >= 16, see :func:`grid_sampler_function`; CPU kernel: opbridge's native
  kernel for float32 inputs with enough channels (:mod:`opbridge.ops._gridsample_cpu`),
  else PyTorch's own CPU grid_sample. For NaN, infinite and huge coordinates the GPU
  kernels give what PyTorch's CUDA kernels give and the CPU kernels what its CPU
  kernel gives; the two differ for bilinear with zeros padding (0 from PyTorch's CUDA
  kernel, NaN on the CPU and from cuDNN's sampler, which F.grid_sample takes on CUDA
  with ``align_corners=True`` where cuDNN is enabled).
* :data:`ModulatedDeformConv2d` (``mmdeploy::MMCVModulatedDeformConv2d``):
  DCNv2, torchvision ``deform_conv2d(..., mask=mask)``. Function body: ONNX
  ``DeformConv`` (models at opset >= 19); CPU kernel (torch: one grid_sample
  per deform group and one matmul).
* :data:`RoIAlign` (``mmdeploy::MMCVRoiAlign``): MMCV ``roi_align`` (torchvision
  ``roi_align`` for mode "avg", plus mode "max"). CPU kernel: opbridge's native kernel
  (:mod:`opbridge.ops._roialign_cpu`; float16 and float64 features computed in float32, as the
  reference does), numpy where the extension is not built.
* :data:`MultiLevelRoiAlign` (``mmdeploy::MMCVMultiLevelRoiAlign``): MMDet's
  ``SingleRoIExtractor`` over up to 5 FPN levels. CPU kernel: the RoIAlign kernel per level.
* :data:`BatchedNMS` (``mmdeploy::TRTBatchedNMS``): MMDeploy's TensorRT batched
  NMS with fixed-size padded outputs. CPU kernel (numpy).

Each op also has a GPU kernel (Triton, imported on first call; grid_sample on small planes in
bilinear, nearest and, with zeros padding, bicubic mode a CUDA kernel,
:mod:`opbridge.ops._gridsample_cuda`) registered with ``register_gpu_kernel``; see
:mod:`opbridge.ops._detection_gpu`.

Example:
    >>> import torch
    >>> from opbridge.ops.detection import GridSample
    >>> x = torch.arange(4.0).view(1, 1, 2, 2)
    >>> GridSample(x, torch.zeros(1, 1, 1, 2), align_corners=True).item()
    1.5
"""

from __future__ import annotations

from typing import Any, Literal

import torch

import opbridge
from opbridge.ops import _detection_cpu as cpu
from opbridge.ops import _detection_gpu as gpu
from opbridge.ops import _detection_ref as ref
from opbridge.shape import TensorInfo
from opbridge.spec import Tolerance

__all__ = [
    "BatchedNMS",
    "GridSample",
    "ModulatedDeformConv2d",
    "MultiLevelRoiAlign",
    "RoIAlign",
    "detection_ops",
    "grid_sampler_function",
]

DOMAIN = "mmdeploy"
_HALF = {"float16": Tolerance(rtol=1e-2, atol=1e-2)}

# --------------------------------------------------------------------------- grid_sampler


# PyTorch's float16 grid_sample on the CPU rounds its intermediates to float16: up to 0.016 from the
# float32 result on values of a few units (bilinear and bicubic), where runtimes compute in float32. In
# float32 the runtimes' GridSample (the body) rounds the sampling coordinates otherwise than PyTorch: on a
# standard-normal 300 x 400 input up to 7.4e-5 (ONNX Runtime) and 2.3e-4 (OpenVINO) from F.grid_sample
# (2026-12-02), against an absolute default of 1e-5; a sample taken at another pixel is off by whole units.
@opbridge.op(
    f"{DOMAIN}::grid_sampler",
    tolerances={"float16": Tolerance(rtol=1e-2, atol=2e-2), "float32": Tolerance(rtol=1e-3, atol=5e-4)},
)
def GridSample(
    input: torch.Tensor,
    grid: torch.Tensor,
    interpolation_mode: Literal[0, 1, 2] = 0,
    padding_mode: Literal[0, 1, 2] = 0,
    align_corners: bool = False,
) -> torch.Tensor:
    """Sample input (N, C, H, W) at grid (N, Ho, Wo, 2) in [-1, 1], as F.grid_sample."""
    return ref.grid_sample(input, grid, interpolation_mode, padding_mode, align_corners)


@GridSample.register_shape
def _grid_shape(
    x: Any,
    grid: Any,
    *,
    interpolation_mode: int,
    padding_mode: int,
    align_corners: bool,
) -> TensorInfo:
    ref.check_choice(
        "mmdeploy::grid_sampler",
        "interpolation_mode",
        interpolation_mode,
        ref.GRID_MODES,
    )
    ref.check_choice("mmdeploy::grid_sampler", "padding_mode", padding_mode, ref.GRID_PADDINGS)
    ref.check_grid_shapes(tuple(x.shape), tuple(grid.shape))
    return TensorInfo((x.shape[0], x.shape[1], grid.shape[1], grid.shape[2]), x.dtype)


def grid_sampler_function(opset: int) -> Any:
    """An ONNX function body of grid_sampler for a model whose default opset is ``opset`` (>= 16).

    One branch per (mode, padding, align_corners) code, chosen by nested ``If`` on the
    integer attributes (a mode or padding the kernels refuse gives NaN outputs, not another
    branch's): a standard ``GridSample`` for bilinear and bicubic, nearest sampling
    written out in standard ops (:func:`_nearest_nodes`). GridSample's mode names changed at
    opset 20 ("bilinear"/"bicubic" became "linear"/"cubic") and a model-local
    function must use the model's own default opset, so the body depends on the
    model's opset; export builds it for the model's opset (below 16 there is no
    body and the node runs through the CPU kernel).

    Example:
        >>> grid_sampler_function(17).name
        'grid_sampler'
    """
    import onnx
    from onnx import helper

    def const_int(out: str, attr: str) -> onnx.NodeProto:
        node = helper.make_node("Constant", [], [out])
        ref_attr = onnx.AttributeProto()
        ref_attr.name, ref_attr.ref_attr_name, ref_attr.type = (
            "value_int",
            attr,
            onnx.AttributeProto.INT,
        )
        node.attribute.append(ref_attr)
        return node

    nodes = [
        # the grid in the input's dtype, as the reference takes it (ONNX Runtime has no GridSample kernel of
        # a float32 input and a float64 grid)
        helper.make_node("CastLike", ["grid_given", "input"], ["grid"]),
        const_int("m", "interpolation_mode"),
        const_int("p", "padding_mode"),
        const_int("a_given", "align_corners"),
        helper.make_node("Constant", [], ["zero"], value_int=0),
        helper.make_node("Constant", [], ["three"], value_int=3),
        helper.make_node("Constant", [], ["six"], value_int=6),
        helper.make_node("Constant", [], ["two"], value_int=2),
        helper.make_node("Constant", [], ["invalid"], value_int=-1),
        # align_corners is a bool: any value but 0 is true, as for the kernels
        helper.make_node("Equal", ["a_given", "zero"], ["a_false"]),
        helper.make_node("Not", ["a_false"], ["a_true"]),
        helper.make_node("Cast", ["a_true"], ["a"], to=onnx.TensorProto.INT64),
        helper.make_node("Mul", ["m", "six"], ["m6"]),
        helper.make_node("Mul", ["p", "two"], ["p2"]),
        helper.make_node("Add", ["m6", "p2"], ["mp"]),
        helper.make_node("Add", ["mp", "a"], ["code_given"]),
        # a mode or padding outside 0..2 (which the kernels refuse) selects no sampling: NaN outputs
        helper.make_node("Less", ["m", "zero"], ["m_low"]),
        helper.make_node("Less", ["m", "three"], ["m_below"]),
        helper.make_node("Less", ["p", "zero"], ["p_low"]),
        helper.make_node("Less", ["p", "three"], ["p_below"]),
        helper.make_node("Or", ["m_low", "p_low"], ["low"]),
        helper.make_node("And", ["m_below", "p_below"], ["below"]),
        helper.make_node("Not", ["low"], ["not_low"]),
        helper.make_node("And", ["not_low", "below"], ["valid"]),
        helper.make_node("Where", ["valid", "code_given", "invalid"], ["code"]),
    ]
    if opset < 16:
        raise ValueError(f"mmdeploy::grid_sampler: ONNX GridSample needs opset >= 16; the model has opset {opset}.")
    modes = ref.GRID_MODES if opset < 20 else ("linear", "nearest", "cubic")
    combos = [(m, p, a) for m in range(3) for p in range(3) for a in range(2)]

    def branch(i: int, out: str) -> onnx.GraphProto:
        m, p, a = combos[i] if i < len(combos) else (0, 0, 0)
        sample: list[onnx.NodeProto] = [
            helper.make_node(
                "GridSample",
                ["input", "grid"],
                [out],
                mode=modes[m],
                padding_mode=ref.GRID_PADDINGS[p],
                align_corners=a,
            )
        ]
        if m == 1:
            sample = _nearest_nodes(p, a, out, f"n{i}_")
        if i == len(combos):  # no valid code: NaN in the output's shape
            sample = [
                helper.make_node("GridSample", ["input", "grid"], ["any"], mode=modes[0], align_corners=0),
                helper.make_node("Constant", [], ["nan"], value_float=float("nan")),
                helper.make_node("CastLike", ["nan", "any"], ["nan_like"]),
                helper.make_node("Mul", ["any", "nan_like"], [out]),
            ]
            return helper.make_graph(sample, f"gs{i}", [], [helper.make_value_info(out, onnx.TypeProto())])
        k = helper.make_node("Constant", [], [f"k{i}"], value_int=i)
        eq = helper.make_node("Equal", ["code", f"k{i}"], [f"is{i}"])
        node = helper.make_node(
            "If",
            [f"is{i}"],
            [out],
            then_branch=helper.make_graph(sample, f"gs{i}", [], [helper.make_value_info(out, onnx.TypeProto())]),
            else_branch=branch(i + 1, f"r{i + 1}"),
        )
        return helper.make_graph(
            [k, eq, node],
            f"sel{i}",
            [],
            [helper.make_value_info(out, onnx.TypeProto())],
        )

    top = branch(0, "output")
    nodes.extend(top.node)
    return helper.make_function(
        DOMAIN,
        "grid_sampler",
        ["input", "grid_given"],
        ["output"],
        nodes,
        [helper.make_opsetid("", opset)],
        ["interpolation_mode", "padding_mode", "align_corners"],
    )


def _nearest_nodes(padding: int, align: int, out: str, p: str) -> list[Any]:
    """Nearest sampling written out in standard ops (``p`` prefixes the names), ATen's CPU kernel
    operation by operation: the unnormalized coordinate as one fused multiply-add (computed in
    float64, where it is exact, and rounded to float32 once), the padding, the rounding half to even,
    then a gather. ONNX's GridSample rounds before it reflects: at a half-pixel coordinate outside the
    plane (-2.5 on 4 pixels, say) reflection without ``align_corners`` then picks another pixel than
    ``F.grid_sample``. Coordinates are float32 whatever the grid's dtype (PyTorch samples float16
    grids so)."""
    from onnx import TensorProto, helper

    f32, f64, i64 = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64
    nodes: list[Any] = []

    def op(kind: str, inputs: list[str], name: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(kind, inputs, [p + name], **attrs))
        return p + name

    def const(name: str, value: float | int | list[int], dtype: int) -> str:
        values = value if isinstance(value, list) else [value]
        tensor = helper.make_tensor(p + name, dtype, [len(values)] if isinstance(value, list) else [], values)
        return op("Constant", [], name, value=tensor)

    shape = op("Shape", ["input"], "shape")
    g = op("Cast", ["grid"], "g", to=f32)
    one = const("one", 1.0, f32)

    def axis(index: int, which: str) -> tuple[str, str]:
        """(the coordinate rounded to a pixel, whether it reads the plane) along one axis."""
        size = op("Gather", [shape, const(f"dim{which}", 3 - index, i64)], f"size{which}")
        size_f = op("Cast", [size], f"sizef{which}", to=f32)
        coord = op("Gather", [g, const(f"comp{which}", index, i64)], f"coord{which}", axis=3)
        shifted = op("Add", [coord, one], f"plus1{which}")  # g + 1, rounded in float32 as ATen does
        if align:
            scale = op("Div", [op("Sub", [size_f, one], f"last{which}"), const(f"two{which}", 2.0, f32)], f"sc{which}")
            v = op("Mul", [shifted, scale], f"u{which}")
        else:
            scale = op("Cast", [size_f], f"szd{which}", to=f64)
            half = const(f"half{which}", 0.5, f64)
            product = op(
                "Mul",
                [op("Cast", [shifted], f"sd{which}", to=f64), op("Mul", [scale, half], f"s2{which}")],
                f"pd{which}",
            )
            v = op("Cast", [op("Sub", [product, half], f"ud{which}")], f"u{which}", to=f32)
        last = op("Sub", [size_f, one], f"max{which}")
        zero = const(f"zero{which}", 0.0, f32)

        def clip(x: str) -> str:  # NaN becomes 0, then v > 0 ? v : 0, then v < size - 1 ? v : size - 1
            # (NaN explicitly: OpenVINO's CPU plugin gives Greater(NaN, 0) true)
            x = op("Where", [op("IsNaN", [x], f"nan{which}"), zero, x], f"num{which}")
            low = op("Where", [op("Greater", [x, zero], f"gt{which}"), x, zero], f"lo{which}")
            return op("Where", [op("Less", [low, last], f"lt{which}"), low, last], f"cl{which}")

        if padding == 2:  # ATen's reflection: |v - low| folded into twice the span, by one fused multiply-add
            low_v = const(f"low{which}", 0.0 if align else -0.5, f32)
            twice = op("Mul", [last if align else size_f, const(f"tw{which}", 2.0, f32)], f"ts{which}")
            abs_in = op("Abs", [op("Sub", [v, low_v], f"d{which}")], f"abs{which}")
            flips = op("Floor", [op("Div", [abs_in, twice], f"q{which}")], f"fl{which}")
            exact = op(
                "Sub",
                [
                    op("Cast", [abs_in], f"ad{which}", to=f64),
                    op(
                        "Mul",
                        [op("Cast", [flips], f"fd{which}", to=f64), op("Cast", [twice], f"td{which}", to=f64)],
                        f"ft{which}",
                    ),
                ],
                f"ed{which}",
            )
            extra = op("Cast", [exact], f"ex{which}", to=f32)
            back = op("Sub", [twice, extra], f"bk{which}")
            folded = op("Where", [op("Less", [extra, back], f"lb{which}"), extra, back], f"mn{which}")
            v = clip(op("Add", [folded, low_v], f"rf{which}"))
        elif padding == 1:
            v = clip(v)
        r = op("Round", [v], f"r{which}")
        inside = op(
            "And",
            [op("Greater", [r, const(f"m1{which}", -1.0, f32)], f"a{which}"), op("Less", [r, size_f], f"b{which}")],
            f"in{which}",
        )
        return op("Cast", [op("Where", [inside, r, zero], f"rs{which}")], f"i{which}", to=i64), inside

    ix, in_x = axis(0, "x")
    iy, in_y = axis(1, "y")
    width = op("Gather", [shape, const("dimw", 3, i64)], "w")
    index = op("Add", [op("Mul", [iy, width], "row"), ix], "idx")  # (N, Ho, Wo); 0 where outside
    ok = op("And", [in_x, in_y], "ok")
    # one Gather from the flattened input (onnx.reference's GatherElements takes at most 64 indices
    # per position): element (n, c, q) reads (n * C + c) * H * W + index[n, q]
    n_scalar = op("Gather", [shape, const("d0", 0, i64)], "nsz")
    c_scalar = op("Gather", [shape, const("d1", 1, i64)], "csz")
    plane = op("Mul", [op("Gather", [shape, const("d2", 2, i64)], "hsz"), width], "plane")
    zero_i, one_i = const("z_i", 0, i64), const("o_i", 1, i64)
    rows = op("Unsqueeze", [op("Range", [zero_i, n_scalar, one_i], "rn"), const("ax_n", [1], i64)], "rn2")
    cols = op("Unsqueeze", [op("Range", [zero_i, c_scalar, one_i], "rc"), const("ax_c", [0], i64)], "rc2")
    planes = op("Add", [op("Mul", [rows, c_scalar], "rnc"), cols], "nc_index")  # (N, C)
    base = op("Unsqueeze", [op("Mul", [planes, plane], "base0"), const("ax_l", [2], i64)], "base")  # (N, C, 1)
    # (Flatten, not a Reshape to (N, 1, -1): the -1 cannot be worked out where N is 0, and ONNX Runtime
    # rewrites a shape computed from the grid's into one)
    index3 = op("Unsqueeze", [op("Flatten", [index], "idx2", axis=1), const("ax_1", [1], i64)], "idx3")  # (N, 1, L)
    flat = op("Reshape", ["input", const("m1", [-1], i64)], "flat")
    picked = op("Gather", [flat, op("Add", [base, index3], "gidx")], "picked", axis=0)  # (N, C, L)
    nc = op("Slice", [shape, const("s0", [0], i64), const("s2", [2], i64)], "nc")
    grid_shape = op("Shape", ["grid"], "gshape")
    hw = op("Slice", [grid_shape, const("u1", [1], i64), const("u3", [3], i64)], "hw")
    values = op("Reshape", [picked, op("Concat", [nc, hw], "oshape", axis=0)], "vals")
    mask = op("Unsqueeze", [ok, const("ax1", [1], i64)], "mask")
    zero_out = op("CastLike", [const("zo", 0.0, f32), "input"], "zout")
    nodes.append(helper.make_node("Where", [mask, values, zero_out], [out]))
    return nodes


# ONNX Runtime 1.32's GridSample runs slower than the op's kernel at every size benchmarks/cpu_ops.py
# times (through opbridge's session: linear 1.4-2.5x, nearest 4-9x, cubic 7-17x), so the session runs
# every grid_sampler node through the kernel.
@GridSample.register_function(prefer_kernel=True)
def _grid_sampler_body(spec: Any, opset: int) -> Any:
    return grid_sampler_function(opset) if opset >= 16 else None


def _gridsample_native(attrs: Any) -> Any:
    from opbridge.ops import _gridsample_cpu

    return _gridsample_cpu.native_kernel(attrs)


GridSample.register_kernel(cpu.grid_sample, kind="torch", native=_gridsample_native)
GridSample.register_gpu_kernel(gpu.grid_sampler, dtypes=("float32", "float16"))


# --------------------------------------------------------------------------- DCNv2


@opbridge.op(f"{DOMAIN}::MMCVModulatedDeformConv2d", tolerances=_HALF)
def ModulatedDeformConv2d(
    input: torch.Tensor,
    offset: torch.Tensor,
    mask: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride: list[int] = [1, 1],  # noqa: B006 - defaults are normalised to tuples
    padding: list[int] = [0, 0],  # noqa: B006
    dilation: list[int] = [1, 1],  # noqa: B006
    groups: int = 1,
    deform_groups: int = 1,
) -> torch.Tensor:
    """Modulated deformable convolution (DCNv2), as torchvision deform_conv2d with a mask."""
    return ref.deform_conv2d(
        input,
        offset,
        mask,
        weight,
        bias,
        tuple(stride),
        tuple(padding),
        tuple(dilation),
        groups,
        deform_groups,
    )


def _static(*shapes: Any) -> bool:
    """Whether every dim of ``shapes`` is an int: the reference's shape checks run whole then. With a symbolic
    dim (torch.export's, a TensorRT build's dynamic one, ONNX's named one) a rule checks what needs no size."""
    return all(isinstance(d, int) for shape in shapes for d in shape)


@ModulatedDeformConv2d.register_shape
def _dcn_shape(
    x: Any,
    offset: Any,
    mask: Any,
    weight: Any,
    bias: Any,
    *,
    stride: Any,
    padding: Any,
    dilation: Any,
    groups: int,
    deform_groups: int,
    **_: Any,
) -> TensorInfo:
    x_shape, offset_shape, mask_shape, w_shape = shapes = [tuple(t.shape) for t in (x, offset, mask, weight)]
    bias_shape = None if bias is None else tuple(bias.shape)
    if _static(*shapes, bias_shape or ()):
        # (the dims the reference computes: a file declaring offset's would be wrong where they differ)
        geometry = ref.deform_conv_geometry(
            x_shape,
            offset_shape,
            mask_shape,
            w_shape,
            tuple(stride),
            tuple(padding),
            tuple(dilation),
            groups,
            deform_groups,
            bias_shape,
        )
        return TensorInfo((x.shape[0], weight.shape[0], geometry[3], geometry[4]), x.dtype)
    ref.check_dcn_attributes(stride, padding, dilation, groups, deform_groups)
    if any(len(s) != 4 for s in shapes):
        raise ValueError(
            "mmdeploy::MMCVModulatedDeformConv2d: input, offset, mask and weight must be 4-D; got "
            f"{', '.join(str(list(s)) for s in shapes)}."
        )
    return TensorInfo((x.shape[0], weight.shape[0], offset.shape[2], offset.shape[3]), x.dtype)


@ModulatedDeformConv2d.register_function
def _dcn_body(spec: Any, opset: int) -> Any:
    """ONNX ``DeformConv`` (opset >= 19; below, no body and the numpy kernel runs).

    DeformConv's ``pads`` cannot be derived from the ``padding`` attribute inside a
    function, so the input is zero-padded first with ``Pad`` and DeformConv runs
    unpadded: samples that fall in the padding read zeros either way.
    """
    if opset < 19:
        return None
    from onnx import AttributeProto, helper

    from opbridge.functions import make_body, ref_attr

    def with_refs(node: Any, *refs: tuple[str, str, Any]) -> Any:
        node.attribute.extend(ref_attr(name, ref, kind) for name, ref, kind in refs)
        return node

    ints, one = AttributeProto.INTS, AttributeProto.INT
    nodes = [
        with_refs(helper.make_node("Constant", [], ["hw_pads"]), ("value_ints", "padding", ints)),
        helper.make_node("Constant", [], ["nc_pads"], value_ints=[0, 0]),
        helper.make_node("Concat", ["nc_pads", "hw_pads", "nc_pads", "hw_pads"], ["pads"], axis=0),
        helper.make_node("Pad", ["input", "pads"], ["padded"], mode="constant"),
        with_refs(
            helper.make_node("DeformConv", ["padded", "weight", "offset", "bias", "mask"], ["output"]),
            ("strides", "stride", ints),
            ("dilations", "dilation", ints),
            ("group", "groups", one),
            ("offset_group", "deform_groups", one),
        ),
    ]
    return make_body(spec, nodes, opset)


ModulatedDeformConv2d.register_kernel(cpu.deform_conv2d, kind="torch")
ModulatedDeformConv2d.register_gpu_kernel(gpu.deform_conv2d, dtypes=("float32", "float16"))


# --------------------------------------------------------------------------- RoIAlign


@opbridge.op(f"{DOMAIN}::MMCVRoiAlign", tolerances=_HALF)
def RoIAlign(
    input: torch.Tensor,
    rois: torch.Tensor,
    output_height: int = 7,
    output_width: int = 7,
    spatial_scale: float = 1.0,
    sampling_ratio: int = 0,
    mode: Literal["avg", "max"] = "avg",
    aligned: bool = True,
) -> torch.Tensor:
    """RoIAlign over input (N, C, H, W) for rois (R, 5) [batch, x1, y1, x2, y2], as MMCV's roi_align."""
    return ref.roi_align(
        input,
        rois,
        output_height,
        output_width,
        spatial_scale,
        sampling_ratio,
        mode,
        aligned,
    )


@RoIAlign.register_shape
def _roi_shape(x: Any, rois: Any, *, output_height: int, output_width: int, **_: Any) -> TensorInfo:
    ref.check_output_size(f"{DOMAIN}::MMCVRoiAlign", output_height, output_width)
    ref.check_rois(f"{DOMAIN}::MMCVRoiAlign", rois)
    ref.check_roi_features(f"{DOMAIN}::MMCVRoiAlign", tuple(x.shape))
    return TensorInfo((rois.shape[0], x.shape[1], output_height, output_width), x.dtype)


def _roialign_native(attrs: Any) -> Any:
    from opbridge.ops import _roialign_cpu

    return _roialign_cpu.native_kernel(attrs)


RoIAlign.register_kernel(cpu.roi_align, kind="numpy", native=_roialign_native)
RoIAlign.register_gpu_kernel(gpu.roi_align, dtypes=("float32", "float16"))


@opbridge.op(f"{DOMAIN}::MMCVMultiLevelRoiAlign", tolerances=_HALF)
def MultiLevelRoiAlign(
    rois: torch.Tensor,
    feat0: torch.Tensor,
    feat1: torch.Tensor | None = None,
    feat2: torch.Tensor | None = None,
    feat3: torch.Tensor | None = None,
    feat4: torch.Tensor | None = None,
    output_height: int = 7,
    output_width: int = 7,
    featmap_strides: list[float] = [4.0, 8.0, 16.0, 32.0],  # noqa: B006
    sampling_ratio: int = 0,
    pool_mode: Literal[0, 1] = 1,
    roi_scale_factor: float = 1.0,
    finest_scale: int = 56,
    aligned: bool = True,
) -> torch.Tensor:
    """RoIAlign of each RoI on its FPN level (MMDet SingleRoIExtractor); pool_mode 0 max, 1 avg."""
    feats = [f for f in (feat0, feat1, feat2, feat3, feat4) if f is not None]
    return ref.multi_level_roi_align(
        rois,
        feats,
        output_height,
        output_width,
        tuple(featmap_strides),
        sampling_ratio,
        pool_mode,
        roi_scale_factor,
        finest_scale,
        aligned,
    )


@MultiLevelRoiAlign.register_shape
def _mlroi_shape(
    rois: Any, feat0: Any, *rest: Any, output_height: int, output_width: int, featmap_strides: Any, **_: Any
) -> TensorInfo:
    op = f"{DOMAIN}::MMCVMultiLevelRoiAlign"
    ref.check_output_size(op, output_height, output_width)
    ref.check_rois(op, rois)
    feats = [feat0, *(f for f in rest if f is not None)]
    ref.check_levels(op, [tuple(f.shape) for f in feats])
    ref.check_strides(op, tuple(featmap_strides), len(feats))
    return TensorInfo((rois.shape[0], feat0.shape[1], output_height, output_width), feat0.dtype)


MultiLevelRoiAlign.register_kernel(cpu.multi_level_roi_align, kind="numpy")
MultiLevelRoiAlign.register_gpu_kernel(gpu.multi_level_roi_align, dtypes=("float32", "float16"))


# --------------------------------------------------------------------------- batched NMS


@opbridge.op(f"{DOMAIN}::TRTBatchedNMS", outputs=("dets", "labels"), tolerances=_HALF)
def BatchedNMS(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    num_classes: int = 80,
    background_label_id: int = -1,
    iou_threshold: float = 0.5,
    score_threshold: float = 0.05,
    topk: int = 1000,
    keep_topk: int = 100,
    is_normalized: bool = False,
    clip_boxes: bool = False,
    return_index: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-class NMS over a batch; dets (B, keep_topk, 5) and int32 labels (B, keep_topk), padded with 0 / -1."""
    ref.check_nms_inputs(
        "mmdeploy::TRTBatchedNMS",
        tuple(boxes.shape),
        tuple(scores.shape),
        num_classes,
        return_index,
        keep_topk,
        boxes.is_floating_point() and scores.is_floating_point(),
    )
    return ref.batched_nms(
        boxes,
        scores,
        num_classes,
        background_label_id,
        iou_threshold,
        score_threshold,
        topk,
        keep_topk,
        clip_boxes,
    )


@BatchedNMS.register_shape
def _nms_shape(
    boxes: Any, scores: Any, *, keep_topk: int, num_classes: int, return_index: bool, **_: Any
) -> tuple[TensorInfo, TensorInfo]:
    ref.check_nms_inputs(
        "mmdeploy::TRTBatchedNMS", tuple(boxes.shape), tuple(scores.shape), num_classes, return_index, keep_topk
    )
    return TensorInfo((boxes.shape[0], keep_topk, 5), boxes.dtype), TensorInfo((boxes.shape[0], keep_topk), torch.int32)


BatchedNMS.register_kernel(cpu.batched_nms, kind="numpy")
BatchedNMS.register_gpu_kernel(gpu.batched_nms, dtypes=("float32", "float16"))


def detection_ops() -> list[opbridge.OpDef]:
    """The detection ops, in a fixed order."""
    return [GridSample, ModulatedDeformConv2d, RoIAlign, MultiLevelRoiAlign, BatchedNMS]
