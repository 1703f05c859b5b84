"""opbridge.export: every seed model x both exporters gives a valid ONNX file with its custom nodes."""

from __future__ import annotations

import copy
import logging
import math
import re
from pathlib import Path
from typing import Any, Literal, Optional
from unittest import mock

import numpy as np
import onnx
import pytest
import torch
from conftest import EXPORTERS, SEED_IDS, run_script, seed_by_name

import opbridge
from opbridge import ExportError

# (domain, op_type) -> expected {attribute name: (ONNX type, value)} of each node, in graph order.
EXPECTED_NODES: dict[str, list[tuple[str, str, int, dict[str, tuple[str, Any]]]]] = {
    "myselu": [
        (
            "opbridge",
            "MySELU",
            1,
            {"attr1": ("STRING", "这是字符串属性"), "attr2": ("INTS", [1, 2, 3]), "attr3": ("FLOAT", 222.0)},
        )
    ],
    "strange_net": [
        ("opbridge", "MyStrangeOp", 2, {"float_attr": ("FLOATS", [0.1, 0.5]), "int_attr": ("INTS", [2, 2])}),
        ("opbridge", "MyStrangeOp", 2, {"float_attr": ("FLOATS", [0.5, 0.5]), "int_attr": ("INTS", [3, 3])}),
    ],
    "strange_net2": [
        (
            "opbridge",
            "MyStrangeOp2",
            1,
            {"int_attr1": ("INT", 10), "int_attr2": ("INTS", [3, 5]), "str_attr3": ("STRING", "first")},
        ),
        (
            "opbridge",
            "MyStrangeOp2",
            1,
            {"int_attr1": ("INT", 40), "int_attr2": ("INTS", [12, 22]), "str_attr3": ("STRING", "second")},
        ),
    ],
    "super_resolution": [("Test", "DynamicTRTResize", 1, {"align_corners": ("INT", 0)})],
}

# Output dims after ONNX shape inference: the graph output's, with dynamic axes kept by name.
EXPECTED_OUTPUT_DIMS = {
    "myselu": ["batch", 1, "height", "width"],
    "strange_net": ["batch", 3, 4, 4],
    "strange_net2": ["batch", 3, 4, 4],
    "super_resolution": ["batch", 3, "out_height", "out_width"],
}


def _dims(value: onnx.ValueInfoProto) -> list[Any]:
    return [d.dim_param if d.HasField("dim_param") else d.dim_value for d in value.type.tensor_type.shape.dim]


