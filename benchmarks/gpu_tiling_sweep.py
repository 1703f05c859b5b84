"""Tile-shape sweep of the resize, grid_sample and DCNv2 im2col Triton kernels, timed side by side in one run.

Needs a CUDA GPU, torch and triton. For each tiling it checks the result against
PyTorch's own CUDA op (max abs error, fp32 result) and times it with
``triton.testing.do_bench`` (median, L2 flushed before each run), next to PyTorch and
a device-to-device copy measured in the same run. The registered defaults
(``_resize_config`` and ``_resize_int_config`` in ``opbridge.ops._seed_gpu``, ``GRID_LOOP_CONFIG`` and
``GRID_NHWC_CONFIG`` in ``opbridge.ops._detection_triton``) were picked from this table. ``--only dcn``
times DCNv2's channels-last path per im2col tiling in GPU time (CUDA-graph replay, as
gpu_graph_timing.py), against the reference.
``--only dcn-fused`` times the implicit-GEMM variant per tiling against that path, in TF32 and
float16, on the shapes that set ``_dcn_default_variant``'s rule. ``--only resize-plane`` times
DynamicResize's CUDA "plane" kernel per band tiling (``default_config`` in
``opbridge.ops._resize_cuda``) beside the registered kernel and the Triton ones, event-timed and in
GPU time. ``--only grid-plane`` times grid_sample's CUDA "plane" kernel per tiling (``default_config`` in
``opbridge.ops._gridsample_cuda`` was picked from it) against the Triton variant the table
``GRID_VARIANT`` names, event-timed and in GPU time, at the two gpu_ops.py sizes whose planes fit
in shared memory, on its three grids.

Usage:
    PYTHONPATH=src python3 benchmarks/gpu_tiling_sweep.py [--only resize,resize-plane,grid,grid-plane,dcn,dcn-fused]
        [--modes bilinear,nearest,bicubic] [--json out.json]
"""

# ruff: noqa: B023 - the lambdas built in loops are timed at once, inside the same iteration

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from gpu_ops import grid_kinds, unavailable  # this directory: the inputs gpu_ops.py times

from opbridge.ops import _seed_gpu as sg

DEV = "cuda"
ROWS: list[dict[str, Any]] = []


def bench(fn: Any) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=5, rep=40, return_mode="median"))


def copy_gbs() -> float:
    src = torch.empty(1 << 28, dtype=torch.float32, device=DEV)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / (bench(lambda: dst.copy_(src)) * 1e-3) / 1e9


def row(
    kind: str,
    shape: str,
    dtype: torch.dtype,
    cfg: Any,
    ms: float,
    native_ms: float,
    nbytes: int,
    copy: float,
    err: float,
) -> None:
    r = {
        "kind": kind,
        "shape": shape,
        "dtype": str(dtype).replace("torch.", ""),
        "config": str(cfg),
        "ms": ms,
        "native_ms": native_ms,
        "speedup": native_ms / ms,
        "pct_copy": nbytes / (ms * 1e-3) / 1e9 / copy,
        "max_abs_err": err,
    }
    ROWS.append(r)
    print(
        f"{kind:18s} {shape:22s} {r['dtype']:8s} {r['config']:24s} {ms:8.4f} ms  native {native_ms:8.4f}  "
        f"x{r['speedup']:5.2f}  {100 * r['pct_copy']:5.1f}% copy  err {err:.2e}",
        flush=True,
    )


