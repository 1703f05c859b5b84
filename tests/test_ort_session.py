"""opbridge.InferenceSession: seed models, legacy default-domain models, unknown ops, bad files."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from _graph_models import legacy_model
from conftest import run_script
from onnx import TensorProto, helper
from torch import nn

import opbridge
from opbridge.backends.base import InputError
from opbridge.examples.seeds import SEED_MODELS, SeedModel
from opbridge.export import custom_nodes

pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")

RTOL, ATOL = 1e-3, 1e-5
EXPORTERS = ("dynamo", "torchscript")
SEED_IDS = [m.name for m in SEED_MODELS]


def _seed(name: str) -> SeedModel:
    return next(m for m in SEED_MODELS if m.name == name)


def _inputs(seed: SeedModel, shapes: dict[str, tuple[int, ...]] | None) -> tuple[torch.Tensor, ...]:
    _, example = seed.factory()
    if shapes is None:
        return example
    g = torch.Generator().manual_seed(7)
    return tuple(torch.rand(shapes[n], generator=g) for n in seed.input_names)


# --------------------------------------------------------------------------- seed models


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", SEED_IDS)
def test_seed_models_without_function_bodies_match_eager(seed_export, name: str, exporter: str) -> None:
    seed = _seed(name)
    result = seed_export(name, exporter, functions=False)
    sess = opbridge.InferenceSession(result.path)
    custom = custom_nodes(result.model)
    assert custom, "the export lost its custom nodes"
    assert len(sess.kernels) == len(custom)
    assert all(k.path in ("kernel", "reference", "registered") for k in sess.kernels.values()), sess.kernels
    assert [i.name for i in sess.get_inputs()] == list(seed.input_names)
    assert [o.name for o in sess.get_outputs()] == list(seed.output_names)
    model, _ = seed.factory()
    for shapes in (None, *seed.shapes):
        args = _inputs(seed, shapes)
        with torch.no_grad():
            expected = model(*args)
        feed = {n: a.numpy() for n, a in zip(seed.input_names, args)}
        (got,) = sess.run(None, feed)
        np.testing.assert_allclose(got, expected.numpy(), rtol=RTOL, atol=ATOL, err_msg=f"{name} {exporter} {shapes}")


def test_model_given_as_path_bytes_or_proto(seed_export) -> None:
    result = seed_export("myselu", "torchscript", functions=False)
    model, (x,) = _seed("myselu").factory()
    feed = {"image": x.numpy()}
    outs = [
        opbridge.InferenceSession(src).run(None, feed)[0]
        for src in (str(result.path), Path(result.path), Path(result.path).read_bytes(), result.model)
    ]
    for out in outs[1:]:
        np.testing.assert_array_equal(out, outs[0])
    np.testing.assert_allclose(outs[0], model(x).detach().numpy(), rtol=RTOL, atol=ATOL)


# --------------------------------------------------------------------------- legacy default-domain models


class MYSELUImpl(torch.autograd.Function):
    """Seed 000's technique: a symbolic writing MYSELU into ONNX's default domain."""

    @staticmethod
    def symbolic(g, x, p):
        const = g.op("Constant", value_t=torch.tensor([3, 2, 1], dtype=torch.float32))
        return g.op("MYSELU", x, p, const, attr1_s="这是字符串属性", attr2_i=[1, 2, 3], attr3_f=0.123456789)

    @staticmethod
    def forward(ctx, x, p):
        return x / (1 + torch.exp(-x))


class LegacySelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 1, 3, padding=1)
        self.param = nn.Parameter(torch.arange(3).float())
        with torch.no_grad():
            self.conv.weight.fill_(1.0)
            self.conv.bias.fill_(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return MYSELUImpl.apply(self.conv(x), self.param)


class StrangeImpl(torch.autograd.Function):
    """Seed 004's technique, with outputs=2: one MyStrangeOp node with two outputs."""

    @staticmethod
    def symbolic(g, x, weight, bias):
        return g.op("MyStrangeOp", x, weight, bias, float_attr_f=[0.1, 0.5], int_attr_i=[2, 2], outputs=2)

    @staticmethod
    def forward(ctx, x, weight, bias):
        return x + weight, x * weight + bias


class LegacyStrange(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(4)
        self.w = nn.Parameter(torch.rand(1, 3, 4, 4, generator=g) + 0.5)
        self.b = nn.Parameter(torch.rand(1, 3, 4, 4, generator=g))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = StrangeImpl.apply(x, self.w, self.b)
        return a * 2 + b


LEGACY_SEEN: dict[str, dict] = {}


@opbridge.kernel("MYSELU", domain="")
def legacy_myselu(x, p, c, *, attr1="", attr2=(), attr3=0.0):
    LEGACY_SEEN["MYSELU"] = {"attr1": attr1, "attr2": attr2, "attr3": attr3, "p": p.copy(), "c": c.copy()}
    return x / (np.float32(1) + np.exp(-x))


@opbridge.kernel("MyStrangeOp", domain="", outputs=2)
def legacy_strange(x, weight, bias, *, float_attr=(), int_attr=()):
    LEGACY_SEEN["MyStrangeOp"] = {"float_attr": float_attr, "int_attr": int_attr}
    return x + weight, x * weight + bias


def _export_legacy(module: nn.Module, x: torch.Tensor, path: Path, opset: int) -> Path:
    torch.onnx.export(
        module,
        (x,),
        str(path),
        input_names=["x"],
        output_names=["y"],
        opset_version=opset,
        dynamo=False,
        dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}},
    )
    return path


