"""CPU paths of the detection ops: kernels against the references, and the standard ONNX ops.

The standard-op tests record why each op has the CPU path it has: ONNX's
GridSample matches F.grid_sample but renames its modes at opset 20; DeformConv
matches DCNv2 but needs opset 19; RoiAlign matches in "avg" mode only.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from conftest import run_script
from onnx import TensorProto, helper

import opbridge
from opbridge.ops import detection as d

RTOL, ATOL = 1e-3, 1e-5


def _close(got: Any, want: torch.Tensor, rtol: float = RTOL, atol: float = ATOL) -> None:
    got = got if isinstance(got, torch.Tensor) else torch.from_numpy(np.asarray(got))
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _one_node_model(node: onnx.NodeProto, elem: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """A model of one custom node, no function body (opbridge's session runs the op's kernel): the
    node's inputs and its output "y", all of element type ``elem``."""
    graph = helper.make_graph(
        [node],
        node.op_type,
        [helper.make_tensor_value_info(k, elem, None) for k in node.input],
        [helper.make_tensor_value_info("y", elem, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(node.domain, 1)])
    model.ir_version = 10
    return model


# --------------------------------------------------------------------------- inputs


def dcn_inputs(
    seed: int,
    n: int = 2,
    cin: int = 4,
    cout: int = 6,
    h: int = 9,
    w: int = 7,
    k: int = 3,
    groups: int = 2,
    deform_groups: int = 2,
    stride: int = 1,
    pad: int = 1,
    dil: int = 1,
    dtype: torch.dtype = torch.float32,
) -> tuple[list[torch.Tensor], dict[str, Any]]:
    g = _gen(seed)
    ho = (h + 2 * pad - (dil * (k - 1) + 1)) // stride + 1
    wo = (w + 2 * pad - (dil * (k - 1) + 1)) // stride + 1
    tensors = [
        torch.randn(n, cin, h, w, generator=g),
        torch.randn(n, 2 * deform_groups * k * k, ho, wo, generator=g) * 2,
        torch.rand(n, deform_groups * k * k, ho, wo, generator=g),
        torch.randn(cout, cin // groups, k, k, generator=g),
        torch.randn(cout, generator=g),
    ]
    attrs = {
        "stride": [stride] * 2,
        "padding": [pad] * 2,
        "dilation": [dil] * 2,
        "groups": groups,
        "deform_groups": deform_groups,
    }
    return [t.to(dtype) for t in tensors], attrs


def rois_for(seed: int, n_rois: int, batch: int, extent: float) -> torch.Tensor:
    g = _gen(seed)
    xy = torch.rand(n_rois, 2, generator=g) * extent * 1.1 - extent * 0.05
    wh = torch.rand(n_rois, 2, generator=g) * extent * 0.6
    b = torch.randint(0, batch, (n_rois, 1), generator=g).float()
    return torch.cat([b, xy, xy + wh], dim=1)


def nms_inputs(
    seed: int, b: int = 2, n: int = 120, c: int = 4, per_class: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen(seed)
    xy = torch.rand(b, n, 1 if not per_class else c, 2, generator=g) * 60
    boxes = torch.cat([xy, xy + 5 + torch.rand(xy.shape, generator=g) * 30], dim=-1)
    scores = torch.rand(b, n, c, generator=g)
    scores[0, :5] = scores[0, 5]  # exact ties
    return boxes, scores


# --------------------------------------------------------------------------- kernels vs references


@pytest.mark.parametrize(
    "geometry",
    [
        {},
        {"stride": 2, "pad": 0},
        {"dil": 2, "pad": 2, "groups": 1, "deform_groups": 4, "k": 3},
        {"k": 1, "pad": 0, "groups": 1},
        {"cin": 16, "cout": 8, "groups": 1, "deform_groups": 2},
    ],
    ids=["3x3-g2-dg2", "stride2-nopad", "dilation2-dg4", "1x1", "native-sampler-8ch-per-dg"],
)
def test_dcn_kernel_matches_reference(geometry: dict) -> None:
    """The torch kernel (grid_sample im2col, one matmul) against the reference, returned and into
    ``out``; the last case samples through the native bilinear kernel (8 channels per deform group)."""
    tensors, attrs = dcn_inputs(1, **geometry)
    want = d.ModulatedDeformConv2d.run_reference(*tensors, **attrs)
    assert d.ModulatedDeformConv2d.kernel_kind == "torch"
    _close(d.ModulatedDeformConv2d.kernel(*tensors, **attrs), want, atol=1e-4)
    out = torch.full(want.shape, float("nan"))
    assert d.ModulatedDeformConv2d.kernel(*tensors, out=out, **attrs) is out
    _close(out, want, atol=1e-4)


@pytest.mark.parametrize("cin", [4, 16], ids=["aten-sampler", "native-sampler"])
def test_dcn_kernel_non_finite_offsets_and_empty_input(cin: int) -> None:
    """Infinite offsets sample 0 (torchvision's rule; grid_sample alone would give NaN) and NaN
    offsets NaN, as the reference, through ATen's and the native sampler; an empty input gives the bias."""
    tensors, attrs = dcn_inputs(5, cin=cin, cout=4, deform_groups=1)
    off = tensors[1]
    off[0, 0, 2, 2], off[1, 5, 3, 1], off[1, 2, 4, 4] = math.inf, -math.inf, 1e30
    off[0, 6:8, 0, 0] = math.nan  # tap 3's dy and dx
    want = d.ModulatedDeformConv2d.run_reference(*tensors, **attrs)
    assert torch.isnan(want).any() and not torch.isnan(want[1]).any()
    got = d.ModulatedDeformConv2d.kernel(*tensors, **attrs)
    torch.testing.assert_close(got, want, rtol=RTOL, atol=1e-4, equal_nan=True)
    x, _, _, w, b = tensors  # 9 x 7 inputs, padding 1
    empty = [x[..., :0], torch.zeros(2, 18, 9, 0), torch.ones(2, 9, 9, 0), w, b]
    with pytest.raises(ValueError, match=r"the dilated kernel \(3 x 3\) is larger than the padded input \(11 x 2\)"):
        d.ModulatedDeformConv2d.kernel(*empty, **attrs)
    empty[1:3] = torch.zeros(2, 18, 9, 2), torch.ones(2, 9, 9, 2)
    _close(
        d.ModulatedDeformConv2d.kernel(*empty, **{**attrs, "padding": (1, 2)}), b.view(1, 4, 1, 1).expand(2, 4, 9, 2)
    )


def test_dcn_kernel_without_bias_and_in_float16() -> None:
    tensors, attrs = dcn_inputs(2, dtype=torch.float16)
    want = d.ModulatedDeformConv2d.run_reference(*tensors[:4], None, **attrs)
    got = d.ModulatedDeformConv2d.kernel(*tensors[:4], None, **attrs)
    assert got.dtype == torch.float16
    _close(got, want, rtol=1e-2, atol=1e-2)
    out = torch.full(want.shape, float("nan"), dtype=torch.float16)
    assert d.ModulatedDeformConv2d.kernel(*tensors[:4], None, out=out, **attrs) is out
    _close(out, want, rtol=1e-2, atol=1e-2)


def test_dcn_kernel_on_one_pixel_wide_inputs() -> None:
    """A 1-pixel-wide (and 1-pixel-high) input with offsets that leave it: zeros outside, as the reference."""
    g = _gen(11)
    for shape in ((1, 4, 5, 1), (1, 4, 1, 6), (1, 4, 1, 1)):
        x = torch.randn(*shape, generator=g)
        off = torch.randn(1, 18, shape[2], shape[3], generator=g) * 1.5
        mask, wt = torch.rand(1, 9, shape[2], shape[3], generator=g), torch.randn(3, 4, 3, 3, generator=g)
        attrs = {"stride": (1, 1), "padding": (1, 1), "dilation": (1, 1), "groups": 1, "deform_groups": 1}
        want = d.ModulatedDeformConv2d.run_reference(x, off, mask, wt, None, **attrs)
        _close(d.ModulatedDeformConv2d.kernel(x, off, mask, wt, None, **attrs), want, atol=1e-5)


@pytest.mark.parametrize("path", ["native", "numpy"])
@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "legacy"])
@pytest.mark.parametrize("sampling_ratio", [0, 2, -1], ids=["adaptive", "sr2", "adaptive-neg"])
def test_roi_align_kernel_matches_reference(mode: str, aligned: bool, sampling_ratio: int, path: str) -> None:
    """The op's kernel (the native one) and the numpy kernel it falls back to without the extension."""
    from opbridge.ops import _detection_cpu

    feat = torch.randn(2, 5, 24, 20, generator=_gen(3))
    rois = rois_for(4, 40, 2, 90.0)
    attrs = {
        "output_height": 4,
        "output_width": 3,
        "spatial_scale": 0.25,
        "sampling_ratio": sampling_ratio,
        "mode": mode,
        "aligned": aligned,
    }
    want = d.RoIAlign.run_reference(feat, rois, **attrs)
    if path == "native":
        got = d.RoIAlign.kernel(feat.numpy(), rois.numpy(), **attrs)
    else:
        got = _detection_cpu._roi_align_numpy(feat.numpy(), rois.numpy(), *attrs.values())
    _close(got, want, atol=1e-5)


# MMCV's arithmetic and order: max pooling equal to the reference bit for bit; avg sums in MMCV's order
# (rows, then columns) where the reference's reduction may pair them otherwise: a few float32 ulps.
ROI_NATIVE_RTOL, ROI_NATIVE_ATOL = 1e-6, 1e-6


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "legacy"])
@pytest.mark.parametrize("sampling_ratio", [0, 3], ids=["adaptive", "sr3"])
def test_native_roi_align_edges(mode: str, aligned: bool, sampling_ratio: int) -> None:
    """RoIs across and beyond every edge, RoIs of less than a bin (an adaptive grid of 0 samples: 0 for
    avg, -FLT_MAX for max), one-pixel feature maps, batch indices with a fraction (truncated), and NaN
    and infinite feature values, against the reference."""
    from opbridge.ops import _roialign_cpu

    g = _gen(70)
    for shape in ((2, 9, 17, 23), (1, 4, 1, 1), (1, 3, 1, 6)):
        feat = torch.randn(*shape, generator=g)
        feat.view(-1)[min(5, feat.numel() - 2)] = float("nan")
        feat.view(-1)[-1] = float("inf")
        n, _, h, w = shape
        boxes = [
            [0.0, -30.0, -30.0, 10.0, 10.0],  # across the top-left corner
            [n - 0.5, w * 4 - 8.0, h * 4 - 8.0, w * 4 + 30.0, h * 4 + 30.0],  # across the bottom-right one
            [0.0, -80.0, -80.0, -60.0, -60.0],  # wholly outside
            [0.0, 3.0, 3.0, 3.5, 3.2],  # less than a bin
            [0.0, 0.0, 0.0, w * 4.0, h * 4.0],  # the whole map
            [0.7, 5.0, 2.0, 40.0, 29.0],  # a fractional batch index: image 0
        ]
        rois = torch.tensor(boxes)
        attrs = {"output_height": 5, "output_width": 4, "spatial_scale": 0.25}
        want = d.RoIAlign.run_reference(feat, rois, **attrs, sampling_ratio=sampling_ratio, mode=mode, aligned=aligned)
        got = torch.from_numpy(
            _roialign_cpu.roi_align(feat.numpy(), rois.numpy(), 5, 4, 0.25, sampling_ratio, mode == "max", aligned)
        )
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())
        finite = want.isfinite()
        if mode == "max":
            assert torch.equal(got[finite], want[finite])
        else:
            torch.testing.assert_close(got[finite], want[finite], rtol=ROI_NATIVE_RTOL, atol=ROI_NATIVE_ATOL)


def test_native_roi_align_non_finite_boxes_and_values() -> None:
    """With a fixed sampling ratio a NaN box gives NaN bins (the reference indexes outside its features
    there); in max mode a bin whose samples are all -inf is -inf, as the reference, and one without
    samples -FLT_MAX."""
    from opbridge.ops import _roialign_cpu

    feat = torch.randn(1, 3, 8, 8, generator=_gen(73))
    feat[0, 1] = float("-inf")
    rois = torch.tensor([[0.0, float("nan"), 1.0, 5.0, 5.0], [0.0, 1.0, 1.0, 6.0, 6.0]])
    for mode in ("avg", "max"):
        want = d.RoIAlign.run_reference(feat, rois[1:], output_height=2, output_width=2, sampling_ratio=2, mode=mode)
        got = torch.from_numpy(_roialign_cpu.roi_align(feat.numpy(), rois.numpy(), 2, 2, 1.0, 2, mode == "max", True))
        assert got[0].isnan().all()
        torch.testing.assert_close(got[1:], want, rtol=ROI_NATIVE_RTOL, atol=ROI_NATIVE_ATOL, equal_nan=True)
        if mode == "max":
            assert (got[1, 1] == float("-inf")).all()
    empty = _roialign_cpu.roi_align(feat.numpy(), np.array([[0, 3, 3, 3, 3]], np.float32), 2, 2, 1.0, 0, True, True)
    assert (empty == np.float32(-3.4028234663852886e38)).all()