RESIZE_CONFIGS = [
    None,
    (32, 256, 1, False),
    (8, 256, 2, False),
    (32, 256, 2, True),
    (32, 256, 1, True),
    (16, 256, 2, True),
    (8, 256, 2, True),
    (32, 128, 1, True),
    (64, 256, 2, True),
    (32, 64, 1, True),
    (32, 32, 1, True),
    (16, 128, 2, True),
    (64, 128, 4, True),
    (16, 256, 4, True),
    (32, 256, 8, True),
    (16, 256, 8, True),
    (8, 256, 8, True),
]
# "nhwc" tilings: (output pixels, channels, num_warps) per program
GRID_NHWC_CONFIGS = [(32, 32, 4), (16, 64, 4), (32, 64, 4), (64, 32, 4), (64, 64, 8), (16, 32, 4)]
GRID_CONFIGS = {
    0: [
        (8, 16, 16, 4, 4),
        (32, 32, 8, 4, 8),
        (8, 32, 8, 2, 4),
        (4, 64, 16, 4, 4),
        (16, 16, 8, 4, 4),
        (8, 16, 8, 4, 4),
        (4, 32, 8, 4, 4),
        (8, 16, 16, 8, 4),
        (16, 32, 4, 4, 8),
    ],
    1: [(32, 32, 8, 4, 8), (32, 16, 8, 4, 8), (8, 32, 16, 4, 4), (8, 16, 16, 4, 4), (4, 64, 16, 4, 4)],
    2: [(4, 32, 16, 2, 4), (4, 16, 16, 2, 4), (2, 32, 16, 2, 4), (4, 32, 8, 1, 4)],
}


RESIZE_INT_CONFIGS = [
    None,
    (128, 8, 4, True),
    (128, 32, 4, True),
    (128, 16, 4, False),
    (256, 16, 4, True),
    (256, 16, 8, True),
    (512, 16, 8, True),
    (64, 16, 2, True),
    (64, 8, 1, True),
    (128, 4, 4, True),
]


# (n, c, h, w, ho, wo): gpu_ops.py's four resize sizes
RESIZE_SWEEP_SIZES = [
    (1, 3, 256, 256, 1024, 1024),
    (8, 64, 128, 128, 256, 256),
    (1, 3, 540, 960, 1080, 1920),
    (8, 64, 128, 128, 200, 200),
]


def resize_cases(sizes: list[tuple[int, ...]]) -> Iterator[tuple[Any, ...]]:
    """Per size and dtype: (n, c, h, w, ho, wo, dtype, x, out, reference result in float32,
    F.interpolate's time, bytes moved)."""
    for n, c, h, w, ho, wo in sizes:
        for dtype in (torch.float32, torch.float16):
            x = torch.randn(n, c, h, w, device=DEV).to(dtype)
            out = torch.empty(n, c, ho, wo, device=DEV, dtype=dtype)
            want = F.interpolate(x.float(), size=(ho, wo), mode="bicubic", align_corners=False)
            native = bench(lambda: F.interpolate(x, size=(ho, wo), mode="bicubic", align_corners=False))
            yield n, c, h, w, ho, wo, dtype, x, out, want, native, (x.numel() + out.numel()) * x.element_size()


def sweep_resize(copy: float) -> None:
    for n, c, h, w, ho, wo, dtype, x, out, want, native, nbytes in resize_cases(RESIZE_SWEEP_SIZES):
        variants = [("window", cfg) for cfg in RESIZE_CONFIGS]
        if sg._integer_factor(h, w, ho, wo, False):
            variants += [("integer", cfg) for cfg in RESIZE_INT_CONFIGS]
        for variant, cfg in variants:
            out.fill_(float("nan"))
            kw = {"config": cfg, "variant": variant}
            sg.dynamic_resize_gpu([x, None], [out], {"align_corners": False}, 0, **kw)
            err = float((out.float() - want).abs().max())
            ms = bench(lambda: sg.dynamic_resize_gpu([x, None], [out], {"align_corners": False}, 0, **kw))
            default = sg._resize_config(n * c, ho, wo) if variant == "window" else sg._resize_int_config(n * c, h, w)
            row(
                f"resize {variant}",
                f"{n}x{c}x{h}x{w} -> {ho}x{wo}",
                dtype,
                cfg or default,
                ms,
                native,
                nbytes,
                copy,
                err,
            )


