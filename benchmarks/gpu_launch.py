"""Host cost of our GPU kernels' calls: Triton's JIT launch against the direct launch, side by side.

Every Triton kernel of the built-in ops is launched by ``opbridge.ops._triton_launch.launch``:
after the JIT has returned the compiled kernel for a specialization, later launches call its
launcher directly. ``OPBRIDGE_TRITON_JIT_LAUNCH=1`` sends every launch through ``kernel[grid](...)``
instead; this script flips it between measurements, so both paths run on the same inputs in the
same process, alternating, five rounds each.

First the parts of one launch on their own (a small kernel through the JIT and directly, the
host helpers the ops used before). Then per row: the CPU time one registered ``gpu_kernel`` call
takes to enqueue its work (host us; minimum over rounds of 30 back-to-back calls), the
event-timed median (``do_bench``, L2 flushed before each call, as in gpu_ops.py) and the GPU time
alone (CUDA-graph replay minus the flushes, as in gpu_graph_timing.py). Where host time exceeds
what the flush keeps the GPU busy, the event time reads the host; the ratio columns show how much
of that the direct launch removes.

Needs a CUDA GPU, torch and triton. Usage:
    PYTHONPATH=src python3 benchmarks/gpu_launch.py [--only resize,grid,dcn,roi,nms]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from gpu_ops import DCN_SIZES, GRID_SIZES, RESIZE_SIZES, dcn_inputs, fpn_inputs, grid_kinds, nms_inputs, unavailable

from opbridge.ops import DynamicResize
from opbridge.ops import detection as d

DEV = "cuda"
ROUNDS = 5


def jit_launches(on: bool) -> None:
    """Send every Triton launch through the JIT (``on``) or let cached kernels launch directly."""
    from opbridge.ops import _triton_launch as tlaunch

    os.environ["OPBRIDGE_TRITON_JIT_LAUNCH"] = "1" if on else "0"
    tlaunch.direct_launch_supported.cache_clear()


def cases(only: set[str]) -> Iterator[tuple[str, str, torch.dtype, Callable[[], None]]]:
    """(op, shape, dtype, call) for each row."""
    from gpu_graph_timing import registered  # this directory

    for dtype in (torch.float32, torch.float16):
        for (n, c, h, w), (ho, wo) in RESIZE_SIZES if "resize" in only else []:
            x = torch.randn(n, c, h, w, device=DEV).to(dtype)
            size = torch.empty(1, 1, ho, wo, device=DEV, dtype=dtype)
            call = registered(DynamicResize, [x, size], {"align_corners": False})
            yield "DynamicResize", f"{n}x{c}x{h}x{w} -> {ho}x{wo}", dtype, call
        for n, c, h, w in GRID_SIZES if "grid" in only else []:
            x, grids = grid_kinds(n, c, h, w, dtype)
            for mode, name in ((0, "bilinear"), (1, "nearest"), (2, "bicubic")):
                attrs = {"interpolation_mode": mode, "padding_mode": 0, "align_corners": False}
                call = registered(d.GridSample, [x, grids["jittered grid"]], attrs)
                yield f"grid_sampler {name}", f"{n}x{c}x{h}x{w}, jittered grid", dtype, call
        for n, cin, h, w, cout in DCN_SIZES if "dcn" in only else []:
            attrs = {"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 1, "deform_groups": 1}
            call = registered(d.ModulatedDeformConv2d, list(dcn_inputs(n, cin, h, w, cout, dtype)), attrs)
            yield (
                "DCNv2" + (" (strict fp32)" if dtype == torch.float32 else ""),
                f"{n}x{cin}x{h}x{w} 3x3->{cout}",
                dtype,
                call,
            )
        if "roi" in only:
            rois, feats = fpn_inputs(1000, 256, (800, 1344), dtype)
            attrs = {
                "output_height": 7,
                "output_width": 7,
                "featmap_strides": [4.0, 8.0, 16.0, 32.0],
                "sampling_ratio": 0,
                "pool_mode": 1,
                "roi_scale_factor": 1.0,
                "finest_scale": 56,
                "aligned": True,
            }
            yield (
                "MultiLevelRoiAlign",
                "1000 RoIs, 4 levels, 256ch",
                dtype,
                registered(d.MultiLevelRoiAlign, [rois, *feats], attrs),
            )
        if "nms" in only:
            boxes, scores = nms_inputs(1, 1000, 80, dtype)
            attrs = {"num_classes": 80, "iou_threshold": 0.5, "score_threshold": 0.05, "topk": -1, "keep_topk": 100}
            yield "BatchedNMS", "1x1000 boxes, 80 classes", dtype, registered(d.BatchedNMS, [boxes, scores], attrs)


def per_call_us(fn: Callable[[], Any], calls: int = 300, rounds: int = 7) -> float:
    """Minimum over rounds of the mean CPU microseconds per call of ``calls`` back-to-back calls."""
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) * 1e6 / calls)
        torch.cuda.synchronize()
    return best


def launch_parts() -> None:
    """The parts of a launch on their own: one small kernel (the layout kernel, 4 runtime arguments
    and 2 constexprs) through the JIT and directly, and the host helpers the ops used before."""
    import triton

    from opbridge.ops import _detection_triton as tk
    from opbridge.ops import _triton_launch as tlaunch

    x = torch.randn(1, 64, 32, 32, device=DEV)
    y = torch.empty(1, 32, 32, 64, device=DEV)
    grid = (16, 1, 1)
    kernel = tk._to_channels_last_kernel
    device = torch.cuda.current_device()
    parts = {}
    for jit in (True, False):
        jit_launches(jit)
        parts["JIT" if jit else "direct"] = per_call_us(
            lambda: tlaunch.launch(kernel, grid, x, y, 64, 1024, BLOCK_C=64, BLOCK_S=64, num_warps=4)
        )
    parts["torch.cuda.current_stream().cuda_stream"] = per_call_us(lambda: torch.cuda.current_stream().cuda_stream)
    parts["torch._C._cuda_getCurrentRawStream"] = per_call_us(lambda: torch._C._cuda_getCurrentRawStream(device))
    parts["triton.cdiv"] = per_call_us(lambda: triton.cdiv(16384, 16))
    parts["_triton_launch.cdiv"] = per_call_us(lambda: tlaunch.cdiv(16384, 16))
    print("| one launch or helper call | CPU us |\n|---|---|")
    for name, us in parts.items():
        print(f"| {name} | {us:.2f} |")
    print(flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="resize,grid,dcn,roi,nms", help="comma-separated op groups")
    args = parser.parse_args(argv)
    problem = unavailable("gpu_launch.py", "triton")
    if problem:
        print(problem, file=sys.stderr)
        return 2
    import triton
    from gpu_graph_timing import event_ms, flush_buffer, graph_ms, host_ms  # this directory

    from opbridge.ops import _triton_launch as tlaunch

    flush_buffer()  # before the cases' buffers, as when it was allocated at import
    jit_launches(False)
    if not tlaunch.direct_launch_supported():
        print(f"Triton {triton.__version__} has no direct launch here (_DIRECT_VERSIONS)", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} {torch.cuda.get_device_name()} "
        f"torch {torch.__version__} triton {triton.__version__}"
    )
    launch_parts()
    print(
        "| op | shape | dtype | host us JIT | host us direct | host JIT / direct | event ms JIT "
        "| event ms direct | event JIT / direct | GPU ms (graph) | event direct / GPU |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for op, shape, dtype, call in cases(set(args.only.split(","))):
        host = {True: [], False: []}
        event = {True: [], False: []}
        for _ in range(ROUNDS):
            for jit in (True, False):
                jit_launches(jit)
                host[jit].append(host_ms(call) * 1e3)
                event[jit].append(event_ms(call))
        jit_launches(False)
        gpu = graph_ms(call)
        hj, hd = min(host[True]), min(host[False])
        ej, ed = sorted(event[True])[ROUNDS // 2], sorted(event[False])[ROUNDS // 2]
        print(
            f"| {op} | {shape} | {str(dtype)[6:]} | {hj:.1f} | {hd:.1f} | {hj / hd:.2f}x | {ej:.4f} | {ed:.4f} "
            f"| {ej / ed:.2f}x | {gpu:.4f} | {ed / gpu:.2f}x |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
