"""``opbridge view``: open a model in Netron's viewer, served by a small local HTTP server.

Netron (``pip install 'opbridge[view]'``) provides the viewer (its page and scripts, drawn in the
browser); opbridge serves them, and the model, itself:

- only the model file and the external data files it names are served, never other files of its
  folder;
- a request whose ``Host`` is a name other than the one served is refused (a web page cannot reach
  the server through a name it controls, as in DNS rebinding);
- what comes from the model's path is escaped in the page;
- a free port is taken unless one is given; binding an address other than loopback is logged as a
  warning (anyone who reaches it can fetch the model).

The browser is optional (``browse=False`` on a headless machine: open the printed URL from anywhere
that reaches it).

Example:
    >>> server = serve_model("model.onnx", port=0)  # doctest: +SKIP
    >>> server.url  # doctest: +SKIP
    'http://localhost:40123'
    >>> server.stop()  # doctest: +SKIP
"""

from __future__ import annotations

import http.server
import ipaddress
import logging
import os
import socket
import socketserver
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from opbridge.errors import BackendUnavailableError, OpbridgeError

__all__ = ["NetronServer", "serve_model"]

logger = logging.getLogger(__name__)

# the viewer's files served by type (Netron's own Python files are not among them)
_ASSET_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript",
    ".css": "text/css",
    ".json": "application/json",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".svg": "image/svg+xml",
}


@dataclass(frozen=True)
class NetronServer:
    """A running viewer server for one model."""

    host: str
    port: int
    path: Path
    _httpd: Any = field(default=None, repr=False, compare=False)
    _thread: Any = field(default=None, repr=False, compare=False)

    @property
    def url(self) -> str:
        shown = self.host if ":" not in self.host else f"[{self.host}]"
        return f"http://{shown}:{self.port}"

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the server and wait (up to ``timeout`` seconds) for its thread to end; idempotent."""
        if self._httpd is None:
            return
        if self.running():
            self._httpd.shutdown()
            self._thread.join(timeout)
        self._httpd.server_close()

    def wait(self) -> None:
        """Block until the server stops or the caller is interrupted; the server is stopped either way,
        and an interrupt (Ctrl-C: KeyboardInterrupt) goes on to the caller."""
        try:
            while self.running():
                self._thread.join(0.2)
        finally:
            self.stop()


class _Handler(http.server.BaseHTTPRequestHandler):
    """Serves the viewer's assets and the model's files; each server has a subclass with its own."""

    assets: ClassVar[dict[str, Path]] = {}
    files: ClassVar[dict[str, Path]] = {}
    page: ClassVar[bytes] = b""
    hosts: ClassVar[frozenset[str]] = frozenset()
    server_version = "opbridge-view"
    timeout = 60  # (a connection left open does not keep a thread, or the process at exit, forever)

    def do_GET(self) -> None:
        self._serve(body=True)

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def _serve(self, body: bool) -> None:
        import urllib.parse

        host = (self.headers.get("Host") or "").strip().lower()
        if host.startswith("["):  # [::1]:8080
            name = host[1 : host.find("]")] if "]" in host else host
        else:
            name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
        if name and name not in self.hosts and not _is_address(name):
            self._plain(403, "this server answers requests for its own host only\n", body)
            return
        path = urllib.parse.unquote(urllib.parse.urlparse(self.path).path)
        if path in ("/", "/index.html"):
            self._send(200, _ASSET_TYPES[".html"], self.page, body)
            return
        if path.startswith("/data/") and path[len("/data/") :] in self.files:
            self._send_file(self.files[path[len("/data/") :]], "application/octet-stream", body)
            return
        asset = self.assets.get(path.lstrip("/"))
        if asset is None:
            self._plain(404, "not found\n", body)
            return
        self._send_file(asset, _ASSET_TYPES[asset.suffix], body)

    def _plain(self, status: int, text: str, body: bool) -> None:
        self._send(status, "text/plain; charset=utf-8", text.encode(), body)

    def _send(self, status: int, content_type: str, data: bytes, body: bool) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _send_file(self, path: Path, content_type: str, body: bool) -> None:
        import shutil

        try:
            handle = open(path, "rb")
        except OSError:
            self._plain(404, "not found\n", body)
            return
        try:
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(os.fstat(handle.fileno()).st_size))
            self.end_headers()
            if body:
                shutil.copyfileobj(handle, self.wfile, 1 << 20)  # (a large data file is not read whole)
        finally:
            handle.close()

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except (BrokenPipeError, ConnectionResetError, TimeoutError):  # the client went away: nothing to say
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s %s", self.address_string(), format % args)


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True  # (a browser's open connection does not hold the process at exit)
    allow_reuse_address = True


def _is_address(name: str) -> bool:
    """Whether ``name`` is an IP address (which a web page cannot make resolve elsewhere)."""
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _viewer_assets() -> tuple[dict[str, Path], str]:
    """Netron's viewer files by URL name, and its page; BackendUnavailableError without Netron."""
    try:
        import netron
    except ImportError as exc:
        raise BackendUnavailableError("netron is not installed: pip install 'opbridge[view]'") from exc
    folder = Path(netron.__file__).parent
    assets = {p.name: p for p in folder.iterdir() if p.is_file() and p.suffix in _ASSET_TYPES}
    if "index.html" not in assets:
        raise BackendUnavailableError(f"netron at {folder} has no viewer page (index.html); reinstall it.")
    return assets, assets["index.html"].read_text(encoding="utf-8")