@pytest.mark.parametrize("hw", [(1, 4), (5, 1), (1, 1)], ids=lambda hw: f"{hw[0]}x{hw[1]}")
def test_roi_align_nan_samples_on_one_pixel_axes(hw: tuple[int, int]) -> None:
    """An infinite box with a fixed sampling ratio gives NaN sample coordinates: NaN bins in every path,
    on features one pixel high or wide too (the last-pixel rule made them pixel 0 in the reference)."""
    from opbridge.ops import _detection_cpu, _roialign_cpu

    h, w = hw
    feat = torch.arange(1.0, 1.0 + 2 * h * w).reshape(1, 2, h, w)
    rois = torch.tensor([[0.0, 0.0, 0.0, 2.0, float("inf")], [0.0, 0.0, 0.0, 3.0, 1.0]])
    for mode in ("avg", "max"):
        want = d.RoIAlign.run_reference(feat, rois, output_height=1, output_width=1, sampling_ratio=1, mode=mode)
        assert want[0].isnan().all() and want[1].isfinite().all()
        native = _roialign_cpu.roi_align(feat.numpy(), rois.numpy(), 1, 1, 1.0, 1, mode == "max", True)
        plain = _detection_cpu._roi_align_numpy(feat.numpy(), rois.numpy(), 1, 1, 1.0, 1, mode, True)
        for got in (native, plain):
            torch.testing.assert_close(torch.from_numpy(got), want, rtol=0, atol=0, equal_nan=True)


def test_native_roi_align_on_planes_wider_than_float_precision(tmp_path: Path) -> None:
    """A sample at x = 2**31 on a plane 2**31 - 2 pixels wide ((float)W rounds up to 2**31): the last
    pixel, as the reference's rule; the int cast of floor(x) read 8 GiB before the features."""
    out = run_script(
        tmp_path,
        """
        import numpy as np
        from opbridge.ops import _cpu_kernels

        W = 2**31 - 2
        try:
            xt = np.zeros(W + 1, np.float32)  # channels-last (H * W + 1, C), calloc'ed: untouched pages
        except MemoryError:
            print("no address space")
            raise SystemExit(0)
        xt[W - 1] = 5.0
        x1 = np.float32(2147483520.0)  # one sample, at x1 + 128 = 2**31
        rois = np.array([[0, x1, 0, x1 + 256, 1]], np.float32)
        out = np.zeros((1, 1, 1, 1), np.float32)
        _cpu_kernels.roi_align(xt, rois, out, 1, 1, 1, W, 1, 1, 1, 1.0, 1, False, False, 0, 1)
        print(float(out[0, 0, 0, 0]))
        """,
        timeout=120,
    )
    if out.strip() == "no address space":
        pytest.skip("needs 8 GiB of address space for a lazily zeroed plane")
    assert out.strip() == "5.0"


def test_native_roi_align_writes_out_and_splits_over_threads() -> None:
    """Into ``out`` in place; RoIs split over two threads give one thread's result bit for bit."""
    from opbridge.ops import _roialign_cpu

    feat, rois = torch.randn(2, 32, 40, 56, generator=_gen(71)), rois_for(72, 64, 2, 200.0)
    out = np.full((64, 32, 7, 7), np.nan, np.float32)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _roialign_cpu.roi_align(feat.numpy(), rois.numpy(), 7, 7, 0.25, 0, False, True)
        torch.set_num_threads(2)
        attrs = {"output_height": 7, "output_width": 7, "spatial_scale": 0.25, "sampling_ratio": 0}
        assert d.RoIAlign.kernel(feat.numpy(), rois.numpy(), **attrs, out=out) is out
    finally:
        torch.set_num_threads(threads)
    np.testing.assert_array_equal(out, one)


def test_native_roi_align_rejects_bad_calls() -> None:
    """A batch index outside the batch, a box whose adaptive sampling grid is not finite, and buffers
    of the wrong size raise errors naming the problem before anything is written."""
    from opbridge.ops import _cpu_kernels, _roialign_cpu

    feat = np.zeros((1, 2, 6, 6), np.float32)
    good = [0.0, 1.0, 1.0, 4.0, 4.0]
    for bad, match in (
        ([3.0, 1.0, 1.0, 4.0, 4.0], "RoI 1 has batch index 3.0, outside the feature batch of 1"),
        ([-1.0, 1.0, 1.0, 4.0, 4.0], "RoI 1 has batch index -1.0"),
        ([float("nan"), 1.0, 1.0, 4.0, 4.0], "RoI 1 has batch index nan"),
        ([0.0, 0.0, 0.0, 1e30, 4.0], r"RoI 1 \[0.0, 0.0, 1.0000000150474662e\+30, 4.0\] needs a sampling grid"),
        (
            [0.0, 0.0, float("nan"), 4.0, 4.0],
            "pass finite boxes on the feature map's scale or a smaller sampling_ratio",
        ),
        ([0.0, 0.0, 0.0, 4100.0, 4100.0], r"over 16777216 samples \(the bins times the samples of a bin\)"),
        ([0.0, 0.0, 0.0, 3e8, -5.0], "needs a sampling grid"),  # one side over the limit, the other empty
    ):
        out = np.full((2, 2, 3, 3), 7.0, np.float32)
        with pytest.raises(ValueError, match=match):
            _roialign_cpu.roi_align(feat, np.array([good, bad], np.float32), 3, 3, 1.0, 0, False, True, out=out)
        assert (out == 7.0).all()  # nothing written
    # a sampling ratio bounds the grid: the same huge box runs, a box of 4096 x 4096 pixels too (the
    # limit exactly), and a sampling ratio past it is refused
    _roialign_cpu.roi_align(feat, np.array([[0.0, 0.0, 0.0, 1e30, 4.0]], np.float32), 3, 3, 1.0, 2, False, True)
    _roialign_cpu.roi_align(feat, np.array([[0.0, 0.0, 0.0, 4096.0, 4096.0]], np.float32), 4, 4, 1.0, 0, False, False)
    with pytest.raises(ValueError, match=r"RoI 0 \[1.0, 1.0, 4.0, 4.0\] needs a sampling grid"):
        _roialign_cpu.roi_align(feat, np.array([good], np.float32), 3, 3, 1.0, 1366, False, True)
    with pytest.raises(ValueError, match=r"`out` must be a contiguous float32 array of shape \(1, 2, 3, 3\)"):
        _roialign_cpu.roi_align(feat, np.array([good], np.float32), 3, 3, 1.0, 0, False, True, out=np.zeros((1, 2, 3)))
    xt, rois, out = np.zeros((1, 37, 2), np.float32), np.array([good], np.float32), np.zeros((1, 2, 3, 3), np.float32)
    _cpu_kernels.roi_align(xt, rois, out, 1, 2, 6, 6, 1, 3, 3, 1.0, 0, False, True, 0, 1)  # the right sizes run
    with pytest.raises(ValueError, match="xt holds 288 bytes, 74 float32 values"):
        _cpu_kernels.roi_align(xt[:, :-1], rois, out, 1, 2, 6, 6, 1, 3, 3, 1.0, 0, False, True, 0, 1)
    with pytest.raises(ValueError, match="out holds 48 bytes"):
        _cpu_kernels.roi_align(xt, rois, out[:, :, :2].copy(), 1, 2, 6, 6, 1, 3, 3, 1.0, 0, False, True, 0, 1)
    with pytest.raises(ValueError, match=r"range \[0, 2\) outside \[0, 1\)"):
        _cpu_kernels.roi_align(xt, rois, out, 1, 2, 6, 6, 1, 3, 3, 1.0, 0, False, True, 0, 2)
    with pytest.raises(ValueError, match="sizes N=0"):
        _cpu_kernels.roi_align(xt, rois, out, 0, 2, 6, 6, 1, 3, 3, 1.0, 0, False, True, 0, 1)


@pytest.mark.parametrize("path", ["reference", "native", "numpy"])
def test_roi_align_bad_rois_are_named_by_every_path(path: str) -> None:
    """The reference, the native kernel (any float dtype) and the numpy kernel refuse the same RoIs
    with the same words: a batch index outside the batch after truncation (NaN and inf too), a
    sampling grid that is not finite or over ROI_MAX_SAMPLES; a batch index of -0.5 truncates to 0."""
    from opbridge.ops import _detection_cpu
    from opbridge.ops._detection_ref import ROI_MAX_SAMPLES

    feat = torch.randn(2, 3, 8, 8, generator=_gen(78)).double()
    attrs = {"output_height": 2, "output_width": 2, "spatial_scale": 1.0, "sampling_ratio": 0, "mode": "avg"}

    def run(rois: list, **extra: Any) -> torch.Tensor:
        a = {**attrs, **extra}
        r = torch.tensor(rois, dtype=torch.float64)
        if path == "reference":
            return d.RoIAlign.run_reference(feat, r, **a)
        if path == "native":
            return torch.from_numpy(d.RoIAlign.kernel(feat.numpy(), r.numpy(), **a))
        return torch.from_numpy(_detection_cpu._roi_align_numpy(feat.numpy(), r.numpy(), *a.values(), True))

    box = [1.0, 1.0, 6.0, 7.0]
    for index in (math.nan, math.inf, 2.0, -1.0):
        with pytest.raises(ValueError, match=rf"RoI 1 has batch index {index!r}, outside the feature batch of 2"):
            run([[0.0, *box], [index, *box]])
    for bad, extra in (
        ([0.0, math.nan, 1.0, 6.0, 7.0], {}),
        ([0.0, 0.0, 0.0, 1e9, 9.0], {}),
        ([0.0, *box], {"sampling_ratio": 2049}),
    ):
        with pytest.raises(
            ValueError, match=rf"RoI 0 .* needs a sampling grid that is not finite or over {ROI_MAX_SAMPLES}"
        ):
            run([bad], **extra)
    got = run([[-0.5, *box], [1.999, *box]])
    assert got.dtype == torch.float64
    want = d.RoIAlign.run_reference(feat, torch.tensor([[0.0, *box], [1.0, *box]]), **attrs)
    torch.testing.assert_close(got, want, rtol=ROI_NATIVE_RTOL, atol=ROI_NATIVE_ATOL)
    # a NaN box with a fixed sampling ratio: NaN bins; a box far past the map: zeros (no index overflow)
    out = run([[0.0, math.nan, 1.0, 6.0, 7.0], [0.0, 1e20, 1e20, 2e20, 2e20]], sampling_ratio=2)
    assert out[0].isnan().all() and (out[1] == 0).all()


def test_roi_align_sampling_ratio_past_int32_is_named() -> None:
    """A sampling ratio past int32 (an attribute of 2**40): the native kernel declines it at session
    creation (no OverflowError there) and the kernel names the RoI whose grid it makes too large."""
    from opbridge.ops import _roialign_cpu

    attrs = {"output_height": 2, "output_width": 2, "sampling_ratio": 2**40}
    assert _roialign_cpu.native_kernel(attrs) is None
    with pytest.raises(ValueError, match=r"RoI 0 \[0.0, 0.0, 3.0, 3.0\] needs a sampling grid"):
        d.RoIAlign.kernel(np.ones((1, 1, 4, 4), np.float32), np.array([[0, 0, 0, 3, 3]], np.float32), **attrs)


def test_roi_align_output_size_and_empty_inputs() -> None:
    feat = np.ones((1, 2, 6, 6), np.float32)
    rois = np.array([[0, 1, 1, 4, 4]], np.float32)
    with pytest.raises(ValueError, match="output_height and output_width must be >= 1; got 0x2"):
        d.RoIAlign.kernel(feat, rois, output_height=0, output_width=2)
    assert d.RoIAlign.kernel(feat[:, :0].astype(np.float64), rois, output_height=2, output_width=2).shape == (
        1,
        0,
        2,
        2,
    )
    with pytest.raises(ValueError, match="RoI 0 has batch index 7.0"):  # checked with no channels too
        d.RoIAlign.kernel(feat[:, :0], np.array([[7, 1, 1, 4, 4]], np.float32), output_height=2, output_width=2)


def test_multi_level_roi_align_checks_levels_and_unmapped_rois() -> None:
    """Levels of another channel count and malformed rois are named; a RoI whose level is NaN (a box
    inverted in one axis, a NaN box) maps to no level and stays 0 in the reference and the kernel."""
    feats = [np.ones((1, 2, 16, 16), np.float32), np.ones((1, 2, 8, 8), np.float32)]
    attrs = {"featmap_strides": [4.0, 8.0], "output_height": 1, "output_width": 1, "sampling_ratio": 0}
    bound = d.MultiLevelRoiAlign.spec.bind_attributes(attrs)
    rois = np.array([[0, 10, 10, 5, 30], [0, np.nan, 1, 8, 8], [0, 1, 1, 20, 20]], np.float32)
    for pool in (0, 1):
        want = d.MultiLevelRoiAlign.run_reference(
            torch.from_numpy(rois), *map(torch.from_numpy, feats), **attrs, pool_mode=pool
        )
        got = d.MultiLevelRoiAlign.kernel(rois, *feats, **{**bound, "pool_mode": pool})
        assert (want[:2] == 0).all() and (want[2] == 1).all()
        np.testing.assert_array_equal(got, want.numpy())
    with pytest.raises(
        ValueError,
        match=r"the feature levels must be \(N, C, H, W\) with the same C; got \[\[1, 2, 16, 16\], \[1, 1, 8, 8\]\]",
    ):
        d.MultiLevelRoiAlign.kernel(rois, feats[0], feats[1][:, :1], **bound)
    with pytest.raises(ValueError, match=r"rois must be \(num_rois, 5\) rows"):
        d.MultiLevelRoiAlign.kernel(rois[:, :4], *feats, **bound)


