"""opbridge's native CPU kernels (the C extension ``opbridge.ops._cpu_kernels``): loading, and
splitting a call's work over threads.

The extension's functions release the GIL, so Python threads run them in parallel; each takes a
range of its work (output points, planes or rows). Up to ``torch.get_num_threads()`` threads work
on one call, where it has enough work to share.

Example:
    >>> ranges(10, 3)
    [(0, 4), (4, 8), (8, 10)]
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import os
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import torch

__all__ = [
    "available",
    "deliver",
    "module",
    "output_buffer",
    "ranges",
    "require",
    "run",
    "scratch",
    "split",
    "threads_for",
]

logger = logging.getLogger(__name__)


@functools.cache
def _load() -> tuple[ModuleType | None, str]:
    """The extension and ``""``, or None and why it does not import (not built, or built but not loading)."""
    try:
        from opbridge.ops import _cpu_kernels
    except ImportError as err:
        from opbridge.onnxruntime._native import unloadable

        return None, unloadable("opbridge.ops._cpu_kernels", "native CPU kernel extension", err)
    return _cpu_kernels, ""


@functools.cache
def module() -> ModuleType | None:
    """The extension, or None where it does not import (a warning says why once)."""
    native, why = _load()
    if native is None:  # PyTorch's kernels run instead
        logger.warning("%s PyTorch's CPU kernels run instead.", why)
    return native


def available() -> bool:
    """Whether the native extension is importable (it is built with the package)."""
    return module() is not None


def require() -> ModuleType:
    """The extension, or a RuntimeError saying why it does not import and how to rebuild it."""
    native = module()
    if native is None:
        raise RuntimeError(_load()[1])
    return native


def output_buffer(op: str, out: torch.Tensor | None, want: tuple[int, ...]) -> torch.Tensor:
    """The contiguous float32 CPU tensor of shape ``want`` a kernel writes: ``out`` itself where it is
    one, else a new tensor (:func:`deliver` copies it into a non-contiguous ``out``). A ValueError
    naming ``op`` where ``out`` has another shape, dtype or device."""
    if out is not None and (tuple(out.shape) != want or out.dtype != torch.float32 or not out.is_cpu):
        raise ValueError(
            f"{op}: `out` must be a float32 CPU tensor of shape {want}, got {tuple(out.shape)} {out.dtype} on {out.device}."
        )
    return out if out is not None and out.is_contiguous() else torch.empty(want, dtype=torch.float32)


def deliver(out: torch.Tensor | None, target: torch.Tensor) -> torch.Tensor:
    """The result of a kernel that wrote ``target`` (from :func:`output_buffer`): ``out`` where given."""
    if out is not None and target is not out:
        return out.copy_(target)
    return target


# Working copies of at most this many bytes (an image of 64 x 256 x 256 floats) are kept for the
# calling thread's next call: a fresh allocation per call cost up to 0.7 ms of page faults at
# 1x16x128x128 in grid_sample (benchmarks/cpu_ops.py). The native kernels keep theirs the same way.
_KEEP_BYTES = 16 << 20
_kept = threading.local()


def scratch(elements: int) -> Any:
    """A float32 numpy buffer of ``elements`` values for a kernel's working copy (a channels-last
    image): the calling thread's kept buffer where it takes at most 16 MiB, else a fresh one. Its
    contents are the caller's until the thread's next call."""
    kept = getattr(_kept, "buffer", None)
    if kept is not None and kept.size >= elements:
        return kept[:elements]
    buffer = torch.empty(elements).numpy()
    if elements * 4 <= _KEEP_BYTES:
        _kept.buffer = buffer
    return buffer


def threads_for(work: int, per_thread: int) -> int:
    """Threads for ``work`` units where each thread should get at least ``per_thread`` of them:
    at most ``torch.get_num_threads()``, at least one."""
    return max(1, min(torch.get_num_threads(), work // max(1, per_thread)))


def ranges(total: int, parts: int) -> list[tuple[int, int]]:
    """``[0, total)`` in at most ``parts`` consecutive ranges of nearly equal size."""
    step = max(1, -(-total // max(1, parts)))
    return [(i, min(i + step, total)) for i in range(0, total, step)]


@functools.cache
def _pool(workers: int, pid: int) -> concurrent.futures.ThreadPoolExecutor:
    # one pool per process: a forked child does not inherit the parent's worker threads
    return concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="opbridge-cpu")


def run(calls: Sequence[Callable[[], object]]) -> None:
    """Run the calls, on as many threads as there are calls; the first error is raised."""
    if len(calls) == 1:
        calls[0]()
        return
    for future in [_pool(len(calls), os.getpid()).submit(call) for call in calls]:
        future.result()


def split(fn: Callable[..., object], args: tuple[Any, ...], total: int, threads: int) -> None:
    """``fn(*args, start, end)`` over ``[0, total)`` in up to ``threads`` ranges, one thread each (see
    :func:`run`); one thread calls ``fn`` straight, without the split's Python cost (a fifth of a
    small image's time in grid_sample)."""
    if threads <= 1:
        fn(*args, 0, total)
        return
    run([functools.partial(fn, *args, a, b) for a, b in ranges(total, threads)])
