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


@pytest.mark.parametrize(
    ("sigint", "stop"),
    [("default", "SIGINT"), ("ignored", "SIGINT"), ("default", "SIGTERM")],
    ids=["sigint-default", "started-with-sigint-ignored", "sigterm"],
)
def test_cli_view_headless(tmp_path: Path, sigint: str, stop: str) -> None:
    """``opbridge view --no-browser --port 0`` prints the URL, serves it, and stops on Ctrl-C (SIGINT),
    also when the process starts with SIGINT ignored (a shell script's background job), or on SIGTERM:
    quietly, with the shell's code for the signal (128 + its number: 130, 143; it exited 0)."""
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
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        # (wait for the first line however long the start takes on a loaded machine: a quiet second is not
        # the end, a closed stdout or the deadline is)
        deadline, line = time.monotonic() + 120, ""
        while not line and time.monotonic() < deadline:
            if sel.select(timeout=1):
                line = proc.stdout.readline()
                if not line:  # (end of file: the process closed its stdout)
                    break
        assert line.startswith(f"serving {path} at http://localhost:"), (line, proc.poll())
        url = line.split(" at ")[1].split()[0]
        with urllib.request.urlopen(url + "/", timeout=10) as response:
            assert response.status == 200 and "netron" in response.read().decode("utf-8", "replace").lower()
        proc.send_signal(getattr(signal, stop))
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 128 + getattr(signal, stop), err
        assert err == ""  # (no traceback, no message)
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


def _get(url: str, host: str | None = None) -> tuple[int, bytes]:
    import urllib.error

    request = urllib.request.Request(url, headers={"Host": host} if host else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_view_serves_the_model_and_its_data_files_only(tmp_path: Path) -> None:
    """Netron's own server handed out every file under the model's folder to any Host (a web page using
    DNS rebinding could read them), and pasted the file name into the page unescaped."""
    pytest.importorskip("netron", reason="netron (the 'view' extra) is not installed")
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    folder = tmp_path / "m"
    folder.mkdir()
    (folder / ".env").write_text("token=secret")
    name = 'x"><img src=x onerror=alert(1)>.onnx'
    weights = numpy_helper.from_array(np.arange(512, dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [512])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [512])],
        [weights],
    )
    path = folder / name
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
        path,
        save_as_external_data=True,
        location="weights.bin",
        size_threshold=0,
    )
    server = serve_model(path, port=0)
    other = serve_model(tmp_path / "m" / name, port=0)  # a second server in the process serves its own
    try:
        status, page = _get(server.url + "/")
        assert status == 200 and b"<img" not in page and b"&lt;img src=x onerror=alert(1)&gt;.onnx" in page
        assert _get(f"{server.url}/data/weights.bin") == (200, (folder / "weights.bin").read_bytes())
        import urllib.parse

        assert _get(f"{server.url}/data/{urllib.parse.quote(name)}")[1] == path.read_bytes()
        assert _get(f"{server.url}/data/.env")[0] == 404
        assert _get(f"{server.url}/data/../m/.env")[0] == 404
        assert _get(f"{server.url}/server.py")[0] == 404
        assert _get(f"{server.url}/", host=f"attacker.example:{server.port}")[0] == 403
        assert _get(f"{server.url}/", host=f"127.0.0.1:{server.port}")[0] == 200
        assert _get(other.url + "/")[0] == 200 and other.port != server.port
    finally:
        server.stop()
        other.stop()
    (folder / "weights.bin").unlink()  # a data file missing: the model is still shown (Netron says what is missing)
    alone = serve_model(path, port=0)
    try:
        assert _get(alone.url + "/")[0] == 200 and _get(f"{alone.url}/data/weights.bin")[0] == 404
    finally:
        alone.stop()


def test_view_does_not_serve_data_files_outside_the_models_folder(tmp_path: Path) -> None:
    """A model naming ``../secret.data``, an absolute path or a link that leads out of its folder as a
    tensor's data had that file served to the viewer's clients (``/etc/passwd`` by a crafted model)."""
    pytest.importorskip("netron", reason="netron (the 'view' extra) is not installed")
    import os

    from onnx import TensorProto, helper

    folder = tmp_path / "m"
    folder.mkdir()
    secret = tmp_path / "secret.data"
    secret.write_bytes(b"\0" * 16)
    (folder / "link.data").symlink_to(secret)
    (folder / "inside.data").write_bytes(b"\0" * 16)
    tensors = []
    for name, location in [("a", "../secret.data"), ("b", str(secret)), ("c", "link.data"), ("d", "inside.data")]:
        tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=[4], data_location=TensorProto.EXTERNAL)
        tensor.external_data.add(key="location", value=location)
        tensors.append(tensor)
    graph = helper.make_graph(
        [helper.make_node("Sum", ["x", "a", "b", "c", "d"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        tensors,
    )
    path = folder / "evil.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    server = serve_model(path, port=0)
    try:
        for location in ["../secret.data", os.path.relpath(secret, folder), "link.data"]:
            escaped = "/".join("%2E%2E" if part == ".." else part for part in location.split("/"))
            assert _get(f"{server.url}/data/{escaped}")[0] == 404, location
        assert _get(f"{server.url}/data/inside.data") == (200, b"\0" * 16)
    finally:
        server.stop()