def test_legacy_myselu_in_default_domain(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    module = LegacySelu().eval()
    x = torch.randn(2, 1, 6, 5, generator=torch.Generator().manual_seed(0))
    path = _export_legacy(module, x, tmp_path / "myselu.onnx", 11)
    saved = onnx.load(str(path))
    assert [n.op_type for n in saved.graph.node if n.domain == ""].count("MYSELU") == 1  # the legacy layout
    with caplog.at_level(logging.WARNING, logger="opbridge.onnxruntime.session"):
        sess = opbridge.InferenceSession(path)
    assert sum("MYSELU" in r.getMessage() and "opbridge.legacy" in r.getMessage() for r in caplog.records) == 1
    assert sess.moved_ops == ["MYSELU"]
    assert [(k.domain, k.path) for k in sess.kernels.values()] == [("opbridge.legacy", "registered")]
    for shape in [(2, 1, 6, 5), (3, 1, 6, 5)]:
        xi = torch.randn(shape, generator=torch.Generator().manual_seed(1))
        (y,) = sess.run(None, {"x": xi.numpy()})
        with torch.no_grad():
            np.testing.assert_allclose(y, module(xi).numpy(), rtol=RTOL, atol=ATOL)
    seen = LEGACY_SEEN["MYSELU"]
    assert seen["attr1"] == "这是字符串属性"
    assert seen["attr2"] == [1, 2, 3]
    assert seen["attr3"] == float(np.float32(0.123456789))
    np.testing.assert_array_equal(seen["p"], [0.0, 1.0, 2.0])
    np.testing.assert_array_equal(seen["c"], [3.0, 2.0, 1.0])
    assert onnx.load(str(path)).graph.node[-1].domain == ""  # the file on disk is unchanged


def test_legacy_two_output_op_in_default_domain(tmp_path: Path) -> None:
    module = LegacyStrange().eval()
    x = torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(2))
    path = _export_legacy(module, x, tmp_path / "strange.onnx", 13)
    sess = opbridge.InferenceSession(path)
    assert sess.moved_ops == ["MyStrangeOp"]
    (y,) = sess.run(None, {"x": x.numpy()})
    with torch.no_grad():
        np.testing.assert_allclose(y, module(x).numpy(), rtol=RTOL, atol=ATOL)
    seen = LEGACY_SEEN["MyStrangeOp"]
    assert seen["float_attr"] == [float(np.float32(0.1)), 0.5]
    assert seen["int_attr"] == [2, 2]


@opbridge.kernel("Swish", domain="")
def _legacy_swish(x):
    return x * np.float32(0.5)


def test_a_default_domain_kernel_only_for_later_opsets_is_named_with_its_version() -> None:
    """The message asked for the kernel @opbridge.kernel("...", domain="") that was registered."""

    @opbridge.kernel("LegacyOnlyNewForSessions", domain="", since_version=13)
    def only_new(x):
        return x

    with pytest.raises(opbridge.UnknownOpError) as err:
        opbridge.InferenceSession(legacy_model("LegacyOnlyNewForSessions", 11))
    text = str(err.value)
    assert "<default>::LegacyOnlyNewForSessions (opset 11), node(s) 'legacy0'" in text
    assert "registered only from opset version 13 on" in text and "the model imports opset 11" in text
    assert "since_version=11 or lower" in text


def test_an_onnx_op_name_of_a_later_opset_runs_its_kernel_in_an_older_model() -> None:
    """ONNX has Swish from opset 24 on; an opset-11 legacy export's Swish node failed in ONNX Runtime
    ("No Op registered for Swish with domain_version of 11")."""
    sess = opbridge.InferenceSession(legacy_model("Swish", 11))
    assert sess.moved_ops == ["Swish"]
    x = np.array([1.0, -2.0], np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x * np.float32(0.5))


# --------------------------------------------------------------------------- unknown ops, bad files


