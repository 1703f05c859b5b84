"""Import TensorRT: ``tensorrt`` where installed, else ``tensorrt_rtx`` (CPU-capable builds).

The ``tensorrt_rtx`` wheel ships ``libtensorrt_rtx.so.1`` but its ONNX parser
``dlopen()``s the unsuffixed ``libtensorrt_rtx.so`` when it adds the first plugin
layer; the failed load ends in ``std::terminate``. Before importing
``tensorrt_rtx`` we put a stand-in ``tensorrt_rtx_libs`` package first on
``sys.path``: a private temporary folder of symlinks to the wheel's files plus the
missing ``libtensorrt_rtx.so -> libtensorrt_rtx.so.1``. Nothing in site-packages
is touched. Environment variables set inside the process do not help, because
the loader reads them at process start.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import logging
import os
import shutil
import sys
import tempfile
from types import ModuleType

from opbridge._locks import ForkSafeLock
from opbridge.errors import BackendUnavailableError

__all__ = ["backend_name", "in_process_plugin_problem", "load_tensorrt"]

logger = logging.getLogger(__name__)

_LOCK = ForkSafeLock()
# the environment variable that forces one of the backends, and the backends, in the order tried
_FORCE = "OPBRIDGE_TENSORRT_BACKEND"
_BACKENDS = ("tensorrt", "tensorrt_rtx")
_LOADED: tuple[ModuleType, str] | None = None
# where the tensorrt_rtx_libs stand-in's folder goes (None: the temporary folder). A TensorRT worker puts
# it in its caller's temporary folder, which the caller removes even when it has to kill the worker.
_STAND_IN_PARENT: str | None = None
# why this process's TensorRT parser cannot take plugin nodes (None: it can)
_PLUGIN_PROBLEM: str | None = None


def _shadow_rtx_libs() -> None:
    """Put a ``tensorrt_rtx_libs`` stand-in holding ``libtensorrt_rtx.so`` first on ``sys.path``."""
    global _PLUGIN_PROBLEM
    if "tensorrt_rtx_libs" in sys.modules:
        folder = os.path.dirname(sys.modules["tensorrt_rtx_libs"].__file__ or "")
        if not os.path.exists(os.path.join(folder, "libtensorrt_rtx.so")):
            _PLUGIN_PROBLEM = (
                "tensorrt_rtx was imported before opbridge's TensorRT loader could add libtensorrt_rtx.so beside "
                "its libraries, so TensorRT's ONNX parser would abort this process at the first plugin node"
            )
            logger.warning(
                "%s. opbridge parses and builds in a subprocess by default, which is not affected; in this process "
                "(isolate=False) it refuses models with plugin nodes.",
                _PLUGIN_PROBLEM,
            )
        return
    spec = importlib.util.find_spec("tensorrt_rtx_libs")
    if spec is None or spec.origin is None:
        return
    original = os.path.dirname(spec.origin)
    if os.path.exists(os.path.join(original, "libtensorrt_rtx.so")):
        return
    root = tempfile.mkdtemp(prefix="opbridge_trt_rtx_libs_", dir=_STAND_IN_PARENT)
    atexit.register(shutil.rmtree, root, True)
    package = os.path.join(root, "tensorrt_rtx_libs")
    os.mkdir(package)
    for name in os.listdir(original):
        if name.endswith(".py") or ".so" in name:
            os.symlink(os.path.join(original, name), os.path.join(package, name))
    target = os.path.join(original, "libtensorrt_rtx.so.1")
    if os.path.exists(target):
        os.symlink(target, os.path.join(package, "libtensorrt_rtx.so"))
    sys.path.insert(0, root)
    logger.debug("tensorrt_rtx_libs stand-in at %s", package)


def load_tensorrt() -> tuple[ModuleType, str]:
    """Return ``(module, backend_name)``: ``tensorrt`` if importable, else ``tensorrt_rtx``.

    ``OPBRIDGE_TENSORRT_BACKEND`` (``tensorrt`` or ``tensorrt_rtx``) forces one of them.

    Raises:
        BackendUnavailableError: neither package is installed (or not the forced one), or
            ``OPBRIDGE_TENSORRT_BACKEND`` names another backend.

    Example:
        >>> trt, backend = load_tensorrt()  # doctest: +SKIP
        >>> backend in ("tensorrt", "tensorrt_rtx")  # doctest: +SKIP
        True
    """
    global _LOADED
    with _LOCK:
        if _LOADED is not None:
            return _LOADED
        forced = os.environ.get(_FORCE, "")
        if forced not in ("", *_BACKENDS):
            raise BackendUnavailableError(
                f"{_FORCE}={forced!r} is not a TensorRT backend opbridge knows; set it to "
                f"{' or '.join(map(repr, _BACKENDS))}, or unset it to use whichever is installed."
            )
        errors: list[str] = []
        if forced in ("", "tensorrt"):
            try:
                _LOADED = (importlib.import_module("tensorrt"), "tensorrt")
                return _LOADED
            except (ImportError, OSError, RuntimeError) as exc:  # PyPI's stub packages fail in several ways
                errors.append(f"tensorrt: {exc}")
        if forced in ("", "tensorrt_rtx"):
            try:
                _shadow_rtx_libs()
                _LOADED = (importlib.import_module("tensorrt_rtx"), "tensorrt_rtx")
                return _LOADED
            except (ImportError, OSError) as exc:
                errors.append(f"tensorrt_rtx: {exc}")
        raise BackendUnavailableError(
            "TensorRT is not installed (" + "; ".join(errors) + "). "
            "Install NVIDIA's 'tensorrt' on a GPU machine, or TensorRT-RTX for CPU-only build checks: "
            "pip install 'opbridge[tensorrt-rtx]'."
        )


def in_process_plugin_problem() -> str | None:
    """Why TensorRT's ONNX parser cannot import plugin nodes in this process, or ``None`` where it can.

    Set when ``tensorrt_rtx`` (its ``tensorrt_rtx_libs``) was imported before :func:`load_tensorrt` could
    put the library its parser loads beside it: parsing a plugin node would then end the process.
    A child process (``isolate=True``) is not affected.
    """
    return _PLUGIN_PROBLEM


def backend_name() -> str | None:
    """The backend :func:`load_tensorrt` would use, without importing it; ``None`` if none is installed."""
    if _LOADED is not None:
        return _LOADED[1]
    for name in _BACKENDS:
        if importlib.util.find_spec(name) is not None:
            return name
    return None
