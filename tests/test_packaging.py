"""What the sdist and the wheel carry, and what a native extension that does not import says."""

from __future__ import annotations

import importlib
import importlib.machinery
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from opbridge.onnxruntime._native import unloadable

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def source_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files that build the distributions, copied (without built extensions or caches), with setuptools'
    egg_info run there: its SOURCES.txt is what the sdist holds."""
    if not (ROOT / "setup.py").is_file():
        pytest.skip("not a source checkout")
    copy = tmp_path_factory.mktemp("pkg") / "src_copy"
    copy.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE", "constraints.txt", "Makefile"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, copy / name)
    shutil.copytree(
        ROOT / "src", copy / "src", ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__", "*.egg-info")
    )
    _setup(copy, "egg_info")
    return copy


def _setup(folder: Path, *argv: str) -> None:
    done = subprocess.run(
        [sys.executable, "setup.py", "-q", *argv], cwd=folder, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_sdist_carries_the_c_sources_and_headers(source_copy: Path) -> None:
    (sources,) = source_copy.glob("src/*.egg-info/SOURCES.txt")
    listed = set(sources.read_text().split())
    for name in (
        "src/opbridge/onnxruntime/_bridge.c",
        "src/opbridge/onnxruntime/_ort_abi.h",
        "src/opbridge/ops/_cpu_kernels.c",
        "src/opbridge/_native_kernel.h",
    ):
        assert name in listed, f"{name} is not in the sdist"


def test_the_wheel_carries_the_public_header_but_not_the_c_sources(source_copy: Path) -> None:
    """The wheel's Python part is build_py's output (build_ext adds the compiled extensions)."""
    out = source_copy / "wheel_py"
    _setup(source_copy, "build_py", "--build-lib", str(out))
    files = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert {"opbridge/_native_kernel.h", "opbridge/py.typed", "opbridge/ops/_cpu_kernels.pyi"} <= files
    shipped = sorted(f for f in files if f.endswith(".c") or f.endswith("_ort_abi.h"))
    assert not shipped, f"the wheel would ship {shipped}"


def _package_with_a_broken_extension(root: Path, name: str) -> None:
    """``name``: a package holding ``_ext``, a file with an extension's name that is no shared library."""
    package = root / name
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / f"_ext{importlib.machinery.EXTENSION_SUFFIXES[0]}").write_bytes(b"not a shared library")


def test_an_extension_that_is_there_but_does_not_import_is_told_from_one_not_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _package_with_a_broken_extension(tmp_path, "opbridge_broken_pkg")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    with pytest.raises(ImportError) as broken:
        importlib.import_module("opbridge_broken_pkg._ext")
    message = unloadable("opbridge_broken_pkg._ext", "test extension", broken.value)
    assert "(opbridge_broken_pkg._ext) is built but does not load under numpy " in message, message
    assert (
        "rebuild it: pip install -e . in a checkout, or pip install --force-reinstall --no-deps on the sdist" in message
    )

    with pytest.raises(ImportError) as missing:
        importlib.import_module("opbridge_broken_pkg._absent")
    message = unloadable("opbridge_broken_pkg._absent", "test extension", missing.value)
    assert "(opbridge_broken_pkg._absent) is not built" in message and "does not load" not in message, message
    assert "build it: pip install -e . in a checkout" in message
