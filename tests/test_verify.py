"""``opbridge.verify`` and ``opbridge verify``: records, tolerances, shape sets, exit codes and errors."""

from __future__ import annotations

import itertools
import json
import re
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from conftest import run_script, seed_by_name
from onnx import helper

import opbridge
from opbridge.backends import BACKENDS
from opbridge.backends.base import TensorMeta
from opbridge.cli import main
from opbridge.cli.verify import parse_ranges, parse_shape_sets, parse_tolerances
from opbridge.spec import Tolerance
from opbridge.verify import resolve_shape_sets

pytestmark = pytest.mark.skipif(not BACKENDS["openvino"].available(), reason="openvino is not installed")

MYSELU = seed_by_name("myselu").reference  # opbridge.examples.seeds:myselu_model

# --------------------------------------------------------------------------- a deliberately wrong kernel


@opbridge.op("tests.verify::Offset", tolerances={"float32": Tolerance(rtol=2e-3, atol=1e-4)})
def offset(x: torch.Tensor, amount: float = 1.0) -> torch.Tensor:
    """x + amount."""
    return x + amount


@offset.register_kernel
def _offset_wrong(x: np.ndarray, amount: float) -> np.ndarray:
    """Wrong on purpose: adds amount twice where x > 1."""
    return np.where(x > 1.0, x + 2 * amount, x + amount).astype(x.dtype)


class TwoOutputs(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.relu(x), offset(x, amount=0.5)


def two_outputs_model() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    return TwoOutputs(), (torch.randn(2, 4, generator=torch.Generator().manual_seed(0)),)


@pytest.fixture(scope="module")
def wrong_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("wrong") / "two_outputs.onnx"
    model, args = two_outputs_model()
    opbridge.export(
        model,
        args,
        path,
        exporter="torchscript",
        input_names=["x"],
        output_names=["good", "bad"],
        dynamic_axes={"x": {0: "n"}, "good": {0: "n"}, "bad": {0: "n"}},
    )
    return path


WRONG_REF = f"{__file__}:two_outputs_model"


def test_wrong_kernel_fails_and_names_the_output(wrong_model: Path) -> None:
    record = opbridge.verify(wrong_model, WRONG_REF, backends=["openvino"], shapes=[{"x": (64, 4)}])
    assert record.exit_code == 1
    failed = {o.name for _, o in record.failures()}
    assert failed == {"bad"}
    bad = record.failures()[0][1]
    assert bad.abs.max == pytest.approx(0.5, rel=1e-6)  # the extra amount
    assert "beyond tolerance" in bad.reason
    # The op declares float32 tolerances: they apply to the output it computes, not to relu's.
    assert record.tolerances["bad"] == (Tolerance(2e-3, 1e-4), "declared by tests.verify::Offset")
    assert record.tolerances["good"] == (Tolerance(), "default")


def test_cli_exit_1_on_mismatch_names_output_and_writes_json(wrong_model: Path, tmp_path: Path, capsys) -> None:
    out_json = tmp_path / "report.json"
    code = main(
        [
            "verify",
            str(wrong_model),
            "--reference",
            WRONG_REF,
            "--backend",
            "openvino",
            "--shape",
            "x:64x4",
            "--json",
            str(out_json),
            "-q",
        ]
    )
    text = capsys.readouterr().out
    assert code == 1
    bad_row = next(line for line in text.splitlines() if line.startswith("openvino") and " bad " in line)
    assert bad_row.rstrip().endswith("FAIL")
    good_row = next(line for line in text.splitlines() if line.startswith("openvino") and " good " in line)
    assert good_row.rstrip().endswith("PASS")
    assert "openvino set 1 bad: " in text and "FAIL: 1 of 2 output comparison(s) within tolerance" in text
    data = json.loads(out_json.read_text())
    assert data["exit_code"] == 1 and data["shape_sets"] == [{"x": [64, 4]}]
    outputs = {o["name"]: o for o in data["runs"][0]["outputs"]}
    assert outputs["bad"]["passed"] is False and outputs["good"]["passed"] is True
    assert set(outputs["bad"]["abs"]) == {"max", "mean", "median", "p99"}


def test_per_output_tolerance_override(wrong_model: Path) -> None:
    record = opbridge.verify(
        wrong_model, WRONG_REF, backends=["openvino"], shapes=[{"x": (64, 4)}], tolerances={"bad": (0.0, 0.6)}
    )
    assert record.exit_code == 0
    assert record.tolerances["bad"] == (Tolerance(0.0, 0.6), "--tol")
    assert record.tolerances["good"][1] == "default"


# --------------------------------------------------------------------------- seed models


def test_verify_seed_model_at_several_shapes(seed_export) -> None:
    path = seed_export("myselu", "torchscript", functions=False).path  # MySELU runs as a Python op
    messages: list[str] = []
    record = opbridge.verify(
        path,
        MYSELU,
        backends=["openvino"],
        shapes=[{"image": (1, 1, 5, 7)}, {"image": (3, 1, 12, 9)}],
        progress=messages.append,
    )
    assert record.exit_code == 0, record.table()
    assert [r.shape_set for r in record.runs] == [0, 1]
    assert all(o.passed and o.abs.max < 1e-5 for r in record.runs for o in r.outputs)
    assert any("openvino: set 2/2 image:3x1x12x9" in m for m in messages)
    assert record.backends[0].custom_ops == ["opbridge::MySELU (PyTorch reference)"]


def test_default_shape_is_the_example_and_dims_follow_their_names(seed_export) -> None:
    path = seed_export("strange_net2", "dynamo").path
    record = opbridge.verify(
        path, seed_by_name("strange_net2").reference, backends=["openvino"], shapes=[{"input1": (4, 3, 4, 4)}]
    )
    assert record.exit_code == 0, record.table()
    assert record.shape_sets == [{f"input{i}": (4, 3, 4, 4) for i in range(1, 5)}]
    record = opbridge.verify(path, seed_by_name("strange_net2").reference, backends=["openvino"])
    # the example's shapes, then every dynamic dim one larger (here the shared batch dim)
    assert record.shape_sets == [
        {f"input{i}": (2, 3, 4, 4) for i in range(1, 5)},
        {f"input{i}": (3, 3, 4, 4) for i in range(1, 5)},
    ]
    assert record.exit_code == 0, record.table()
    assert record.set_origins[1].endswith("the example's dynamic dims varied, batch 2->3")
    assert "batch 2->3" in record.table() and record.to_dict()["set_origins"] == record.set_origins
    record = opbridge.verify(path, seed_by_name("strange_net2").reference, backends=["openvino"], vary_dims=False)
    assert record.shape_sets == [{f"input{i}": (2, 3, 4, 4) for i in range(1, 5)}]


def test_same_seed_same_numbers_and_npz_inputs(seed_export, tmp_path: Path) -> None:
    path = seed_export("myselu", "dynamo").path
    a = opbridge.verify(path, MYSELU, backends=["openvino"], seed=3)
    b = opbridge.verify(path, MYSELU, backends=["openvino"], seed=3)
    assert a.runs[0].outputs[0].abs == b.runs[0].outputs[0].abs
    npz = tmp_path / "inputs.npz"
    np.savez(npz, image=np.full((1, 1, 6, 6), 0.25, np.float32))
    rec = opbridge.verify(path, MYSELU, backends=["openvino"], inputs=npz, shapes=[{"image": (2, 1, 3, 3)}])
    assert rec.exit_code == 0 and rec.shape_sets == [{"image": (1, 1, 6, 6)}, {"image": (2, 1, 3, 3)}]


# --------------------------------------------------------------------------- CLI exit codes and errors


def test_cli_exit_0(seed_export, capsys) -> None:
    path = seed_export("super_resolution", "torchscript").path
    code = main(
        [
            "verify",
            str(path),
            "--reference",
            seed_by_name("super_resolution").reference,
            "--backend",
            "openvino",
            "--shape",
            "input:1x3x12x20,size_tensor:1x1x48x40",
            "-q",
        ]
    )
    text = capsys.readouterr().out
    assert code == 0, text
    assert "set 1:     input:1x3x12x20,size_tensor:1x1x48x40" in text
    assert "PASS: 1 of 1 output comparison(s) within tolerance" in text


def test_cli_unknown_backend_is_reported_and_the_others_still_run(seed_export, capsys) -> None:
    path = seed_export("myselu", "torchscript").path
    code = main(["verify", str(path), "--reference", MYSELU, "--backend", "tensorrtt", "--backend", "openvino", "-q"])
    text = capsys.readouterr().out
    assert code == 2
    names = "onnxruntime, onnxruntime-kernels, reference, openvino"
    assert f"error: tensorrtt: unknown backend 'tensorrtt'; choose from {names}" in text
    assert any(line.startswith("openvino") and line.rstrip().endswith("PASS") for line in text.splitlines())


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--reference", "no/such/file.py:build"], "no/such/file.py: no such Python file"),
        (["--reference", "opbridge.examples.seeds"], "write it as path/to/file.py:factory"),
        (
            ["--reference", MYSELU, "--shape", "image:2x3x8x8"],
            "--shape image:2x3x8x8: dim 1 of 'image' is static 1 in the model (batchx1xheightxwidth)",
        ),
        (
            ["--reference", MYSELU, "--shape", "picture:2x1x8x8"],
            "the model has no input 'picture'; its inputs are ['image']",
        ),
        (["--reference", MYSELU, "--shape", "image:2x1x8"], "has rank 4 (batchx1xheightxwidth); give 4 dims"),
        (["--reference", MYSELU, "--tol", "output:fast"], "--tol 'output:fast': write OUTPUT:RTOL,ATOL"),
        (["--reference", MYSELU, "--tol", "logits:1e-3,1e-5"], "the model has no output 'logits'"),
        (
            ["--reference", MYSELU, "--tol", "output:1e-3,inf"],
            "--tol 'output:1e-3,inf': write OUTPUT:RTOL,ATOL with finite numbers >= 0",
        ),
        (["--reference", MYSELU, "--rtol", "inf"], "--rtol inf: a tolerance must be a finite number >= 0"),
        (["--reference", MYSELU, "--atol", "nan"], "--atol nan: a tolerance must be a finite number >= 0"),
        (["--reference", MYSELU, "--seed", "-5"], "--seed -5: the seed is a whole number >= 0"),
        # (said after the reference ran, and its fix asked for the --reference already given)
        (["--reference", MYSELU, "--backend", "torch"], "backend 'torch' is the PyTorch reference (--reference"),
    ],
    ids=[
        "factory-missing-file",
        "factory-no-colon",
        "static-dim",
        "unknown-input",
        "rank",
        "bad-tol",
        "unknown-output",
        "infinite-tol",
        "infinite-rtol",
        "nan-atol",
        "negative-seed",
        "torch-backend",
    ],
)
def test_cli_usage_errors_exit_2(seed_export, capsys, extra: list[str], message: str) -> None:
    path = seed_export("myselu", "torchscript").path
    code = main(["verify", str(path), *extra, "--backend", "openvino", "-q"])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1  # a one-line error


# each mistake as the Python API names it (its argument) and as the command line does (its flag); {npz}: an
# .npz whose image array has rank 3, {missing}: a path where there is no file
@pytest.mark.parametrize(
    ("kwargs", "extra", "api_message", "cli_message"),
    [
        (
            {"seed": -5},
            ["--seed", "-5"],
            "seed=-5: the seed is a whole number >= 0, e.g. seed=0",
            "--seed -5: the seed is a whole number >= 0, e.g. --seed 0",
        ),
        (
            {"rtol": float("inf")},
            ["--rtol", "inf"],
            "rtol=inf: a tolerance must be a finite number >= 0 (an infinite one would pass any value), e.g. rtol=1e-3",
            "--rtol inf: a tolerance must be a finite number >= 0 (an infinite one would pass any value), e.g. "
            "--rtol 1e-3",
        ),
        (
            {"shapes": [{"image": (2, 3, 8, 8)}]},
            ["--shape", "image:2x3x8x8"],
            "shapes: image:2x3x8x8: dim 1 of 'image' is static 1 in the model (batchx1xheightxwidth); only dynamic "
            "dims may change.",
            "--shape image:2x3x8x8: dim 1 of 'image' is static 1 in the model (batchx1xheightxwidth); only dynamic "
            "dims may change.",
        ),
        (
            {"tolerances": {"logits": (1e-3, 1e-5)}},
            ["--tol", "logits:1e-3,1e-5"],
            "tolerances['logits']: the model has no output 'logits'; its outputs are ['output'].",
            "--tol logits: the model has no output 'logits'; its outputs are ['output'].",
        ),
        (
            {"ranges": {"image": (1, 1)}},
            ["--range", "image:1,1"],
            "ranges['image'] = (1, 1): values are drawn from [LO, HI), so LO must be below HI, e.g. "
            "ranges={{'image': (1, 2)}}.",  # (braces doubled: the messages are format strings)
            "--range image:1,1: values are drawn from [LO, HI), so LO must be below HI, e.g. --range image:1,2.",
        ),
        (
            {"inputs": "{missing}"},
            ["--inputs", "{missing}"],
            "inputs={missing!r}: no such file; give the path of an .npz file of the inputs.",
            "--inputs {missing}: no such file; give the path of an .npz file of the inputs.",
        ),
        (
            {"inputs": ["{npz}"]},
            ["--inputs", "{npz}"],
            "inputs[0] = {npz!r}: array image:1x4x4: the model's input 'image' has rank 4 (batchx1xheightxwidth); "
            "give 4 dims.",
            "--inputs {npz}: array image:1x4x4: the model's input 'image' has rank 4 (batchx1xheightxwidth); give 4 "
            "dims.",
        ),
        (
            {"reference": "opbridge.examples.seeds"},
            ["--reference", "opbridge.examples.seeds"],
            "reference 'opbridge.examples.seeds': write it as path/to/file.py:factory or package.module:factory.",
            "--reference 'opbridge.examples.seeds': write it as path/to/file.py:factory or package.module:factory.",
        ),
    ],
    ids=["seed", "rtol", "shape", "tolerance", "range", "inputs-file", "inputs-rank", "reference"],
)
def test_api_errors_name_its_arguments_and_the_cli_its_flags(
    seed_export, tmp_path: Path, capsys, kwargs: dict[str, Any], extra: list[str], api_message: str, cli_message: str
) -> None:
    """verify()'s errors named the command line's flags (--seed -5, --shape image:..., --tol, --range,
    --inputs, --reference) where a Python caller had given seed=, shapes=, tolerances=, ranges=, inputs= or
    reference=; the command keeps naming its flags."""
    files = {"npz": str(tmp_path / "rank3.npz"), "missing": str(tmp_path / "none.npz")}
    np.savez(files["npz"], image=np.zeros((1, 4, 4), np.float32))

    def filled(value: Any) -> Any:
        if isinstance(value, str):
            return value.format(**files)
        return [filled(v) for v in value] if isinstance(value, list) else value

    path = seed_export("myselu", "torchscript").path
    call = {"reference": MYSELU, **{k: filled(v) for k, v in kwargs.items()}}
    with pytest.raises(opbridge.OpbridgeError) as caught:
        opbridge.verify(path, backends=["reference"], **call)
    assert str(caught.value) == api_message.format(**files)
    argv = ["verify", str(path), "--reference", MYSELU, *filled(extra), "--backend", "reference", "-q"]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"opbridge verify: error: {cli_message.format(**files)}\n"