# DynamicResize "plane" tilings: (output rows per band, warps per block, planes per block)
RESIZE_PLANE_CONFIGS = [(rows, warps, planes) for planes in (1, 2) for rows in (8, 16, 32, 64) for warps in (4, 8, 16)]


def sweep_resize_plane(copy: float) -> None:
    from gpu_graph_timing import graph_ms  # this directory

    from opbridge.ops import _resize_cuda as rc
    from opbridge.ops._nvrtc import smem_limit

    sizes = RESIZE_SWEEP_SIZES + [(8, 64, 128, 128, 96, 96), (1, 3, 540, 960, 720, 1280)]
    for n, c, h, w, ho, wo, dtype, x, out, want, native, nbytes in resize_cases(sizes):
        variants: list[tuple[str | None, Any]] = [(None, None), ("window", None)]
        if sg._integer_factor(h, w, ho, wo, False):
            variants.append(("integer", None))
        variants.append(("plane", None))
        variants += [
            ("plane", cfg)
            for cfg in RESIZE_PLANE_CONFIGS
            if rc.smem_bytes(x, ho, wo, False, cfg[0], cfg[2]) <= smem_limit(x.device.index or 0)
        ]
        for variant, cfg in variants:
            out.fill_(float("nan"))
            kw = {"config": cfg, "variant": variant}
            fn = lambda: sg.dynamic_resize_gpu([x, None], [out], {"align_corners": False}, 0, **kw)
            fn()
            err = float((out.float() - want).abs().max())
            ms, gpu = bench(fn), graph_ms(fn)
            if variant == "plane" and cfg is None:
                cfg = f"default {rc.default_config(x, ho, wo, False)}"
            row(
                f"resize {variant or 'registered'}",
                f"{n}x{c}x{h}x{w} -> {ho}x{wo}",
                dtype,
                cfg or "default",
                ms,
                native,
                nbytes,
                copy,
                err,
            )
            ROWS[-1]["gpu_ms"] = gpu
            print(f"{'':18s} GPU time {gpu:.4f} ms", flush=True)


def sweep_grid(copy: float) -> None:
    from opbridge.ops import _detection_triton as tk

    names = {0: "bilinear", 1: "nearest", 2: "bicubic"}
    for dtype in (torch.float32, torch.float16):
        n, c, h, w = 8, 64, 128, 128
        x, grids = grid_kinds(n, c, h, w, dtype)
        xl = x.to(memory_format=torch.channels_last)
        out = torch.empty_like(x)
        nbytes = (2 * x.numel() + n * h * w * 2) * x.element_size()
        for grid_name, grid in grids.items():
            for mode, name in names.items():
                want = F.grid_sample(x.float(), grid.float(), mode=name, align_corners=False)
                native = bench(lambda: F.grid_sample(x, grid, mode=name, align_corners=False))
                # "nhwc" tilings on a channels-last input, read in place: the kernel alone, one launch
                # (its layout copy is the same for every tiling)
                for variant, src, configs in (("loop", x, GRID_CONFIGS[mode]), ("nhwc", xl, GRID_NHWC_CONFIGS)):
                    for cfg in configs:
                        out.fill_(float("nan"))
                        tk.grid_sample(src, grid, out, mode, 0, False, variant=variant, config=cfg)
                        err = float((out.float() - want).abs().max())
                        ms = bench(lambda: tk.grid_sample(src, grid, out, mode, 0, False, variant=variant, config=cfg))
                        label = f"8x64x128x128 {grid_name.split()[0]}"
                        kind = "loop" if variant == "loop" else "nhwc kernel"
                        row(f"grid {name} {kind}", label, dtype, cfg, ms, native, nbytes, copy, err)


