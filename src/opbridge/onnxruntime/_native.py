"""Loading the native bridge (``_bridge``, a CPython extension and ONNX Runtime custom-op library).

Kept apart so that a missing build gives one clear error instead of an ImportError deep in a session.
"""

from __future__ import annotations

import functools
from types import ModuleType

from opbridge.errors import BackendUnavailableError

__all__ = ["module", "unloadable"]


@functools.cache
def module() -> ModuleType:
    """The imported ``opbridge.onnxruntime._bridge`` extension.

    Raises:
        BackendUnavailableError: the extension was not built, or it was built but does not load.
    """
    try:
        from opbridge.onnxruntime import _bridge
    except ImportError as exc:
        raise BackendUnavailableError(
            unloadable("opbridge.onnxruntime._bridge", "ONNX Runtime kernel bridge", exc)
        ) from exc
    return _bridge


def unloadable(name: str, what: str, exc: ImportError) -> str:
    """The message for the extension ``name`` (opbridge's ``what``) that failed to import with ``exc``:
    "built but does not load" where its file is there (compiled for another numpy, a missing library),
    "not built" where it is not, each with the fix for a pip install and for a checkout."""
    import importlib.util

    import numpy

    try:
        built = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        built = False
    rebuild = (
        "pip install -e . in a checkout, or pip install --force-reinstall --no-deps on the sdist, which compiles "
        "it against numpy 2's headers and needs a C compiler"
    )
    if built:
        return (
            f"opbridge's {what} ({name}) is built but does not load under numpy {numpy.__version__}: {exc}. "
            f"It was most likely compiled against numpy 1.x or for another environment; rebuild it: {rebuild}."
        )
    return f"opbridge's {what} ({name}) is not built ({exc}); build it: {rebuild}."