def test_cli_npz_missing_input_exit_2(seed_export, tmp_path: Path, capsys) -> None:
    npz = tmp_path / "in.npz"
    np.savez(npz, img=np.zeros((1, 1, 4, 4), np.float32))
    code = main(
        ["verify", str(seed_export("myselu", "torchscript").path), "--reference", MYSELU, "--inputs", str(npz), "-q"]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert f"--inputs {npz}: no array named 'image'; it holds ['img']" in err


def test_cli_npz_that_does_not_read_exit_2(seed_export, tmp_path: Path, capsys) -> None:
    """An empty or cut archive, or one of object arrays, ended in a traceback and exit 1 (a mismatch)."""
    good = tmp_path / "good.npz"
    np.savez(good, image=np.zeros((1, 1, 4, 4), np.float32))
    (tmp_path / "empty.npz").write_bytes(b"")
    (tmp_path / "cut.npz").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    np.savez(tmp_path / "objects.npz", image=np.array([{"a": 1}], dtype=object))
    model = str(seed_export("myselu", "torchscript").path)
    expected = {
        "empty.npz": "cannot read it as .npz (not a numpy archive: EOFError)",
        "cut.npz": "cannot read it as .npz (not a numpy archive: BadZipFile)",
        "objects.npz": "cannot read its array 'image' (ValueError: Object arrays cannot be loaded when allow_pickle",
    }
    for name, message in expected.items():
        npz = tmp_path / name
        assert main(["verify", model, "--reference", MYSELU, "--inputs", str(npz), "--backend", "reference", "-q"]) == 2
        err = capsys.readouterr().err
        assert f"--inputs {npz}: {message}" in err and "Traceback" not in err


def test_cli_model_that_does_not_load_exit_2(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    assert main(["verify", str(bad), "--reference", MYSELU, "-q"]) == 2
    assert f"{bad}: not a valid ONNX model" in capsys.readouterr().err
    assert main(["verify", str(tmp_path / "none.onnx"), "--reference", MYSELU, "-q"]) == 2
    assert "none.onnx: no such file" in capsys.readouterr().err


def test_cli_custom_op_a_backend_cannot_run_exit_2(wrong_model: Path, tmp_path: Path, capsys) -> None:
    import onnx

    model = onnx.load(str(wrong_model))
    for node in model.graph.node:
        if node.op_type == "Offset":
            node.op_type = "Unheard"
    path = tmp_path / "unknown_op.onnx"
    onnx.save(model, str(path))
    code = main(["verify", str(path), "--reference", WRONG_REF, "-q"])
    text = capsys.readouterr().out
    assert code == 2
    assert (
        "error: openvino: custom op tests.verify::Unheard has no opbridge definition or kernel in this process; "
        "define it with @opbridge.op"
    ) in text
    # every installed backend is tried and reported, one line each
    for name in ("onnxruntime", "reference"):
        if BACKENDS[name].available():
            assert any(line.startswith(f"error: {name}: ") and "Unheard" in line for line in text.splitlines())


# --------------------------------------------------------------------------- parsing


def test_shape_sets_grouping() -> None:
    assert parse_shape_sets(["x:1x3x64x64", "x:2x3x96x128"]) == [{"x": (1, 3, 64, 64)}, {"x": (2, 3, 96, 128)}]
    assert parse_shape_sets(["a:1x3x8x8,b:1x1x16x16", "a:2x3x8x8,b:2x1x4x4"]) == [
        {"a": (1, 3, 8, 8), "b": (1, 1, 16, 16)},
        {"a": (2, 3, 8, 8), "b": (2, 1, 4, 4)},
    ]
    assert parse_shape_sets(["a:1x2", "b:3x4", "a:5x6"]) == [{"a": (1, 2), "b": (3, 4)}, {"a": (5, 6)}]
    assert parse_shape_sets(["a:1,3,8,8,b:2x2"]) == [{"a": (1, 3, 8, 8), "b": (2, 2)}]
    with pytest.raises(opbridge.OpbridgeError, match="write NAME:DIMS"):
        parse_shape_sets(["1x3x8x8"])
    with pytest.raises(opbridge.OpbridgeError, match="write dims as integers"):
        parse_shape_sets(["x:1xax8"])
    # a scalar input, written as the tables print its shape (there was no way to give rank 0)
    assert parse_shape_sets(["x:2x3,s:scalar"]) == [{"x": (2, 3), "s": ()}]
    meta = [TensorMeta("s", np.dtype(np.float32), ())]
    with pytest.raises(
        opbridge.OpbridgeError, match=r"has rank 0 \(scalar\); give 0 dims \(on the command line: --shape s:scalar\)"
    ):
        resolve_shape_sets(meta, [{"s": (1,)}])


def test_tolerance_parsing() -> None:
    assert parse_tolerances(["y:1e-2,1e-4", "z:0,0"]) == {"y": (1e-2, 1e-4), "z": (0.0, 0.0)}
    with pytest.raises(opbridge.OpbridgeError, match="numbers >= 0"):
        parse_tolerances(["y:-1,0"])
    for item in ("y:inf,0", "y:0,inf", "y:1e-3,-inf", "y:nan,0"):
        with pytest.raises(opbridge.OpbridgeError, match="with finite numbers >= 0"):
            parse_tolerances([item])
    with pytest.raises(opbridge.OpbridgeError, match=r"--tol y: given twice \(0.01,0.0001 and 0.1,0\)"):
        parse_tolerances(["y:1e-2,1e-4", "y:0.1,0"])  # (the last one was kept, silently)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rtol": float("inf")}, "^rtol=inf: a tolerance must be a finite number >= 0"),
        ({"atol": float("inf")}, "^atol=inf: a tolerance must be a finite number >= 0"),
        (
            {"tolerances": {"y": (0.0, float("inf"))}},
            r"^tolerances\['y'\] = \(0.0, inf\): Tolerance\(rtol=0.0, atol=inf\): tolerances ",
        ),
    ],
    ids=["rtol", "atol", "tol"],
)
def test_verify_refuses_infinite_tolerances(tmp_path: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(opbridge.OpbridgeError, match=message):
        opbridge.verify(_silu_model(tmp_path), SILU_REFERENCE, backends=["openvino"], **kwargs)


def test_shared_named_dim_given_two_sizes_is_refused() -> None:
    meta = [TensorMeta("x", np.dtype("float32"), ("b", 3)), TensorMeta("idx", np.dtype("int64"), ("b", 3))]
    with pytest.raises(
        opbridge.OpbridgeError,
        match=r"^shapes: idx:4x3: dim 0 of 'idx' is the named dim 'b', which x:3x3 sets to 3; inputs that share "
        r"a named dim must give it one size \(make 'b' 3 or 4 in both\)\.$",
    ):
        resolve_shape_sets(meta, [{"x": (3, 3), "idx": (4, 3)}])
    assert resolve_shape_sets(meta, [{"x": (4, 3), "idx": (4, 3)}]) == [{"x": (4, 3), "idx": (4, 3)}]
    assert resolve_shape_sets(meta, [{"x": (5, 3)}]) == [{"x": (5, 3), "idx": (5, 3)}]


def test_a_dim_written_as_an_expression_is_checked_when_the_set_leaves_out_the_dims_it_reads() -> None:
    """--shape y:3x7 alone, on x (b, n) and y (b, 2*n): the 7 went unchecked (no whole n gives it), x kept
    the example's n and the reference failed on the random values."""
    f32 = np.dtype("float32")
    meta = [TensorMeta("x", f32, ("b", "n")), TensorMeta("y", f32, ("b", "2*n"))]
    example = {"x": (2, 3), "y": (2, 6)}
    with pytest.raises(
        opbridge.OpbridgeError,
        match=r"^shapes: y:3x7: the model declares a dim of 'y' as '2\*n', and no whole n makes it 7; give it a size",
    ):
        resolve_shape_sets(meta, [{"y": (3, 7)}], example)
    assert resolve_shape_sets(meta, [{"y": (3, 8)}], example) == [{"x": (3, 4), "y": (3, 8)}]
    # the smallest whole solution of a division, beyond twice the size
    meta = [TensorMeta("x", f32, ("n",)), TensorMeta("y", f32, ("floor(n/100)",))]
    assert resolve_shape_sets(meta, [{"y": (5,)}], {"x": (300,), "y": (3,)}) == [{"x": (500,), "y": (5,)}]
    # an expression of two dims the set leaves out: they keep the example's sizes, which must give it
    meta = [TensorMeta("a", f32, ("n",)), TensorMeta("b", f32, ("m",)), TensorMeta("y", f32, ("m + n",))]
    example = {"a": (2,), "b": (3,), "y": (5,)}
    with pytest.raises(
        opbridge.OpbridgeError,
        match=r"^shapes: y:7: the model declares a dim of 'y' as 'm \+ n', which is 5 with m 3, n 2 \(the inputs "
        r"this set leaves out keep the example's sizes\); give it 5, or give the inputs holding m, n sizes",
    ):
        resolve_shape_sets(meta, [{"y": (7,)}], example)
    assert resolve_shape_sets(meta, [{"a": (4,), "y": (7,)}], example) == [{"a": (4,), "b": (3,), "y": (7,)}]


def test_a_shape_too_large_to_fill_is_named_not_a_memory_error() -> None:
    """--shape x:99999999999x3 ended verify in numpy's MemoryError (a traceback, exit code 1)."""
    from opbridge.verify import make_inputs

    meta = [TensorMeta("x", np.dtype("float32"), ("n", 3))]
    with pytest.raises(opbridge.OpbridgeError, match=r"^input 'x' at 99999999999x3 would take 1.12e\+03 GiB of random"):
        make_inputs(meta, {"x": (99999999999, 3)}, 0)
    with pytest.raises(opbridge.OpbridgeError, match=r"^input 'x' at 99999999999999999999x3 would take"):
        make_inputs(meta, {"x": (99999999999999999999, 3)}, 0)
    assert make_inputs(meta, {"x": (4, 3)}, 0)["x"].shape == (4, 3)


def test_resolve_shape_sets_needs_a_size_for_unbound_dynamic_dims() -> None:
    meta = [TensorMeta("x", np.dtype("float32"), ("n", 3))]
    with pytest.raises(
        opbridge.OpbridgeError,
        match=r"input 'x' dim 0 \(n\) is dynamic and has no size; give it with shapes=\[\{'x': DIMS\}\] "
        r"\(the model declares nx3: e.g. shapes=\[\{'x': \(4, 3\)\}\]\)\.$",
    ):
        resolve_shape_sets(meta, None, None)
    assert resolve_shape_sets(meta, [{"x": (5, 3)}]) == [{"x": (5, 3)}]


def test_without_pytorch_reference_the_first_backend_is_the_reference(tmp_path: Path) -> None:
    path = _silu_model(tmp_path)
    record = opbridge.verify(path, None, backends=["reference", "openvino"], shapes=[{"x": (3, 8)}])
    assert [(r.backend, r.status) for r in record.runs] == [("reference", "reference"), ("openvino", "pass")]
    assert record.exit_code == 0 and "REFERENCE" in record.table()
    alone = opbridge.verify(path, None, backends=["openvino"], shapes=[{"x": (3, 8)}])
    assert alone.exit_code == 2  # nothing was compared, and the record says why
    why = (
        "nothing to compare against: with no PyTorch reference the first backend to run (openvino) only gives "
        "the reference outputs; pass reference=(model, example_inputs) or a factory, or name a second backend."
    )
    assert alone.errors == [why]
    assert f"error: {why}" in alone.table()
    assert record.errors == []


OPS_FILE = """
import numpy as np
import opbridge


@opbridge.kernel("LegacyCube", domain="")
def legacy_cube(x, *, bias=0.0):
    return x**3 + np.float32(bias)
"""

REFERENCE_FILE = """
import torch


class Cube(torch.nn.Module):
    def forward(self, x):
        return x**3 + 0.25


def build():
    return Cube(), (torch.randn(2, 5),)
"""


def test_cli_ops_file_supplies_the_kernel_of_a_default_domain_op(tmp_path: Path, capsys) -> None:
    """A TorchScript-era model with a custom node in the default domain, its kernel given with --ops."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("LegacyCube", ["x"], ["y"], bias=0.25)],
        "legacy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 5])],
    )
    model = tmp_path / "legacy.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)]), str(model))
    (tmp_path / "legacy_ops.py").write_text(OPS_FILE)
    (tmp_path / "legacy_ref.py").write_text(REFERENCE_FILE)
    args = ["verify", str(model), "--reference", f"{tmp_path / 'legacy_ref.py'}:build", "--backend", "openvino", "-q"]
    assert main(args) == 2
    assert (
        "error: openvino: custom op <default domain>::LegacyCube has no opbridge kernel in this process. "
        'Provide a kernel @opbridge.kernel("LegacyCube", domain="")' in capsys.readouterr().out
    )
    assert main([*args, "--shape", "x:7x5", "--ops", str(tmp_path / "legacy_ops.py")]) == 0
    assert "PASS: 1 of 1 output comparison(s) within tolerance" in capsys.readouterr().out


def _silu_model(tmp_path: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])],
        "silu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8])],
    )
    path = tmp_path / "silu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


SILU_REFERENCE = (torch.nn.SiLU(), (torch.randn(4, 8),))


class _AbsentRunner(opbridge.backends.base.OnnxRunner):
    """A backend whose runtime is not installed on any machine."""

    name = "absent"
    requires = ("opbridge_absent_runtime",)

    def _load(self) -> None:
        try:
            import opbridge_absent_runtime  # type: ignore[import-not-found]  # noqa: F401
        except ImportError as exc:
            raise opbridge.BackendUnavailableError(f"absent backend is not installed ({exc})") from None

    def _infer(self, feed):  # pragma: no cover - never loads
        raise AssertionError


class _NoDeviceRunner(opbridge.backends.base.OnnxRunner):
    """A backend whose runtime imports but finds no device when it loads (as a GPU runtime on a CPU host)."""

    name = "nodevice"

    def _load(self) -> None:
        raise opbridge.BackendUnavailableError("nodevice backend needs a device this machine lacks")

    def _infer(self, feed):  # pragma: no cover - never loads
        raise AssertionError


@pytest.fixture
def absent_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    import opbridge.backends as backends

    monkeypatch.setitem(backends.BACKENDS, "absent", _AbsentRunner)
    monkeypatch.setitem(backends.BACKENDS, "nodevice", _NoDeviceRunner)
    monkeypatch.setattr(backends, "ONNX_BACKENDS", (*backends.ONNX_BACKENDS, "absent", "nodevice"))


def test_missing_backend_is_listed_by_default_and_an_error_when_named(tmp_path: Path, absent_backend) -> None:
    path = _silu_model(tmp_path)
    record = opbridge.verify(path, SILU_REFERENCE)
    absent = next(b for b in record.backends if b.name == "absent")
    assert absent.status == "not installed" and "opbridge_absent_runtime" in absent.message
    assert record.exit_code == 0, record.table()
    assert {r.backend for r in record.runs} >= {"openvino"}
    record = opbridge.verify(path, SILU_REFERENCE, backends=["absent", "openvino", "openvino"])
    assert record.exit_code == 2
    assert [(b.name, b.status) for b in record.backends] == [("absent", "unavailable"), ("openvino", "ran")]
    assert (
        "error: absent: absent backend is not installed (No module named 'opbridge_absent_runtime')" in record.table()
    )
    assert [r.status for r in record.runs] == ["pass", "pass"]  # the example's shape and one with larger dims


def test_backend_that_cannot_load_here_is_listed_by_default_and_an_error_when_named(
    tmp_path: Path, absent_backend
) -> None:
    path = _silu_model(tmp_path)
    record = opbridge.verify(path, SILU_REFERENCE)
    nodevice = next(b for b in record.backends if b.name == "nodevice")
    assert (nodevice.status, nodevice.message) == (
        "not installed",
        "nodevice backend needs a device this machine lacks",
    )
    assert record.exit_code == 0, record.table()
    record = opbridge.verify(path, SILU_REFERENCE, backends=["nodevice", "openvino"])
    assert record.exit_code == 2
    assert "error: nodevice: nodevice backend needs a device this machine lacks" in record.table()


def test_cli_factory_that_raises_exit_2(seed_export, tmp_path: Path, capsys) -> None:
    factory = tmp_path / "broken_factory.py"
    factory.write_text("def build():\n    raise RuntimeError('weights file missing')\n")
    path = seed_export("myselu", "torchscript").path
    assert main(["verify", str(path), "--reference", f"{factory}:build", "--backend", "openvino", "-q"]) == 2
    err = capsys.readouterr().err
    assert f"--reference {factory}:build: building the PyTorch model raised RuntimeError: weights file missing" in err
    # export names it the same way (a traceback before), and writes nothing
    target = tmp_path / "out.onnx"
    assert main(["export", f"{factory}:build", "-o", str(target)]) == 2
    assert "building the PyTorch model raised RuntimeError: weights file missing" in capsys.readouterr().err
    assert not target.exists()


class _NoBatchOfThree(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if x.shape[0] == 3:
            raise ValueError("no batch of 3")
        return torch.relu(x), x + 0.5


def test_a_reference_failing_on_one_set_is_said_once_and_that_set_is_not_compared(wrong_model: Path) -> None:
    reference = (_NoBatchOfThree(), (torch.randn(2, 4),))
    record = opbridge.verify(
        wrong_model,
        reference,
        backends=["reference", "openvino"],
        shapes=[{"x": (2, 4)}, {"x": (3, 4)}],
    )
    assert record.exit_code == 2
    assert record.errors == [
        "set 2 (x:3x4): the PyTorch reference failed: ValueError: no batch of 3; no backend was compared on it."
    ]
    assert [(r.backend, r.shape_set) for r in record.runs] == [("reference", 0), ("openvino", 0)]
    assert record.table().count("no batch of 3") == 1


# --------------------------------------------------------------------------- feeds, declared tolerances, strings


@opbridge.op("tests.verify::Scribble", shape=lambda x: opbridge.TensorInfo(x.shape, x.dtype))
def scribble(x: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(x); its torch kernel also zeroes its input."""
    return x * torch.sigmoid(x)


@scribble.register_function
def _scribble_body(spec: opbridge.OpSpec, opset: int) -> onnx.FunctionProto:
    from onnx import helper

    from opbridge.functions import make_body

    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], [spec.outputs[0].name])]
    return make_body(spec, nodes, opset)


