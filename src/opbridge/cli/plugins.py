"""``opbridge plugins``: register the TensorRT plugins generated from the op specs and list them."""

from __future__ import annotations

import argparse
import json

from opbridge.cli._common import add_ops_argument, json_for_stdout

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plugins", help="register and list the TensorRT plugin creators made from the op specs")
    p.add_argument("--all", action="store_true", help="also list creators opbridge did not make")
    p.add_argument("--json", action="store_true", help="print JSON")
    add_ops_argument(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from opbridge._loading import load_ops
    from opbridge.tensorrt import list_plugins, load_tensorrt, register_plugins

    load_ops(args.ops)
    _, backend = load_tensorrt()
    register_plugins()
    infos = list_plugins(include_all=args.all)
    if args.json:
        print(
            json_for_stdout(
                json.dumps(
                    {
                        "backend": backend,
                        "plugins": [
                            {
                                "name": i.name,
                                "version": i.version,
                                "namespace": i.namespace,
                                "op": i.op,
                                "fields": [
                                    {"name": n, "type": t, "attribute": a}
                                    for (n, t), a in zip(i.fields, i.attributes or (None,) * len(i.fields))
                                ],
                            }
                            for i in infos
                        ],
                    },
                    ensure_ascii=False,
                    indent=2,
                )
            )
        )
    else:
        print(f"TensorRT backend: {backend}; {len(infos)} creator(s)")
        for info in infos:
            print("  " + info.describe())
    return 0