# grid_sample "plane" tilings: (channels per block, threads, output pixels per block at most, unroll
# [, blocks per SM (0: as many as fit), persistent[, zero border]]); one work item per block, then
# persistent blocks, then the default tilings without the zero border that bilinear takes by default
GRID_PLANE_CONFIGS = [
    (1, 1024, 16384, 4),
    (1, 512, 16384, 4),
    (2, 1024, 16384, 4),
    (2, 512, 8192, 4),
    (2, 512, 16384, 4),
    (4, 512, 8192, 4),
    (1, 1024, 16384, 4, 0, 1),
    (1, 1024, 8192, 4, 0, 1),
    (1, 512, 16384, 4, 0, 1),
    (2, 1024, 16384, 4, 0, 1),
    (2, 512, 8192, 4, 0, 1),
    (4, 1024, 16384, 4, 0, 1),
    (4, 512, 8192, 4, 0, 1),
    (1, 1024, 16384, 4, 0, 0, 0),
    (2, 512, 8192, 4, 0, 0, 0),
    (2, 512, 8192, 4, 0, 1, 0),
    (4, 512, 8192, 4, 0, 1, 0),
]


def sweep_grid_plane(copy: float, modes: list[str]) -> None:
    from gpu_graph_timing import graph_ms  # this directory

    from opbridge.ops import _detection_triton as tk
    from opbridge.ops import _gridsample_cuda as gc

    names = {m: name for m, name in {0: "bilinear", 1: "nearest", 2: "bicubic"}.items() if name in modes}
    for n, c, h, w in ((8, 64, 128, 128), (4, 256, 64, 64)):
        for dtype in (torch.float32, torch.float16):
            x, grids = grid_kinds(n, c, h, w, dtype)
            out = torch.empty_like(x)
            nbytes = (2 * x.numel() + n * h * w * 2) * x.element_size()
            shape = f"{n}x{c}x{h}x{w}"
            for grid_name, grid in grids.items():
                for mode, name in names.items():
                    want = F.grid_sample(x.float(), grid.float(), mode=name, align_corners=False)
                    native = bench(lambda: F.grid_sample(x, grid, mode=name, align_corners=False))
                    triton_variant = tk.GRID_VARIANT[mode, x.element_size()]
                    runs: list[tuple[str, Any]] = [(triton_variant, None), ("plane", None)]
                    runs += [("plane", cfg) for cfg in GRID_PLANE_CONFIGS if gc.plane_fits(x, cfg[0])]
                    for variant, cfg in runs:
                        out.fill_(float("nan"))
                        tk.grid_sample(x, grid, out, mode, 0, False, variant=variant, config=cfg)
                        err = float((out.float() - want).abs().max())
                        fn = lambda: tk.grid_sample(x, grid, out, mode, 0, False, variant=variant, config=cfg)
                        ms = bench(fn)
                        gpu = graph_ms(fn)
                        label = cfg or (
                            "default " + str(gc.default_config(x, mode)) if variant == "plane" else "default"
                        )
                        kind = f"grid {name} {variant}"
                        row(kind, f"{shape} {grid_name.split()[0]}", dtype, label, ms, native, nbytes, copy, err)
                        ROWS[-1]["gpu_ms"] = gpu
                        print(f"{'':18s} GPU time {gpu:.4f} ms", flush=True)


# DCNv2 channels-last im2col tilings: (output pixels, channels, num_warps) per program
DCN_NHWC_CONFIGS = [
    (16, 64, 4),
    (32, 64, 4),
    (64, 64, 8),
    (32, 32, 4),
    (16, 128, 4),
    (8, 64, 2),
    (64, 32, 4),
    (32, 128, 8),
]


