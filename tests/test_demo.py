"""``opbridge demo`` in its reduced mode: seed models exported, run on the backends, one table."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

import opbridge
from opbridge.backends import available_backends
from opbridge.cli import main
from opbridge.demo import run_demo

pytestmark = pytest.mark.skipif("openvino" not in available_backends(), reason="openvino is not installed")


def test_demo_quick_cli(tmp_path: Path, capsys) -> None:
    out = tmp_path / "demo.json"
    code = main(
        [
            "demo",
            "--quick",
            "--model",
            "super_resolution",
            "--exporter",
            "torchscript",
            "--backend",
            "openvino",
            "--json",
            str(out),
            "-q",
        ]
    )
    text = capsys.readouterr().out
    assert code == 0, text
    lines = text.splitlines()
    assert lines[0].split() == ["model", "exporter", "backend", "shape", "max", "abs", "err", "result"]
    rows = [line.split() for line in lines[1:] if line.startswith("super_resolution")]
    # quick mode: the export shape and one further shape
    assert [r[3:5] for r in rows] == [["export", "2x3x16x16,2x1x32x32"], ["shape", "2"]]
    assert all(r[2] == "openvino" and r[-1] == "PASS" and float(r[-2]) < 1e-5 for r in rows)
    assert lines[-1].startswith("PASS: 2 of 2 runs within tolerance in ")
    records = json.loads(out.read_text())
    assert len(records) == 1 and records[0]["exit_code"] == 0


def test_demo_runs_every_installed_backend() -> None:
    result = run_demo(models=["myselu"], exporters=["dynamo"], quick=True)
    ran = {r.backend for r in result.rows}
    assert ran == set(available_backends())
    assert [r.result for r in result.rows if r.backend == "openvino"] == ["PASS", "PASS"]
    errors = [r for r in result.rows if r.result == "ERROR"]
    # Only possible where ORT / onnx.reference cannot host the seed op: no opbridge kernels, no ONNX body.
    assert all("opbridge::MySELU has no function body" in r.note for r in errors), result.table()
    if all(importlib.util.find_spec(m) for m in ("opbridge.onnxruntime", "opbridge.reference")):
        assert not errors
    assert result.exit_code == (2 if errors else 0), result.table()


def test_demo_rejects_unknown_model(tmp_path: Path, capsys) -> None:
    assert main(["demo", "--model", "resnet"]) == 2
    assert (
        "demo: unknown model 'resnet'; choose from myselu, strange_net, strange_net2, super_resolution"
        in capsys.readouterr().err
    )
    with pytest.raises(opbridge.OpbridgeError, match="unknown exporter"):
        run_demo(exporters=["tracing"])
    # an unknown backend is named before anything is exported (it came after every model's export)
    kept = tmp_path / "kept"
    with pytest.raises(opbridge.OpbridgeError, match=r"unknown backend 'onnxruntme'; choose from onnxruntime"):
        run_demo(backends=["onnxruntme"], workdir=kept)
    assert not kept.exists()
    # so is torch, the model every backend is compared with (named after both exports, with verify's fix)
    with pytest.raises(opbridge.OpbridgeError, match=r"backend 'torch' is the PyTorch model every backend is compared"):
        run_demo(backends=["torch"], workdir=kept)
    assert not kept.exists()


def test_demo_names_a_keep_folder_it_cannot_use(tmp_path: Path, capsys) -> None:
    """A --keep folder that cannot be created ended in a traceback (exit 1); an empty one wrote the
    models into the current folder."""
    a_file = tmp_path / "file"
    a_file.write_text("user data")
    argv = ["demo", "--quick", "--model", "myselu", "--exporter", "torchscript", "--backend", "reference", "-q"]
    assert main([*argv, "--keep", str(a_file / "sub")]) == 2
    err = capsys.readouterr().err
    assert f"cannot create the folder {a_file / 'sub'} for --keep: Not a directory" in err and "Traceback" not in err
    assert main([*argv, "--keep", ""]) == 2
    assert "--keep is empty; give a folder" in capsys.readouterr().err
    assert a_file.read_text() == "user data"
    # --json over a model the run keeps: refused before the run (it was after it, with the table lost)
    keep = tmp_path / "keep"
    assert main([*argv, "--keep", str(keep), "--json", str(keep / "myselu_torchscript.onnx")]) == 2
    assert "demo writes one of its exported models there (--keep" in capsys.readouterr().err
    assert not keep.exists()
