"""Shared fixtures: the seed models are exported once per session and reused by every test."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import opbridge
from opbridge.examples.seeds import SEED_MODELS, SeedModel

EXPORTERS = ("dynamo", "torchscript")
SEED_IDS = [m.name for m in SEED_MODELS]

# The Triton kernels run in Triton's interpreter in a child process (tests/test_triton_interpreted.py) for two
# to three minutes of one core: started as the session starts, where its tests are selected, it runs beside
# the other tests, and its fixture collects the result.
_INTERPRETED_TESTS = "test_triton_interpreted.py"
_interpreted: dict[str, Any] = {}


def pytest_collection_finish(session: pytest.Session) -> None:
    if importlib.util.find_spec("triton") is None:
        return
    if any(
        Path(str(item.path)).name == _INTERPRETED_TESTS and "interpreted" in item.fixturenames for item in session.items
    ):
        start_interpreted_kernels()


def start_interpreted_kernels() -> dict[str, Any]:
    """The child process that runs tests/_interpreted_kernels.py (started once): ``{"process", "stdout",
    "stderr"}``, its outputs going to temporary files (a pipe nobody reads while it runs could fill up)."""
    if not _interpreted:
        script = Path(__file__).with_name("_interpreted_kernels.py")
        stdout, stderr = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        env = {**os.environ, "TRITON_INTERPRET": "1"}
        process = subprocess.Popen([sys.executable, str(script)], stdout=stdout, stderr=stderr, text=True, env=env)
        _interpreted.update(process=process, stdout=stdout, stderr=stderr)
    return _interpreted


def pytest_sessionfinish(session: pytest.Session) -> None:
    process = _interpreted.get("process")
    if process is not None and process.poll() is None:  # (its tests were not run: -x stopped the session first)
        process.kill()
        process.wait()
    for name in ("stdout", "stderr"):
        if name in _interpreted:
            _interpreted[name].close()


SHAPE_IDS = ["export_shape", "shape1", "shape2"]
# (rtol, atol) per seed model: elementwise ops agree with eager to float rounding; the resize seed
# goes through a 64-channel 9x9 convolution and keeps the project's default tolerance.
SEED_TOLERANCE = {"myselu": (1e-5, 1e-6), "strange_net": (1e-4, 1e-5), "strange_net2": (1e-4, 1e-5)}


def seed_case(name: str, which: int, seed: int) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    """A seed's eager model and inputs: the export example (``which`` 0) or ``SeedModel.shapes[which - 1]``
    filled with normal noise from ``seed + which``."""
    seed_model = seed_by_name(name)
    model, args = seed_model.factory()
    if which == 0:
        return model, list(args)
    shapes = seed_model.shapes[which - 1]
    g = torch.Generator().manual_seed(seed + which)
    return model, [torch.randn(shapes[n], generator=g) for n in seed_model.input_names]


def seed_by_name(name: str) -> SeedModel:
    return next(m for m in SEED_MODELS if m.name == name)


def export_seed(seed: SeedModel, exporter: str, path: Path, *, functions: bool = True) -> opbridge.ExportResult:
    model, args = seed.factory()
    extra = {"dynamic_shapes": seed.dynamic_shapes()} if exporter == "dynamo" else {"dynamic_axes": seed.dynamic_axes()}
    return opbridge.export(
        model,
        args,
        path,
        exporter=exporter,
        input_names=seed.input_names,
        output_names=seed.output_names,
        functions=functions,
        **extra,
    )


@pytest.fixture(scope="session")
def seed_export(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., opbridge.ExportResult]:
    """``seed_export(name, exporter, functions=True)``: the export of a seed model, made once per session."""
    cache: dict[tuple[str, str, bool], opbridge.ExportResult] = {}
    root = tmp_path_factory.mktemp("seed_exports")

    def get(name: str, exporter: str, functions: bool = True) -> opbridge.ExportResult:
        key = (name, exporter, functions)
        if key not in cache:
            suffix = "" if functions else "_nobody"
            cache[key] = export_seed(
                seed_by_name(name), exporter, root / f"{name}_{exporter}{suffix}.onnx", functions=functions
            )
        return cache[key]

    return get


def run_script(folder: Path, source: str, timeout: float = 300) -> str:
    """Run ``source`` (dedented) as a script in a fresh Python process, so that process-wide state
    (imports, registries) starts empty or an abort cannot end the test run; its stdout, once it
    exited 0."""
    script = folder / "script.py"
    script.write_text(textwrap.dedent(source), encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout
