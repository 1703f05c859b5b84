"""The copy-rate ceiling of each memory-bound GPU case: how close to a 1 GiB copy's rate a copy of the same bytes gets.

gpu_ops.py states DynamicResize's and grid_sample's speed as a fraction of the rate of a 1 GiB
device-to-device copy, both event-timed by ``triton.testing.do_bench``, which zeroes a 256 MB
buffer before every call to flush L2. A copy of a few tens of MB does not reach the 1 GiB copy's
rate in this timing: its fixed costs weigh more, and it writes back the dirty lines the flush
leaves in L2. A copy of a case's own bytes, timed the same way, is therefore the most any kernel
moving those bytes can reach in this timing: its "ceiling".

For each case (the sizes of gpu_ops.py; grid_sample in every mode on its three grids) this prints
the bytes moved (read + written once), the same-size copy's rate as a percentage of the 1 GiB
copy's (the ceiling), the registered kernel's percentage and the kernel as a percentage of the
same-size copy, each event-timed with do_bench's flush; and the same with a flush that only reads
256 MB (it leaves L2 clean, so the difference is the write-back's share).

Needs a CUDA GPU, torch and triton. Every kernel is called through its registered ``gpu_kernel``,
as the TensorRT plugin calls it.

Usage:
    PYTHONPATH=src python3 benchmarks/gpu_copy_ceiling.py [--only resize,grid] [--json out.json]
"""

# ruff: noqa: B023 - the lambdas built in loops are timed at once, inside the same iteration

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from gpu_ops import (  # this directory: gpu_ops.py's cases and its timing
    GRID_SIZES,
    RESIZE_SIZES,
    bench,
    copy_fn,
    dtype_name,
    grid_kinds,
    kernel_fn,
    unavailable,
)

from opbridge.ops import DynamicResize

DEV = "cuda"
ROWS: list[dict[str, Any]] = []


@functools.cache
def read_flush() -> torch.Tensor:
    """The 256 MB buffer read before each timed call, allocated on first use (importing needs no GPU)."""
    return torch.empty(256 * 1024 * 1024 // 4, dtype=torch.float32, device=DEV)


def read_flush_ms(fn: Callable[[], Any], reps: int = 100) -> float:
    """Median ms with CUDA events around each call after reading 256 MB (L2 left clean)."""
    flush = read_flush()
    for _ in range(10):
        flush.sum()
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for start, end in zip(starts, ends):
        flush.sum()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


class Ceiling:
    """The 1 GiB copy's rate with both flushes, and same-size copies timed once per byte count."""

    def __init__(self) -> None:
        big = copy_fn(2 << 30)
        self.rate = {"zero": (2 << 30) / bench(big) / 1e6, "read": (2 << 30) / read_flush_ms(big, 30) / 1e6}
        self.copies: dict[int, dict[str, float]] = {}

    def share(self, nbytes: int, ms: float, flush: str) -> float:
        """``nbytes`` moved in ``ms``, in percent of the 1 GiB copy's rate with this flush."""
        return 100 * nbytes / ms / 1e6 / self.rate[flush]

    def row(self, op: str, case: str, nbytes: int, fn: Callable[[], Any]) -> None:
        if nbytes not in self.copies:
            same = copy_fn(nbytes)
            self.copies[nbytes] = {"zero": bench(same), "read": read_flush_ms(same)}
        copy = self.copies[nbytes]
        ours = {"zero": bench(fn), "read": read_flush_ms(fn)}
        result = {
            "op": op,
            "case": case,
            "mb": nbytes / 1e6,
            **{f"copy_ms_{k}": v for k, v in copy.items()},
            **{f"ours_ms_{k}": v for k, v in ours.items()},
        }
        ROWS.append(result)
        cells = [
            f"{self.share(nbytes, copy['zero'], 'zero'):.0f}%",
            f"{self.share(nbytes, ours['zero'], 'zero'):.0f}%",
            f"{100 * copy['zero'] / ours['zero']:.0f}%",
            f"{self.share(nbytes, copy['read'], 'read'):.0f}%",
            f"{self.share(nbytes, ours['read'], 'read'):.0f}%",
        ]
        print(f"| {op} | {case} | {nbytes / 1e6:.1f} | " + " | ".join(cells) + " |", flush=True)


def resize_cases(ceiling: Ceiling) -> None:
    for (n, c, h, w), (ho, wo) in RESIZE_SIZES:
        for dtype in (torch.float32, torch.float16):
            x = torch.randn(n, c, h, w, device=DEV).to(dtype)
            size = torch.empty(1, 1, ho, wo, device=DEV, dtype=dtype)
            nbytes = (x.numel() + n * c * ho * wo) * x.element_size()
            fn = kernel_fn(DynamicResize, [x, size], {"align_corners": False})
            ceiling.row("DynamicResize", f"{n}x{c}x{h}x{w} -> {ho}x{wo} {dtype_name(dtype)}", nbytes, fn)


def grid_cases(ceiling: Ceiling) -> None:
    from opbridge.ops import _detection_triton as tk

    names = {0: "bilinear", 1: "nearest", 2: "bicubic"}
    for n, c, h, w in GRID_SIZES:
        for dtype in (torch.float32, torch.float16):
            x, grids = grid_kinds(n, c, h, w, dtype)
            out = torch.empty_like(x)
            nbytes = (2 * x.numel() + n * h * w * 2) * x.element_size()
            for mode, name in names.items():
                for grid_name, grid in grids.items():
                    fn = lambda: tk.grid_sample(x, grid, out, mode, 0, False)
                    case = f"{n}x{c}x{h}x{w} {dtype_name(dtype)} {name}, {grid_name}"
                    ceiling.row("grid_sampler", case, nbytes, fn)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="resize,grid", help="comma-separated: resize,grid")
    parser.add_argument("--json", help="write the rows as JSON here")
    args = parser.parse_args(argv)
    problem = unavailable("gpu_copy_ceiling.py", "triton")
    if problem:
        print(problem, file=sys.stderr)
        return 2
    import triton

    read_flush()  # before the copies' buffers, as when it was allocated at import
    ceiling = Ceiling()
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"{stamp} {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    print(
        f"1 GiB copy: {ceiling.rate['zero']:.0f} GB/s (zeroing flush), {ceiling.rate['read']:.0f} GB/s (reading flush)"
    )
    print(
        "| op | case | MB | same-size copy, % of 1 GiB rate (ceiling) | ours, % of 1 GiB rate | ours, % of same-size "
        "copy | reading flush: copy % | reading flush: ours % |"
    )
    print("|---|---|---|---|---|---|---|---|")
    only = args.only.split(",")
    if "resize" in only:
        resize_cases(ceiling)
    if "grid" in only:
        grid_cases(ceiling)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"when": stamp, "copy_gbs": ceiling.rate, "rows": ROWS}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
