"""The command line as users meet it: streams that are not UTF-8, kept files, hosts, modules in the
current folder, and files that are not models."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import onnx
import pytest
from onnx import helper

from opbridge.cli import main

FACTORY = textwrap.dedent(
    """
    import torch, opbridge

    @opbridge.op("tests.cli::Twice")
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    class M(torch.nn.Module):
        def forward(self, x):
            return twice(x)

    def build():
        return M(), (torch.randn(2, 3),)
    """
)


def test_a_stdout_that_is_not_utf8_gets_escapes_not_a_traceback(seed_export) -> None:
    """MySELU's attribute is Chinese text: an ASCII stdout raised UnicodeEncodeError, exit code 1."""
    path = seed_export("myselu", "dynamo").path
    env = dict(os.environ, PYTHONIOENCODING="ascii")
    done = subprocess.run(
        [sys.executable, "-m", "opbridge", "inspect", str(path)], capture_output=True, env=env, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert b"\\u8fd9" in done.stdout and b"Traceback" not in done.stderr


def test_demo_json_never_replaces_a_model_it_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keep = tmp_path / "keep"
    argv = ["demo", "--keep", str(keep), "--model", "myselu", "--exporter", "dynamo", "--backend", "reference"]
    target = keep / "myselu_dynamo.onnx"
    record = tmp_path / "demo.json"
    assert main([*argv, "--quick", "-q", "--json", str(record)]) == 0
    assert json.loads(record.read_text())[0]["exit_code"] == 0
    model = target.read_bytes()
    assert main([*argv, "--quick", "-q", "--json", str(target)]) == 2  # (refused before the run)
    assert "demo writes one of its exported models there (--keep" in capsys.readouterr().err
    assert target.read_bytes() == model  # still the model


def test_view_names_a_host_it_cannot_bind(seed_export, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("netron", reason="netron is not installed (pip install 'opbridge[view]')")
    path = str(seed_export("myselu", "dynamo").path)
    assert main(["view", path, "--no-browser", "--host", "nosuch.invalid"]) == 2
    assert "--host 'nosuch.invalid': not an address here" in capsys.readouterr().err
    assert main(["view", path, "--no-browser", "--host", ""]) == 2
    assert "--host is empty" in capsys.readouterr().err


def test_export_names_its_factory_and_one_dim_of_two_sizes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    factory = tmp_path / "factory.py"
    factory.write_text(FACTORY, encoding="utf-8")
    out = tmp_path / "m.onnx"
    assert main(["export", str(factory), "-o", str(out)]) == 2
    assert f"factory {str(factory)!r}: write it as path/to/file.py:factory" in capsys.readouterr().err
    argv = ["export", f"{factory}:build", "-o", str(out), "--dynamic", "x:0=batch", "--dynamic", "x:1=batch"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "both 'batch', one dim, but the example inputs give them sizes" in err and "Traceback" not in err
    assert not out.exists()
    # one axis named twice: the last name won, silently
    for dynamic in (["x:0=a,0=b"], ["x:0=a", "x:0=b"]):
        argv = ["export", f"{factory}:build", "-o", str(out), *[a for d in dynamic for a in ("--dynamic", d)]]
        assert main(argv) == 2
        assert "axis 0 of 'x' is named 'a' already; name it once." in capsys.readouterr().err
        assert not out.exists()
    # export()'s checks of its arguments, named as the command's flags
    for flags, said in (
        (["--dynamic", "y:0=b"], "--dynamic names ['y'], which the model has no input"),
        (["--input-names", "a", "b"], "--input-names ['a', 'b'] name 2 inputs"),
    ):
        assert main(["export", f"{factory}:build", "-o", str(out), *flags]) == 2
        err = capsys.readouterr().err
        assert said in err and "dynamic_axes" not in err and "input_names" not in err, err
        assert not out.exists()


def test_json_on_stdout_is_the_whole_output_when_user_code_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the factory's module printed went to stdout ahead of the JSON (--json - of verify, --json of export),
    which then did not parse."""
    factory = tmp_path / "chatty.py"
    source = FACTORY.replace("tests.cli::", "tests.cli.chatty::").replace(
        "def build():", "def build():\n    print('building')"
    )
    factory.write_text("print('importing')\n" + source, encoding="utf-8")
    out = tmp_path / "m.onnx"
    assert main(["export", f"{factory}:build", "-o", str(out), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["exporter"] == "dynamo" and "building" in captured.err
    argv = ["verify", str(out), "--reference", f"{factory}:build", "--backend", "reference", "--json", "-", "-q"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["exit_code"] == 0 and "building" in captured.err


def test_a_module_in_the_current_folder_is_found_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`python -m opbridge` has the current folder on its path, the opbridge script did not."""
    (tmp_path / "cli_factory_in_cwd.py").write_text(FACTORY.replace("tests.cli::", "tests.cli.cwd::"), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert main(["export", "cli_factory_in_cwd:build", "-o", "m.onnx"]) == 0
    assert (tmp_path / "m.onnx").is_file() and str(tmp_path) not in sys.path
    out = capsys.readouterr().out
    assert out.startswith("m.onnx (dynamo): 1 custom node(s)") and "{" not in out  # (JSON only with --json)
    assert main(["export", "cli_factory_in_cwd:build", "-o", "m.onnx", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["exporter"] == "dynamo" and [n["domain"] for n in record["custom_nodes"]] == ["tests.cli.cwd"]


def test_a_module_given_by_name_is_never_written_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A factory given as ``path.py:fn`` was protected, one given by module name (or a module it imports)
    was not: ``export cli_victim:build -o cli_victim.py`` replaced the user's source with the model."""
    source = FACTORY.replace("tests.cli::", "tests.cli.victim::").replace(
        "import torch, opbridge", "import torch, opbridge, cli_victim_helper"
    )
    (tmp_path / "cli_victim.py").write_text(source, encoding="utf-8")
    (tmp_path / "cli_victim_helper.py").write_text("SIZE = 3\n", encoding="utf-8")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    monkeypatch.chdir(tmp_path)
    for target in ("cli_victim.py", "cli_victim_helper.py"):
        assert main(["export", "cli_victim:build", "-o", target]) == 2
        module = target.removesuffix(".py")
        assert f"{target} is the source of the module {module}, which this run imported" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def _pkgk_model(path: Path, domain: str) -> Path:
    """A model of one ``domain::PkgK`` node, saved at ``path``."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("PkgK", ["x"], ["y"], domain=domain)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)])
    onnx.save(model, str(path))
    return path


KERNEL_FILE = "import opbridge\n{imports}\n@opbridge.kernel('{domain}::PkgK')\ndef k(x):\n    return x\n{tail}"


def test_ops_given_as_a_package_folder_or_a_module_of_a_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A folder given to --ops was taken for a missing file ("no such Python file"); a package's module
    with relative imports, given as a path, failed with no hint of its module name."""
    import opbridge

    folder = tmp_path / "cli_ops_folder_pkg"
    folder.mkdir()
    (folder / "__init__.py").write_text(KERNEL_FILE.format(imports="", domain="tests.cli.folder", tail=""))
    package = tmp_path / "cli_ops_relative_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "util.py").write_text("FACTOR = 2\n")
    (package / "ops.py").write_text(
        KERNEL_FILE.format(imports="from .util import FACTOR", domain="tests.cli.relative", tail="")
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    model = _pkgk_model(tmp_path / "folder.onnx", "tests.cli.folder")
    assert main(["lint", str(model), "--ops", "cli_ops_folder_pkg"]) == 0
    assert opbridge.find_kernel("tests.cli.folder", "PkgK", 1) is not None
    assert "0 warning(s)" in capsys.readouterr().out and str(tmp_path) not in sys.path
    model = _pkgk_model(tmp_path / "relative.onnx", "tests.cli.relative")
    assert main(["lint", str(model), "--ops", "cli_ops_relative_pkg/ops.py"]) == 2
    err = capsys.readouterr().err
    assert "attempted relative import" in err
    assert "give it as the module name cli_ops_relative_pkg.ops instead of a path" in err
    assert main(["lint", str(model), "--ops", "cli_ops_relative_pkg.ops"]) == 0
    assert opbridge.find_kernel("tests.cli.relative", "PkgK", 1) is not None


def test_an_empty_ops_target_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--ops '' was read as the current folder: ": a folder without __init__.py ..." named nothing."""
    model = _pkgk_model(tmp_path / "m.onnx", "tests.cli.empty")
    assert main(["lint", str(model), "--ops", ""]) == 2
    assert "an empty module name or path was given (e.g. --ops '')" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("tail", "code"),
    [("import sys\nsys.exit(0)\n", 0), ("import argparse\nargparse.ArgumentParser().parse_args()\n", 2)],
    ids=["sys-exit", "argparse"],
)
def test_an_ops_file_that_exits_at_import_fails_the_command(
    tail: str, code: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """sys.exit(0) in an --ops file ended opbridge lint with exit code 0 and no output, a false pass; an
    argparse at its top level read opbridge's command line and ended it."""
    ops = tmp_path / "exits_at_import.py"
    ops.write_text(KERNEL_FILE.format(imports="", domain="tests.cli.exits", tail=tail))
    model = _pkgk_model(tmp_path / "m.onnx", "tests.cli.exits")
    argv = ["lint", str(model), "--ops", str(ops)]
    monkeypatch.setattr(sys, "argv", ["opbridge", *argv])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{ops}: importing it exited with code {code}" in err
    assert 'if __name__ == "__main__":' in err


def test_a_factory_that_exits_fails_the_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """sys.exit(0) in a --reference factory ended opbridge verify with exit code 0 and no output: a false pass."""
    factory = tmp_path / "exits_in_factory.py"
    factory.write_text("import sys\n\ndef build():\n    sys.exit(0)\n")
    model = tmp_path / "m.onnx"
    onnx.save(
        helper.make_model(
            helper.make_graph(
                [helper.make_node("Relu", ["x"], ["y"])],
                "g",
                [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
                [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])],
            ),
            opset_imports=[helper.make_opsetid("", 17)],
        ),
        model,
    )
    assert main(["verify", str(model), "--reference", f"{factory}:build"]) == 2
    err = capsys.readouterr().err
    assert f"--reference {factory}:build: the factory exited with code 0" in err, err
    assert main(["export", f"{factory}:build", "-o", str(tmp_path / "out.onnx")]) == 2
    assert "the factory exited with code 0" in capsys.readouterr().err and not (tmp_path / "out.onnx").exists()


@pytest.mark.parametrize("command", ["inspect", "lint", "trt-build"])
def test_files_that_are_not_models_are_named_alike(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty, folder = tmp_path / "empty.onnx", tmp_path / "folder.onnx"
    empty.write_bytes(b"")
    folder.mkdir()
    extra = ["-o", str(tmp_path / "t.engine")] if command == "trt-build" else []
    for path, message in (
        (empty, "not a usable ONNX model"),
        (folder, "is a folder"),
        (Path(os.devnull), "is not a regular file"),
    ):
        assert main([command, str(path), *extra]) == 2, (command, path)
        assert message in capsys.readouterr().err, (command, path)


def test_verbose_goes_before_or_after_the_command() -> None:
    """-v was taken only before the command; after it, argparse refused it as unrecognized. Then one after the
    command replaced the count before it (-vv export ... -v gave INFO, not DEBUG)."""
    from opbridge.cli import _verbosity, build_parser

    parser = build_parser()
    assert _verbosity(parser.parse_args(["inspect", "m.onnx", "-vv"])) == 2
    assert _verbosity(parser.parse_args(["-v", "lint", "m.onnx"])) == 1
    assert _verbosity(parser.parse_args(["-vv", "lint", "m.onnx", "-v"])) == 3
    assert _verbosity(parser.parse_args(["-v", "lint", "m.onnx", "-v"])) == 2
    assert _verbosity(parser.parse_args(["compat", "m.onnx", "--target", "onnxruntime"])) == 0


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["verify", "m.onnx", "--reference", "pkg:factory", "--shapes", "x:1x3"],
            "opbridge verify: error: unrecognized arguments: --shapes x:1x3 (did you mean --shape?)",
        ),
        (
            ["inspect", "m.onnx", "--jsn"],
            "opbridge inspect: error: unrecognized arguments: --jsn (did you mean --json?)",
        ),
        (["inspect", "m.onnx", "extra"], "opbridge inspect: error: unrecognized arguments: extra"),
        (["--bogus", "inspect", "m.onnx"], "opbridge: error: unrecognized arguments: --bogus"),
    ],
    ids=["close-option", "typo", "extra-positional", "before-the-command"],
)
def test_unknown_arguments_are_named_by_their_command(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unknown option was reported under the top-level usage (usage: opbridge [-h] [-v] ...), naming
    neither the command nor the option meant."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    usage = "usage: opbridge [-h]" if argv[0].startswith("-") else f"usage: opbridge {argv[0]} "
    assert usage in err and expected in err and (argv[0] != "--bogus" or "did you mean" not in err)


_TERMINATED_WRITE = """
import os, signal, sys, time
import opbridge._files as files
from opbridge.cli import main

real = files.write_atomic_group


def terminated_midway(group, **kwargs):
    def wrap(write):
        def killed_while_writing(fh):
            fh.write(b"partial")
            fh.flush()
            os.kill(os.getpid(), signal.SIGTERM)  # a SIGTERM while the file is half written
            time.sleep(30)
            write(fh)

        return killed_while_writing

    return real([(path, wrap(write)) for path, write in group], **kwargs)


files.write_atomic_group = terminated_midway
sys.exit(main(sys.argv[1:]))
"""


def test_a_sigterm_while_writing_leaves_no_temporary_file(tmp_path: Path) -> None:
    """SIGTERM's default action ended a write where it stood: the temporary file beside the output (as
    large as the model's data) stayed. The command now unwinds, removes it and exits 143."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("MYSELU", ["x"], ["y"], domain="")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = tmp_path / "legacy.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)]), str(model))
    argv = ["rewrite", str(model), "-o", str(tmp_path / "fixed.onnx"), "--rule", "legacy-domain"]
    done = subprocess.run(
        [sys.executable, "-c", _TERMINATED_WRITE, *argv], capture_output=True, timeout=120, check=False
    )
    assert done.returncode == 143, done.stderr.decode(errors="replace")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["legacy.onnx"]


def test_a_file_name_that_is_not_utf8_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A model named by bytes that are not UTF-8 (Python holds them as surrogates, which onnx's checker,
    ONNX Runtime and the JSON writer refused): lint called the valid model invalid, compat's plain session
    failed, verify --json ended in a traceback, and trt-build's child parser died."""
    from onnx import TensorProto, helper

    value = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 3])  # noqa: E731
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [value("x")], [value("y")])
    raw = os.fsencode(tmp_path) + b"/m\xff.onnx"
    with open(raw, "wb") as fh:
        fh.write(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    path = os.fsdecode(raw)
    assert main(["lint", path]) == 0
    assert "0 error(s)" in capsys.readouterr().out
    assert main(["compat", path, "--target", "onnxruntime"]) == 0
    assert "real backend: ok" in capsys.readouterr().out
    factory = tmp_path / "relu.py"
    factory.write_text("import torch\n\ndef build():\n    return torch.nn.ReLU(), (torch.randn(2, 3),)\n")
    record = tmp_path / "record.json"
    argv = ["verify", path, "--reference", f"{factory}:build", "--backend", "onnxruntime", "--json", str(record)]
    assert main([*argv, "-q"]) == 0
    assert json.loads(record.read_text())["model"] == path
    from opbridge.tensorrt import backend_name

    if backend_name() is None:  # (through opbridge's loader: a bare import of tensorrt_rtx skips its set-up)
        pytest.skip("neither tensorrt nor tensorrt_rtx is installed: trt-build is not tried")
    assert main(["trt-build", path, "-o", str(tmp_path / "m.engine")]) == 2
    assert (
        "the path holds bytes that are not UTF-8 text, which TensorRT's parser cannot open" in capsys.readouterr().err
    )
