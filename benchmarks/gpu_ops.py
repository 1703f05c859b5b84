"""GPU parity and speed of the detection ops' kernels against PyTorch / torchvision, measured in one run.

Needs a CUDA GPU, torch, triton and (for the cross-checks and baselines)
torchvision. Imports no onnx. Every kernel is called through the op's registered
``gpu_kernel(inputs, outputs, attrs, stream)``, as the TensorRT plugin calls it.

Usage:
    PYTHONPATH=src python3 benchmarks/gpu_ops.py [--quick] [--only resize,grid,dcn,roi,nms] [--json out.json]

Prints one markdown table for parity and one for speed. Times are medians of
``triton.testing.do_bench`` (CUDA events; slow baselines: median of a few CUDA-event
timed runs). Memory-bound ops also report achieved bytes/s (bytes read + written once)
as a fraction of a 1 GiB device-to-device copy measured in the same run, and against a
copy of their own size (a small op cannot reach the large copy's rate either). Each op
runs at three or more sizes (RESIZE_SIZES, GRID_SIZES, DCN_SIZES, ROI_SIZES, NMS_SIZES).
"""

# ruff: noqa: B023 - the lambdas built in loops are timed at once, inside the same iteration

from __future__ import annotations

import argparse
import importlib
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from opbridge.ops import DynamicResize
from opbridge.ops import _detection_ref as ref
from opbridge.ops import detection as d

try:
    import torchvision
    from torchvision.ops import batched_nms as tv_batched_nms
    from torchvision.ops import deform_conv2d as tv_deform_conv2d
    from torchvision.ops import roi_align as tv_roi_align
except ImportError:  # pragma: no cover - the baselines need it
    torchvision = None

DEV = "cuda"
PARITY: list[dict[str, Any]] = []
SPEED: list[dict[str, Any]] = []


# --------------------------------------------------------------------------- helpers


def unavailable(script: str, *packages: str, results: str = "benchmarks/README.md") -> str | None:
    """Why ``script`` cannot run here, in one line: no CUDA GPU, or one of ``packages`` not importable.

    None where it can run. Checked before any CUDA work; ``results`` names where its recorded results are.
    """
    where = f"its recorded results are in {results}"
    if not torch.cuda.is_available():
        return f"{script}: needs a CUDA GPU (torch.cuda.is_available() is False here); {where}"
    for package in packages:
        try:
            importlib.import_module(package)
        except ImportError as exc:
            return f"{script}: needs {package}, which cannot be imported here ({exc}); {where}"
    return None


def bench(fn: Callable[[], Any], slow: bool = False) -> float:
    """Median milliseconds of fn."""
    if slow:
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(3):
            start, end = (
                torch.cuda.Event(enable_timing=True),
                torch.cuda.Event(enable_timing=True),
            )
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median"))


def run_kernel(opdef: Any, inputs: list[torch.Tensor | None], attrs: dict[str, Any]) -> list[torch.Tensor]:
    """Allocate the outputs the op's shape rule gives and run its GPU kernel on the current stream."""
    bound = opdef.spec.bind_attributes(attrs)
    infos = opdef.shape_rule(*inputs, **bound)
    infos = infos if isinstance(infos, tuple) else (infos,)
    outs = [torch.empty(tuple(int(s) for s in i.shape), dtype=i.dtype, device=DEV) for i in infos]
    opdef.gpu_kernel(inputs, outs, bound, torch.cuda.current_stream().cuda_stream)
    return outs


def kernel_fn(opdef: Any, inputs: list[torch.Tensor | None], attrs: dict[str, Any]) -> Callable[[], Any]:
    bound = opdef.spec.bind_attributes(attrs)
    infos = opdef.shape_rule(*inputs, **bound)
    infos = infos if isinstance(infos, tuple) else (infos,)
    outs = [torch.empty(tuple(int(s) for s in i.shape), dtype=i.dtype, device=DEV) for i in infos]
    stream = torch.cuda.current_stream().cuda_stream
    return lambda: opdef.gpu_kernel(inputs, outs, bound, stream)


def compare(
    op: str,
    shape: str,
    dtype: torch.dtype,
    against: str,
    got: torch.Tensor,
    want: torch.Tensor,
    rtol: float,
    atol: float,
) -> None:
    if got.dtype != want.dtype and got.is_floating_point():
        want = want.to(got.dtype)  # compare in the output's dtype (float16 rounding; -FLT_MAX -> -inf)
    got, want = got.float(), want.float()
    diff = torch.where(got == want, torch.zeros_like(got), (got - want).abs())
    bad = diff > atol + rtol * want.abs()
    PARITY.append(
        {
            "op": op,
            "shape": shape,
            "dtype": str(dtype).replace("torch.", ""),
            "against": against,
            "max_abs": float(diff.max()) if diff.numel() else 0.0,
            "mismatched": int(bad.sum()),
            "numel": int(diff.numel()),
            "ok": bool(not bad.any()),
            "rtol": rtol,
            "atol": atol,
        }
    )


def tol(dtype: torch.dtype) -> tuple[float, float]:
    return (1e-3, 1e-5) if dtype == torch.float32 else (1e-2, 1e-2)