def _roi_align_model(attrs: dict, elem: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """One mmdeploy::MMCVRoiAlign node y = MMCVRoiAlign(x, rois)."""
    return _one_node_model(helper.make_node("MMCVRoiAlign", ["x", "rois"], ["y"], domain="mmdeploy", **attrs), elem)


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("aligned", [1, 0], ids=["aligned", "legacy"])
def test_native_roi_align_in_ort_session(mode: str, aligned: int) -> None:
    """opbridge's session runs RoIAlign's native kernel inside ONNX Runtime, without Python: the Python
    kernel's results bit for bit (``native=False``, the same kernel), the reference's within the native
    tolerance; sessions of one, two and three intra-op threads (RoIs in up to three pieces) agree bit for
    bit."""
    from opbridge.onnxruntime import InferenceSession

    attrs = {"output_height": 5, "output_width": 4, "spatial_scale": 0.25, "sampling_ratio": 0, "mode": mode}
    model = _roi_align_model({**attrs, "aligned": aligned})
    feat, rois = torch.randn(2, 6, 30, 26, generator=_gen(74)), rois_for(75, 40, 2, 110.0)
    feeds = {"x": feat.numpy(), "rois": rois.numpy()}
    results = []
    for threads in (1, 2, 3):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        sess = InferenceSession(model, sess_options=opts)
        assert [(k.path, k.native) for k in sess.kernels.values()] == [("kernel", True)]
        results.append(sess.run(None, feeds)[0])
    python = InferenceSession(model, native=False)
    for other in (*results[1:], python.run(None, feeds)[0]):
        np.testing.assert_array_equal(other, results[0])
    want = d.RoIAlign.run_reference(feat, rois, **attrs, aligned=bool(aligned))
    torch.testing.assert_close(torch.from_numpy(results[0]), want, rtol=ROI_NATIVE_RTOL, atol=ROI_NATIVE_ATOL)


def test_native_roi_align_declines_and_runs_without_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """float64 inputs run the Python kernel (which calls the native kernel in float32); a RoI the
    kernel refuses reaches the Python kernel, whose error names it; other float32 runs never reach
    Python (the session runs with the Python kernel made to fail)."""
    from opbridge.onnxruntime import InferenceSession
    from opbridge.ops import _roialign_cpu

    attrs = {"output_height": 3, "output_width": 3, "spatial_scale": 0.5, "sampling_ratio": 2}
    feat, rois = torch.randn(1, 4, 12, 12, generator=_gen(76)), rois_for(77, 9, 1, 24.0)
    want = d.RoIAlign.run_reference(feat, rois, **attrs)
    double = InferenceSession(_roi_align_model(attrs, TensorProto.DOUBLE))
    got = double.run(None, {"x": feat.double().numpy(), "rois": rois.double().numpy()})[0]
    assert got.dtype == np.float64
    torch.testing.assert_close(torch.from_numpy(got).float(), want, rtol=1e-5, atol=1e-5)
    sess = InferenceSession(_roi_align_model(attrs))
    bad = rois.clone()
    bad[4, 0] = 3.0
    with pytest.raises(Exception, match="RoI 4 has batch index 3.0, outside the feature batch of 1"):
        sess.run(None, {"x": feat.numpy(), "rois": bad.numpy()})

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the Python kernel ran")

    monkeypatch.setattr(_roialign_cpu, "roi_align", fail)
    got = torch.from_numpy(sess.run(None, {"x": feat.numpy(), "rois": rois.numpy()})[0])
    torch.testing.assert_close(got, want, rtol=ROI_NATIVE_RTOL, atol=ROI_NATIVE_ATOL)
    with pytest.raises(Exception, match="the Python kernel ran"):
        InferenceSession(_roi_align_model(attrs), native=False).run(None, {"x": feat.numpy(), "rois": rois.numpy()})


@pytest.mark.parametrize("pool_mode", [0, 1], ids=["max", "avg"])
@pytest.mark.parametrize("scale", [1.0, 1.5])
def test_multi_level_kernel_matches_reference(pool_mode: int, scale: float) -> None:
    g = _gen(5)
    feats = [torch.randn(2, 3, 256 // s, 256 // s, generator=g) for s in (4, 8, 16, 32)]
    rois = rois_for(6, 60, 2, 256.0)
    attrs = {
        "output_height": 7,
        "output_width": 7,
        "featmap_strides": [4.0, 8.0, 16.0, 32.0],
        "sampling_ratio": 0,
        "pool_mode": pool_mode,
        "roi_scale_factor": scale,
        "finest_scale": 56,
        "aligned": True,
    }
    want = d.MultiLevelRoiAlign.run_reference(rois, *feats, **attrs)
    got = d.MultiLevelRoiAlign.kernel(rois.numpy(), *[f.numpy() for f in feats], **attrs)
    _close(got, want, atol=1e-5)


@pytest.mark.parametrize(
    "attrs",
    [
        {"topk": 50, "keep_topk": 30},
        {"topk": -1, "keep_topk": 200, "iou_threshold": 0.3, "score_threshold": 0.5},
        {"topk": 20, "keep_topk": 10, "background_label_id": 0, "clip_boxes": True},
    ],
    ids=["pre50-keep30", "all-keep200", "background-clip"],
)
@pytest.mark.parametrize("per_class", [False, True], ids=["shared-boxes", "per-class-boxes"])
def test_nms_kernel_matches_reference(attrs: dict, per_class: bool) -> None:
    boxes, scores = nms_inputs(7, per_class=per_class)
    attrs = {"num_classes": 4, **attrs}
    want_dets, want_labels = d.BatchedNMS.run_reference(boxes, scores, **attrs)
    got_dets, got_labels = d.BatchedNMS.kernel(
        boxes.numpy(), scores.numpy(), **d.BatchedNMS.spec.bind_attributes(attrs)
    )
    assert (want_labels >= 0).sum() > 0
    np.testing.assert_array_equal(got_labels, want_labels.numpy())
    _close(got_dets, want_dets, rtol=0, atol=0)


def test_nms_kernel_takes_bfloat16_as_the_reference_does() -> None:
    """ReferenceSession hands a numpy kernel ml_dtypes' bfloat16 arrays, which numpy does not file as
    floating-point: the kernel refused them as "must be floating-point", where the reference runs."""
    import ml_dtypes

    boxes, scores = nms_inputs(7, per_class=False)
    boxes, scores = boxes.bfloat16(), scores.bfloat16()
    attrs = {"num_classes": 4, "topk": 50, "keep_topk": 30}
    want_dets, want_labels = d.BatchedNMS.run_reference(boxes, scores, **attrs)
    as_ml = [t.float().numpy().astype(ml_dtypes.bfloat16) for t in (boxes, scores)]
    got_dets, got_labels = d.BatchedNMS.kernel(*as_ml, **d.BatchedNMS.spec.bind_attributes(attrs))
    assert (want_labels >= 0).sum() > 0
    np.testing.assert_array_equal(got_labels, want_labels.numpy())
    _close(np.asarray(got_dets, np.float32), want_dets.float(), rtol=0, atol=0)


def test_multi_level_reference_takes_bfloat16_rois() -> None:
    """The reference read the RoIs' batch indices through numpy, which has no bfloat16 (a TypeError, where
    RoIAlign's reference computes)."""
    g = _gen(5)
    feats = [torch.randn(1, 3, 64 // s, 64 // s, generator=g) for s in (4, 8)]
    rois = rois_for(6, 8, 1, 64.0)
    attrs = {"output_height": 2, "output_width": 2, "featmap_strides": [4.0, 8.0], "sampling_ratio": 2}
    want = d.MultiLevelRoiAlign(rois, *feats, **attrs)
    got = d.MultiLevelRoiAlign(rois.bfloat16(), *feats, **attrs)
    torch.testing.assert_close(got, d.MultiLevelRoiAlign(rois.bfloat16().float(), *feats, **attrs), rtol=0, atol=0)
    assert got.shape == want.shape


def test_nms_kernel_infinite_scores_and_blocked_greedy(monkeypatch: pytest.MonkeyPatch) -> None:
    """+inf scores pass the threshold and rank first (as in the reference); the greedy pass in
    blocks of a few rows (its memory bound for a large topk) keeps the same boxes."""
    from opbridge.ops import _detection_cpu as cpu

    boxes, scores = nms_inputs(9, n=200)
    scores[0, 3, 1] = scores[1, 10, 2] = math.inf
    scores[0, 4, 0] = -math.inf
    scores[1, 11, 3] = math.nan
    attrs = {"num_classes": 4, "topk": -1, "keep_topk": 150, "iou_threshold": 0.3}
    want_dets, want_labels = d.BatchedNMS.run_reference(boxes, scores, **attrs)
    assert torch.isposinf(want_dets[:, 0, 4]).all()
    bound = d.BatchedNMS.spec.bind_attributes(attrs)
    for block in (cpu._IOU_BLOCK, 3 * 200, 1):  # one block, three rows per block, one row
        monkeypatch.setattr(cpu, "_IOU_BLOCK", block)
        got_dets, got_labels = d.BatchedNMS.kernel(boxes.numpy(), scores.numpy(), **bound)
        np.testing.assert_array_equal(got_labels, want_labels.numpy())
        _close(got_dets, want_dets, rtol=0, atol=0)


def test_grid_sample_kernel_runs_on_torch_tensors() -> None:
    """One channel: PyTorch's own CPU kernel runs (the native one starts at two channels for bicubic),
    bit for bit the reference."""
    x, grid = (
        torch.randn(2, 1, 6, 5, generator=_gen(8)),
        torch.rand(2, 4, 3, 2, generator=_gen(9)) * 2.4 - 1.2,
    )
    assert d.GridSample.kernel_kind == "torch"
    _close(
        d.GridSample.kernel(x, grid, interpolation_mode=2, padding_mode=2, align_corners=False),
        d.GridSample.run_reference(x, grid, interpolation_mode=2, padding_mode=2, align_corners=False),
        rtol=0,
        atol=0,
    )


# --------------------------------------------------------------------------- grid_sample, native kernel

# ATen's CPU build may fuse some of the products the native kernel rounds one by one: up to a few
# float32 ulps apart on values of order 1 (measured: 7.2e-7 at most). Nearest copies values: bit for bit.
NATIVE_RTOL, NATIVE_ATOL = 1e-6, 2e-6
_PADDINGS = ("zeros", "border", "reflection")
_NATIVE_MODES = {0: "bilinear", 1: "nearest", 2: "bicubic"}


def _native_case(
    shape: tuple[int, int, int, int], out_hw: tuple[int, int], seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Input and grid with points inside, across every edge and far outside, non-finite ones, and
    finite ones 2**22-2**27 plane sizes away (reflection's remainder there depends on its rounding)."""
    g = _gen(seed)
    x = torch.randn(*shape, generator=g)
    grid = torch.rand(shape[0], *out_hw, 2, generator=g) * 3.0 - 1.5
    special = torch.tensor(
        [[float("nan"), 0.1], [float("inf"), 0.0], [0.2, -float("inf")], [1e30, 0.3], [-1e30, -1e30]]
    )
    grid[0, 0, : len(special)] = special[: out_hw[1]]
    if torch.backends.cpu.get_cpu_capability() != "DEFAULT":  # ATen's builds with FMA fuse the remainder
        far = torch.tensor([[3.1e6, 0.1], [-2.9e7, 0.4], [0.3, 5.3e6], [7.7e7, -6.1e6], [-1.3e8, 2.2e7]])
        grid[-1, -1, : len(far)] = far[: out_hw[1]]
    return x, grid


@pytest.mark.parametrize("align", [False, True], ids=["half-pixel", "align-corners"])
@pytest.mark.parametrize("pad", [0, 1, 2], ids=_PADDINGS)
@pytest.mark.parametrize(
    "shape,out_hw",
    [
        ((2, 1, 13, 17), (9, 11)),
        ((2, 3, 13, 17), (9, 11)),
        ((1, 6, 11, 9), (7, 8)),
        ((1, 8, 1, 1), (3, 5)),
        ((1, 9, 1, 7), (4, 6)),
        ((2, 20, 32, 24), (40, 30)),
        ((1, 64, 9, 10), (8, 7)),
        ((1, 256, 5, 6), (4, 5)),
    ],
    ids=["1ch-13x17", "3ch-13x17", "6ch-11x9", "8ch-1x1", "9ch-1x7", "20ch-32x24", "64ch-9x10", "256ch-5x6"],
)
@pytest.mark.parametrize("mode", list(_NATIVE_MODES), ids=list(_NATIVE_MODES.values()))
def test_native_grid_sample_matches_torch(
    mode: int, shape: tuple[int, int, int, int], out_hw: tuple[int, int], pad: int, align: bool
) -> None:
    """The native kernel against F.grid_sample: every mode, padding and corner rule, planes of one
    pixel, channel counts padded to a vector of 4 or 8, to a multiple of 4 and past a multiple of 256
    bytes, pixel and point counts that do not fill the 4 x 4 transposes, NaN, infinite and huge
    coordinates; nearest bit for bit."""
    from opbridge.ops import _gridsample_cpu

    x, grid = _native_case(shape, out_hw, seed=sum(shape) + pad)
    x[0, 0, 0, 0] = float("inf")  # an infinite input value reaches exactly the outputs that read it
    want = torch.nn.functional.grid_sample(
        x, grid, mode=_NATIVE_MODES[mode], padding_mode=_PADDINGS[pad], align_corners=align
    )
    assert _gridsample_cpu.applies(x, grid, mode) == (shape[1] >= _gridsample_cpu.MIN_CHANNELS[mode])
    got = _gridsample_cpu.grid_sample(x, grid, mode, pad, align)
    _assert_grid_result(got, want, mode)
    assert mode == 1 or want.isfinite().float().mean() > 0.5  # the comparison covers most outputs


@pytest.mark.parametrize("mode", list(_NATIVE_MODES), ids=list(_NATIVE_MODES.values()))
def test_native_grid_sample_vector_pixels_match_plain_ones(mode: int) -> None:
    """Up to 8 channels are stored as vectors of 4 or 8 values per pixel (zeros after the channels),
    more with their count rounded up to a multiple of 4 and padded past multiples of 256 bytes
    (``channel_stride``); every lane computes its channel as the plain layout does: the results are
    equal bit for bit."""
    from opbridge.ops import _cpu_kernels, _gridsample_cpu

    strides = {1: 4, 2: 4, 3: 4, 5: 8, 7: 8, 9: 12, 13: 16, 64: 68, 130: 132, 256: 260}
    assert {c: _gridsample_cpu.channel_stride(c) for c in strides} == strides
    for c, stride in strides.items():
        x, grid = _native_case((1, c, 11, 13), (7, 9), seed=60 + c)
        xs, gs = x[0].reshape(c, -1).numpy(), grid[0].reshape(-1, 2).numpy()
        results = []
        for s in (c, stride):
            xt = np.full((11 * 13 + 1, s), np.nan, np.float32)  # the kernel writes every value it reads
            out = np.full((c, 63), np.nan, np.float32)
            _cpu_kernels.to_channels_last(xs, xt, c, s, 11 * 13, 0, 11 * 13)
            _cpu_kernels.grid_sample(xt, gs, out, c, s, 11, 13, 63, mode, 0, False, 0, 63)
            results.append(out.view(np.int32))
        np.testing.assert_array_equal(results[1], results[0])


def _planes_available() -> bool:
    from opbridge.ops import _cpu_native

    module = _cpu_native.module()
    return module is not None and bool(module.planes_apply(1, 8, 8, 0))


_NO_PLANES = "this CPU has no AVX2 and FMA: grid_sample reads every channel count through the channels-last copy"


@pytest.mark.skipif(not _planes_available(), reason=_NO_PLANES)
@pytest.mark.parametrize("mode", list(_NATIVE_MODES), ids=list(_NATIVE_MODES.values()))
def test_native_grid_sample_planes_equal_channels_last(mode: int) -> None:
    """With few channels the kernel gathers each point's taps from the input planes, eight points per
    vector, instead of reading a channels-last copy: bit for bit the same outputs in every padding and
    corner rule, at NaN, infinite, huge and half-way coordinates, on planes of one pixel and on ranges
    of points that start and end inside a vector (each call writes only its own points)."""
    from opbridge.ops import _cpu_kernels

    assert [_cpu_kernels.planes_apply(c, 64, 64, mode) for c in (1, 2, 3)] == [True, mode == 1, False]
    assert not _cpu_kernels.planes_apply(1, 1, 2**24 + 1, mode) and not _cpu_kernels.planes_apply(1, 2**24 + 1, 1, mode)
    for c, h, w in ((1, 16, 8), (2, 1, 1), (3, 6, 9), (1, 64, 32), (1, 13, 17)):
        x, grid = _native_case((1, c, h, w), (9, 11), seed=90 + c + h)
        gs = grid[0].reshape(-1, 2).clone()
        # without align_corners, half-way between columns j and j + 1 at (2 j + 2) / W - 1 (exact where the
        # side is a power of two; likewise for rows), and the corners
        gs[5:9] = torch.tensor([[2 / w - 1, 2 / h - 1], [6 / w - 1, 4 / h - 1], [-1.0, 1.0], [1.0, -1.0]])
        xs, gs = x[0].reshape(c, -1).numpy(), gs.numpy()
        p = gs.shape[0]
        xt = np.empty((h * w + 1, _cpu_kernels.channel_stride(c)), np.float32)
        _cpu_kernels.to_channels_last(xs, xt, c, xt.shape[1], h * w, 0, h * w)
        for pad in (0, 1, 2):
            for align in (False, True):
                want = np.full((c, p), np.nan, np.float32)
                _cpu_kernels.grid_sample(xt, gs, want, c, xt.shape[1], h, w, p, mode, pad, align, 0, p)
                got = np.full((c, p), np.nan, np.float32)
                _cpu_kernels.grid_sample_planes(xs, gs, got, c, h, w, p, mode, pad, align, 0, 3)
                _cpu_kernels.grid_sample_planes(xs, gs, got, c, h, w, p, mode, pad, align, 3, p - 10)
                part = got[:, p - 10 :].copy()
                _cpu_kernels.grid_sample_planes(xs, gs, got, c, h, w, p, mode, pad, align, p - 10, p)
                assert np.isnan(part).all()
                np.testing.assert_array_equal(
                    got.view(np.int32), want.view(np.int32), err_msg=f"{c}x{h}x{w} {pad} {align}"
                )


@pytest.mark.skipif(not _planes_available(), reason=_NO_PLANES)
def test_native_grid_sample_planes_reject_bad_calls() -> None:
    """The planes path checks its buffers' lengths and sizes before it reads or writes anything."""
    from opbridge.ops import _cpu_kernels

    x, g, out = np.zeros((1, 36), np.float32), np.zeros((4, 2), np.float32), np.zeros((1, 4), np.float32)
    with pytest.raises(
        ValueError, match=r"grid_sample_planes: x holds 144 bytes, 42 float32 values \(168 bytes\) expected"
    ):
        _cpu_kernels.grid_sample_planes(x, g, out, 1, 7, 6, 4, 0, 0, False, 0, 4)
    with pytest.raises(ValueError, match=r"grid_sample_planes: out holds 16 bytes, 5 float32 values"):
        _cpu_kernels.grid_sample_planes(x, np.zeros((5, 2), np.float32), out, 1, 6, 6, 5, 0, 0, False, 0, 5)
    with pytest.raises(ValueError, match=r"grid_sample_planes: mode 3, padding 0"):
        _cpu_kernels.grid_sample_planes(x, g, out, 1, 6, 6, 4, 3, 0, False, 0, 4)
    with pytest.raises(RuntimeError, match=r"planes of 1x16777217 .* sides of at most 16777216"):
        _cpu_kernels.grid_sample_planes(x, g, out, 1, 1, 2**24 + 1, 4, 0, 0, False, 0, 4)


@pytest.mark.parametrize("channels", [4, 2, 1], ids=["4ch", "2ch-planes", "1ch-planes"])
def test_native_grid_sample_nearest_rounds_half_to_even_and_keeps_bits(channels: int) -> None:
    """Nearest at coordinates exactly half-way between pixels rounds as ATen does (half to even), and
    copies NaN payloads and infinities as they are, through the channels-last copy and, with one or two
    channels, from the planes."""
    from opbridge.ops import _gridsample_cpu

    x = torch.arange(4 * 4 * 8, dtype=torch.float32).view(1, 4, 4, 8)
    bits = x.view(torch.int32)
    bits[0, 1] = 0x7FC00000 + torch.arange(32, dtype=torch.int32).view(4, 8)  # NaNs with payloads
    x[0, 2, 2, 2] = float("-inf")  # rounding half to even reads even rows and columns only
    first = 0 if channels == 4 else 1  # the channels taken: from the NaNs on
    # align_corners=False: half-way between pixels j and j + 1 of a row of 8 at 2 (j + 1) / 8 - 1 (exact
    # in float32, as is every step of the unnormalize), and likewise for the 4 rows
    xs = torch.tensor([(j + 1) / 4 - 1 for j in range(-1, 8)])
    ys = torch.tensor([(j + 1) / 2 - 1 for j in range(-1, 4)])
    grid = torch.stack(torch.meshgrid(ys, xs, indexing="ij")[::-1], dim=-1)[None]
    u = (grid[..., 0] + 1) * 4 - 0.5
    assert torch.equal(u - u.floor(), torch.full_like(u, 0.5))  # every point half-way in x
    for pad in (0, 1, 2):
        want = torch.nn.functional.grid_sample(
            x, grid, mode="nearest", padding_mode=_PADDINGS[pad], align_corners=False
        )
        got = _gridsample_cpu.grid_sample(x[:, first : first + channels], grid, 1, pad, False)
        assert torch.equal(got.view(torch.int32), want[:, first : first + channels].view(torch.int32))
    assert got[0, 1 - first].isnan().all() and (channels == 1 or (got[0, 2 - first] == float("-inf")).any())


@pytest.mark.parametrize(
    "shape,out_hw",
    [((2, 32, 64, 48), (96, 80)), ((1, 4, 37, 29), (192, 176)), ((2, 1, 37, 29), (384, 347))],
    ids=["32ch", "4ch-odd-pixels", "1ch-planes"],
)
@pytest.mark.parametrize("mode", list(_NATIVE_MODES), ids=list(_NATIVE_MODES.values()))
def test_native_grid_sample_writes_out_and_splits_over_threads(
    mode: int, shape: tuple[int, int, int, int], out_hw: tuple[int, int]
) -> None:
    """Into ``out`` in place (the bridge passes ONNX Runtime's buffer); two threads (each taking a
    range of pixels of the layout copy, then of output points) give the single thread's result bit
    for bit; a non-contiguous ``out`` is filled through a copy."""
    from opbridge.ops import _gridsample_cpu

    x, grid = _native_case(shape, out_hw, seed=31)
    n, c = shape[:2]
    assert c * out_hw[0] * out_hw[1] >= 2 * _gridsample_cpu._SPLIT_MIN  # enough work for two threads
    out = torch.full((n, c, *out_hw), float("nan"))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _gridsample_cpu.grid_sample(x, grid, mode, 0, False)
        torch.set_num_threads(2)
        if c >= _gridsample_cpu.MIN_CHANNELS[mode]:  # the op's kernel runs the native kernel
            got = d.GridSample.kernel(x, grid, interpolation_mode=mode, padding_mode=0, align_corners=False, out=out)
        else:
            got = _gridsample_cpu.grid_sample(x, grid, mode, 0, False, out=out)
        assert got is out
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(out.nan_to_num(7.0), one.nan_to_num(7.0))
    strided = torch.empty(n, c, out_hw[1], out_hw[0]).transpose(2, 3)
    assert _gridsample_cpu.grid_sample(x, grid, mode, 0, False, out=strided) is strided
    assert torch.equal(strided.nan_to_num(7.0), one.nan_to_num(7.0))


def test_native_grid_sample_concurrent_callers() -> None:
    """Callers on several threads at once, with different sizes (each thread keeps its own
    channels-last buffer, reused from call to call): every result is F.grid_sample's."""
    import concurrent.futures

    from opbridge.ops import _gridsample_cpu

    cases = [_native_case((1, c, 9 + c, 11), (7, 6 + c), seed=40 + c) for c in (8, 12, 16, 20, 24, 9)]

    def run(case: tuple[torch.Tensor, torch.Tensor]) -> bool:
        x, grid = case
        ok = True
        for mode in (2, 0, 1, 2):
            want = torch.nn.functional.grid_sample(x, grid, mode=_NATIVE_MODES[mode], align_corners=False)
            got = _gridsample_cpu.grid_sample(x, grid, mode)
            finite = want.isfinite()
            ok &= torch.equal(got.isnan(), want.isnan()) and torch.allclose(
                got[finite], want[finite], rtol=NATIVE_RTOL, atol=NATIVE_ATOL
            )
        return ok

    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        assert all(pool.map(run, cases * 3))


def test_native_grid_sample_path_choice() -> None:
    """The native kernel takes float32 inputs from two channels (bicubic), three (bilinear) and four
    (nearest); fewer channels (ATen is faster there) and other dtypes run F.grid_sample, bit for bit."""
    from opbridge.ops import _gridsample_cpu

    assert _gridsample_cpu.MIN_CHANNELS == {0: 3, 1: 4, 2: 2}
    _, grid = _native_case((1, 1, 8, 8), (5, 5), seed=32)
    xs = {c: torch.randn(1, c, 8, 8, generator=_gen(c)) for c in (1, 2, 3, 4)}
    assert [_gridsample_cpu.applies(xs[c], grid, 2) for c in (1, 2)] == [False, True]
    assert [_gridsample_cpu.applies(xs[c], grid, 0) for c in (2, 3)] == [False, True]
    assert [_gridsample_cpu.applies(xs[c], grid, 1) for c in (3, 4)] == [False, True]
    assert not _gridsample_cpu.applies(xs[4].double(), grid, 2)
    x6 = torch.randn(1, 6, 8, 8, dtype=torch.float64, generator=_gen(33))
    for x, mode in ((xs[1], 2), (xs[2], 0), (xs[3], 1), (x6, 2)):
        want = torch.nn.functional.grid_sample(
            x, grid.to(x.dtype), mode=("bilinear", "nearest", "bicubic")[mode], align_corners=False
        )
        got = d.GridSample.kernel(x, grid, interpolation_mode=mode, padding_mode=0, align_corners=False)
        assert torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0))


def test_native_grid_sample_rejects_bad_calls() -> None:
    """Wrong shapes, dtypes, modes and buffers raise errors naming the problem; the extension checks
    every buffer's length before it reads or writes, so a direct call with a short buffer cannot crash."""
    from opbridge.ops import _cpu_kernels, _gridsample_cpu

    x, grid = torch.randn(1, 4, 6, 6), torch.zeros(1, 2, 2, 2)
    with pytest.raises(ValueError, match=r"grid \(N, Ho, Wo, 2\)"):
        _gridsample_cpu.grid_sample(x, grid[..., :1], 2)
    with pytest.raises(ValueError, match="float32 CPU input"):
        _gridsample_cpu.grid_sample(x.double(), grid, 2)
    with pytest.raises(ValueError, match="interpolation_mode 3; 0 \\(bilinear\\), 1 \\(nearest\\) or 2 \\(bicubic\\)"):
        _gridsample_cpu.grid_sample(x, grid, 3)
    with pytest.raises(ValueError, match="padding_mode 3"):
        _gridsample_cpu.grid_sample(x, grid, 2, 3)
    with pytest.raises(ValueError, match=r"`out` must be a float32 CPU tensor of shape \(1, 4, 2, 2\)"):
        _gridsample_cpu.grid_sample(x, grid, 2, 0, False, out=torch.empty(1, 4, 2, 3))
    with pytest.raises(ValueError, match="attribute 'padding_mode' must be one of"):
        d.GridSample.kernel(x, grid, interpolation_mode=2, padding_mode=5, align_corners=False)
    xt, g, out = np.zeros((37, 4), np.float32), np.zeros((4, 2), np.float32), np.zeros((4, 4), np.float32)
    for mode in (0, 1, 2):
        _cpu_kernels.grid_sample(xt, g, out, 4, 4, 6, 6, 4, mode, 0, False, 0, 4)  # the right sizes run
    with pytest.raises(ValueError, match="mode 3, padding 0; modes 0 \\(bilinear\\), 1 \\(nearest\\), 2 \\(bicubic\\)"):
        _cpu_kernels.grid_sample(xt, g, out, 4, 4, 6, 6, 4, 3, 0, False, 0, 4)
    with pytest.raises(ValueError, match="xt holds 576 bytes, 148 float32 values"):
        _cpu_kernels.grid_sample(xt[:-1], g, out, 4, 4, 6, 6, 4, 2, 0, False, 0, 4)
    with pytest.raises(ValueError, match="xt holds 592 bytes, 296 float32 values"):  # S = 8 needs 8 per pixel
        _cpu_kernels.grid_sample(xt, g, out, 4, 8, 6, 6, 4, 2, 0, False, 0, 4)
    with pytest.raises(
        ValueError, match="channel stride S=5 for C=4 and 36 pixels; S is C, or a multiple of 4 above C"
    ):
        _cpu_kernels.grid_sample(xt, g, out, 4, 5, 6, 6, 4, 2, 0, False, 0, 4)
    # a stride whose byte count wraps around 2**64 (to 32 bytes here) is refused, not read past
    huge = 2**61 + 4
    with pytest.raises(
        ValueError, match=r"S=2305843009213693956 for C=1 and 1 pixels; .* S \* \(pixels \+ 1\) <= 1e15"
    ):
        _cpu_kernels.grid_sample(
            np.zeros(8, np.float32),
            np.zeros(2, np.float32),
            np.zeros(1, np.float32),
            1,
            huge,
            1,
            1,
            1,
            0,
            0,
            False,
            0,
            1,
        )
    with pytest.raises(ValueError, match="to_channels_last: channel stride S=2305843009213693956"):
        _cpu_kernels.to_channels_last(np.zeros(1, np.float32), np.zeros(8, np.float32), 1, huge, 1, 0, 1)
    with pytest.raises(ValueError, match="channel_stride: C=0; C >= 1 expected"):
        _cpu_kernels.channel_stride(0)
    with pytest.raises(ValueError, match="channel stride S=4 for C=5"):
        _cpu_kernels.to_channels_last(np.zeros((5, 36), np.float32), xt, 5, 4, 36, 0, 36)
    with pytest.raises(ValueError, match=r"range \[0, 5\) outside \[0, 4\)"):
        _cpu_kernels.grid_sample(xt, g, out, 4, 4, 6, 6, 4, 2, 0, False, 0, 5)
    with pytest.raises(ValueError, match="out holds 48 bytes"):
        _cpu_kernels.grid_sample(xt, g, out[:, :3].copy(), 4, 4, 6, 6, 4, 2, 0, False, 0, 4)
    with pytest.raises(TypeError):
        _cpu_kernels.grid_sample(xt, g, out.copy().view(np.float32)[::-1], 4, 4, 6, 6, 4, 2, 0, False, 0, 4)
    with pytest.raises(ValueError, match="x holds"):
        _cpu_kernels.to_channels_last(np.zeros((4, 35), np.float32), xt, 4, 4, 36, 0, 36)


# --------------------------------------------------------------------------- grid_sample's native kernel inside ONNX Runtime


def _grid_sampler_node(mode: int, pad: int, align: int) -> onnx.NodeProto:
    """An mmdeploy::grid_sampler node y = grid_sampler(x, g)."""
    return helper.make_node(
        "grid_sampler",
        ["x", "g"],
        ["y"],
        domain="mmdeploy",
        interpolation_mode=mode,
        padding_mode=pad,
        align_corners=align,
    )


def _grid_sampler_model(mode: int, pad: int, align: int, elem: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """One grid_sampler node y = grid_sampler(x, g)."""
    return _one_node_model(_grid_sampler_node(mode, pad, align), elem)


def _assert_grid_result(got: torch.Tensor, want: torch.Tensor, mode: int) -> None:
    """Nearest bit for bit; the other modes with F.grid_sample's NaN and infinity patterns and the
    native kernel's tolerance elsewhere."""
    if mode == 1:
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))
        return
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())
    finite = want.isfinite()
    torch.testing.assert_close(got[finite], want[finite], rtol=NATIVE_RTOL, atol=NATIVE_ATOL)


_SESSION_CASES = [
    ((2, 1, 13, 17), (9, 11)),
    ((2, 3, 13, 17), (9, 11)),
    ((1, 6, 11, 9), (7, 8)),
    ((2, 20, 32, 24), (40, 30)),
    ((2, 64, 9, 10), (8, 7)),
]


@pytest.mark.parametrize("align", [0, 1], ids=["half-pixel", "align-corners"])
@pytest.mark.parametrize("pad", [0, 1, 2], ids=_PADDINGS)
@pytest.mark.parametrize("mode", list(_NATIVE_MODES), ids=list(_NATIVE_MODES.values()))
def test_native_grid_sample_in_ort_session(mode: int, pad: int, align: int) -> None:
    """opbridge's session runs grid_sampler's native kernel inside ONNX Runtime, without Python: F.grid_sample's
    results (nearest bit for bit) for batches, channel counts of the 4-wide, 8-wide, plain and padded layouts and
    NaN, infinite and huge coordinates, and the Python kernel's bit for bit where that runs the same kernel
    (``native=False``); fewer channels than ``NATIVE_MIN_CHANNELS`` run the Python kernel."""
    from opbridge.onnxruntime import InferenceSession
    from opbridge.ops import _gridsample_cpu

    model = _grid_sampler_model(mode, pad, align)
    native, python = InferenceSession(model), InferenceSession(model, native=False)
    assert [(k.path, k.native) for k in native.kernels.values()] == [("kernel", True)]
    assert [(k.path, k.native) for k in python.kernels.values()] == [("kernel", False)]
    for shape, out_hw in _SESSION_CASES:
        x, grid = _native_case(shape, out_hw, seed=sum(shape) + 3 * pad + align)
        x[-1, -1, 0, 0] = float("inf")
        feeds = {"x": x.numpy(), "g": grid.numpy()}
        got = torch.from_numpy(native.run(None, feeds)[0])
        want = F.grid_sample(x, grid, mode=_NATIVE_MODES[mode], padding_mode=_PADDINGS[pad], align_corners=bool(align))
        _assert_grid_result(got, want, mode)
        if shape[1] >= _gridsample_cpu.MIN_CHANNELS[mode]:  # the Python kernel runs the native kernel too
            slow = torch.from_numpy(python.run(None, feeds)[0])
            assert torch.equal(got.view(torch.int32), slow.view(torch.int32))


@pytest.mark.parametrize(
    "shape,out_hw", [((2, 32, 64, 48), (96, 80)), ((2, 1, 37, 29), (384, 347))], ids=["32ch", "1ch-planes"]
)
@pytest.mark.parametrize("mode", list(_NATIVE_MODES), ids=list(_NATIVE_MODES.values()))
def test_native_grid_sample_session_splits_over_intra_op_threads(
    mode: int, shape: tuple[int, int, int, int], out_hw: tuple[int, int]
) -> None:
    """A call with enough work is cut into pieces that ONNX Runtime's intra-op threads run: sessions of
    one, two and three threads give the same result bit for bit (each piece writes only its own
    points), which is F.grid_sample's; with one channel (read from the planes where the CPU has AVX2)
    too."""
    from opbridge.onnxruntime import InferenceSession

    x, grid = _native_case(shape, out_hw, seed=31)  # 2 or 3 pieces an image (65536 outputs a piece)
    feeds = {"x": x.numpy(), "g": grid.numpy()}
    results = []
    for threads in (1, 2, 3):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        sess = InferenceSession(_grid_sampler_model(mode, 0, 0), sess_options=opts)
        results.append(torch.from_numpy(sess.run(None, feeds)[0]))
    assert torch.equal(results[1].view(torch.int32), results[0].view(torch.int32))
    assert torch.equal(results[2].view(torch.int32), results[0].view(torch.int32))
    _assert_grid_result(results[0], F.grid_sample(x, grid, mode=_NATIVE_MODES[mode], align_corners=False), mode)


def test_native_grid_sample_sessions_on_several_threads() -> None:
    """Sessions run from several Python threads at once (the native kernel runs without the GIL; each
    thread keeps its own channels-last buffer, reused from run to run, here with growing images)."""
    import concurrent.futures

    from opbridge.onnxruntime import InferenceSession

    sessions = {mode: InferenceSession(_grid_sampler_model(mode, 0, 0)) for mode in _NATIVE_MODES}
    cases = [_native_case((1, c, 9 + 3 * c, 11 + c), (7, 6 + c), seed=70 + c) for c in (4, 8, 12, 16, 24, 9)]

    def run(case: tuple[torch.Tensor, torch.Tensor]) -> bool:
        x, grid = case
        for mode in (2, 0, 1, 2):
            got = torch.from_numpy(sessions[mode].run(None, {"x": x.numpy(), "g": grid.numpy()})[0])
            _assert_grid_result(got, F.grid_sample(x, grid, mode=_NATIVE_MODES[mode], align_corners=False), mode)
        return True

    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        assert all(pool.map(run, cases * 3))


def test_native_grid_sample_runs_without_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """The native kernel's runs never reach the op's Python kernel: with that kernel made to fail, the
    native session still runs (and the Python-kernel session fails), one bilinear channel too where the
    kernel reads it from the planes (AVX2), until a call the native kernel declines (empty planes, whose
    error the Python kernel names)."""
    from opbridge.onnxruntime import InferenceSession
    from opbridge.ops import _gridsample_cpu

    model = _grid_sampler_model(0, 0, 0)
    native, python = InferenceSession(model), InferenceSession(model, native=False)
    x, grid = _native_case((1, 5, 8, 9), (4, 6), seed=81)

    def fail(*args: Any, **kwargs: Any) -> bool:
        raise RuntimeError("the Python kernel ran")

    monkeypatch.setattr(_gridsample_cpu, "applies", fail)
    got = torch.from_numpy(native.run(None, {"x": x.numpy(), "g": grid.numpy()})[0])
    _assert_grid_result(got, F.grid_sample(x, grid, align_corners=False), 0)
    with pytest.raises(Exception, match="the Python kernel ran"):
        python.run(None, {"x": x.numpy(), "g": grid.numpy()})
    one = x[:, :1].contiguous()
    if _planes_available():
        got = torch.from_numpy(native.run(None, {"x": one.numpy(), "g": grid.numpy()})[0])
        _assert_grid_result(got, F.grid_sample(one, grid, align_corners=False), 0)
    else:
        with pytest.raises(Exception, match="the Python kernel ran"):
            native.run(None, {"x": one.numpy(), "g": grid.numpy()})
    with pytest.raises(Exception, match="the Python kernel ran"):
        native.run(None, {"x": np.zeros((1, 5, 0, 9), np.float32), "g": grid.numpy()})


def test_native_grid_sample_declines_to_the_python_kernel() -> None:
    """Inputs the native kernel does not take run the op's Python kernel in the same session: float64
    (F.grid_sample), a single channel for bilinear where the kernel cannot read it from the planes (no
    AVX2; ATen's kernel is faster than the channels-last copy there), an empty output, and empty input
    planes, whose error the Python kernel names."""
    from opbridge.onnxruntime import InferenceSession
    from opbridge.ops import _gridsample_cpu

    assert _gridsample_cpu.NATIVE_MIN_CHANNELS[0] == 2
    x, grid = _native_case((1, 4, 6, 7), (5, 3), seed=80)
    double = InferenceSession(_grid_sampler_model(0, 1, 0, TensorProto.DOUBLE))
    got = double.run(None, {"x": x.double().numpy(), "g": grid.double().numpy()})[0]
    want = F.grid_sample(x.double(), grid.double(), padding_mode="border", align_corners=False)
    assert got.dtype == np.float64 and torch.equal(torch.from_numpy(got).nan_to_num(7.0), want.nan_to_num(7.0))
    sess = InferenceSession(_grid_sampler_model(0, 0, 0))
    one = x[:, :1].contiguous()
    got = torch.from_numpy(sess.run(None, {"x": one.numpy(), "g": grid.numpy()})[0])
    if _planes_available():  # the native kernel's planes path: F.grid_sample's within its tolerance
        _assert_grid_result(got, F.grid_sample(one, grid, align_corners=False), 0)
    else:
        assert torch.equal(got.nan_to_num(7.0), F.grid_sample(one, grid, align_corners=False).nan_to_num(7.0))
    empty = sess.run(None, {"x": x.numpy(), "g": np.zeros((1, 0, 3, 2), np.float32)})[0]
    assert empty.shape == (1, 4, 0, 3)
    with pytest.raises(Exception, match=r"the input's planes are empty \(0x7\); pass H, W >= 1"):
        sess.run(None, {"x": np.zeros((1, 4, 0, 7), np.float32), "g": grid.numpy()})


def test_native_kernel_factory_errors() -> None:
    """The extension's factory checks its arguments; a native kernel that is not a capsule of opbridge's
    native kernel ABI fails the session's creation with a message naming the op and the fix."""
    from opbridge.onnxruntime import InferenceSession
    from opbridge.ops import _cpu_kernels

    with pytest.raises(ValueError, match="grid_sample_native: mode 3, padding 0, min_channels 1"):
        _cpu_kernels.grid_sample_native(3, 0, False, 1)
    with pytest.raises(ValueError, match="min_channels 0"):
        _cpu_kernels.grid_sample_native(0, 0, False, 0)
    with pytest.raises(ValueError, match="roi_align_native: output 0x3; both at least 1"):
        _cpu_kernels.roi_align_native(0, 3, 1.0, 0, False, True)

    @opbridge.op("test.native::Twice", shape=lambda x: opbridge.TensorInfo(x.shape, x.dtype))
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    twice.register_kernel(lambda x: x * 2, native=lambda attrs: "not a capsule")
    model = _one_node_model(helper.make_node("Twice", ["x"], ["y"], domain="test.native"))
    with pytest.raises(
        Exception, match=r"native kernel of test.native::Twice is not a 'opbridge.native_kernel' capsule"
    ):
        InferenceSession(model)
    sess = InferenceSession(model, native=False)  # the Python kernel alone
    assert sess.run(None, {"x": np.array([1.0, -2.0], np.float32)})[0].tolist() == [2.0, -4.0]


# --------------------------------------------------------------------------- DynamicResize, native kernel

# ATen's build fuses some products the native kernel rounds one by one (measured: 2.0e-6 of the
# input's largest value at most, over 900 random sizes); the tolerance is relative to that value
RESIZE_SCALE_TOL = 4e-6


def _resize_close(got: torch.Tensor, want: torch.Tensor, x: torch.Tensor) -> None:
    """Equal NaN and infinity patterns; elsewhere within RESIZE_SCALE_TOL of the input's largest value."""
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())
    finite = want.isfinite()
    scale = float(x[x.isfinite()].abs().max())
    torch.testing.assert_close(got[finite], want[finite], rtol=0, atol=RESIZE_SCALE_TOL * scale)


@pytest.mark.parametrize("align", [False, True], ids=["half-pixel", "align-corners"])
def test_dynamic_resize_native_kernel_coefficients_equal_aten(align: bool) -> None:
    """The cubic coefficients of every interior output equal ATen's bit for bit (read from resizing
    one-hot rows): ATen makes some exactly 0 at fractions near 0 and 1, and an infinite input then
    gives NaN there (inf * 0), not an infinity of the other sign."""
    from opbridge.ops import DynamicResize

    for w, wo in ((13, 38), (21, 45), (100, 37), (7, 200), (64, 129)):
        eye = torch.eye(w).view(1, w, 1, w)
        want = F.interpolate(eye, size=(1, wo), mode="bicubic", align_corners=align)[0, :, 0]
        got = DynamicResize.kernel(eye, torch.empty(1, 1, 1, wo), align_corners=align)[0, :, 0]
        # interior outputs: the four taps read four distinct pixels, each one weight alone
        taps = (want != 0).sum(0)
        interior = ((want != 0) & (torch.arange(w)[:, None] > 0) & (torch.arange(w)[:, None] < w - 1)).sum(0) == taps
        assert interior.sum() > wo // 5
        assert torch.equal(got[:, interior].view(torch.int32), want[:, interior].view(torch.int32))
    x = torch.ones(1, 1, 4, 13)
    x[0, 0, 1, 10] = float("inf")
    want = F.interpolate(x, size=(3, 38), mode="bicubic", align_corners=True)
    got = DynamicResize.kernel(x, torch.empty(1, 1, 3, 38), align_corners=True)
    assert want[0, 0, 1, -1].isnan()
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())


@pytest.mark.parametrize("align", [False, True], ids=["half-pixel", "align-corners"])
@pytest.mark.parametrize(
    "size,out_hw",
    [
        ((2, 3, 9, 13), (20, 7)),
        ((1, 2, 16, 16), (32, 32)),
        ((1, 2, 16, 16), (64, 64)),
        ((1, 1, 40, 33), (7, 5)),
        ((1, 2, 1, 1), (3, 4)),
        ((1, 1, 1, 9), (5, 1)),
        ((1, 1, 8, 8), (1, 1)),
    ],
    ids=["9x13-to-20x7", "x2", "x4", "down-40x33-to-7x5", "1x1-up", "1x9-to-5x1", "to-1x1"],
)
def test_dynamic_resize_native_kernel_matches_torch(size: tuple, out_hw: tuple, align: bool) -> None:
    """DynamicResize's CPU kernel (the native separable kernel for float32) against F.interpolate:
    up, down, non-integer and one-pixel sizes, both corner rules, NaN and infinite inputs; into
    ``out`` in place and returned; float64 runs ATen's kernel, bit-equal."""
    from opbridge.ops import DynamicResize, _resize_cpu

    x = torch.randn(*size, generator=_gen(10)) * 10
    if x.numel() >= 4:  # a NaN and an infinity among finite values
        x.view(-1)[size[-1] // 2] = float("nan")
        x.view(-1)[-1] = float("inf")
    size_t = torch.empty(1, 1, *out_hw)
    want = DynamicResize.run_reference(x, size_t, align_corners=align)
    assert _resize_cpu.applies(x) and DynamicResize.kernel_kind == "torch"
    out = torch.full((size[0], size[1], *out_hw), 7.0)
    assert DynamicResize.kernel(x, size_t, align_corners=align, out=out) is out
    _resize_close(out, want, x)
    _resize_close(DynamicResize.kernel(x, size_t, align_corners=align), want, x)
    xd = x.double()
    assert not _resize_cpu.applies(xd)
    torch.testing.assert_close(
        DynamicResize.kernel(xd, size_t, align_corners=align),
        F.interpolate(xd, size=out_hw, mode="bicubic", align_corners=align),
        rtol=0,
        atol=0,
        equal_nan=True,
    )


def test_dynamic_resize_native_kernel_splits_over_threads() -> None:
    """Whole planes per thread, or bands of output rows when there are fewer planes than threads:
    both give the single thread's result bit for bit; a non-contiguous ``out`` is filled by a copy."""
    from opbridge.ops import _resize_cpu

    threads = torch.get_num_threads()
    for shape, hw in (((2, 3, 64, 48), (300, 200)), ((1, 1, 200, 120), (450, 260))):
        x = torch.randn(*shape, generator=_gen(11))
        try:
            torch.set_num_threads(1)
            one = _resize_cpu.resize_bicubic(x, *hw)
            torch.set_num_threads(2)
            two = _resize_cpu.resize_bicubic(x, *hw)
        finally:
            torch.set_num_threads(threads)
        assert torch.equal(one, two)
        _resize_close(one, F.interpolate(x, size=hw, mode="bicubic", align_corners=False), x)
        strided = torch.empty(shape[0], shape[1], hw[1], hw[0]).transpose(2, 3)
        assert _resize_cpu.resize_bicubic(x, *hw, out=strided) is strided
        assert torch.equal(strided, one)


def test_dynamic_resize_native_kernel_rejects_bad_calls() -> None:
    """Bad shapes, dtypes and sizes raise errors naming them; the extension checks the buffers'
    lengths and the ranges before it reads or writes."""
    from opbridge.ops import _cpu_kernels, _resize_cpu

    x = torch.randn(1, 2, 4, 5)
    with pytest.raises(ValueError, match="float32 CPU input"):
        _resize_cpu.resize_bicubic(x.double(), 8, 10)
    with pytest.raises(ValueError, match="output size 0x10"):
        _resize_cpu.resize_bicubic(x, 0, 10)
    with pytest.raises(ValueError, match=r"`out` must be a float32 CPU tensor of shape \(1, 2, 8, 10\)"):
        _resize_cpu.resize_bicubic(x, 8, 10, out=torch.empty(1, 2, 8, 9))
    xs, out = np.zeros((2, 4, 5), np.float32), np.zeros((2, 8, 10), np.float32)
    _cpu_kernels.resize_bicubic(xs, out, 2, 4, 5, 8, 10, False, 0, 2, 0, 8)  # the right sizes run
    with pytest.raises(ValueError, match="resize_bicubic: x holds 156 bytes"):
        _cpu_kernels.resize_bicubic(xs.reshape(-1)[:-1].copy(), out, 2, 4, 5, 8, 10, False, 0, 2, 0, 8)
    with pytest.raises(ValueError, match=r"resize_bicubic: range \[0, 9\) outside \[0, 8\)"):
        _cpu_kernels.resize_bicubic(xs, out, 2, 4, 5, 8, 10, False, 0, 2, 0, 9)
    with pytest.raises(ValueError, match=r"resize_bicubic: range \[0, 3\) outside \[0, 2\)"):
        _cpu_kernels.resize_bicubic(xs, out, 2, 4, 5, 8, 10, False, 0, 3, 0, 8)
    with pytest.raises(ValueError, match="planes=2 H=0"):
        _cpu_kernels.resize_bicubic(xs, out, 2, 0, 5, 8, 10, False, 0, 2, 0, 8)


def _resize_model(align: int, elem: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """One DynamicTRTResize node y = DynamicTRTResize(x, size)."""
    return _one_node_model(
        helper.make_node("DynamicTRTResize", ["x", "size"], ["y"], domain="Test", align_corners=align), elem
    )


@pytest.mark.parametrize("align", [0, 1], ids=["half-pixel", "align-corners"])
def test_dynamic_resize_native_kernel_in_ort_session(align: int) -> None:
    """opbridge's session runs DynamicResize's native kernel inside ONNX Runtime, without Python: the
    Python kernel's results bit for bit (``native=False``), F.interpolate's within the kernel's
    tolerance; sessions of one, two and three intra-op threads agree bit for bit, whether the pieces are
    planes or (one plane) bands of output rows."""
    from opbridge.onnxruntime import InferenceSession

    model = _resize_model(align)
    python = InferenceSession(model, native=False)
    sessions = []
    for threads in (1, 2, 3):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        sessions.append(InferenceSession(model, sess_options=opts))
    assert [(k.path, k.native) for k in sessions[0].kernels.values()] == [("kernel", True)]
    # 6 planes of 60000 outputs: up to 3 pieces of planes; one plane of 240000 outputs: 3 bands of rows
    for shape, hw in (((2, 3, 9, 13), (20, 7)), ((2, 3, 64, 48), (300, 200)), ((1, 1, 200, 120), (600, 400))):
        x = torch.randn(*shape, generator=_gen(12)) * 10
        x.view(-1)[5], x.view(-1)[-1] = float("nan"), float("inf")
        feeds = {"x": x.numpy(), "size": np.empty((1, 1, *hw), np.float32)}
        results = [torch.from_numpy(sess.run(None, feeds)[0]) for sess in sessions]
        for other in (*results[1:], torch.from_numpy(python.run(None, feeds)[0])):
            assert torch.equal(other.nan_to_num(7.0), results[0].nan_to_num(7.0))
        _resize_close(results[0], F.interpolate(x, size=hw, mode="bicubic", align_corners=bool(align)), x)


def test_dynamic_resize_native_kernel_declines_and_runs_without_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """float64 inputs and empty sizes run the Python kernel (ATen's result; its error for empty input
    planes); float32 runs never reach it (the session runs with the Python kernel made to fail)."""
    from opbridge.onnxruntime import InferenceSession
    from opbridge.ops import _resize_cpu

    x = torch.randn(1, 2, 6, 5, generator=_gen(13))
    size = np.empty((1, 1, 9, 4), np.float32)
    double = InferenceSession(_resize_model(0, TensorProto.DOUBLE))
    got = double.run(None, {"x": x.double().numpy(), "size": size.astype(np.float64)})[0]
    assert torch.equal(torch.from_numpy(got), F.interpolate(x.double(), size=(9, 4), mode="bicubic"))
    sess = InferenceSession(_resize_model(0))
    with pytest.raises(Exception, match=r"the input's planes are empty \(0x5\); pass H, W >= 1"):
        sess.run(None, {"x": np.zeros((1, 2, 0, 5), np.float32), "size": size})
    with pytest.raises(Exception, match="output size 0x4"):
        sess.run(None, {"x": x.numpy(), "size": np.empty((1, 1, 0, 4), np.float32)})
    with pytest.raises(Exception, match=r"the input \[1, 0, 6, 5\] has no channels"):  # as F.interpolate
        sess.run(None, {"x": np.zeros((1, 0, 6, 5), np.float32), "size": size})
    assert sess.run(None, {"x": np.zeros((0, 2, 6, 5), np.float32), "size": size})[0].shape == (0, 2, 9, 4)

    def fail(*args: Any, **kwargs: Any) -> bool:
        raise RuntimeError("the Python kernel ran")

    monkeypatch.setattr(_resize_cpu, "applies", fail)
    got = torch.from_numpy(sess.run(None, {"x": x.numpy(), "size": size})[0])
    _resize_close(got, F.interpolate(x, size=(9, 4), mode="bicubic"), x)
    with pytest.raises(Exception, match="the Python kernel ran"):
        InferenceSession(_resize_model(0), native=False).run(None, {"x": x.numpy(), "size": size})


# --------------------------------------------------------------------------- standard ONNX ops in ONNX Runtime


def _run_ort(
    nodes: list[onnx.NodeProto],
    feeds: dict[str, np.ndarray],
    opset: int,
    functions: list[onnx.FunctionProto] = (),
    extra_opsets: tuple = (),
) -> np.ndarray:
    types = {
        np.dtype(np.float32): TensorProto.FLOAT,
        np.dtype(np.float64): TensorProto.DOUBLE,
        np.dtype(np.int64): TensorProto.INT64,
    }
    inputs = [helper.make_tensor_value_info(k, types[v.dtype], None) for k, v in feeds.items()]
    graph = helper.make_graph(
        nodes,
        "g",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", opset), *extra_opsets],
        functions=list(functions),
    )
    model.ir_version = 10
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


GRID_COMBOS = [(m, p, a) for m in range(3) for p in range(3) for a in (0, 1)]


@pytest.mark.parametrize("opset", [16, 20])
@pytest.mark.parametrize("combo", GRID_COMBOS, ids=[f"m{m}-p{p}-a{a}" for m, p, a in GRID_COMBOS])
def test_onnx_gridsample_matches_reference(combo: tuple, opset: int) -> None:
    m, p, a = combo
    x, grid = (
        torch.randn(2, 3, 5, 7, generator=_gen(10)),
        torch.rand(2, 4, 6, 2, generator=_gen(11)) * 2.6 - 1.3,
    )
    names = ("bilinear", "nearest", "bicubic") if opset < 20 else ("linear", "nearest", "cubic")
    node = helper.make_node(
        "GridSample",
        ["x", "g"],
        ["y"],
        mode=names[m],
        padding_mode=("zeros", "border", "reflection")[p],
        align_corners=a,
    )
    got = _run_ort([node], {"x": x.numpy(), "g": grid.numpy()}, opset)
    _close(
        got,
        d.GridSample.run_reference(x, grid, interpolation_mode=m, padding_mode=p, align_corners=bool(a)),
        atol=1e-5,
    )


def test_onnx_gridsample_renamed_its_modes_at_opset_20() -> None:
    node = helper.make_node("GridSample", ["x", "g"], ["y"], mode="bilinear")
    feeds = {
        "x": np.zeros((1, 1, 2, 2), np.float32),
        "g": np.zeros((1, 1, 1, 2), np.float32),
    }
    with pytest.raises(
        Exception,
        match='mode "bilinear" not supported, expect linear, nearest or cubic',
    ):
        _run_ort([node], feeds, 20)


@pytest.mark.parametrize("opset", [17, 20])
def test_grid_sampler_function_body_runs_at_the_opset_it_was_built_for(
    opset: int,
) -> None:
    x, grid = (
        torch.randn(1, 2, 4, 5, generator=_gen(12)),
        torch.rand(1, 3, 3, 2, generator=_gen(13)) * 2.2 - 1.1,
    )
    for m, p, a in [(0, 0, 0), (1, 2, 1), (2, 1, 0)]:
        node = _grid_sampler_node(m, p, a)
        got = _run_ort(
            [node],
            {"x": x.numpy(), "g": grid.numpy()},
            opset,
            [d.grid_sampler_function(opset)],
            (helper.make_opsetid("mmdeploy", 1),),
        )
        _close(
            got,
            d.GridSample.run_reference(x, grid, interpolation_mode=m, padding_mode=p, align_corners=bool(a)),
            atol=1e-5,
        )
    # a float64 grid with a float32 input: sampled in the input's dtype, as the reference casts it (the body
    # handed it to GridSample as it was, which ONNX Runtime has no kernel of: the model did not load)
    for m in (0, 1):
        got = _run_ort(
            [_grid_sampler_node(m, 0, 0)],
            {"x": x.numpy(), "g": grid.double().numpy()},
            opset,
            [d.grid_sampler_function(opset)],
            (helper.make_opsetid("mmdeploy", 1),),
        )
        want = d.GridSample.run_reference(x, grid.double(), interpolation_mode=m, padding_mode=0, align_corners=False)
        assert got.dtype == np.float32
        _close(got, want, atol=1e-5)
    with pytest.raises(ValueError, match="GridSample needs opset >= 16; the model has opset 15"):
        d.grid_sampler_function(15)


def _half_pixel_grid(h: int, w: int, align: int, seed: int) -> torch.Tensor:
    """Grid points on every half pixel from 2.5 planes before the plane to 2.5 after it (ties of nearest's
    rounding), then uniform ones."""
    rng = np.random.default_rng(seed)
    px = np.arange(-2 * w - 5, 4 * w + 6) / 2.0
    py = rng.integers(-2 * h - 5, 4 * h + 6, px.shape) / 2.0
    if align:
        gx, gy = px * 2 / max(w - 1, 1) - 1, py * 2 / max(h - 1, 1) - 1
    else:
        gx, gy = (2 * px + 1) / w - 1, (2 * py + 1) / h - 1
    ties = np.stack([gx, gy], -1).astype(np.float32).reshape(1, 1, -1, 2)
    uniform = rng.uniform(-1.7, 1.7, (1, 1, 64, 2)).astype(np.float32)
    return torch.from_numpy(np.concatenate([ties, uniform], axis=2))


@pytest.mark.parametrize("align", [0, 1], ids=["align0", "align1"])
@pytest.mark.parametrize("pad", [0, 1, 2], ids=["zeros", "border", "reflection"])
def test_grid_sampler_body_samples_nearest_as_pytorch(pad: int, align: int) -> None:
    """ONNX's GridSample rounds a nearest coordinate before it reflects it: at half-pixel points outside the
    plane, reflection without align_corners picked another pixel than F.grid_sample (-2.5 on 4 pixels
    read pixel 1 for 2) in ONNX Runtime, OpenVINO and onnx.reference alike. The body now writes nearest
    sampling out in standard ops, as ATen computes it; stock ONNX Runtime gives F.grid_sample's values."""
    from onnx.reference import ReferenceEvaluator

    for h, w, seed in ((1, 4, 0), (5, 4, 1), (3, 7, 2)):
        x = torch.randn(2, 3, h, w, generator=_gen(seed))
        grid = _half_pixel_grid(h, w, align, seed).expand(2, -1, -1, -1).contiguous()
        want = F.grid_sample(x, grid, mode="nearest", padding_mode=("zeros", "border", "reflection")[pad],
                             align_corners=bool(align))  # fmt: skip
        feeds = {"x": x.numpy(), "g": grid.numpy()}
        body = [d.grid_sampler_function(17)]
        got = _run_ort([_grid_sampler_node(1, pad, align)], feeds, 17, body, (helper.make_opsetid("mmdeploy", 1),))
        np.testing.assert_array_equal(got, want.numpy())
        graph = helper.make_graph(
            [_grid_sampler_node(1, pad, align)],
            "g",
            [helper.make_tensor_value_info(k, TensorProto.FLOAT, None) for k in feeds],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        )
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("mmdeploy", 1)], functions=body
        )
        np.testing.assert_array_equal(ReferenceEvaluator(model).run(None, feeds)[0], want.numpy())


@pytest.mark.parametrize("pad", [0, 1, 2], ids=["zeros", "border", "reflection"])
def test_grid_sampler_nearest_body_takes_an_empty_batch(pad: int) -> None:
    """The body reshaped the indices to (N, 1, -1), which ONNX Runtime cannot work out at N = 0: a batch
    of 0 failed where F.grid_sample returns an empty output."""
    x, grid = torch.randn(0, 3, 4, 5), torch.rand(0, 2, 6, 2) * 2 - 1
    want = F.grid_sample(x, grid, mode="nearest", padding_mode=("zeros", "border", "reflection")[pad])
    feeds = {"x": x.numpy(), "g": grid.numpy()}
    body = [d.grid_sampler_function(17)]
    got = _run_ort([_grid_sampler_node(1, pad, 0)], feeds, 17, body, (helper.make_opsetid("mmdeploy", 1),))
    assert got.shape == tuple(want.shape) == (0, 3, 2, 6) and got.dtype == np.float32


def test_onnx_deformconv_matches_reference_but_needs_opset_19() -> None:
    tensors, attrs = dcn_inputs(14, groups=2, deform_groups=2)
    x, off, mask, w, b = (t.numpy() for t in tensors)
    node = helper.make_node(
        "DeformConv",
        ["x", "w", "o", "b", "m"],
        ["y"],
        pads=[1, 1, 1, 1],
        group=2,
        offset_group=2,
    )
    feeds = {"x": x, "w": w, "o": off, "b": b, "m": mask}
    _close(
        _run_ort([node], feeds, 19),
        d.ModulatedDeformConv2d.run_reference(*tensors, **attrs),
        atol=1e-4,
    )
    # the TorchScript exporter's default opset is 17, where DeformConv does not exist
    with pytest.raises(Exception, match="DeformConv"):
        _run_ort([node], feeds, 17)


@pytest.mark.parametrize("aligned", [True, False], ids=["half_pixel", "output_half_pixel"])
def test_onnx_roialign_avg_matches_reference(aligned: bool) -> None:
    feat, rois = (
        torch.randn(2, 3, 16, 16, generator=_gen(15)),
        rois_for(16, 12, 2, 60.0),
    )
    node = helper.make_node(
        "RoiAlign",
        ["x", "r", "b"],
        ["y"],
        mode="avg",
        output_height=3,
        output_width=3,
        sampling_ratio=0,
        spatial_scale=0.25,
        coordinate_transformation_mode="half_pixel" if aligned else "output_half_pixel",
    )
    feeds = {
        "x": feat.numpy(),
        "r": rois[:, 1:].contiguous().numpy(),
        "b": rois[:, 0].long().numpy(),
    }
    want = d.RoIAlign.run_reference(
        feat,
        rois,
        output_height=3,
        output_width=3,
        spatial_scale=0.25,
        sampling_ratio=0,
        aligned=aligned,
    )
    _close(_run_ort([node], feeds, 16), want, atol=1e-5)


def test_onnx_roialign_max_differs_from_mmcv() -> None:
    """ONNX Runtime's RoiAlign "max" takes the max of weighted corner terms, not of interpolated samples."""
    feat, rois = torch.randn(1, 2, 16, 16, generator=_gen(17)), rois_for(18, 8, 1, 60.0)
    node = helper.make_node(
        "RoiAlign",
        ["x", "r", "b"],
        ["y"],
        mode="max",
        output_height=3,
        output_width=3,
        sampling_ratio=2,
        spatial_scale=0.25,
        coordinate_transformation_mode="half_pixel",
    )
    feeds = {
        "x": feat.numpy(),
        "r": rois[:, 1:].contiguous().numpy(),
        "b": rois[:, 0].long().numpy(),
    }
    want = d.RoIAlign.run_reference(
        feat,
        rois,
        output_height=3,
        output_width=3,
        spatial_scale=0.25,
        sampling_ratio=2,
        mode="max",
    )
    got = _run_ort([node], feeds, 16)
    assert float(np.abs(got - want.numpy()).max()) > 0.1


# --------------------------------------------------------------------------- ONNX Runtime through opbridge's kernel bridge


def _export_cases() -> list[tuple[str, opbridge.OpDef, tuple, dict]]:
    dcn, dcn_attrs = dcn_inputs(20)
    g = _gen(21)
    feats = tuple(torch.randn(1, 3, 128 // s, 128 // s, generator=g) for s in (4, 8, 16, 32))
    boxes, scores = nms_inputs(22)
    return [
        (
            "grid_sampler",
            d.GridSample,
            (  # five channels: the session runs the native bicubic kernel into its own output
                torch.randn(1, 5, 5, 6, generator=g),
                torch.rand(1, 3, 4, 2, generator=g) * 2 - 1,
            ),
            {"interpolation_mode": 2, "padding_mode": 1},
        ),
        ("dcn", d.ModulatedDeformConv2d, tuple(dcn), dcn_attrs),
        (
            "roi_align",
            d.RoIAlign,
            (torch.randn(2, 3, 16, 16, generator=g), rois_for(23, 10, 2, 60.0)),
            {"spatial_scale": 0.25, "mode": "max"},
        ),
        ("multi_level", d.MultiLevelRoiAlign, (rois_for(24, 20, 1, 128.0), *feats), {}),
        (
            "nms",
            d.BatchedNMS,
            (boxes, scores),
            {"num_classes": 4, "topk": 40, "keep_topk": 25},
        ),
    ]


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("case", _export_cases(), ids=lambda c: c[0])
def test_ort_session_runs_the_ops(case: tuple, exporter: str, tmp_path: Path) -> None:
    """Each op runs in ONNX Runtime: through its ONNX body where the model's opset has one, else its kernel.

    grid_sampler has a body from opset 16 and DCNv2 from 19 (dynamo exports at 20, TorchScript at 17).
    """
    from opbridge.onnxruntime import InferenceSession

    name, opdef, args, attrs = case

    class Call(torch.nn.Module):
        def forward(self, *xs: torch.Tensor) -> Any:
            return opdef(*xs, **attrs)

    result = opbridge.export(Call(), args, tmp_path / f"{name}.onnx", exporter=exporter)
    has_body = any(f.name == opdef.spec.name for f in result.model.functions)
    opset = next(o.version for o in result.model.opset_import if o.domain == "")
    assert has_body == (opdef is d.GridSample or (opdef is d.ModulatedDeformConv2d and opset >= 19))
    # a body runs unless the op prefers its kernel for these attributes (bicubic grid_sampler does)
    prefers = has_body and opdef.prefers_kernel(opdef.spec.bind_attributes(attrs))
    sess = InferenceSession(str(result.path))
    assert {k.path for k in sess.kernels.values()} == {"function" if has_body and not prefers else "kernel"}
    feeds = {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)}
    got = sess.run(None, feeds)
    want = opdef.run_reference(*args, **attrs)
    want = want if isinstance(want, tuple) else (want,)
    for g_out, w_out in zip(got, want):
        _close(g_out, w_out, atol=1e-4)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize(
    "geometry",
    [{}, {"stride": 2, "pad": 2, "dil": 2}, {"groups": 1, "deform_groups": 1, "pad": 0}],
    ids=["groups2", "stride2-pad2-dil2", "plain"],
)
def test_dcn_body_matches_reference(geometry: dict, bias: bool, tmp_path: Path) -> None:
    """The DeformConv body (Pad + unpadded DeformConv) equals the reference in plain ONNX Runtime."""
    tensors, attrs = dcn_inputs(30, **geometry)
    args = tuple(tensors if bias else tensors[:4])

    class Call(torch.nn.Module):
        def forward(self, *xs: torch.Tensor) -> torch.Tensor:
            return d.ModulatedDeformConv2d(*xs, **attrs)

    result = opbridge.export(Call(), args, tmp_path / "dcn.onnx", exporter="torchscript", opset_version=19)
    body = next(f for f in result.model.functions if f.name == "MMCVModulatedDeformConv2d")
    assert [n.op_type for n in body.node] == ["Constant", "Constant", "Concat", "Pad", "DeformConv"]
    sess = ort.InferenceSession(str(result.path), providers=["CPUExecutionProvider"])
    got = sess.run(None, {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)})[0]
    _close(got, d.ModulatedDeformConv2d.run_reference(*args, **attrs), atol=1e-5)


@pytest.mark.parametrize("case", _export_cases(), ids=lambda c: c[0])
def test_openvino_runs_the_ops(case: tuple, tmp_path: Path) -> None:
    """OpenVINO runs each op: inlined bodies where its ONNX frontend converts them (GridSample),
    the op's Python kernel where it does not (DeformConv has no conversion rule) or there is no body."""
    pytest.importorskip("openvino", reason="openvino (the 'openvino' extra) is not installed")
    from opbridge.backends.openvino_backend import OpenVINORunner

    name, opdef, args, attrs = case

    class Call(torch.nn.Module):
        def forward(self, *xs: torch.Tensor) -> Any:
            return opdef(*xs, **attrs)

    result = opbridge.export(Call(), args, tmp_path / f"{name}.onnx", exporter="dynamo")
    with OpenVINORunner(str(result.path)) as runner:
        outputs = runner.infer({i.name: a.numpy() for i, a in zip(result.model.graph.input, args)})
        via_kernel = [k.name for k in runner.kernels]
    assert (opdef.spec.name in via_kernel) == (opdef is not d.GridSample)
    want = opdef.run_reference(*args, **attrs)
    want = want if isinstance(want, tuple) else (want,)
    for got, w in zip(outputs.values(), want):
        _close(got, w, atol=1e-4)


class _NearestClipped(torch.nn.Module):
    def forward(self, x: torch.Tensor, grid: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # the paddings that clip (border, reflection), one per corner rule (OpenVINO takes seconds a node)
        return tuple(
            d.GridSample(x, grid, interpolation_mode=1, padding_mode=padding, align_corners=align)
            for padding, align in ((1, False), (2, True))
        )


def test_nearest_body_in_openvino_takes_non_finite_coordinates_as_pytorch_does(tmp_path: Path) -> None:
    """The nearest body clips a NaN coordinate to pixel 0 through Greater(NaN, 0) being false; OpenVINO's
    CPU plugin gives it true, and a NaN (or, under reflection, an infinite) coordinate picked the last
    pixel with border and reflection padding. The body now replaces NaN explicitly."""
    pytest.importorskip("openvino", reason="openvino (the 'openvino' extra) is not installed")
    from opbridge.backends.openvino_backend import OpenVINORunner

    nan, inf = float("nan"), float("inf")
    x = torch.arange(1.0, 13.0).view(1, 1, 3, 4)
    grid = torch.tensor([[[[nan, 0.3], [0.3, nan], [inf, 0.3], [-inf, -0.3], [0.3, -inf], [nan, nan]]]])
    model = _NearestClipped()
    path = tmp_path / "nearest.onnx"
    opbridge.export(model, (x, torch.zeros(1, 1, 6, 2)), path, exporter="torchscript", input_names=["x", "grid"])
    with OpenVINORunner(str(path)) as runner:
        assert runner.kernels == []  # (the bodies, not the op's Python kernel)
        got = list(runner.infer({"x": x.numpy(), "grid": grid.numpy()}).values())
    want = model(x, grid)
    assert len(got) == len(want) == 2
    for g, w, which in zip(got, want, ("border", "reflection")):
        np.testing.assert_array_equal(g, w.numpy(), err_msg=which)


def test_openvino_unconverted_op_message_is_parsed() -> None:
    from opbridge.backends.openvino_backend import _unconverted_ops

    message = (
        "FrontEnd API failed with OpConversionFailure: | Model wasn't fully converted. | Summary: "
        "| -- No conversion rule found for operations: DeformConv-20, mmdeploy.Foo-1\n more"
    )
    assert _unconverted_ops(message) == {"DeformConv", "Foo"}
    assert _unconverted_ops("some other failure") == set()


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("case", _export_cases(), ids=lambda c: c[0])
def test_reference_session_runs_the_ops(case: tuple, exporter: str, tmp_path: Path) -> None:
    """The ONNX reference evaluator runs each op: its kernel by default, its ONNX body when preferred."""
    from opbridge.reference import ReferenceSession

    name, opdef, args, attrs = case

    class Call(torch.nn.Module):
        def forward(self, *xs: torch.Tensor) -> Any:
            return opdef(*xs, **attrs)

    result = opbridge.export(Call(), args, tmp_path / f"{name}.onnx", exporter=exporter)
    want = opdef.run_reference(*args, **attrs)
    want = want if isinstance(want, tuple) else (want,)
    has_body = any(f.name == opdef.spec.name for f in result.model.functions)
    opset = next(o.version for o in result.model.opset_import if o.domain == "")
    for prefer in ("spec", "function") if has_body else ("spec",):
        sess = ReferenceSession(result.path, prefer=prefer)
        feeds = {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)}
        if prefer == "function" and opdef is d.GridSample and opset < 20:
            # onnx.reference implements GridSample with opset 20's mode names only.
            with pytest.raises(RuntimeError, match="only supports nearest, linear, and cubic"):
                sess.run(None, feeds)
            continue
        for g_out, w_out in zip(sess.run(None, feeds), want):
            _close(g_out, w_out, atol=1e-4)


def test_openvino_compat_reports_the_kernel_fallback(tmp_path: Path) -> None:
    """compat --target openvino agrees with the backend: a body OpenVINO cannot convert runs as a Python op."""
    pytest.importorskip("openvino", reason="openvino (the 'openvino' extra) is not installed")
    from opbridge.graph import check_compat

    tensors, attrs = dcn_inputs(31)

    class Call(torch.nn.Module):
        def forward(self, *xs: torch.Tensor) -> torch.Tensor:
            return d.ModulatedDeformConv2d(*xs, **attrs)

    result = opbridge.export(Call(), tuple(tensors), tmp_path / "dcn.onnx", exporter="dynamo")
    assert any(f.name == "MMCVModulatedDeformConv2d" for f in result.model.functions)
    (verdict,) = [n for n in check_compat(result.path, "openvino").nodes if n.op_type == "MMCVModulatedDeformConv2d"]
    assert verdict.verdict == "opbridge"
    assert "DeformConv" in verdict.reason and "without conversion rule" in verdict.reason


def _resize_in_child(queue: Any) -> None:
    from opbridge.ops import _resize_cpu

    torch.set_num_threads(2)
    x = torch.arange(2 * 3 * 40 * 40, dtype=torch.float32).reshape(2, 3, 40, 40)
    # numpy's sum: PyTorch's own thread pool is not usable in a child forked after it ran
    queue.put(float(_resize_cpu.resize_bicubic(x, 300, 300).numpy().astype(np.float64).sum()))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_native_kernels_thread_pool_survives_fork() -> None:
    """A process forked after the native kernels split work over threads gets a pool of its own
    (the parent's worker threads do not exist in the child) instead of waiting forever."""
    import multiprocessing

    from opbridge.ops import _resize_cpu

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        x = torch.arange(2 * 3 * 40 * 40, dtype=torch.float32).reshape(2, 3, 40, 40)
        want = float(_resize_cpu.resize_bicubic(x, 300, 300).numpy().astype(np.float64).sum())  # the parent's pool
    finally:
        torch.set_num_threads(threads)
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_resize_in_child, args=(queue,))
    child.start()
    child.join(timeout=30)
    alive = child.is_alive()
    if alive:
        child.kill()
    assert not alive and child.exitcode == 0
    assert queue.get(timeout=5) == want


