"""``opbridge inspect MODEL``: opsets, I/O, custom nodes, op counts and initializers of an ONNX file."""

from __future__ import annotations

import argparse

from opbridge.cli._common import json_for_stdout

__all__ = ["add_parser"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="summarize an ONNX model and its custom nodes")
    p.add_argument("model", help="path of the .onnx file")
    p.add_argument("--json", action="store_true", help="print JSON instead of the readable summary")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from opbridge.graph.inspect import inspect_model

    report = inspect_model(args.model)
    print(json_for_stdout(report.to_json()) if args.json else report.format_text())
    return 0