def _scribble_kernel(x: torch.Tensor) -> torch.Tensor:
    y = x * torch.sigmoid(x)
    x.zero_()  # writes into its input
    return y


scribble.register_kernel(_scribble_kernel, kind="torch")


class _Scribbles(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return scribble(x)


def test_a_kernel_writing_into_its_input_cannot_change_the_next_backends_feed(tmp_path: Path) -> None:
    """The reference evaluator hands this torch kernel its feed's memory: the kernel's write is named there
    (as ONNX Runtime's bridge names it), and openvino (running the body) still gets the feed unchanged."""
    path = tmp_path / "scribble.onnx"
    x = torch.randn(2, 3, generator=torch.Generator().manual_seed(0))
    opbridge.export(_Scribbles(), (x,), path, exporter="torchscript", input_names=["x"], output_names=["y"])
    record = opbridge.verify(path, (_Scribbles(), (x,)), backends=["reference", "openvino"])
    assert [(r.backend, r.status) for r in record.runs] == [("reference", "error"), ("openvino", "pass")], (
        record.table()
    )
    assert "tests.verify::Scribble node '/Scribble' wrote input 0 in place" in record.runs[0].error
    assert record.exit_code == 2


@opbridge.op("tests.verify::Loose", tolerances={"float32": Tolerance(rtol=1e-2, atol=2e-2)})
def loose(x: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(x), with an ONNX body and a declared float32 tolerance."""
    return x * torch.sigmoid(x)


@loose.register_function
def _loose_body(spec: opbridge.OpSpec, opset: int) -> onnx.FunctionProto:
    from onnx import helper

    from opbridge.functions import make_body

    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], [spec.outputs[0].name])]
    return make_body(spec, nodes, opset)


class _Loose(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return loose(x)


@pytest.mark.parametrize("functions", [True, False], ids=["with-body", "without-body"])
def test_declared_tolerance_applies_whether_or_not_the_op_has_its_body(tmp_path: Path, functions: bool) -> None:
    path = tmp_path / "loose.onnx"
    x = torch.randn(2, 3)
    opbridge.export(_Loose(), (x,), path, exporter="torchscript", output_names=["y"], functions=functions)
    assert any(f.name == "Loose" for f in onnx.load(str(path)).functions) is functions
    record = opbridge.verify(path, (_Loose(), (x,)), backends=["openvino"])
    assert record.tolerances == {"y": (Tolerance(1e-2, 2e-2), "declared by tests.verify::Loose")}
    assert record.exit_code == 0, record.table()
    if functions:
        return
    # one of --rtol / --atol given: the other stays the declared one
    for kwargs, want in (
        ({"rtol": 0.5}, (Tolerance(0.5, 2e-2), "--rtol; atol declared by tests.verify::Loose")),
        ({"atol": 0.5}, (Tolerance(1e-2, 0.5), "--atol; rtol declared by tests.verify::Loose")),
        ({"rtol": 0.5, "atol": 0.25}, (Tolerance(0.5, 0.25), "--rtol/--atol")),
    ):
        record = opbridge.verify(path, (_Loose(), (x,)), backends=["onnxruntime"], **kwargs)
        assert record.tolerances == {"y": want}


def _string_model(tmp_path: Path) -> Path:
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["s"], ["y"])],
        "strings",
        [helper.make_tensor_value_info("s", TensorProto.STRING, [2])],
        [helper.make_tensor_value_info("y", TensorProto.STRING, [2])],
    )
    path = tmp_path / "strings.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return path


def test_string_input_asks_for_an_npz_and_string_outputs_compare_by_value(tmp_path: Path) -> None:
    path = _string_model(tmp_path)
    backends = [b for b in ("onnxruntime", "reference") if BACKENDS[b].available()]
    if len(backends) < 2:
        pytest.skip("needs onnxruntime and the reference evaluator")
    with pytest.raises(
        opbridge.OpbridgeError,
        match=r"^input 's' has ONNX type string, which verify cannot fill with random values; give its values with "
        r"--inputs FILE.npz",
    ):
        opbridge.verify(path, None, backends=backends)
    npz = tmp_path / "strings.npz"
    np.savez(npz, s=np.array(["a", "bc"]))
    record = opbridge.verify(path, None, backends=backends, inputs=npz)
    assert [r.status for r in record.runs] == ["reference", "pass"], record.table()
    assert record.exit_code == 0


def test_make_inputs_refuses_types_it_cannot_fill() -> None:
    from opbridge.verify import make_inputs

    meta = [TensorMeta("x", np.dtype("float32"), (2,)), TensorMeta("s", None, (2,)), TensorMeta("u", None, (2,))]
    shapes = {"x": (2,), "s": (2,), "u": (2,)}
    with pytest.raises(opbridge.OpbridgeError, match="^input 's' has ONNX type string, "):
        make_inputs(meta, shapes, 0, {"s": "string"})
    feed = make_inputs(meta, shapes, 0)  # an input of unknown type is float32
    assert [feed[k].dtype for k in ("x", "s", "u")] == [np.float32] * 3


@opbridge.op("tests.verify::Swish", shape=lambda x: opbridge.TensorInfo(x.shape, x.dtype))
def swish(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


@swish.register_function(prefer_kernel=True)
def _swish_body(spec, opset):  # type: ignore[no-untyped-def]
    from onnx import helper

    from opbridge.functions import make_body

    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["output"])]
    return make_body(spec, nodes, opset)


swish.register_kernel(lambda x: (x * 2).astype(x.dtype))  # wrong: what the onnxruntime-kernels backend is for


class SwishModel(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return swish(x)


def swish_model() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    return SwishModel(), (torch.randn(2, 3, generator=torch.Generator().manual_seed(1)),)


def test_kernels_the_session_runs_in_place_of_bodies_are_verified(tmp_path: Path) -> None:
    """The file's body is right, the op's kernel (which opbridge.InferenceSession prefers) is wrong:
    onnxruntime runs the body and passes, onnxruntime-kernels runs the kernel and fails."""
    path = tmp_path / "swish.onnx"
    model, args = swish_model()
    opbridge.export(model, args, path, exporter="torchscript", input_names=["x"])
    record = opbridge.verify(path, (model, args), backends=["onnxruntime", "onnxruntime-kernels"])
    assert [(r.backend, r.status) for r in record.runs] == [("onnxruntime", "pass"), ("onnxruntime-kernels", "fail")]
    assert record.exit_code == 1


@opbridge.op("tests.verify::FirstRows")
def first_rows(x: torch.Tensor, k: int = 16) -> torch.Tensor:
    return x[: min(k, x.shape[0])] * 1


class FirstRowsModel(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return first_rows(x)


def test_output_shape_other_than_the_model_declares_fails(tmp_path: Path) -> None:
    """Without a shape rule, torch's trace at batch 20 fixes min(16, batch) at 16: the export refuses such a
    file now, but one written elsewhere says 16 rows where at batch 9 every backend gives 9, as PyTorch does,
    and a runtime trusting the file would not."""
    path = tmp_path / "rows.onnx"
    x = torch.randn(20, 3, generator=torch.Generator().manual_seed(0))
    shapes = ({0: torch.export.Dim("batch")},)
    with pytest.raises(opbridge.ExportError, match=r"gives its output 0 \('output'\) dim 0 the size 16"):
        opbridge.export(FirstRowsModel(), (x,), path, exporter="dynamo", dynamic_shapes=shapes)
    # at batch 9 the file named the rows after the batch, wrong from 17 on: refused too
    with pytest.raises(opbridge.ExportError, match=r"dim 0 the size of the input dim 'batch', which it equals"):
        opbridge.export(FirstRowsModel(), (x[:9],), path, exporter="dynamo", dynamic_shapes=shapes)
    opbridge.export(FirstRowsModel(), (x[:9],), path, exporter="dynamo")
    model = onnx.load(path)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 16  # (as torch fixed it at batch 20)
    onnx.save(model, path)
    record = opbridge.verify(path, (FirstRowsModel(), (x,)), backends=["onnxruntime"], shapes=[{"x": (9, 3)}])
    assert record.exit_code == 1
    (run,) = record.runs
    assert run.status == "fail" and "declares this output as 16x3, but it is 9x3 here" in run.outputs[0].reason
    assert run.outputs[0].abs.max == 0.0, "the values themselves agree"


def test_a_named_output_dim_that_does_not_follow_its_input_fails() -> None:
    """An output declared ``seq`` x 3 like its input but clamped to 4 rows (a TorchScript trace's derived shape
    can say so): at 9 rows the declaration said 9, and verify passed it."""
    f32 = onnx.TensorProto.FLOAT
    nodes = [helper.make_node("Slice", ["x", "zero", "four"], ["y"])]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", f32, ["seq", 3])],
        [helper.make_tensor_value_info("y", f32, ["seq", 3])],
    )
    model.graph.initializer.extend(
        [onnx.numpy_helper.from_array(np.array([v], np.int64), n) for n, v in (("zero", 0), ("four", 4))]
    )
    record = opbridge.verify(model, None, backends=["reference", "onnxruntime"], shapes=[{"x": (2, 3)}, {"x": (9, 3)}])
    assert record.exit_code == 1
    by_set = {(r.backend, r.shape_set): r for r in record.runs}
    assert by_set["onnxruntime", 0].status == "pass", by_set["onnxruntime", 0]
    failed = by_set["onnxruntime", 1]
    assert (
        failed.status == "fail" and "declares this output as seq(=9)x3, but it is 4x3 here" in failed.outputs[0].reason
    )


def test_reference_without_example_inputs_is_named(tmp_path: Path) -> None:
    path = _silu_model(tmp_path)
    with pytest.raises(opbridge.OpbridgeError, match=r"the reference is a SwishModel; give \(model, example_inputs\)"):
        opbridge.verify(path, SwishModel(), backends=["openvino"])  # type: ignore[arg-type]


def test_bfloat16_inputs_are_refused_with_the_way_out(tmp_path: Path) -> None:
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "bf16",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [3])],
        [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [3])],
    )
    path = tmp_path / "bf16.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    with pytest.raises(opbridge.OpbridgeError, match=r"input 'x' is bfloat16, which verify does not feed.*float32"):
        opbridge.verify(path, None, backends=["onnxruntime", "reference"])


def test_inputs_files_are_checked_up_front_and_never_overwritten(seed_export, tmp_path: Path, capsys) -> None:
    """--inputs takes an .npz whose arrays fit the model's inputs (checked as --shape sets are: before any
    backend runs); --json never replaces a file the command reads (the --ops file, the --inputs arrays)."""
    path = str(seed_export("myselu", "torchscript").path)
    base = ["verify", path, "--reference", MYSELU, "--backend", "onnxruntime", "-q"]
    npy = tmp_path / "image.npy"
    np.save(npy, np.zeros((1, 1, 4, 4), np.float32))
    assert main([*base, "--inputs", str(npy)]) == 2
    assert "a single array (.npy), not an archive" in capsys.readouterr().err
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, image=np.zeros((1, 4, 4), np.float32))
    assert main([*base, "--inputs", str(wrong)]) == 2
    assert f"--inputs {wrong}: array image:1x4x4: the model's input 'image' has rank 4" in capsys.readouterr().err
    good = tmp_path / "good.npz"
    np.savez(good, image=np.ones((2, 1, 5, 5), np.float32))
    ops = tmp_path / "ops.py"
    ops.write_text("# no ops here\n")
    before = (good.read_bytes(), ops.read_text())
    for target in (good, ops):
        assert main([*base, "--inputs", str(good), "--ops", str(ops), "--json", str(target)]) == 2
        assert "is one of the input's own files" in capsys.readouterr().err
    assert (good.read_bytes(), ops.read_text()) == before


def test_json_never_replaces_the_models_external_data_file(seed_export, tmp_path: Path, capsys) -> None:
    """The model's external data file is one of the files verify reads: ``--json`` naming it wrote the record
    over the weights, and the model no longer loaded."""
    from onnx import numpy_helper

    model = onnx.load(str(seed_export("myselu", "torchscript").path))
    model.graph.initializer.append(numpy_helper.from_array(np.arange(64, dtype=np.float32), "unused"))
    path = tmp_path / "m.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="m.onnx.data", size_threshold=0)
    data = tmp_path / "m.onnx.data"
    before = data.read_bytes()
    base = ["verify", str(path), "--reference", MYSELU, "--backend", "onnxruntime", "-q"]
    assert main([*base, "--json", str(data)]) == 2
    assert f"{data} is one of the input's own files ({data})" in capsys.readouterr().err
    assert data.read_bytes() == before
    assert main([*base, "--json", str(tmp_path / "record.json")]) == 0


def test_api_arguments_are_checked() -> None:
    """A seed, shape set or backend list of the wrong kind is an OpbridgeError saying how to write it."""
    model = str(Path(__file__).parent / "data" / "missing.onnx")  # (refused before the model is read)
    with pytest.raises(opbridge.OpbridgeError, match="the seed is a whole number >= 0"):
        opbridge.verify(model, seed=-1)
    meta = [TensorMeta("x", np.dtype("float32"), ("n", 5))]
    for bad in ((-1, 5), "2x5", (2.5, 5)):
        with pytest.raises(opbridge.OpbridgeError, match="give its dims as whole numbers >= 0"):
            resolve_shape_sets(meta, [{"x": bad}])


def test_python_forms_of_the_arguments(wrong_model: Path, tmp_path: Path) -> None:
    """One dict is one shape set and one tensor one example input; arrays, numbers and strings where a
    set, a tolerance or a backend list belongs are named with the form to write."""
    model, (x,) = two_outputs_model()
    record = opbridge.verify(wrong_model, (model, x), backends=["reference"], shapes={"x": (3, 4)})
    assert record.shape_sets == [{"x": (3, 4)}]
    assert [r.status for r in record.runs] == ["fail"]  # (the kernel of `bad` is wrong; `good` compared)
    assert record.failures()[0][1].name == "bad"
    for kwargs, message in [
        ({"shapes": ["x:3x5"]}, r"shapes=\['x:3x5'\]: give a list of sets, each a dict .*--shape x:1x3x64x64"),
        ({"inputs": np.zeros((2, 5), np.float32)}, r"inputs: a ndarray is neither an .npz path nor a dict"),
        ({"tolerances": {"good": 1e-3}}, r"tolerances\['good'\] = 0.001: give a Tolerance or a pair"),
        ({"backends": []}, r"backends=\[\] names no backend; choose from"),
    ]:
        with pytest.raises(opbridge.OpbridgeError, match=message):
            opbridge.verify(wrong_model, WRONG_REF, **kwargs)


def test_the_record_is_never_written_over_a_file_verify_read(wrong_model: Path, tmp_path: Path) -> None:
    npz = tmp_path / "inputs.npz"
    np.savez(npz, x=np.ones((2, 4), np.float32))
    record = opbridge.verify(wrong_model, WRONG_REF, backends=["reference"], inputs=str(npz))
    before = {p: p.read_bytes() for p in (wrong_model, npz, Path(__file__))}
    for target in before:
        # (this file is the source of a module the run imported, which is refused as such first)
        own = "is the source of the module" if target == Path(__file__) else "is one of the input.s own files"
        with pytest.raises(opbridge.OutputPathError, match=own):
            record.write_json(target)
    assert {p: p.read_bytes() for p in before} == before
    assert json.loads(record.write_json(tmp_path / "record.json").read_text())["exit_code"] == record.exit_code


def _argmax_model() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    class ArgMax(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x.argmax(dim=1), torch.relu(x)

    return ArgMax(), (torch.randn(3, 4),)


def test_integer_outputs_are_exact_and_say_so(tmp_path: Path) -> None:
    """An integer output is compared exactly: the record says so, and a --tol for it is refused (it was
    accepted, recorded and not applied)."""
    path = tmp_path / "argmax.onnx"
    opbridge.export(*_argmax_model(), path, output_names=["index", "act"])
    ref = (_argmax_model()[0], _argmax_model()[1])
    record = opbridge.verify(path, ref, backends=["onnxruntime"], rtol=0.5)
    assert record.tolerances["index"] == (Tolerance(0.0, 0.0), "exact (int64 output)")
    assert record.tolerances["act"][0] == Tolerance(0.5, Tolerance().atol)
    with pytest.raises(opbridge.OpbridgeError, match="output 'index' is int64, which verify compares exactly"):
        opbridge.verify(path, ref, backends=["onnxruntime"], tolerances={"index": (1.0, 5.0)})


def test_an_input_without_a_declared_shape_is_not_a_scalar(tmp_path: Path) -> None:
    """ONNX Runtime describes an input whose shape the model leaves out as shape []: it was taken for a
    scalar, and every set was refused."""
    path = tmp_path / "relu.onnx"
    opbridge.export(*_argmax_model(), path, output_names=["index", "act"], dynamic_shapes=({0: torch.export.Dim("n")},))
    model = onnx.load(path)
    model.graph.input[0].type.tensor_type.ClearField("shape")
    onnx.save(model, path)
    record = opbridge.verify(path, _argmax_model(), backends=["onnxruntime", "reference"], shapes=[{"x": (5, 4)}])
    assert [r.status for r in record.runs] == ["pass", "pass"], [r.error for r in record.runs]


def test_declared_tolerances_are_checked_at_definition() -> None:
    """An op's tolerances are keyed by dtype name (a typo was never looked up) and given as Tolerance or an
    (rtol, atol) pair (a pair failed later, in verify)."""
    with pytest.raises(opbridge.OpDefinitionError, match="got 'fp32'"):

        @opbridge.op("tests.verify::TolTypo", tolerances={"fp32": Tolerance(1e-2, 1e-3)})
        def typo(x: torch.Tensor) -> torch.Tensor:
            return x

    @opbridge.op("tests.verify::TolPair", tolerances={"float32": (1e-2, 1e-3)})
    def pair(x: torch.Tensor) -> torch.Tensor:
        return x

    assert pair.spec.tolerances == {"float32": Tolerance(1e-2, 1e-3)}


def test_records_say_how_each_custom_op_ran(tmp_path: Path) -> None:
    """Each backend's record lists how it ran each custom op; where onnxruntime-kernels ran a body because
    no @opbridge.op is defined for it here, it says so (it then checked no kernel)."""
    from onnx import TensorProto, helper

    body = helper.make_function(
        "tests.undefined", "Act", ["x"], ["y"], [helper.make_node("Relu", ["x"], ["y"])], [helper.make_opsetid("", 17)]
    )
    graph = helper.make_graph(
        [helper.make_node("Act", ["x"], ["y"], domain="tests.undefined")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("tests.undefined", 1)], functions=[body]
    )
    path = tmp_path / "act.onnx"
    onnx.save(model, path)
    record = opbridge.verify(path, backends=["onnxruntime", "onnxruntime-kernels", "reference"])
    reports = {b.name: b for b in record.backends}
    assert reports["onnxruntime"].custom_ops == ["tests.undefined::Act (function body)"]
    assert reports["reference"].custom_ops == ["tests.undefined::Act (function)"]
    assert "no @opbridge.op is defined for it in this process" in reports["onnxruntime-kernels"].message
    assert reports["onnxruntime"].message == ""
    assert "note: onnxruntime-kernels: tests.undefined::Act" in record.table()


def test_a_factory_importing_a_sibling_module_when_called(tmp_path: Path) -> None:
    """The factory's folder is on sys.path while it runs, as while its file was imported: an import inside
    the factory finds the modules beside it (it raised ModuleNotFoundError)."""
    (tmp_path / "sibling_net.py").write_text("import torch\n\ndef build():\n    return torch.nn.ReLU()\n")
    (tmp_path / "factory.py").write_text(
        "import torch\n\ndef make():\n    import sibling_net\n\n    return sibling_net.build(), (torch.randn(2, 3),)\n"
    )
    path = tmp_path / "relu.onnx"
    opbridge.export(torch.nn.ReLU(), (torch.randn(2, 3),), path)
    record = opbridge.verify(path, f"{tmp_path / 'factory.py'}:make", backends=["onnxruntime"])
    assert [r.status for r in record.runs] == ["pass"]
    import sys

    assert str(tmp_path) not in sys.path  # taken off again


class _SameTwice(torch.nn.Module):
    def __init__(self, last: float = 1.0) -> None:
        super().__init__()
        self.last = last

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        a = torch.sigmoid(x)
        return a, x + 1, (a if self.last == 1.0 else a * self.last)


def test_an_output_listed_twice_is_compared_once_and_must_be_one_value(tmp_path: Path) -> None:
    """torch.onnx's TorchScript exporter lists ``(a, b, a)`` as outputs ``['1', '3', '1']``: one value,
    compared once, with a note; a PyTorch model returning different tensors at those places does not match
    the file. (opbridge.export gives the repeat a name of its own: the file is torch.onnx's.)"""
    path = tmp_path / "same_twice.onnx"
    example = (torch.randn(2, 4),)
    torch.onnx.export(_SameTwice(), example, str(path), dynamo=False)
    names = [o.name for o in onnx.load(str(path)).graph.output]
    assert len(names) == 3 and names[0] == names[2] != names[1]
    record = opbridge.verify(path, (_SameTwice(), example), backends=["onnxruntime"])
    assert record.exit_code == 0, record.table()
    assert [o.name for o in record.runs[0].outputs] == names[:2]
    note = f"output {names[0]!r} is listed at positions [0, 2] of the model's outputs: one value, compared once"
    assert record.notes == [note]
    assert record.to_dict()["notes"] == record.notes
    wrong = opbridge.verify(path, (_SameTwice(last=3.0), example), backends=["onnxruntime"])
    assert wrong.exit_code == 2 and not wrong.runs
    assert f"the model lists output {names[0]!r} at positions 0 and 2" in wrong.errors[0]
    assert "export it again from this model" in wrong.errors[0]


class _Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x: torch.Tensor, s: float) -> torch.Tensor:
        return self.drop(torch.relu(x)) * s


def test_the_callers_model_keeps_its_mode_and_python_numbers_are_example_inputs(tmp_path: Path) -> None:
    """verify left the caller's model in eval mode, and failed on a float among the example inputs."""
    path = tmp_path / "scaled.onnx"
    model = _Scaled().eval()
    x = torch.randn(2, 3)
    opbridge.export(model, (x, 2.0), path, exporter="torchscript", input_names=["x", "s"])
    model.train()
    record = opbridge.verify(path, (model, (x, 2.0)), backends=["onnxruntime"])
    assert record.exit_code == 0, record.table()
    assert model.training


# --------------------------------------------------------------------------- proofs that prove nothing


@opbridge.op("tests.verify::LooseTol", tolerances={"float32": Tolerance(rtol=0.1, atol=1e-2)})
def loose_tol(x: torch.Tensor) -> torch.Tensor:
    return x * 0.5


@opbridge.op("tests.verify::FivePercent")
def five_percent(x: torch.Tensor) -> torch.Tensor:
    return x * 3.0


@five_percent.register_kernel
def _five_percent_wrong(x: np.ndarray) -> np.ndarray:
    return (x * 3.0 * 1.05).astype(x.dtype)  # 5% off on purpose


@opbridge.op("tests.verify::Exact", tolerances={"float32": Tolerance(0.0, 0.0)})
def exact(x: torch.Tensor) -> torch.Tensor:
    return x + 1.0


@opbridge.op("tests.verify::HalfTol", tolerances={"float16": Tolerance(rtol=1e-2, atol=1e-3)})
def half_tol(x: torch.Tensor) -> torch.Tensor:
    return x * 0.25


class _Mixed(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return loose_tol(x), five_percent(x), exact(x) * 3.0, exact(x).reshape(-1), half_tol(x.half()).float()


def test_declared_tolerances_apply_to_the_outputs_their_ops_compute(tmp_path: Path) -> None:
    """A loose op's tolerance covered every output of the model, so another op 5% off passed beside
    it; an exact op's tolerance failed the ordinary rounding of arithmetic after it; a float16 op's
    tolerance was lost after a cast to float32. Each output now takes the tolerances of the ops it
    is computed from, and the default where anything else rounds on the way."""
    path = tmp_path / "mixed.onnx"
    example = (torch.randn(2, 8),)
    names = ["loose", "five", "exact_mul", "exact_reshape", "half"]
    opbridge.export(_Mixed(), example, path, exporter="torchscript", input_names=["x"], output_names=names)
    record = opbridge.verify(path, (_Mixed(), example), backends=["onnxruntime"])
    tols = record.tolerances
    assert tols["loose"] == (Tolerance(0.1, 1e-2), "declared by tests.verify::LooseTol")
    assert tols["five"] == (Tolerance(), "default")
    assert tols["exact_mul"][0] == Tolerance()
    assert tols["exact_mul"][1].startswith("declared by tests.verify::Exact; default for Mul")
    assert tols["exact_reshape"] == (Tolerance(0.0, 0.0), "declared by tests.verify::Exact")
    assert tols["half"] == (Tolerance(1e-2, 1e-3), "declared by tests.verify::HalfTol")
    assert record.exit_code == 1
    assert {o.name for _, o in record.failures()} == {"five"}  # (each set)


def test_every_output_of_a_long_chain_takes_the_tolerances_of_what_computes_it() -> None:
    """Each output of a chain that exposes every block's output (as a feature pyramid does) takes what
    is upstream of it: the exact op's tolerance from where it enters, the default from the first Mul."""
    from opbridge.verify import _output_tolerances

    n = 60
    nodes, outputs = [], []
    for k in range(n):
        src = "x" if k == 0 else f"v{k - 1}"
        if k == n // 2:
            nodes.append(helper.make_node("Exact", [src], [f"v{k}"], domain="tests.verify", name=f"exact{k}"))
        else:
            op = "Relu" if k < n // 2 + 5 else "Mul"
            nodes.append(helper.make_node(op, [src] if op == "Relu" else [src, src], [f"v{k}"], name=f"n{k}"))
        outputs.append(helper.make_tensor_value_info(f"v{k}", onnx.TensorProto.FLOAT, [4]))
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4])], outputs
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("tests.verify", 1)]
    )
    meta = [TensorMeta(f"v{k}", np.dtype("float32"), (4,)) for k in range(n)]
    tols = _output_tolerances(model, meta, None, None, None)
    for k in range(n):
        want = (
            "default"
            if k < n // 2
            else "declared by tests.verify::Exact"
            if k < n // 2 + 5
            else "declared by tests.verify::Exact; default for Mul"
        )
        assert tols[f"v{k}"][1] == want, k


