"""Memory kept per session created and dropped: opbridge's ONNX Runtime and OpenVINO paths against the bare runtimes.

A server that reloads models creates and drops sessions for as long as it runs: any memory a session
leaves behind adds up. Each case here creates a session (or loads a runner), runs it once and drops it,
``--sessions`` times (``--loads`` for OpenVINO) after a warm-up, with ``gc.collect()`` at both ends, and
prints what the process holds more afterwards, per session:

- "heap": bytes in use in the C heap (glibc's ``mallinfo2``: ``uordblks + hblkhd``), exact to the byte;
- "RSS": resident memory (``VmRSS`` in ``/proc/self/status``), which also moves with the allocator's
  free pages and thread stacks (noise of a few hundred bytes per session at these counts).

The cases, each beside its baseline (the same runtime on a model of standard ops, no opbridge):

- ``ort``: ``onnxruntime.InferenceSession`` of three standard ops (the baseline: ONNX Runtime's own growth)
  against ``opbridge.InferenceSession`` of three custom op types bridged to numpy kernels; with
  tracemalloc's largest Python-side growth for the latter, and the bridge's count of live op entries.
- ``openvino``: ``Core().compile_model`` of the standard-op model (the baseline) against
  ``OpenVINORunner`` of the custom-op model, and of a model with 4 MiB of weights upstream of one custom
  op (what each load keeps of the model's weights).

Usage:
    PYTHONPATH=src python benchmarks/session_memory.py [--sessions 2000] [--loads 200] [--only ort,openvino]
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import sys
import tempfile
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np

DOMAIN = "bench.memory"
#: elements of the weight upstream of the custom op in the "weights" OpenVINO case (4 MiB of float32)
WEIGHTS = 1 << 20


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")
    ] + [("keepcost", ctypes.c_size_t)]


def _mallinfo() -> tuple[Callable[[], int] | None, Callable[[], None]]:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
    except (OSError, AttributeError):  # not glibc >= 2.33
        return None, lambda: None

    def heap() -> int:
        info = libc.mallinfo2()
        return int(info.uordblks + info.hblkhd)

    def trim() -> None:
        libc.malloc_trim(0)

    return heap, trim


_HEAP, _TRIM = _mallinfo()


def heap_bytes() -> int:
    """Bytes in use in the C heap (0 where glibc's mallinfo2 is missing)."""
    return _HEAP() if _HEAP is not None else 0


def rss_bytes() -> int:
    """The process's resident memory (VmRSS), after the allocator gave its free pages back."""
    _TRIM()
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def growth(make: Callable[[], None], count: int, warm: int) -> tuple[float, float]:
    """(heap, RSS) bytes kept per call of ``make`` over ``count`` calls, after ``warm`` calls."""
    for _ in range(warm):
        make()
    gc.collect()
    heap0, rss0 = heap_bytes(), rss_bytes()
    for _ in range(count):
        make()
    gc.collect()
    return (heap_bytes() - heap0) / count, (rss_bytes() - rss0) / count


def python_growth(make: Callable[[], None], count: int, top: int = 3) -> tuple[float, list[str]]:
    """tracemalloc: Python bytes kept per call of ``make``, and the largest growths by line."""
    make()
    gc.collect()
    tracemalloc.start(6)
    before = tracemalloc.take_snapshot()
    for _ in range(count):
        make()
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    stats = after.compare_to(before, "traceback")
    total = sum(s.size_diff for s in stats) / count
    lines = []
    for stat in stats[:top]:
        frame = stat.traceback[-1]
        lines.append(f"{stat.size_diff / count:9.1f} B  {os.path.basename(frame.filename)}:{frame.lineno}")
    return total, lines


def three_op_model(custom: bool, weights: int = 0) -> Any:
    """x -> three unary nodes -> y: custom op types of DOMAIN, or Relu/Abs/Neg. With ``weights``, an Add
    of that many float32 weights feeds the first node (and the model runs one custom node)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    ops = ["MemA", "MemB", "MemC"] if custom else ["Relu", "Abs", "Neg"]
    size = weights or 4
    nodes, inits, first = [], [], "x"
    if weights:
        rng = np.random.default_rng(0)
        inits.append(numpy_helper.from_array(rng.random(weights, dtype=np.float32), name="w"))
        nodes.append(helper.make_node("Add", ["x", "w"], ["v0"], name="add"))
        first, ops = "v0", ops[:1]
    names = [first] + [f"v{i + 1}" for i in range(len(ops) - 1)] + ["y"]
    for i, op in enumerate(ops):
        domain = DOMAIN if custom else ""
        nodes.append(helper.make_node(op, [names[i]], [names[i + 1]], domain=domain, name=f"n{i}"))
    graph = helper.make_graph(
        nodes,
        "session_memory",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [size])],
        inits,
    )
    imports = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(DOMAIN, 1)] if custom else [])
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def register_kernels() -> None:
    """numpy kernels for the three custom op types."""
    import opbridge

    opbridge.kernel("MemA", domain=DOMAIN)(lambda x: x + 1)
    opbridge.kernel("MemB", domain=DOMAIN)(lambda x: x * 2)
    opbridge.kernel("MemC", domain=DOMAIN)(lambda x: -x)


def _row(case: str, per: tuple[float, float], unit: str) -> None:
    heap, rss = per
    print(f"  {case:<54} heap {heap:10.1f} B/{unit}   RSS {rss:10.1f} B/{unit}")


def bench_ort(sessions: int) -> None:
    import onnxruntime as ort

    import opbridge
    from opbridge.onnxruntime import _native

    plain = three_op_model(False).SerializeToString()
    custom = three_op_model(True)
    feed = {"x": np.ones(4, np.float32)}
    warm = max(100, sessions // 10)

    def bare() -> None:
        ort.InferenceSession(plain, providers=["CPUExecutionProvider"]).run(None, feed)

    def bridged() -> None:
        opbridge.InferenceSession(custom).run(None, feed)

    print(f"ONNX Runtime {ort.__version__}: {sessions} sessions created, run once and dropped (after {warm})")
    _row("onnxruntime.InferenceSession, 3 standard ops", growth(bare, sessions, warm), "session")
    _row("opbridge.InferenceSession, 3 custom op types", growth(bridged, sessions, warm), "session")
    total, lines = python_growth(bridged, min(sessions, 500))
    print(f"  Python (tracemalloc) per opbridge session: {total:.1f} B; largest:")
    for line in lines:
        print(f"    {line}")
    report = _native.module().abi_report()
    print(f"  bridge op entries alive after the sessions: {report.get('live_ops', 'not counted (older build)')}")


def bench_openvino(loads: int) -> None:
    import onnx
    import openvino as ov

    from opbridge.backends.openvino_backend import OpenVINORunner

    feed = {"x": np.ones(4, np.float32)}
    heavy_feed = {"x": np.ones(WEIGHTS, np.float32)}
    custom = three_op_model(True)
    heavy = three_op_model(True, weights=WEIGHTS)
    warm = max(10, loads // 10)
    with tempfile.TemporaryDirectory(prefix="opbridge_memory_") as tmp:
        path = os.path.join(tmp, "plain.onnx")
        onnx.save(three_op_model(False), path)

        def bare() -> None:
            core = ov.Core()
            core.compile_model(core.read_model(path), "CPU").create_infer_request().infer(feed)

        def runner() -> None:
            with OpenVINORunner(custom) as r:
                r.infer(feed)

        def weighted() -> None:
            with OpenVINORunner(heavy) as r:
                r.infer(heavy_feed)

        print(f"OpenVINO {ov.get_version()}: {loads} loads, run once and closed (after {warm})")
        _row("Core().compile_model, 3 standard ops", growth(bare, loads, warm), "load")
        _row("OpenVINORunner, 3 custom op types", growth(runner, loads, warm), "load")
        _row("OpenVINORunner, 4 MiB weights upstream of a custom op", growth(weighted, max(5, loads // 10), 3), "load")
        total, lines = python_growth(runner, min(loads, 100))
        print(f"  Python (tracemalloc) per runner load: {total:.1f} B; largest:")
        for line in lines:
            print(f"    {line}")


SECTIONS = ("ort", "openvino")  # the names --only takes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=2000, help="ONNX Runtime sessions per case")
    parser.add_argument("--loads", type=int, default=200, help="OpenVINO runner loads per case")
    parser.add_argument("--only", default="ort,openvino", help="comma-separated: ort, openvino")
    args = parser.parse_args(argv)
    only = {w.strip() for w in args.only.split(",") if w.strip()}
    unknown = sorted(only - set(SECTIONS))
    if unknown:
        parser.error(f"--only: unknown section(s) {', '.join(unknown)}; valid: {', '.join(SECTIONS)}")
    if _HEAP is None:
        print("(glibc's mallinfo2 is missing here: heap columns read 0)")
    register_kernels()
    if "ort" in only:
        bench_ort(args.sessions)
    if "openvino" in only:
        try:
            import openvino  # noqa: F401
        except ImportError:
            print("OpenVINO is not installed: its cases are skipped")
        else:
            bench_openvino(args.loads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
