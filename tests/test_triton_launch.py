"""Direct launches of compiled Triton kernels (opbridge.ops._triton_launch).

The key tests run anywhere; the launch tests need a CUDA GPU. The one that matters most checks,
against the installed Triton's own JIT, that two argument lists with the same cache key always get
the same compiled kernel: the key is at least as fine as Triton's specialization.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch

triton = pytest.importorskip("triton", reason="the GPU kernels are written in Triton")
tl = pytest.importorskip("triton.language")

from opbridge.ops import _triton_launch as tlaunch  # noqa: E402

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")


@triton.jit
def _axpy_kernel(x_ptr, y_ptr, n, scale, BLOCK: tl.constexpr, SHIFT: tl.constexpr = 0.0):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=m) * scale + SHIFT, mask=m)


def test_arg_key_separates_what_triton_specializes() -> None:
    x = torch.zeros(8)
    assert tlaunch.arg_key(x) != tlaunch.arg_key(x[1:]), "16-byte alignment"
    assert tlaunch.arg_key(x) != tlaunch.arg_key(x.half()), "dtype"
    assert tlaunch.arg_key(1) != tlaunch.arg_key(3), "the value 1"
    assert tlaunch.arg_key(16) != tlaunch.arg_key(17), "divisibility by 16"
    assert tlaunch.arg_key(-16) == tlaunch.arg_key(16)
    assert tlaunch.arg_key(2**31 - 16) != tlaunch.arg_key(2**31), "32-bit range"
    assert tlaunch.arg_key(2**63) != tlaunch.arg_key(2**62), "unsigned 64-bit range"
    assert tlaunch.arg_key(True) != tlaunch.arg_key(1) and tlaunch.arg_key(True) != tlaunch.arg_key(False)
    assert tlaunch.arg_key(0.5) == tlaunch.arg_key(2.0) != tlaunch.arg_key(2)
    assert tlaunch.arg_key("text") is None and tlaunch.arg_key(None) is None


@pytest.mark.parametrize("env", ["OPBRIDGE_TRITON_JIT_LAUNCH", "TRITON_INTERPRET"])
def test_direct_launch_can_be_turned_off(monkeypatch: pytest.MonkeyPatch, env: str) -> None:
    tlaunch.direct_launch_supported.cache_clear()
    try:
        monkeypatch.setenv(env, "1")
        assert not tlaunch.direct_launch_supported()
    finally:
        monkeypatch.undo()
        tlaunch.direct_launch_supported.cache_clear()


def _jit(x: torch.Tensor, y: torch.Tensor, n: int, scale: float, **kw: Any) -> Any:
    return _axpy_kernel[(triton.cdiv(max(n, 1), 128),)](x, y, n, scale, BLOCK=128, **kw)


@needs_gpu
def test_key_is_at_least_as_fine_as_triton() -> None:
    """Argument lists with the same key get the same compiled kernel from Triton's own JIT."""
    compiled: dict[tuple, set[int]] = {}
    for dtype, n in itertools.product((torch.float32, torch.float16), (1, 2, 16, 17, 32, 48)):
        base = torch.arange(64, device="cuda").to(dtype)
        out = torch.empty(64, dtype=dtype, device="cuda")
        for x, y in itertools.product((base, base[1:], base[16:]), (out, out[1:])):  # 16-byte aligned or not
            kernel = _jit(x, y, n, 2.0)
            key = tuple(map(tlaunch.arg_key, (x, y, n, 2.0)))
            compiled.setdefault(key, set()).add(id(kernel))
    assert len(compiled) == 2 * 3 * 2 * 2  # dtypes x n (1, a multiple of 16, other) x alignment of x, of y
    shared = {k: v for k, v in compiled.items() if len(v) > 1}
    assert not shared, f"one key, several compiled kernels: {shared}"


@needs_gpu
@pytest.mark.parametrize("shift", [None, 1.5], ids=["default-constexpr", "given-constexpr"])
def test_direct_launch_matches_the_jit(shift: float | None) -> None:
    if not tlaunch.direct_launch_supported():
        pytest.skip(f"Triton {triton.__version__} launches through its JIT here (not in _DIRECT_VERSIONS)")
    kw = {} if shift is None else {"SHIFT": shift}
    x = torch.randn(1000, device="cuda")
    for step in range(3):  # the first launch fills the cache, the others launch directly
        y = torch.full_like(x, float("nan"))
        tlaunch.launch(_axpy_kernel, (8,), x + step, y, 1000, 0.5, BLOCK=128, **kw)
        torch.testing.assert_close(y, (x + step) * 0.5 + (shift or 0.0), rtol=0, atol=0)
    entries = [
        e for k, e in tlaunch._CACHE.items() if k[0] == id(_axpy_kernel) and k[3] == (("BLOCK", 128), *kw.items())
    ]
    assert entries and all(e is not None for e in entries), "the launches did not take the direct path"


@needs_gpu
def test_direct_launch_uses_the_current_stream() -> None:
    x = torch.randn(4096, device="cuda")
    y = torch.zeros_like(x)
    tlaunch.launch(_axpy_kernel, (32,), x, y, 4096, 2.0, BLOCK=128)  # compile, fill the cache
    y.zero_()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # keeps the side stream busy for tens of milliseconds
        tlaunch.launch(_axpy_kernel, (32,), x, y, 4096, 2.0, BLOCK=128)
    early = y.cpu()  # the default stream does not wait for the side stream
    torch.cuda.synchronize()
    assert not early.any(), "the kernel ran on the default stream, not the current (side) one"
    torch.testing.assert_close(y, x * 2.0, rtol=0, atol=0)


@needs_gpu
def test_direct_launch_calls_launch_hooks() -> None:
    """A profiler's launch hook sees direct launches too."""
    if not tlaunch.direct_launch_supported():
        pytest.skip(f"Triton {triton.__version__} launches through its JIT here (not in _DIRECT_VERSIONS)")
    from triton import knobs

    seen: list[Any] = []
    before = knobs.runtime.launch_enter_hook
    if hasattr(before, "add"):  # a hook chain
        before.add(seen.append)
    else:
        knobs.runtime.launch_enter_hook = seen.append
    try:
        x = torch.randn(256, device="cuda")
        y = torch.empty_like(x)
        for _ in range(3):
            tlaunch.launch(_axpy_kernel, (2,), x, y, 256, 3.0, BLOCK=128)
    finally:
        if hasattr(before, "remove"):
            before.remove(seen.append)
        else:
            knobs.runtime.launch_enter_hook = before
    assert len(seen) == 3
    torch.testing.assert_close(y, x * 3.0, rtol=0, atol=0)
