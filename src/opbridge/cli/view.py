"""``opbridge view MODEL``: serve the model in Netron on localhost and print the URL."""

from __future__ import annotations

import argparse

__all__ = ["add_parser"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("view", help="open the model in Netron (served on localhost)")
    p.add_argument("model", help="path of the .onnx file")
    p.add_argument("--port", type=int, default=None, help="port to serve on (default: any free port)")
    p.add_argument("--host", default="localhost", help="address to bind (default localhost)")
    p.add_argument("--no-browser", action="store_true", help="do not open a browser (headless machines)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Serve until Ctrl-C or SIGTERM; exit code 128 + the signal's number (130, 143), as a shell gives
    a command the signal ended."""
    import signal
    from types import FrameType

    from opbridge._text import printable
    from opbridge.graph.view import serve_model

    server = serve_model(args.model, port=args.port, host=args.host, browse=not args.no_browser)
    # Ctrl-C and SIGTERM stop the server, also in a process started with SIGINT ignored (a background
    # job of a shell script: Python then installs no KeyboardInterrupt handler)
    received: list[int] = []

    def interrupt(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        raise KeyboardInterrupt

    stops = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, interrupt) for s in stops}
    try:
        print(f"serving {printable(args.model)} at {server.url} (Ctrl-C to stop)", flush=True)
        server.wait()
    except KeyboardInterrupt:
        server.stop()  # (stopped by wait() already, unless the signal came before it)
        return 128 + (received[0] if received else signal.SIGINT)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 0
