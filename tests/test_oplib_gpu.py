"""GPU kernels of the detection ops against their references (needs CUDA and triton).

Each kernel runs through its registered ``gpu_kernel(inputs, outputs, attrs, stream)``
on a side stream, as the TensorRT plugin's enqueue calls it.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from opbridge.ops import detection as d

if not torch.cuda.is_available():
    pytest.skip("no CUDA device on this machine", allow_module_level=True)
pytest.importorskip("triton", reason="the GPU kernels are written in Triton")

DTYPES = [torch.float32, torch.float16]


def _tol(dtype: torch.dtype) -> dict[str, float]:
    return {"rtol": 1e-3, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 1e-2}


def _run(opdef: Any, inputs: list, attrs: dict) -> list[torch.Tensor]:
    bound = opdef.spec.bind_attributes(attrs)
    infos = opdef.shape_rule(*inputs, **bound)
    infos = infos if isinstance(infos, tuple) else (infos,)
    outs = [torch.full(tuple(i.shape), 7, dtype=i.dtype, device="cuda") for i in infos]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    opdef.gpu_kernel(inputs, outs, bound, side.cuda_stream)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    return outs


def _gen() -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mode", [0, 1, 2], ids=["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("pad", [0, 1, 2], ids=["zeros", "border", "reflection"])
def test_grid_sampler_gpu(dtype: torch.dtype, mode: int, pad: int) -> None:
    g = _gen()
    x = torch.randn(2, 5, 9, 11, device="cuda", generator=g).to(dtype)
    grid = (torch.rand(2, 7, 6, 2, device="cuda", generator=g) * 2.6 - 1.3).to(dtype)
    for ac in (False, True):
        attrs = {"interpolation_mode": mode, "padding_mode": pad, "align_corners": ac}
        (out,) = _run(d.GridSample, [x, grid], attrs)
        want = d.GridSample.run_reference(x.float(), grid.float(), **attrs)
        torch.testing.assert_close(out.float(), want, **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_dcn_gpu(dtype: torch.dtype, bias: bool) -> None:
    g = _gen()
    x = torch.randn(2, 8, 10, 9, device="cuda", generator=g)
    off = torch.randn(2, 2 * 2 * 9, 5, 5, device="cuda", generator=g) * 2
    mask = torch.rand(2, 2 * 9, 5, 5, device="cuda", generator=g)
    w = torch.randn(6, 4, 3, 3, device="cuda", generator=g) / 6
    b = torch.randn(6, device="cuda", generator=g) if bias else None
    attrs = {
        "stride": [2, 2],
        "padding": [1, 1],
        "dilation": [1, 1],
        "groups": 2,
        "deform_groups": 2,
    }
    inputs = [t.to(dtype) if t is not None else None for t in (x, off, mask, w, b)]
    (out,) = _run(d.ModulatedDeformConv2d, inputs, attrs)
    want = d.ModulatedDeformConv2d.run_reference(*[t.float() if t is not None else None for t in inputs], **attrs)
    torch.testing.assert_close(out.float(), want, **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dcn_gpu_offsets_past_the_input(dtype: torch.dtype) -> None:
    """Infinite and huge offsets sample 0 (torchvision's rule; their weights, NaN, are not used):
    finite outputs equal to the reference's in every variant."""
    from opbridge.ops import _detection_triton as tk

    g = _gen()
    x = torch.randn(2, 8, 10, 9, device="cuda", generator=g).to(dtype)
    off = torch.randn(2, 18, 10, 9, device="cuda", generator=g) * 2
    off[0, 0, 2, 2], off[1, 5, 3, 1], off[0, 3, 9, 8] = float("inf"), float("-inf"), 1e30
    off = off.to(dtype)
    mask = torch.rand(2, 9, 10, 9, device="cuda", generator=g).to(dtype)
    w = (torch.randn(6, 8, 3, 3, device="cuda", generator=g) / 6).to(dtype)
    want = d.ModulatedDeformConv2d.run_reference(x.float(), off.float(), mask.float(), w.float(), None, padding=[1, 1])
    assert want.isfinite().all()
    prev = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        for variant in ("nhwc", "loop", "fused"):
            out = torch.full((2, 6, 10, 9), float("nan"), device="cuda", dtype=dtype)
            tk.deform_conv2d(x, off, mask, w, None, out, (1, 1), (1, 1), (1, 1), 1, 1, variant=variant)
            assert out.isfinite().all(), variant
            torch.testing.assert_close(
                out.float(), want, **(_tol(dtype) if variant != "fused" else {"rtol": 1e-2, "atol": 1e-2})
            )
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_roi_align_gpu_bad_rois_stay_unwritten(dtype: torch.dtype) -> None:
    """RoIs the CPU kernels refuse (a NaN or out-of-range batch index; an adaptive grid that is not
    finite or over ROI_MAX_SAMPLES samples) are not run: a plugin cannot raise, and image 0 is not
    read for them; a batch index of -0.5 truncates to 0 as in the reference."""
    g = _gen()
    feat = torch.randn(2, 3, 12, 16, device="cuda", generator=g).to(dtype)
    good = [[0.0, 2.0, 3.0, 30.0, 20.0], [1.0, 0.0, 0.0, 60.0, 44.0], [-0.5, 5.0, 5.0, 25.0, 30.0]]
    bad = [
        [float("nan"), 2.0, 3.0, 30.0, 20.0],
        [2.0, 2.0, 3.0, 30.0, 20.0],
        [0.0, float("nan"), 3.0, 30.0, 20.0],
        [0.0, 0.0, 0.0, 60000.0, 60000.0],
    ]
    rois = torch.tensor(good + bad, device="cuda").to(dtype)
    attrs = {"output_height": 3, "output_width": 4, "spatial_scale": 0.25, "sampling_ratio": 0}
    (out,) = _run(d.RoIAlign, [feat, rois], attrs)
    want = d.RoIAlign.run_reference(feat.float(), rois[: len(good)].float(), **attrs)
    torch.testing.assert_close(out[: len(good)].float(), want, **_tol(dtype))
    assert (out[len(good) :] == 7).all()  # _run's fill value


@pytest.mark.parametrize("hw", [(1, 4), (5, 1), (1, 1), (4, 6)], ids=lambda hw: f"{hw[0]}x{hw[1]}")
@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roi_align_gpu_nan_samples(mode: str, hw: tuple[int, int]) -> None:
    """An infinite box with a fixed sampling ratio gives NaN sample coordinates: NaN bins, as the
    reference and the CPU kernels, on one-pixel axes too, and in max mode (NaN wins)."""
    h, w = hw
    feat = torch.arange(1.0, 1.0 + 2 * h * w, device="cuda").reshape(1, 2, h, w)
    inf = float("inf")
    rois = torch.tensor(
        [[0.0, 0.0, 0.0, 2.0, inf], [0.0, 0.0, 0.0, inf, 2.0], [0.0, 1.0, 0.0, 3.0, 1.0]], device="cuda"
    )
    attrs = {"output_height": 2, "output_width": 2, "spatial_scale": 1.0, "sampling_ratio": 2, "mode": mode}
    (out,) = _run(d.RoIAlign, [feat, rois], attrs)
    want = d.RoIAlign.run_reference(feat, rois, **attrs)
    assert want[:2].isnan().any()
    torch.testing.assert_close(out, want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_roi_align_gpu(dtype: torch.dtype) -> None:
    g = _gen()
    feat = torch.randn(2, 4, 20, 24, device="cuda", generator=g).to(dtype)
    xy = torch.rand(25, 2, device="cuda", generator=g) * 90 - 5
    rois = torch.cat(
        [
            torch.randint(0, 2, (25, 1), device="cuda", generator=g).float(),
            xy,
            xy + torch.rand(25, 2, device="cuda", generator=g) * 50,
        ],
        1,
    ).to(dtype)
    for mode in ("avg", "max"):
        for aligned in (True, False):
            for sr in (0, 2):
                attrs = {
                    "output_height": 3,
                    "output_width": 4,
                    "spatial_scale": 0.25,
                    "sampling_ratio": sr,
                    "mode": mode,
                    "aligned": aligned,
                }
                (out,) = _run(d.RoIAlign, [feat, rois], attrs)
                want = d.RoIAlign.run_reference(feat.float(), rois.float(), **attrs)
                torch.testing.assert_close(out.float(), want, **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_multi_level_roi_align_gpu(dtype: torch.dtype) -> None:
    g = _gen()
    feats = [torch.randn(2, 3, 256 // s, 256 // s, device="cuda", generator=g).to(dtype) for s in (4, 8, 16, 32)]
    xy = torch.rand(40, 2, device="cuda", generator=g) * 200
    rois = torch.cat(
        [
            torch.randint(0, 2, (40, 1), device="cuda", generator=g).float(),
            xy,
            xy + torch.rand(40, 2, device="cuda", generator=g) * 250,
        ],
        1,
    ).to(dtype)
    for pool in (0, 1):
        attrs = {"pool_mode": pool, "roi_scale_factor": 1.5}
        (out,) = _run(d.MultiLevelRoiAlign, [rois, *feats], attrs)
        want = d.MultiLevelRoiAlign.run_reference(rois.float(), *[f.float() for f in feats], **attrs)
        torch.testing.assert_close(out.float(), want, **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("per_class", [False, True], ids=["shared", "per-class"])
def test_batched_nms_gpu(dtype: torch.dtype, per_class: bool) -> None:
    g = _gen()
    xy = torch.rand(2, 150, 4 if per_class else 1, 2, device="cuda", generator=g) * 100
    boxes = torch.cat([xy, xy + 5 + torch.rand(xy.shape, device="cuda", generator=g) * 40], -1).to(dtype)
    scores = torch.rand(2, 150, 4, device="cuda", generator=g).to(dtype)
    scores[0, 7, 2] = scores[1, 3, 0] = float("inf")  # +inf passes any threshold and ranks first
    scores[0, 8, 1], scores[1, 4, 3] = float("-inf"), float("nan")  # these never pass
    for attrs in (
        {"topk": 40, "keep_topk": 30},
        {"topk": -1, "keep_topk": 300, "background_label_id": 1},
    ):
        attrs = dict(num_classes=4, **attrs)
        dets, labels = _run(d.BatchedNMS, [boxes, scores], attrs)
        want_d, want_l = d.BatchedNMS.run_reference(boxes.float(), scores.float(), **attrs)
        assert labels.dtype == torch.int32
        torch.testing.assert_close(labels, want_l, rtol=0, atol=0)
        torch.testing.assert_close(dets.float(), want_d, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "config", [None, (64, 16, 16, 4, 2), (32, 32, 16, 2, 3)], ids=["default", "split-channels", "small-blocks"]
)
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw-input", "channels-last-input"])
def test_dcn_gpu_fused_variant(dtype: torch.dtype, config: tuple | None, channels_last: bool) -> None:
    """Implicit GEMM from the channels-last input: channel blocks past Cin (40 in blocks of 16 or
    32), output channels in one or two blocks (20), pixels past P (90)."""
    from opbridge.ops import _detection_triton as tk

    g = _gen()
    x = torch.randn(2, 40, 10, 9, device="cuda", generator=g).to(dtype)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    off = (torch.randn(2, 18, 10, 9, device="cuda", generator=g) * 2).to(dtype)
    mask = torch.rand(2, 9, 10, 9, device="cuda", generator=g).to(dtype)
    w = (torch.randn(20, 40, 3, 3, device="cuda", generator=g) / 20).to(dtype)
    b = torch.randn(20, device="cuda", generator=g).to(dtype)
    want = d.ModulatedDeformConv2d.run_reference(
        x.float(), off.float(), mask.float(), w.float(), b.float(), padding=[1, 1]
    )
    out = torch.empty(2, 20, 10, 9, device="cuda", dtype=dtype)
    prev = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = dtype == torch.float32  # the fused path needs TF32 in float32
        tk.deform_conv2d(x, off, mask, w, b, out, (1, 1), (1, 1), (1, 1), 1, 1, variant="fused", fused_config=config)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    torch.testing.assert_close(out.float(), want, rtol=1e-2, atol=1e-2)


def _dcn_case(
    dtype: torch.dtype,
    size: tuple[int, int, int, int, int],
    kernel: tuple[int, int],
    stride: tuple[int, int],
    padding: tuple[int, int],
    dilation: tuple[int, int],
    groups: int,
    dg: int,
    bias: bool,
) -> tuple:
    """DCNv2 inputs (x, offset, mask, weight, bias or None) in ``dtype`` for an (N, Cin, H, W, Cout)
    ``size`` and a kh x kw ``kernel``, and the float32 reference's output."""
    n, cin, h, w, cout = size
    kh, kw = kernel
    ho = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (w + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    g = _gen()
    x = torch.randn(n, cin, h, w, device="cuda", generator=g).to(dtype)
    off = (torch.randn(n, 2 * dg * kh * kw, ho, wo, device="cuda", generator=g) * 2).to(dtype)
    mask = torch.rand(n, dg * kh * kw, ho, wo, device="cuda", generator=g).to(dtype)
    wt = (torch.randn(cout, cin // groups, kh, kw, device="cuda", generator=g) / 20).to(dtype)
    b = torch.randn(cout, device="cuda", generator=g).to(dtype) if bias else None
    want = d.ModulatedDeformConv2d.run_reference(
        x.float(),
        off.float(),
        mask.float(),
        wt.float(),
        b.float() if b is not None else None,
        stride=list(stride),
        padding=list(padding),
        dilation=list(dilation),
        groups=groups,
        deform_groups=dg,
    )
    return x, off, mask, wt, b, want


@pytest.mark.parametrize("dtype", DTYPES, ids=["tf32", "float16"])
@pytest.mark.parametrize(
    "geometry",
    [
        ((2, 1), (0, 2), (1, 2), (3, 3), True),
        ((1, 2), (2, 1), (2, 1), (3, 3), False),
        ((1, 1), (1, 2), (1, 1), (3, 5), True),
    ],
    ids=["strided-dilated", "dilated-no-bias", "kernel-3x5"],
)
def test_dcn_gpu_fused_geometry(dtype: torch.dtype, geometry: tuple) -> None:
    """The implicit GEMM with strides, dilations, asymmetric padding and a 3 x 5 kernel (K = 15
    taps), 36 input channels (a partial channel block) and 24 output channels."""
    from opbridge.ops import _detection_triton as tk

    stride, padding, dilation, kernel, bias = geometry
    x, off, mask, wt, b, want = _dcn_case(dtype, (2, 36, 13, 17, 24), kernel, stride, padding, dilation, 1, 1, bias)
    out = torch.empty(want.shape, device="cuda", dtype=dtype)
    prev = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        tk.deform_conv2d(x, off, mask, wt, b, out, stride, padding, dilation, 1, 1, variant="fused")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    torch.testing.assert_close(out.float(), want, rtol=1e-2, atol=1e-2)


def test_dcn_gpu_rejects_strided_out() -> None:
    """The kernels write (N, Cout, Ho, Wo) contiguously: a channels-last ``out`` is refused, not
    filled in the wrong order."""
    from opbridge.ops import _detection_triton as tk

    x = torch.randn(1, 4, 6, 6, device="cuda")
    off, mask = torch.zeros(1, 18, 6, 6, device="cuda"), torch.ones(1, 9, 6, 6, device="cuda")
    w = torch.randn(8, 4, 3, 3, device="cuda")
    out = torch.full((1, 8, 6, 6), 7.0, device="cuda").to(memory_format=torch.channels_last)
    with pytest.raises(ValueError, match="contiguous"):
        tk.deform_conv2d(x, off, mask, w, None, out, (1, 1), (1, 1), (1, 1), 1, 1)
    assert bool((out == 7.0).all())


@pytest.mark.parametrize("dtype", DTYPES, ids=["tf32", "float16"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_dcn_gpu_default_takes_fused(dtype: torch.dtype, bias: bool) -> None:
    """In float16, or float32 with TF32 allowed, with 32 output channels and 2 x 128 x 128 output
    pixels, the registered kernel takes the implicit GEMM: the same result as naming it, and the
    reference's within the precision of the inputs tl.dot takes."""
    from opbridge.ops import _detection_triton as tk

    g = _gen()
    x = torch.randn(2, 24, 128, 128, device="cuda", generator=g)
    off = torch.randn(2, 18, 128, 128, device="cuda", generator=g) * 2
    mask = torch.rand(2, 9, 128, 128, device="cuda", generator=g)
    w = torch.randn(32, 24, 3, 3, device="cuda", generator=g) / 15
    b = torch.randn(32, device="cuda", generator=g) if bias else None
    inputs = [t.to(dtype) if t is not None else None for t in (x, off, mask, w, b)]
    attrs = {"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 1, "deform_groups": 1}
    want = d.ModulatedDeformConv2d.run_reference(*[t.float() if t is not None else None for t in inputs], **attrs)
    named = torch.empty(want.shape, device="cuda", dtype=dtype)
    prev = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        assert tk._dcn_default_variant(True, 2, 128 * 128, 32, 1, 1) == "fused"
        (out,) = _run(d.ModulatedDeformConv2d, inputs, attrs)
        tk.deform_conv2d(*inputs, named, (1, 1), (1, 1), (1, 1), 1, 1, variant="fused")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    torch.testing.assert_close(out, named, rtol=0, atol=0)
    tol = 2e-3 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.float(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "geometry",
    [
        ((1, 1), (1, 1), (1, 1), 1, 1),
        ((2, 1), (0, 2), (1, 2), 1, 2),
        ((1, 1), (1, 1), (1, 1), 2, 1),
    ],
    ids=["s1-p1", "strided-dilated-dg2", "groups2"],
)
@pytest.mark.parametrize("config", [None, (16, 8, 1), (64, 32, 8)], ids=["default", "small-blocks", "large-blocks"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_dcn_gpu_nhwc_variant(dtype: torch.dtype, geometry: tuple, config: tuple | None, bias: bool) -> None:
    """The channels-last im2col: channel blocks that overhang a deform group, pixels past P, groups
    (which take the NCHW path)."""
    from opbridge.ops import _detection_triton as tk

    stride, padding, dilation, groups, dg = geometry
    x, off, mask, wt, b, want = _dcn_case(
        dtype, (2, 40, 11, 9, 20), (3, 3), stride, padding, dilation, groups, dg, bias
    )
    out = torch.empty(want.shape, device="cuda", dtype=dtype)
    tk.deform_conv2d(x, off, mask, wt, b, out, stride, padding, dilation, groups, dg, variant="nhwc", config=config)
    torch.testing.assert_close(out.float(), want, **_tol(dtype))


def _check_grid_variant(
    variant: str, config: tuple | None, dtype: torch.dtype, mode: int, channels: int, pads: tuple[int, ...]
) -> None:
    """grid_sample's ``variant`` with tiling ``config`` against the reference: a 3 x channels x 13 x 17
    input, an 11 x 19 grid reaching past the borders, each padding mode in ``pads``, both align_corners."""
    from opbridge.ops import _detection_triton as tk

    g = _gen()
    x = torch.randn(3, channels, 13, 17, device="cuda", generator=g).to(dtype)
    grid = (torch.rand(3, 11, 19, 2, device="cuda", generator=g) * 2.6 - 1.3).to(dtype)
    for pad in pads:
        for ac in (False, True):
            out = torch.full((3, channels, 11, 19), float("nan"), device="cuda", dtype=dtype)
            tk.grid_sample(x, grid, out, mode, pad, ac, variant=variant, config=config)
            want = d.GridSample.run_reference(
                x.float(), grid.float(), interpolation_mode=mode, padding_mode=pad, align_corners=ac
            )
            torch.testing.assert_close(out.float(), want, **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mode", [0, 1, 2], ids=["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize(
    "config",
    [(8, 32, 16, 4, 4), (2, 8, 3, 2, 1), (4, 4, 64, 4, 2), (1, 16, 1, 1, 1)],
    ids=["default-like", "partial-channel-group", "one-group", "row-tile"],
)
def test_grid_sampler_gpu_loop_tilings(dtype: torch.dtype, mode: int, config: tuple) -> None:
    """Tiles that overhang the output's edges and channel groups that do not divide C."""
    _check_grid_variant("loop", config, dtype, mode, channels=7, pads=(0, 2))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mode", [0, 1, 2], ids=["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("config", [None, (16, 8, 1), (64, 32, 8)], ids=["default", "small-blocks", "large-blocks"])
def test_grid_sampler_gpu_nhwc_variant(dtype: torch.dtype, mode: int, config: tuple | None) -> None:
    """The channels-last kernel: channel blocks that overhang C, pixel blocks past the output, every padding."""
    _check_grid_variant("nhwc", config, dtype, mode, channels=37, pads=(0, 1, 2))


def _plane_available() -> bool:
    from opbridge.ops import _gridsample_cuda

    return _gridsample_cuda.available()


needs_plane = pytest.mark.skipif(
    not hasattr(torch.cuda, "_compile_kernel"),
    reason="grid_sample's 'plane' kernel is compiled by torch.cuda._compile_kernel (NVRTC), absent in this torch",
)


@needs_plane
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mode", [0, 1, 2], ids=["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize(
    "config",
    [None, (1, 128, 64, 0, 0), (2, 256, 100, 2, 0), (4, 1024, 16384, 4, 1), (2, 256, 100, 2, 0, 1)],
    ids=["default", "one-channel-many-parts", "two-channels", "four-channels-one-block", "persistent-scalar-planes"],
)
def test_grid_sampler_gpu_plane_variant(dtype: torch.dtype, mode: int, config: tuple | None) -> None:
    """The shared-memory kernel: channel groups that overhang C (37 channels), outputs split over
    blocks, every padding, both align_corners; an odd plane (13 x 17) takes the scalar staging path."""
    assert _plane_available()
    _check_grid_variant("plane", config, dtype, mode, channels=37, pads=(0, 1, 2))


@needs_plane
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mode", [0, 1, 2], ids=["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize(
    "config", [None, (2, 256, 100, 2, 0), (4, 512, 8192, 4, 0, 1)], ids=["default", "two-channels", "persistent"]
)
def test_grid_sampler_gpu_plane_equals_pytorch_cuda(dtype: torch.dtype, mode: int, config: tuple | None) -> None:
    """ "plane" gives PyTorch's CUDA kernel's outputs bit for bit (its roundings of the unnormalize, the
    cubic weights and the tap sums): every padding, both align_corners, a grid reaching past the
    borders, planes staged plainly (13 x 17) and inside the zero border (16 x 32). cuDNN is off: with
    it, F.grid_sample runs bilinear with zeros padding and align_corners=True through cuDNN's sampler,
    whose roundings differ from PyTorch's kernel in the last bits."""
    import torch.nn.functional as F

    from opbridge.ops import _detection_triton as tk

    g = _gen()
    names, pads = ("bilinear", "nearest", "bicubic"), ("zeros", "border", "reflection")
    for n, c, h, w in ((3, 37, 13, 17), (2, 8, 16, 32)):
        x = torch.randn(n, c, h, w, device="cuda", generator=g).to(dtype)
        grid = (torch.rand(n, 11, 19, 2, device="cuda", generator=g) * 2.6 - 1.3).to(dtype)
        for pad in range(3):
            for ac in (False, True):
                out = torch.full((n, c, 11, 19), float("nan"), device="cuda", dtype=dtype)
                tk.grid_sample(x, grid, out, mode, pad, ac, variant="plane", config=config)
                with torch.backends.cudnn.flags(enabled=False):
                    want = F.grid_sample(x, grid, mode=names[mode], padding_mode=pads[pad], align_corners=ac)
                where = f"{h}x{w}, {pads[pad]}, align_corners={ac}"
                torch.testing.assert_close(out, want, rtol=0, atol=0, msg=lambda m, where=where: f"{where}: {m}")


@needs_plane
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("ck", [1, 2, 4])
def test_grid_sampler_gpu_plane_vector_staging(dtype: torch.dtype, ck: int) -> None:
    """Planes whose size is a multiple of 16 bytes are staged with 16-byte loads: against the
    reference and bit-equal to the scalar staging of the same planes read from an offset view."""
    from opbridge.ops import _detection_triton as tk

    g = _gen()
    x = torch.randn(2, 6, 16, 24, device="cuda", generator=g).to(dtype)
    grid = (torch.rand(2, 9, 8, 2, device="cuda", generator=g) * 2.6 - 1.3).to(dtype)
    for mode in (0, 1, 2):
        out = torch.full((2, 6, 9, 8), float("nan"), device="cuda", dtype=dtype)
        tk.grid_sample(x, grid, out, mode, 1, False, variant="plane", config=(ck, 256, 4096))
        want = d.GridSample.run_reference(
            x.float(), grid.float(), interpolation_mode=mode, padding_mode=1, align_corners=False
        )
        torch.testing.assert_close(out.float(), want, **_tol(dtype))
        shifted = torch.empty(x.numel() + 1, device="cuda", dtype=dtype)[1:].view(x.shape)  # not 16-byte aligned
        shifted.copy_(x)
        scalar = torch.full_like(out, float("nan"))
        tk.grid_sample(shifted, grid, scalar, mode, 1, False, variant="plane", config=(ck, 256, 4096))
        torch.testing.assert_close(scalar, out, rtol=0, atol=0)


@needs_plane
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("ck", [1, 2, 4])
def test_grid_sampler_gpu_plane_persistent(dtype: torch.dtype, ck: int) -> None:
    """Persistent blocks (each loads its next work item's planes while it computes the current one):
    one block per SM, so each takes several items of different images, channel groups (overhanging
    C) and output parts; 2-3 loads per thread and channel, the last one partial. Bit-equal to one item
    per block and against the reference in every mode (the paddings share the code of one item per
    block, tested above)."""
    from opbridge.ops import _detection_triton as tk

    g = _gen()
    x = torch.randn(4, 62, 32, 40, device="cuda", generator=g).to(dtype)
    grid = (torch.rand(4, 20, 30, 2, device="cuda", generator=g) * 2.6 - 1.3).to(dtype)
    for mode, pad, ac in ((0, 0, False), (0, 2, True), (1, 1, False), (2, 1, True)):
        per_item, persistent = (torch.full((4, 62, 20, 30), float("nan"), device="cuda", dtype=dtype) for _ in range(2))
        tk.grid_sample(x, grid, per_item, mode, pad, ac, variant="plane", config=(ck, 128, 256, 2, 1))
        tk.grid_sample(x, grid, persistent, mode, pad, ac, variant="plane", config=(ck, 128, 256, 2, 1, 1))
        torch.testing.assert_close(persistent, per_item, rtol=0, atol=0)
        want = d.GridSample.run_reference(
            x.float(), grid.float(), interpolation_mode=mode, padding_mode=pad, align_corners=ac
        )
        torch.testing.assert_close(persistent.float(), want, **_tol(dtype))


@needs_plane
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("variant", ["loop", "nhwc", "plane"])
def test_grid_sampler_gpu_non_finite_coordinates_as_pytorch_cuda(variant: str, dtype: torch.dtype) -> None:
    """NaN, infinite and huge coordinates give what F.grid_sample gives on CUDA, in every variant,
    mode and padding: PyTorch's CUDA kernels move such coordinates outside the plane (zeros for
    bilinear and nearest with zeros padding, where its CPU kernel gives NaN for bilinear), clip
    them with border and reflection padding, and bicubic's weights make NaN. Reflection of finite
    coordinates beyond 1e9 is left out: PyTorch's flip count overflows an int there."""
    from opbridge.ops import _detection_triton as tk

    g = _gen()
    x = torch.randn(2, 5, 12, 16, device="cuda", generator=g).to(dtype)
    special = [float("nan"), float("inf"), -float("inf"), 1e30, -1e30, 5e9, 0.2]
    grid = torch.rand(2, 8, len(special), 2, device="cuda", generator=g) * 2.4 - 1.2
    grid[0, 0, :, 0] = torch.tensor(special)
    grid[0, 1, :, 1] = torch.tensor(special)
    grid[0, 2, :, 0] = torch.tensor(special)
    grid[0, 2, :, 1] = torch.tensor(special)
    grid = grid.to(dtype)
    huge = (grid.float().abs() > 1e9) & grid.float().isfinite()
    for mode, name in enumerate(("bilinear", "nearest", "bicubic")):
        for pad, pad_name in enumerate(("zeros", "border", "reflection")):
            out = torch.full((2, 5, 8, len(special)), 7.0, device="cuda", dtype=dtype)
            tk.grid_sample(x, grid, out, mode, pad, False, variant=variant)
            want = torch.nn.functional.grid_sample(x, grid, mode=name, padding_mode=pad_name, align_corners=False)
            keep = torch.ones_like(want, dtype=torch.bool)
            if pad == 2:
                keep = ~huge.any(-1)[:, None].expand_as(want)
            label = f"{variant} {name} {pad_name}"
            assert torch.equal(out.isnan() & keep, want.isnan() & keep), label
            finite = want.isfinite() & keep
            if mode == 1:
                assert torch.equal(out[finite], want[finite]), label
            else:
                torch.testing.assert_close(out[finite].float(), want[finite].float(), **_tol(dtype), msg=label)


@pytest.mark.parametrize("variant", ["loop", "nhwc"])
def test_grid_sampler_gpu_bicubic_align_corners_rounds_as_pytorch_cuda(variant: str) -> None:
    """Bicubic float32 with align_corners: the Triton kernels round the unnormalized coordinate on its
    own, as PyTorch's CUDA build does, so their outputs stay within float32 rounding of F.grid_sample
    on CUDA (the compiler had fused that product into ix - floor(ix): up to 3e-5 off on 85% of the
    outputs of a 128 x 128 plane)."""
    from opbridge.ops import _detection_triton as tk

    g = _gen()
    x = torch.randn(2, 8, 128, 128, device="cuda", generator=g)
    grid = torch.rand(2, 96, 96, 2, device="cuda", generator=g) * 2.2 - 1.1
    for pad, pad_name in enumerate(("zeros", "border", "reflection")):
        for ac in (False, True):
            out = torch.empty(2, 8, 96, 96, device="cuda")
            tk.grid_sample(x, grid, out, 2, pad, ac, variant=variant)
            want = torch.nn.functional.grid_sample(x, grid, mode="bicubic", padding_mode=pad_name, align_corners=ac)
            torch.testing.assert_close(out, want, rtol=0, atol=2e-6, msg=f"{variant} {pad_name} align_corners={ac}")


@needs_plane
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("config", [(1, 128, 256, 2), (2, 512, 8192, 4, 0, 1, 0)], ids=str)
def test_grid_sampler_gpu_plane_nearest_copies_bits(dtype: torch.dtype, config: tuple) -> None:
    """Nearest copies the input's values bit for bit, NaN payloads and negative zeros included, as
    F.grid_sample does; zeros outside (every padding on points far out and on NaN coordinates)."""
    from opbridge.ops import _detection_triton as tk

    g = _gen()
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    info = torch.iinfo(bits)
    x = torch.randint(info.min, info.max, (2, 5, 12, 16), device="cuda", generator=g, dtype=bits).view(dtype)
    # pixel positions within 0.3 of a pixel centre, inside and up to 3 pixels out (far from the
    # rounding boundaries, so that PyTorch's half-precision coordinates pick the same pixels)
    size = torch.tensor([16.0, 12.0], device="cuda")
    centre = torch.randint(-3, 19, (2, 7, 9, 2), device="cuda", generator=g).float().clamp(max=size + 2)
    pos = centre + torch.rand(2, 7, 9, 2, device="cuda", generator=g) * 0.6 - 0.3
    grid = ((2 * pos + 1) / size - 1).to(dtype)
    grid[0, 0, :3, 0] = torch.tensor([float("nan"), 1e4, -1e4])
    assert x.isnan().any()
    for pad in (0, 1, 2):
        out = torch.full((2, 5, 7, 9), 3.0, device="cuda", dtype=dtype)
        tk.grid_sample(x, grid, out, 1, pad, False, variant="plane", config=config)
        want = torch.nn.functional.grid_sample(
            x, grid, mode="nearest", padding_mode=("zeros", "border", "reflection")[pad], align_corners=False
        )
        assert torch.equal(out.view(bits), want.view(bits))


@needs_plane
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("config", [(1, 128, 256, 2, 1), (2, 256, 100, 2, 0), (4, 128, 256, 2, 1, 1)], ids=str)
@pytest.mark.parametrize("mode", [0, 2], ids=["bilinear", "bicubic"])
def test_grid_sampler_gpu_plane_zero_border(mode: int, dtype: torch.dtype, config: tuple) -> None:
    """Bilinear and bicubic with zeros padding stage the planes inside a border of zeros: bit-equal
    to the plain layout (border 0 in the config) for points inside, across and far outside every
    edge, infinite and NaN coordinates included; one item per block and persistent blocks; the
    16-byte and the scalar staging (a misaligned view)."""
    from opbridge.ops import _detection_triton as tk
    from opbridge.ops import _gridsample_cuda as gc

    g = _gen()
    x = torch.randn(3, 7, 12, 16, device="cuda", generator=g).to(dtype)
    assert gc.uses_border(x, config[0], mode, 0) and not gc.uses_border(x, config[0], mode, 1)
    assert not gc.uses_border(x[..., :15], config[0], mode, 0)  # rows not a whole number of 16-byte vectors
    assert not gc.uses_border(x, config[0], 1, 0)  # nearest has one tap: no border
    grid = torch.rand(3, 9, 10, 2, device="cuda", generator=g) * 2.6 - 1.3
    grid[0, 0, :, 0] = torch.tensor(
        [-1.0, 1.0, -1.05, 1.05, 40.0, -40.0, 1e30, float("inf"), float("-inf"), float("nan")]
    )
    grid[0, 1, :, 1] = grid[0, 0, :, 0]
    grid = grid.to(dtype)
    shifted = torch.empty(x.numel() + 1, device="cuda", dtype=dtype)[1:].view(x.shape)  # not 16-byte aligned
    shifted.copy_(x)
    for ac in (False, True):
        plain = torch.full((3, 7, 9, 10), 5.0, device="cuda", dtype=dtype)
        tk.grid_sample(x, grid, plain, mode, 0, ac, variant="plane", config=(*config, *(0,) * (6 - len(config)), 0))
        for src in (x, shifted):
            bordered = torch.full_like(plain, 7.0)
            tk.grid_sample(src, grid, bordered, mode, 0, ac, variant="plane", config=config)
            torch.testing.assert_close(bordered, plain, rtol=0, atol=0, equal_nan=True)
        want = d.GridSample.run_reference(
            x.float(), grid.float(), interpolation_mode=mode, padding_mode=0, align_corners=ac
        )
        finite = torch.isfinite(grid.float()).all(-1, keepdim=True).permute(0, 3, 1, 2).expand_as(want)
        torch.testing.assert_close(plain.float()[finite], want[finite], **_tol(dtype))


@needs_plane
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_grid_sampler_gpu_plane_is_default(dtype: torch.dtype) -> None:
    """Bilinear, nearest and (zeros padding, 16-byte rows) bicubic on NCHW planes of at most 64 KiB
    take "plane" by default (bit-equal to naming it); bicubic with other paddings or rows, channels-last
    inputs and larger planes keep the Triton kernels."""
    from opbridge.ops import _detection_triton as tk
    from opbridge.ops import _gridsample_cuda as gc

    g = _gen()
    x = torch.randn(2, 8, 128, 128, device="cuda", generator=g).to(dtype)
    grid = (torch.rand(2, 64, 96, 2, device="cuda", generator=g) * 2 - 1).to(dtype)
    for mode in (0, 1, 2):
        assert gc.is_default(x, mode)
        default, named = (torch.full((2, 8, 64, 96), float("nan"), device="cuda", dtype=dtype) for _ in range(2))
        tk.grid_sample(x, grid, default, mode, 0, False)
        tk.grid_sample(x, grid, named, mode, 0, False, variant="plane")
        torch.testing.assert_close(default, named, rtol=0, atol=0)
        want = d.GridSample.run_reference(
            x.float(), grid.float(), interpolation_mode=mode, padding_mode=0, align_corners=False
        )
        torch.testing.assert_close(default.float(), want, **_tol(dtype))
    assert gc.is_default(x, 1, 2) and not gc.is_default(x, 2, 1) and not gc.is_default(x, 2, 2)
    odd_rows = torch.empty(1, 2, 64, 63, device="cuda", dtype=dtype)
    assert gc.is_default(odd_rows, 0) and not gc.is_default(odd_rows, 2)
    assert not gc.is_default(x.to(memory_format=torch.channels_last), 0)
    assert not gc.is_default(torch.empty(1, 1, 256, 256, device="cuda", dtype=torch.float32), 0)


@needs_plane
def test_grid_sampler_gpu_plane_rejects() -> None:
    """Planes larger than a block's shared memory and a non-contiguous ``out``: clear errors, ``out`` untouched."""
    from opbridge.ops import _detection_triton as tk

    x = torch.zeros(1, 1, 300, 300, device="cuda")
    grid = torch.zeros(1, 4, 4, 2, device="cuda")
    out = torch.full((1, 1, 4, 4), 7.0, device="cuda")
    with pytest.raises(ValueError, match="shared memory"):
        tk.grid_sample(x, grid, out, 0, 0, False, variant="plane")
    x = torch.zeros(1, 3, 8, 8, device="cuda")
    out = torch.full((1, 4, 4, 3), 7.0, device="cuda").permute(0, 3, 1, 2)
    with pytest.raises(ValueError, match="contiguous"):
        tk.grid_sample(x, grid, out, 0, 0, False, variant="plane")
    assert bool((out == 7.0).all())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_channels_last_input_gpu(dtype: torch.dtype) -> None:
    """An input whose memory is channels-last: read in place by the "nhwc" variants, made
    NCHW-contiguous by the others; the same results as from an NCHW input."""
    from opbridge.ops import _detection_triton as tk

    g = _gen()
    x = torch.randn(2, 24, 13, 17, device="cuda", generator=g).to(dtype)
    xl = x.to(memory_format=torch.channels_last)
    grid = (torch.rand(2, 11, 19, 2, device="cuda", generator=g) * 2.6 - 1.3).to(dtype)
    plane = ("plane",) if hasattr(torch.cuda, "_compile_kernel") else ()  # the CUDA kernel needs NVRTC through torch
    for variant in ("nhwc", "loop", *plane):
        for mode in (0, 1, 2):
            want = torch.empty(2, 24, 11, 19, device="cuda", dtype=dtype)
            got = torch.full_like(want, float("nan"))
            tk.grid_sample(x, grid, want, mode, 0, False, variant=variant)
            tk.grid_sample(xl, grid, got, mode, 0, False, variant=variant)
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    off = (torch.randn(2, 18, 13, 17, device="cuda", generator=g) * 2).to(dtype)
    mask = torch.rand(2, 9, 13, 17, device="cuda", generator=g).to(dtype)
    wt = (torch.randn(8, 24, 3, 3, device="cuda", generator=g) / 15).to(dtype)
    b = torch.randn(8, device="cuda", generator=g).to(dtype)
    for variant in ("nhwc", "loop"):
        want = torch.empty(2, 8, 13, 17, device="cuda", dtype=dtype)
        got = torch.full_like(want, float("nan"))
        tk.deform_conv2d(x, off, mask, wt, b, want, (1, 1), (1, 1), (1, 1), 1, 1, variant=variant)
        tk.deform_conv2d(xl, off, mask, wt, b, got, (1, 1), (1, 1), (1, 1), 1, 1, variant=variant)
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_to_channels_last_gpu() -> None:
    from opbridge.ops import _detection_triton as tk

    x = torch.randn(2, 70, 9, 131, device="cuda", generator=_gen()).half()
    assert torch.equal(tk.to_channels_last(x), x.permute(0, 2, 3, 1))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("align", [False, True], ids=["half-pixel", "align-corners"])
@pytest.mark.parametrize(
    ("in_hw", "out_hw"),
    [
        ((16, 16), (32, 32)),
        ((12, 20), (17, 13)),
        ((40, 37), (9, 5)),
        ((100, 8), (7, 300)),
        ((1, 1), (5, 6)),
        ((33, 70), (70, 33)),
    ],
    ids=["up2", "odd", "down", "down9-up37", "single-pixel", "transpose-like"],
)
def test_dynamic_resize_gpu(dtype: torch.dtype, align: bool, in_hw: tuple, out_hw: tuple) -> None:
    """The registered kernel ("plane", "integer" or "window" by size): upscaling, downscaling, tile edges."""
    import torch.nn.functional as F

    from opbridge.ops import DynamicResize

    g = _gen()
    x = torch.randn(2, 3, *in_hw, device="cuda", generator=g).to(dtype)
    size = torch.empty(1, 1, *out_hw, device="cuda", dtype=dtype)
    (out,) = _run(DynamicResize, [x, size], {"align_corners": align})
    want = F.interpolate(x.float(), size=out_hw, mode="bicubic", align_corners=align)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-3, "atol": 4e-3}
    torch.testing.assert_close(out.float(), want, **tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("factor", [2, 4], ids=["x2", "x4"])
@pytest.mark.parametrize(
    "in_hw",
    [(1, 1), (2, 3), (16, 16), (37, 129), (70, 33)],
    ids=["single-pixel", "2x3", "16x16", "37x129", "70x33"],
)
@pytest.mark.parametrize(
    "config",
    [None, (32, 3, 1, True), (32, 5, 1, False), (256, 16, 8, True), (64, 1, 2, True)],
    ids=["default", "small-prefetch", "small", "wide", "one-row"],
)
def test_dynamic_resize_gpu_integer_factor(dtype: torch.dtype, factor: int, in_hw: tuple, config: tuple | None) -> None:
    """The integer-factor kernel (outputs 2x / 4x the input) against PyTorch's CUDA op, tile edges included."""
    import torch.nn.functional as F

    from opbridge.ops import _seed_gpu as sg

    g = _gen()
    x = torch.randn(2, 3, *in_hw, device="cuda", generator=g).to(dtype)
    out_hw = (in_hw[0] * factor, in_hw[1] * factor)
    out = torch.full((2, 3, *out_hw), float("nan"), device="cuda", dtype=dtype)
    sg.dynamic_resize_gpu([x, None], [out], {"align_corners": False}, 0, config=config, variant="integer")
    want = F.interpolate(x.float(), size=out_hw, mode="bicubic", align_corners=False)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-3, "atol": 4e-3}
    torch.testing.assert_close(out.float(), want, **tol)
    if dtype == torch.float16:
        # PyTorch's own fp16 CUDA op computes in float32 and rounds once, as ours does
        native = F.interpolate(x, size=out_hw, mode="bicubic", align_corners=False)
        torch.testing.assert_close(out, native, rtol=1e-3, atol=2e-3)


@needs_plane
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "config",
    [None, (1, 1), (8, 4), (64, 32), (1, 1, 2), (8, 4, 2), (32, 8, 2)],
    ids=["default", "row-bands", "small", "wide", "pairs-row-bands", "pairs-small", "pairs"],
)
def test_dynamic_resize_gpu_plane_variant(dtype: torch.dtype, config: tuple | None) -> None:
    """The shared-memory CUDA kernel equals PyTorch's CUDA op bit for bit (the same roundings, in
    float32 whatever the storage dtype): up- and downscaling, both align_corners, bands that
    overhang the output, column groups wider than a block (1500 columns), rows whose size is not a
    multiple of 16 bytes (scalar staging), a single pixel; one plane per block or two, with an odd
    number of planes (the last block's second plane absent)."""
    import torch.nn.functional as F

    from opbridge.ops import _seed_gpu as sg

    g = _gen()
    cases = [((45, 61), (97, 130)), ((45, 61), (20, 29)), ((128, 128), (200, 200)), ((12, 20), (17, 13))]
    cases += [((40, 37), (9, 5)), ((1, 1), (5, 6)), ((7, 1100), (9, 1500)), ((33, 70), (70, 33))]
    for i, (in_hw, out_hw) in enumerate(cases):
        n = 1 if i % 2 else 2  # 3 or 6 planes
        x = torch.randn(n, 3, *in_hw, device="cuda", generator=g).to(dtype)
        for align in (False, True):
            out = torch.full((n, 3, *out_hw), float("nan"), device="cuda", dtype=dtype)
            sg.dynamic_resize_gpu([x, None], [out], {"align_corners": align}, 0, config=config, variant="plane")
            native = F.interpolate(x, size=out_hw, mode="bicubic", align_corners=align)
            where = f"{in_hw} -> {out_hw}, align_corners={align}"
            torch.testing.assert_close(out, native, rtol=0, atol=0, msg=lambda m, where=where: f"{where}: {m}")


@needs_plane
def test_dynamic_resize_gpu_plane_default_and_rejects() -> None:
    """Non-integer factors take "plane" by default (bit-equal to naming it); exact x2 keeps "integer";
    bands too large for shared memory and a strided ``out`` are refused with ``out`` untouched."""
    from opbridge.ops import _resize_cuda as rc
    from opbridge.ops import _seed_gpu as sg

    g = _gen()
    x = torch.randn(2, 4, 64, 64, device="cuda", generator=g)
    assert rc.is_default(x, 100, 100, False)
    default, named = (torch.full((2, 4, 100, 100), float("nan"), device="cuda") for _ in range(2))
    sg.dynamic_resize_gpu([x, None], [default], {}, 0)
    sg.dynamic_resize_gpu([x, None], [named], {}, 0, variant="plane")
    torch.testing.assert_close(default, named, rtol=0, atol=0)
    assert not rc.is_default(x, 16, 16, False)  # downscaling by 4: rows no output reads
    wide = torch.zeros(1, 1, 64, 60000, device="cuda")
    assert not rc.is_default(wide, 100, 60000, False)
    out = torch.full((1, 1, 100, 60000), 7.0, device="cuda")
    with pytest.raises(ValueError, match="shared memory"):
        sg.dynamic_resize_gpu([wide, None], [out], {}, 0, config=(64, 16), variant="plane")
    assert bool((out == 7.0).all())
    strided = torch.full((2, 4, 100, 100), 7.0, device="cuda").transpose(2, 3)
    with pytest.raises(ValueError, match="contiguous"):
        sg.dynamic_resize_gpu([x, None], [strided], {}, 0, variant="plane")
    assert bool((strided == 7.0).all())
    kept = torch.full((2, 4, 100, 100), 7.0, device="cuda")
    with pytest.raises(ValueError, match="1 or 2 planes per block"):
        sg.dynamic_resize_gpu([x, None], [kept], {}, 0, config=(8, 4, 3), variant="plane")
    assert bool((kept == 7.0).all())


@pytest.mark.parametrize(
    "config",
    [(32, 256, 2, True), (32, 256, 1, False), (3, 32, 1, True), (5, 32, 1, False), (8, 1024, 4, True)],
    ids=["prefetch", "no-prefetch", "small-prefetch", "small", "wide"],
)
def test_dynamic_resize_gpu_tilings(config: tuple) -> None:
    import torch.nn.functional as F

    from opbridge.ops import _seed_gpu as sg

    g = _gen()
    x = torch.randn(2, 3, 45, 61, device="cuda", generator=g)
    for out_hw in ((97, 130), (90, 122), (20, 29), (8, 7)):  # (90, 122): exactly x2, which "window" handles too
        for align in (False, True):
            out = torch.full((2, 3, *out_hw), float("nan"), device="cuda")
            sg.dynamic_resize_gpu([x, None], [out], {"align_corners": align}, 0, config=config, variant="window")
            want = F.interpolate(x, size=out_hw, mode="bicubic", align_corners=align)
            # align_corners=True: one element of 75660 at 97x130 differs from PyTorch's CUDA op by 1.1e-5
            # (a near-cancelling value, 0.089), hence atol 2e-5
            torch.testing.assert_close(out, want, rtol=1e-5, atol=2e-5 if align else 1e-5)


@needs_plane
@pytest.mark.parametrize("seed", [1, 2], ids=["seed-1", "seed-2"])
def test_cuda_kernels_on_random_shapes_equal_pytorch(seed: int) -> None:
    """Seeded random cases beyond the hand-picked ones: shapes from one pixel to planes of 140 x 140
    and 181 x 181, 1-64 channels, every mode, padding and align_corners, grids inside, across and on
    the pixel edges, a NaN coordinate. grid_sample's "plane" kernel (its default tiling) and the band
    resize equal PyTorch's CUDA ops bit for bit; the registered kernels, whatever variant each case
    takes, are within the dtype's tolerance of the references."""
    import random

    import torch.nn.functional as F

    from opbridge.ops import DynamicResize
    from opbridge.ops import _gridsample_cuda as gc
    from opbridge.ops import _resize_cuda as rc

    rng = random.Random(seed)
    g = torch.Generator(device="cuda").manual_seed(seed)
    names, pads = ("bilinear", "nearest", "bicubic"), ("zeros", "border", "reflection")
    for _ in range(24):
        dtype = rng.choice(DTYPES)
        n, c = rng.randint(1, 3), rng.choice([1, 2, 3, 5, 8, 13, 64])
        h, w = rng.choice([(rng.randint(1, 140), rng.randint(1, 140)), (181, 181), (1, 90), (64, 64)])
        ho, wo = rng.randint(1, 60), rng.randint(1, 60)
        mode, pad, align = rng.randrange(3), rng.randrange(3), rng.random() < 0.5
        x = (torch.randn(n, c, h, w, device="cuda", generator=g) * rng.choice([1.0, 50.0])).to(dtype)
        if rng.random() < 0.7:
            grid = (torch.rand(n, ho, wo, 2, device="cuda", generator=g) - 0.5) * rng.choice([2.0, 3.0])
        else:  # points on the pixel edges and centers, some outside
            edges = [torch.randint(-2, 2 * s + 2, (n, ho, wo), device="cuda", generator=g) / s - 1 for s in (w, h)]
            grid = torch.stack(edges, -1)
        grid[0, 0, 0, 0] = float("nan")
        grid = grid.to(dtype)
        where = f"{dtype} {(n, c, h, w)} -> {(ho, wo)}, {names[mode]}, {pads[pad]}, align_corners={align}"
        with torch.backends.cudnn.flags(enabled=False):
            want = F.grid_sample(x, grid, mode=names[mode], padding_mode=pads[pad], align_corners=align)
        out = torch.full_like(want, 7.0)
        gc.grid_sample_plane(x, grid, out, mode, pad, align)
        torch.testing.assert_close(out, want, rtol=0, atol=0, equal_nan=True, msg=lambda m, at=where: f"{at}: {m}")
        attrs = {"interpolation_mode": mode, "padding_mode": pad, "align_corners": align}
        (got,) = _run(d.GridSample, [x, grid], attrs)
        with torch.backends.cudnn.flags(enabled=False):  # cuDNN's sampler gives NaN for the NaN point
            ref = d.GridSample.run_reference(x.float(), grid.float(), **attrs)
        torch.testing.assert_close(
            got.float(), ref, equal_nan=True, **_tol(dtype), msg=lambda m, at=where: f"{at}: {m}"
        )
    for _ in range(16):
        dtype = rng.choice(DTYPES)
        n, c, h, w = rng.randint(1, 3), rng.randint(1, 9), rng.randint(1, 150), rng.randint(1, 150)
        ho, wo, align = rng.randint(1, 300), rng.randint(1, 300), rng.random() < 0.5
        x = torch.randn(n, c, h, w, device="cuda", generator=g).to(dtype)
        where = f"{dtype} {(n, c, h, w)} -> {(ho, wo)}, align_corners={align}"
        want = F.interpolate(x, size=(ho, wo), mode="bicubic", align_corners=align)
        out = torch.full_like(want, 7.0)
        rc.resize_plane(x, out, align)
        torch.testing.assert_close(out, want, rtol=0, atol=0, msg=lambda m, at=where: f"{at}: {m}")
        size = torch.empty(1, 1, ho, wo, device="cuda", dtype=dtype)
        (got,) = _run(DynamicResize, [x, size], {"align_corners": align})
        ref = F.interpolate(x.float(), size=(ho, wo), mode="bicubic", align_corners=align)
        torch.testing.assert_close(got.float(), ref, **_tol(dtype), msg=lambda m, at=where: f"{at}: {m}")
