"""GPU time with and without host launch gaps: event-timed and CUDA-graph-replayed medians, side by side.

``triton.testing.do_bench`` (the "event" columns, as in gpu_ops.py) times each call between
two CUDA events after an L2 flush. When a call's Python side (argument checks, allocations,
several kernel launches) takes longer than the flush keeps the GPU busy, the GPU waits for
the host inside the timed interval, so multi-launch paths and short kernels read slow. The
"graph" columns capture 20 x (flush, call) in a CUDA graph, replay it, and subtract a graph
of 20 flushes alone: GPU time only, no host launch cost. The flush's write-back overlaps the
call there, which slows memory-bound calls too (the 1 GiB copy reads about 2.8 instead of
4.2 TB/s), so "% copy" compares each method with a copy measured the same way. "host ms" is
the CPU time one call of ours takes to enqueue its work (30 calls back to back, not waiting
for the GPU): where it exceeds the GPU time, event timing reads the host.

A graph is only a measure of a call whose work it captures: each row first replays a one-call graph
and compares its output with the eager call's. torchvision's ``deform_conv2d`` fails that check (its
replay gives other outputs and half its eager GPU time: part of its work escapes the capture). Such a
call's "graph" cell is marked ``*`` and holds its eager GPU time instead: events around 20 x (flush,
call), minus 20 flushes alone, as long as its host time per call stays below that (the flush keeps
the GPU busy while the host enqueues the next call).

Needs a CUDA GPU, torch, triton and (for the dcn rows) torchvision. Every op of ours is called through its
registered ``gpu_kernel`` entry point, as the TensorRT plugin calls it.

Usage:
    PYTHONPATH=src python3 benchmarks/gpu_graph_timing.py [--split] [--only resize,grid,dcn] [--registered]

``--split`` instead times the channels-last grid_sample path in parts (the layout copy,
the kernel alone on a channels-last input, both through ``grid_sample``, the NCHW "loop"
kernel, the registered entry point), three rounds each, event-timed.
"""

# ruff: noqa: B023 - the lambdas built in loops are timed at once, inside the same iteration

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from gpu_ops import (  # this directory: the sizes and inputs of gpu_ops.py
    DCN_SIZES,
    GRID_SIZES,
    RESIZE_SIZES,
    copy_fn,
    grid_default_variant,
    grid_kinds,
    grid_other_variants,
    unavailable,
)

from opbridge.ops import DynamicResize
from opbridge.ops import detection as d

DEV = "cuda"


@functools.cache
def flush_buffer() -> torch.Tensor:
    """The 256 MB buffer zeroed before each timed call, allocated on first use (importing needs no GPU)."""
    return torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device=DEV)


