"""The examples in the public docstrings run and give what they show."""

from __future__ import annotations

import ast
import doctest
import functools
import importlib
import importlib.util
import pkgutil
from pathlib import Path

import pytest

import opbridge

HAS_TRITON = importlib.util.find_spec("triton") is not None


@functools.cache
def _imports_at_load(name: str) -> frozenset[str]:
    """The modules that opbridge's module ``name`` imports unconditionally at its top level (not in a
    function, an ``if`` or a ``try``), and the names ``from`` imports take, read from its source without
    importing anything; an empty set for a name that is no module of opbridge."""
    base = Path(opbridge.__path__[0]).joinpath(*name.split(".")[1:])
    source = next((f for f in (base.with_suffix(".py"), base / "__init__.py") if f.is_file()), None)
    if source is None:
        return frozenset()
    found: set[str] = set()
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)  # and what it names, which may be submodules
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return frozenset(found)


def _needs_triton(name: str) -> bool:
    """Whether importing ``name`` imports Triton: itself, its packages, or an opbridge module it imports."""
    todo, seen = [name], {name}
    while todo:
        module = todo.pop()
        packages = {module.rsplit(".", up)[0] for up in range(1, module.count("."))}
        for imported in _imports_at_load(module) | packages:
            if imported.split(".")[0] == "triton":
                return True
            if imported.startswith("opbridge.") and imported not in seen:
                seen.add(imported)
                todo.append(imported)
    return False


def _params() -> list[object]:
    """Every module of opbridge but ``__main__``; those that import Triton skipped where it is missing."""
    params: list[object] = []
    for m in sorted(pkgutil.walk_packages(opbridge.__path__, "opbridge."), key=lambda m: m.name):
        if m.name.endswith(".__main__"):  # __main__ runs the CLI
            continue
        # modules whose import needs Triton (the GPU kernels; tests/gpu checks those on a GPU)
        skip = not HAS_TRITON and _needs_triton(m.name)
        reason = f"{m.name} imports triton, which is not installed (pip install 'opbridge[kernel-tests]')"
        params.append(pytest.param(m.name, marks=pytest.mark.skipif(skip, reason=reason)))
    return params


@pytest.mark.parametrize("name", _params())
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} docstring example(s) of {name} failed (run with -s to see them)"
