"""Loading the native bridge (``_bridge``, a CPython extension and ONNX Runtime custom-op library).

Kept apart so that a missing build gives one clear error instead of an ImportError deep in a session.
"""

from __future__ import annotations

import functools
from types import ModuleType

from opbridge.errors import BackendUnavailableError

__all__ = ["module"]


@functools.cache
def module() -> ModuleType:
    """The imported ``opbridge.onnxruntime._bridge`` extension.

    Raises:
        BackendUnavailableError: the extension was not built.
    """
    try:
        from opbridge.onnxruntime import _bridge
    except ImportError as exc:
        raise BackendUnavailableError(
            "opbridge's ONNX Runtime kernel bridge (opbridge.onnxruntime._bridge) is not built: "
            f"{exc}. Install opbridge with `pip install -e .` (or run `python setup.py build_ext --inplace` "
            "in the checkout); it needs a C compiler and numpy."
        ) from exc
    return _bridge