def sweep_dcn() -> None:
    from gpu_graph_timing import graph_ms  # this directory
    from gpu_ops import DCN_SIZES, dcn_inputs

    from opbridge.ops import _detection_ref as ref
    from opbridge.ops import _detection_triton as tk

    for n, cin, h, w, cout in DCN_SIZES:
        for dtype, tf32 in ((torch.float32, False), (torch.float32, True), (torch.float16, False)):
            prev = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = tf32
            x, off, mask, wt, b = dcn_inputs(n, cin, h, w, cout, dtype)
            out = torch.empty(n, cout, h, w, device=DEV, dtype=dtype)
            geo = ((1, 1), (1, 1), (1, 1), 1, 1)
            want = ref.deform_conv2d(x.double(), off.double(), mask.double(), wt.double(), b.double(), *geo)
            for cfg in DCN_NHWC_CONFIGS:
                out.fill_(float("nan"))
                tk.deform_conv2d(x, off, mask, wt, b, out, *geo, variant="nhwc", config=cfg)
                err = float(((out.double() - want).abs() / (want.abs() + 1)).max())
                ms = graph_ms(lambda: tk.deform_conv2d(x, off, mask, wt, b, out, *geo, variant="nhwc", config=cfg))
                r = {
                    "kind": "dcn nhwc" + (" tf32" if tf32 else ""),
                    "shape": f"{n}x{cin}x{h}x{w} 3x3->{cout}",
                    "dtype": str(dtype).replace("torch.", ""),
                    "config": str(cfg),
                    "gpu_ms": ms,
                    "max_rel_err": err,
                }
                ROWS.append(r)
                print(
                    f"{r['kind']:14s} {r['shape']:24s} {r['dtype']:8s} {r['config']:16s} GPU {ms:8.4f} ms  err {err:.2e}"
                )
            torch.backends.cuda.matmul.allow_tf32 = prev


# shapes (N, Cin, H, W, Cout) on which _dcn_default_variant's "fused" rule was measured, and the
# implicit GEMM's tilings (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) timed on each
DCN_FUSED_SHAPES = [
    (2, 128, 128, 128, 128),
    (4, 64, 128, 128, 64),
    (2, 128, 128, 128, 96),
    (8, 128, 64, 64, 128),
    (8, 64, 128, 128, 128),
    (1, 128, 128, 128, 128),
    (2, 128, 64, 64, 128),
    (4, 128, 64, 64, 128),
    (8, 256, 64, 64, 256),
]
DCN_FUSED_CONFIGS = [(128, 128, 32, 4, 3), (128, 128, 16, 4, 3), (64, 128, 16, 4, 3), (128, 128, 32, 8, 2)]


def _fused_n_major(
    x: torch.Tensor, off: torch.Tensor, mask: torch.Tensor, wt: torch.Tensor, b: torch.Tensor, out: torch.Tensor
) -> None:
    """The TF32 implicit GEMM with its weights (tap, Cin, Cout), contiguous along N: the layout it
    had before TF32 took K-major weights (default tiling of that time: 128, 128, 32, 8 warps, 2 stages)."""
    import triton

    from opbridge.ops import _detection_triton as tk

    n, cin, h, w = x.shape
    cout = wt.shape[0]
    w2 = wt.permute(2, 3, 1, 0).reshape(9 * cin, cout).contiguous()
    grid = (triton.cdiv(h * w, 128), triton.cdiv(cout, 128), n)
    tk._dcn_fused_kernel[grid](
        tk.as_channels_last(x), off, mask, w2, b, out, cin, h, w, w, h * w, cout, cout, 1, 3, 1, 1, 1, 1, 1, 1,
        K=9, HAS_BIAS=True, TF32=True, BLOCK_M=128, BLOCK_N=128, BLOCK_K=32, num_warps=8, num_stages=2,
    )  # fmt: skip


