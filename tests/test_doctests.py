"""The examples in the public docstrings run and give what they show."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import opbridge

# Modules whose import needs a GPU toolchain (Triton): their kernels are checked by tests/gpu.
NEEDS_GPU = {"opbridge.ops._detection_triton"}

MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(opbridge.__path__, "opbridge.")
    if m.name not in NEEDS_GPU and not m.name.endswith(".__main__")  # __main__ runs the CLI
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} docstring example(s) of {name} failed (run with -s to see them)"
