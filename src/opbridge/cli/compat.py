"""``opbridge compat MODEL --target T``: what a runtime does with each node; exit code 1 when the report
is not ok (a node fails statically, or the real backend fails: ``CompatReport.ok``)."""

from __future__ import annotations

import argparse

from opbridge.cli._common import add_ops_argument, json_for_stdout

__all__ = ["add_parser"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compat", help="per-node backend compatibility (tensorrt, onnxruntime, openvino)")
    p.add_argument("model", help="path of the .onnx file")
    p.add_argument(
        "--target", required=True, choices=("tensorrt", "onnxruntime", "openvino"), help="the runtime to check for"
    )
    p.add_argument(
        "--trt-version", default=None, help="TensorRT version for the static rules, e.g. 8.6 (default: newest)"
    )
    p.add_argument(
        "--no-real",
        action="store_true",
        help="static verdicts only; do not run the real backend (tensorrt, onnxruntime). openvino has no static "
        "rules: its verdicts always come from OpenVINO, which must be installed",
    )
    p.add_argument("--all", action="store_true", help="list natively supported nodes too")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    add_ops_argument(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from opbridge._loading import load_ops
    from opbridge.graph.compat import check_compat

    load_ops(args.ops)
    report = check_compat(args.model, args.target, real=not args.no_real, trt_version=args.trt_version)
    print(json_for_stdout(report.to_json()) if args.json else report.format_text(show_native=args.all))
    return 0 if report.ok else 1