def event_ms(fn: Callable[[], Any]) -> float:
    """Median ms of ``do_bench`` (CUDA events around each call, L2 flushed before it)."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median"))


def graph_ms(fn: Callable[[], Any], reps: int = 20, rounds: int = 5) -> float:
    """Median over rounds of (graph of reps x (flush, fn) - graph of reps x flush) / reps."""
    flush = flush_buffer()  # allocated before the capture, never inside it
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
        with_fn, flush_only = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(with_fn, stream=s):
            for _ in range(reps):
                flush.zero_()
                fn()
        with torch.cuda.graph(flush_only, stream=s):
            for _ in range(reps):
                flush.zero_()
    torch.cuda.synchronize()

    def replay(g: torch.cuda.CUDAGraph) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        g.replay()
        torch.cuda.synchronize()
        start.record()
        g.replay()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end)

    return statistics.median((replay(with_fn) - replay(flush_only)) / reps for _ in range(rounds))


def eager_ms(fn: Callable[[], Any], reps: int = 20, rounds: int = 5) -> float:
    """Median over rounds of (events around reps x (flush, fn) - events around reps x flush) / reps,
    launched eagerly: GPU time where the host enqueues a call faster than the GPU runs it."""
    flush = flush_buffer()

    def timed(with_fn: bool) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(reps):
            flush.zero_()
            if with_fn:
                fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end)

    for _ in range(3):
        fn()
    return statistics.median((timed(True) - timed(False)) / reps for _ in range(rounds))


def graph_faithful(fn: Callable[[], torch.Tensor]) -> bool:
    """Whether replaying a CUDA graph of one ``fn()`` call reproduces the eager call's output
    (``fn`` returns its output tensor; the graph's copy is overwritten before the replay: NaN, or -1
    for an integer output)."""
    want = fn().clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            got = fn()
    torch.cuda.current_stream().wait_stream(s)
    got.fill_(float("nan") if got.is_floating_point() else -1)
    g.replay()
    torch.cuda.synchronize()
    return bool(torch.equal(got, want) or torch.allclose(got, want, rtol=0.0, atol=0.0, equal_nan=True))


def host_ms(fn: Callable[[], Any], calls: int = 30) -> float:
    """Host milliseconds per call: the wall time of ``calls`` back-to-back calls, not waiting for the GPU.

    The launch queue holds them all, so this is the Python and launch cost a call adds on the CPU.
    """
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    ms = (time.perf_counter() - start) * 1e3 / calls
    torch.cuda.synchronize()
    return ms


def registered(op: Any, inputs: list[torch.Tensor], attrs: dict[str, Any]) -> Callable[[], torch.Tensor]:
    """The op's gpu_kernel on the current stream (read at each call: graph capture runs on its own
    stream), outputs allocated once; a call returns the first output."""
    bound = op.spec.bind_attributes(attrs)
    infos = op.shape_rule(*inputs, **bound)
    infos = infos if isinstance(infos, tuple) else (infos,)
    outs = [torch.empty(tuple(int(v) for v in i.shape), dtype=i.dtype, device=DEV) for i in infos]
    device = torch.cuda.current_device()

    def call() -> torch.Tensor:
        # the current stream's handle as a launcher reads it (torch.cuda.current_stream() costs ~5 us)
        op.gpu_kernel(inputs, outs, bound, torch._C._cuda_getCurrentRawStream(device))
        return outs[0]

    return call


class Table:
    def __init__(self) -> None:
        import triton

        nbytes = 2 << 30  # a 1 GiB copy: 1 GiB read and 1 GiB written
        copy = copy_fn(nbytes)
        self.copy_event = nbytes / (event_ms(copy) * 1e-3) / 1e9
        self.copy_graph = nbytes / (graph_ms(copy, reps=5) * 1e-3) / 1e9
        self.eager: list[str] = []  # the rows whose "graph" cells hold eager GPU time (*)
        print(
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} {torch.cuda.get_device_name()} "
            f"torch {torch.__version__} triton {triton.__version__}"
        )
        print(f"copy 1 GiB: event {self.copy_event:.0f} GB/s, graph {self.copy_graph:.0f} GB/s", flush=True)
        print(
            "| op | shape | dtype | ours event ms | ours graph ms | ours host ms | baseline | baseline event ms "
            "| baseline graph ms | speed-up event / graph | ours % copy event / graph | same-size copy graph ms |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")

    def gpu_ms(self, fn: Callable[[], torch.Tensor], label: str) -> tuple[float, float, str]:
        """(GPU ms, host ms per call, mark): graph-replayed where the replay reproduces the eager
        output, else eager (marked ``*`` and listed by :meth:`notes`)."""
        host = host_ms(fn)
        if graph_faithful(fn):
            return graph_ms(fn), host, ""
        ms = eager_ms(fn)
        bound = "" if host < ms else "; host-bound, so an upper bound"
        self.eager.append(f"{label}: eager GPU time {ms:.4f} ms, host time {host:.4f} ms per call{bound}")
        return ms, host, "*"

    def notes(self) -> None:
        if self.eager:
            print("\n* its CUDA-graph replay does not reproduce its eager output; eager GPU time instead:")
            for line in self.eager:
                print(f"  {line}")

    def row(
        self,
        op: str,
        shape: str,
        dtype: torch.dtype,
        ours: Callable[[], torch.Tensor],
        base: Callable[[], torch.Tensor],
        base_name: str,
        nbytes: int | None = None,
    ) -> None:
        oe, og, oh, o_mark = event_ms(ours), *self.gpu_ms(ours, f"{op} {shape} {dtype} (ours)")
        be, (bg, _, b_mark) = event_ms(base), self.gpu_ms(base, f"{op} {shape} {dtype} ({base_name})")
        pct = same = "-"
        if nbytes:
            same = f"{graph_ms(copy_fn(nbytes)):.4f}"
            pct = (
                f"{nbytes / (oe * 1e-3) / 1e9 / self.copy_event * 100:.0f}% / "
                f"{nbytes / (og * 1e-3) / 1e9 / self.copy_graph * 100:.0f}%"
            )
        print(
            f"| {op} | {shape} | {str(dtype)[6:]} | {oe:.4f} | {og:.4f}{o_mark} | {oh:.4f} | {base_name} | {be:.4f} | "
            f"{bg:.4f}{b_mark} | "
            f"{be / oe:.2f}x / {bg / og:.2f}x | {pct} | {same} |",
            flush=True,
        )


def table(only: set[str], registered_only: bool = False) -> None:
    from opbridge.ops import _detection_triton as tk

    if "dcn" in only:
        from torchvision.ops import deform_conv2d as tv_deform_conv2d

    t = Table()
    for (n, c, h, w), (ho, wo) in RESIZE_SIZES if "resize" in only else []:
        for dtype in (torch.float32, torch.float16):
            x = torch.randn(n, c, h, w, device=DEV).to(dtype)
            size = torch.empty(1, 1, ho, wo, device=DEV, dtype=dtype)
            t.row(
                "DynamicResize",
                f"{n}x{c}x{h}x{w} -> {ho}x{wo}",
                dtype,
                registered(DynamicResize, [x, size], {"align_corners": False}),
                lambda: F.interpolate(x, size=(ho, wo), mode="bicubic", align_corners=False),
                "F.interpolate",
                (x.numel() + n * c * ho * wo) * x.element_size(),
            )
    for dtype in (torch.float32, torch.float16) if "grid" in only else ():
        for n, c, h, w in GRID_SIZES:
            x, grids = grid_kinds(n, c, h, w, dtype)
            shape = f"{n}x{c}x{h}x{w}"
            nbytes = (2 * x.numel() + n * h * w * 2) * x.element_size()
            out = torch.empty_like(x)
            for kind, grid in grids.items():
                for mode, name in ((0, "bilinear"), (1, "nearest"), (2, "bicubic")):
                    variant = grid_default_variant(x, mode)
                    attrs = {"interpolation_mode": mode, "padding_mode": 0, "align_corners": False}
                    t.row(
                        f"grid_sampler {name}, {kind} ({variant})",
                        shape,
                        dtype,
                        registered(d.GridSample, [x, grid], attrs),
                        lambda: F.grid_sample(x, grid, mode=name, align_corners=False),
                        "F.grid_sample",
                        nbytes,
                    )
                    if registered_only:
                        continue
                    for other in grid_other_variants(x, variant):
                        t.row(
                            f"grid_sampler {name}, {kind} ({other})",
                            shape,
                            dtype,
                            lambda: (tk.grid_sample(x, grid, out, mode, 0, False, variant=other), out)[1],
                            lambda: F.grid_sample(x, grid, mode=name, align_corners=False),
                            "F.grid_sample",
                            nbytes,
                        )
    for n, cin, h, w, cout in DCN_SIZES if "dcn" in only else []:
        g = torch.Generator(device=DEV).manual_seed(0)
        x32 = torch.randn(n, cin, h, w, device=DEV, generator=g)
        off32 = torch.randn(n, 18, h, w, device=DEV, generator=g) * 2
        m32 = torch.rand(n, 9, h, w, device=DEV, generator=g)
        wt32 = torch.randn(cout, cin, 3, 3, device=DEV, generator=g) / (3 * cin**0.5)
        b32 = torch.randn(cout, device=DEV, generator=g)
        attrs = {"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 1, "deform_groups": 1}
        shape = f"{n}x{cin}x{h}x{w} 3x3->{cout}"
        for dtype, tf32 in ((torch.float32, False), (torch.float32, True), (torch.float16, False)):
            x, off, m, wt, b = (v.to(dtype) for v in (x32, off32, m32, wt32, b32))
            # the same precision for both: strict fp32 (no TF32 in cuBLAS or cuDNN), TF32 for both, fp16
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch.backends.cudnn.allow_tf32 = tf32 or dtype == torch.float16
            label = "strict fp32" if dtype == torch.float32 and not tf32 else ("TF32" if tf32 else "")
            ours = registered(d.ModulatedDeformConv2d, [x, off, m, wt, b], attrs)
            conv = lambda: F.conv2d(x, wt, b, padding=1)
            t.row(f"DCNv2 {label}", shape, dtype, ours, conv, "F.conv2d, same precision")
            t.row(
                f"DCNv2 {label}",
                shape,
                dtype,
                ours,
                lambda: tv_deform_conv2d(x, off, wt, b, padding=1, mask=m),
                "torchvision deform_conv2d",
            )
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = True
    t.notes()


def split() -> None:
    import triton

    from opbridge.ops import _detection_triton as tk

    for dtype in (torch.float32, torch.float16):
        x, grids = grid_kinds(8, 64, 128, 128, dtype)
        n, c, h, w = x.shape
        out = torch.empty_like(x)
        xt = tk.to_channels_last(x)
        for kind, grid in grids.items():
            for mode in (0, 1, 2):
                attrs = {"interpolation_mode": mode, "padding_mode": 0, "align_corners": False}
                bp, bc, warps = tk.GRID_NHWC_CONFIG[mode, x.element_size()]
                bc = min(bc, c)
                fns = {
                    "transpose": lambda: tk.to_channels_last(x),
                    "nhwc-main": lambda: tk._grid_sample_nhwc_kernel[(triton.cdiv(h * w, bp), n, triton.cdiv(c, bc))](
                        xt,
                        grid,
                        out,
                        c,
                        h,
                        w,
                        h * w,
                        MODE=mode,
                        PAD=0,
                        ALIGN=False,
                        BLOCK_P=bp,
                        BLOCK_C=bc,
                        num_warps=warps,
                    ),
                    "nhwc": lambda: tk.grid_sample(x, grid, out, mode, 0, False, variant="nhwc"),
                    "loop": lambda: tk.grid_sample(x, grid, out, mode, 0, False, variant="loop"),
                    "registered": registered(d.GridSample, [x, grid], attrs),
                }
                res: dict[str, list[float]] = {k: [] for k in fns}
                for _ in range(3):
                    for k, f in fns.items():
                        res[k].append(event_ms(f))
                cells = " | ".join(f"{k} {' '.join(f'{v:.4f}' for v in vals)}" for k, vals in res.items())
                print(f"grid {kind} m{mode} {dtype}: {cells}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", action="store_true", help="time the channels-last grid_sample path in parts")
    parser.add_argument("--only", default="resize,grid,dcn", help="comma-separated sections of the table")
    parser.add_argument(
        "--registered", action="store_true", help="grid_sample: the registered variant only, not the other one too"
    )
    args = parser.parse_args(argv)
    only = set(args.only.split(","))
    needs = ("triton", "torchvision") if "dcn" in only and not args.split else ("triton",)
    problem = unavailable("gpu_graph_timing.py", *needs)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    flush_buffer()  # before the cases' buffers, as when it was allocated at import
    split() if args.split else table(only, args.registered)
    return 0


if __name__ == "__main__":
    sys.exit(main())