def test_inputs_the_ops_cannot_take_are_named_by_every_path() -> None:
    """Bare IndexErrors ("Dimension out of range", "index is out of bounds") named neither the op nor the
    input, and a count mismatch between NMS boxes and scores was blamed on num_classes."""
    from opbridge.ops import DynamicResize
    from opbridge.ops import _detection_cpu as cpu

    empty = torch.zeros(1, 2, 0, 6)
    rois = torch.tensor([[0.0, 1, -1, 3, 2]])
    with pytest.raises(ValueError, match=r"the features \(1, 2, 0, 6\) are empty; pass N, H, W >= 1"):
        d.RoIAlign(empty, rois, 2, 2)
    with pytest.raises(ValueError, match=r"the features \(1, 2, 0, 6\) are empty"):
        cpu._roi_align_numpy(empty.numpy(), rois.numpy(), 2, 2, 1.0, 0, "avg", True)
    with pytest.raises(ValueError, match=r"size_tensor .* needs at least 2 dims .* got shape \(5,\)"):
        DynamicResize(torch.zeros(1, 2, 4, 4), torch.zeros(5))
    with pytest.raises(ValueError, match=r"input must be \(N, C, H, W\); got shape \(2, 4, 4\)"):
        DynamicResize(torch.zeros(2, 4, 4), torch.zeros(1, 1, 3, 3))
    with pytest.raises(ValueError, match=r"boxes \(1, 9, 1, 4\) and scores \(1, 10, 3\) must agree in their first"):
        d.BatchedNMS(torch.zeros(1, 9, 1, 4), torch.zeros(1, 10, 3), num_classes=3)


