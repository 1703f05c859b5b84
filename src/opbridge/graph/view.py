"""``opbridge view``: open a model in Netron, served on localhost.

Netron (``pip install 'opbridge[view]'``) serves the model and its viewer from a
local HTTP server thread; the browser is optional (``browse=False`` on a
headless machine: open the printed URL from anywhere that reaches it).

Example:
    >>> server = serve_model("model.onnx", port=0)  # doctest: +SKIP
    >>> server.url  # doctest: +SKIP
    'http://localhost:40123'
    >>> server.stop()  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from opbridge.errors import BackendUnavailableError, OpbridgeError

__all__ = ["NetronServer", "serve_model"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class NetronServer:
    """A running Netron server for one model."""

    host: str
    port: int
    path: Path

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def running(self) -> bool:
        import netron

        return bool(netron.status((self.host, self.port)))

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the server and wait (up to ``timeout`` seconds) for its thread to end; idempotent."""
        import time

        import netron

        netron.stop((self.host, self.port))
        deadline = time.monotonic() + timeout
        while self.running() and time.monotonic() < deadline:
            time.sleep(0.05)

    def wait(self) -> None:
        """Block until interrupted (Ctrl-C), then stop."""
        import time

        try:
            while self.running():
                time.sleep(0.2)
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()


def serve_model(
    model: str | os.PathLike[str], *, port: int | None = None, host: str = "localhost", browse: bool = False
) -> NetronServer:
    """Serve ``model`` with Netron at ``host:port`` (a free port when ``port`` is 0; Netron's choice when None).

    Raises:
        ModelLoadError: the file is missing or not an ONNX model.
        OpbridgeError: the port is out of range or taken.
        BackendUnavailableError: netron is not installed.
    """
    from opbridge.model_io import load_model

    path = Path(model)
    load_model(path)  # a missing, unreadable or non-ONNX file is named here, as by the other commands
    if port is not None and not 0 <= port <= 65535:
        raise OpbridgeError(f"port {port}: give 0 (any free port) to 65535.")
    if not host.strip():
        raise OpbridgeError("--host is empty: give an address to bind, e.g. localhost or 127.0.0.1.")
    import socket

    try:
        socket.getaddrinfo(host, None)
    except OSError as exc:  # netron would fail to find a port on it, or a bare ValueError
        raise OpbridgeError(f"--host {host!r}: not an address here ({exc.strerror or exc}); e.g. localhost.") from None
    try:
        import netron
    except ImportError as exc:
        raise BackendUnavailableError("netron is not installed: pip install 'opbridge[view]'") from exc
    try:
        address = netron.serve(str(path), None, address=(host, port), browse=browse)
    except OSError as exc:
        raise OpbridgeError(
            f"cannot serve on {host}:{port}: {exc.strerror or exc}; choose another --port (0: any free one)"
        ) from None
    server = NetronServer(address[0], int(address[1]), path)
    logger.info("serving %s at %s", path, server.url)
    return server