def _attr(a: onnx.AttributeProto) -> tuple[str, Any]:
    value = onnx.helper.get_attribute_value(a)
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    if isinstance(value, list):
        value = [v.decode("utf-8") if isinstance(v, bytes) else v for v in value]
    return onnx.AttributeProto.AttributeType.Name(a.type), value


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", SEED_IDS)
def test_custom_nodes_exact(seed_export: Any, name: str, exporter: str) -> None:
    result = seed_export(name, exporter)
    nodes = [n for n in result.model.graph.node if n.domain not in ("", "ai.onnx")]
    assert len(nodes) == len(EXPECTED_NODES[name])
    for node, (domain, op_type, n_out, attrs) in zip(nodes, EXPECTED_NODES[name]):
        assert (node.domain, node.op_type) == (domain, op_type)
        assert len(node.output) == n_out
        got = {a.name: _attr(a) for a in node.attribute}
        assert set(got) == set(attrs)
        for key, (kind, value) in attrs.items():
            assert got[key][0] == kind, key
            if kind in ("FLOAT", "FLOATS"):
                assert got[key][1] == pytest.approx(value, rel=1e-7, abs=0), key
            else:
                assert got[key][1] == value, key
    imports = {o.domain: o.version for o in result.model.opset_import}
    for domain, _, _, _ in EXPECTED_NODES[name]:
        assert imports.get(domain) == 1
    assert [(n.domain, n.op_type) for n in result.custom_nodes] == [(n.domain, n.op_type) for n in nodes]


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", SEED_IDS)
def test_file_checks_and_infers_shapes(seed_export: Any, name: str, exporter: str) -> None:
    result = seed_export(name, exporter)
    model = onnx.load(result.path)
    opbridge.register_onnx_schemas()
    onnx.checker.check_model(model, full_check=True)
    stripped = onnx.ModelProto()
    stripped.CopyFrom(model)
    del stripped.graph.value_info[:]
    inferred = onnx.shape_inference.infer_shapes(stripped, strict_mode=True)
    types = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    for node in result.custom_nodes:
        for out in node.output:
            assert out in types, f"shape inference gave no type to {out}"
            assert types[out].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
            assert len(types[out].type.tensor_type.shape.dim) == 4
    assert _dims(inferred.graph.output[0]) == EXPECTED_OUTPUT_DIMS[name]


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", SEED_IDS)
def test_inputs_dynamic_and_parameters_are_initializers(seed_export: Any, name: str, exporter: str) -> None:
    seed = seed_by_name(name)
    model = seed_export(name, exporter).model
    inputs = {i.name: _dims(i) for i in model.graph.input}
    assert list(inputs) == list(seed.input_names), "parameters and constants must not become graph inputs"
    for input_name, axes in seed.dynamic.items():
        for axis, dim_name in axes.items():
            assert inputs[input_name][axis] == dim_name
    initializers = {i.name for i in model.graph.initializer}
    constants = {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    for node in (n for n in model.graph.node if n.domain not in ("", "ai.onnx")):
        for value in node.input[1:]:
            if value and value not in inputs:
                producer = [n.op_type for n in model.graph.node if value in n.output]
                assert value in initializers or value in constants or producer, value


def test_myselu_parameter_and_constant(seed_export: Any) -> None:
    for exporter in EXPORTERS:
        model = seed_export("myselu", exporter).model
        node = next(n for n in model.graph.node if n.op_type == "MySELU")
        inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
        consts = {
            n.output[0]: onnx.numpy_helper.to_array(n.attribute[0].t)
            for n in model.graph.node
            if n.op_type == "Constant"
        }
        assert inits[node.input[1]].tolist() == [0.0, 1.0, 2.0], "the parameter is an initializer"
        const = inits.get(node.input[2], consts.get(node.input[2]))
        assert const is not None and const.tolist() == [3.0, 2.0, 1.0], "the constant stays a constant"


def test_tracer_warning_captured(tmp_path: Path) -> None:
    class BuildsATensor(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return scaled_swish(x + torch.tensor([1.0]))

    result = opbridge.export(BuildsATensor(), (torch.ones(2, 3),), tmp_path / "w.onnx", exporter="torchscript")
    assert any(w.category == "TracerWarning" and "torch.tensor" in w.message for w in result.warnings)


# ------------------------------------------------------------------ the README's user snippet


@opbridge.op("acme::ScaledSwish")
def scaled_swish(x: torch.Tensor, beta: float = 1.0, tag: str = "") -> torch.Tensor:
    return x * torch.sigmoid(beta * x)


@opbridge.op("acme::AllAttrs", version=3)
def all_attrs(
    x: torch.Tensor,
    bias: Optional[torch.Tensor],  # noqa: UP045 - the Optional spelling is what is tested
    f: float,
    i: int,
    b: bool,
    s: str,
    fs: list[float],
    is_: list[int],
    ss: list[str],
) -> tuple[torch.Tensor, torch.Tensor]:
    return x * f, x + i if bias is None else x + bias


class Swish(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return scaled_swish(x, beta=2.0, tag="这是字符串属性")


class AllAttrsModel(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = all_attrs(
            x, None, f=0.123456789, i=2**40, b=True, s="ü", fs=[0.5, -1.25], is_=[-1, 2**33], ss=["p", "这", ""]
        )
        return a + b


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_user_snippet(tmp_path: Path, exporter: str) -> None:
    x = torch.randn(2, 3, 8)
    path = tmp_path / "m.onnx"
    if exporter == "dynamo":
        kw: dict[str, Any] = {"dynamic_shapes": ({0: torch.export.Dim("batch")},)}
    else:
        kw = {"dynamic_axes": {"x": {0: "batch"}}}
    result = opbridge.export(Swish(), (x,), path, exporter=exporter, **kw)
    (node,) = result.custom_nodes
    assert (node.domain, node.op_type) == ("acme", "ScaledSwish")
    assert {a.name: _attr(a) for a in node.attribute} == {"beta": ("FLOAT", 2.0), "tag": ("STRING", "这是字符串属性")}
    assert _dims(onnx.load(path).graph.input[0])[0] == "batch"


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_every_attribute_type(tmp_path: Path, exporter: str) -> None:
    result = opbridge.export(AllAttrsModel(), (torch.randn(2, 3),), tmp_path / "a.onnx", exporter=exporter)
    (node,) = result.custom_nodes
    assert (node.domain, node.op_type, len(node.output)) == ("acme", "AllAttrs", 2)
    assert len(node.input) == 1 or node.input[1] == "", "an omitted optional input is empty"
    got = {a.name: _attr(a) for a in node.attribute}
    assert got["f"][0] == "FLOAT" and got["f"][1] == pytest.approx(0.123456789, rel=1e-7)
    assert got["i"] == ("INT", 2**40)
    assert got["b"] == ("INT", 1)
    assert got["s"] == ("STRING", "ü")
    assert got["fs"] == ("FLOATS", [0.5, -1.25])
    assert got["is_"] == ("INTS", [-1, 2**33])
    assert got["ss"] == ("STRINGS", ["p", "这", ""])
    assert {o.domain: o.version for o in result.model.opset_import}["acme"] == 3


@opbridge.op("acme::PickRows")
def pick_rows(x: torch.Tensor, mode: Literal["avg", "max"] = "avg", rows: list[Literal[0, 1]] = [0]) -> torch.Tensor:  # noqa: B006
    picked = x[list(rows)]
    return picked.amax(0) if mode == "max" else picked.mean(0)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_literal_attributes_export_their_value_and_refuse_others(tmp_path: Path, exporter: str) -> None:
    class Pick(torch.nn.Module):
        def __init__(self, mode: str) -> None:
            super().__init__()
            self.mode = mode

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return pick_rows(x, mode=self.mode, rows=[1, 0])

    result = opbridge.export(Pick("max"), (torch.randn(2, 3),), tmp_path / "p.onnx", exporter=exporter)
    (node,) = result.custom_nodes
    assert {a.name: _attr(a) for a in node.attribute} == {"mode": ("STRING", "max"), "rows": ("INTS", [1, 0])}
    target = tmp_path / "mean.onnx"
    with pytest.raises(
        ExportError, match=r"attribute 'mode' = 'mean' is not one of the values it takes, \['avg', 'max'\]"
    ):
        opbridge.export(Pick("mean"), (torch.randn(2, 3),), target, exporter=exporter)
    assert not target.exists()


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_lost_op_fails_loudly(tmp_path: Path, exporter: str) -> None:
    class Dropped(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            scaled_swish(x)  # result unused: the exporter eliminates the node
            return x + 1

    target = tmp_path / "dropped.onnx"
    with pytest.raises(ExportError, match=r"dropped or inlined custom op\(s\) acme::ScaledSwish v1"):
        opbridge.export(Dropped(), (torch.randn(2),), target, exporter=exporter)
    assert not target.exists(), "a failed export writes nothing"


def test_op_on_a_constant_made_in_forward_names_torchscripts_folding(tmp_path: Path) -> None:
    """TorchScript folds an op whose inputs are all trace-time constants: the error says so (the model
    does call the op object), and dynamo keeps the node."""

    class OnConstant(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + scaled_swish(torch.arange(3, dtype=torch.float32), beta=5.0)

    with pytest.raises(
        ExportError, match=r"folds an op whose inputs are all constants at trace time.*exporter='dynamo'"
    ):
        opbridge.export(OnConstant(), (torch.randn(2, 3),), tmp_path / "c.onnx", exporter="torchscript")
    result = opbridge.export(OnConstant(), (torch.randn(2, 3),), tmp_path / "c.onnx", exporter="dynamo")
    assert [f"{n.domain}::{n.op_type}" for n in result.custom_nodes] == ["acme::ScaledSwish"]


@opbridge.op("acme.tensorless::Ramp")
def _ramp(n: int = 3) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32)


@opbridge.op("acme.tensorless::Fill")
def _fill(x: torch.Tensor | None = None, k: float = 1.0) -> torch.Tensor:
    return torch.full((3,), k) if x is None else x * k


@pytest.mark.parametrize(
    ("call", "said"),
    [
        (lambda: _ramp(n=3), "acme.tensorless::Ramp takes no tensor inputs"),
        (lambda: _fill(k=2.0), r"acme.tensorless::Fill takes only optional tensor inputs \(a call may give none\)"),
    ],
    ids=["no-tensor-inputs", "optional-inputs-left-out"],
)
def test_a_call_without_tensors_names_torchscripts_constant(tmp_path: Path, call: Any, said: str) -> None:
    """An op called without a tensor is a constant to the TorchScript tracer: the error says why for an op
    whose tensor inputs are all optional too (it spoke of tensors made inside forward); dynamo keeps it."""

    class Tensorless(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + call()

    with pytest.raises(ExportError, match=said + r".*recorded by the TorchScript tracer as a constant"):
        opbridge.export(Tensorless(), (torch.randn(3),), tmp_path / "t.onnx", exporter="torchscript")
    result = opbridge.export(Tensorless(), (torch.randn(3),), tmp_path / "t.onnx", exporter="dynamo")
    assert [n.domain for n in result.custom_nodes] == ["acme.tensorless"]


@opbridge.op("acme.versions::Act", version=1)
def act_v1(x: torch.Tensor) -> torch.Tensor:
    return x + 1


@opbridge.op("acme.versions::Act", version=2)
def act_v2(x: torch.Tensor) -> torch.Tensor:
    return x * 100


@opbridge.op("acme.versions::Other", version=2)
def other_v2(x: torch.Tensor) -> torch.Tensor:
    return x - 1


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_domain_is_imported_at_the_called_version(tmp_path: Path, exporter: str) -> None:
    """With Act v1 and v2 defined, a model calling v1 imports the domain at version 1 (at 2 every
    runtime would run v2); calling v1 beside another op's v2 cannot be written and is refused."""

    class CallsV1(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return act_v1(x)

    x = torch.ones(2, 3)
    result = opbridge.export(CallsV1(), (x,), tmp_path / "v1.onnx", exporter=exporter)
    assert {o.domain: o.version for o in result.model.opset_import}["acme.versions"] == 1
    sess = opbridge.InferenceSession(result.path)
    np.testing.assert_array_equal(sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0], np.full((2, 3), 2.0))

    class Mixed(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return other_v2(act_v1(x))

    target = tmp_path / "mixed.onnx"
    with pytest.raises(ExportError, match=r"calls acme.versions::Act v1, but its domain is imported at version 2"):
        opbridge.export(Mixed(), (x,), target, exporter=exporter)
    assert not target.exists()


def test_dynamo_exports_beside_ops_named_like_standard_or_other_domains_ops(tmp_path: Path) -> None:
    """onnx.reference, which the dynamo exporter imports, refuses two schemas of one op name; in a
    fresh process (where it is not imported yet) ops named like a standard op, or like another
    domain's op, still export."""
    stdout = run_script(
        tmp_path,
        f"""
        import torch, opbridge

        @opbridge.op("names_a::Gelu")
        def gelu(x: torch.Tensor) -> torch.Tensor:
            return x * 2

        @opbridge.op("names_b::Gelu")
        def other_gelu(x: torch.Tensor) -> torch.Tensor:
            return x * 3

        class M(torch.nn.Module):
            def forward(self, x):
                return other_gelu(gelu(x))

        result = opbridge.export(M(), (torch.ones(2, 3),), {str(tmp_path / "names.onnx")!r}, exporter="dynamo")
        print(sorted((n.domain, n.op_type) for n in result.custom_nodes))
        """,
    )
    assert stdout.strip().splitlines()[-1] == "[('names_a', 'Gelu'), ('names_b', 'Gelu')]"


def test_dynamo_exports_ops_named_like_an_onnxscript_opsets_attributes(tmp_path: Path) -> None:
    """An op named 'domain' or 'version' gave onnxscript's Opset attribute, a str, to call: the export
    failed with torch's generic "Failed to convert" error."""

    @opbridge.op("tests.names::domain")
    def domain(x: torch.Tensor, k: int = 1) -> torch.Tensor:
        return x + k

    @opbridge.op("tests.names::version")
    def version(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @opbridge.op("tests.names::cache")
    def cache(x: torch.Tensor) -> torch.Tensor:
        return x - 1

    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return cache(version(domain(x, k=3)))

    x = torch.randn(2, 3)
    result = opbridge.export(M(), (x,), tmp_path / "names.onnx", exporter="dynamo")
    assert [(n.op_type, [_attr(a) for a in n.attribute]) for n in result.custom_nodes] == [
        ("domain", [("INT", 3)]),
        ("version", []),
        ("cache", []),
    ]
    session = opbridge.InferenceSession(str(result.path))
    (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    torch.testing.assert_close(torch.from_numpy(got), (x + 3) * 2 - 1, rtol=0, atol=0)


class _InterruptedInsideTorch(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        try:
            raise KeyboardInterrupt  # (as a Ctrl-C lands in one of torch's lazy imports)
        except KeyboardInterrupt:
            raise AttributeError("module 'torch._dynamo' has no attribute 'exc'") from None


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_a_ctrl_c_behind_an_exporters_error_is_raised_not_reported(tmp_path: Path, exporter: str) -> None:
    """A Ctrl-C during torch's lazy imports comes back as another error (AttributeError), which export
    reported as the model's fault ("dynamo export of Model failed: ... Modify the model code")."""
    with pytest.raises(KeyboardInterrupt):
        opbridge.export(_InterruptedInsideTorch(), (torch.ones(2),), tmp_path / "m.onnx", exporter=exporter)
    assert not (tmp_path / "m.onnx").exists()


@opbridge.op("acme::EmptyLists")
def empty_lists(x: torch.Tensor, fs: list[float] = [], is_: list[int] = [], ss: list[str] = []) -> torch.Tensor:  # noqa: B006
    return x + len(fs) + 2 * len(is_) + 4 * len(ss)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_empty_list_attributes_keep_their_type(tmp_path: Path, exporter: str) -> None:
    class Empty(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return empty_lists(x, fs=[], is_=[], ss=[])

    x = torch.zeros(2)
    result = opbridge.export(Empty(), (x,), tmp_path / "empty.onnx", exporter=exporter)
    (node,) = result.custom_nodes
    assert {a.name: _attr(a) for a in node.attribute} == {
        "fs": ("FLOATS", []),
        "is_": ("INTS", []),
        "ss": ("STRINGS", []),
    }
    sess = opbridge.InferenceSession(result.path)
    np.testing.assert_array_equal(sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0], np.zeros(2))


@opbridge.op("acme::Affine")
def affine(
    x: torch.Tensor,
    w: Optional[torch.Tensor] = None,  # noqa: UP045 - the Optional spelling is what is tested
    b: Optional[torch.Tensor] = None,  # noqa: UP045
) -> torch.Tensor:
    y = x * w if w is not None else x.clone()
    return y + b if b is not None else y


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_omitted_optional_input_before_a_given_one(tmp_path: Path, exporter: str) -> None:
    class SkipsW(torch.nn.Module):
        def forward(self, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return affine(x, None, b)

    x, b = torch.randn(2, 3, generator=torch.Generator().manual_seed(3)), torch.full((2, 3), 0.5)
    result = opbridge.export(SkipsW(), (x, b), tmp_path / "skip.onnx", exporter=exporter, input_names=["x", "b"])
    (node,) = result.custom_nodes
    assert list(node.input)[1] == "" and len(node.input) == 3
    sess = opbridge.InferenceSession(result.path)
    np.testing.assert_array_equal(sess.run(None, {"x": x.numpy(), "b": b.numpy()})[0], (x + b).numpy())


@opbridge.op("acme::RepeatRows")
def repeat_rows(x: torch.Tensor, n: int = 1) -> torch.Tensor:
    return x.repeat(n, 1)


def test_dynamic_dim_made_static_is_refused(tmp_path: Path) -> None:
    """A dynamic size passed to an int attribute fails torch.export's first trace, and torch.onnx's
    strict retry specializes the dim: the export says so instead of writing a static input."""

    class SizeAsAttribute(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return repeat_rows(x, n=x.shape[0])

    target = tmp_path / "symint.onnx"
    with pytest.raises(ExportError, match=r"input 'x' dim 0 \(batch\) was asked to be dynamic, but .* static \(2\)"):
        opbridge.export(
            SizeAsAttribute(),
            (torch.ones(2, 3),),
            target,
            exporter="dynamo",
            dynamic_shapes=({0: torch.export.Dim("batch")},),
        )
    assert not target.exists()


@opbridge.op("acme::CountAll")
def count_all(x: torch.Tensor) -> torch.Tensor:
    return torch.tensor(x.numel(), dtype=torch.int64)


@opbridge.op("acme::CountAllDeclared", shape=lambda x: opbridge.TensorInfo((), torch.int64))
def count_all_declared(x: torch.Tensor) -> torch.Tensor:
    return torch.tensor(x.numel(), dtype=torch.int64)


def test_a_dim_made_static_by_a_derived_shape_names_the_op_without_a_shape_rule(tmp_path: Path) -> None:
    """A reference that turns a size into a value, run on the trace's fake tensors for want of a shape
    rule, fixes the dim: the error gave only causes that did not apply. It now names the op; declaring
    its shape keeps the dim dynamic."""

    class Count(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return count_all(x)

    class CountDeclared(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return count_all_declared(x)

    dims = ({0: torch.export.Dim("b")},)
    with pytest.raises(
        ExportError, match=r"an op that declares no shape rule \(acme::CountAll\).*@CountAll.register_shape"
    ):
        opbridge.export(Count(), (torch.ones(3, 4),), tmp_path / "c.onnx", dynamic_shapes=dims)
    result = opbridge.export(CountDeclared(), (torch.ones(3, 4),), tmp_path / "d.onnx", dynamic_shapes=dims)
    assert result.model.graph.input[0].type.tensor_type.shape.dim[0].dim_param
    (got,) = opbridge.InferenceSession(result.path).run(None, {"x": np.ones((5, 4), np.float32)})
    assert int(got) == 20


@opbridge.op("acme::Positives", shape=lambda x: opbridge.TensorInfo((opbridge.SymDim(),), x.dtype))
def positives(x: torch.Tensor) -> torch.Tensor:
    """An output size that depends on the data: the rule says so with SymDim()."""
    return x[x > 0]


@opbridge.op("acme::PositivesNoRule")
def positives_no_rule(x: torch.Tensor) -> torch.Tensor:
    return x[x > 0]


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_data_dependent_output_size(tmp_path: Path, exporter: str) -> None:
    class Keep(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return positives(x) * 2

    x = torch.tensor([1.0, -2.0, 3.0, 0.0, 5.0])
    result = opbridge.export(Keep(), (x,), tmp_path / "dd.onnx", exporter=exporter, input_names=["x"])
    (dim,) = result.model.graph.output[0].type.tensor_type.shape.dim
    assert not dim.HasField("dim_value"), "the size is not static"
    sess = opbridge.InferenceSession(result.path)
    for values in ([1.0, -2.0, 3.0, 0.0, 5.0], [-1.0, 4.0, -1.0, -1.0, -1.0], [-3.0] * 5):
        feed = np.array(values, np.float32)
        np.testing.assert_array_equal(sess.run(None, {"x": feed})[0], feed[feed > 0] * 2)

    class NoRule(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return positives_no_rule(x)

    with pytest.raises(
        ExportError,
        match=r"acme::PositivesNoRule declares no shape rule, and its reference (raised \w+ on the fake|cannot run on meta)",
    ):
        opbridge.export(NoRule(), (x,), tmp_path / "dd_no_rule.onnx", exporter=exporter)


@opbridge.op("acme::PadCols")
def pad_cols(x: torch.Tensor, pad: list[int] = [0, 0]) -> torch.Tensor:  # noqa: B006
    return torch.nn.functional.pad(x, pad)


@pad_cols.register_shape
def _(x: Any, pad: list[int] = [0, 0]) -> opbridge.TensorInfo:  # noqa: B006
    return opbridge.TensorInfo((x.shape[0], x.shape[1] + pad[0] + pad[1]), x.dtype)


@opbridge.op("acme::FirstFactor")
def first_factor(x: torch.Tensor, k: list[int] = []) -> torch.Tensor:  # noqa: B006
    return x * k[0]


_RAISED_BY = {
    "shape-rule": r"\(raised by acme::PadCols's shape rule, @PadCols.register_shape\)",
    "reference": r"\(raised by acme::FirstFactor's reference\)",
}


@pytest.mark.parametrize("exporter", ["eager", "torchscript", "dynamo"])
@pytest.mark.parametrize("where", ["shape-rule", "reference"])
def test_an_exception_of_a_shape_rule_or_reference_names_the_op(tmp_path: Path, exporter: str, where: str) -> None:
    """A rule's or a reference's own IndexError came out as "tuple index out of range" alone, in eager
    calls and in the TorchScript export's message: it now carries a note naming the op and which of its
    functions raised. (dynamo runs a reference without a rule on fake tensors: its own message there.)"""
    op, kwargs = (pad_cols, {"pad": []}) if where == "shape-rule" else (first_factor, {})

    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return op(x, **kwargs)

    x = torch.ones(2, 3)
    if exporter == "eager":
        with pytest.raises(IndexError, match="tuple index out of range") as caught:
            Model()(x)
        assert re.fullmatch(_RAISED_BY[where], " ".join(caught.value.__notes__))
        return
    message = r"(?s)tuple index out of range.*" + _RAISED_BY[where]
    if exporter == "dynamo" and where == "reference":
        message = r"acme::FirstFactor declares no shape rule, and its reference raised IndexError on the fake tensors"
    with pytest.raises(ExportError, match=message):
        opbridge.export(Model(), (x,), tmp_path / "m.onnx", exporter=exporter)


def test_dynamo_keeps_the_forward_parameter_names(tmp_path: Path) -> None:
    """torch.onnx lower-cases them (inputTensor -> inputtensor) unless told; the CLI's --shape and
    --dynamic name them as the forward does."""

    class Camel(torch.nn.Module):
        def forward(self, inputTensor: torch.Tensor, otherInput: torch.Tensor) -> torch.Tensor:
            return scaled_swish(inputTensor) + otherInput

    result = opbridge.export(Camel(), (torch.ones(2), torch.ones(2)), tmp_path / "camel.onnx", exporter="dynamo")
    assert [i.name for i in result.model.graph.input] == ["inputTensor", "otherInput"]


def test_unknown_exporter(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=r"unknown exporter 'onnx'; use 'dynamo' or 'torchscript'"):
        opbridge.export(Swish(), (torch.randn(2),), tmp_path / "x.onnx", exporter="onnx")  # type: ignore[arg-type]


def test_existing_file_kept_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "keep.onnx"
    target.write_bytes(b"user data")

    class Broken(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return scaled_swish(x, beta="wrong")  # type: ignore[arg-type]

    with pytest.raises(ExportError, match=r"attribute 'beta' expects float"):
        opbridge.export(Broken(), (torch.randn(2),), target, exporter="torchscript")
    assert target.read_bytes() == b"user data"


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_dynamic_axes_of_an_unknown_input_are_refused(tmp_path: Path, exporter: str) -> None:
    """A dynamic_axes name that is no input (a typo) gave a fully static model silently."""
    target = tmp_path / "m.onnx"
    with pytest.raises(ExportError, match=r"dynamic_axes names \['nosuch'\].*its inputs are \['x'\]"):
        opbridge.export(
            Swish(),
            (torch.randn(2, 3, 8),),
            target,
            exporter=exporter,
            dynamic_axes={"nosuch": {0: "batch"}},
            output_names=["y"],
        )
    assert not target.exists()


def test_opset_the_exporter_cannot_reach_is_refused(tmp_path: Path) -> None:
    """torch's dynamo exporter falls back to its own opset when it cannot convert: the asked opset
    was silently not the one written."""
    from opbridge.examples.seeds import myselu_model

    model, inputs = myselu_model()
    target = tmp_path / "m.onnx"
    with pytest.raises(ExportError, match=r"opset 99 was asked for, but the dynamo exporter wrote opset \d+"):
        opbridge.export(model, inputs, target, exporter="dynamo", opset_version=99)
    assert not target.exists()


def test_dynamo_renaming_an_output_dim_is_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    x = torch.randn(2, 3)
    with caplog.at_level("WARNING", logger="opbridge.export"):
        result = opbridge.export(
            Swish(),
            (x,),
            tmp_path / "names.onnx",
            exporter="dynamo",
            input_names=["x"],
            output_names=["y"],
            dynamic_axes={"x": {0: "batch"}, "y": {0: "rows"}},
        )
    assert _dims(result.model.graph.output[0])[0] == "batch"
    assert any("output 'y' dim 0 is named 'batch' in the file, not 'rows'" in r.getMessage() for r in caplog.records)


@opbridge.op("tests.export::Positives")
def _positives(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    keep = x > 0
    return torch.nonzero(keep), x[keep]


@_positives.register_shape
def _positives_shape(x: torch.Tensor) -> tuple[opbridge.TensorInfo, opbridge.TensorInfo]:
    n = opbridge.SymDim()
    return opbridge.TensorInfo((n, len(x.shape)), torch.int64), opbridge.TensorInfo((n,), x.dtype)


class _Positives(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return _positives(x)


def test_dynamo_names_data_dependent_output_dims_as_dynamic_axes_asks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The dynamo exporter names a size that depends on the data u0, u1 (one per output, though the rule
    gives both one size): the export warned that it "names an output dim after the input dim it equals" and
    said to use that name; now they take the names asked for, as under TorchScript."""
    x = torch.tensor([[1.0, -2.0, 3.0], [-4.0, 5.0, 6.0]])
    with caplog.at_level("WARNING", logger="opbridge.export"):
        result = opbridge.export(
            _Positives(),
            (x,),
            tmp_path / "positives.onnx",
            exporter="dynamo",
            input_names=["x"],
            output_names=["idx", "vals"],
            dynamic_axes={"x": {0: "b"}, "idx": {0: "n"}, "vals": {0: "n"}},
        )
    assert [_dims(o) for o in result.model.graph.output] == [["n", 2], ["n"]]
    assert not [r for r in caplog.records if "dynamic_axes asks" in r.getMessage()]
    idx, vals = opbridge.InferenceSession(result.path).run(None, {"x": x.numpy()})
    assert idx.tolist() == [[0, 0], [0, 2], [1, 1], [1, 2]] and vals.tolist() == [1.0, 3.0, 5.0, 6.0]


@opbridge.op("tests.export::AddMaybe", shape=lambda x, b, **_: opbridge.TensorInfo(x.shape, x.dtype))
def _add_maybe(x: torch.Tensor, b: torch.Tensor | None = None, k: float = 1.0) -> torch.Tensor:
    return x * k if b is None else x * k + b


class _KeywordInput(torch.nn.Module):
    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return _add_maybe(x, bias, k=2.0)


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("form", ["dynamic_axes", "dynamic_shapes"])
def test_keyword_tensor_inputs_keep_their_names_and_dynamic_dims(tmp_path: Path, exporter: str, form: str) -> None:
    """A tensor passed as a keyword input is a graph input named after the keyword, with the dims that
    dynamic_axes / dynamic_shapes give it (TorchScript named it after the op and kept it static)."""
    x, bias = torch.randn(2, 3), torch.randn(2, 3)
    batch = torch.export.Dim("batch")
    dims = (
        {"dynamic_axes": {"x": {0: "batch"}, "bias": {0: "batch"}}}
        if form == "dynamic_axes"
        else {"dynamic_shapes": {"x": {0: batch}, "bias": {0: batch}}}
    )
    path = tmp_path / "kw.onnx"
    opbridge.export(_KeywordInput(), (x,), path, exporter=exporter, kwargs={"bias": bias}, **dims)
    model = onnx.load(str(path))
    shapes = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    assert shapes == {"x": ["batch", 3], "bias": ["batch", 3]}
    x4, b4 = torch.randn(4, 3), torch.randn(4, 3)
    (y,) = opbridge.InferenceSession(path).run(None, {"x": x4.numpy(), "bias": b4.numpy()})
    np.testing.assert_allclose(y, (x4 * 2 + b4).numpy(), rtol=1e-6, atol=1e-6)


class _TwoKeywords(torch.nn.Module):
    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, bias: torch.Tensor | None = None):
        return _add_maybe(x, mask, k=2.0) - bias


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("form", ["dynamic_axes", "dynamic_shapes"])
def test_keyword_inputs_take_input_names_in_forwards_order(tmp_path: Path, exporter: str, form: str) -> None:
    """kwargs given out of forward's order ({"bias", "mask"}) with input_names for every input: TorchScript
    failed ("5 names for 3 inputs"), dynamo named the bias input "M" (its inputs followed the dict) and
    dropped the axes given by the new names; verify then failed on a correct file."""
    x, mask, bias = torch.randn(3, 4), torch.randn(3, 4), torch.randn(4)
    batch = torch.export.Dim("batch")
    dims = (
        {"dynamic_axes": {"X": {0: "batch"}, "M": {0: "batch"}}}
        if form == "dynamic_axes"
        else {"dynamic_shapes": {"x": {0: batch}, "mask": {0: batch}, "bias": None}}
    )
    path = tmp_path / "kw2.onnx"
    kwargs = {"bias": bias, "mask": mask}
    model = _TwoKeywords()
    opbridge.export(model, (x,), path, exporter=exporter, kwargs=kwargs, input_names=["X", "M", "B"], **dims)
    inputs = {i.name: _dims(i) for i in onnx.load(str(path)).graph.input}
    assert inputs == {"X": ["batch", 4], "M": ["batch", 4], "B": [4]}
    x5, m5 = torch.randn(5, 4), torch.randn(5, 4)
    (y,) = opbridge.InferenceSession(path).run(None, {"X": x5.numpy(), "M": m5.numpy(), "B": bias.numpy()})
    np.testing.assert_allclose(y, model(x5, mask=m5, bias=bias).numpy(), rtol=1e-6, atol=1e-6)
    unnamed = tmp_path / "kw3.onnx"
    opbridge.export(model, (x,), unnamed, exporter=exporter, kwargs=kwargs)
    assert [i.name for i in onnx.load(str(unnamed)).graph.input] == ["x", "mask", "bias"]
    # input_names for some positional inputs only: the others keep forward's names (TorchScript gave the
    # keyword input's name to the second positional input)
    some = opbridge.export(
        model, (x, mask), tmp_path / "kw4.onnx", exporter=exporter, kwargs={"bias": bias}, input_names=["X"]
    )
    assert [i.name for i in some.model.graph.input] == ["X", "mask", "bias"]
    assert opbridge.verify(unnamed, (model, (x, mask, bias)), backends=["onnxruntime"]).exit_code == 0


class _Branching(torch.nn.Module):
    """torch.cond with a custom op in each branch."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(
            x.sum() > 0, lambda t: scaled_swish(t, beta=3.0), lambda t: scaled_swish(t - 1.0, beta=0.5), (x,)
        )


class _Looping(torch.nn.Module):
    """torch.while_loop whose body calls a custom op three times."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def cond_fn(i: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            return i < 3

        def body_fn(i: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return i + 1, scaled_swish(t, beta=2.0)

        from torch._higher_order_ops import while_loop

        return while_loop(cond_fn, body_fn, (torch.tensor(0), x))[1]


@pytest.mark.parametrize("model", [_Branching, _Looping], ids=["torch.cond", "torch.while_loop"])
def test_ops_inside_control_flow_export_and_run_everywhere(tmp_path: Path, model: type[torch.nn.Module]) -> None:
    """A custom op inside torch.cond's branches or torch.while_loop's body is a node of the If or Loop
    body (torch.export traced the call; counting it was a side effect dynamo refused there). ONNX
    Runtime's bridge, the reference evaluator and OpenVINO run it: both branches, every iteration."""
    path = tmp_path / "flow.onnx"
    result = opbridge.export(model(), (torch.randn(2, 3),), path, dynamic_shapes=({0: torch.export.Dim("n")},))
    loaded = onnx.load(str(path))
    assert [n.op_type for n in loaded.graph.node][-1] in ("If", "Loop")
    assert not [n for n in loaded.graph.node if n.domain]  # all in the bodies, which custom_nodes lists
    assert {(n.domain, n.op_type) for n in result.custom_nodes} == {("acme", "ScaledSwish")}
    inputs = [torch.linspace(0.5, 2.0, 12).reshape(4, 3), -torch.linspace(0.5, 2.0, 15).reshape(5, 3)]
    record = opbridge.verify(path, (model(), (inputs[0],)), inputs={"x": inputs[0].numpy()}, shapes=[{"x": (5, 3)}])
    assert record.runs and all(r.status == "pass" for r in record.runs), [(r.backend, r.error) for r in record.runs]
    from opbridge.backends import available_backends

    assert {r.backend for r in record.runs} == set(available_backends())  # OpenVINO's too, where installed
    for x in inputs:  # both directions of the condition, on each backend
        expected = model()(x).numpy()
        for session in (opbridge.InferenceSession(str(path)), opbridge.ReferenceSession(str(path))):
            (got,) = session.run(None, {"x": x.numpy()})
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


class _V2InBranch(torch.nn.Module):
    def __init__(self, outside: bool) -> None:
        super().__init__()
        self.outside = outside

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = act_v1(x) if self.outside else x
        return torch.cond(y.sum() > 0, lambda t: act_v2(t), lambda t: t - 1.0, (y,))


def test_op_versions_inside_control_flow_set_the_domains_version(tmp_path: Path) -> None:
    """A version-2 op called only inside torch.cond's branch imports its domain at version 2 (the call
    count does not see branches; the version came from the highest defined, or from the main graph's
    calls). v1 in the main graph beside v2 in a branch cannot be written: refused, as in one graph."""
    x = torch.ones(2, 3)
    result = opbridge.export(_V2InBranch(False), (x,), tmp_path / "v2.onnx")
    assert {o.domain: o.version for o in result.model.opset_import}["acme.versions"] == 2
    assert [n.op_type for n in result.custom_nodes] == ["Act"]
    sess = opbridge.InferenceSession(result.path)
    np.testing.assert_array_equal(sess.run(None, {"x": x.numpy()})[0], np.full((2, 3), 100.0))
    target = tmp_path / "mixed.onnx"
    with pytest.raises(ExportError, match=r"calls acme.versions::Act v1, but its domain is imported at version 2"):
        opbridge.export(_V2InBranch(True), (x,), target)
    assert not target.exists()


class _ScriptedBranch(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool(x.sum() > 0):
            return torch.ops.opbridge.acme_versions__Act_v2(x)
        return x - 1.0


def test_scripted_code_calling_a_version_2_op_imports_version_2(tmp_path: Path) -> None:
    """TorchScript export of scripted code: its op calls are not counted while tracing; the nodes the
    exporter wrote set the domain's version (it was imported at 1 and ran v1 everywhere)."""
    assert act_v2.torch_op_name == "opbridge::acme_versions__Act_v2"
    x = torch.ones(2, 3)
    result = opbridge.export(torch.jit.script(_ScriptedBranch()), (x,), tmp_path / "s.onnx", exporter="torchscript")
    assert {o.domain: o.version for o in result.model.opset_import}["acme.versions"] == 2
    assert [n.op_type for n in result.custom_nodes] == ["Act"]
    sess = opbridge.InferenceSession(result.path)
    np.testing.assert_array_equal(sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0], np.full((2, 3), 100.0))


class _TracedOp(torch.nn.Module):
    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return _add_maybe(x, bias, k=3.0)


def test_a_traced_module_exports_with_torchscript_and_is_refused_by_name_by_dynamo(tmp_path: Path) -> None:
    """torch.jit.trace's module: both exporters failed inside opbridge ("no signature found for
    <torch.ScriptMethod>"), and torch.export cannot take it at all."""
    x, bias = torch.randn(2, 3), torch.randn(2, 3)
    traced = torch.jit.trace(_TracedOp(), (x, bias))
    result = opbridge.export(traced, (x, bias), tmp_path / "t.onnx", exporter="torchscript")
    assert [i.name for i in result.model.graph.input] == ["x", "bias"]
    assert [n.op_type for n in result.custom_nodes] == ["AddMaybe"]
    (y,) = opbridge.InferenceSession(result.path).run(None, {"x": x.numpy(), "bias": bias.numpy()})
    np.testing.assert_allclose(y, (x * 3 + bias).numpy(), rtol=1e-6, atol=1e-6)
    with pytest.raises(ExportError, match=r"TopLevelTracedModule \(torch.jit.trace or torch.jit.script made it\)"):
        opbridge.export(traced, (x, bias), tmp_path / "d.onnx", exporter="dynamo")
    assert not (tmp_path / "d.onnx").exists()


def test_an_exported_program_keeps_its_input_names_and_torchscript_refuses_it(tmp_path: Path) -> None:
    """opbridge.export(ExportedProgram) named the inputs input0, input1 (torch.onnx keeps x, bias), and the
    TorchScript exporter failed with "No ONNX function found" for the op."""
    x, bias = torch.randn(2, 3), torch.randn(2, 3)
    program = torch.export.export(_TracedOp(), (x, bias))
    result = opbridge.export(program, (x, bias), tmp_path / "p.onnx", exporter="dynamo")
    assert [i.name for i in result.model.graph.input] == ["x", "bias"]
    (y,) = opbridge.InferenceSession(result.path).run(None, {"x": x.numpy(), "bias": bias.numpy()})
    np.testing.assert_allclose(y, (x * 3 + bias).numpy(), rtol=1e-6, atol=1e-6)
    with pytest.raises(ExportError, match=r"ExportedProgram, which the TorchScript exporter cannot take"):
        opbridge.export(program, (x, bias), tmp_path / "t.onnx", exporter="torchscript")


class _MiddleOptional(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, z: torch.Tensor | None = None):
        out = _add_maybe(x, y, k=2.0)
        return out - 10 * z


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_input_names_skip_a_positional_none(tmp_path: Path, exporter: str) -> None:
    """(x, None, z) with input_names X, Y, Z: dynamo named z's input "Y" (names went by position, and None
    has no input); TorchScript failed with an internal assert of torch's."""
    x, z = torch.randn(3, 4), torch.randn(3, 4)
    result = opbridge.export(
        _MiddleOptional(), (x, None, z), tmp_path / "n.onnx", exporter=exporter, input_names=["X", "Y", "Z"]
    )
    assert [i.name for i in result.model.graph.input] == ["X", "Z"]
    (out,) = opbridge.InferenceSession(result.path).run(None, {"X": x.numpy(), "Z": z.numpy()})
    np.testing.assert_allclose(out, (x * 2 - 10 * z).numpy(), rtol=1e-6, atol=1e-5)


class _WithMean(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _add_maybe(x, None, k=2.0) + x.mean()


def test_a_dynamo_down_conversion_the_checker_refuses_names_the_opset_fix(tmp_path: Path) -> None:
    """At opset 17 torch's conversion from 18 leaves ReduceMean's opset 18 attribute: the checker's message
    came alone, naming neither the conversion nor the fix."""
    with pytest.raises(ExportError, match=r"(?s)noop_with_empty_axes.*export at opset_version 18 or later"):
        opbridge.export(_WithMean(), (torch.randn(2, 3),), tmp_path / "m.onnx", exporter="dynamo", opset_version=17)
    assert not (tmp_path / "m.onnx").exists()


def test_control_flow_with_the_torchscript_exporter_names_the_exporter_that_takes_it(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=r"the TorchScript exporter cannot trace; export it with exporter='dynamo'"):
        opbridge.export(_Branching(), (torch.randn(2, 3),), tmp_path / "flow.onnx", exporter="torchscript")


@opbridge.op("tests.export::Gate")
def _gate(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return x * g  # no shape rule: derived from the reference


class _GatedConv(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, image: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return _gate(self.conv(image), gate)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_derived_rule_with_dims_onnx_inference_left_unnamed(tmp_path: Path, exporter: str) -> None:
    """A Conv's output dims come out of ONNX shape inference unnamed (unk__N): a derived rule sizes them
    like the named dims they broadcast against (distinct probe sizes made the reference fail)."""
    torch.manual_seed(0)
    model = _GatedConv().eval()
    x, g = torch.randn(2, 3, 6, 5), torch.randn(2, 4, 6, 5)
    axes = {"image": {0: "batch", 2: "height", 3: "width"}, "gate": {0: "batch", 2: "height", 3: "width"}}
    path = tmp_path / "gated.onnx"
    opbridge.export(model, (x, g), path, exporter=exporter, dynamic_axes=axes)
    x2, g2 = torch.randn(3, 3, 9, 7), torch.randn(3, 4, 9, 7)
    (y,) = opbridge.InferenceSession(path).run(None, {"image": x2.numpy(), "gate": g2.numpy()})
    with torch.no_grad():
        np.testing.assert_allclose(y, model(x2, g2).numpy(), rtol=1e-5, atol=1e-5)


@opbridge.op("tests.export::Branchy")
def _branchy(x: torch.Tensor) -> torch.Tensor:
    return x[:1] * 1


@_branchy.register_shape
def _branchy_shape(x):
    return opbridge.TensorInfo((1 if x.shape[0] > 1 else x.shape[0], x.shape[1]), x.dtype)


class _BranchyModel(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _branchy(x)


def test_a_shape_rule_failing_at_export_names_its_op(tmp_path: Path) -> None:
    """The message named the dim and not the op whose rule branched on it."""
    with pytest.raises(
        opbridge.ExportError,
        match=r"tests.export::Branchy: its shape rule failed for inputs \(bx4 float32\): TypeError: dim b .*cannot branch",
    ):
        opbridge.export(
            _BranchyModel(),
            (torch.randn(3, 4),),
            tmp_path / "b.onnx",
            exporter="torchscript",
            input_names=["x"],
            dynamic_axes={"x": {0: "b"}},
        )
    assert not (tmp_path / "b.onnx").exists()


@opbridge.op("tests.export::AddPair")
def _add_pair(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y


class _AddPairModel(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return _add_pair(x, y)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_inputs_input_names_leaves_unnamed_take_forwards_names(tmp_path: Path, exporter: str) -> None:
    """``input_names=["a"]`` for a model of two inputs: dynamo named the second after forward's parameter,
    the TorchScript exporter after torch's trace (``onnx::...``, or the op that reads it)."""
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    result = opbridge.export(_AddPairModel(), (x, y), tmp_path / "m.onnx", exporter=exporter, input_names=["a"])
    assert [i.name for i in result.model.graph.input] == ["a", "y"]


def test_dims_of_other_names_that_a_rule_less_op_needs_equal(tmp_path: Path) -> None:
    """Each input's batch under a name of its own, broadcast together by an op without a shape rule: its
    derivation gave the two names different sizes, which the reference refused."""
    path = tmp_path / "pair.onnx"
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    opbridge.export(
        _AddPairModel(),
        (x, y),
        path,
        exporter="torchscript",
        input_names=["x", "y"],
        dynamic_axes={"x": {0: "bx"}, "y": {0: "by"}},
    )
    dims = [d.dim_param or d.dim_value for d in onnx.load(str(path)).graph.output[0].type.tensor_type.shape.dim]
    assert dims[1] == 3 and dims[0] not in ("bx", "by", 2)  # the output's batch follows both: no one name
    sess = opbridge.InferenceSession(path)
    a, b = np.ones((4, 3), np.float32), np.full((4, 3), 2, np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": a, "y": b})[0], a + b)


class _StarArgs(torch.nn.Module):
    def forward(self, x: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        return _add_pair(x, rest[0]) * rest[1]


def test_dynamic_axes_reach_the_inputs_a_star_args_forward_takes(tmp_path: Path) -> None:
    """torch.export binds ``*rest``'s inputs as one tuple: dynamic_axes by input name must follow them there."""
    x = torch.randn(2, 3)
    result = opbridge.export(
        _StarArgs(),
        (x, x.clone(), x.clone()),
        tmp_path / "star.onnx",
        exporter="dynamo",
        input_names=["x", "y", "z"],
        dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}, "z": {0: "batch"}},
    )
    assert [(i.name, _dims(i)) for i in result.model.graph.input] == [
        ("x", ["batch", 3]),
        ("y", ["batch", 3]),
        ("z", ["batch", 3]),
    ]
    sess = opbridge.InferenceSession(result.path)
    a, b, c = (np.full((4, 3), v, np.float32) for v in (1.0, 2.0, 3.0))
    np.testing.assert_array_equal(sess.run(None, {"x": a, "y": b, "z": c})[0], (a + b) * c)


class _OptionalMask(torch.nn.Module):
    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, y: torch.Tensor | None = None) -> torch.Tensor:
        out = _add_pair(x, x)
        return out if y is None else out + y


def test_torchscript_inputs_given_as_none_take_no_name(tmp_path: Path) -> None:
    """A None argument is no input of the traced graph: naming it shifted the names (or refused them all)."""
    x = torch.randn(2, 3)
    result = opbridge.export(_OptionalMask(), (x, None, x), tmp_path / "m.onnx", exporter="torchscript")
    assert [i.name for i in result.model.graph.input] == ["x", "y"]


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("form", ["dynamic_axes", "dynamic_shapes"])
@pytest.mark.parametrize("names", [None, ["X", "M", "Y"]], ids=["forwards-names", "input-names"])
def test_dims_named_for_inputs_beside_a_positional_none_keep_their_names(
    tmp_path: Path, exporter: str, form: str, names: list[str] | None
) -> None:
    """(x, None, y) with x's and y's first dim named "batch": dynamo's file named it torch's way, s17
    (torch.onnx pairs the dims' entries with the graph's inputs, and the None argument, no input, made it
    skip the renaming)."""
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    first, last = names[0] if names else "x", names[2] if names else "y"
    batch = torch.export.Dim("batch")
    dims = (
        {"dynamic_axes": {first: {0: "batch"}, last: {0: "batch"}}}
        if form == "dynamic_axes"
        else {"dynamic_shapes": ({0: batch}, None, {0: batch})}
    )
    path = tmp_path / "m.onnx"
    result = opbridge.export(_OptionalMask(), (x, None, y), path, exporter=exporter, input_names=names, **dims)
    assert {i.name: _dims(i) for i in result.model.graph.input} == {first: ["batch", 3], last: ["batch", 3]}
    assert _dims(result.model.graph.output[0]) == ["batch", 3]
    x5, y5 = torch.randn(5, 3), torch.randn(5, 3)
    (out,) = opbridge.InferenceSession(path).run(None, {first: x5.numpy(), last: y5.numpy()})
    np.testing.assert_allclose(out, _OptionalMask()(x5, None, y5).numpy(), rtol=1e-6, atol=1e-6)


class _Static2(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _add_pair(x, x)


def test_dim_hints_and_axes_are_checked_on_both_exporters(tmp_path: Path) -> None:
    from torch.export import Dim

    x = torch.randn(2, 3)
    shapes = ({0: Dim("batch"), 1: Dim.STATIC},)
    for exporter in ("dynamo", "torchscript"):
        result = opbridge.export(
            _Static2(), (x,), tmp_path / f"{exporter}.onnx", exporter=exporter, dynamic_shapes=shapes
        )
        dims = [d.dim_param or d.dim_value for d in result.model.graph.input[0].type.tensor_type.shape.dim]
        assert dims == ["batch", 3], exporter  # Dim.STATIC came out dynamic in TorchScript
    with pytest.raises(ExportError, match=r"dynamic_axes gives input 'x' axis 5, but the example input has 2 dim"):
        opbridge.export(_Static2(), (x,), tmp_path / "a.onnx", dynamic_axes={"x": {5: "b"}})
    for exporter in ("dynamo", "torchscript"):  # (torch.onnx said only "tuple index out of range")
        with pytest.raises(ExportError, match=r"dynamic_shapes gives input 'x' axis 5, but the example input has 2"):
            opbridge.export(_Static2(), (x,), tmp_path / "a.onnx", exporter=exporter, dynamic_shapes=({5: Dim("b")},))
    with pytest.raises(ExportError, match=r"dynamic_axes names \['X'\], which the exported graph has no input"):
        opbridge.export(_Static2(), (x,), tmp_path / "b.onnx", exporter="torchscript", dynamic_axes={"X": {0: "b"}})
    assert not (tmp_path / "b.onnx").exists()


class _FixedBatch(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _add_pair(x, x) + torch.ones(2, 3)


def test_a_dim_that_came_out_static_is_refused_whatever_names_the_inputs_take(tmp_path: Path) -> None:
    from torch.export import Dim

    with pytest.raises(ExportError, match=r"input 'inp' dim 0 \(b\) was asked to be dynamic"):
        opbridge.export(
            _FixedBatch(),
            (torch.randn(2, 3),),
            tmp_path / "m.onnx",
            dynamic_shapes={"x": {0: Dim("b")}},
            input_names=["inp"],
        )


class _Gained(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(3))

    def forward(self, x: torch.Tensor, *, gain: torch.Tensor) -> torch.Tensor:
        return _add_pair(x, x) * gain * self.weight


class _ScaledMask(torch.nn.Module):
    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, *, scale: float = 1.0) -> torch.Tensor:
        return _add_pair(x, mask) * scale


def test_names_and_arguments_the_exporters_cannot_take_are_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    x = torch.randn(2, 3)
    with pytest.raises(ExportError, match=r"keyword-only parameter\(s\) \['gain'\] cannot take"):
        opbridge.export(_Gained(), (x,), tmp_path / "a.onnx", kwargs={"gain": x}, exporter="torchscript")
    with pytest.raises(ExportError, match=r"output_names \['weight'\] are also the names of the model's parameters"):
        opbridge.export(_Gained(), (x,), tmp_path / "b.onnx", kwargs={"gain": x}, output_names=["weight"])
    # (an input named so failed in ONNX shape inference: "differ in rank")
    with pytest.raises(ExportError, match=r"input_names \['weight'\] are also the names .* name the inputs otherwise"):
        opbridge.export(_Gained(), (x,), tmp_path / "b.onnx", kwargs={"gain": x}, input_names=["weight"])
    # a keyword-only parameter kwargs leaves to its default: TorchScript passes it by position too ("takes from
    # 2 to 3 positional arguments but 4 were given")
    with pytest.raises(ExportError, match=r"keyword-only parameter\(s\) \['scale'\] cannot take"):
        opbridge.export(_ScaledMask(), (x,), tmp_path / "a.onnx", kwargs={"mask": x}, exporter="torchscript")
    assert not (tmp_path / "a.onnx").exists() and not (tmp_path / "b.onnx").exists()
    with pytest.raises(ExportError, match=r"writes custom ops from opset 9 on"):
        opbridge.export(_Static2(), (x,), tmp_path / "c.onnx", exporter="torchscript", opset_version=8)
    train = torch.nn.Sequential(torch.nn.Dropout(0.5), _Static2()).train()
    with caplog.at_level(logging.WARNING, logger="opbridge.export"):
        opbridge.export(train, (x,), tmp_path / "d.onnx", exporter="torchscript")
    assert "the TorchScript exporter exports its Dropout as in eval mode" in caplog.text
    assert "export as in training" not in caplog.text  # (torch.onnx's TorchScript exporter traces in eval mode)
    assert [n.op_type for n in onnx.load(str(tmp_path / "d.onnx")).graph.node] == ["AddPair"]


class _Weighted(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(256, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _add_pair(self.lin(x), x)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_a_model_too_large_for_one_message_keeps_its_tensors_in_a_data_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exporter: str
) -> None:
    """A model of 2 GiB or more was serialized in one piece for shape inference and the file, which
    protobuf refuses: it is checked through files and written with its tensors in <name>.data (the
    limit lowered here to run that path on a small model)."""
    import opbridge.model_io as model_io

    monkeypatch.setattr(model_io, "PROTO_LIMIT", 64 * 1024)
    model = _Weighted().eval()
    x = torch.randn(2, 256)
    path = tmp_path / "big.onnx"
    result = opbridge.export(model, (x,), path, exporter=exporter)
    data = tmp_path / "big.onnx.data"
    assert data.stat().st_size >= 256 * 256 * 4 and path.stat().st_size < 64 * 1024
    assert all(t.HasField("raw_data") and not t.external_data for t in result.model.graph.initializer)
    (y,) = opbridge.InferenceSession(path).run(None, {result.model.graph.input[0].name: x.numpy()})
    np.testing.assert_allclose(y, model(x).detach().numpy(), rtol=1e-5, atol=1e-5)
    opbridge.export(model, (x,), path, exporter=exporter)  # again over its own files
    other = tmp_path / "other.onnx"
    (tmp_path / "other.onnx.data").write_bytes(b"someone else's")
    with pytest.raises(opbridge.OutputPathError, match=r"other.onnx.data exists and is not the data file"):
        opbridge.export(model, (x,), other, exporter=exporter)
    assert (tmp_path / "other.onnx.data").read_bytes() == b"someone else's" and not other.exists()


def test_exports_from_two_threads_both_succeed_and_leave_the_warning_state(tmp_path: Path) -> None:
    """torch's exporters keep global state: two exports at once failed ("slot already occupied",
    "in_onnx_export must be True"), and the warning filters they swap were left behind."""
    import threading
    import warnings

    filters = list(warnings.filters)
    errors: list[BaseException] = []

    def export(i: int) -> None:
        try:
            opbridge.export(_Static2(), (torch.randn(2, 3),), tmp_path / f"m{i}.onnx")
        except BaseException as exc:  # recorded: the test's verdict
            errors.append(exc)

    threads = [threading.Thread(target=export, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and all((tmp_path / f"m{i}.onnx").is_file() for i in range(2))
    assert warnings.filters == filters


class _ReturnsInputTwice(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return x, x, x * 2


def test_a_model_returning_its_input_twice_exports_single_assignment(tmp_path: Path) -> None:
    """torch.onnx's dynamo exporter wrote ``Identity(x) -> x`` beside the input ``x``, which the checker
    refuses (not single static assignment): the export failed."""
    import onnxruntime as ort

    path = tmp_path / "twice.onnx"
    x = torch.randn(2, 3)
    opbridge.export(_ReturnsInputTwice(), (x,), path, exporter="dynamo")
    model = onnx.load(str(path))
    names = [o.name for o in model.graph.output]
    assert len(set(names)) == 3 and names[0] == "x"
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})
    np.testing.assert_array_equal(got[0], x.numpy())
    np.testing.assert_array_equal(got[1], x.numpy())
    np.testing.assert_allclose(got[2], 2 * x.numpy(), rtol=0, atol=0)


class _ReturnsOpResultTwice(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = scaled_swish(x, beta=2.0)
        return y, y


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("model", [_ReturnsOpResultTwice, _ReturnsInputTwice], ids=["op-result-twice", "input-twice"])
def test_a_value_returned_twice_is_an_output_of_its_own_each_time(
    tmp_path: Path, exporter: str, model: type[torch.nn.Module]
) -> None:
    """``return y, y``: the TorchScript exporter listed one value twice among the graph's outputs, under one
    name; both exporters now give the repeat a name of its own, ``<name>_alias_1``, as dynamo did."""
    x = torch.randn(2, 3)
    path = tmp_path / "twice.onnx"
    opbridge.export(model(), (x,), path, exporter=exporter)
    written = onnx.load(str(path))
    names = [o.name for o in written.graph.output]
    assert len(set(names)) == len(names) and names[1] == f"{names[0]}_alias_1"
    opbridge.register_onnx_schemas()
    onnx.checker.check_model(written, full_check=True)
    got = opbridge.InferenceSession(path).run(None, {written.graph.input[0].name: x.numpy()})
    expected = model()(x)
    assert len(got) == len(expected)
    for value, wanted in zip(got, expected):
        np.testing.assert_allclose(value, wanted.numpy(), rtol=1e-6, atol=1e-6)


def test_a_dynamo_export_without_onnxscript_names_the_fix(tmp_path: Path, monkeypatch) -> None:
    """torch.onnx's dynamo exporter writes its graph with onnxscript; without it the export said only
    "No module named 'onnxscript'"."""

    def missing(*args: Any, **kwargs: Any) -> None:
        raise ModuleNotFoundError("No module named 'onnxscript'", name="onnxscript")

    monkeypatch.setattr(torch.onnx, "export", missing)
    with pytest.raises(
        ExportError, match=r"needs onnxscript .* pip install 'onnxscript>=0.6', or export with exporter="
    ):
        opbridge.export(_ReturnsInputTwice(), (torch.randn(2, 3),), tmp_path / "m.onnx", exporter="dynamo")


@opbridge.op("tests.export::PlusFixed")
def _plus_fixed(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x + w  # no shape rule: derived from the reference


class _PlusFixedWeight(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1, 3, 4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _plus_fixed(x, self.w)


def test_a_dim_the_model_fixes_is_named_as_one_that_cannot_be_dynamic(tmp_path: Path) -> None:
    """A dim marked dynamic that meets a weight of one size asked only for a shape rule, which then gave a
    model that failed at every other size: the message now says the dim cannot be dynamic."""
    with pytest.raises(ExportError, match=r"declares no shape rule.*that dim cannot be dynamic: export it static"):
        opbridge.export(
            _PlusFixedWeight(),
            (torch.ones(2, 3, 4, 4),),
            tmp_path / "fixed.onnx",
            exporter="torchscript",
            input_names=["x"],
            dynamic_axes={"x": {2: "h"}},
        )


@opbridge.op("tests.export::AddOne")
def _add_one(x: torch.Tensor) -> torch.Tensor:
    return x + 1


def test_one_tensor_given_for_two_inputs_exports_two_inputs(tmp_path: Path) -> None:
    """torch.export makes tensors that alias one graph input: with ``(x, x)`` as the example, the custom
    op read the model's second input, silently. The examples are given as copies of their own."""

    class TwoInputs(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return _add_one(x) * 2 + y.sum()

    x = torch.randn(2, 3)
    result = opbridge.export(TwoInputs(), (x, x), tmp_path / "two.onnx", exporter="dynamo")
    (custom,) = result.custom_nodes
    assert list(custom.input) == [result.model.graph.input[0].name]
    a, b = torch.randn(2, 3), torch.randn(2, 3)
    names = [i.name for i in result.model.graph.input]
    (got,) = opbridge.ReferenceSession(result.model).run(None, dict(zip(names, (a.numpy(), b.numpy()))))
    torch.testing.assert_close(torch.from_numpy(got), TwoInputs()(a, b), rtol=1e-6, atol=1e-6)


@opbridge.op("tests.export::FilterRows")
def _filter_rows(x: torch.Tensor) -> torch.Tensor:
    return x[x[:, 0] > 0]


@_filter_rows.register_shape
def _(x: Any) -> opbridge.TensorInfo:
    return opbridge.TensorInfo((opbridge.SymDim("n"), x.shape[1]), x.dtype)  # "n": the input's dim name


def test_a_size_the_rule_makes_never_takes_an_input_dims_name(tmp_path: Path) -> None:
    """A SymDim a rule makes is a size that depends on the data (torch gets a fresh one); named like the
    input's dynamic dim, ONNX inference wrote that name, claiming the output has as many rows."""

    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return _filter_rows(x) * 2

    path = tmp_path / "filter.onnx"
    opbridge.export(
        Model(), (torch.randn(8, 4),), path, exporter="torchscript", input_names=["x"], dynamic_axes={"x": {0: "n"}}
    )
    graph = onnx.load(str(path)).graph
    rows = graph.output[0].type.tensor_type.shape.dim[0]
    assert [d.dim_param for d in graph.input[0].type.tensor_type.shape.dim][0] == "n"
    assert rows.dim_param != "n" and not rows.HasField("dim_value")


@opbridge.op("tests.export::PositiveAt")
def _positive_at(x: torch.Tensor) -> torch.Tensor:
    return (x > 0).nonzero()  # as many rows as the data has positive values: no rule says so


def test_a_data_dependent_size_without_a_rule_asks_for_one_and_no_static_export(tmp_path: Path) -> None:
    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return _positive_at(x)

    with pytest.raises(ExportError, match=r"register_shape \(an output size that depends on the data") as caught:
        opbridge.export(
            Model(),
            (torch.randn(6, 3),),
            tmp_path / "at.onnx",
            exporter="torchscript",
            input_names=["x"],
            dynamic_axes={"x": {0: "n"}},
        )
    assert "export it static" not in str(caught.value)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_one_dim_name_for_inputs_of_two_sizes_is_refused(tmp_path: Path, exporter: str) -> None:
    """TorchScript wrote both axes as one named dim that the example gives two sizes (verify then ran
    inputs the file declares equal at different sizes); dynamo refused."""

    class Cat(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.cat([scaled_swish(x), y])

    target = tmp_path / "m.onnx"
    with pytest.raises(ExportError, match=r"input 'y' axis 0 and input 'x' axis 0 both 'b', one dim, but the exa"):
        opbridge.export(
            Cat(),
            (torch.randn(2, 4), torch.randn(3, 4)),
            target,
            exporter=exporter,
            dynamic_axes={"x": {0: "b"}, "y": {0: "b"}},
        )
    assert not target.exists()


def test_negative_dynamic_axes_are_counted_from_the_end_on_torchscript(tmp_path: Path) -> None:
    """A negative axis reached torch's TorchScript exporter, which aborted the process (heap corruption):
    run in a process of its own, both forms of dynamic dims."""
    out = run_script(
        tmp_path,
        f"""
        import torch, opbridge
        from torch.export import Dim

        @opbridge.op("neg.axes::Twice")
        def twice(x: torch.Tensor) -> torch.Tensor:
            return x * 2

        class M(torch.nn.Module):
            def forward(self, x):
                return twice(x)

        if __name__ == "__main__":
            x = torch.randn(2, 3, 4)
            forms = {{"axes": {{"dynamic_axes": {{"x": {{-1: "w"}}}}}}, "shapes": {{"dynamic_shapes": ({{-1: Dim("w")}},)}}}}
            for form, kw in forms.items():
                r = opbridge.export(M(), (x,), {str(tmp_path)!r} + f"/{{form}}.onnx", exporter="torchscript", **kw)
                print(form, [d.dim_param or d.dim_value for d in r.model.graph.input[0].type.tensor_type.shape.dim])
        """,
    )
    assert out.split("\n")[:2] == ["axes [2, 3, 'w']", "shapes [2, 3, 'w']"]


def test_arguments_of_the_wrong_type_or_names_given_twice_are_named_before_export(tmp_path: Path) -> None:
    x = torch.randn(2, 3)
    target = tmp_path / "m.onnx"

    def build() -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
        return _Static2(), (x,)

    refused: list[tuple[dict[str, Any], str]] = [
        ({"dynamic_axes": {"x": "batch"}}, r"dynamic_axes\['x'\] is 'batch'; give \{axis: dim name\}"),
        ({"dynamic_axes": ["x"]}, r"dynamic_axes is a list; give a dict"),
        ({"kwargs": [x]}, r"kwargs is a list; give a dict"),
        ({"opset_version": "17"}, r"opset_version is '17' \(a str\); give an int"),
        ({"input_names": ["a", "a"]}, r"input_names \['a', 'a'\] gives \['a'\] more than once"),
        ({"output_names": ["y", "y"]}, r"output_names \['y', 'y'\] gives \['y'\] more than once"),
        ({"input_names": ["x"], "output_names": ["x"]}, r"\['x'\] are both in input_names and in output_names"),
        ({"output_names": [1]}, r"output_names is \[1\]: give a list of non-empty strings, one per graph output"),
        ({"input_names": [""]}, r"input_names is \[''\]: give a list of non-empty strings, one per graph input"),
        ({"output_names": ["y"], "dynamic_axes": {"y": {-1: "w"}}}, r"gives 'y' axis -1, a negative axis"),
    ]
    for kw, message in refused:
        with pytest.raises(ExportError, match=message):
            opbridge.export(_Static2(), (x,), target, exporter="torchscript", **kw)
    with pytest.raises(ExportError, match=r"model build\(\) is no torch.nn.Module and cannot take the example"):
        opbridge.export(build, (x,), target)  # type: ignore[arg-type]
    with pytest.raises(ExportError, match=r"model is the class _Static2; give the torch.nn.Module instance"):
        opbridge.export(_Static2, (x,), target)  # type: ignore[arg-type]

    def doubled(t: torch.Tensor) -> torch.Tensor:
        return t * 2

    for exporter in ("dynamo", "torchscript"):  # (TorchScript: "'function' object has no attribute 'modules'")
        with pytest.raises(ExportError, match=r"model doubled is a Python function, which torch.onnx does not"):
            opbridge.export(doubled, (x,), target, exporter=exporter)  # type: ignore[arg-type]
    with pytest.raises(ExportError, match=r"output_names \['a', 'b'\] name 2 outputs, and the model returns 1"):
        opbridge.export(_Static2(), (x,), target, exporter="dynamo", output_names=["a", "b"])
    assert not target.exists()


@opbridge.op("tests.export::Same")
def _same(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


class _Same(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _same(x)


def test_unsigned_dtypes_export_with_dynamo_and_torchscript_names_the_fix(tmp_path: Path) -> None:
    """uint16 read as having no torch equivalent; TorchScript cannot write it and said only its ScalarType."""
    x = torch.tensor([[1, 60000, 3]], dtype=torch.uint16)
    result = opbridge.export(_Same(), (x,), tmp_path / "u16.onnx", exporter="dynamo")
    assert result.model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.UINT16
    assert result.model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.UINT16
    (got,) = opbridge.ReferenceSession(result.model).run(None, {"x": x.numpy()})
    np.testing.assert_array_equal(got, x.numpy())
    with pytest.raises(ExportError, match=r"cannot write tensors of dtype uint16 \(input\(s\) \['x'\]\): cast"):
        opbridge.export(_Same(), (x,), tmp_path / "ts.onnx", exporter="torchscript")


@opbridge.op("tests.export::HalvedTo64", shape=lambda x: opbridge.TensorInfo(x.shape, x.dtype))
def _halved_to_64(x: torch.Tensor) -> torch.Tensor:
    return x.double() * 0.5


class _HalvedTo64(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _halved_to_64(x)


def test_a_rule_contradicting_the_reference_and_float8_are_named_at_dynamo_export(tmp_path: Path) -> None:
    """Fake tensors take the rule's dtype: the file said float32 for a float64 reference (and ONNX Runtime
    then blamed a kernel); float8 failed as a bare 'unsupported type' of shape inference."""
    target = tmp_path / "m.onnx"
    with pytest.raises(
        ExportError, match=r"the shape rule declares output 0 \('output'\) as \[2, 3\] torch\.float32, but"
    ) as err:
        opbridge.export(_HalvedTo64(), (torch.randn(2, 3),), target, exporter="dynamo")
    assert "(@HalvedTo64.register_shape)" in str(err.value)
    x = torch.randn(2, 3).to(torch.float8_e4m3fn)
    with pytest.raises(
        ExportError, match=r"opbridge ops take no float8e4m3fn tensors \(Same is given or returns one\)"
    ):
        opbridge.export(_Same(), (x,), target, exporter="dynamo")
    assert not target.exists()


class _TrainingHalvedTo64(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.BatchNorm1d(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _halved_to_64(self.norm(x))


@opbridge.op("tests.export::AddsInPlace")
def _adds_in_place(x: torch.Tensor) -> torch.Tensor:
    return x.add_(1)  # (no shape rule)


class _AddsInPlace(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _adds_in_place(x * 1)


def test_the_eager_check_covers_models_in_training_mode_and_ops_without_rules(tmp_path: Path) -> None:
    """The eager call that checks each op against its reference after a dynamo export was skipped for a model
    in training mode (its rule contradicting the reference then reached the file) and where no used op had a
    shape rule (a reference writing its input in place was exported, and every runtime then failed)."""
    target = tmp_path / "m.onnx"
    model = _TrainingHalvedTo64().train()
    with pytest.raises(ExportError, match=r"the shape rule declares output 0 \('output'\) as \[4, 3\] torch\.float32"):
        opbridge.export(model, (torch.randn(4, 3),), target, exporter="dynamo")
    assert model.training and model.norm.training  # (the check ran on an eval copy)
    with pytest.raises(ExportError, match=r"tests.export::AddsInPlace: the reference changed its input 'x' in place"):
        opbridge.export(_AddsInPlace(), (torch.randn(2, 3),), target, exporter="dynamo")
    assert not target.exists()


@opbridge.op("tests.export::RuledBadly")
def _ruled_badly(x: torch.Tensor, case: int = 0) -> torch.Tensor:
    return x + 1


@_ruled_badly.register_shape
def _ruled_badly_rule(x: Any, case: int) -> opbridge.TensorInfo:
    if case == 0:
        return opbridge.TensorInfo(x.shape, np.float32)  # a numpy dtype
    return opbridge.TensorInfo((x.shape[0], -1), x.dtype)  # a negative dim


class _RuledBadly(torch.nn.Module):
    def __init__(self, case: int) -> None:
        super().__init__()
        self.case = case

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ruled_badly(x, case=self.case)


@pytest.mark.parametrize(
    ("case", "message"),
    [(0, r"gives output 0 the dtype <class 'numpy.float32'>"), (1, r"gives output 0 dim 1 as -1; a dim is an int")],
    ids=["numpy-dtype", "negative-dim"],
)
def test_a_rule_giving_fake_tracing_no_dtype_or_size_is_named_at_dynamo_export(
    tmp_path: Path, case: int, message: str
) -> None:
    """Under dynamo export (and torch.compile) the rule's outputs went to torch.empty unchecked: torch's
    TypeError, behind torch.onnx's "create an issue" text, named neither the op nor the rule."""
    with pytest.raises(ExportError) as err:
        opbridge.export(_RuledBadly(case), (torch.randn(2, 3),), tmp_path / "m.onnx", exporter="dynamo")
    assert re.match(
        rf"dynamo export of _RuledBadly failed: tests.export::RuledBadly: the shape rule {message}", str(err.value)
    )


@opbridge.op("tests.export::Halved", shape=lambda x: opbridge.TensorInfo(x.shape, x.dtype))
def _halved(x: torch.Tensor) -> torch.Tensor:
    return x * 0.5


class _CountingHalved(torch.nn.Module):
    """A model whose forward writes its buffer and its input (the eager check must touch neither), and
    records where its weight's data lies on each eager call."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))
        self.weight = torch.nn.Parameter(torch.ones(3))
        self.weights_at: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        x.add_(1)
        if type(x) is torch.Tensor:  # (not a fake tensor of the trace)
            self.weights_at.append(self.weight.data_ptr())
        return _halved(x) * self.weight


def test_the_eager_rule_check_after_dynamo_export_changes_nothing_of_the_callers(tmp_path: Path) -> None:
    """The shape rules are checked by calling the model after a dynamo export: on the model and inputs
    themselves, a buffer the forward writes was counted and the example input written."""
    model, x = _CountingHalved().eval(), torch.ones(2, 3)
    copies: list[_CountingHalved] = []
    real_deepcopy = copy.deepcopy

    def recording_deepcopy(value: Any, memo: Any = None) -> Any:
        result = real_deepcopy(value, memo)
        if isinstance(value, tuple) and value and value[0] is model:
            copies.append(result[0])
        return result

    with mock.patch.object(copy, "deepcopy", recording_deepcopy):
        opbridge.export(model, (x,), tmp_path / "m.onnx", exporter="dynamo")
    assert float(model.calls) == 0.0
    assert torch.equal(x, torch.ones(2, 3))
    # the copy called shares the model's weights (they were held twice)
    (called,) = copies
    assert called.weights_at == [model.weight.data_ptr()]


def test_a_model_and_its_data_file_are_replaced_together_or_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The data file was renamed into place before the model file was written: a full disk at the model
    left the old model reading the new data file (its tensors swapped, no error). Both are now whole
    before either replaces what is there."""
    import errno
    import os

    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from opbridge.model_io import save_with_data_file

    def model(value: float) -> onnx.ModelProto:
        weight = numpy_helper.from_array(np.full(1024, value, np.float32), "w")
        graph = helper.make_graph(
            [helper.make_node("Add", ["x", "w"], ["y"])],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1024])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1024])],
            [weight],
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    path = tmp_path / "m.onnx"
    save_with_data_file(model(1.0), path, data_name="m.onnx.data")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    class FullDisk:  # the second file opened (the model's) cannot be written
        def __init__(self, fh: Any) -> None:
            self.fh = fh

        def __enter__(self) -> FullDisk:
            return self

        def __exit__(self, *exc: object) -> None:
            self.fh.close()

        def write(self, data: bytes) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

    opened: list[Any] = []
    real = os.fdopen

    def fdopen(fd: int, mode: str) -> Any:
        opened.append(real(fd, mode))
        return FullDisk(opened[-1]) if len(opened) == 2 else opened[-1]

    monkeypatch.setattr(os, "fdopen", fdopen)
    with pytest.raises(OSError, match="No space left"):
        save_with_data_file(model(2.0), path, data_name="m.onnx.data")
    monkeypatch.undo()
    assert len(opened) == 2
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no temporary file left either
    loaded = onnx.load(path)
    np.testing.assert_array_equal(numpy_helper.to_array(loaded.graph.initializer[0]), np.full(1024, 1.0, np.float32))


def test_a_command_that_runs_out_of_room_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """A full disk while writing blamed the input ("m.onnx is not a valid ONNX model ... Fix the model")."""
    import errno
    import os

    import onnx
    from onnx import TensorProto, helper

    from opbridge.cli import main

    graph = helper.make_graph(
        [helper.make_node("MYSELU", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    source = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), source)
    real = os.fdopen

    def full(fd: int, mode: str) -> Any:
        real(fd, mode).close()
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fdopen", full)
    code = main(["rewrite", str(source), "-o", str(tmp_path / "out.onnx"), "--rule", "legacy-domain"])
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert code == 2
    assert "error: No space left on device writing the output; an output file is replaced whole" in err, err
    assert "any file it would replace is unchanged" in err
    assert "not a valid ONNX model" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux) to fill standard output")
def test_cli_standard_output_full_is_named(tmp_path: Path) -> None:
    """``opbridge lint m.onnx > /dev/full``: the error says the output could not be written, without
    claiming files that lint never writes."""
    import subprocess
    import sys

    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    onnx.save(helper.make_model(graph), tmp_path / "m.onnx")
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "opbridge", "lint", str(tmp_path / "m.onnx")],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    assert done.returncode == 2, done.stderr
    assert "No space left on device writing the output" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("length", [32, None], ids=["length-short", "file-short"])
def test_external_data_shorter_than_its_dims_is_named_at_load(tmp_path: Path, length: int | None) -> None:
    """An external tensor whose data is not the size of its dims loaded; lint passed it and ONNX Runtime
    failed later with "Deserialize tensor W failed"."""
    import onnx
    from onnx import TensorProto, helper

    from opbridge.model_io import load_model

    weight = onnx.TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[16])
    weight.data_location = TensorProto.EXTERNAL
    entries = {"location": "w.bin", "offset": "32" if length is None else "0"}
    if length is not None:
        entries["length"] = str(length)
    for key, value in entries.items():
        entry = weight.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "W"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16])],
        [weight],
    )
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    np.arange(16, dtype=np.float32).tofile(tmp_path / "w.bin")
    message = r"tensor 'W' is 16 float \(64 bytes\), but its external data holds 32 bytes"
    for external_data in (True, 1 << 20):  # (every tensor read; only the small ones, as lint reads them)
        with pytest.raises(opbridge.ModelLoadError, match=message):
            load_model(path, external_data=external_data)
    with pytest.raises(opbridge.ModelLoadError, match=message):
        opbridge.InferenceSession(path)


@pytest.mark.parametrize(("dtype", "count", "nbytes"), [("FLOAT6E2M3", 1024, 768), ("INT4", 5, 3), ("UINT2", 9, 3)])
def test_external_data_of_types_below_a_byte_is_sized_packed(
    tmp_path: Path, dtype: str, count: int, nbytes: int
) -> None:
    """float6 external data (1024 elements in 768 bytes) was refused at load as not the size of its dims; a
    packed type's data that is short was not checked at all."""
    import onnx
    from onnx import TensorProto, helper

    from opbridge.model_io import load_model

    weight = TensorProto(
        name="w", data_type=getattr(TensorProto, dtype), dims=[count], raw_data=bytes(i % 251 for i in range(nbytes))
    )
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 25)])
    path = tmp_path / "m.onnx"
    onnx.save(model, path, save_as_external_data=True, location="m.data", size_threshold=0)
    assert (tmp_path / "m.data").stat().st_size == nbytes
    assert load_model(path).graph.initializer[0].raw_data == weight.raw_data
    saved = onnx.load(path, load_external_data=False)
    entry = next(e for e in saved.graph.initializer[0].external_data if e.key == "length")
    entry.value = str(nbytes - 1)
    onnx.save(saved, path)
    with pytest.raises(opbridge.ModelLoadError, match=rf"tensor 'w' is {count} {dtype.lower()} \({nbytes} bytes\)"):
        load_model(path)


def test_an_output_path_that_is_a_symbolic_link_loop_is_refused(tmp_path: Path) -> None:
    """A link that loops was replaced by a regular file, where open() would fail; a link to a file not
    written yet is still written through."""
    from opbridge._files import prepare_output

    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(opbridge.OutputPathError, match=r"a is a symbolic link that cannot be followed"):
        prepare_output(tmp_path / "a")
    (tmp_path / "later").symlink_to(tmp_path / "model.onnx")
    assert prepare_output(tmp_path / "later") == tmp_path / "model.onnx"
    assert (tmp_path / "a").is_symlink() and (tmp_path / "b").is_symlink()


def test_only_protected_models_are_read_for_their_data_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An output that exists is checked against the protected files' external data files: every protected
    file was parsed as a model for that, the model's data files too (gigabytes read for a name check)."""
    from onnx import numpy_helper

    import opbridge.model_io as model_io
    from opbridge._files import prepare_output

    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Add", ["x", "w"], ["y"])],
        "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4])],
        [numpy_helper.from_array(np.zeros(4, np.float32), "w")],
    )
    model, data = tmp_path / "m.onnx", tmp_path / "w.bin"
    onnx.save(onnx.helper.make_model(graph), str(model), save_as_external_data=True, location="w.bin", size_threshold=0)
    read: list[Path] = []
    real = model_io.external_files
    monkeypatch.setattr(
        model_io, "external_files", lambda source, proto=None: read.append(source) or real(source, proto)
    )
    target = tmp_path / "out.onnx"
    target.write_bytes(b"old")
    assert prepare_output(target, protected=[model, data]) == target
    assert read == [model]
    with pytest.raises(opbridge.OutputPathError, match=r"w.bin is one of the input's own files"):
        prepare_output(data, protected=[model])


@opbridge.op("tests.export::Noise")
def _noise(x: torch.Tensor, p: float = 0.1) -> torch.Tensor:
    return x + p * torch.randn_like(x)


@opbridge.op("tests.export::Signed")
def _signed(x: torch.Tensor, k: float = 0.0) -> torch.Tensor:
    return x + math.copysign(1.0, k)


class _RepeatedCalls(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return _noise(x), _noise(x), _signed(x, k=0.0), _signed(x, k=-0.0)


def test_dynamo_keeps_each_call_of_an_op_a_node_of_its_own(tmp_path: Path) -> None:
    """torch.onnx's optimizer merged two calls of an op on one input (as if pure): an op drawing random
    numbers gave both outputs one draw, and attributes 0.0 and -0.0 (equal as floats) became one node."""
    x = torch.zeros(2, 3)
    result = opbridge.export(_RepeatedCalls(), (x,), tmp_path / "m.onnx", exporter="dynamo")
    nodes = [n for n in result.model.graph.node if n.domain == "tests.export"]
    assert [n.op_type for n in nodes] == ["Noise", "Noise", "Signed", "Signed"]
    assert all(n.overload == "" for n in result.model.graph.node)
    signs = [math.copysign(1.0, onnx.helper.get_attribute_value(n.attribute[0])) for n in nodes[2:]]
    assert signs == [1.0, -1.0]
    first, second, plus, minus = opbridge.InferenceSession(result.path).run(None, {"x": x.numpy()})
    assert not np.array_equal(first, second)
    np.testing.assert_array_equal(plus, np.ones((2, 3), np.float32))
    np.testing.assert_array_equal(minus, -np.ones((2, 3), np.float32))


class _SignedPair(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _scaled(x, k=0.0) + _scaled(x, k=-0.0)


@opbridge.op("tests.export::Scaled")
def _scaled(x: torch.Tensor, k: float = 1.0) -> torch.Tensor:
    return x * k + 1


def test_torchscript_calls_that_differ_only_in_a_zeros_sign_may_become_one_node(tmp_path: Path) -> None:
    """The TorchScript exporter writes -0.0 as 0.0 (the README says so), which makes two calls differing
    only there equal, and it merges them: that was called "a call was dropped or folded into a constant"."""
    x = torch.randn(2, 3)
    result = opbridge.export(_SignedPair(), (x,), tmp_path / "m.onnx", exporter="torchscript", input_names=["x"])
    nodes = [n for n in result.model.graph.node if n.domain == "tests.export"]
    assert [onnx.helper.get_attribute_value(a) for n in nodes for a in n.attribute] == [0.0]
    (out,) = opbridge.InferenceSession(result.path).run(None, {"x": x.numpy()})
    np.testing.assert_array_equal(out, _SignedPair()(x).numpy())


class _OneCallTwoInputs(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return _scaled(x, k=2.0) + y


def test_a_call_traced_by_a_capture_torch_onnx_retried_is_not_counted(tmp_path: Path) -> None:
    """Two Dims that the model makes equal fail torch.export's first capture, and torch.onnx traces again
    with refined shapes: the failed capture's call was counted too, and the export said "1 node(s) for the
    2 calls traced: a call was dropped". Only the capture that made the graph counts."""
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    shapes = ({0: torch.export.Dim("a")}, {0: torch.export.Dim("b")})
    result = opbridge.export(_OneCallTwoInputs(), (x, y), tmp_path / "m.onnx", dynamic_shapes=shapes)
    assert [n.op_type for n in result.model.graph.node if n.domain == "tests.export"] == ["Scaled"]
    feed = {"x": np.ones((4, 3), np.float32), "y": np.ones((4, 3), np.float32)}
    (out,) = opbridge.InferenceSession(result.path).run(None, feed)
    np.testing.assert_array_equal(out, np.full((4, 3), 4.0, np.float32))


@opbridge.op("tests.export::TopUpTo")  # (no shape rule: derived from the reference)
def _top_up_to(x: torch.Tensor, k: int = 16) -> torch.Tensor:
    return x.topk(min(k, x.shape[0])).values


@opbridge.op("tests.export::TopUpToRuled")
def _top_up_to_ruled(x: torch.Tensor, k: int = 16) -> torch.Tensor:
    return x.topk(min(k, x.shape[0])).values


@_top_up_to_ruled.register_shape
def _top_up_to_rule(x: Any, k: int) -> opbridge.TensorInfo:
    return opbridge.TensorInfo((opbridge.SymDim(),), x.dtype)  # (min(k, n): no arithmetic of n)


class _TopFour(torch.nn.Module):
    def __init__(self, ruled: bool) -> None:
        super().__init__()
        self.ruled = ruled

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (_top_up_to_ruled if self.ruled else _top_up_to)(x, k=4)


def test_an_output_size_torch_export_fixed_while_tracing_is_refused(tmp_path: Path) -> None:
    """``min(k, x.shape[0])`` on a dynamic dim takes the example's branch under torch.export, which guards
    nothing: the file declared the output 4 long for every n, ONNX Runtime gave 3 at n = 3, and runtimes that
    trust the declaration size it wrong. With the size declared as a SymDim the export is right."""
    x = torch.randn(10)
    shapes = ({0: torch.export.Dim("n", min=2)},)
    target = tmp_path / "m.onnx"
    with pytest.raises(ExportError, match=r"TopUpTo declares no shape rule, and the exported file gives its output 0"):
        opbridge.export(_TopFour(False), (x,), target, exporter="dynamo", dynamic_shapes=shapes)
    assert not target.exists()
    result = opbridge.export(_TopFour(True), (x,), target, exporter="dynamo", dynamic_shapes=shapes)
    (dim,) = result.model.graph.output[0].type.tensor_type.shape.dim
    assert not dim.HasField("dim_value")
    for n in (3, 10):
        (got,) = opbridge.InferenceSession(result.path).run(None, {"x": np.arange(n, dtype=np.float32)})
        np.testing.assert_array_equal(got, np.arange(n, dtype=np.float32)[::-1][: min(4, n)])


class _TopFourInCond(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda t: _top_up_to(t, k=4), lambda t: _top_up_to(t, k=4) * 2, (x,))


@pytest.mark.parametrize(
    ("module", "n", "size"),
    [
        # n = 3 < k: the file named the output dim after n, wrong for every n > 4
        (_TopFour(False), 3, r"dim 0 the size of the input dim 'n', which it equals at the sizes torch.export traced"),
        # inside a torch.cond branch (an If's body), which the check did not look into
        (_TopFourInCond(), 10, r"dim 0 the size 4, which torch.export fixed while tracing"),
    ],
    ids=["named-after-an-input-dim", "inside-cond"],
)
def test_an_output_size_that_follows_the_example_is_refused(
    module: torch.nn.Module, n: int, size: str, tmp_path: Path
) -> None:
    target = tmp_path / "m.onnx"
    with pytest.raises(ExportError, match=rf"TopUpTo declares no shape rule, .*{size}, but its reference"):
        opbridge.export(module, (torch.randn(n),), target, dynamic_shapes=({0: torch.export.Dim("n", min=2)},))
    assert not target.exists()


def test_an_output_size_fixed_inside_the_dims_bounds_is_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With ``Dim("n", min=8)``, min(4, n) is 4 at every size the bounds allow: the probes below them are no
    proof, and the export stands, with a warning (the file's dims carry no bounds)."""
    x = torch.randn(10)
    with caplog.at_level("WARNING", logger="opbridge.export"):
        result = opbridge.export(
            _TopFour(False),
            (x,),
            tmp_path / "m.onnx",
            exporter="dynamo",
            dynamic_shapes=({0: torch.export.Dim("n", min=8)},),
        )
    assert any(
        "TopUpTo declares no shape rule" in r.getMessage() and "bounds may exclude" in r.getMessage()
        for r in caplog.records
    )
    (got,) = opbridge.InferenceSession(result.path).run(None, {"x": np.arange(8, dtype=np.float32)})
    np.testing.assert_array_equal(got, [7.0, 6.0, 5.0, 4.0])


class _KeywordSizeAsAttribute(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        assert y is not None
        return x.sum() + repeat_rows(y, n=y.shape[0])


class _AfterNoneSizeAsAttribute(torch.nn.Module):
    def forward(self, x: torch.Tensor, m: torch.Tensor | None = None, y: torch.Tensor | None = None) -> torch.Tensor:
        assert y is not None
        return x.sum() + repeat_rows(y, n=y.shape[0])


class _DictSizeAsAttribute(torch.nn.Module):
    def forward(self, d: dict[str, torch.Tensor]) -> torch.Tensor:
        return d["b"].sum() + repeat_rows(d["a"], n=d["a"].shape[0])


def test_a_dynamic_dim_of_a_keyword_or_dict_input_that_came_out_static_is_refused(tmp_path: Path) -> None:
    """Only positional inputs' dims were checked: a keyword input's, or a dict input's tensor's, came out
    static silently."""
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    n = torch.export.Dim("n")
    target = tmp_path / "m.onnx"
    with pytest.raises(ExportError, match=r"input 'y' dim 0 \(n\) was asked to be dynamic, but .* static \(2\)"):
        opbridge.export(
            _KeywordSizeAsAttribute(), (x,), target, kwargs={"y": y}, dynamic_shapes={"x": None, "y": {0: n}}
        )
    with pytest.raises(ExportError, match=r"input 'd_a' dim 0 \(n\) was asked to be dynamic, but .* static \(2\)"):
        opbridge.export(_DictSizeAsAttribute(), ({"a": x, "b": y},), target, dynamic_shapes=({"a": {0: n}, "b": None},))
    # after a positional None, input_names named the next input's dims by the None's name: unchecked
    for shapes in [{"dynamic_shapes": (None, None, {0: n})}, {"dynamic_axes": {"c": {0: "n"}}}]:
        with pytest.raises(ExportError, match=r"input 'c' dim 0 \(n\) was asked to be dynamic, but .* static \(2\)"):
            opbridge.export(_AfterNoneSizeAsAttribute(), (x, None, y), target, input_names=["a", "b", "c"], **shapes)
    assert not target.exists()


class _DictInput(torch.nn.Module):
    def forward(self, d: dict[str, torch.Tensor]) -> torch.Tensor:
        return _add_pair(d["a"], d["b"] * 2)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_a_dict_last_in_args_is_a_positional_input_unless_its_keys_are_parameters(
    tmp_path: Path, exporter: str
) -> None:
    """torch.onnx takes a dict last in args as keyword inputs: a forward taking a dict failed with "missing
    a required argument: 'd'". Such a dict is now the positional input; one whose keys name the forward's
    parameters left open (``(x, {'bias': b})``, ``(d, {})``) is still keyword inputs."""
    a, b = torch.randn(2, 3), torch.randn(2, 3)
    for i, args in enumerate([({"a": a, "b": b},), ({"a": a, "b": b}, {})]):
        result = opbridge.export(_DictInput(), args, tmp_path / f"d{i}.onnx", exporter=exporter)
        assert [i.name for i in result.model.graph.input] == ["d_a", "d_b"]
        (out,) = opbridge.InferenceSession(result.path).run(None, {"d_a": a.numpy(), "d_b": b.numpy()})
        np.testing.assert_allclose(out, (a + b * 2).numpy(), rtol=1e-6, atol=1e-6)
    # verify hands the reference its dict again (it refused: "the reference takes 1 example input(s), the model
    # has 2 input(s)")
    record = opbridge.verify(result.path, (_DictInput(), ({"a": a, "b": b},)), backends=["onnxruntime"])
    assert record.exit_code == 0 and [r.status for r in record.runs] == ["pass"], record.table()
    result = opbridge.export(_KeywordInput(), (a, {"bias": b}), tmp_path / "kw.onnx", exporter=exporter)
    assert [i.name for i in result.model.graph.input] == ["x", "bias"]


def test_torchscript_refuses_dims_of_a_dict_input_and_an_example_outside_a_dims_bounds(tmp_path: Path) -> None:
    """A dict input's dims crashed the conversion to dynamic_axes ("invalid literal for int()"); a Dim's
    min/max were ignored where the example lies outside them (torch.export refuses that example)."""
    a = torch.randn(2, 3)
    batch = torch.export.Dim("batch")
    with pytest.raises(ExportError, match=r"gives dims for input 'd', a dict: the TorchScript exporter takes"):
        opbridge.export(
            _DictInput(),
            ({"a": a, "b": a},),
            tmp_path / "d.onnx",
            exporter="torchscript",
            dynamic_shapes=({"a": {0: batch}, "b": {0: batch}},),
        )
    bounded = torch.export.Dim("rows", min=3, max=8)
    with pytest.raises(ExportError, match=r"input 'x' dim 0 the Dim 'rows' of 3\.\.8, but the example .* size is 2"):
        opbridge.export(_Static2(), (a,), tmp_path / "b.onnx", exporter="torchscript", dynamic_shapes=({0: bounded},))


class _ScaledByNumber(torch.nn.Module):
    def forward(self, x: torch.Tensor, k: float = 1.0) -> torch.Tensor:
        return scaled_swish(x, beta=k)


def test_torchscript_names_a_number_given_as_an_example_input_for_an_attribute(tmp_path: Path) -> None:
    """The TorchScript exporter makes ``3.0`` in ``(x, 3.0)`` a tensor input: the error blamed a size
    (x.shape[0]) where the user passed a constant."""
    with pytest.raises(
        ExportError,
        match=r"example inputs that are Python numbers \(\['k'\]\) tensor inputs.*"
        r"exporter='dynamo'.*attribute 'beta' expects float, got Tensor",
    ):
        opbridge.export(_ScaledByNumber(), (torch.randn(2, 3), 3.0), tmp_path / "m.onnx", exporter="torchscript")


@opbridge.op("tests.calls::Noise")
def _calls_noise(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    return x + scale * torch.randn_like(x)


@opbridge.op("tests.calls::Table")
def _calls_table(w: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    return torch.sin(w) * scale


class _TwoDraws(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _calls_noise(x) - _calls_noise(x)  # (two calls, two draws: never zero)


class _OneFolded(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _calls_table(x) + _calls_table(torch.arange(3.0), scale=-1.0)  # (the second on a constant)


class _OneUnused(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _calls_table(x, scale=3.0)  # (a result nothing reads)
        return _calls_table(x)


class _TwoEqual(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _calls_table(x) + _calls_table(x)


@pytest.mark.parametrize(
    ("model", "exporter", "message"),
    [
        (_TwoDraws, "torchscript", r"merged equal calls of tests.calls::Noise v1 .* one draw where PyTorch gives one"),
        (_OneFolded, "torchscript", r"wrote 1 node\(s\) of tests.calls::Table v1 for the 2 calls traced.*folded"),
        (_OneUnused, "dynamo", r"wrote 1 node\(s\) of tests.calls::Table v1 for the 2 calls traced.*dead code"),
        (_OneUnused, "torchscript", r"wrote 1 node\(s\) of tests.calls::Table v1 for the 2 calls traced"),
    ],
    ids=["merged-random-torchscript", "folded-torchscript", "unused-dynamo", "unused-torchscript"],
)
def test_each_call_of_an_op_must_be_a_node(tmp_path: Path, model: type, exporter: str, message: str) -> None:
    """The check counted op types: with one call of an op kept, another call could be folded into a constant,
    removed as dead code, or (TorchScript) merged with an equal one, so that a random op gave one draw for
    two: zeros where PyTorch gives noise."""
    with pytest.raises(ExportError, match=message):
        opbridge.export(model(), (torch.zeros(3),), tmp_path / "m.onnx", exporter=exporter)
    assert not (tmp_path / "m.onnx").exists()


def test_equal_calls_of_a_deterministic_op_may_share_a_node(tmp_path: Path) -> None:
    """TorchScript merges two equal calls of an op that draws nothing into one node: the same values."""
    path = tmp_path / "m.onnx"
    opbridge.export(_TwoEqual(), (torch.zeros(3),), path, exporter="torchscript")
    assert sum(n.op_type == "Table" for n in onnx.load(path).graph.node) == 1
    x = np.array([0.5, -1.0, 2.0], np.float32)
    (y,) = opbridge.InferenceSession(path).run(None, {"x": x})
    np.testing.assert_allclose(y, 2 * np.sin(x), rtol=1e-6)


class _ComplexTwice(torch.nn.Module):
    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return _calls_table(z)


def test_a_complex_input_to_an_op_is_named_with_the_fix(tmp_path: Path) -> None:
    """dynamo's message was torch's "file an issue" text around "No decompositions registered for the
    complex-valued input"."""
    z = torch.randn(3, dtype=torch.complex64)
    with pytest.raises(ExportError, match=r"the op tests.calls::Table is given a complex tensor.*view_as_real"):
        opbridge.export(_ComplexTwice(), (z,), tmp_path / "c.onnx", exporter="dynamo")