def _unknown_model() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Mystery", ["x"], ["a"], domain="acme.unknown", name="m0"),
        helper.make_node("Enigma", ["a"], ["y"], domain="acme.other", name="m1"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    return helper.make_model(
        graph,
        opset_imports=[
            helper.make_opsetid("", 17),
            helper.make_opsetid("acme.unknown", 3),
            helper.make_opsetid("acme.other", 1),
        ],
    )


def test_unknown_ops_are_listed_with_the_fix() -> None:
    with pytest.raises(opbridge.UnknownOpError) as err:
        opbridge.InferenceSession(_unknown_model())
    text = str(err.value)
    assert "2 custom node(s)" in text
    assert "acme.unknown::Mystery (opset 3), node(s) 'm0'" in text
    assert "acme.other::Enigma (opset 1), node(s) 'm1'" in text
    assert '@opbridge.op("acme.unknown::Mystery")' in text
    assert '@opbridge.kernel("Mystery", domain="acme.unknown")' in text
    assert "function body" in text


def test_truncated_file_raises_model_load_error(seed_export, tmp_path: Path) -> None:
    data = Path(seed_export("myselu", "dynamo", functions=False).path).read_bytes()
    broken = tmp_path / "truncated.onnx"
    broken.write_bytes(data[: len(data) // 2])
    with pytest.raises(opbridge.ModelLoadError, match=r"truncated\.onnx: not a (valid|usable) ONNX model.*truncated"):
        opbridge.InferenceSession(broken)


@pytest.mark.parametrize(
    "content", [b"", b"\x00\x01garbage\xff" * 10, b"not onnx at all"], ids=["empty", "binary", "text"]
)
def test_corrupt_file_raises_model_load_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "corrupt.onnx"
    path.write_bytes(content)
    with pytest.raises(opbridge.ModelLoadError, match=r"corrupt\.onnx: not a (valid|usable) ONNX model"):
        opbridge.InferenceSession(path)


def test_missing_file_raises_model_load_error(tmp_path: Path) -> None:
    with pytest.raises(opbridge.ModelLoadError, match=r"missing\.onnx: no such file"):
        opbridge.InferenceSession(tmp_path / "missing.onnx")


def test_function_bodies_run_natively(tmp_path: Path) -> None:
    """A custom op whose body is a model-local function takes the function path (no bridge)."""
    body = helper.make_function(
        "acme.fn",
        "Double",
        ["x"],
        ["y"],
        [helper.make_node("Add", ["x", "x"], ["y"])],
        [helper.make_opsetid("", 17)],
    )
    graph = helper.make_graph(
        [helper.make_node("Double", ["x"], ["y"], domain="acme.fn", name="d")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(
        graph, functions=[body], opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("acme.fn", 1)]
    )
    sess = opbridge.InferenceSession(model)
    assert sess.kernels["d"].path == "function"
    np.testing.assert_array_equal(sess.run(None, {"x": np.array([1.0, 2.5], np.float32)})[0], [2.0, 5.0])


@pytest.fixture(scope="module")
def two_grid_samplers(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, tuple[torch.Tensor, torch.Tensor]]:
    """A model with a bilinear and a bicubic mmdeploy::grid_sampler node, both with the op's body."""
    from opbridge.ops import detection as d

    class Two(nn.Module):
        def forward(self, x: torch.Tensor, grid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return d.GridSample(x, grid, interpolation_mode=0), d.GridSample(x, grid, interpolation_mode=2)

    g = torch.Generator().manual_seed(3)
    args = (torch.randn(1, 3, 9, 11, generator=g), torch.rand(1, 7, 6, 2, generator=g) * 2.4 - 1.2)
    path = tmp_path_factory.mktemp("bodies") / "two.onnx"
    result = opbridge.export(Two(), args, path, exporter="torchscript")
    assert [f.name for f in result.model.functions] == ["grid_sampler"]
    return path, args


@pytest.mark.parametrize(
    ("bodies", "rule", "paths"),
    [
        ("auto", None, ["kernel", "kernel"]),
        ("auto", "bicubic-only", ["function", "kernel"]),
        ("always", None, ["function", "function"]),
        ("never", None, ["kernel", "kernel"]),
    ],
    ids=["auto", "auto-bicubic-rule", "always", "never"],
)
def test_bodies_choose_per_node(
    two_grid_samplers, monkeypatch: pytest.MonkeyPatch, bodies: str, rule: str | None, paths: list[str]
) -> None:
    """grid_sampler prefers its kernel for every node (ONNX Runtime's GridSample is slower than it in
    every mode). With a rule that prefers it for bicubic nodes only, "auto" runs the bilinear node's
    body and the bicubic node's kernel, in one model whose body stays for the other node; both
    outputs match the reference either way."""
    from opbridge.ops import detection as d

    if rule is not None:
        monkeypatch.setattr(d.GridSample, "function_prefers_kernel", lambda attrs: attrs["interpolation_mode"] == 2)
    path, (x, grid) = two_grid_samplers
    sess = opbridge.InferenceSession(path, bodies=bodies)
    by_mode = {}
    for node in sess.model.graph.node:
        mode = next(a.i for a in node.attribute if a.name == "interpolation_mode")
        by_mode[mode] = sess.kernels[node.name]
    assert [by_mode[0].path, by_mode[2].path] == paths
    # a node that runs the kernel sits in a domain of its own in ONNX Runtime's copy (the body stays);
    # the kernels' record names the model's domain
    for node in sess.model.graph.node:
        k = sess.kernels[node.name]
        assert node.domain == ("opbridge.kernel.mmdeploy" if k.path == "kernel" else "mmdeploy")
        assert k.domain == "mmdeploy"
    assert [f.name for f in sess.model.functions] == ["grid_sampler"]
    feeds = {i.name: a.numpy() for i, a in zip(sess.get_inputs(), (x, grid))}
    for got, mode in zip(sess.run(None, feeds), (0, 2)):
        want = d.GridSample.run_reference(x, grid, interpolation_mode=mode)
        np.testing.assert_allclose(got, want.numpy(), rtol=RTOL, atol=ATOL)


def test_bodies_value_is_checked(two_grid_samplers) -> None:
    with pytest.raises(ValueError, match="bodies must be 'auto', 'always' or 'never', got 'some'"):
        opbridge.InferenceSession(two_grid_samplers[0], bodies="some")


@pytest.mark.parametrize(
    ("bodies", "paths"), [(None, ["function", "function"]), ("auto", ["kernel", "kernel"])], ids=["default", "auto"]
)
def test_verify_runner_checks_the_bodies(two_grid_samplers, bodies: str | None, paths: list[str]) -> None:
    """The ONNX Runtime backend of ``opbridge verify`` runs every body the file carries unless told otherwise."""
    from opbridge.backends.onnxruntime_backend import OnnxRuntimeRunner

    path, (x, grid) = two_grid_samplers
    runner = OnnxRuntimeRunner(path) if bodies is None else OnnxRuntimeRunner(path, bodies=bodies)
    names = [i.name for i in onnx.load(path).graph.input]
    with runner:
        outputs = runner.infer(dict(zip(names, (x.numpy(), grid.numpy()))))
        kernels = dict(runner._session.kernels)
    assert len(outputs) == 2
    assert sorted(k.path for k in kernels.values()) == paths
    with pytest.raises(ValueError, match="bodies must be"):
        OnnxRuntimeRunner(path, bodies="sometimes")


def test_bicubic_resize_runs_pytorch_not_the_body(seed_export) -> None:
    """DynamicResize's body is ONNX Runtime's cubic Resize, slower than F.interpolate on CPU: the
    session runs its kernel (PyTorch's op, into ONNX Runtime's output) by default and the body with
    bodies="always", with the same result."""
    seed = _seed("super_resolution")
    result = seed_export("super_resolution", "torchscript")
    assert any(f.name == "DynamicTRTResize" for f in result.model.functions)
    auto = opbridge.InferenceSession(result.path)
    always = opbridge.InferenceSession(result.path, bodies="always")
    assert {k.path for k in auto.kernels.values()} == {"kernel"}
    assert all(k.writes_outputs for k in auto.kernels.values())
    assert {k.path for k in always.kernels.values()} == {"function"}
    feed = {n: a.numpy() for n, a in zip(seed.input_names, _inputs(seed, None))}
    np.testing.assert_allclose(auto.run(None, feed)[0], always.run(None, feed)[0], rtol=RTOL, atol=ATOL)


def test_importing_opbridge_does_not_import_onnxruntime() -> None:
    code = (
        "import sys, opbridge; print('onnxruntime' in sys.modules); "
        "print(opbridge.InferenceSession.__name__); print('onnxruntime' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["False", "InferenceSession", "False"], out.stdout + out.stderr


@opbridge.kernel("Halve", domain="acme.inner")
def _halve(x):
    return x / np.float32(2)


def test_custom_node_inside_a_function_body() -> None:
    """A local function whose body calls a bridged op: the functions are inlined, the inner node bridged."""
    body = helper.make_function(
        "acme.outer",
        "HalfPlusOne",
        ["x"],
        ["y"],
        [
            helper.make_node("Halve", ["x"], ["h"], domain="acme.inner"),
            helper.make_node("Constant", [], ["one"], value=helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])),
            helper.make_node("Add", ["h", "one"], ["y"]),
        ],
        [helper.make_opsetid("", 17), helper.make_opsetid("acme.inner", 1)],
    )
    graph = helper.make_graph(
        [helper.make_node("HalfPlusOne", ["x"], ["y"], domain="acme.outer", name="outer")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )
    model = helper.make_model(
        graph,
        functions=[body],
        opset_imports=[
            helper.make_opsetid("", 17),
            helper.make_opsetid("acme.outer", 1),
            helper.make_opsetid("acme.inner", 1),
        ],
    )
    sess = opbridge.InferenceSession(model)
    assert [(k.domain, k.op_type, k.path) for k in sess.kernels.values()] == [("acme.inner", "Halve", "registered")]
    (y,) = sess.run(None, {"x": np.array([2.0, -4.0, 1.0], np.float32)})
    np.testing.assert_array_equal(y, [2.0, -1.0, 1.5])


def test_custom_node_in_an_if_branch_inside_a_function_body() -> None:
    """Only a function body's own nodes were searched for custom ones: a bridged node inside an If branch of
    a function was never inlined, and ONNX Runtime refused it ("is not a registered function/op")."""
    value = helper.make_tensor_value_info
    then = helper.make_graph(
        [helper.make_node("Halve", ["x"], ["t"], domain="acme.inner")],
        "then",
        [],
        [value("t", TensorProto.FLOAT, None)],
    )
    other = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e"])], "else", [], [value("e", TensorProto.FLOAT, None)]
    )
    body = helper.make_function(
        "acme.outer",
        "HalveIf",
        ["x", "c"],
        ["y"],
        [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
        [helper.make_opsetid("", 17), helper.make_opsetid("acme.inner", 1)],
    )
    graph = helper.make_graph(
        [helper.make_node("HalveIf", ["x", "c"], ["y"], domain="acme.outer")],
        "g",
        [value("x", TensorProto.FLOAT, [2]), value("c", TensorProto.BOOL, [])],
        [value("y", TensorProto.FLOAT, [2])],
    )
    opsets = [helper.make_opsetid(d, 17 if not d else 1) for d in ("", "acme.outer", "acme.inner")]
    sess = opbridge.InferenceSession(helper.make_model(graph, functions=[body], opset_imports=opsets))
    x = np.array([2.0, -4.0], np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x, "c": np.array(True)})[0], [1.0, -2.0])
    np.testing.assert_array_equal(sess.run(None, {"x": x, "c": np.array(False)})[0], [-2.0, 4.0])


def test_custom_output_types_of_intermediate_values_come_from_the_op() -> None:
    """TRTBatchedNMS's int32 labels feeding another node (no value_info for them): the output type
    comes from the op's schema through shape inference, not from its first input (float32)."""
    import opbridge.ops.detection

    nms = helper.make_node(
        "TRTBatchedNMS", ["boxes", "scores"], ["dets", "labels"], domain="mmdeploy", num_classes=3, keep_topk=5
    )
    cast = helper.make_node("Cast", ["labels"], ["labels64"], to=TensorProto.INT64)
    graph = helper.make_graph(
        [nms, cast],
        "g",
        [
            helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, 10, 1, 4]),
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 10, 3]),
        ],
        [
            helper.make_tensor_value_info("dets", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("labels64", TensorProto.INT64, None),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("mmdeploy", 1)])
    rng = np.random.default_rng(5)
    xy = rng.random((1, 10, 1, 2), dtype=np.float32) * 50
    boxes, scores = np.concatenate([xy, xy + 10], -1), rng.random((1, 10, 3), dtype=np.float32)
    dets, labels = opbridge.InferenceSession(model).run(None, {"boxes": boxes, "scores": scores})
    want_dets, want_labels = opbridge.ops.detection.BatchedNMS.kernel(boxes, scores, num_classes=3, keep_topk=5)
    assert labels.dtype == np.int64
    np.testing.assert_array_equal(labels, want_labels.astype(np.int64))
    np.testing.assert_array_equal(dets, want_dets)


