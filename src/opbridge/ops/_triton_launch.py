"""Triton kernel launches with less host work than ``kernel[grid](...)``.

``launch(kernel, grid, *args, **constexprs)`` does what ``kernel[grid](*args, **constexprs)``
does. The first launch of each specialization goes through Triton's JIT, which compiles the kernel
or finds it in its cache; later launches with the same specialization call that compiled kernel's
launcher directly. This skips the JIT's argument binding, option parsing and cache-key hashing: on
the H200 machine (Triton 3.6) a small kernel's launch takes 9.1 instead of 13.6 us of CPU time, and
a resize, grid_sample or DCNv2 call 1.2-1.5x less (benchmarks/gpu_launch.py, benchmarks/OPLIB.md).

The cache key is at least as fine as Triton's specialization of the arguments: each tensor's dtype
and 16-byte alignment; each int's equality to 1, divisibility by 16 and 32/64-bit range; the type of
other scalars; every keyword argument (constexprs and launch options) by value; the device.
Arguments of any other type, kernels whose runtime arguments are passed by keyword, the Triton
interpreter, and Triton versions outside ``_DIRECT_VERSIONS`` always take the JIT's path, as does
every launch while ``OPBRIDGE_TRITON_JIT_LAUNCH=1`` is set. A compiled kernel is reused only after
the JIT has returned it for that key, so nothing is compiled or chosen here.

Example:
    >>> from opbridge.ops._triton_launch import launch  # doctest: +SKIP
    >>> launch(silu_kernel, (cdiv(n, 1024),), x, out, n, BLOCK=1024)  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch
import triton

try:
    from triton import knobs
except ImportError:  # releases before knobs: never launched directly (_DIRECT_VERSIONS)
    knobs = None

__all__ = ["arg_key", "cdiv", "direct_launch_supported", "launch", "next_power_of_2"]

# Triton releases checked on a GPU (tests/test_triton_launch.py): CompiledKernel.run takes (grid x,
# y, z, stream, function, packed metadata, launch metadata, enter hook, exit hook, *all parameters,
# constexprs included) as the JIT calls it, and the key below is at least as fine as the JIT's.
_DIRECT_VERSIONS = ((3, 6),)
_I32 = 2**31
_U64 = 2**63

# (id of the kernel, device, argument keys, keyword items) -> (kernel, launcher, function, packed
# metadata, compiled kernel, constexpr tail), or None: this key always takes the JIT's path
_CACHE: dict[tuple[Any, ...], tuple[Any, ...] | None] = {}


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` of ints on the host (``triton.cdiv`` is a constexpr function: a host call
    of it costs more than a direct launch).

    >>> cdiv(7, 2), cdiv(8, 2), cdiv(0, 4)
    (4, 4, 0)
    """
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of 2 that is at least ``n`` (1 for ``n <= 1``), on the host.

    >>> next_power_of_2(1), next_power_of_2(48), next_power_of_2(64)
    (1, 64, 64)
    """
    return 1 << max(0, n - 1).bit_length()


def _version() -> tuple[int, int]:
    major, minor = triton.__version__.split(".")[:2]
    return int(major), int(minor)


@functools.cache
def direct_launch_supported() -> bool:
    """Whether compiled kernels are launched directly in this process: a Triton release in
    ``_DIRECT_VERSIONS``, not the interpreter, not ``OPBRIDGE_TRITON_JIT_LAUNCH=1``. Read once;
    ``direct_launch_supported.cache_clear()`` reads the environment again."""
    if knobs is None:
        return False
    if os.environ.get("OPBRIDGE_TRITON_JIT_LAUNCH", "0") not in ("", "0"):
        return False
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return False
    return _version() in _DIRECT_VERSIONS


def arg_key(arg: Any) -> Any:
    """What Triton specializes a runtime argument on, or finer; ``None`` for a type it is not
    known for (the launch then takes the JIT's path).

    >>> arg_key(1), arg_key(32), arg_key(33), arg_key(2**40)
    ((1, False, True, False), (0, True, True, False), (0, False, True, False), (0, True, False, False))
    """
    kind = type(arg)
    if kind is torch.Tensor:
        return (arg.dtype, arg.data_ptr() % 16 == 0)
    if kind is int:
        return (1 if arg == 1 else 0, arg % 16 == 0, -_I32 <= arg < _I32, arg >= _U64)
    if kind is float:
        return float
    if kind is bool:
        return (bool, arg)
    return None


def _fill(kernel: Any, key: tuple[Any, ...], compiled: Any, n_args: int, kwargs: dict[str, Any]) -> None:
    """Cache what a direct launch of ``compiled`` needs: every parameter after the runtime
    arguments must be a constexpr given by keyword or by default."""
    params = getattr(kernel, "params", None)
    if params is None or not all(hasattr(compiled, a) for a in ("run", "function", "packed_metadata")):
        _CACHE[key] = None
        return
    tail = []
    for param in params[n_args:]:
        if not param.is_constexpr:
            _CACHE[key] = None
            return
        if param.name in kwargs:
            tail.append(kwargs[param.name])
        elif param.has_default:
            tail.append(param.default)
        else:
            _CACHE[key] = None
            return
    _CACHE[key] = (kernel, compiled.run, compiled.function, compiled.packed_metadata, compiled, tuple(tail))


def _hook(hook: Any) -> Any:
    """A launch hook as the launcher takes it: ``None`` for an empty hook chain (Triton calls the
    chain, and builds its metadata, on every launch otherwise)."""
    return None if hook is None or getattr(hook, "calls", None) == [] else hook


def launch(kernel: Any, grid: tuple[int, ...], *args: Any, **kwargs: Any) -> None:
    """``kernel[grid](*args, **kwargs)`` on the current device and stream, launched directly
    once the JIT has returned the compiled kernel for this specialization."""
    if not direct_launch_supported():
        kernel[grid](*args, **kwargs)
        return
    keys = tuple(map(arg_key, args))
    if None in keys:
        kernel[grid](*args, **kwargs)
        return
    device = torch.cuda.current_device()
    key = (id(kernel), device, keys, tuple(kwargs.items()))
    try:
        entry = _CACHE.get(key)
    except TypeError:  # an unhashable keyword value
        kernel[grid](*args, **kwargs)
        return
    if (entry is None and key not in _CACHE) or (entry is not None and entry[0] is not kernel):
        compiled = kernel[grid](*args, **kwargs)
        _fill(kernel, key, compiled, len(args), kwargs)
        return
    if entry is None:
        kernel[grid](*args, **kwargs)
        return
    _, run, function, packed, compiled, tail = entry
    enter, leave = _hook(knobs.runtime.launch_enter_hook), _hook(knobs.runtime.launch_exit_hook)
    stream = torch._C._cuda_getCurrentRawStream(device)
    full = (*args, *tail)
    meta = compiled.launch_metadata(grid, stream, *full) if enter is not None else None
    size = len(grid)
    run(
        grid[0],
        grid[1] if size > 1 else 1,
        grid[2] if size > 2 else 1,
        stream,
        function,
        packed,
        meta,
        enter,
        leave,
        *full,
    )
