"""Loading user code named on the command line: ``--ops`` files/modules and model factories."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from opbridge.errors import OpbridgeError

__all__ = ["load_factory", "load_module", "load_ops"]


def load_module(target: str) -> ModuleType:
    """Import ``target``: a path to a ``.py`` file, or a dotted module name."""
    path = Path(target)
    if target.endswith(".py") or path.exists():
        if not path.is_file():
            raise OpbridgeError(f"{target}: no such Python file; give an existing .py file or a module name.")
        resolved = path.resolve()
        name = f"_opbridge_user_{resolved.stem}_{hashlib.sha1(str(resolved).encode()).hexdigest()[:8]}"
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, resolved)
        if spec is None or spec.loader is None:
            raise OpbridgeError(f"{target}: cannot be imported as a Python file.")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        sys.path.insert(0, str(resolved.parent))
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[name]
            raise OpbridgeError(f"{target}: importing it failed: {type(exc).__name__}: {exc}") from exc
        finally:
            sys.path.remove(str(resolved.parent))
        return module
    # the current folder on the path, as `python -m opbridge` has it: the opbridge script finds a module
    # there too (mymod for ./mymod.py)
    here = os.getcwd()
    added = here not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, here)
    try:
        return importlib.import_module(target)
    except ImportError as exc:
        raise OpbridgeError(
            f"{target}: cannot import module ({exc}); give a .py file path or an importable module name."
        ) from exc
    finally:
        if added:
            sys.path.remove(here)


def load_ops(targets: list[str] | tuple[str, ...] | None) -> list[ModuleType]:
    """Import every ``--ops`` target so that the ops and kernels it defines are known."""
    return [load_module(t) for t in targets or ()]


def load_factory(target: str, *, label: str = "--reference") -> tuple[Any, tuple[Any, ...]]:
    """Call a ``path/to/file.py:factory`` or ``package.module:factory`` and return ``(model, inputs)``;
    errors name it as ``label`` (the option or argument that gave it)."""
    module_part, sep, attr = target.rpartition(":")
    if not sep or not module_part or not attr:
        raise OpbridgeError(f"{label} {target!r}: write it as path/to/file.py:factory or package.module:factory.")
    module = load_module(module_part)
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise OpbridgeError(f"{label} {target!r}: {module_part} has no callable {attr!r}.")
    # the factory's own folder, as while its file was imported: an import inside the factory finds its siblings
    folder = (
        str(Path(module.__file__).parent) if module.__name__.startswith("_opbridge_user_") and module.__file__ else None
    )
    if folder is not None:
        sys.path.insert(0, folder)
    try:
        result = factory()
    except Exception as exc:
        raise OpbridgeError(f"{label} {target}: building the PyTorch model raised {type(exc).__name__}: {exc}") from exc
    finally:
        if folder is not None:
            sys.path.remove(folder)
    if not (isinstance(result, tuple) and len(result) == 2):
        got = f"a tuple of {len(result)}" if isinstance(result, tuple) else type(result).__name__
        raise OpbridgeError(f"{label} {target!r}: the factory must return (model, example_inputs), got {got}.")
    model, inputs = result
    if not isinstance(inputs, (tuple, list)):
        inputs = (inputs,)
    return model, tuple(inputs)