def test_nodes_of_one_op_with_other_output_types_each_get_theirs() -> None:
    """Two nodes of one op whose outputs have other element types (a dtype attribute): ONNX Runtime
    takes one output type per registered op, so the session registers one per set of types."""

    @opbridge.kernel("AsType", domain="test.session.types")
    def as_type(x: np.ndarray, to: int = 1) -> np.ndarray:
        return x.astype(helper.tensor_dtype_to_np_dtype(to))

    nodes = [
        helper.make_node("AsType", ["x"], ["i"], domain="test.session.types", to=TensorProto.INT64),
        helper.make_node("AsType", ["x"], ["f"], domain="test.session.types", to=TensorProto.FLOAT),
        helper.make_node("AsType", ["x"], ["j"], domain="test.session.types", to=TensorProto.INT64),
        helper.make_node("AsType", ["x"], ["d"], domain="test.session.types", to=TensorProto.DOUBLE),
    ]
    outputs = {"i": TensorProto.INT64, "f": TensorProto.FLOAT, "j": TensorProto.INT64, "d": TensorProto.DOUBLE}
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info(name, t, [3]) for name, t in outputs.items()],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("test.session.types", 1)]
    )
    x = np.array([1.5, -2.0, 3.0], np.float32)
    sess = opbridge.InferenceSession(model)
    results = sess.run(None, {"x": x})
    assert [r.dtype for r in results] == [np.int64, np.float32, np.int64, np.float64]
    for r in results:
        np.testing.assert_array_equal(r, x.astype(r.dtype))
    assert {k.domain for k in sess.kernels.values()} == {"test.session.types"}


def test_custom_node_inside_a_subgraph_is_bridged() -> None:
    """A custom node in an If branch runs through the bridge like one of the main graph."""

    @opbridge.op("test.session.sub::Silu")
    def silu(x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)

    branch = helper.make_graph(
        [helper.make_node("Silu", ["x"], ["t"], domain="test.session.sub", name="act")],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)],
    )
    other = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)],
    )
    node = helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=other, name="choose")
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("test.session.sub", 1)]
    )
    session = opbridge.InferenceSession(model)
    x = np.array([-1.0, 0.0, 2.0], np.float32)
    (taken,) = session.run(None, {"c": np.array(True), "x": x})
    np.testing.assert_allclose(taken, x / (1 + np.exp(-x)), rtol=1e-6, atol=1e-7)
    (other,) = session.run(None, {"c": np.array(False), "x": x})
    np.testing.assert_array_equal(other, x)
    assert session.kernels["act"].path in ("kernel", "reference")


