"""Loading user code named on the command line: ``--ops`` files/modules and model factories."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from opbridge.errors import OpbridgeError

__all__ = ["forward_parameters", "forward_signature", "load_factory", "load_module", "load_ops"]


def load_module(target: str) -> ModuleType:
    """Import ``target``: a path to a ``.py`` file or to a package folder, or a dotted module name."""
    if not str(target).strip():
        raise OpbridgeError(
            "an empty module name or path was given (e.g. --ops ''); give a .py file, a package folder or a module "
            "name, e.g. --ops my_ops.py"
        )
    path = Path(target)
    if path.is_dir() and not target.endswith(".py"):
        return _load_package(target, path)
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
        except SystemExit as exc:
            del sys.modules[name]
            raise OpbridgeError(_exit_message(target, exc)) from None
        except Exception as exc:
            del sys.modules[name]
            hint = _package_hint(resolved) if isinstance(exc, ImportError) and "relative import" in str(exc) else ""
            raise OpbridgeError(f"{target}: importing it failed: {type(exc).__name__}: {exc}{hint}") from exc
        finally:
            sys.path.remove(str(resolved.parent))
        return module
    # the current folder on the path, as `python -m opbridge` has it: the opbridge script finds a module
    # there too (mymod for ./mymod.py)
    return _import_name(target, target, os.getcwd())


def _import_name(label: str, name: str, folder: str) -> ModuleType:
    """Import the module ``name`` with ``folder`` on the path; errors name it as ``label``."""
    added = folder not in sys.path and not (folder == os.getcwd() and "" in sys.path)
    if added:
        sys.path.insert(0, folder)
    try:
        return importlib.import_module(name)
    except SystemExit as exc:
        raise OpbridgeError(_exit_message(label, exc)) from None
    except ImportError as exc:
        raise OpbridgeError(
            f"{label}: cannot import module ({exc}); give a .py file path or an importable module name."
        ) from exc
    finally:
        if added:
            sys.path.remove(folder)


def _load_package(target: str, path: Path) -> ModuleType:
    """Import the package folder ``path`` as the module of its name, from the folder that holds it."""
    resolved = path.resolve()
    if not (resolved / "__init__.py").is_file():
        raise OpbridgeError(
            f"{target}: a folder without __init__.py, not a Python package; give a .py file in it, or add an "
            "__init__.py that imports the modules defining the ops."
        )
    if not resolved.name.isidentifier():
        raise OpbridgeError(
            f"{target}: {resolved.name!r} is no Python module name; rename the folder or give a .py file in it."
        )
    module = _import_name(target, resolved.name, str(resolved.parent))
    where = Path(module.__file__).resolve().parent if module.__file__ else None
    if where != resolved:
        raise OpbridgeError(
            f"{target}: the module name {resolved.name!r} is taken by {module.__file__ or module!r}; rename the folder."
        )
    return module


def _package_hint(path: Path) -> str:
    """How to give ``path``, a module of a package, so that its relative imports work ('' outside a package)."""
    parts = [path.stem]
    folder = path.parent
    while (folder / "__init__.py").is_file():
        parts.insert(0, folder.name)
        folder = folder.parent
    if len(parts) == 1 or not all(p.isidentifier() for p in parts):
        return ""
    name = ".".join(parts)
    if folder == Path.cwd().resolve():
        return f". It is a module of package {parts[0]}: give it as the module name {name} instead of a path."
    return (
        f". It is a module of package {parts[0]}: run from the folder {folder} and give it as the module name {name}."
    )


def _exit_message(target: str, exc: SystemExit) -> str:
    """Why importing ``target`` stopped: it called ``sys.exit`` (or its argparse did)."""
    return (
        f"{target}: importing it exited with code {exc.code!r} (sys.exit, or argparse reading the command line): "
        "the file runs as a script when imported. Put its script part under "
        'if __name__ == "__main__": so that importing it only defines the ops and kernels.'
    )


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
    except SystemExit as exc:  # (sys.exit(0) in a factory read as a pass: the command ended with its code)
        raise OpbridgeError(
            f"{label} {target}: the factory exited with code {exc.code!r} (sys.exit, or argparse reading the command "
            "line) instead of returning (model, example_inputs); return them, and keep the script part under "
            'if __name__ == "__main__":.'
        ) from None
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


def forward_signature(model: Any) -> inspect.Signature:
    """The signature of ``model``'s ``forward`` (of ``model`` itself where it has none: an ``nn.Module``'s own
    signature is ``(*args, **kwargs)``); a ``torch.jit.trace``'d module's from its TorchScript schema, which
    :func:`inspect.signature` cannot read; an ``ExportedProgram``'s from its module. Raises as
    :func:`inspect.signature` does otherwise."""
    if type(model).__name__ == "ExportedProgram" and callable(getattr(model, "module", None)):
        model = model.module()  # (a torch.export program: its module's forward takes the program's inputs)
    forward = getattr(model, "forward", model)
    schema = getattr(forward, "schema", None)  # (a torch.ScriptMethod: its first argument is self)
    if schema is not None and not inspect.isfunction(forward) and not inspect.ismethod(forward):
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        return inspect.Signature([inspect.Parameter(a.name, kind) for a in list(schema.arguments)[1:]])
    return inspect.signature(forward)


def forward_parameters(model: Any) -> list[str]:
    """The names of the positional parameters of ``model``'s ``forward`` (see :func:`forward_signature`),
    in order; raises as :func:`inspect.signature` does where the signature cannot be read."""
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in forward_signature(model).parameters.values() if p.kind in kinds]