FACTORY_ONLY_OP = """
    import numpy as np
    import torch
    import opbridge
    from opbridge.spec import Tolerance

    @opbridge.op("tests.verifyfactory::Strict", tolerances={"float32": Tolerance(0.0, 0.0)})
    def strict(x: torch.Tensor) -> torch.Tensor:
        return x * 3.0

    @strict.register_kernel
    def _(x):
        return np.nextafter(x * np.float32(3.0), np.float32(np.inf)).astype(np.float32)  # 1 ulp up

    class M(torch.nn.Module):
        def forward(self, x):
            return strict(x)

    def build():
        return M(), (torch.randn(2, 5),)
"""


def test_tolerances_declared_by_ops_the_factory_defines_apply(tmp_path: Path) -> None:
    """Tolerances were looked up before the --reference factory was imported: an op defined only
    there fell back to the default one, and its kernel 1 ulp off passed its exact tolerance."""
    (tmp_path / "strict_net.py").write_text(textwrap.dedent(FACTORY_ONLY_OP))
    model = tmp_path / "strict.onnx"
    run_script(
        tmp_path,
        f"""
        import sys; sys.path.insert(0, {str(tmp_path)!r})
        import opbridge, strict_net
        m, args = strict_net.build()
        opbridge.export(m, args, {str(model)!r}, exporter="torchscript", input_names=["x"])
        """,
    )
    out = run_script(
        tmp_path,
        f"""
        import opbridge
        record = opbridge.verify({str(model)!r}, {str(tmp_path / "strict_net.py")!r} + ":build",
                                 backends=["onnxruntime"])
        print(record.exit_code, list(record.tolerances.values())[0][1])
        """,
    )
    assert out.split("\n")[0] == "1 declared by tests.verifyfactory::Strict"