def test_model_over_the_protobuf_limit_runs_from_a_temporary_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A model over protobuf's 2 GiB limit cannot go to ONNX Runtime as bytes: it is written with its
    tensors as external data to a temporary folder, removed with the session (the limit is lowered
    here so that a small model takes that path)."""
    import gc
    import tempfile

    import opbridge.ops
    from opbridge import model_io

    w = onnx.numpy_helper.from_array(np.linspace(-1, 1, 1000, dtype=np.float32), "w")
    nodes = [
        helper.make_node("Add", ["x", "w"], ["a"]),
        helper.make_node("MySELU", ["a", "w", "w"], ["y"], domain="opbridge"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1000])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1000])],
        initializer=[w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("opbridge", 1)])
    x = np.full(1000, 0.3, np.float32)
    want = opbridge.InferenceSession(model).run(None, {"x": x})[0]
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(model_io, "PROTO_LIMIT", 100)
    sess = opbridge.InferenceSession(model)
    folders = list(tmp_path.glob("opbridge-session-*"))
    assert len(folders) == 1 and (folders[0] / "model.data").stat().st_size >= 4000
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], want)
    del sess
    gc.collect()
    assert not folders[0].exists()


def test_unknown_output_type_of_a_kernel_only_op_is_explained() -> None:
    """A kernel-only op's int64 output feeding another node, with no value_info: ONNX Runtime takes the
    node's input type, and its type error gets opbridge's explanation and fix."""

    @opbridge.kernel("ArgMaxLast", domain="test.session.untyped")
    def arg_max_last(x: np.ndarray) -> np.ndarray:
        return np.argmax(x, axis=-1)

    nodes = [
        helper.make_node("ArgMaxLast", ["x"], ["i"], domain="test.session.untyped"),
        helper.make_node("Identity", ["i"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [2])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("test.session.untyped", 1)]
    )
    with pytest.raises(
        opbridge.ModelLoadError,
        match=r"could not tell the element type of test.session.untyped::ArgMaxLast output 'i' .* value_info",
    ):
        opbridge.InferenceSession(model)
    typed = onnx.ModelProto()
    typed.CopyFrom(model)
    typed.graph.value_info.append(helper.make_tensor_value_info("i", TensorProto.INT64, [2]))
    x = np.array([[1.0, 3.0, 2.0], [5.0, 0.0, 1.0]], np.float32)
    np.testing.assert_array_equal(opbridge.InferenceSession(typed).run(None, {"x": x})[0], [1, 0])


def test_custom_ops_named_like_onnx_runtime_ops_run(tmp_path: Path) -> None:
    """ONNX Runtime's optimizers match some ops by type alone (a one-input acme::Conv aborted the
    process in a fusion): bridged nodes named like its ops run under an in-memory name of their own.
    In a child process, so that an abort cannot end the test run."""
    stdout = run_script(
        tmp_path,
        "import numpy as np, onnx, opbridge\n"
        "from onnx import TensorProto, helper\n"
        "for name in ('Conv', 'Gemm', 'Add', 'Where', 'Gelu'):\n"
        "    opbridge.kernel(name, domain='test.session.std')(lambda x: x * 2)\n"
        "    node = helper.make_node(name, ['x'], ['y'], domain='test.session.std', name='n')\n"
        "    t = helper.make_tensor_value_info\n"
        "    graph = helper.make_graph([node], 'g', [t('x', TensorProto.FLOAT, [1, 2, 4, 4])],\n"
        "                              [t('y', TensorProto.FLOAT, [1, 2, 4, 4])])\n"
        "    opsets = [helper.make_opsetid('', 17), helper.make_opsetid('test.session.std', 1)]\n"
        "    sess = opbridge.InferenceSession(helper.make_model(graph, opset_imports=opsets))\n"
        "    x = np.arange(32, dtype=np.float32).reshape(1, 2, 4, 4)\n"
        "    assert (sess.run(None, {'x': x})[0] == 2 * x).all(), name\n"
        "    assert sess.kernels['n'].op_type == name\n"
        "print('ok')\n",
    )
    assert stdout.strip() == "ok"


def test_run_time_dtype_error_of_an_untyped_kernel_only_output_is_explained() -> None:
    @opbridge.kernel("Widen", domain="test.session.untyped")
    def widen(x: np.ndarray) -> np.ndarray:
        return x.astype(np.float64)

    nodes = [
        helper.make_node("Widen", ["x"], ["w"], domain="test.session.untyped"),
        helper.make_node("Cast", ["w"], ["y"], to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("test.session.untyped", 1)]
    )
    sess = opbridge.InferenceSession(model)
    with pytest.raises(Exception, match=r"has dtype float64, .*could not tell the element type of .*Widen output 'w'"):
        sess.run(None, {"x": np.ones(2, np.float32)})


@opbridge.op("tests.session::Double")
def _double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def _add_weight_then_double(custom: bool) -> onnx.ModelProto:
    second = (
        helper.make_node("Double", ["t"], ["y"], domain="tests.session")
        if custom
        else helper.make_node("Add", ["t", "t"], ["y"])
    )
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["t"]), second],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])],
        initializer=[onnx.numpy_helper.from_array(np.zeros(1, np.float32), "w")],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("tests.session", 1)]
    )


@pytest.mark.parametrize("custom", [False, True], ids=["plain-ops", "bridged-op"])
def test_options_a_session_options_cannot_report_come_through_a_function(custom: bool) -> None:
    """An initializer override or a free-dimension override cannot be read back from a SessionOptions, so
    a copy loses it (the file's weight ran, silently); a function making the options keeps every one."""
    import onnxruntime as ort

    weight = ort.OrtValue.ortvalue_from_numpy(np.full(1, 10, np.float32))

    def make_options() -> ort.SessionOptions:
        options = ort.SessionOptions()
        options.add_initializer("w", weight)
        options.add_free_dimension_override_by_name("n", 2)
        return options

    sess = opbridge.InferenceSession(_add_weight_then_double(custom), sess_options=make_options)
    (y,) = sess.run(None, {"x": np.ones(2, np.float32)})
    assert y.tolist() == [22.0, 22.0]
    assert sess.get_inputs()[0].shape == [2]
    with pytest.raises(TypeError, match="it must return an onnxruntime.SessionOptions; it returned dict"):
        opbridge.InferenceSession(_add_weight_then_double(custom), sess_options=dict)


# --------------------------------------------------------------------------- malformed protos, arguments, feeds


def _no_ir_version() -> onnx.ModelProto:
    model = onnx.ModelProto()
    model.graph.CopyFrom(_add_weight_then_double(False).graph)
    return model


def _no_outputs() -> onnx.ModelProto:
    model = _add_weight_then_double(False)
    del model.graph.output[:]
    return model


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (onnx.ModelProto, r"the given ModelProto: not a usable ONNX model \(ir_version 0, 0 node"),
        (_no_ir_version, r"the given ModelProto: not a usable ONNX model \(ir_version 0, 2 node"),
        (_no_outputs, r"the given ModelProto: the model's graph has no outputs"),
    ],
    ids=["empty", "no-ir-version", "no-outputs"],
)
def test_a_malformed_proto_gets_the_load_error_a_file_gets(make, message: str) -> None:
    """A ModelProto is checked as a file is (ONNX Runtime's own "No graph was found", a C++ Fail), and
    the proto is neither copied nor changed by the check."""
    from opbridge.graph import check_compat
    from opbridge.model_io import load_model

    model = make()
    before = model.SerializeToString()
    with pytest.raises(opbridge.ModelLoadError, match=message):
        opbridge.InferenceSession(model)
    with pytest.raises(opbridge.ModelLoadError, match=message):
        check_compat(model, "tensorrt")
    assert model.SerializeToString() == before
    good = _add_weight_then_double(False)
    assert load_model(good) is good