def _at_offset(a: np.ndarray, offset: int) -> np.ndarray:
    """A copy of ``a`` starting ``offset`` bytes into a buffer (misaligned for float32 at 1 to 3)."""
    raw = np.zeros(a.nbytes + 16, np.uint8)
    out = np.frombuffer(raw.data, dtype=a.dtype, count=a.size, offset=offset).reshape(a.shape)
    out[...] = a
    return out


def test_native_kernels_leave_misaligned_feeds_to_the_python_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """A caller's feed may start at any address, and ONNX Runtime hands it over as it is: the native
    kernels, which read whole floats (and vectors), decline a misaligned input, and the Python kernels
    give the aligned feed's results bit for bit."""
    from opbridge.onnxruntime import InferenceSession
    from opbridge.ops import _roialign_cpu

    gen = _gen(81)
    cases = [
        (
            _grid_sampler_model(0, 1, 0),
            {"x": torch.randn(2, 16, 13, 15, generator=gen), "g": torch.rand(2, 7, 9, 2, generator=gen) * 2 - 1},
        ),
        (
            _grid_sampler_model(1, 0, 1),
            {"x": torch.randn(1, 1, 13, 15, generator=gen), "g": torch.rand(1, 7, 9, 2, generator=gen) * 2 - 1},
        ),
        (_resize_model(0), {"x": torch.randn(2, 5, 11, 13, generator=gen), "size": torch.zeros(1, 1, 17, 29)}),
        (
            _roi_align_model({"output_height": 3, "output_width": 2, "sampling_ratio": 2}),
            {"x": torch.randn(2, 3, 12, 12, generator=gen), "rois": rois_for(82, 6, 2, 24.0)},
        ),
    ]
    python_calls: list[int] = []
    kernel = _roialign_cpu.roi_align

    def counted(*args: Any, **kwargs: Any) -> Any:
        python_calls.append(1)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(_roialign_cpu, "roi_align", counted)
    for model, tensors in cases:
        feed = {k: v.numpy() for k, v in tensors.items()}
        sess = InferenceSession(model)
        want = sess.run(None, feed)[0]
        for offset in (1, 2, 3):
            got = sess.run(None, {k: _at_offset(v, offset) for k, v in feed.items()})[0]
            np.testing.assert_array_equal(got, want)
    assert len(python_calls) == 3  # RoIAlign's aligned run stayed native; its three misaligned ones did not


def test_the_c_entry_points_refuse_misaligned_buffers() -> None:
    """The extension's entry points read whole floats: a view that starts between two refuses, naming the
    buffer and the fix (the op's Python kernels hand them aligned copies)."""
    from opbridge.ops import _cpu_native

    module = _cpu_native.require()
    c, hw = 5, 31 * 37
    stride = module.channel_stride(c)
    x = _at_offset(np.ones(c * hw, np.float32), 1)
    xt = np.zeros((hw + 1) * stride, np.float32)
    with pytest.raises(ValueError, match=r"to_channels_last: x starts at an address that is not a multiple of 4"):
        module.to_channels_last(x, xt, c, stride, hw, 0, hw)
    module.to_channels_last(np.require(x, requirements="CA"), xt, c, stride, hw, 0, hw)
    assert xt.reshape(hw + 1, stride)[:hw, :c].min() == 1.0