class _Tiny(torch.nn.Module):
    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x.to(self.dtype)
        return torch.sqrt(-x.abs() - 1.0), x * 1e-7


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_outputs_that_cannot_fail_are_named(tmp_path: Path, dtype: torch.dtype) -> None:
    """An output that is NaN everywhere in the reference passed with nothing compared; one whose every
    value lies within atol of zero passed whatever a backend gave (zeros included). bfloat16 outputs
    (ml_dtypes' arrays, which numpy's isnan does not take) were not checked at all."""
    path = tmp_path / "tiny.onnx"
    example = (torch.randn(3, 4),)
    model = _Tiny(dtype)
    opbridge.export(model, example, path, exporter="torchscript", input_names=["x"], output_names=["nan", "tiny"])
    backend = "onnxruntime" if dtype == torch.float32 else "reference"  # (ONNX Runtime has no bfloat16 Sqrt)
    record = opbridge.verify(path, (model, example), backends=[backend])
    assert record.exit_code == 2, record.table()
    assert len(record.errors) == 1
    assert "output 'nan': every value of the PyTorch reference is NaN, so nothing of it is compared" in record.errors[0]
    assert "--inputs FILE.npz" in record.errors[0]
    # (its row said PASS, and the summary counted it within tolerance)
    by_output = {o.name: o for r in record.runs for o in r.outputs}
    assert (
        not by_output["nan"].passed
        and by_output["nan"].reason == "every value of the reference is NaN: nothing compared"
    )
    assert [o.name for _, o in record.failures()] == ["nan"], record.failures()
    assert "1 of 2 output comparison(s) within tolerance" in record.table(), record.table()
    atol = "1e-05" if dtype == torch.float32 else "0.008"  # (the default for bfloat16)
    assert any(
        f"output 'tiny': every value of the PyTorch reference is within atol {atol} of zero" in n for n in record.notes
    )