def test_bytes_of_a_path_are_read_as_a_serialized_model(tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(_add_weight_then_double(False), path)
    with pytest.raises(
        opbridge.ModelLoadError, match=r"bytes are read as a serialized ModelProto.*str or os\.PathLike"
    ):
        opbridge.InferenceSession(str(path).encode())


@pytest.mark.parametrize("custom", [False, True], ids=["plain-ops", "bridged-op"])
def test_sess_options_of_another_type_is_refused(custom: bool) -> None:
    """A dict of settings was dropped without a word (a bridged model) or refused by ONNX Runtime."""
    with pytest.raises(TypeError, match=r"sess_options must be an onnxruntime.SessionOptions .*got dict"):
        opbridge.InferenceSession(_add_weight_then_double(custom), sess_options={"intra_op_num_threads": 1})


@pytest.mark.parametrize("custom", [False, True], ids=["plain-ops", "bridged-op"])
def test_the_constructor_takes_onnxruntimes_arguments_in_its_order(custom: bool, tmp_path: Path) -> None:
    """InferenceSession(path, options), onnxruntime's most common call, failed as a model ONNX Runtime
    "cannot load" (the second argument was providers); path_or_bytes= and provider_options were refused.
    onnxruntime's other calls answer as the underlying session's do."""
    import onnxruntime as ort

    path = tmp_path / "m.onnx"
    onnx.save(_add_weight_then_double(custom), path)
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "profile")
    sess = opbridge.InferenceSession(str(path), options, ["CPUExecutionProvider"], [{}], bodies="auto")
    x = np.array([1.0, 2.0], np.float32)
    (y,) = sess.run(None, {"x": x})
    by_name = opbridge.InferenceSession(path_or_bytes=str(path), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(by_name.run(None, {"x": x})[0], y)
    assert sess.get_provider_options() == sess.session.get_provider_options()
    assert "CPUExecutionProvider" in sess.get_provider_options()
    assert sess.get_modelmeta().graph_name == onnx.load(path).graph.name
    assert sess.get_session_options().enable_profiling
    assert [i.name for i in sess.get_overridable_initializers()] == [
        i.name for i in sess.session.get_overridable_initializers()
    ]
    assert sess.get_profiling_start_time_ns() > 0
    binding = sess.io_binding()
    binding.bind_cpu_input("x", x)
    binding.bind_output(sess.get_outputs()[0].name)
    sess.run_with_iobinding(binding)
    np.testing.assert_array_equal(binding.copy_outputs_to_cpu()[0], y)
    values = sess.run_with_ort_values(None, {"x": ort.OrtValue.ortvalue_from_numpy(x)})
    np.testing.assert_array_equal(values[0].numpy(), y)
    assert Path(sess.end_profiling()).exists()
    with pytest.raises(TypeError, match=r"looks like execution providers: .* give providers=\.\.\. by name"):
        opbridge.InferenceSession(str(path), ["CPUExecutionProvider"])


@pytest.mark.parametrize("custom", [False, True], ids=["plain-ops", "bridged-op"])
def test_providers_set_on_the_session_options_are_used(custom: bool, caplog: pytest.LogCaptureFixture) -> None:
    """Providers given with SessionOptions.add_provider were replaced by CPU without a word (onnxruntime uses
    them where providers is None). The options of a bridged model are copied, and a copy cannot carry them:
    a warning says so and names the two ways that keep them."""
    import onnxruntime as ort

    def options() -> ort.SessionOptions:
        made = ort.SessionOptions()
        made.add_provider("AzureExecutionProvider", {})
        return made

    model = _add_weight_then_double(custom)
    with caplog.at_level(logging.WARNING, logger="opbridge"):
        copied = opbridge.InferenceSession(model, options())
    assert copied.get_providers() == (
        ["CPUExecutionProvider"] if custom else ["AzureExecutionProvider", "CPUExecutionProvider"]
    )
    warned = [r.getMessage() for r in caplog.records if "add_provider" in r.getMessage()]
    assert len(warned) == int(custom) and all("sess_options=make_options" in m for m in warned)
    made = opbridge.InferenceSession(model, options)  # (a function making the options: taken as it is)
    assert made.get_providers() == ["AzureExecutionProvider", "CPUExecutionProvider"]
    np.testing.assert_array_equal(
        made.run(None, {"x": np.ones(2, np.float32)})[0], copied.run(None, {"x": np.ones(2, np.float32)})[0]
    )


@pytest.mark.parametrize("session", ["onnxruntime", "reference"])
def test_bytes_strings_are_read_as_utf8_text(session: str) -> None:
    """ONNX Runtime read a fixed-width bytes element that fills its width on into the next one
    ([b"abc", b"d"] came back as ["abcd", "d"]); the reference evaluator handed back bytes."""
    from opbridge.reference import ReferenceSession

    graph = helper.make_graph(
        [helper.make_node("Identity", ["s"], ["t"])],
        "g",
        [helper.make_tensor_value_info("s", TensorProto.STRING, [2])],
        [helper.make_tensor_value_info("t", TensorProto.STRING, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    make = opbridge.InferenceSession if session == "onnxruntime" else ReferenceSession
    (got,) = make(model).run(None, {"s": np.array([b"abc", "dé".encode()])})
    assert got.tolist() == ["abc", "dé"]
    with pytest.raises(ValueError, match=r"input 's' holds bytes that are not UTF-8 .*decode them to str first"):
        make(model).run(None, {"s": np.array([b"\xff", b"d"])})


def test_one_provider_string_is_one_provider(capfd: pytest.CaptureFixture[str]) -> None:
    """ONNX Runtime split a string into its letters (an EP error, then a fallback)."""
    sess = opbridge.InferenceSession(_add_weight_then_double(True), providers="CPUExecutionProvider")
    assert sess.get_providers() == ["CPUExecutionProvider"]
    assert "EP Error" not in capfd.readouterr().out


@pytest.fixture(scope="module")
def fixed_and_named_dims() -> opbridge.InferenceSession:
    """A bridged model of one input of dims ``n x 3``."""
    graph = helper.make_graph(
        [helper.make_node("Double", ["x"], ["y"], domain="tests.session")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("tests.session", 1)]
    )
    return opbridge.InferenceSession(model)


@pytest.mark.parametrize(
    ("feed", "message"),
    [
        ({"X": np.ones((2, 3), np.float32)}, r"missing \['x'\], unknown \['X'\]; the model's inputs are \['x'\]"),
        ({}, r"mismatch: missing \['x'\]; "),
        ({"x": np.ones((2, 3), np.float32), "z": np.ones(1)}, r"mismatch: unknown \['z'\]; "),
        ({"x": np.ones((2, 3))}, r"input 'x' expects tensor\(float\) \(numpy float32\), got numpy float64"),
        ({"x": np.ones(3, np.float32)}, r"input 'x' has shape \(3,\), but the model declares nx3"),
        ({"x": np.ones((2, 4), np.float32)}, r"input 'x' has shape \(2, 4\), but the model declares nx3"),
    ],
    ids=["wrong-name", "missing", "extra", "dtype", "rank", "fixed-dim"],
)
def test_run_names_the_input_a_feed_gets_wrong(fixed_and_named_dims, feed: dict, message: str) -> None:
    """As ReferenceSession.run does, not ONNX Runtime's InvalidArgument."""
    with pytest.raises(opbridge.OpbridgeError, match=message) as err:
        fixed_and_named_dims.run(None, feed)
    assert isinstance(err.value, ValueError)
    (y,) = fixed_and_named_dims.run(None, {"x": np.ones((5, 3), np.float32)})
    np.testing.assert_allclose(y, np.full((5, 3), 2.0, np.float32), rtol=0, atol=0)


def test_an_overridable_initializer_may_be_fed() -> None:
    model = _add_weight_then_double(False)
    model.graph.input.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [1]))
    sess = opbridge.InferenceSession(model)
    (y,) = sess.run(None, {"x": np.ones(2, np.float32), "w": np.full(1, 4, np.float32)})
    np.testing.assert_allclose(y, np.full(2, 10.0, np.float32), rtol=0, atol=0)
    with pytest.raises(opbridge.OpbridgeError, match=r"input 'w' expects tensor\(float\)"):
        sess.run(None, {"x": np.ones(2, np.float32), "w": np.full(1, 4, np.int64)})


def test_run_takes_the_feeds_onnx_runtime_takes() -> None:
    """The feed checks refused what ONNX Runtime runs: an optional input left out, a big-endian array
    (which ONNX Runtime reads as native, wrong values: it is converted), a one-element array for an input
    declared as a scalar."""
    opt = helper.make_value_info(
        "o", helper.make_optional_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, [2]))
    )
    has = helper.make_model(
        helper.make_graph(
            [helper.make_node("OptionalHasElement", ["o"], ["h"])],
            "g",
            [opt],
            [helper.make_tensor_value_info("h", TensorProto.BOOL, [])],
        ),
        opset_imports=[helper.make_opsetid("", 18)],
    )
    assert opbridge.InferenceSession(has).run(None, {})[0].item() is False
    add = helper.make_model(
        helper.make_graph(
            [helper.make_node("Add", ["a", "x"], ["y"])],
            "g",
            [
                helper.make_tensor_value_info("a", TensorProto.FLOAT, []),
                helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2]),
            ],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    (y,) = opbridge.InferenceSession(add).run(None, {"a": np.array([1], np.float32), "x": np.ones((3, 2), ">f4")})
    np.testing.assert_array_equal(y, np.full((3, 2), 2, np.float32))
    # a numpy scalar for a scalar input, as ReferenceSession and verify take it (ONNX Runtime raised "Unable to
    # handle object of type <class 'numpy.float32'>")
    (y,) = opbridge.InferenceSession(add).run(None, {"a": np.float32(2), "x": np.ones((1, 2), np.float32)})
    np.testing.assert_array_equal(y, np.full((1, 2), 3, np.float32))