def sweep_dcn_fused() -> None:
    """DCNv2's implicit GEMM ("fused") against the column-buffer path ("nhwc") in GPU time, per
    tiling, in TF32 and float16; event-timed, the registered kernel against both and the conv."""
    import triton
    from gpu_graph_timing import event_ms, graph_ms  # this directory
    from gpu_ops import dcn_inputs

    from opbridge.ops import _detection_triton as tk

    geo = ((1, 1), (1, 1), (1, 1), 1, 1)
    print("| shape | precision | variant | tiling | GPU ms | / nhwc | / conv | max rel diff vs nhwc |")
    print("|---|---|---|---|---|---|---|---|")
    for dtype, label in ((torch.float32, "TF32"), (torch.float16, "float16")):
        prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        for n, cin, h, w, cout in DCN_FUSED_SHAPES:
            x, off, mask, wt, b = dcn_inputs(n, cin, h, w, cout, dtype)
            ref_out = torch.empty(n, cout, h, w, device=DEV, dtype=dtype)
            out = torch.empty_like(ref_out)
            nhwc = lambda: tk.deform_conv2d(x, off, mask, wt, b, ref_out, *geo, variant="nhwc")
            nhwc()
            scale = float(ref_out.float().abs().max())
            g_ref, conv = graph_ms(nhwc), graph_ms(lambda: F.conv2d(x, wt, b, padding=1))
            shape = f"{n}x{cin}x{h}x{w} 3x3->{cout}"
            chosen = tk._dcn_default_variant(True, n, h * w, cout, 1, 1)
            print(f"| {shape} | {label} | nhwc | - | {g_ref:.4f} | 1.00 | {g_ref / conv:.2f}x | registered: {chosen} |")
            runs: list[tuple[str, Any, Any]] = []
            for cfg in [None, *DCN_FUSED_CONFIGS]:
                if cfg is None or cfg[1] <= max(16, triton.next_power_of_2(cout)):
                    fn = lambda cfg=cfg: tk.deform_conv2d(
                        x, off, mask, wt, b, out, *geo, variant="fused", fused_config=cfg
                    )
                    runs.append(("fused", cfg or "default", fn))
            if dtype == torch.float32:
                before = lambda: _fused_n_major(x, off, mask, wt, b, out)
                runs.append(("fused, N-major weights", "(128, 128, 32, 8, 2)", before))
            for name, cfg, fn in runs:
                fn()
                diff = float((out.float() - ref_out.float()).abs().max()) / scale
                ms = graph_ms(fn)
                ROWS.append(
                    {
                        "kind": f"dcn {name}",
                        "shape": shape,
                        "dtype": label,
                        "config": str(cfg),
                        "gpu_ms": ms,
                        "nhwc_gpu_ms": g_ref,
                        "conv_gpu_ms": conv,
                        "max_rel_diff": diff,
                    }
                )
                ratios = f"{ms / g_ref:.2f} | {ms / conv:.2f}x"
                print(f"| {shape} | {label} | {name} | {cfg} | {ms:.4f} | {ratios} | {diff:.1e} |")
            reg = lambda: tk.deform_conv2d(x, off, mask, wt, b, out, *geo)
            ev, ev_nhwc, ev_conv = event_ms(reg), event_ms(nhwc), event_ms(lambda: F.conv2d(x, wt, b, padding=1))
            print(
                f"| {shape} | {label} | event-timed: registered ({chosen}) {ev:.4f} ms, nhwc {ev_nhwc:.4f}, "
                f"conv {ev_conv:.4f} | | | registered {ev / ev_conv:.2f}x conv | |",
                flush=True,
            )
        torch.backends.cuda.matmul.allow_tf32 = prev


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the rows as JSON here")
    parser.add_argument("--only", default="resize,grid")
    parser.add_argument("--modes", default="bilinear,nearest,bicubic", help="grid_sample modes of --only grid-plane")
    args = parser.parse_args(argv)
    problem = unavailable("gpu_tiling_sweep.py", "triton")
    if problem:
        print(problem, file=sys.stderr)
        return 2
    copy = copy_gbs()
    print(f"device {torch.cuda.get_device_name()}; copy {copy:.0f} GB/s", flush=True)
    if "resize" in args.only.split(","):
        sweep_resize(copy)
    if "resize-plane" in args.only:
        sweep_resize_plane(copy)
    if "grid" in args.only.split(","):
        sweep_grid(copy)
    if "grid-plane" in args.only:
        sweep_grid_plane(copy, args.modes.split(","))
    if "dcn" in args.only.split(","):
        sweep_dcn()
    if "dcn-fused" in args.only:
        sweep_dcn_fused()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"copy_gbs": copy, "rows": ROWS}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
