"""Compare compat's static ONNX Runtime verdicts with real sessions over many one-node models.

Usage:
    python tests/_ort_kernel_sweep.py

Builds one node of every ONNX op that takes one or two inputs and no required attribute, in 9 types, at
opsets 13, 17, 18, 20, 21 and 22 (the models the checker passes), and prints how often the static verdict
(fail or not) agrees with an ``InferenceSession`` of the installed onnxruntime, then each disagreement.
tests/test_graph_compat.py checks a handful of these cases on every run; docs/graph_tools.md gives the
figure this prints.
"""

from __future__ import annotations

import sys
from collections import Counter

import onnxruntime as ort
from _graph_models import one_op_model
from onnx import TensorProto, defs

from opbridge.graph import check_compat

TYPES = (
    TensorProto.FLOAT,
    TensorProto.FLOAT16,
    TensorProto.BFLOAT16,
    TensorProto.DOUBLE,
    TensorProto.INT8,
    TensorProto.UINT8,
    TensorProto.INT32,
    TensorProto.INT64,
    TensorProto.BOOL,
)
OPSETS = (13, 17, 18, 20, 21, 22)


def main() -> int:
    ort.set_default_logger_severity(3)
    ops = sorted(
        {
            (s.name, s.min_input)
            for s in defs.get_all_schemas()
            if s.domain == ""
            and not s.deprecated
            and 1 <= s.min_input <= 2
            and s.min_output == 1
            and not any(a.required for a in s.attributes.values())
        }
    )
    counts: Counter[tuple[bool, bool]] = Counter()
    disagreements = []
    for op, inputs in ops:
        for elem in TYPES:
            for opset in OPSETS:
                model = one_op_model(op, elem, opset, inputs)
                if model is None:
                    continue
                report = check_compat(model, "onnxruntime")
                (node,) = report.nodes
                static_ok = node.verdict != "fail"
                counts[static_ok, bool(report.real_ok)] += 1
                if static_ok != report.real_ok:
                    name = TensorProto.DataType.Name(elem).lower()
                    disagreements.append(
                        f"{op} {name} opset {opset}: {node.verdict} ({node.reason}); real: {node.real}"
                    )
    total = sum(counts.values())
    agree = counts[True, True] + counts[False, False]
    print(
        f"onnxruntime {ort.__version__}: {len(ops)} ops, {total} models; static verdict agrees with the session on {agree}"
    )
    print(f"  runs: {counts[True, True]}, fails: {counts[False, False]}")
    for line in disagreements:
        print("  disagree:", line)
    return 0 if agree == total else 1


if __name__ == "__main__":
    sys.exit(main())