@pytest.mark.parametrize("session", ["InferenceSession", "ReferenceSession"])
def test_a_proto_whose_external_data_was_not_read_is_named(tmp_path: Path, session: str) -> None:
    """A ModelProto loaded with load_external_data=False failed in ONNX Runtime's words ("model_path must not
    be empty") or the evaluator's ("An instance of LargeContainer should be created")."""
    from onnx import numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [numpy_helper.from_array(np.arange(4, dtype=np.float32), "w")],
    )
    path = tmp_path / "m.onnx"
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path), save_as_external_data=True, location="m.data", size_threshold=0)
    unread = onnx.load(str(path), load_external_data=False)
    runner = getattr(opbridge, session)
    for given in (unread, unread.SerializeToString()):
        with pytest.raises(opbridge.ModelLoadError, match=rf"{session}: the given model keeps tensor 'w' in the"):
            runner(given)
    (y,) = runner(str(path)).run(None, {"x": np.zeros(4, np.float32)})
    np.testing.assert_array_equal(y, np.arange(4, dtype=np.float32))


def test_bfloat16_inputs_are_refused_with_the_way_out() -> None:
    """A float32 array for a bfloat16 input, or an ml_dtypes bfloat16 array (which ONNX Runtime's Python API
    cannot convert: "Numpy_type 256 can't be converted to MLDataType"), is named with what to do instead."""
    import ml_dtypes

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [3])],
        [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [3])],
    )
    sess = opbridge.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    x = np.ones(3, np.float32)
    with pytest.raises(InputError, match=r"expects tensor\(bfloat16\).*got numpy float32; ONNX Runtime's Python"):
        sess.run(None, {"x": x})
    with pytest.raises(InputError, match=r"input 'x' is bfloat16, which ONNX Runtime's Python API takes no"):
        sess.run(None, {"x": x.astype(ml_dtypes.bfloat16)})


