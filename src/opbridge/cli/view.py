"""``opbridge view MODEL``: serve the model in Netron on localhost and print the URL."""

from __future__ import annotations

import argparse

__all__ = ["add_parser"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("view", help="open the model in Netron (served on localhost)")
    p.add_argument("model", help="path of the .onnx file")
    p.add_argument(
        "--port", type=int, default=None, help="port to serve on (default: Netron's choice, 0 = any free port)"
    )
    p.add_argument("--host", default="localhost", help="address to bind (default localhost)")
    p.add_argument("--no-browser", action="store_true", help="do not open a browser (headless machines)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from opbridge.graph.view import serve_model

    server = serve_model(args.model, port=args.port, host=args.host, browse=not args.no_browser)
    try:
        print(f"serving {args.model} at {server.url} (Ctrl-C to stop)", flush=True)
        server.wait()
    except KeyboardInterrupt:  # Ctrl-C before wait() took it over: a stop all the same
        server.stop()
    return 0
