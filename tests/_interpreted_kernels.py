"""Run opbridge's Triton kernels in Triton's interpreter on the CPU and compare them with the references.

Usage (tests/test_triton_interpreted.py runs it in a child process):
    TRITON_INTERPRET=1 python tests/_interpreted_kernels.py CASE [CASE ...]

Prints one JSON object: case -> [max abs error, allowed error]. The interpreter runs each
program with numpy on CPU tensors: it checks the kernels' indexing, masking and arithmetic,
not their compiled code or speed (tests/test_oplib_gpu.py does that on a GPU).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

from opbridge.ops import _detection_ref as ref
from opbridge.ops import _detection_triton as tk
from opbridge.ops import _seed_gpu as sg

ATOL = 1e-5  # float32 against float32 references; the interpreter does not fuse multiply-adds


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def _err(got: torch.Tensor, want: torch.Tensor) -> float:
    if got.shape != want.shape:
        return float("inf")
    return float((got.float() - want.float()).abs().max()) if got.numel() else 0.0


def resize(align: bool) -> float:
    x = torch.randn(1, 2, 21, 30, generator=_gen())
    worst = 0.0
    # up, exactly x2, down (the window restarts), 4 px to 3 (every tap clamped), same size; default
    # and small tiles
    for out_hw in ((45, 64), (42, 60), (9, 13), (4, 3), (21, 30)):
        for config in (None, (3, 32, 1, False)):
            out = torch.full((1, 2, *out_hw), float("nan"))
            sg.dynamic_resize_gpu([x, None], [out], {"align_corners": align}, 0, config=config, variant="window")
            want = F.interpolate(x, size=out_hw, mode="bicubic", align_corners=align)
            worst = max(worst, _err(out, want))
    return worst


def resize_integer() -> float:
    x = torch.randn(1, 2, 7, 37, generator=_gen())
    worst = 0.0
    # x2 and x4; the default tiling (one program: 128 columns, 4 rows) and 32-column programs of
    # 3 rows, so that tiles end inside the image, with and without the row prefetch
    for k in (2, 4):
        for config in (None, (32, 3, 1, True), (32, 3, 1, False)):
            out = torch.full((1, 2, 7 * k, 37 * k), float("nan"))
            sg.dynamic_resize_gpu([x, None], [out], {"align_corners": False}, 0, config=config, variant="integer")
            want = F.interpolate(x, size=(7 * k, 37 * k), mode="bicubic", align_corners=False)
            worst = max(worst, _err(out, want))
    return worst


def silu() -> float:
    x = torch.randn(3, 1000, generator=_gen())
    out = torch.empty_like(x)
    sg.myselu_gpu([x], [out], {}, 0)
    return _err(out, F.silu(x))


def grid_sample(variant: str, mode: int, channels_last: bool = False) -> float:
    g = _gen()
    # 21 channels: a partial last channel group (16 per program in the loop kernel) and channel block
    x = torch.randn(2, 21, 9, 11, generator=g)
    if channels_last:  # read in place by "nhwc", made NCHW-contiguous by "loop"
        x = x.to(memory_format=torch.channels_last)
    grid = torch.rand(2, 7, 6, 2, generator=g) * 2.6 - 1.3
    worst = 0.0
    for pad in (0, 1, 2):
        for align in (False, True):
            out = torch.full((2, 21, 7, 6), float("nan"))
            tk.grid_sample(x, grid, out, mode, pad, align, variant=variant)
            worst = max(worst, _err(out, ref.grid_sample(x, grid, mode, pad, align)))
    return worst


def deform_conv(variant: str, channels_last: bool = False) -> float:
    g = _gen()
    worst = 0.0
    # (stride, padding, dilation, groups, deform groups), with and without bias
    for stride, padding, dilation, groups, dg in (
        ((1, 1), (1, 1), (1, 1), 1, 1),
        ((2, 1), (0, 2), (1, 2), 1, 2),
        ((1, 1), (1, 1), (1, 1), 2, 1),
    ):
        n, cin, h, w, cout = 2, 24, 11, 9, 10
        ho = (h + 2 * padding[0] - dilation[0] * 2 - 1) // stride[0] + 1
        wo = (w + 2 * padding[1] - dilation[1] * 2 - 1) // stride[1] + 1
        x = torch.randn(n, cin, h, w, generator=g)
        if channels_last:
            x = x.to(memory_format=torch.channels_last)
        off = torch.randn(n, 2 * dg * 9, ho, wo, generator=g) * 2
        off[0, 0, 1, 1], off[0, 3, 2, 0], off[-1, 4, 0, 2] = float("inf"), float("-inf"), 1e30  # samples 0
        mask = torch.rand(n, dg * 9, ho, wo, generator=g)
        wt = torch.randn(cout, cin // groups, 3, 3, generator=g) / 15
        for b in (torch.randn(cout, generator=g), None):
            want = ref.deform_conv2d(x, off, mask, wt, b, stride, padding, dilation, groups, dg)
            out = torch.full((n, cout, ho, wo), float("nan"))
            tk.deform_conv2d(x, off, mask, wt, b, out, stride, padding, dilation, groups, dg, variant=variant)
            worst = max(worst, _err(out, want))
    return worst


def deform_conv_fused() -> float:
    """The implicit-GEMM variant, which float32 takes only where TF32 is allowed (the interpreter's
    dot computes in float32 whatever the precision asked); groups and deform groups fall back."""
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        return deform_conv("fused")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def roi_align(mode: str) -> float:
    g = _gen()
    feat = torch.randn(2, 4, 20, 24, generator=g)
    xy = torch.rand(25, 2, generator=g) * 90 - 5
    rois = torch.cat(
        [torch.randint(0, 2, (25, 1), generator=g).float(), xy, xy + torch.rand(25, 2, generator=g) * 50], 1
    )
    worst = 0.0
    for aligned in (True, False):
        for sr in (0, 2):
            want = ref.roi_align(feat, rois, 3, 4, 0.25, sr, mode, aligned)
            out = torch.full_like(want, float("nan"))
            tk.roi_align(feat, rois, out, 0.25, sr, mode == "max", aligned)
            worst = max(worst, _err(out, want))
    return worst


def roi_align_bad_rois() -> float:
    """RoIs the CPU kernels refuse (a NaN or out-of-range batch index; an adaptive grid that is NaN or
    over ROI_MAX_SAMPLES samples) stay unwritten; a batch index of -0.5 truncates to image 0 and runs."""
    g = _gen()
    feat = torch.randn(2, 3, 12, 16, generator=g)
    good = [[0.0, 2.0, 3.0, 30.0, 20.0], [1.0, 0.0, 0.0, 60.0, 44.0], [-0.5, 5.0, 5.0, 25.0, 30.0]]
    bad = [
        [float("nan"), 2.0, 3.0, 30.0, 20.0],
        [2.0, 2.0, 3.0, 30.0, 20.0],
        [0.0, float("nan"), 3.0, 30.0, 20.0],
        [0.0, 0.0, 0.0, 1e9, 1e9],
        [0.0, 0.0, 0.0, 3e8, -5.0],  # one side over the limit, the other empty
    ]
    rois = torch.tensor(good + bad)
    want = ref.roi_align(feat, rois[: len(good)], 3, 4, 0.25, 0, "avg", True)
    out = torch.full((len(good) + len(bad), 3, 3, 4), float("nan"))
    tk.roi_align(feat, rois, out, 0.25, 0, False, True)
    return max(_err(out[: len(good)], want), 0.0 if out[len(good) :].isnan().all() else float("inf"))


def roi_align_non_finite() -> float:
    """A box with an infinite corner and a fixed sampling ratio puts NaN sample coordinates in the
    kernel: NaN bins, as the reference, on one-pixel-high and one-pixel-wide features too."""
    worst = 0.0
    inf = float("inf")
    rois = torch.tensor([[0.0, 0.0, 0.0, 2.0, inf], [0.0, 0.0, 0.0, inf, 2.0], [0.0, 1.0, 0.0, 3.0, 1.0]])
    for h, w in ((1, 4), (5, 1), (1, 1), (4, 6)):
        feat = torch.arange(1.0, 1.0 + 2 * h * w).reshape(1, 2, h, w)
        for mode in ("avg", "max"):
            want = ref.roi_align(feat, rois, 2, 2, 1.0, 2, mode, True)
            out = torch.full_like(want, -7.0)
            tk.roi_align(feat, rois, out, 1.0, 2, mode == "max", True)
            same_nan = torch.equal(out.isnan(), want.isnan()) and bool(want[:2].isnan().any())
            worst = max(worst, _err(out.nan_to_num(nan=0.0), want.nan_to_num(nan=0.0)) if same_nan else inf)
    return worst


def multi_level_roi_align() -> float:
    g = _gen()
    feats = [torch.randn(2, 3, 256 // s, 256 // s, generator=g) for s in (4, 8, 16, 32)]
    xy = torch.rand(40, 2, generator=g) * 200
    rois = torch.cat(
        [torch.randint(0, 2, (40, 1), generator=g).float(), xy, xy + torch.rand(40, 2, generator=g) * 250], 1
    )
    strides = (4.0, 8.0, 16.0, 32.0)
    worst = 0.0
    for pool in (0, 1):
        want = ref.multi_level_roi_align(rois, feats, 7, 7, strides, 2, pool, 1.5, 56, True)
        out = torch.full_like(want, float("nan"))
        tk.multi_level_roi_align(rois, feats, out, strides, 2, pool == 0, 1.5, 56, True)
        worst = max(worst, _err(out, want))
    return worst


def batched_nms() -> float:
    """Scores of +inf pass the threshold and rank first; -inf and NaN never pass."""
    g = _gen()
    xy = torch.rand(2, 150, 4, 2, generator=g) * 100
    boxes = torch.cat([xy, xy + 5 + torch.rand(xy.shape, generator=g) * 40], -1)
    scores = torch.rand(2, 150, 4, generator=g)
    scores[0, 7, 2] = scores[1, 3, 0] = float("inf")
    scores[0, 8, 1], scores[1, 4, 3] = float("-inf"), float("nan")
    worst = 0.0
    for topk, keep, background in ((40, 30, -1), (-1, 300, 1)):
        want_d, want_l = ref.batched_nms(boxes, scores, 4, background, 0.5, 0.05, topk, keep, False)
        dets = torch.full_like(want_d, float("nan"))
        labels = torch.full_like(want_l, -7)
        tk.batched_nms(boxes, scores, dets, labels, 4, background, 0.5, 0.05, topk, False)
        # exact: the same boxes in the same order, and the same labels
        worst = max(worst, _err(dets, want_d), float("inf") if not torch.equal(labels, want_l) else 0.0)
    return worst


CASES: dict[str, tuple[Callable[[], float], float]] = {
    "resize-half-pixel": (lambda: resize(False), ATOL),
    "resize-align-corners": (lambda: resize(True), ATOL),
    "resize-integer-factor": (resize_integer, ATOL),
    "silu": (silu, 1e-6),
    **{
        f"grid-{variant}-{name}": ((lambda v=variant, m=mode: grid_sample(v, m)), ATOL)
        for variant in ("loop", "nhwc")
        for mode, name in ((0, "bilinear"), (1, "nearest"), (2, "bicubic"))
    },
    **{f"dcn-{variant}": ((lambda v=variant: deform_conv(v)), ATOL) for variant in ("nhwc", "loop")},
    **{f"grid-{v}-channels-last-input": ((lambda v=v: grid_sample(v, 0, True)), ATOL) for v in ("loop", "nhwc")},
    "dcn-nhwc-channels-last-input": (lambda: deform_conv("nhwc", True), ATOL),
    "dcn-fused": (deform_conv_fused, ATOL),
    "roi-align-avg": (lambda: roi_align("avg"), ATOL),
    "roi-align-max": (lambda: roi_align("max"), ATOL),
    "roi-align-bad-rois": (roi_align_bad_rois, ATOL),
    "roi-align-non-finite": (roi_align_non_finite, ATOL),
    "multi-level-roi-align": (multi_level_roi_align, ATOL),
    "batched-nms": (batched_nms, 0.0),
}


def _boolean_masks() -> None:
    """Give the interpreter's masked loads and stores boolean masks, and its broadcast conditions
    boolean data.

    Triton 3.9's interpreter computes ``vector_mask & scalar_condition`` (a channel loop's bound, say)
    as int32, which its load and store then refuse ("mask has unsupported dtype"); compiled kernels
    treat the same mask as i1. Casting to bool keeps the meaning (0 false, 1 true).
    """
    import copy

    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    for name, position in (("create_masked_load", 1), ("create_masked_store", 2)):
        original = getattr(builder, name)

        def wrapped(self: object, *args: object, _original: Callable = original, _at: int = position) -> object:
            mask = args[_at]
            if mask.data.dtype != bool:  # type: ignore[attr-defined]
                mask = copy.copy(mask)
                mask.data = mask.data.astype(bool)  # type: ignore[attr-defined]
                args = (*args[:_at], mask, *args[_at + 1 :])
            return _original(self, *args)

        setattr(builder, name, wrapped)

    # A float comparison's result carries the float type in the interpreter, so broadcasting a scalar
    # condition (a RoI's "run" flag against a block mask) filled a float32 array that `&` refuses;
    # compiled kernels hold it as i1. Splat boolean data as booleans.
    original_splat = builder.create_splat

    def splat(self: object, ret_ty: object, arg: object, _original: Callable = original_splat) -> object:
        data = arg.data  # type: ignore[attr-defined]
        if data.dtype == bool:
            value = data.reshape(-1)[0] if data.ndim else data
            return interpreter.TensorHandle(np.full(ret_ty.shape, value, dtype=bool), tl.int1)  # type: ignore[attr-defined]
        return _original(self, ret_ty, arg)

    builder.create_splat = splat


def main(argv: list[str]) -> int:
    if os.environ.get("TRITON_INTERPRET") != "1":
        print("set TRITON_INTERPRET=1: the kernels run in Triton's interpreter here", file=sys.stderr)
        return 2
    _boolean_masks()
    unknown = [name for name in argv if name not in CASES]
    if unknown:
        print(f"unknown cases {unknown}; known: {sorted(CASES)}", file=sys.stderr)
        return 2
    results = {}
    for name in argv or list(CASES):
        fn, tol = CASES[name]
        results[name] = [fn(), tol]
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