def record(
    op: str,
    shape: str,
    dtype: torch.dtype,
    ours: float | None,
    native: float | None,
    native_name: str,
    nbytes: int | None = None,
    copy_gbs: float | None = None,
    note: str = "",
    same_copy_ms: float | None = None,
) -> None:
    row: dict[str, Any] = {
        "op": op,
        "shape": shape,
        "dtype": str(dtype).replace("torch.", ""),
        "ours_ms": ours,
        "native": native_name,
        "native_ms": native,
        "note": note,
    }
    row["speedup"] = native / ours if ours and native else None
    if nbytes and copy_gbs:
        if ours:
            row["ours_bw"] = nbytes / (ours * 1e-3) / 1e9 / copy_gbs
        if native:
            row["native_bw"] = nbytes / (native * 1e-3) / 1e9 / copy_gbs
    if same_copy_ms and ours:
        row["ours_same_copy"] = same_copy_ms / ours
    SPEED.append(row)
    print(
        f"  {op:22s} {shape:34s} {row['dtype']:8s} ours {fmt(ours)} ms  {native_name} {fmt(native)} ms  "
        f"x{fmt(row['speedup'], 2)} {note}",
        flush=True,
    )


def fmt(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def copy_fn(nbytes: int) -> Callable[[], Any]:
    """A device-to-device copy that reads and writes ``nbytes`` in all."""
    src = torch.empty(max(1, nbytes // 2), dtype=torch.uint8, device=DEV)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def same_size_copy_ms(nbytes: int) -> float:
    """Milliseconds of a device-to-device copy that reads and writes ``nbytes`` in all."""
    return bench(copy_fn(nbytes))


def copy_bandwidth() -> float:
    src = torch.empty(1 << 28, dtype=torch.float32, device=DEV)  # 1 GiB
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src))
    return 2 * src.numel() * 4 / (ms * 1e-3) / 1e9


# --------------------------------------------------------------------------- inputs


def grid_inputs(n: int, c: int, h: int, w: int, ho: int, wo: int, dtype: torch.dtype, seed: int = 0) -> tuple:
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(n, c, h, w, device=DEV, generator=g).to(dtype)
    # the identity grid, each point jittered on its own (Gaussian, 3.2 input pixels), some outside [-1, 1]
    ys, xs = torch.meshgrid(
        torch.linspace(-1.1, 1.1, ho, device=DEV),
        torch.linspace(-1.1, 1.1, wo, device=DEV),
        indexing="ij",
    )
    jitter = torch.randn(n, ho, wo, 2, device=DEV, generator=g) * torch.tensor([6.4 / w, 6.4 / h], device=DEV)
    grid = torch.stack([xs, ys], -1).expand(n, ho, wo, 2) + jitter
    return x, grid.to(dtype).contiguous()


def uniform_grid(n: int, ho: int, wo: int, dtype: torch.dtype) -> torch.Tensor:
    """Uniformly random points in [-1, 1]: every lane of a warp gathers from its own cache line."""
    g = torch.Generator(device=DEV).manual_seed(1)
    return (torch.rand(n, ho, wo, 2, device=DEV, generator=g) * 2 - 1).to(dtype)


def affine_grid(n: int, ho: int, wo: int, dtype: torch.dtype) -> torch.Tensor:
    """A spatial transformer's grid: per image a rotation by 10-31 degrees, scale 0.9, a small shift."""
    theta = []
    for i in range(n):
        a, s = math.radians(10 + 3 * i), 0.9
        theta.append([[s * math.cos(a), -s * math.sin(a), 0.05], [s * math.sin(a), s * math.cos(a), -0.03]])
    t = torch.tensor(theta, device=DEV)
    return F.affine_grid(t, [n, 1, ho, wo], align_corners=False).to(dtype).contiguous()


def grid_kinds(n: int, c: int, h: int, w: int, dtype: torch.dtype) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The input and the three grids every grid_sample size is timed on, by name."""
    x, jittered = grid_inputs(n, c, h, w, h, w, dtype)
    grids = {
        "jittered grid": jittered,
        "affine grid": affine_grid(n, h, w, dtype),
        "uniform random grid": uniform_grid(n, h, w, dtype),
    }
    return x, grids


def dcn_inputs(
    n: int,
    cin: int,
    h: int,
    w: int,
    cout: int,
    dtype: torch.dtype,
    dg: int = 1,
    groups: int = 1,
    seed: int = 0,
) -> tuple:
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(n, cin, h, w, device=DEV, generator=g)
    off = torch.randn(n, 2 * dg * 9, h, w, device=DEV, generator=g) * 2
    mask = torch.rand(n, dg * 9, h, w, device=DEV, generator=g)
    wt = torch.randn(cout, cin // groups, 3, 3, device=DEV, generator=g) / math.sqrt(cin * 9 / groups)
    b = torch.randn(cout, device=DEV, generator=g)
    return tuple(t.to(dtype) for t in (x, off, mask, wt, b))


def fpn_inputs(
    n_rois: int,
    c: int,
    img: tuple[int, int],
    dtype: torch.dtype,
    batch: int = 1,
    seed: int = 0,
) -> tuple:
    g = torch.Generator(device=DEV).manual_seed(seed)
    feats = [torch.randn(batch, c, img[0] // s, img[1] // s, device=DEV, generator=g).to(dtype) for s in (4, 8, 16, 32)]
    # box sides log-uniform in [16, 512] px so every level gets RoIs
    side = torch.exp(torch.empty(n_rois, 2, device=DEV).uniform_(math.log(16), math.log(512), generator=g))
    xy = torch.rand(n_rois, 2, device=DEV, generator=g) * torch.tensor([img[1], img[0]], device=DEV)
    b = torch.randint(0, batch, (n_rois, 1), device=DEV, generator=g).float()
    rois = torch.cat(
        [
            b,
            xy,
            (xy + side).minimum(torch.tensor([img[1], img[0]], device=DEV).float()),
        ],
        1,
    )
    return rois.to(dtype), feats


def nms_inputs(b: int, n: int, c: int, dtype: torch.dtype, seed: int = 0) -> tuple:
    g = torch.Generator(device=DEV).manual_seed(seed)
    xy = torch.rand(b, n, 1, 2, device=DEV, generator=g) * 800
    wh = 16 + torch.rand(b, n, 1, 2, device=DEV, generator=g) * 200
    boxes = torch.cat([xy, xy + wh], -1)
    # distinct scores (exact in float32), so tie order cannot make implementations differ
    scores = (torch.randperm(b * n * c, device=DEV, generator=g).float() + 0.5) / (b * n * c)
    return boxes.to(dtype), scores.view(b, n, c).to(dtype)


def tv_multilevel(rois: torch.Tensor, feats: list[torch.Tensor], strides: tuple[float, ...]) -> torch.Tensor:
    """MMDet's SingleRoIExtractor written with torchvision roi_align (the baseline)."""
    levels = ref.map_roi_levels(rois.float(), len(feats), 56)
    out = rois.new_zeros(rois.shape[0], feats[0].shape[1], 7, 7, dtype=feats[0].dtype)
    for lvl, (f, s) in enumerate(zip(feats, strides)):
        idx = torch.nonzero(levels == lvl).flatten()
        if idx.numel():
            out[idx] = tv_roi_align(f, rois[idx].to(f.dtype), (7, 7), 1.0 / s, 0, True)
    return out


def tv_nms(
    boxes: torch.Tensor, scores: torch.Tensor, iou: float, thr: float, keep: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-image torchvision batched_nms over every (box, class) above the threshold, top ``keep`` (the baseline)."""
    b = scores.shape[0]
    dets = torch.zeros(b, keep, 5, device=DEV, dtype=boxes.dtype)
    labels = torch.full((b, keep), -1, device=DEV, dtype=torch.int32)
    for i in range(b):
        s = scores[i].float()
        box_idx, cls = torch.nonzero(s > thr, as_tuple=True)
        sc = s[box_idx, cls]
        bx = boxes[i, box_idx, 0].float()
        kept = tv_batched_nms(bx, sc, cls, iou)[:keep]
        m = kept.numel()
        dets[i, :m, :4] = bx[kept].to(dets.dtype)
        dets[i, :m, 4] = sc[kept].to(dets.dtype)
        labels[i, :m] = cls[kept].to(torch.int32)
    return dets, labels


# --------------------------------------------------------------------------- sections


# (n, c, h, w) -> (ho, wo): x4 super-resolution of a small image, the x2 feature map,
# 540p -> 1080p video, and a non-integer factor (the shared-memory band kernel)
RESIZE_SIZES = [
    ((1, 3, 256, 256), (1024, 1024)),
    ((8, 64, 128, 128), (256, 256)),
    ((1, 3, 540, 960), (1080, 1920)),
    ((8, 64, 128, 128), (200, 200)),
]


def section_resize(copy_gbs: float, quick: bool) -> None:
    from opbridge.ops import _resize_cuda
    from opbridge.ops import _seed_gpu as sg

    print("resize (bicubic)", flush=True)
    for (n, c, h, w), (ho, wo) in RESIZE_SIZES:
        for dtype in (torch.float32, torch.float16):
            x = torch.randn(n, c, h, w, device=DEV).to(dtype)
            size = torch.empty(1, 1, ho, wo, device=DEV, dtype=dtype)
            factor = sg._integer_factor(h, w, ho, wo, False)
            shape = f"{n}x{c}x{h}x{w} -> {ho}x{wo}" + (f" (x{factor})" if factor else "")
            native = bench(lambda: F.interpolate(x, size=(ho, wo), mode="bicubic", align_corners=False))
            nbytes = (x.numel() + n * c * ho * wo) * x.element_size()
            same = same_size_copy_ms(nbytes)
            if DynamicResize.gpu_kernel is None or dtype_name(dtype) not in DynamicResize.gpu_kernel_dtypes:
                note = "no GPU kernel registered for Test::DynamicTRTResize in this build"
                record("DynamicResize", shape, dtype, None, native, "F.interpolate", nbytes, copy_gbs, note)
                continue
            (out,) = run_kernel(DynamicResize, [x, size], {"align_corners": False})
            want = DynamicResize.run_reference(x.float(), size.float())
            compare("DynamicResize", shape, dtype, "reference", out, want, *tol(dtype))
            native_out = F.interpolate(x, size=(ho, wo), mode="bicubic", align_corners=False)
            compare(
                "DynamicResize", shape, dtype, f"F.interpolate CUDA {dtype_name(dtype)}", out, native_out, *tol(dtype)
            )
            ours = bench(kernel_fn(DynamicResize, [x, size], {"align_corners": False}))
            plane = not factor and _resize_cuda.is_default(x, ho, wo, False)
            if factor:
                note = f"registered: integer {sg._resize_int_config(n * c, h, w)}"
            elif plane:
                note = f"registered: plane {_resize_cuda.default_config(x, ho, wo, False)}"
            else:
                note = f"registered: window {sg._resize_config(n * c, ho, wo)}"
            record(
                "DynamicResize", shape, dtype, ours, native, "F.interpolate", nbytes, copy_gbs, note, same_copy_ms=same
            )
            # the other kernel / tiling on the same inputs
            alts: list[tuple[str, tuple]] = []
            if factor:
                alts.append(("window", sg._resize_config(n * c, ho, wo)))
                bi, ri, warps, prefetch = sg._resize_int_config(n * c, h, w)
                alts.append(("integer", (bi, ri, warps, not prefetch)))
            else:
                rows, bw, _, prefetch = sg._resize_config(n * c, ho, wo)
                if plane:
                    alts.append(("window", sg._resize_config(n * c, ho, wo)))
                alts.append(("window", (rows, bw, 1 if prefetch else 2, not prefetch)))
            for variant, cfg in alts:
                out = torch.full((n, c, ho, wo), float("nan"), device=DEV, dtype=dtype)
                sg.dynamic_resize_gpu([x, size], [out], {"align_corners": False}, 0, config=cfg, variant=variant)
                compare(f"DynamicResize {variant} {cfg}", shape, dtype, "reference", out, want, *tol(dtype))
                alt_ms = bench(
                    lambda: sg.dynamic_resize_gpu(
                        [x, size], [out], {"align_corners": False}, 0, config=cfg, variant=variant
                    )
                )
                record(
                    "DynamicResize",
                    shape,
                    dtype,
                    alt_ms,
                    native,
                    "F.interpolate",
                    nbytes,
                    copy_gbs,
                    f"{variant} {cfg}",
                    same_copy_ms=same,
                )


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


# the feature map, one large many-channel feature map (optical-flow style warping of
# features), and a deep low-resolution one
GRID_SIZES = [(8, 64, 128, 128), (1, 32, 512, 512), (4, 256, 64, 64)]


def grid_default_variant(x: torch.Tensor, mode: int) -> str:
    """The variant grid_sample's registered kernel runs for input ``x`` in this mode."""
    from opbridge.ops import _detection_triton as tk
    from opbridge.ops import _gridsample_cuda as gc

    return "plane" if gc.is_default(x, mode) else tk.GRID_VARIANT[mode, x.element_size()]


def grid_other_variants(x: torch.Tensor, registered: str) -> list[str]:
    """The other variants that can run on ``x``, timed beside the registered one ("plane" where
    one channel plane fits in shared memory and the kernel builds here)."""
    from opbridge.ops import _gridsample_cuda as gc

    fits = gc.available() and gc.plane_fits(x, 1)
    return [v for v in ("loop", "nhwc", "plane") if v != registered and (v != "plane" or fits)]


def section_grid(copy_gbs: float, quick: bool) -> None:
    print("grid_sampler", flush=True)
    for dtype in (torch.float32, torch.float16):
        for n, c, h, w in [(2, 5, 13, 17), (8, 64, 128, 128)]:
            x, grid = grid_inputs(n, c, h, w, h, w, dtype)
            shape = f"{n}x{c}x{h}x{w}"
            for mode in (0, 1, 2):
                for pad in (0, 1, 2):
                    for ac in (False, True):
                        attrs = {
                            "interpolation_mode": mode,
                            "padding_mode": pad,
                            "align_corners": ac,
                        }
                        (out,) = run_kernel(d.GridSample, [x, grid], attrs)
                        want = ref.grid_sample(x.float(), grid.float(), mode, pad, ac)
                        compare(
                            f"grid_sampler m{mode}p{pad}a{int(ac)}",
                            shape,
                            dtype,
                            "F.grid_sample fp32",
                            out,
                            want,
                            *tol(dtype),
                        )
        if dtype == torch.float32:
            # the numerical floor: PyTorch's own CUDA grid_sample against its CPU one, same inputs
            x, grid = grid_inputs(8, 64, 128, 128, 128, 128, dtype)
            for mode, name in ((0, "bilinear"), (2, "bicubic")):
                native = F.grid_sample(x, grid, mode=name, align_corners=True)
                cpu_ref = F.grid_sample(x.cpu(), grid.cpu(), mode=name, align_corners=True).to(DEV)
                compare(
                    f"F.grid_sample CUDA (floor) m{mode}p0a1",
                    "8x64x128x128",
                    dtype,
                    "F.grid_sample CPU",
                    native,
                    cpu_ref,
                    *tol(dtype),
                )
        from opbridge.ops import _detection_triton as tk

        for n, c, h, w in GRID_SIZES:
            shape = f"{n}x{c}x{h}x{w}"
            x, grids = grid_kinds(n, c, h, w, dtype)
            nbytes = (2 * x.numel() + n * h * w * 2) * x.element_size()
            same = same_size_copy_ms(nbytes)
            out = torch.empty_like(x)
            for grid_name, grid in grids.items():
                for mode, name in ((0, "bilinear"), (1, "nearest"), (2, "bicubic")):
                    attrs = {"interpolation_mode": mode, "padding_mode": 0, "align_corners": False}
                    (got,) = run_kernel(d.GridSample, [x, grid], attrs)
                    want = ref.grid_sample(x.float(), grid.float(), mode, 0, False)
                    compare(
                        f"grid_sampler m{mode}p0a0 {grid_name}",
                        shape,
                        dtype,
                        "F.grid_sample fp32",
                        got,
                        want,
                        *tol(dtype),
                    )
                    native = bench(lambda: F.grid_sample(x, grid, mode=name, padding_mode="zeros", align_corners=False))
                    ours = bench(kernel_fn(d.GridSample, [x, grid], attrs))
                    registered = grid_default_variant(x, mode)
                    label = f"grid_sampler {name}, {grid_name}"
                    common = ("F.grid_sample", nbytes, copy_gbs)
                    record(label, shape, dtype, ours, native, *common, f"registered ({registered})", same_copy_ms=same)
                    for other in grid_other_variants(x, registered):
                        tk.grid_sample(x, grid, out, mode, 0, False, variant=other)
                        label_other = f"grid_sampler {other} m{mode}p0a0 {grid_name}"
                        compare(label_other, shape, dtype, "F.grid_sample fp32", out, want, *tol(dtype))
                        alt = bench(lambda: tk.grid_sample(x, grid, out, mode, 0, False, variant=other))
                        record(label, shape, dtype, alt, native, *common, f"variant {other}", same_copy_ms=same)


# DCNv2 in ResNet-50's stages 2, 3 and 4 (MMDet's dcn configs put it in stages 3-5; stage 3 is the
# issue's shape), batch 8 (stage 2: batch 2)
DCN_SIZES = [(2, 128, 128, 128, 128), (8, 256, 64, 64, 256), (8, 512, 32, 32, 512)]


def section_dcn(quick: bool) -> None:
    print("MMCVModulatedDeformConv2d", flush=True)
    for dtype in (torch.float32, torch.float16):
        for n, cin, h, w, cout, dg, gr in [
            (2, 8, 11, 9, 6, 2, 2),
            (8, 256, 64, 64, 256, 1, 1),
        ]:
            x, off, mask, wt, b = dcn_inputs(n, cin, h, w, cout, dtype, dg, gr)
            attrs = {
                "stride": [1, 1],
                "padding": [1, 1],
                "dilation": [1, 1],
                "groups": gr,
                "deform_groups": dg,
            }
            shape = f"{n}x{cin}x{h}x{w} 3x3->{cout} g{gr} dg{dg}"
            (out,) = run_kernel(d.ModulatedDeformConv2d, [x, off, mask, wt, b], attrs)
            want = ref.deform_conv2d(
                x.float(),
                off.float(),
                mask.float(),
                wt.float(),
                b.float(),
                (1, 1),
                (1, 1),
                (1, 1),
                gr,
                dg,
            )
            rt, at = tol(dtype)
            compare(
                "MMCVModulatedDeformConv2d",
                shape,
                dtype,
                "reference",
                out,
                want,
                rt,
                at if dtype == torch.float16 else 1e-4,
            )
            if torchvision is not None:
                tv = tv_deform_conv2d(
                    x.float(),
                    off.float(),
                    wt.float(),
                    b.float(),
                    padding=1,
                    mask=mask.float(),
                )
                compare(
                    "MMCVModulatedDeformConv2d",
                    shape,
                    dtype,
                    "torchvision fp32",
                    out,
                    tv,
                    rt,
                    at if dtype == torch.float16 else 1e-4,
                )
        for n, cin, h, w, cout in DCN_SIZES:
            dcn_timed(dtype, n, cin, h, w, cout, variants=(n, cin, h, w, cout) == (8, 256, 64, 64, 256))


def dcn_timed(dtype: torch.dtype, n: int, cin: int, h: int, w: int, cout: int, variants: bool) -> None:
    """Time DCNv2 (groups 1, 3x3, stride 1, pad 1) against torchvision and a plain conv of the same shape.

    ``variants``: also time the non-default im2col and the fused implicit-GEMM variant.
    """
    x, off, mask, wt, b = dcn_inputs(n, cin, h, w, cout, dtype)
    attrs = {
        "stride": [1, 1],
        "padding": [1, 1],
        "dilation": [1, 1],
        "groups": 1,
        "deform_groups": 1,
    }
    shape = f"{n}x{cin}x{h}x{w} 3x3->{cout}"
    conv = bench(lambda: F.conv2d(x, wt, b, padding=1))  # cuDNN's default: TF32 allowed in float32
    conv_strict = conv
    if dtype == torch.float32:
        prev_cudnn = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = False
        conv_strict = bench(lambda: F.conv2d(x, wt, b, padding=1))
        torch.backends.cudnn.allow_tf32 = prev_cudnn
    tv = bench(lambda: tv_deform_conv2d(x, off, wt, b, padding=1, mask=mask)) if torchvision is not None else None
    prev = torch.backends.cuda.matmul.allow_tf32
    modes = [(False, "")] + ([(True, "TF32 matmul (as cudnn conv)")] if dtype == torch.float32 else [])
    if variants:
        from opbridge.ops import _detection_triton as tk

        other = "nhwc" if tk.DCN_VARIANT == "loop" else "loop"
        bn, bc, bh, bw = x.shape
        bo = wt.shape[0]
        out = torch.empty(bn, bo, bh, bw, device=DEV, dtype=dtype)
        tk.deform_conv2d(x, off, mask, wt, b, out, (1, 1), (1, 1), (1, 1), 1, 1, variant=other)
        want = ref.deform_conv2d(
            x.float(),
            off.float(),
            mask.float(),
            wt.float(),
            b.float(),
            (1, 1),
            (1, 1),
            (1, 1),
            1,
            1,
        )
        compare(
            f"MMCVModulatedDeformConv2d {other}",
            shape,
            dtype,
            "reference",
            out,
            want,
            *(tol(dtype) if dtype == torch.float16 else (1e-3, 1e-4)),
        )
        cols = torch.empty(bn, bc * 9, bh * bw, device=DEV, dtype=dtype)
        res = out.view(bn, bo, bh * bw)
        mm = bench(lambda: torch.matmul(wt.reshape(1, bo, bc * 9), cols, out=res))
        alt = bench(lambda: tk.deform_conv2d(x, off, mask, wt, b, out, (1, 1), (1, 1), (1, 1), 1, 1, variant=other))
        record(
            "MMCVModulatedDeformConv2d",
            shape,
            dtype,
            alt,
            conv,
            "F.conv2d (plain conv)",
            note=f"variant {other}; matmul alone {mm:.3f} ms",
        )
        # the fused implicit-GEMM variant (float16; float32 only with TF32 allowed)
        for tf32 in [False] if dtype == torch.float16 else [True]:
            prev_tf32 = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = tf32
            tk.deform_conv2d(x, off, mask, wt, b, out, (1, 1), (1, 1), (1, 1), 1, 1, variant="fused")
            fused_tol = tol(dtype) if dtype == torch.float16 else (1e-2, 1e-2)
            compare(
                "MMCVModulatedDeformConv2d fused",
                shape,
                dtype,
                "reference",
                out,
                want,
                *fused_tol,
            )
            fused = bench(
                lambda: tk.deform_conv2d(
                    x,
                    off,
                    mask,
                    wt,
                    b,
                    out,
                    (1, 1),
                    (1, 1),
                    (1, 1),
                    1,
                    1,
                    variant="fused",
                )
            )
            label = "variant fused" + ("; TF32" if tf32 else "")
            record(
                "MMCVModulatedDeformConv2d",
                shape,
                dtype,
                fused,
                conv,
                "F.conv2d (plain conv)",
                note=label,
            )
            if tv is not None:
                record(
                    "MMCVModulatedDeformConv2d",
                    shape,
                    dtype,
                    fused,
                    tv,
                    "torchvision deform_conv2d",
                    note=label,
                )
            torch.backends.cuda.matmul.allow_tf32 = prev_tf32
    for tf32, label in modes:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        ours = bench(kernel_fn(d.ModulatedDeformConv2d, [x, off, mask, wt, b], attrs))
        if tf32:
            (out,) = run_kernel(d.ModulatedDeformConv2d, [x, off, mask, wt, b], attrs)
            want = ref.deform_conv2d(x, off, mask, wt, b, (1, 1), (1, 1), (1, 1), 1, 1)
            compare(
                "MMCVModulatedDeformConv2d TF32",
                shape,
                dtype,
                "reference",
                out,
                want,
                1e-2,
                1e-2,
            )
        record(
            "MMCVModulatedDeformConv2d",
            shape,
            dtype,
            ours,
            tv,
            "torchvision deform_conv2d",
            note=label,
        )
        strict = dtype == torch.float32 and not tf32
        record(
            "MMCVModulatedDeformConv2d",
            shape,
            dtype,
            ours,
            conv_strict if strict else conv,
            "F.conv2d (plain conv" + (", cuDNN without TF32)" if strict else ")"),
            note=(label + "; goal: ours <= 2x conv at the same precision").strip("; "),
        )
        if strict:
            record(
                "MMCVModulatedDeformConv2d",
                shape,
                dtype,
                ours,
                conv,
                "F.conv2d (plain conv, cuDNN default: TF32)",
                note="strict fp32 DCN against a TF32 conv",
            )
    torch.backends.cuda.matmul.allow_tf32 = prev


# RoIs per batch of 800x1344 images (FPN levels 4-32): test-time proposals of one image, the
# issue's 1000, and two images' training-time 1000 each
ROI_SIZES = [(300, 1), (1000, 1), (2000, 2)]


def section_roi(quick: bool) -> None:
    print("MMCVRoiAlign / MMCVMultiLevelRoiAlign", flush=True)
    strides = (4.0, 8.0, 16.0, 32.0)
    for dtype in (torch.float32, torch.float16):
        for n_rois, c, img in [(37, 5, (128, 160)), (1000, 256, (800, 1344))]:
            rois, feats = fpn_inputs(n_rois, c, img, dtype)
            shape = f"{n_rois} RoIs, {c}ch, img {img[0]}x{img[1]}"
            rt, at = tol(dtype)
            for mode in ("avg", "max"):
                for aligned in (True, False):
                    for sr in (0, 2):
                        attrs = {
                            "output_height": 7,
                            "output_width": 7,
                            "spatial_scale": 0.25,
                            "sampling_ratio": sr,
                            "mode": mode,
                            "aligned": aligned,
                        }
                        (out,) = run_kernel(d.RoIAlign, [feats[0], rois], attrs)
                        if n_rois <= 40 or (mode == "avg" and sr == 0):
                            want = ref.roi_align(
                                feats[0].float(),
                                rois.float(),
                                7,
                                7,
                                0.25,
                                sr,
                                mode,
                                aligned,
                            )
                            compare(
                                f"MMCVRoiAlign {mode} al{int(aligned)} sr{sr}",
                                shape,
                                dtype,
                                "reference",
                                out,
                                want,
                                rt,
                                at,
                            )
                        if mode == "avg" and torchvision is not None:
                            tv = tv_roi_align(
                                feats[0].float(),
                                rois.float(),
                                (7, 7),
                                0.25,
                                sr,
                                aligned,
                            )
                            compare(
                                f"MMCVRoiAlign avg al{int(aligned)} sr{sr}",
                                shape,
                                dtype,
                                "torchvision fp32",
                                out,
                                tv,
                                rt,
                                at,
                            )
                            if dtype == torch.float32 and sr == 0:
                                # the numerical floor: torchvision's CUDA kernel against the reference
                                want = ref.roi_align(
                                    feats[0].float(),
                                    rois.float(),
                                    7,
                                    7,
                                    0.25,
                                    sr,
                                    mode,
                                    aligned,
                                )
                                compare(
                                    f"torchvision roi_align (floor) al{int(aligned)}",
                                    shape,
                                    dtype,
                                    "reference",
                                    tv,
                                    want,
                                    rt,
                                    at,
                                )
            for pool in (1, 0):
                attrs = {
                    "output_height": 7,
                    "output_width": 7,
                    "featmap_strides": list(strides),
                    "sampling_ratio": 0,
                    "pool_mode": pool,
                    "roi_scale_factor": 1.0,
                    "finest_scale": 56,
                    "aligned": True,
                }
                (out,) = run_kernel(d.MultiLevelRoiAlign, [rois, *feats], attrs)
                want = ref.multi_level_roi_align(
                    rois.float(),
                    [f.float() for f in feats],
                    7,
                    7,
                    strides,
                    0,
                    pool,
                    1.0,
                    56,
                    True,
                )
                compare(
                    f"MMCVMultiLevelRoiAlign pool{pool}",
                    shape,
                    dtype,
                    "reference",
                    out,
                    want,
                    rt,
                    at,
                )
                if pool == 1 and torchvision is not None:
                    tv = tv_multilevel(rois.float(), [f.float() for f in feats], strides)
                    compare(
                        "MMCVMultiLevelRoiAlign avg",
                        shape,
                        dtype,
                        "torchvision fp32",
                        out,
                        tv,
                        rt,
                        at,
                    )
        for n_rois, batch in ROI_SIZES:
            rois, feats = fpn_inputs(n_rois, 256, (800, 1344), dtype, batch=batch)
            attrs = {
                "output_height": 7,
                "output_width": 7,
                "spatial_scale": 0.25,
                "sampling_ratio": 0,
                "mode": "avg",
                "aligned": True,
            }
            ours = bench(kernel_fn(d.RoIAlign, [feats[0], rois], attrs))
            tv = bench(lambda: tv_roi_align(feats[0], rois, (7, 7), 0.25, 0, True)) if torchvision is not None else None
            record(
                "MMCVRoiAlign",
                f"{n_rois} RoIs on {batch}x256x200x336",
                dtype,
                ours,
                tv,
                "torchvision roi_align",
            )
            attrs = {
                "output_height": 7,
                "output_width": 7,
                "featmap_strides": list(strides),
                "sampling_ratio": 0,
                "pool_mode": 1,
                "roi_scale_factor": 1.0,
                "finest_scale": 56,
                "aligned": True,
            }
            ours = bench(kernel_fn(d.MultiLevelRoiAlign, [rois, *feats], attrs))
            tv = bench(lambda: tv_multilevel(rois, feats, strides)) if torchvision is not None else None
            record(
                "MMCVMultiLevelRoiAlign",
                f"{n_rois} RoIs, {batch}x4 levels, 256ch",
                dtype,
                ours,
                tv,
                "torchvision roi_align x4 levels",
            )


# (images, boxes, classes): one image's RetinaNet-style candidates, a batch of 16, and the 8x4000
NMS_SIZES = [(1, 1000, 80), (16, 1000, 80), (8, 4000, 80)]


def section_nms(quick: bool) -> None:
    print("TRTBatchedNMS", flush=True)
    for dtype in (torch.float32, torch.float16):
        boxes, scores = nms_inputs(2, 300, 6, dtype, seed=1)
        for topk in (100, -1):
            attrs = {
                "num_classes": scores.shape[2],
                "iou_threshold": 0.5,
                "score_threshold": 0.05,
                "topk": topk,
                "keep_topk": 50,
            }
            dets, labels = run_kernel(d.BatchedNMS, [boxes, scores], attrs)
            want_d, want_l = ref.batched_nms(
                boxes.float(),
                scores.float(),
                scores.shape[2],
                -1,
                0.5,
                0.05,
                topk,
                50,
                False,
            )
            compare(
                f"TRTBatchedNMS topk{topk} dets",
                "2x300 boxes, 6 classes",
                dtype,
                "reference",
                dets,
                want_d,
                0,
                0 if dtype == torch.float32 else 0.25,
            )
            compare(
                f"TRTBatchedNMS topk{topk} labels",
                "2x300 boxes, 6 classes",
                dtype,
                "reference",
                labels,
                want_l,
                0,
                0,
            )
        for b, n, c in NMS_SIZES[:2] if quick else NMS_SIZES:
            boxes, scores = nms_inputs(b, n, c, dtype)
            b, n, c = scores.shape
            shape = f"{b}x{n} boxes, {c} classes"
            attrs = {
                "num_classes": c,
                "iou_threshold": 0.5,
                "score_threshold": 0.05,
                "topk": -1,
                "keep_topk": 100,
            }
            dets, labels = run_kernel(d.BatchedNMS, [boxes, scores], attrs)
            if dtype == torch.float16:
                # float16 scores tie often; the CPU kernel (tested against the reference) keeps the same tie order
                from opbridge.ops import _detection_cpu as cpu

                cd, cl = cpu.batched_nms(
                    boxes[:1].cpu().numpy(),
                    scores[:1].cpu().numpy(),
                    **d.BatchedNMS.spec.bind_attributes(attrs),
                )
                compare(
                    "TRTBatchedNMS dets (all candidates)",
                    "image 0 of " + shape,
                    dtype,
                    "numpy CPU kernel",
                    dets[:1],
                    torch.from_numpy(cd).to(DEV),
                    0,
                    0,
                )
                compare(
                    "TRTBatchedNMS labels (all candidates)",
                    "image 0 of " + shape,
                    dtype,
                    "numpy CPU kernel",
                    labels[:1],
                    torch.from_numpy(cl).to(DEV),
                    0,
                    0,
                )
            elif torchvision is not None:
                tv_d, tv_l = tv_nms(boxes, scores, 0.5, 0.05, 100)
                compare(
                    "TRTBatchedNMS dets (all candidates)",
                    shape,
                    dtype,
                    "torchvision batched_nms",
                    dets,
                    tv_d,
                    0,
                    0,
                )
                compare(
                    "TRTBatchedNMS labels (all candidates)",
                    shape,
                    dtype,
                    "torchvision batched_nms",
                    labels,
                    tv_l,
                    0,
                    0,
                )
            ours = bench(kernel_fn(d.BatchedNMS, [boxes, scores], attrs))
            tv = bench(lambda: tv_nms(boxes, scores, 0.5, 0.05, 100), slow=True) if torchvision is not None else None
            record(
                "TRTBatchedNMS",
                shape + ", no pre-top-k",
                dtype,
                ours,
                tv,
                "torchvision batched_nms (per image)",
                note="goal >= 10x",
            )
            attrs["topk"] = 1000
            ours = bench(kernel_fn(d.BatchedNMS, [boxes, scores], attrs))
            record(
                "TRTBatchedNMS",
                shape + ", pre-top-k 1000/class",
                dtype,
                ours,
                tv,
                "torchvision batched_nms (all)",
                note="ours does less work (top 1000 per class)",
            )


def markdown() -> str:
    lines = [
        "| op | shape | dtype | ours ms | baseline | baseline ms | speed-up | ours % copy bw | baseline % copy bw "
        "| ours % same-size copy | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in SPEED:
        pct = lambda v: "-" if v is None else f"{100 * v:.0f}%"
        lines.append(
            f"| {r['op']} | {r['shape']} | {r['dtype']} | {fmt(r['ours_ms'])} | {r['native']} | {fmt(r['native_ms'])} | "
            f"{fmt(r['speedup'], 2)} | {pct(r.get('ours_bw'))} | {pct(r.get('native_bw'))} | "
            f"{pct(r.get('ours_same_copy'))} | {r['note']} |"
        )
    lines += [
        "",
        "| op | shape | dtype | against | max abs err | mismatched / n | tolerance | ok |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in PARITY:
        lines.append(
            f"| {p['op']} | {p['shape']} | {p['dtype']} | {p['against']} | {p['max_abs']:.2e} | "
            f"{p['mismatched']} / {p['numel']} | rtol {p['rtol']}, atol {p['atol']} | {'yes' if p['ok'] else 'NO'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the largest NMS batch")
    parser.add_argument("--json", help="write the results as JSON here")
    parser.add_argument("--only", default="resize,grid,dcn,roi,nms", help="comma-separated sections")
    args = parser.parse_args(argv)
    problem = unavailable("gpu_ops.py", "triton")
    if problem:
        print(problem, file=sys.stderr)
        return 2
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    print(
        f"device: {props.name}; torch {torch.__version__}; torchvision {getattr(torchvision, '__version__', None)}; "
        f"triton {__import__('triton').__version__}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        flush=True,
    )
    copy_gbs = copy_bandwidth()
    print(f"device-to-device copy: {copy_gbs:.0f} GB/s", flush=True)
    only = set(args.only.split(","))
    failures = []
    for name, fn in (
        ("resize", lambda: section_resize(copy_gbs, args.quick)),
        ("grid", lambda: section_grid(copy_gbs, args.quick)),
        ("dcn", lambda: section_dcn(args.quick)),
        ("roi", lambda: section_roi(args.quick)),
        ("nms", lambda: section_nms(args.quick)),
    ):
        if name in only:
            try:
                fn()
            except Exception as exc:
                import traceback

                traceback.print_exc()
                failures.append(f"{name}: {exc!r}")
    text = markdown()
    print(text)
    bad = [p for p in PARITY if not p["ok"]]
    print(f"\nparity: {len(PARITY) - len(bad)}/{len(PARITY)} ok; section failures: {failures or 'none'}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {
                    "device": props.name,
                    "copy_gbs": copy_gbs,
                    "speed": SPEED,
                    "parity": PARITY,
                    "failures": failures,
                    "torch": torch.__version__,
                    "torchvision": getattr(torchvision, "__version__", None),
                },
                fh,
                indent=1,
            )
    return 1 if bad or failures else 0


if __name__ == "__main__":
    sys.exit(main())
