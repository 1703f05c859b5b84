"""``opbridge lint MODEL``: findings a runtime would hit; exit code 1 when any is an error."""

from __future__ import annotations

import argparse
import json

from opbridge.cli._common import add_ops_argument, json_for_stdout

__all__ = ["add_parser"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("lint", help="check an ONNX model for custom-op and backend problems")
    p.add_argument("model", help="path of the .onnx file")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    add_ops_argument(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from opbridge._loading import load_ops
    from opbridge.graph.lint import has_errors, lint_model

    load_ops(args.ops)
    findings = lint_model(args.model)
    if args.json:
        print(json_for_stdout(json.dumps([f.to_dict() for f in findings], indent=2, ensure_ascii=False)))
    else:
        from opbridge._text import printable

        for f in findings:
            print(printable(str(f)))
        counts = {s: sum(f.severity == s for f in findings) for s in ("error", "warning", "info")}
        print(f"{args.model}: {counts['error']} error(s), {counts['warning']} warning(s), {counts['info']} info")
    return 1 if has_errors(findings) else 0
