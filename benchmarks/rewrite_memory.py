"""Peak resident memory of ``opbridge rewrite`` on a model with large weights, as a ratio to its size.

The model: a cubic ``Resize`` whose sizes are computed at run time (``Shape(X) * [1, 1, 2, 2]``, which
``resize-cubic-to-dynamic-resize`` rewrites) beside a chain of ``MatMul`` nodes whose weights add up
to ``--mib`` MiB. It is written twice, with its weights inside the .onnx file ("embedded") and in an
external data file ("external"), and each is rewritten by :func:`opbridge.graph.rewrite.rewrite_file`
in a fresh Python process, which reports its peak resident set (``VmHWM`` in ``/proc/self/status``). The output's
weights are compared byte for byte with the input's.

"peak / model" is the process's peak over the model's weight bytes; "added / model" leaves out what
the process held before the rewrite (Python and the imports, measured after a rewrite of a tiny model
of the same form). With ``--src DIR`` (repeatable), the
same cases also run on other source trees (e.g. an older checkout's ``src``), side by side.

Usage:
    PYTHONPATH=src python benchmarks/rewrite_memory.py [--mib 256] [--src OTHER/src ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

RULE = "resize-cubic-to-dynamic-resize"
#: one weight matrix: 2048 x 2048 float32, 16 MiB
SIDE = 2048


def build(folder: Path, mib: int, side: int = SIDE) -> dict[str, Path]:
    """The model with ``mib`` MiB of weights (``side`` x ``side`` matrices), as ``embedded`` and
    ``external`` files in ``folder``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    count = max(1, mib * (1 << 20) // (side * side * 4))
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.random((side, side), dtype=np.float32), name=f"w{i}") for i in range(count)]
    inits.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.int64), name="factor"))
    nodes = [
        helper.make_node("Shape", ["X"], ["xshape"], name="shape"),
        helper.make_node("Mul", ["xshape", "factor"], ["sizes"], name="sizes_mul"),
        helper.make_node("Resize", ["X", "", "", "sizes"], ["Y"], name="resize", mode="cubic", cubic_coeff_a=-0.75),
    ]
    value = "v"
    for i in range(count):
        nodes.append(helper.make_node("MatMul", [value, f"w{i}"], [f"m{i}"], name=f"matmul{i}"))
        value = f"m{i}"
    graph = helper.make_graph(
        nodes,
        "rewrite_memory",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 3, "H", "W"]),
            helper.make_tensor_value_info("v", TensorProto.FLOAT, [1, side]),
        ],
        [
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, None),
            helper.make_tensor_value_info(value, TensorProto.FLOAT, [1, side]),
        ],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    paths = {"embedded": folder / "embedded.onnx", "external": folder / "external.onnx"}
    onnx.save_model(model, paths["embedded"])
    onnx.save_model(model, paths["external"], save_as_external_data=True, location="external.onnx.data")
    return paths


def weight_bytes(path: Path) -> int:
    """The bytes of the model's initializers (its weights), read without loading them."""
    import onnx

    light = onnx.load(path, load_external_data=False)
    total = 0
    for t in light.graph.initializer:
        length = {e.key: e.value for e in t.external_data}.get("length")
        total += int(length) if length is not None else len(t.raw_data)
    return total


def digests(path: Path) -> dict[str, str]:
    """Per initializer, a hash of its bytes."""
    import hashlib

    import onnx

    return {t.name: hashlib.sha256(t.raw_data).hexdigest() for t in onnx.load(path).graph.initializer}


def peak_rss() -> int:
    """This process's peak resident set in bytes (``VmHWM``: ``ru_maxrss`` would keep the peak of the
    parent that started it, which survives ``exec``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise SystemExit("no VmHWM in /proc/self/status: this benchmark reads Linux's peak resident set")


def child(source: str, output: str) -> None:
    """Rewrite ``source`` into ``output`` and print the peak resident set, before and after, as JSON
    ("before": after a rewrite of a tiny model of the same form, which imports what the rewrite uses)."""
    from opbridge.graph.rewrite import rewrite_file

    with tempfile.TemporaryDirectory(prefix="rewrite-memory-warm-") as tmp:
        tiny = build(Path(tmp), 0, side=8)[Path(source).stem]
        rewrite_file(tiny, Path(tmp) / "out" / tiny.name, [RULE])
    before = peak_rss()
    report = rewrite_file(source, output, [RULE])
    assert report.changed, [str(o) for o in report.outcomes]
    peak = peak_rss()
    print(json.dumps({"before": before, "peak": peak}))


def measure(src: str, source: Path, output: Path) -> dict[str, int]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, __file__, "--child", str(source), str(output)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"the rewrite of {source} with {src} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=256, help="weights in MiB (default 256)")
    parser.add_argument("--src", action="append", default=[], help="another source tree to measure too")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    here = str(Path(__file__).resolve().parent.parent / "src")
    trees = [here, *args.src]
    gib = 1 << 30
    with tempfile.TemporaryDirectory(prefix="rewrite-memory-") as tmp:
        folder = Path(tmp)
        paths = build(folder, args.mib)
        size = weight_bytes(paths["embedded"])
        print(f"model: {size / gib:.2f} GiB of weights; rule {RULE}; peak resident set of the rewrite's process")
        print(
            f"{'case':<10} {'source tree':<40} {'peak GiB':>9} {'peak / model':>13} {'added / model':>14}", flush=True
        )
        for case, path in paths.items():
            expected = digests(path)
            for tree in trees:
                out = folder / "out" / f"{case}.onnx"
                got = measure(tree, path, out)
                written = digests(out)
                if any(written.get(name) != digest for name, digest in expected.items()):
                    raise SystemExit(f"{case} with {tree}: the output's weights differ from the input's")
                added = got["peak"] - got["before"]
                print(
                    f"{case:<10} {tree[-40:]:<40} {got['peak'] / gib:>9.2f} {got['peak'] / size:>13.2f} "
                    f"{added / size:>14.2f}",
                    flush=True,
                )
                for f in out.parent.iterdir():
                    f.unlink()


if __name__ == "__main__":
    main()