@opbridge.op("tests.session.nested::Inner")
def _nested_inner(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@opbridge.op("tests.session.nested::Outer")
def _nested_outer(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + 1


@_nested_outer.register_kernel
def _nested_outer_kernel(x: np.ndarray) -> np.ndarray:
    return x * 2 + 1


def test_an_op_whose_body_calls_another_custom_op_still_runs_its_kernel() -> None:
    """A body calling another custom op made the session inline every body before it chose kernels: the
    outer op's kernel never ran, under bodies='auto' or 'never' (the body here is wrong on purpose: + 5)."""
    domain = "tests.session.nested"
    body = helper.make_function(
        domain,
        "Outer",
        ["x"],
        ["output"],
        [
            helper.make_node("Inner", ["x"], ["t"], domain=domain),
            helper.make_node("Constant", [], ["c"], value_float=5.0),
            helper.make_node("Add", ["t", "c"], ["output"]),
        ],
        [helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)],
    )
    value = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [3])  # noqa: E731
    graph = helper.make_graph([helper.make_node("Outer", ["x"], ["y"], domain=domain)], "g", [value("x")], [value("y")])
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)], functions=[body]
    )
    x = np.ones(3, np.float32)
    for bodies, want in (("never", 3.0), ("always", 7.0)):
        session = opbridge.InferenceSession(model, bodies=bodies)
        np.testing.assert_array_equal(session.run(None, {"x": x})[0], np.full(3, want, np.float32), err_msg=bodies)
    session = opbridge.InferenceSession(model, bodies="never")
    assert [(k.op_type, k.path) for k in session.kernels.values()] == [("Outer", "kernel")]


@opbridge.op("tests.session.pred::Pick")
def _pick(x: torch.Tensor, mode: str = "a") -> torch.Tensor:
    return x * 2


_pick.register_kernel(lambda x, mode="a": x * 2)


@_pick.register_function(prefer_kernel=lambda attrs: attrs["mdoe"] == "b")  # (misspelt on purpose)
def _pick_body(spec, opset):  # type: ignore[no-untyped-def]
    from opbridge.functions import make_body

    return make_body(spec, [helper.make_node("Add", ["x", "x"], ["output"])], opset)


@opbridge.kernel("tests.session.byname::Twice")
def _twice_by_name(x: np.ndarray) -> np.ndarray:
    return x * 2 + 100  # (told apart from the body's x * 2)


def _one_call_with_body(domain: str, op_type: str, body_nodes: list, **attrs: Any) -> onnx.ModelProto:
    """x -> domain::op_type -> y, the op's body (x -> output) in the model."""
    body = helper.make_function(domain, op_type, ["x"], ["output"], body_nodes, [helper.make_opsetid("", 17)])
    value = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [3])  # noqa: E731
    node = helper.make_node(op_type, ["x"], ["y"], domain=domain, **attrs)
    graph = helper.make_graph([node], "g", [value("x")], [value("y")])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)]
    return helper.make_model(graph, opset_imports=opsets, functions=[body])


def test_a_prefer_kernel_rule_that_raises_is_named() -> None:
    """A prefer_kernel rule that raised (a misspelt attribute) reached the user as a bare KeyError."""
    model = _one_call_with_body(
        "tests.session.pred", "Pick", [helper.make_node("Add", ["x", "x"], ["output"])], mode="b"
    )
    with pytest.raises(opbridge.OpDefinitionError, match=r"tests.session.pred::Pick: the prefer_kernel rule of its f"):
        opbridge.InferenceSession(model)
    assert opbridge.InferenceSession(model, bodies="always").run(None, {"x": np.ones(3, np.float32)})[0][0] == 2


def test_bodies_never_runs_a_kernel_registered_by_name() -> None:
    """With bodies='never' a node whose op has a body in the model and only an @opbridge.kernel (no
    @opbridge.op) ran the body, where the reference evaluator ran the kernel."""
    model = _one_call_with_body("tests.session.byname", "Twice", [helper.make_node("Add", ["x", "x"], ["output"])])
    x = np.ones(3, np.float32)
    assert opbridge.InferenceSession(model, bodies="never").run(None, {"x": x})[0].tolist() == [102.0] * 3
    assert opbridge.InferenceSession(model, bodies="always").run(None, {"x": x})[0].tolist() == [2.0] * 3


def test_a_model_onnx_runtime_refuses_is_a_model_load_error_naming_the_file(tmp_path: Path) -> None:
    """ONNX Runtime's own exception (Fail, InvalidArgument) came through as it was, naming no file:
    ``except opbridge.ModelLoadError`` missed it."""
    value = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [2])  # noqa: E731
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="a"), helper.make_node("Neg", ["x"], ["y"], name="b")]
    path = tmp_path / "twice.onnx"
    graph = helper.make_graph(nodes, "g", [value("x")], [value("y")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    with pytest.raises(opbridge.ModelLoadError, match=rf"{re.escape(str(path))}: ONNX Runtime cannot load it: .*Dupl"):
        opbridge.InferenceSession(path)
