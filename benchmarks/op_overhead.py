"""Per-call cost of an opbridge op in PyTorch against its reference and a bare torch.library custom op.

Eager: the median time per call of a trivial elementwise op (``x * sigmoid(x)``, and ``x *
sigmoid(beta * x)`` with a FLOAT attribute given at the call) three ways side by side: the plain
reference function, a ``torch.library.custom_op`` with the same body (a fake kernel and a backward
formula registered, as an opbridge op has), and the opbridge op; with plain inputs, inputs that
require grad, and those under ``torch.no_grad()``; on a tiny and a medium tensor. The three are
timed in turns, round after round, so that a shared machine's noise reaches them alike.

Compiled: a function calling ten ops whose output size depends on the data (a ``SymDim`` in the
shape rule), under ``torch.compile`` without ``fullgraph`` (each call is a graph break), against
the same function run eagerly, for opbridge ops and for bare custom ops; with the frames dynamo
compiled and whether it hit its recompile limit.

Usage:
    PYTHONPATH=src python benchmarks/op_overhead.py [--quick] [--src OTHER/src]

``--src`` imports opbridge from another source tree (e.g. an older checkout) to compare.
"""

# ruff: noqa: B023 - the lambdas built in loops are timed at once, inside the same iteration

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch


def per_call_us(fns: dict[str, Callable[[], Any]], rounds: int, calls: int) -> dict[str, float]:
    """Median over ``rounds`` of each function's mean time per call over ``calls`` calls, in turns."""
    for fn in fns.values():  # warm up
        for _ in range(max(calls // 4, 5)):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter_ns()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter_ns() - start) / calls / 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def eager_table(rounds: int, calls: int) -> None:
    import opbridge

    @opbridge.op("bench.overhead::Silu", shape=lambda x: opbridge.TensorInfo(x.shape, x.dtype))
    def silu(x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)

    @opbridge.op("bench.overhead::Swish", shape=lambda x, beta=1.0: opbridge.TensorInfo(x.shape, x.dtype))
    def swish(x: torch.Tensor, beta: float = 1.0) -> torch.Tensor:
        return x * torch.sigmoid(beta * x)

    @torch.library.custom_op("bench_overhead::silu", mutates_args=())
    def silu_lib(x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)

    @torch.library.custom_op("bench_overhead::swish", mutates_args=())
    def swish_lib(x: torch.Tensor, beta: float = 1.0) -> torch.Tensor:
        return x * torch.sigmoid(beta * x)

    for lib in (silu_lib, swish_lib):
        lib.register_fake(lambda x, beta=1.0: torch.empty_like(x))
        lib.register_autograd(_swish_backward, setup_context=_save_inputs)

    print(
        f"{'op':6s} {'size':>6s} {'inputs':22s} {'plain':>8s} {'custom_op':>10s} {'opbridge':>9s}   "
        f"{'opbridge/custom_op':>18s} {'opbridge/plain':>15s}"
    )
    for name, plain, lib, ours, attrs in (
        ("silu", silu.reference, silu_lib, silu, {}),
        ("swish", swish.reference, swish_lib, swish, {"beta": 0.5}),
    ):
        for size in (16, 64 * 1024):
            for inputs in ("plain", "requires_grad", "requires_grad, no_grad"):
                x = torch.randn(size, requires_grad=inputs != "plain")
                fns = {
                    "plain": lambda f=plain: f(x, **attrs),
                    "custom_op": lambda f=lib: f(x, **attrs),
                    "opbridge": lambda f=ours: f(x, **attrs),
                }
                with torch.no_grad() if "no_grad" in inputs else torch.enable_grad():
                    t = per_call_us(fns, rounds, calls if size < 1024 else max(calls // 10, 20))
                print(
                    f"{name:6s} {size:6d} {inputs:22s} {t['plain']:6.1f}us {t['custom_op']:8.1f}us "
                    f"{t['opbridge']:7.1f}us   {t['opbridge'] / t['custom_op']:18.2f} {t['opbridge'] / t['plain']:15.2f}",
                    flush=True,
                )


def _swish_backward(ctx: Any, grad: Any) -> tuple[Any, None]:
    (x,) = ctx.saved_tensors
    s = torch.sigmoid(ctx.beta * x)
    return grad * (s + ctx.beta * x * s * (1 - s)), None


def _save_inputs(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    ctx.save_for_backward(inputs[0])
    ctx.beta = inputs[1] if len(inputs) > 1 else 1.0


def compiled_table(rounds: int, calls: int) -> None:
    from torch._dynamo.utils import counters

    import opbridge

    def define(k: int) -> Callable[[Any], Any]:
        @opbridge.op(
            f"bench.overhead::Positives{k}", shape=lambda x: opbridge.TensorInfo((opbridge.SymDim(),), torch.int64)
        )
        def positives(x: torch.Tensor) -> torch.Tensor:
            return torch.nonzero(x > 0).flatten()

        return positives

    def define_lib(k: int) -> Callable[[Any], Any]:
        @torch.library.custom_op(f"bench_overhead::positives{k}", mutates_args=())
        def positives(x: torch.Tensor) -> torch.Tensor:
            return torch.nonzero(x > 0).flatten()

        @positives.register_fake
        def _(x: torch.Tensor) -> torch.Tensor:
            return x.new_empty((torch.library.get_ctx().new_dynamic_size(),), dtype=torch.int64)

        return positives

    x = torch.randn(256)
    print(
        f"\n{'ten ops of data-dependent output size':42s} {'eager':>9s} {'compiled':>9s} {'compiled/eager':>15s} "
        f"{'frames':>7s} {'recompile limit':>16s}"
    )
    for kind, ops in (("opbridge", [define(k) for k in range(10)]), ("custom_op", [define_lib(k) for k in range(10)])):
        a, b, c, d, e, f, g, h, i, j = ops

        def model(t: Any) -> Any:
            # (straight-line calls: a graph break inside a loop would skip the whole frame)
            s = a(t).sum() + 1
            s = b(t * 2).sum() + s
            s = c(t - 1).sum() + s
            s = d(t + 1).sum() + s
            s = e(t * 3).sum() + s
            s = f(t - 2).sum() + s
            s = g(t + 2).sum() + s
            s = h(t * 4).sum() + s
            s = i(t - 3).sum() + s
            return j(t + 3).sum() + s

        torch._dynamo.reset()
        counters.clear()
        compiled = torch.compile(model, backend="eager")
        assert torch.equal(compiled(x), model(x))
        t = per_call_us({"eager": lambda: model(x), "compiled": lambda: compiled(x)}, rounds, max(calls // 20, 10))
        frames = counters["frames"]["total"]
        limit = any("recompile limit" in k or "recompile_limit" in k for k in counters["unimplemented"])
        print(
            f"{kind:42s} {t['eager']:7.1f}us {t['compiled']:7.1f}us {t['compiled'] / t['eager']:15.2f} "
            f"{frames:7d} {'hit' if limit else 'not hit':>16s}",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    parser.add_argument("--src", help="import opbridge from this source tree")
    args = parser.parse_args(argv)
    if args.src:
        sys.path.insert(0, args.src)
    torch.set_num_threads(1)
    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)  # (the recompile-limit warning: counted instead)
    rounds, calls = (3, 200) if args.quick else (15, 2000)
    eager_table(rounds, calls)
    compiled_table(rounds, calls)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
