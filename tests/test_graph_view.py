"""opbridge view: Netron serves the model on localhost; fetched with urllib, then stopped."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import onnx
import pytest
from _graph_models import custom_node_model

from opbridge.cli import main
from opbridge.errors import ModelLoadError
from opbridge.graph.view import serve_model


def test_serve_headless_fetch_and_stop(tmp_path: Path) -> None:
    pytest.importorskip("netron", reason="netron (the 'view' extra) is not installed")
    path = tmp_path / "m.onnx"
    onnx.save(custom_node_model(), path)
    server = serve_model(path, port=0, browse=False)
    try:
        assert server.host == "localhost" and server.port > 0 and server.running()
        with urllib.request.urlopen(server.url + "/", timeout=10) as response:
            assert response.status == 200
            page = response.read().decode("utf-8", errors="replace")
        assert "netron" in page.lower()
        with urllib.request.urlopen(f"{server.url}/data/{path.name}", timeout=10) as response:
            assert response.read() == path.read_bytes()
    finally:
        server.stop()
    assert not server.running()


def test_view_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ModelLoadError, match="no such file"):
        serve_model(tmp_path / "nope.onnx")
    assert main(["view", str(tmp_path / "nope.onnx"), "--no-browser"]) == 2
    assert "no such file" in capsys.readouterr().err


@pytest.mark.parametrize("sigint", ["default", "ignored"], ids=["sigint-default", "started-with-sigint-ignored"])
def test_cli_view_headless(tmp_path: Path, sigint: str) -> None:
    """``opbridge view --no-browser --port 0`` prints the URL, serves it, and stops on Ctrl-C (SIGINT),
    also when the process starts with SIGINT ignored (a shell script's background job)."""
    import os
    import selectors
    import signal
    import subprocess
    import sys
    import time

    import opbridge

    pytest.importorskip("netron", reason="netron (the 'view' extra) is not installed")
    path = tmp_path / "m.onnx"
    onnx.save(custom_node_model(), path)
    env = dict(os.environ, PYTHONPATH=str(Path(opbridge.__file__).parents[1]))
    command = [sys.executable, "-m", "opbridge.cli", "view", str(path), "--no-browser", "--port", "0"]
    if sigint == "ignored":  # exec keeps an ignored signal ignored
        start = (
            "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); os.execv(sys.argv[1], sys.argv[1:])"
        )
        command = [sys.executable, "-c", start, *command]
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        deadline, line = time.monotonic() + 60, ""
        while not line and time.monotonic() < deadline and sel.select(timeout=1):
            line = proc.stdout.readline()
        assert line.startswith(f"serving {path} at http://localhost:"), line
        url = line.split(" at ")[1].split()[0]
        with urllib.request.urlopen(url + "/", timeout=10) as response:
            assert response.status == 200 and "netron" in response.read().decode("utf-8", "replace").lower()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_view_refuses_a_file_that_is_not_onnx_and_bad_ports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """view reads the file as the other commands do before serving it, and names a port out of range."""
    text = tmp_path / "notes.onnx"
    text.write_text("not a model")
    assert main(["view", str(text), "--no-browser"]) == 2
    assert "not a valid ONNX model" in capsys.readouterr().err
    model = tmp_path / "m.onnx"
    onnx.save(custom_node_model(), model)
    for port in ("99999", "-1"):
        assert main(["view", str(model), "--no-browser", "--port", port]) == 2
        assert f"port {port}: give 0 (any free port) to 65535" in capsys.readouterr().err