def _page(template: str, model: Path) -> bytes:
    """The viewer's page told which file to open: names from the model's path escaped."""
    import html
    import re
    import urllib.parse

    version = re.search(r'<meta name="version" content="([^"]*)">', template)
    meta = "\n".join(
        [
            '<meta name="type" content="Python">',
            f'<meta name="version" content="{html.escape(version.group(1) if version else "")}">',
            f'<meta name="file" content="/data/{html.escape(urllib.parse.quote(model.name))}">',
            f'<meta name="name" content="{html.escape(model.name)}">',
            f'<meta name="identifier" content="{html.escape(model.name)}">',
        ]
    )
    return re.sub(r'<meta name="version" content="[^"]*">', lambda _: meta, template, count=1).encode("utf-8")


def _model_files(path: Path) -> dict[str, Path]:
    """The files the viewer may fetch, by the name it asks for: the model and its external data files
    (by their locations, relative to the model). A location outside the model's folder (absolute, with
    ``..``, or through a link that leads out), which ONNX itself refuses, is not served: a model file
    must not open the rest of the disk to the viewer's clients."""
    from opbridge.model_io import external_files

    base = path.parent.resolve()
    files = {path.name: path}
    for data in external_files(path):
        if not Path(data).resolve().is_relative_to(base):
            logger.warning(
                "not serving %s, which a tensor of %s names as its data: it lies outside the model's folder (ONNX "
                "refuses such locations); move the data file beside the model",
                data,
                path.name,
            )
            continue
        files[Path(os.path.relpath(data, path.parent)).as_posix()] = data
    return files


def _bind(host: str, port: int) -> _Server:
    """A server bound to ``host:port`` (IPv4 or IPv6, as the host resolves), or an OpbridgeError."""
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except OSError as exc:
        raise OpbridgeError(f"--host {host!r}: not an address here ({exc.strerror or exc}); e.g. localhost.") from None

    class Server(_Server):
        address_family = family

    try:
        return Server(
            (str(address[0]), int(address[1])), _Handler
        )  # (the handler is replaced by the caller's subclass)
    except OSError as exc:
        raise OpbridgeError(
            f"cannot serve on {host}:{port}: {exc.strerror or exc}; choose another --port (0: any free one)"
        ) from None


def serve_model(
    model: str | os.PathLike[str], *, port: int | None = None, host: str = "localhost", browse: bool = False
) -> NetronServer:
    """Serve ``model`` in Netron's viewer at ``host:port`` (a free port when ``port`` is 0 or None).

    Raises:
        ModelLoadError: the file is missing or not an ONNX model.
        OpbridgeError: the port is out of range or taken, or the host is not an address here.
        BackendUnavailableError: netron is not installed.
    """
    from opbridge.model_io import load_model

    path = Path(model)
    # a missing, unreadable or non-ONNX file is named here, as by the other commands (its weights unread)
    load_model(path, external_data=False)
    if port is not None and not 0 <= port <= 65535:
        raise OpbridgeError(f"port {port}: give 0 (any free port) to 65535.")
    if not host.strip():
        raise OpbridgeError("--host is empty: give an address to bind, e.g. localhost or 127.0.0.1.")
    assets, template = _viewer_assets()
    httpd = _bind(host, port or 0)
    bound = str(httpd.server_address[0])
    loopback = host == "localhost" or (_is_address(bound) and ipaddress.ip_address(bound).is_loopback)
    if not loopback:
        logger.warning(
            "view: serving %s on %s, which other machines may reach: anyone who does can fetch the model", path, host
        )
    names = {host.lower().strip("[]"), "localhost", socket.gethostname().lower()}  # (no getfqdn: a DNS wait)
    handler = type(
        "Handler",
        (_Handler,),
        {"assets": assets, "files": _model_files(path), "page": _page(template, path), "hosts": frozenset(names)},
    )
    httpd.RequestHandlerClass = handler
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    thread.start()
    # (a URL for every interface names this machine: http://0.0.0.0:PORT reaches nothing)
    wildcard = _is_address(host) and ipaddress.ip_address(host).is_unspecified
    server = NetronServer(socket.gethostname() if wildcard else host, int(httpd.server_address[1]), path, httpd, thread)
    logger.info("serving %s at %s", path, server.url)
    if browse:
        import webbrowser

        webbrowser.open(server.url)
    return server
