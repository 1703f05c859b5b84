"""The examples run as a user runs them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quickstart_runs(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "custom node(s) ['acme::ScaledSwish']" in done.stdout
    assert done.stdout.count("PASS") >= 2 and "FAIL" not in done.stdout
    assert (tmp_path / "dynamo.onnx").is_file() and (tmp_path / "torchscript.onnx").is_file()


def test_python_dash_m_runs_the_command_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "opbridge", "plugins", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: opbridge plugins")


def test_version_is_the_package_version(capsys) -> None:
    """``opbridge --version`` and ``opbridge.__version__`` say pyproject.toml's version; ``dir(opbridge)``
    lists the public names, the lazily loaded sessions too, not the helpers the package imports."""
    import tomllib

    import pytest

    import opbridge
    from opbridge.cli import main

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert opbridge.__version__ == declared
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"opbridge {declared}"
    names = dir(opbridge)
    assert {"InferenceSession", "ReferenceSession", "op", "verify"} <= set(names)
    assert "Any" not in names and "annotations" not in names
    import opbridge.onnxruntime  # (a subpackage whose names load lazily too)

    assert {"InferenceSession", "NodeKernel"} <= set(dir(opbridge.onnxruntime))


def test_source_distribution_carries_the_tests_examples_and_docs(tmp_path: Path) -> None:
    """The sdist (built from a copy of the tree) holds the tests with their helpers, the example the
    README names, the docs, the pins and the native sources: its test suite can run."""
    import shutil
    import tarfile

    tree = tmp_path / "tree"
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info", "*.onnx", ".pytest_cache")
    for name in ("src", "tests", "examples", "docs", "benchmarks"):
        shutil.copytree(ROOT / name, tree / name, ignore=ignore)
    for name in ("README.md", "pyproject.toml", "setup.py", "MANIFEST.in", "constraints.txt", "Makefile"):
        shutil.copy2(ROOT / name, tree / name)
    done = subprocess.run(
        [sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path / "dist")],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (archive,) = (tmp_path / "dist").glob("opbridge-*.tar.gz")
    with tarfile.open(archive) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    wanted = {
        "tests/conftest.py",
        "tests/_graph_models.py",
        "tests/_detection_cases.py",
        "tests/_interpreted_kernels.py",
        "tests/gpu/check_trt_kernels.py",
        "examples/quickstart.py",
        "docs/verify.md",
        "constraints.txt",
        "src/opbridge/_native_kernel.h",
        "src/opbridge/onnxruntime/_bridge.c",
        "src/opbridge/py.typed",
    }
    assert wanted <= names, sorted(wanted - names)