class _NegOnly(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return -x


def test_a_reference_that_does_not_match_the_file_is_said_plainly() -> None:
    """A reference giving one output for a file of two was blamed on the random input values (give --range,
    --inputs; "the random values are at fault, not the shapes"), which no values can mend."""
    f32 = onnx.TensorProto.FLOAT
    model = _model(
        [helper.make_node("Neg", ["x"], ["y"]), helper.make_node("Abs", ["x"], ["z"])],
        [helper.make_tensor_value_info("x", f32, ["n", 3])],
        [helper.make_tensor_value_info("y", f32, ["n", 3]), helper.make_tensor_value_info("z", f32, ["n", 3])],
    )
    record = opbridge.verify(model, (_NegOnly(), (torch.randn(2, 3),)), backends=["onnxruntime"])
    assert record.exit_code == 2
    text = " ".join([*record.errors, *record.notes])
    assert "the reference returned 1 tensor(s), the model has 2 output(s)" in text, text
    assert "the ONNX file does not match the PyTorch model" in text, text
    assert "--range" not in text and "random values" not in text, text


class _WithSize(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        return x * 2, x.shape[0]


def test_a_python_number_the_model_returns_is_compared(tmp_path: Path) -> None:
    """A model returning a size next to a tensor exports it as a 0-d int64 output; the PyTorch side failed
    on it ("'int' object has no attribute 'detach'") and blamed the random inputs."""
    path = tmp_path / "size.onnx"
    example = (torch.randn(3, 4),)
    opbridge.export(
        _WithSize(), example, path, exporter="torchscript", input_names=["x"], dynamic_axes={"x": {0: "batch"}}
    )
    record = opbridge.verify(path, (_WithSize(), example), backends=["onnxruntime"])
    assert record.exit_code == 0, record.table()
    compared = [o for run in record.runs for o in run.outputs]
    assert len(compared) == 4  # two outputs at two batch sizes
    size = [o for o in compared if o.dtype == "int64"]
    assert len(size) == 2 and all(o.shape == () and o.passed for o in size)


class _UnusedMask(torch.nn.Module):
    def forward(self, x: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
        return x * scale


class _UnusedMaskNoScale(torch.nn.Module):
    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return x * 2.0


class _AnyArgs(torch.nn.Module):
    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return xs[0] * 2.0


@pytest.mark.parametrize(
    ("exporter", "inputs"), [("torchscript", ["x"]), ("dynamo", ["x", "mask"])], ids=["torchscript", "dynamo"]
)
def test_inputs_the_exporter_dropped_keep_their_example_values(
    tmp_path: Path, exporter: str, inputs: list[str]
) -> None:
    """The TorchScript exporter drops an input the outputs do not use, and dynamo folds a number into a
    constant: verify refused the model, asking for one example per model input, which the PyTorch model
    cannot be called with. The model's inputs now go to forward's parameters of their names."""
    path = tmp_path / "unused.onnx"
    example = (torch.randn(3, 4), torch.ones(3, 4, dtype=torch.bool))
    model = _UnusedMask() if exporter == "dynamo" else _UnusedMaskNoScale()
    args = (*example, 2.0) if exporter == "dynamo" else example
    opbridge.export(model, args, path, exporter=exporter)
    assert [i.name for i in onnx.load(path).graph.input] == inputs
    record = opbridge.verify(path, (model, args), backends=["onnxruntime"])
    assert record.exit_code == 0, record.table()
    assert record.runs and all(r.status == "pass" for r in record.runs)
    with pytest.raises(opbridge.OpbridgeError, match=r"name the model's inputs after forward's parameters"):
        opbridge.verify(path, (_AnyArgs(), (*example, 2.0)), backends=["onnxruntime"])


_CALLS = itertools.count()


class _Drifting(torch.nn.Module):
    """Another answer on each call (a count outside the module: verify runs a copy of it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 0.01 * next(_CALLS)


class _Accumulating(torch.nn.Module):
    """Returns its state, changed in place on each call (not a copy of it)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("state", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.state.add_(x.sum(0))
        return self.state


@pytest.mark.parametrize("module", [_Drifting, _Accumulating], ids=["drifting", "returns-its-own-state"])
def test_a_reference_that_does_not_repeat_itself_is_named(tmp_path: Path, module: type[torch.nn.Module]) -> None:
    """returns-its-own-state: verify kept the returned tensor's memory as the expected values, so later calls
    rewrote set 1's, and the run again wrote what it was compared with: the note never came."""
    path = tmp_path / "drift.onnx"
    example = (torch.randn(3, 4),)
    opbridge.export(module(), example, path, exporter="torchscript", input_names=["x"])
    record = opbridge.verify(path, (module(), example), backends=["onnxruntime"])
    assert record.exit_code == 1
    assert any("the PyTorch reference gives other numbers when run again" in n for n in record.notes), record.notes
    if module is _Drifting:
        other = opbridge.verify(path, (_Shifted(), example), backends=["onnxruntime"])
        assert other.exit_code == 1 and not other.notes  # a plain mismatch: the reference repeats itself


_KEPT: dict[tuple[int, ...], np.ndarray] = {}


@opbridge.op("tests.verify.kept::Twice")
def _twice_kept(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_twice_kept.register_kernel
def _(x: np.ndarray) -> np.ndarray:
    out = _KEPT.setdefault(x.shape, np.empty(x.shape, x.dtype))  # one buffer per shape, handed back each call
    np.multiply(x, 2, out=out)
    return out


@_twice_kept.register_function
def _(spec: Any, opset: int) -> Any:  # (ONNX Runtime runs the body, so the kernel's buffer keeps set 2's values)
    from onnx import helper

    from opbridge.functions import make_body

    return make_body(spec, [helper.make_node("Add", ["x", "x"], ["output"])], opset)


def test_without_a_reference_the_first_backends_results_are_kept_as_copies(tmp_path: Path) -> None:
    """The first backend's outputs became the expected values as they were: a kernel (through ReferenceSession)
    handing back a buffer it keeps rewrote set 1's with set 2's, and a correct second backend failed."""

    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return _twice_kept(x)

    path = tmp_path / "kept.onnx"
    opbridge.export(Model(), (torch.randn(2, 4),), path, exporter="torchscript", input_names=["x"])
    record = opbridge.verify(path, None, backends=["reference", "onnxruntime"], shapes=[{"x": (2, 4)}, {"x": (2, 4)}])
    assert record.exit_code == 0, record.table()
    assert [r.status for r in record.runs if r.backend == "onnxruntime"] == ["pass", "pass"]


class _Shifted(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 5.0


def test_several_inputs_files_are_sets_of_their_own(seed_export, tmp_path: Path, capsys) -> None:
    path = seed_export("myselu", "dynamo").path
    ref = seed_by_name("myselu").reference
    rng = np.random.default_rng(0)
    files = []
    for n, shape in enumerate([(1, 1, 5, 7), (2, 1, 6, 9)]):
        files.append(tmp_path / f"set{n}.npz")
        np.savez(files[-1], image=rng.standard_normal(shape).astype(np.float32))
    argv = ["verify", str(path), "--reference", ref, "--backend", "onnxruntime", "--inputs", str(files[0])]
    assert main([*argv, "--inputs", str(files[1]), "-q"]) == 0
    out = capsys.readouterr().out
    assert f"set 1:     image:1x1x5x7  (--inputs {files[0]})" in out
    assert f"set 2:     image:2x1x6x9  (--inputs {files[1]})" in out
    assert "set 3" not in out  # (given arrays: no random set is added)


@opbridge.op("tests.verify::FirstRowOnly")
def first_row_only(x: torch.Tensor) -> torch.Tensor:
    return x - x.mean(-1, keepdim=True)


@first_row_only.register_kernel
def _first_row_only(x: np.ndarray) -> np.ndarray:
    return (x[:1] - x[:1].mean(-1, keepdims=True)).astype(np.float32)  # wrong on purpose: batch 1 only


class _FirstRowOnly(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return first_row_only(x)


def test_a_kernel_result_of_another_size_is_refused_by_every_backend(tmp_path: Path) -> None:
    """OpenVINO took a (1, 3, w) result for a (batch, 3, w) output, its dims being dynamic when compiled,
    and handed on memory nothing wrote. Each backend now names the kernel's shape at the second set, as a
    failure (exit 1): the backend ran, and its result is wrong."""
    path = tmp_path / "first_row.onnx"
    example = (torch.randn(1, 3, 8),)
    opbridge.export(
        _FirstRowOnly(), example, path, exporter="torchscript", input_names=["x"], dynamic_axes={"x": {0: "b"}}
    )
    record = opbridge.verify(path, (_FirstRowOnly(), example), backends=["onnxruntime-kernels", "openvino"])
    assert [(r.backend, r.shape_set, r.status) for r in record.runs] == [
        ("onnxruntime-kernels", 0, "pass"),
        ("onnxruntime-kernels", 1, "fail"),  # (a wrong result: a failure, exit 1, not an error)
        ("openvino", 0, "pass"),
        ("openvino", 1, "fail"),
    ]
    assert record.exit_code == 1
    assert "returned shape 1x3x8 for output 0" in record.runs[3].error
    assert "has shape" in record.runs[1].error and "onnxruntime-kernels set 2: " in record.table()
    assert "2x3x8" in record.runs[3].error or "[2,3,8]" in record.runs[3].error


def test_backends_that_ran_the_reference_as_the_kernel_say_so(tmp_path: Path) -> None:
    path = tmp_path / "loose.onnx"
    example = (torch.randn(2, 3),)
    opbridge.export(_LooseOnly(), example, path, exporter="torchscript", input_names=["x"])
    record = opbridge.verify(path, (_LooseOnly(), example), backends=["onnxruntime-kernels"])
    assert record.exit_code == 0
    assert (
        "note: onnxruntime-kernels ran the PyTorch reference of tests.verify::LooseTol as the kernel" in record.table()
    )


class _LooseOnly(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return loose_tol(x)


@opbridge.op("tests.verify::ToBFloat16")
def _to_bfloat16(x: torch.Tensor) -> torch.Tensor:
    return (x * 3).to(torch.bfloat16)


def test_bfloat16_outputs_compare_by_value_and_backends_without_them_say_so(tmp_path: Path) -> None:
    """A bfloat16 output is compared by value where a backend runs it (the reference evaluator); ONNX
    Runtime's bridge and OpenVINO's Python ops, which take no bfloat16, refuse the node by name."""

    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return _to_bfloat16(x)

    x = torch.randn(2, 3)
    path = tmp_path / "bf16.onnx"
    opbridge.export(Model(), (x,), path, exporter="torchscript")
    record = opbridge.verify(path, (Model(), (x,)), backends=["reference", "onnxruntime", "openvino"])
    runs = {r.backend: r for r in record.runs}
    assert runs["reference"].status == "pass" and runs["reference"].outputs[0].dtype == "bfloat16"
    text = "\n".join(record.errors + [b.message for b in record.backends])
    assert re.search(r"output '\w+' is bfloat16, which ONNX Runtime's Python bridge does not pass to kernels", text)
    if "openvino" in BACKENDS and BACKENDS["openvino"].available():
        assert re.search(r"output '\w+' is bfloat16, which OpenVINO's Python ops do not take", text)


def test_cli_json_dash_writes_the_record_to_stdout(seed_export, tmp_path: Path, capsys) -> None:
    """``--json -`` is stdout, as for the commands whose --json is a flag (it wrote a file named "-"):
    the record alone there, for a pipe, and the table on stderr."""
    path = seed_export("myselu", "torchscript").path
    code = main(["verify", str(path), "--reference", MYSELU, "--backend", "reference", "--json", "-", "-q"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["exit_code"] == 0
    assert "PASS:" in err
    assert not (Path.cwd() / "-").exists()


# --------------------------------------------------------------------------- value ranges of random inputs


class _Take(torch.nn.Module):
    def forward(self, table: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return table[idx]


def take_model() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    return _Take(), (torch.zeros(4, 3), torch.tensor([0, 1, 2, 3, 0, 1]))


@pytest.fixture(scope="module")
def take_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Gather of rows of a 4x3 table by an int64 index input of dynamic length (built, not exported)."""
    from onnx import TensorProto

    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "idx"], ["y"], axis=0)],
        "take",
        [
            helper.make_tensor_value_info("table", TensorProto.FLOAT, [4, 3]),
            helper.make_tensor_value_info("idx", TensorProto.INT64, ["k"]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["k", 3])],
    )
    path = tmp_path_factory.mktemp("take") / "take.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return path


def test_an_index_input_takes_the_range_given_and_the_record_keeps_it(take_path: Path, tmp_path: Path, capsys) -> None:
    """Integers from [0, 10) index past a 4-row table: the reference fails and the error points to --range;
    with --range idx:0,4 every set compares, and the table and the JSON record the ranges."""
    record = opbridge.verify(take_path, take_model(), backends=["reference"])
    assert record.exit_code == 2
    assert (
        "The integer input 'idx' was drawn from [0, 10): where one is an index or a size, give the values it "
        in (record.errors[0])
    )
    ranges = {"idx": (0, 4), "table": (2.0, 3.0)}
    record = opbridge.verify(take_path, take_model(), backends=["reference"], ranges=ranges)
    assert [r.status for r in record.runs] == ["pass", "pass"], record.table()
    assert record.ranges == ranges
    assert "ranges:    idx:0,4 table:2.0,3.0" in record.table()
    report = tmp_path / "record.json"
    argv = ["verify", str(take_path), "--reference", f"{__file__}:take_model", "--backend", "reference"]
    assert main([*argv, "--range", "idx:0,4,table:2,3", "--json", str(report), "-q"]) == 0, capsys.readouterr()
    assert json.loads(report.read_text())["ranges"] == {"idx": [0, 4], "table": [2, 3]}
    npz = tmp_path / "in.npz"
    np.savez(npz, table=np.ones((4, 3), np.float32), idx=np.array([3, 0]))
    record = opbridge.verify(take_path, take_model(), backends=["reference"], inputs=npz, ranges={"idx": (0, 4)})
    assert record.exit_code == 0
    assert record.notes == [
        "--range idx: every set comes from --inputs, so no value was drawn at random and the ranges changed nothing"
    ]


def test_ranges_are_drawn_within_their_bounds_in_the_inputs_dtype() -> None:
    from opbridge.verify import make_inputs

    meta = [
        TensorMeta("h", np.dtype("float16"), (4000,)),
        TensorMeta("f", np.dtype("float32"), (4000,)),
        TensorMeta("i", np.dtype("int8"), (4000,)),
        TensorMeta("u", np.dtype("uint64"), (50,)),
    ]
    shapes = {m.name: m.shape for m in meta}
    ranges = {"h": (0.999, 1), "f": (-3.5, -3.0), "i": (-128, 128), "u": (2**64 - 2, 2**64)}
    feed = make_inputs(meta, shapes, 0, None, ranges)
    assert [feed[k].dtype for k in "hfiu"] == [np.float16, np.float32, np.int8, np.uint64]
    # (float16 holds 0.999 as 0.99902 and nothing between 0.99951 and 1: rounding up to 1 is clipped)
    assert feed["h"].min() >= 0.999 and feed["h"].max() == np.float16(0.99951171875)
    assert feed["f"].min() >= -3.5 and feed["f"].max() < -3.0 and feed["f"].std() > 0.1  # (uniform, not normal)
    assert feed["i"].min() == -128 and feed["i"].max() == 127
    assert set(feed["u"].tolist()) == {2**64 - 2, 2**64 - 1}
    again = make_inputs(meta, shapes, 0, None, ranges)
    assert all(np.array_equal(feed[k], again[k]) for k in feed)


@pytest.mark.parametrize(
    ("ranges", "message"),
    [
        (
            {"ids": (0, 4)},
            r"^ranges\['ids'\] = \(0, 4\): the model has no input 'ids'; its inputs are \['table', 'idx'\]\.$",
        ),
        (
            {"idx": (4, 4)},
            r"^ranges\['idx'\] = \(4, 4\): values are drawn from \[LO, HI\), so LO must be below HI, e.g. "
            r"ranges=\{'idx': \(4, 5\)\}\.$",
        ),
        (
            {"idx": (0.2, 0.7)},
            r"^ranges\['idx'\] = \(0.2, 0.7\): input 'idx' is int64, and \[0.2, 0.7\) holds no whole number; give a "
            r"range that does, e.g. ranges=\{'idx': \(0, 1\)\}\.$",
        ),
        ({"idx": (0, 2**63 + 1)}, "input 'idx' is int64, which holds -9223372036854775808 to 9223372036854775807"),
        (
            {"table": (0, float("nan"))},
            r"^ranges\['table'\] = \(0, nan\): give finite bounds, e.g. ranges=\{'table': \(-1, 1\)\}",
        ),
        ({"table": (-1e39, 1)}, r"input 'table' is float32, whose values reach \+-3.40282e\+38"),
        ({"idx": (True, 4)}, r"ranges\['idx'\] = \(True, 4\): give a pair \(lo, hi\) of numbers"),
        ([("idx", (0, 4))], r"give a dict of input name to \(lo, hi\)"),
    ],
    ids=["unknown-input", "empty", "no-whole-number", "past-int64", "nan", "past-float32", "bool", "not-a-dict"],
)
def test_bad_ranges_are_refused_before_anything_runs(take_path: Path, ranges: object, message: str) -> None:
    with pytest.raises(opbridge.OpbridgeError, match=message):
        opbridge.verify(take_path, "no/such/file.py:build", backends=["reference"], ranges=ranges)  # type: ignore[arg-type]


def test_a_float64_range_too_wide_to_draw_from_says_so() -> None:
    """[-9e307, 9e307) is inside float64, but its width is not: the error said to give a range inside float64."""
    from opbridge.verify import make_inputs

    meta = [TensorMeta("x", np.dtype("float64"), (3,))]
    with pytest.raises(opbridge.OpbridgeError, match=r"its width, 9e\+307 - -9e\+307, is beyond float64's range"):
        make_inputs(meta, {"x": (3,)}, 0, None, {"x": (-9e307, 9e307)})
    wide = make_inputs(meta, {"x": (3,)}, 0, None, {"x": (-4.5e307, 4.5e307)})["x"]
    assert np.isfinite(wide).all() and np.abs(wide).max() <= 4.5e307


def test_range_parsing(seed_export, capsys) -> None:
    assert parse_ranges(["idx:0,4,x:-1,1.5", "a:b:1e-3,2"]) == {"idx": (0, 4), "x": (-1, 1.5), "a:b": (0.001, 2)}
    assert isinstance(parse_ranges(["idx:0,4"])["idx"][1], int)  # (exact, also past 2**53)
    for item in ("idx:0", "idx", "idx:a,4", "idx:0,4,5"):
        with pytest.raises(opbridge.OpbridgeError, match=r"write NAME:LO,HI with two numbers, e.g. idx:0,4"):
            parse_ranges([item])
    with pytest.raises(opbridge.OpbridgeError, match=r"--range idx: given twice \(0,4 and 0,5\); give it once"):
        parse_ranges(["idx:0,4", "idx:0,5"])
    path = seed_export("myselu", "torchscript").path
    assert main(["verify", str(path), "--reference", MYSELU, "--range", "image:1,1", "-q"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        "opbridge verify: error: --range image:1,1: values are drawn from [LO, HI), so LO must be below HI, "
        "e.g. --range image:1,2."
    )


# --------------------------------------------------------------------------- a reference that fails on float values


class _BatchIndex(torch.nn.Module):
    """Reads column 0 of each RoI as a batch index, as RoI ops do: a standard normal gives negative ones."""

    def forward(self, rois: torch.Tensor) -> torch.Tensor:
        if bool((rois[:, 0] < 0).any()):
            raise IndexError("batch index out of range")
        return rois * 1


def batch_index_model() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    return _BatchIndex(), (torch.tensor([[0.0, 1.0], [1.0, 2.0]]),)


def test_a_reference_failing_on_float_values_points_to_range_not_shape(tmp_path: Path) -> None:
    """Random normal RoIs hold negative batch indices: set 1's error names the float input and --range
    and --inputs; set 2 (the dims varied) failed as set 1 did, so its note does not blame the shapes."""
    from onnx import TensorProto

    value = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, ["n", 2])  # noqa: E731
    graph = helper.make_graph([helper.make_node("Identity", ["rois"], ["y"])], "g", [value("rois")], [value("y")])
    path = tmp_path / "rois.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    record = opbridge.verify(path, batch_index_model(), backends=["reference"])
    hint = (
        " The floating-point input 'rois' was drawn from a standard normal (negative values too): where one holds "
        "indices, sizes or boxes, give the values it takes with --range rois:LO,HI (ranges=). Or give the inputs' "
        "values with --inputs FILE.npz (inputs=)."
    )
    assert record.errors == [
        "set 1 (rois:2x2): the PyTorch reference failed: IndexError: batch index out of range; no backend was "
        "compared on it." + hint
    ]
    assert record.notes == [
        "set 2 (rois:3x2), the example's dynamic dims varied: the PyTorch reference failed: IndexError: batch index "
        "out of range; not compared (the reference failed on set 1 too, at the example's shapes: the random values "
        "are at fault, not the shapes)." + hint
    ]
    record = opbridge.verify(path, batch_index_model(), backends=["reference"], ranges={"rois": (0, 1)})
    assert record.exit_code == 0, record.table()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rtol": "1e-3"}, r"^rtol='1e-3': give a number, e.g. rtol=1e-3 \(on the command line: --rtol 1e-3\)\.$"),
        ({"atol": None, "rtol": -1.0}, r"^rtol=-1.0: a tolerance must be .*, e.g. rtol=1e-3$"),
        ({"tolerances": {"y": (1e-3,)}}, r"^tolerances\['y'\] = \(0.001,\): give a Tolerance or a pair \(rtol, atol\)"),
        ({"tolerances": {"y": (1, 2, 3)}}, r"^tolerances\['y'\] = \(1, 2, 3\): give a Tolerance or a pair"),
    ],
    ids=["rtol-string", "rtol-negative", "one-tuple", "three-tuple"],
)
def test_verify_words_bad_tolerance_arguments_for_the_api(tmp_path: Path, kwargs: dict, message: str) -> None:
    """A str rtol can only come from Python: named as rtol=; a tuple that is not (rtol, atol) is refused
    (a 1-tuple was read as rtol alone, a 3-tuple reached Tolerance's constructor)."""
    with pytest.raises(opbridge.OpbridgeError, match=message):
        opbridge.verify(_silu_model(tmp_path), SILU_REFERENCE, backends=["openvino"], **kwargs)


# --------------------------------------------------------------------------- what a tolerance covers, by dtype


@opbridge.op("tests.verify::IdxVal", tolerances={"float32": Tolerance(rtol=0.1, atol=0.1)})
def idx_val(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The index of the largest value of each row (int64) and the row's sum (float32)."""
    return torch.argmax(x, dim=-1), x.sum(-1)


def _model(nodes: list, inputs: list, outputs: list, *domains: str) -> onnx.ModelProto:
    """A model of ``nodes`` at opset 17, importing ``domains`` at version 1."""
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    opsets = [helper.make_opsetid("", 17), *(helper.make_opsetid(d, 1) for d in domains)]
    return helper.make_model(graph, opset_imports=opsets)


def _tolerances(model: onnx.ModelProto) -> dict[str, tuple[Tolerance, str]]:
    from opbridge.backends.base import onnx_io_meta
    from opbridge.verify import _output_tolerances

    return _output_tolerances(model, onnx_io_meta(model)[1], None, None, None)


def test_a_tolerance_covers_the_values_computed_from_its_op_not_shapes_or_conditions() -> None:
    """A loose op whose output only gave another op's result its shape (Shape -> Reshape), or the
    condition of a Where, lent that result its tolerance; an op with several outputs was looked up by
    output 0's dtype (an int64 index), so its float32 output lost the tolerance declared for it."""
    f32 = onnx.TensorProto.FLOAT
    nodes = [
        helper.make_node("LooseTol", ["x"], ["a"], domain="tests.verify"),
        helper.make_node("FivePercent", ["x"], ["b"], domain="tests.verify"),
        helper.make_node("Shape", ["a"], ["s"]),
        helper.make_node("Reshape", ["b", "s"], ["reshaped"]),
        helper.make_node("Greater", ["a", "x"], ["c"]),
        helper.make_node("Where", ["c", "b", "b"], ["picked"]),
        helper.make_node("Where", ["c", "a", "b"], ["mixed"]),
        helper.make_node("IdxVal", ["x"], ["i", "v"], domain="tests.verify"),
        helper.make_node("Relu", ["v"], ["v_relu"]),
    ]
    outputs = ["reshaped", "picked", "mixed", "v", "v_relu"]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", f32, [2, 8])],
        [
            helper.make_tensor_value_info("i", onnx.TensorProto.INT64, [2]),
            *(helper.make_tensor_value_info(o, f32, None) for o in outputs),
        ],
        "tests.verify",
    )
    tols = _tolerances(model)
    assert tols["reshaped"] == (Tolerance(), "default")
    assert tols["picked"] == (Tolerance(), "default")
    assert tols["mixed"] == (
        Tolerance(0.1, 1e-2),
        "declared by tests.verify::LooseTol; default for tests.verify::FivePercent",
    )
    assert tols["i"] == (Tolerance(0.0, 0.0), "exact (int64 output)")
    assert tols["v"] == (Tolerance(0.1, 0.1), "declared by tests.verify::IdxVal")
    assert tols["v_relu"] == (Tolerance(0.1, 0.1), "declared by tests.verify::IdxVal")


def test_a_tolerance_does_not_cover_values_picked_by_indices_computed_from_its_op() -> None:
    """A loose op's ArgMax fed a Gather (and its TopK's indices, cast to float, an output): the gathered
    values and the cast indices took the op's tolerance, so a kernel picking other elements passed
    verify. An index is right or picks another element: the picked values keep what computes them."""
    f32, i64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
    k = helper.make_tensor("k", i64, [1], [2])
    nodes = [
        helper.make_node("LooseTol", ["x"], ["a"], domain="tests.verify"),
        helper.make_node("ArgMax", ["a"], ["idx"], axis=1, keepdims=1),
        helper.make_node("GatherElements", ["y", "idx"], ["picked"], axis=1),
        helper.make_node("GatherElements", ["a", "idx"], ["picked_loose"], axis=1),
        helper.make_node("Cast", ["idx"], ["idx_f"], to=f32),
        helper.make_node("TopK", ["a", "k"], ["top", "top_i"], axis=1),
        helper.make_node("Cast", ["top_i"], ["top_i_f"], to=f32),
        helper.make_node("Gather", ["y", "top_i"], ["rows"], axis=0),
        helper.make_node("NonZero", ["a"], ["nz"]),
        helper.make_node("Cast", ["nz"], ["nz_f"], to=f32),
    ]
    outputs = ["picked", "picked_loose", "idx_f", "top", "top_i_f", "rows", "nz_f"]
    model = _model(
        nodes,
        [helper.make_tensor_value_info(n, f32, [2, 8]) for n in ("x", "y")],
        [helper.make_tensor_value_info(o, f32, None) for o in outputs],
        "tests.verify",
    )
    model.graph.initializer.append(k)
    loose = (Tolerance(0.1, 1e-2), "declared by tests.verify::LooseTol")
    tols = _tolerances(model)
    assert {o: tols[o] for o in outputs} == {
        "picked": (Tolerance(), "default"),
        "picked_loose": loose,
        "idx_f": (Tolerance(), "default"),
        "top": loose,
        "top_i_f": (Tolerance(), "default"),
        "rows": (Tolerance(), "default"),
        "nz_f": (Tolerance(), "default"),
    }


def test_the_default_tolerance_follows_the_dtype_that_was_computed_in() -> None:
    """float16 and bfloat16 results took float32's default: a float16 Conv or a bfloat16 kernel
    failed by a few units in their last place. A bfloat16 op cast to float32 takes bfloat16's."""
    f16, f32 = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT
    model = _model(
        [
            helper.make_node("Mul", ["h", "h"], ["h2"]),
            helper.make_node("ToBFloat16", ["x"], ["b"], domain="tests.verify"),
            helper.make_node("Cast", ["b"], ["b32"], to=f32),
            helper.make_node("Mul", ["x", "x"], ["x2"]),
            helper.make_node("LooseTol", ["x"], ["a"], domain="tests.verify"),
            helper.make_node("Add", ["a", "b32"], ["sum"]),
        ],
        [helper.make_tensor_value_info("h", f16, [3]), helper.make_tensor_value_info("x", f32, [3])],
        [helper.make_tensor_value_info(n, t, [3]) for n, t in [("h2", f16), ("b32", f32), ("x2", f32), ("sum", f32)]],
        "tests.verify",
    )
    tols = _tolerances(model)
    assert tols["h2"] == (Tolerance(2e-3, 1e-3), "default for float16")
    assert tols["b32"] == (Tolerance(1.6e-2, 8e-3), "default for bfloat16")
    assert tols["x2"] == (Tolerance(), "default")
    assert tols["sum"] == (
        Tolerance(0.1, 1e-2),
        "declared by tests.verify::LooseTol; default for bfloat16 (Add, tests.verify::ToBFloat16)",
    )


def test_a_cast_to_a_narrower_float_counts_as_rounding() -> None:
    """A Cast only moves values, except to a narrower floating-point dtype: there an error within an op's
    float32 tolerance may flip the float16 result's last bit, which the float32 tolerance (kept as if the
    Cast were exact) failed. A widening Cast, and one from integers, still keeps the op's own."""
    f16, f32, f64 = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE
    model = _model(
        [
            helper.make_node("LooseTol", ["x"], ["a"], domain="tests.verify"),
            helper.make_node("Cast", ["a"], ["a16"], to=f16),
            helper.make_node("CastLike", ["a", "h"], ["a16_like"]),
            helper.make_node("Cast", ["a"], ["a64"], to=f64),
            helper.make_node("ArgMax", ["a"], ["i"], axis=0, keepdims=1),
            helper.make_node("Cast", ["i"], ["i16"], to=f16),
        ],
        [helper.make_tensor_value_info("x", f32, [3]), helper.make_tensor_value_info("h", f16, [1])],
        [
            helper.make_tensor_value_info(n, t, None)
            for n, t in [("a16", f16), ("a16_like", f16), ("a64", f64), ("i16", f16)]
        ],
        "tests.verify",
    )
    tols = _tolerances(model)
    narrowed = (Tolerance(0.1, 1e-2), "declared by tests.verify::LooseTol; default for float16 (Cast)")
    assert tols["a16"] == narrowed
    assert tols["a16_like"] == (narrowed[0], narrowed[1].replace("(Cast)", "(CastLike)"))
    assert tols["a64"] == (Tolerance(0.1, 1e-2), "declared by tests.verify::LooseTol")
    assert tols["i16"] == (Tolerance(2e-3, 1e-3), "default for float16")


class _SquareOff(torch.nn.Module):
    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h * h * 1.01  # 1% off the model's h * h


def test_a_low_precision_output_failing_on_its_default_says_how_to_loosen_it() -> None:
    model = _model(
        [helper.make_node("Mul", ["h", "h"], ["y"])],
        [helper.make_tensor_value_info("h", onnx.TensorProto.FLOAT16, [2, 8])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT16, [2, 8])],
    )
    h = torch.linspace(1.0, 2.0, 16, dtype=torch.float16).reshape(2, 8)
    record = opbridge.verify(model, (_SquareOff(), (h,)), backends=["reference"])
    assert record.exit_code == 1
    reason = record.failures()[0][1].reason
    assert reason.endswith(
        "; the default for float16 applied: where this is the rounding of a float16 op, declare its tolerance "
        "(@opbridge.op(..., tolerances={'float16': Tolerance(rtol, atol)})) or give the output one with "
        "--tol y:RTOL,ATOL (tolerances=)"
    ), reason


@opbridge.op("tests.verify::RightForOneRow")
def right_for_one_row(x: torch.Tensor) -> torch.Tensor:
    return x * 2.0


@right_for_one_row.register_kernel
def _right_for_one_row(x: np.ndarray) -> np.ndarray:
    """Wrong on purpose beyond the first row."""
    y = (x * 2.0).astype(x.dtype)
    y[1:] = 0.0
    return y


class _OneRow(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return right_for_one_row(x)


def test_unnamed_dynamic_dims_are_varied_too() -> None:
    """A dynamic dim without a name (no dim_param) was left at the example's size: a kernel wrong for
    a batch above 1 passed on a batch of 1 alone."""
    f32 = onnx.TensorProto.FLOAT
    model = _model(
        [helper.make_node("RightForOneRow", ["x"], ["y"], domain="tests.verify")],
        [helper.make_tensor_value_info("x", f32, [None, 4])],
        [helper.make_tensor_value_info("y", f32, [None, 4])],
        "tests.verify",
    )
    record = opbridge.verify(model, (_OneRow(), (torch.randn(1, 4),)), backends=["reference"])
    assert record.shape_sets == [{"x": (1, 4)}, {"x": (2, 4)}]
    assert record.set_origins[1].endswith("the example's dynamic dims varied, x dim 0 (unnamed) 1->2")
    assert [r.status for r in record.runs] == ["pass", "fail"]
    assert record.exit_code == 1


@opbridge.op("tests.verify::PadThreeRows")
def pad_three_rows(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, 0, 0, 3))


@pad_three_rows.register_shape
def _pad_three_rows_shape(x: torch.Tensor) -> opbridge.TensorInfo:
    """Wrong on purpose: 2 * rows equals rows + 3 at 3 rows only."""
    return opbridge.TensorInfo((x.shape[0] * 2, x.shape[1]), x.dtype)


class _PadThreeRows(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return pad_three_rows(x)


def test_an_op_contradicting_its_shape_rule_at_the_varied_dims_fails() -> None:
    """The reference's OpDefinitionError on the set verify varied was a note (blaming the shapes, with
    --range advice), and verify passed on the export shape alone, where the rule happens to hold."""
    f32 = onnx.TensorProto.FLOAT
    model = _model(
        [helper.make_node("PadThreeRows", ["x"], ["y"], domain="tests.verify")],
        [helper.make_tensor_value_info("x", f32, ["b", 4])],
        [helper.make_tensor_value_info("y", f32, [None, 4])],
        "tests.verify",
    )
    record = opbridge.verify(model, (_PadThreeRows(), (torch.randn(3, 4),)), backends=["reference"])
    assert record.shape_sets == [{"x": (3, 4)}, {"x": (4, 4)}]
    assert record.notes == []
    assert record.errors == [
        "set 2 (x:4x4): the PyTorch reference failed: OpDefinitionError: tests.verify::PadThreeRows: the shape rule "
        "declares output 0 ('output') as [8, 4] torch.float32, but the reference returned [7, 4] torch.float32 for "
        "these inputs; exports and runtimes follow the rule, so make the two agree (@PadThreeRows.register_shape); "
        "no backend was compared on it."
    ]
    assert [r.status for r in record.runs] == ["pass"] and record.exit_code == 2


@opbridge.op("tests.verify::Double", shape=lambda x: opbridge.TensorInfo((x.shape[1], x.shape[0]), x.dtype))
def double_swapped_rule(x: torch.Tensor) -> torch.Tensor:
    """Its shape rule swaps rows and columns by mistake: right on square inputs only."""
    return x * 2


class _DoubleSwappedRule(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return double_swapped_rule(x)


def test_named_dims_equal_at_the_example_differ_in_the_varied_set() -> None:
    """Every dynamic dim grew by one: h and w of a square example stayed equal, and an op whose shape rule
    swaps them passed both sets."""
    f32 = onnx.TensorProto.FLOAT
    model = _model(
        [helper.make_node("Double", ["x"], ["y"], domain="tests.verify")],
        [helper.make_tensor_value_info("x", f32, ["h", "w"])],
        [helper.make_tensor_value_info("y", f32, ["w", "h"])],
        "tests.verify",
    )
    record = opbridge.verify(model, (_DoubleSwappedRule(), (torch.randn(4, 4),)), backends=["reference"])
    assert record.shape_sets == [{"x": (4, 4)}, {"x": (5, 6)}]
    assert record.set_origins[1].endswith("the example's dynamic dims varied, h 4->5, w 4->6")
    assert len(record.errors) == 1 and "the shape rule declares output 0 ('output') as [6, 5]" in record.errors[0]
    assert record.exit_code == 2
    # dims of different sizes at the example each grow by one
    record = opbridge.verify(model, (_DoubleSwappedRule(), (torch.randn(4, 5),)), backends=["reference"])
    assert record.shape_sets == [{"x": (4, 5)}, {"x": (5, 6)}]


@opbridge.op("tests.verify::AddPairs")
def add_pairs(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y.view(y.shape[0], -1, 2).sum(-1)


class _AddPairs(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return add_pairs(x, y)


def _add_pairs_model(out_dims: list[Any]) -> onnx.ModelProto:
    """x (b, n) and y (b, 2*n), as torch.export writes a derived dim."""
    f32 = onnx.TensorProto.FLOAT
    return _model(
        [helper.make_node("AddPairs", ["x", "y"], ["z"], domain="tests.verify")],
        [helper.make_tensor_value_info("x", f32, ["b", "n"]), helper.make_tensor_value_info("y", f32, ["b", "2*n"])],
        [helper.make_tensor_value_info("z", f32, out_dims)],
        "tests.verify",
    )


def test_dims_written_as_expressions_of_others_follow_them() -> None:
    """verify read y's '2*n' as a name of its own: the varied set broke the relation (y 7 columns for x's
    4), the reference refused it and only the export shape was compared; --shape x:3x4 left y at 6."""
    model = _add_pairs_model(["b", "n"])
    reference = (_AddPairs(), (torch.randn(2, 3), torch.randn(2, 6)))
    record = opbridge.verify(model, reference, backends=["reference"])
    assert record.shape_sets == [{"x": (2, 3), "y": (2, 6)}, {"x": (3, 4), "y": (3, 8)}]
    assert record.set_origins[1].endswith("the example's dynamic dims varied, b 2->3, n 3->4, 2*n 6->8")
    assert [r.status for r in record.runs] == ["pass", "pass"] and record.notes == [] and record.exit_code == 0
    record = opbridge.verify(model, reference, backends=["reference"], shapes=[{"x": (3, 4)}, {"y": (1, 10)}])
    assert record.shape_sets == [{"x": (3, 4), "y": (3, 8)}, {"x": (1, 5), "y": (1, 10)}]
    assert record.exit_code == 0
    with pytest.raises(opbridge.OpbridgeError, match=r"^shapes: y:3x7: the model declares a dim of 'y' as '2\*n', "):
        opbridge.verify(model, reference, backends=["reference"], shapes=[{"x": (3, 4), "y": (3, 7)}])


def test_an_output_dim_written_as_an_expression_is_checked() -> None:
    """An output declared '2*n' was never checked against the output's size (a name no input binds)."""
    reference = (_AddPairs(), (torch.randn(2, 3), torch.randn(2, 6)))
    record = opbridge.verify(_add_pairs_model(["b", "2*n"]), reference, backends=["reference"])
    assert [r.status for r in record.runs] == ["fail", "fail"]
    reason = record.runs[0].outputs[0].reason
    assert reason.startswith("the model declares this output as b(=2)x2*n(=6), but it is 2x3 here"), reason
    record = opbridge.verify(_add_pairs_model(["b", "floor(2*n/2)"]), reference, backends=["reference"])
    assert record.exit_code == 0, record.table()


class _Zeros(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 0.0


@pytest.mark.parametrize(
    ("with_torch", "source"),
    [(True, "the PyTorch reference"), (False, "the reference (reference's output)")],
    ids=["pytorch_reference", "first_backend_reference"],
)
def test_empty_and_all_zero_reference_outputs_are_named(with_torch: bool, source: str) -> None:
    """An output with no element at a set, or one whose reference is 0 everywhere (where a backend's
    9e-6 passes under atol 1e-5), passed with no word; with no PyTorch reference the first backend's
    outputs are the reference, and the same notes apply."""
    f32 = onnx.TensorProto.FLOAT
    model = _model(
        [helper.make_node("Mul", ["x", "zero"], ["y"])],
        [helper.make_tensor_value_info("x", f32, ["n", 4])],
        [helper.make_tensor_value_info("y", f32, ["n", 4])],
    )
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.zeros((), np.float32), "zero"))
    reference = (_Zeros(), (torch.randn(2, 4),)) if with_torch else None
    backends = ["reference"] if with_torch else ["reference", "onnxruntime"]
    record = opbridge.verify(model, reference, backends=backends, shapes=[{"x": (2, 4)}, {"x": (0, 4)}])
    assert record.exit_code == 0
    assert record.notes == [
        f"set 1 (x:2x4) output 'y': every value of {source} is 0, so any value within atol 1e-05 of zero would "
        "pass; give atol 0 to ask for zeros, e.g. --tol y:0.001,0.",
        f"set 2 (x:0x4) output 'y': {source} is empty (0x4), so only its shape and dtype are compared; give "
        "shapes at which it has elements with --shape (shapes=).",
    ]


def test_the_verdict_line_says_what_failed_where_no_output_was_compared() -> None:
    """Every run refused (a kernel's result of another dtype) or an error read '0 of 0 output comparison(s)
    within tolerance'."""
    from opbridge.verify import BackendReport, RunReport, VerifyRecord

    record = VerifyRecord("m.onnx", "ref", 0, [], [{"x": (2,)}], {}, backends=[BackendReport("reference", "ran")])
    refused = "output 0 has dtype float64, but the node's output type is float32"
    record.runs = [RunReport("reference", 0, "fail", error=refused)]
    assert record.table().splitlines()[-1] == (
        "FAIL: no output compared, 1 run(s) whose kernel returned another dtype or shape than the node's"
    )
    record.runs = [RunReport("reference", 0, "error", error="boom")]
    assert record.table().splitlines()[-1] == "ERROR: no output compared, 1 error(s)"


def test_arrays_given_in_python_are_named_in_python_words(take_path: Path) -> None:
    arrays = {"table": np.ones((4, 3)), "idx": np.array([0, 1])}  # table: float64, the model's is float32
    with pytest.raises(opbridge.OpbridgeError, match=r"^inputs\['table'\] is float64, the model expects float32; "):
        opbridge.verify(take_path, take_model(), backends=["reference"], inputs=arrays)
    with pytest.raises(opbridge.OpbridgeError, match=r"^inputs\[1\]\['table'\] is float64"):
        opbridge.verify(
            take_path,
            take_model(),
            backends=["reference"],
            inputs=[{**arrays, "table": np.ones((4, 3), np.float32)}, arrays],
        )


def test_complex_nan_is_placed_per_part() -> None:
    """``nan+0j`` against ``0+nanj`` passed: NaN was placed per element, not per part."""
    from opbridge.compare import compare_arrays

    nan = float("nan")
    swapped = compare_arrays(np.array([complex(nan, 0.0)]), np.array([complex(0.0, nan)]))
    assert not swapped.passed and swapped.nan_mismatched == 1
    other_part = compare_arrays(np.array([complex(nan, 1.0)]), np.array([complex(nan, 2.0)]))
    assert not other_part.passed and "1 beyond tolerance" in other_part.reason
    same = compare_arrays(np.array([complex(nan, 1.0), 2j]), np.array([complex(nan, 1.0), 2j]))
    assert same.passed and same.nan_both == 1


class _Resized(torch.nn.Module):
    def forward(self, x: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
        from opbridge.ops import DynamicResize

        return DynamicResize(x, size)


def test_a_resize_body_within_its_float32_rounding_passes(tmp_path: Path) -> None:
    """ONNX Runtime's cubic Resize (DynamicResize's body) rounds the source coordinates otherwise than
    PyTorch: 5e-5 off on a downscale of 500 x 400 standard-normal data, which the float32 default (atol
    1e-5) failed though the README gives such a bound. The op declares its float32 rounding."""
    path = tmp_path / "resize.onnx"
    example = (torch.randn(1, 3, 8, 8), torch.zeros(1, 1, 16, 16))
    axes = {"x": {2: "h", 3: "w"}, "size": {2: "oh", 3: "ow"}}
    opbridge.export(_Resized(), example, path, exporter="torchscript", input_names=["x", "size"], dynamic_axes=axes)
    shapes = [{"x": (1, 3, 500, 400), "size": (1, 1, 64, 48)}, {"x": (1, 3, 100, 80), "size": (1, 1, 500, 400)}]
    record = opbridge.verify(path, (_Resized(), example), backends=["onnxruntime"], shapes=shapes)
    assert record.exit_code == 0, record.table()
    tolerance, source = next(iter(record.tolerances.values()))
    assert (tolerance, source) == (Tolerance(1e-3, 5e-4), "declared by Test::DynamicTRTResize")
    assert max(o.abs.max for run in record.runs for o in run.outputs) > 1e-5  # (what the default failed)
