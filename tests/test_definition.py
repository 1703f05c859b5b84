"""@opbridge.op: signatures become specs; eager calls run the reference; bad definitions fail clearly."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Optional

import numpy as np
import pytest
import torch
from conftest import run_script

import opbridge
from opbridge import AttrType, OpDefinitionError
from opbridge.ops import DynamicResize, MySELU, MyStrangeOp, MyStrangeOp2


@opbridge.op("tests.def::Everything", outputs=("y", "z"))
def everything(
    x: torch.Tensor,
    maybe: Optional[torch.Tensor],  # noqa: UP045 - the Optional spelling is what is tested
    alpha: float = 0.5,
    count: int = 3,
    flag: bool = True,
    tag: str = "这是字符串属性",
    weights: list[float] = [1.0, 2.5],  # noqa: B006
    dims: list[int] = [1, 2],  # noqa: B006
    names: list[str] = ["p", "q"],  # noqa: B006
) -> tuple[torch.Tensor, torch.Tensor]:
    """Test op with every attribute type."""
    y = x * alpha + count + (1 if flag else 0) + len(tag) + sum(weights) + sum(dims) + len(names)
    return y, x if maybe is None else x + maybe


def test_signature_becomes_spec() -> None:
    spec = everything.spec
    assert (spec.domain, spec.name, spec.version) == ("tests.def", "Everything", 1)
    assert [(p.name, p.optional) for p in spec.inputs] == [("x", False), ("maybe", True)]
    assert [o.name for o in spec.outputs] == ["y", "z"]
    assert [(a.name, a.type, a.default) for a in spec.attributes] == [
        ("alpha", AttrType.FLOAT, 0.5),
        ("count", AttrType.INT, 3),
        ("flag", AttrType.BOOL, True),
        ("tag", AttrType.STRING, "这是字符串属性"),
        ("weights", AttrType.FLOATS, (1.0, 2.5)),
        ("dims", AttrType.INTS, (1, 2)),
        ("names", AttrType.STRINGS, ("p", "q")),
    ]
    assert spec.doc == "Test op with every attribute type."
    assert opbridge.find_op("tests.def", "Everything") is everything


def test_spec_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        everything.spec.name = "Other"  # type: ignore[misc]


def test_spec_carries_the_shape_rule() -> None:
    assert everything.spec.shape_rule is None, "no rule declared: derived from the reference"
    assert DynamicResize.spec.shape_rule is DynamicResize.shape_rule is not None

    @opbridge.op("tests.def::Ruled")
    def ruled(x: torch.Tensor) -> torch.Tensor:
        return x

    before = ruled.spec
    rule = ruled.register_shape(lambda x: opbridge.TensorInfo(x.shape, x.dtype))
    assert ruled.spec.shape_rule is rule and before.shape_rule is None, "a new frozen spec, the old one unchanged"
    assert ruled.spec == before


def test_eager_call_equals_reference() -> None:
    torch.manual_seed(0)
    x, m = torch.randn(2, 3), torch.randn(2, 3)
    y, z = everything(x, m, alpha=2.0, names=["a", "b", "c"])
    ry, rz = everything.reference(x, m, alpha=2.0, names=["a", "b", "c"])
    torch.testing.assert_close(y, ry, rtol=0, atol=0)
    torch.testing.assert_close(z, rz, rtol=0, atol=0)
    y2, z2 = everything(x, None)
    torch.testing.assert_close(z2, x, rtol=0, atol=0)
    assert z2.data_ptr() != x.data_ptr(), "outputs must not alias inputs"


def test_builtin_ops_match_their_definitions() -> None:
    torch.manual_seed(1)
    x = torch.randn(2, 3, 4, 4)
    torch.testing.assert_close(MySELU(x, torch.zeros(3), torch.ones(3)), x * torch.sigmoid(x), rtol=1e-6, atol=1e-6)
    w, b = torch.rand(1, 3, 4, 4), torch.rand(1, 3, 4, 4)
    s, a = MyStrangeOp(x, w, b)
    torch.testing.assert_close(s, x + w, rtol=0, atol=0)
    torch.testing.assert_close(a, x * w + b, rtol=0, atol=0)
    torch.testing.assert_close(MyStrangeOp2(x, x, b, int_attr1=4), 2 * x - b, rtol=0, atol=0)
    size = torch.empty(2, 1, 7, 9)
    out = DynamicResize(x, size, align_corners=True)
    expected = torch.nn.functional.interpolate(x, size=(7, 9), mode="bicubic", align_corners=True)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_op_inside_module() -> None:
    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return everything(x, None, count=1)[0]

    x = torch.ones(1, 2)
    assert M()(x).shape == (1, 2)


# ------------------------------------------------------------------ bad input


def test_wrong_attribute_type_at_call() -> None:
    with pytest.raises(
        opbridge.OpCallError, match=r"tests.def::Everything: attribute 'alpha' expects float, got str \('x'\)"
    ):
        everything(torch.ones(1), None, alpha="x")
    with pytest.raises(
        opbridge.OpCallError, match=r"attribute 'dims' expects list\[int\], got list \(\[1\.5\]\).*dims=\[1, 2\]"
    ):
        everything(torch.ones(1), None, dims=[1.5])
    with pytest.raises(opbridge.OpCallError, match=r"attribute 'flag' expects bool, got int"):
        everything(torch.ones(1), None, flag=1)
    with pytest.raises(opbridge.OpCallError, match=r"unknown attribute\(s\) \['nope'\]"):
        everything(torch.ones(1), None, nope=1)
    with pytest.raises(opbridge.OpCallError, match=r"input 'x' expects a torch.Tensor, got list"):
        everything([1.0], None)


@opbridge.op("tests.def::PoolChoices")
def pool(
    x: torch.Tensor,
    mode: Literal["avg", "max"] = "avg",
    levels: list[Literal[0, 1, 2]] = [0],  # noqa: B006
) -> torch.Tensor:
    """A Literal attribute, of strings, and a list attribute of Literal ints."""
    return (x.amax() if mode == "max" else x.mean()) + sum(levels)


def test_a_literal_attribute_takes_only_its_values() -> None:
    """A Literal annotation is data of the spec (its choices); every call outside them is refused, an eager
    call and a direct torch.ops call alike (which used to run the reference's fallback branch: mean)."""
    mode, levels = pool.spec.attributes
    assert (mode.type, mode.default, mode.choices) == (AttrType.STRING, "avg", ("avg", "max"))
    assert (levels.type, levels.default, levels.choices) == (AttrType.INTS, (0,), (0, 1, 2))
    x = torch.tensor([1.0, 3.0])
    assert pool(x, mode="max", levels=[2, 1]).item() == 6.0
    with pytest.raises(
        opbridge.OpCallError,
        match=r"tests.def::PoolChoices: attribute 'mode' = 'mean' is not one of the values it takes, \['avg', 'max'\]; "
        r"pass one of them, e.g. mode='avg'",
    ):
        pool(x, mode="mean")
    with pytest.raises(opbridge.OpCallError, match=r"attribute 'levels' holds 3, which is not one of .* levels=\[0\]"):
        pool(x, levels=[0, 3])
    torch_op = getattr(torch.ops.opbridge, pool.torch_op_name.split("::")[1])
    assert torch_op(x, "max", [1]).item() == 4.0
    with pytest.raises(opbridge.OpCallError, match=r"attribute 'mode' = 'mean' is not one of"):
        torch_op(x, "mean", [0])


def test_literal_attributes_that_cannot_be_are_refused_at_definition() -> None:
    with pytest.raises(OpDefinitionError, match=r"default of 'mode'.*'mean' is not one of the values it takes"):

        @opbridge.op("tests.def::BadLiteralDefault")
        def _a(x: torch.Tensor, mode: Literal["avg", "max"] = "mean") -> torch.Tensor:
            return x

    for annotation in (Literal["avg", 1], Literal[True, False], Literal[b"x"]):
        with pytest.raises(OpDefinitionError, match=r"a Literal attribute takes values of one type, int or str"):
            opbridge.definition.spec_from_function(_literal_fn(annotation), "tests.def::BadLiteral")
    with pytest.raises(OpDefinitionError, match=r"choices must be int values; got \('a',\)"):
        opbridge.AttrSpec("k", AttrType.INT, choices=("a",))
    with pytest.raises(OpDefinitionError, match=r"choices= takes a non-empty tuple of str values"):
        opbridge.AttrSpec("mode", AttrType.STRING, choices="avg")
    with pytest.raises(OpDefinitionError, match=r"a bool attribute takes True and False already"):
        opbridge.AttrSpec("flag", AttrType.BOOL, choices=(True,))
    with pytest.raises(OpDefinitionError, match=r"the default \(3,\) is not among its choices \(1, 2\)"):
        opbridge.AttrSpec("ks", AttrType.INTS, (3,), choices=(1, 2))


def _literal_fn(annotation: Any) -> Callable[..., Any]:
    def fn(x: torch.Tensor, mode: int = 0) -> torch.Tensor:
        return x

    fn.__annotations__ = {"x": torch.Tensor, "mode": annotation, "return": torch.Tensor}
    return fn


def test_the_onnx_schema_names_an_attribute_s_choices() -> None:
    from opbridge.onnx_schema import make_schema

    described = {a.name: a.description for a in make_schema(pool).attributes.values()}
    assert described == {"mode": "one of ['avg', 'max']", "levels": "one of [0, 1, 2]"}


def test_name_without_domain() -> None:
    with pytest.raises(OpDefinitionError, match=r"must be written 'domain::Name'.*default domain"):

        @opbridge.op("MYSELU")
        def f(x: torch.Tensor) -> torch.Tensor:
            return x


def test_empty_or_reserved_domain() -> None:
    with pytest.raises(OpDefinitionError, match=r"empty domain; write it as 'mydomain::Op'"):
        opbridge.op("::Op")
    with pytest.raises(OpDefinitionError, match=r"domain 'ai.onnx' is ONNX's own"):
        opbridge.op("ai.onnx::Op")
    with pytest.raises(OpDefinitionError, match=r"domain 'com.microsoft' is ONNX Runtime's own"):
        opbridge.op("com.microsoft::Gelu")
    with pytest.raises(OpDefinitionError, match=r"domain 'ai.onnx.ml' is ONNX's own"):
        opbridge.op("ai.onnx.ml::Scaler")
    # (the reference evaluator ran ONNX's own FlexAttention for an op of this name there)
    for domain in ("ai.onnx.preview", "ai.onnx.preview.training"):
        with pytest.raises(OpDefinitionError, match=rf"domain '{domain}' is ONNX's own"):
            opbridge.op(f"{domain}::FlexAttention")


def test_unsupported_annotation() -> None:
    with pytest.raises(OpDefinitionError, match=r"tests.def::Bad: parameter 'k' has unsupported annotation .*dict"):

        @opbridge.op("tests.def::Bad")
        def bad(x: torch.Tensor, k: dict = {}) -> torch.Tensor:  # noqa: B006
            return x


def test_missing_annotations() -> None:
    with pytest.raises(OpDefinitionError, match=r"parameter 'k' has no type annotation"):

        @opbridge.op("tests.def::Bad2")
        def bad(x: torch.Tensor, k=1) -> torch.Tensor:
            return x

    with pytest.raises(OpDefinitionError, match=r"add a return annotation"):

        @opbridge.op("tests.def::Bad3")
        def bad3(x: torch.Tensor):
            return x

    with pytest.raises(OpDefinitionError, match=r"return annotation .* is not supported"):

        @opbridge.op("tests.def::Bad4")
        def bad4(x: torch.Tensor) -> list:
            return [x]


def test_a_one_tensor_tuple_return_is_refused() -> None:
    """``-> tuple[torch.Tensor]`` was one output that the op returned as a bare tensor: ``op(x)[0]`` was the
    output's first row where the Python function gives the output."""
    with pytest.raises(OpDefinitionError, match=r"declares one output in a tuple.*annotate '-> torch.Tensor'"):

        @opbridge.op("tests.def::OneTuple")
        def one_tuple(x: torch.Tensor) -> tuple[torch.Tensor]:
            return (x * 2,)


@opbridge.op("tests.def::KeywordOnly")
def keyword_only(x: torch.Tensor, *, k: float = 1.0, bias: float = 0.0) -> torch.Tensor:
    return x * k + bias


def test_keyword_only_attributes_are_refused_by_position() -> None:
    """The definition's keyword-only attributes were taken by position (``op(x, 5.0)`` set k), where the
    Python function refuses such a call."""
    x = torch.ones(2)
    with pytest.raises(opbridge.OpCallError, match=r"takes 1 positional argument\(s\), got 2; give k, bias by name"):
        keyword_only(x, 5.0)  # type: ignore[misc]
    torch.testing.assert_close(keyword_only(x, k=5.0, bias=1.0), torch.full((2,), 6.0), rtol=0, atol=0)
    torch.testing.assert_close(keyword_only(x), x, rtol=0, atol=0)


def test_tensor_after_attribute() -> None:
    with pytest.raises(
        OpDefinitionError, match=r"tensor parameter 'y' comes after attribute 'k'; put all tensor inputs first"
    ):

        @opbridge.op("tests.def::Order")
        def order(x: torch.Tensor, k: int, y: torch.Tensor) -> torch.Tensor:
            return x


def test_bad_default() -> None:
    with pytest.raises(OpDefinitionError, match=r"default of 'k'.*expects int, got str"):

        @opbridge.op("tests.def::BadDefault")
        def bd(x: torch.Tensor, k: int = "3") -> torch.Tensor:  # type: ignore[assignment]
            return x


def test_reference_returning_wrong_number_of_outputs() -> None:
    @opbridge.op("tests.def::TwoOut")
    def two(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x + 1  # type: ignore[return-value]

    with pytest.raises(
        OpDefinitionError,
        match=r"tests.def::TwoOut: the reference returned Tensor, but the op declares 2 tensor output",
    ):
        two(torch.ones(2))


def test_redefinition_with_other_signature() -> None:
    @opbridge.op("tests.def::Redef")
    def first(x: torch.Tensor, k: int = 1) -> torch.Tensor:
        return x + k

    assert first(torch.zeros(1)).item() == 1

    @opbridge.op("tests.def::Redef")
    def second(x: torch.Tensor, k: int = 1) -> torch.Tensor:
        return x + 2 * k

    assert second(torch.zeros(1)).item() == 2, "a same-signature redefinition replaces the reference"
    assert first(torch.zeros(1)).item() == 2, "through either object"

    # PyTorch holds the op's schema: another signature is refused where it is defined, and the earlier
    # definition keeps working (its attribute still an attribute in the export)
    with pytest.raises(
        OpDefinitionError, match=r"already defined with another signature \(\(Tensor x, int k\).*bump version="
    ):

        @opbridge.op("tests.def::Redef")
        def third(x: torch.Tensor, k: float = 1.0) -> torch.Tensor:
            return x

    assert second(torch.zeros(1), k=3).item() == 6
    assert opbridge.find_op("tests.def", "Redef") is second


def test_shape_rule_feeds_fake_tensors() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(2, 3, 5, 5)
        size = torch.empty(2, 1, 11, 13)
        out = DynamicResize(x, size)
    assert tuple(out.shape) == (2, 3, 11, 13)


def test_derived_shape_rule_for_onnx() -> None:
    """An op without a rule gets output dims derived from its reference on meta tensors."""
    import onnx

    from opbridge.shape import SymDim, TensorInfo, infer_onnx

    def tp(dims: list) -> onnx.TypeProto:
        return onnx.helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, dims)

    @opbridge.op("tests.def::Pool")
    def pool(x: torch.Tensor, k: int = 2) -> torch.Tensor:
        return torch.nn.functional.avg_pool2d(x, k).transpose(0, 1)

    (out,) = infer_onnx(pool.spec, None, pool.reference, [tp(["N", 3, 8, "W"])], {"k": 2})
    dims = out.tensor_type.shape.dim
    assert dims[0].dim_value == 3 and dims[1].dim_param == "N" and dims[2].dim_value == 4
    assert not dims[3].HasField("dim_param") and not dims[3].HasField("dim_value"), "W/2 is unknown, not W"
    assert TensorInfo((SymDim("a"), 2), torch.float32).rank == 2

    # min(16, batch) is 16 at both large probe sizes, and batch + 12 at the first two probes is the
    # second input's probes: the small third run shows both are neither static nor that input's dim
    @opbridge.op("tests.def::TopRows")
    def top_rows(x: torch.Tensor, k: int = 16) -> torch.Tensor:
        return x[: min(k, x.shape[0])] * 2

    @opbridge.op("tests.def::PadAdd")
    def pad_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(x, (0, 0, 0, 12)) + y.sum()

    @opbridge.op("tests.def::Longer")
    def longer(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.zeros(max(a.shape[0], b.shape[0]), a.shape[1])

    @opbridge.op("tests.def::First64")
    def first64(x: torch.Tensor) -> torch.Tensor:
        return x[:, :64] * 1

    # max of two dims is neither of them (probes in opposite orders); a clamp at 64 is not the input dim
    (both,) = infer_onnx(longer.spec, None, longer.reference, [tp(["n", 3]), tp(["m", 3])], {})
    (clamped,) = infer_onnx(first64.spec, None, first64.reference, [tp([2, "L"])], {})
    assert [d.dim_param or d.dim_value for d in both.tensor_type.shape.dim] == [0, 3]  # 0: unknown
    assert [d.dim_param or d.dim_value for d in clamped.tensor_type.shape.dim] == [2, 0]
    (rows,) = infer_onnx(top_rows.spec, None, top_rows.reference, [tp(["batch", 3])], {"k": 16})
    (padded,) = infer_onnx(pad_add.spec, None, pad_add.reference, [tp(["batch", 3]), tp(["seq", 3])], {})
    for out in (rows, padded):
        first, second = out.tensor_type.shape.dim
        assert not first.HasField("dim_param") and not first.HasField("dim_value"), first
        assert second.dim_value == 3

    # a reference that fails on the small sizes keeps the two large runs' dims
    @opbridge.op("tests.def::NeedsEight")
    def needs_eight(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.avg_pool1d(x, 8)

    (pooled,) = infer_onnx(needs_eight.spec, None, needs_eight.reference, [tp(["n", 3, "L"])], {})
    assert [d.dim_param or d.dim_value for d in pooled.tensor_type.shape.dim] == ["n", 3, 0]  # L // 8 unknown


def test_an_input_of_unknown_rank_gives_no_shape_for_onnx() -> None:
    """An input with no shape (not even a rank) ran the rule as a scalar: a rule refusing it failed the
    model's shape inference (a rewrite of a model of such inputs was refused), and a rule taking it
    declared its outputs scalars. Now: the element type where the rule gives one, no shape."""
    import onnx

    from opbridge.ops import DynamicResize
    from opbridge.shape import TensorInfo, infer_onnx

    unranked = onnx.helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, None)
    ranked = onnx.helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, [1, 1, "h", "w"])
    spec, rule = DynamicResize.spec, DynamicResize.shape_rule
    assert infer_onnx(spec, rule, DynamicResize.reference, [unranked, ranked], {"align_corners": 0}) == [None]

    @opbridge.op("tests.def::Twice", shape=lambda x: TensorInfo(x.shape, torch.float16))
    def twice(x: torch.Tensor) -> torch.Tensor:
        return (2 * x).half()

    (out,) = infer_onnx(twice.spec, twice.shape_rule, twice.reference, [unranked], {})
    assert out.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    assert not out.tensor_type.HasField("shape"), out


_SCALE = torch.tensor([0.5, 2.0, -1.0])  # a module-level tensor the next op's reference reads


@opbridge.op("tests.def::ScaleByConstant")
def scale_by_constant(x: torch.Tensor) -> torch.Tensor:
    return x * _SCALE


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_reference_reading_a_module_level_tensor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exporter: str
) -> None:
    """Without a shape rule, the shapes come from the reference on tensors without data; a real tensor
    it reads from outside its arguments failed there ("not on the expected device meta", and under
    torch.compile's fake tensors). It is taken as a constant: compile, both exporters and a run agree."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))

    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return scale_by_constant(x) + 1

    x = torch.randn(4, 3)
    expected = x * _SCALE + 1
    compiled = torch.compile(Model(), fullgraph=True, dynamic=True, backend="eager")
    torch.testing.assert_close(compiled(x), expected, rtol=0, atol=0)
    path = tmp_path / "m.onnx"
    if exporter == "dynamo":
        opbridge.export(Model(), (x,), path, dynamic_shapes=({0: torch.export.Dim("n")},))
    else:
        opbridge.export(Model(), (x,), path, exporter="torchscript", dynamic_axes={"x": {0: "n"}})
    session = opbridge.InferenceSession(str(path))
    x5 = torch.randn(5, 3)
    (got,) = session.run(None, {session.get_inputs()[0].name: x5.numpy()})
    torch.testing.assert_close(torch.from_numpy(got), x5 * _SCALE + 1, rtol=1e-6, atol=1e-6)


_TABLE = torch.arange(4.0)


@opbridge.op("tests.def::Table")
def table(x: torch.Tensor) -> torch.Tensor:
    return _TABLE


def test_reference_returning_a_module_level_tensor_as_it_is_compiles() -> None:
    """Without a shape rule, torch.compile failed inside dynamo ("Please convert all Tensors to
    FakeTensors first"): the fake output was made from the real tensor outside the fake mode's allowance."""
    x = torch.zeros(1)
    compiled = torch.compile(lambda a: table(a) + a, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x), _TABLE, rtol=0, atol=0)


def test_reference_disagreeing_with_its_shape_rule_is_named() -> None:
    """Exports and runtimes follow the shape rule; an eager call shows where the reference differs."""

    @opbridge.op("tests.def::Count", shape=lambda x: opbridge.TensorInfo(x.shape[:1], x.dtype))
    def count(x: torch.Tensor) -> torch.Tensor:
        return (x > 0).sum(-1)

    with pytest.raises(
        OpDefinitionError,
        match=r"the shape rule declares output 0 \('output'\) as \[3\] torch.float32, but the reference returned "
        r"\[3\] torch.int64",
    ):
        count(torch.ones(3, 4))

    @opbridge.op("tests.def::Rows", shape=lambda x: opbridge.TensorInfo((x.shape[0] + 1, opbridge.SymDim()), x.dtype))
    def rows(x: torch.Tensor) -> torch.Tensor:
        return x[:, x[0] > 0]

    with pytest.raises(OpDefinitionError, match=r"as \[4, '\?'\] torch.float32, but the reference returned \[3, 2\]"):
        rows(torch.tensor([[1.0, -1.0, 2.0]] * 3))
    fits = opbridge.TensorInfo((3, opbridge.SymDim()), torch.float32)
    rows.register_shape(lambda x: fits)
    assert rows(torch.tensor([[1.0, -1.0, 2.0]] * 3)).shape == (3, 2), "a SymDim takes any size"


def test_the_shape_rule_is_consulted_once_per_signature() -> None:
    """Every eager call ran the shape rule again to check the reference's outputs (a few us of a small op's
    cost): a signature found to fit (shapes, dtypes, devices and attribute values in, shapes and dtypes out)
    is not checked again; a new one is, and one that does not fit fails at every call."""
    consulted: list[tuple[int, int]] = []

    def rule(x: torch.Tensor, n: int = 1) -> opbridge.TensorInfo:
        consulted.append((x.shape[0], n))
        return opbridge.TensorInfo((x.shape[0] * n,), x.dtype)

    @opbridge.op("tests.def::Tile", shape=rule)
    def tile(x: torch.Tensor, n: int = 1) -> torch.Tensor:
        return x if x.shape[0] == 5 else x.repeat(n)  # (not what the rule says for 5 elements and n > 1)

    for _ in range(3):
        assert tile(torch.ones(2), n=3).shape == (6,)
        assert tile(torch.ones(2)).shape == (2,)
    assert consulted == [(2, 3), (2, 1)]
    assert tile(torch.ones(4, dtype=torch.float64), n=3).shape == (12,)
    assert consulted[2:] == [(4, 3)]
    for _ in range(2):
        with pytest.raises(OpDefinitionError, match=r"declares output 0 \('output'\) as \[10\] torch.float32"):
            tile(torch.ones(5), n=2)
    assert consulted[3:] == [(5, 2), (5, 2)]


def test_output_names_and_attribute_ranges_are_checked() -> None:
    for outputs, why in ((("lo", ""), r"bad: \['lo', ''\]|bad: \[''\]"), (("x", "y"), r"repeated: \['x'\]")):
        with pytest.raises(OpDefinitionError, match=why):

            @opbridge.op("tests.def::Outs", outputs=outputs)
            def outs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                return x, x

    @opbridge.op("tests.def::Ranges")
    def ranges(x: torch.Tensor, f: float = 1.0, i: int = 0, fs: list[float] = [1.0]) -> torch.Tensor:  # noqa: B006
        return x

    x = torch.ones(1)
    with pytest.raises(opbridge.OpCallError, match=r"attribute 'f' = 1e\+300 is beyond float32"):
        ranges(x, f=1e300)
    with pytest.raises(opbridge.OpCallError, match=r"attribute 'i' = 18446744073709551615 is beyond int64"):
        ranges(x, i=2**64 - 1)
    with pytest.raises(opbridge.OpCallError, match=r"attribute 'fs' = -1e\+39 is beyond float32"):
        ranges(x, fs=[1.0, -1e39])
    assert ranges(x, f=float("inf"), i=-(2**63)).tolist() == [1.0], "inf is a float32 value, -2**63 an int64 one"


def test_autocast_does_not_reach_inside_an_op() -> None:
    """An op is one unit to autocast: its reference computes in its inputs' dtypes, eagerly as under
    torch.compile and as its shape rule and fake kernel say (eagerly it computed in bfloat16, compiled in
    float32, and the fake kernel said float32)."""

    @opbridge.op("tests.def::Project", shape=lambda x, w: opbridge.TensorInfo((x.shape[0], w.shape[1]), x.dtype))
    def project(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x @ w

    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(8, 16, generator=g), torch.randn(16, 8, generator=g)

    def run(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return project(a, b)

    eager = run(x, w)
    compiled = torch.compile(run, backend="aot_eager", fullgraph=True)(x, w)
    assert eager.dtype == compiled.dtype == torch.float32
    assert torch.equal(eager, project.reference(x, w)) and torch.equal(compiled, eager)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.library.opcheck(project.torch_op(), (x, w))


def test_shape_rule_with_a_dtype_name_is_named() -> None:
    @opbridge.op("tests.def::NamedDtype", shape=lambda x: opbridge.TensorInfo(x.shape, "float32"))
    def named_dtype(x: torch.Tensor) -> torch.Tensor:
        return x * 1

    with pytest.raises(OpDefinitionError, match=r"gives output 0 the dtype 'float32' \(str\); give a torch dtype"):
        named_dtype(torch.ones(2))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is not available on this platform")
def test_forked_child_finds_ops_while_another_thread_held_the_registry(tmp_path: Path) -> None:
    """A registry lock held by another thread at the fork would never be released in the child."""
    out = run_script(
        tmp_path,
        """
        import os, threading, time
        import opbridge
        from opbridge import definition

        held, release = threading.Event(), threading.Event()

        def hold():
            with definition._LOCK:
                held.set()
                release.wait()

        t = threading.Thread(target=hold)
        t.start()
        held.wait()
        pid = os.fork()
        if pid == 0:
            signal_exit = threading.Timer(20, lambda: os._exit(3))  # a hang ends the child with 3
            signal_exit.start()
            found = opbridge.find_op("opbridge", "MySELU") is not None
            os._exit(0 if found else 2)
        release.set()
        t.join()
        _, status = os.waitpid(pid, 0)
        print("child exit", os.waitstatus_to_exitcode(status))
        """,
        timeout=120,
    )
    assert out.strip() == "child exit 0", out


def test_names_pytorch_cannot_take_are_refused_and_leave_nothing_behind() -> None:
    """Non-ASCII op or parameter names passed str.isidentifier and then failed inside PyTorch, leaving a
    half-registered op that broke every later export; 'a::b::c' was blamed on a missing domain."""
    with pytest.raises(OpDefinitionError, match=r"'Größe' is not a valid op type; use ASCII letters"):
        opbridge.op("tests.def::Größe")
    with pytest.raises(OpDefinitionError, match=r"domain 'tëst' must be dot-separated ASCII identifiers"):
        opbridge.op("tëst::Op")
    with pytest.raises(OpDefinitionError, match=r"has 2 '::'; write it 'domain::Name' with one"):
        opbridge.op("a::b::c")
    with pytest.raises(OpDefinitionError, match=r"parameter '名前' is not an ASCII name"):

        @opbridge.op("tests.def::NamedInJapanese")
        def named(x: torch.Tensor, 名前: int = 1) -> torch.Tensor:
            return x

    assert opbridge.find_op("tests.def", "NamedInJapanese") is None


def test_a_definition_pytorch_refuses_leaves_the_registry_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    from opbridge import definition

    def refuse(opdef: opbridge.OpDef) -> None:
        raise RuntimeError("PyTorch refused the schema")

    monkeypatch.setattr(definition, "_define_torch_op", refuse)
    with pytest.raises(RuntimeError, match="refused the schema"):

        @opbridge.op("tests.def::Refused")
        def refused(x: torch.Tensor) -> torch.Tensor:
            return x

    assert opbridge.find_op("tests.def", "Refused") is None


def test_two_ops_pytorch_would_name_alike_are_refused() -> None:
    """PyTorch's op names have no dots: 'tests.dots::Gelu' and 'tests_dots::Gelu' were one torch op, the
    later definition silently running for the earlier one's calls."""

    @opbridge.op("tests.dots::Gelu")
    def dotted(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    with pytest.raises(
        OpDefinitionError, match=r"tests_dots::Gelu v1 and the op tests.dots::Gelu v1 .* one PyTorch op"
    ):

        @opbridge.op("tests_dots::Gelu")
        def underscored(x: torch.Tensor) -> torch.Tensor:
            return x * 100

    assert dotted(torch.ones(2)).tolist() == [2.0, 2.0]


@pytest.mark.parametrize("qualname", ["opbridge::MySELU", "Test::DynamicTRTResize"])
def test_a_built_in_op_cannot_be_taken_over(qualname: str) -> None:
    """A user's op of a built-in's name was replaced by the built-in when a lookup loaded them (same
    signature: the user's semantics silently lost) or broke every later lookup (another signature)."""
    from opbridge.ops import DynamicResize

    with pytest.raises(OpDefinitionError, match=rf"{qualname} v1 is one of opbridge's built-in ops"):

        @opbridge.op(qualname)
        def mine(input: torch.Tensor, size_tensor: torch.Tensor, align_corners: bool = False) -> torch.Tensor:
            return input

    assert opbridge.find_op("Test", "DynamicTRTResize") is DynamicResize

    # a new op in a built-in domain is the user's to define
    @opbridge.op("mmdeploy::TestsOwnOp")
    def own(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    assert opbridge.find_op("mmdeploy", "TestsOwnOp") is own


@opbridge.op("tests.def::TextLen")
def _text_len(x: torch.Tensor, s: str = "", words: list[str] = []) -> torch.Tensor:  # noqa: B006
    return x + len(s) + len(words)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"s": "\ud800"},
            r"attribute 's' holds text that is not valid Unicode \(a lone surrogate '\\ud800' at index 0\)",
        ),
        ({"words": ["ok", "a\udcffb"]}, r"attribute 'words' holds text .* '\\udcff' at index 1\)"),
    ],
    ids=["string", "string-list"],
)
def test_text_that_utf8_cannot_hold_is_refused_by_name(kwargs: dict, message: str) -> None:
    """A lone surrogate reached torch's schema check: "Expected a value of type 'str' ... found type 'str'"."""
    with pytest.raises(opbridge.OpCallError, match=r"tests.def::TextLen: " + message):
        _text_len(torch.zeros(2), **kwargs)
    assert _text_len(torch.zeros(2), s="这是", words=["é"]).tolist() == [3.0, 3.0]


def test_a_kernels_out_parameter_without_a_default_is_refused() -> None:
    """Only ONNX Runtime passes ``out``: such a kernel passed verify there and raised TypeError ("missing
    1 required positional argument: 'out'") in the reference evaluator and OpenVINO."""

    @opbridge.op("tests.def::Twice", shape=lambda x: opbridge.TensorInfo(x.shape, x.dtype))
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    with pytest.raises(
        OpDefinitionError, match=r"tests.def::Twice: the kernel's parameter 'out' has no default.*out=None"
    ):

        @twice.register_kernel
        def _(x, out):
            return np.multiply(x, 2, out=out)

    assert twice.kernel is None

    @twice.register_kernel(kind="torch")
    def _(x, *, out=None):
        return torch.mul(x, 2, out=out)

    assert twice.kernel_kind == "torch"


def test_parameters_that_calls_could_not_pass_are_refused_at_definition() -> None:
    """A keyword-only tensor or a positional-only attribute defined fine, then every call failed with a raw
    TypeError; an attribute named like the gradient op's own parameters broke the compiled backward."""
    with pytest.raises(OpDefinitionError, match=r"tensor parameter 'x' is keyword-only \(after '\*'\).*before the"):

        @opbridge.op("tests.def::KwOnlyTensor")
        def kw_only_tensor(*, x: torch.Tensor, k: int = 2) -> torch.Tensor:
            return x * k

    with pytest.raises(OpDefinitionError, match=r"attribute 'k' is positional-only \(before '/'\).*after the '/'"):

        @opbridge.op("tests.def::PosOnlyAttr")
        def pos_only_attr(x: torch.Tensor, k: int = 2, /) -> torch.Tensor:
            return x * k

    for name in ("needs__", "inputs__", "rng_states__"):
        with pytest.raises(OpDefinitionError, match=rf"parameter '{name}': names ending in '__' are reserved"):
            opbridge.op("tests.def::Clash")(_with_attribute(name))

    # positional-only tensors and keyword-only attributes are what calls pass anyway
    @opbridge.op("tests.def::Mixed")
    def mixed(x: torch.Tensor, /, k: int = 2, *, j: int = 3) -> torch.Tensor:
        return x * k + j

    assert mixed(torch.ones(2), 4, j=1).tolist() == [5.0, 5.0]


def _with_attribute(name: str) -> Callable[..., Any]:
    namespace: dict[str, Any] = {"torch": torch}
    exec(f"def f(x: torch.Tensor, {name}: bool = True) -> torch.Tensor:\n    return x", namespace)
    return namespace["f"]


def test_parameter_named_out_and_outputs_as_a_string_are_refused() -> None:
    with pytest.raises(OpDefinitionError, match=r"parameter 'out': the name is reserved"):

        @opbridge.op("tests.def::AddOut")
        def add_out(x: torch.Tensor, out: float = 1.0) -> torch.Tensor:
            return x + out

    # (an attribute named self broke a call by name and dynamo's export; a tensor one the same way)
    with pytest.raises(OpDefinitionError, match=r"parameter 'self': the name is reserved.*rename it"):

        @opbridge.op("tests.def::AddSelf")
        def add_self(x: torch.Tensor, self: int = 1) -> torch.Tensor:
            return x + self

    with pytest.raises(OpDefinitionError, match=r"parameter 'self': the name is reserved"):

        @opbridge.op("tests.def::SelfInput")
        def self_input(self: torch.Tensor) -> torch.Tensor:
            return self + 1

    with pytest.raises(OpDefinitionError, match=r"outputs= takes a tuple of names, one per output.*got 'ab'"):

        @opbridge.op("tests.def::TwoNamed", outputs="ab")  # type: ignore[arg-type]
        def two(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x, x


def test_a_reference_may_return_its_outputs_as_a_list() -> None:
    @opbridge.op("tests.def::ListOut")
    def pair(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return [x + 1, x + 2]  # type: ignore[return-value]

    a, b = pair(torch.ones(2))
    assert a.tolist() == [2.0, 2.0] and b.tolist() == [3.0, 3.0]
    assert isinstance(pair.run_reference(torch.ones(2)), tuple)


def test_register_kernel_as_a_decorator_with_arguments() -> None:
    @opbridge.op("tests.def::KernelKind")
    def plus(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    @plus.register_kernel(kind="torch")
    def _plus(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    assert plus.kernel is _plus and plus.kernel_kind == "torch"


def test_a_traced_size_given_for_an_attribute_says_why() -> None:
    @opbridge.op("tests.def::TakeN")
    def take_n(x: torch.Tensor, n: int = 1) -> torch.Tensor:
        return x * n

    with pytest.raises(
        opbridge.OpCallError, match=r"expects int, got Tensor .*Pass an int.*TorchScript exporter traces"
    ):
        take_n(torch.ones(2), n=torch.tensor(3))


def test_a_dynamic_size_given_for_an_attribute_under_export_says_why() -> None:
    """torch.export traces ``x.shape[0]`` of a dynamic dim as a SymInt: an attribute given one (or a list
    holding one) was refused as "expects int, got SymInt (s77). Pass an int", which said neither why nor
    what to do. torch.compile(dynamic=True) specializes it: compiled again for each size, still correct."""

    @opbridge.op("tests.def::RollBy")
    def roll_by(x: torch.Tensor, k: int = 1, dims: list[int] = [0]) -> torch.Tensor:  # noqa: B006
        return torch.roll(x, k, dims[0])

    class BySize(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return roll_by(x, k=x.shape[0] - 1)

    class ByList(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return roll_by(x, dims=[x.shape[0] - x.shape[0]])

    n = torch.export.Dim("n", min=2)
    for model in (BySize(), ByList()):
        with pytest.raises(
            opbridge.OpCallError,
            match=r"tests.def::RollBy: attribute '(k|dims)' is given .*, a SymInt: a size torch.export traces as "
            r"a variable.*pass a constant.*or take the value from a tensor input",
        ):
            torch.export.export(model, (torch.arange(4.0),), dynamic_shapes=({0: n},))
    torch._dynamo.reset()
    compiled = torch.compile(BySize(), dynamic=True, backend="eager")
    for size in (3, 4):
        x = torch.arange(float(size))
        assert torch.equal(compiled(x), torch.roll(x, size - 1, 0))


def _relu_reference(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x)


_relu_reference.__module__ = "torch.nn.functional"  # as a reference imported from a library would be
_reference_elsewhere = _relu_reference


class _HoldsAnOp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.act = MySELU

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(x, torch.zeros(1), torch.ones(1))


def test_ops_and_modules_holding_them_pickle_by_name(tmp_path: Path) -> None:
    """An op pickles as its name: a module holding one can be saved with torch.save (it failed: the op
    object is not the function its module attribute names)."""
    import pickle

    assert pickle.loads(pickle.dumps(MySELU)) is MySELU
    path = tmp_path / "m.pt"
    torch.save(_HoldsAnOp(), path)
    loaded = torch.load(path, weights_only=False)
    x = torch.randn(2, 3)
    assert loaded.act is MySELU and torch.equal(loaded(x), _HoldsAnOp()(x))
    # the module that applied @opbridge.op is the one to import, not where the reference function lives
    made_here = opbridge.op("tests.def::PickledByModule")(_reference_elsewhere)
    assert _reference_elsewhere.__module__ == "torch.nn.functional"
    assert made_here.__reduce__()[1][0] == __name__
    with pytest.raises(OpDefinitionError, match=r"tests.def::NeverDefined v1 is not defined in this process"):
        from opbridge.definition import _op_by_name

        _op_by_name(None, "tests.def", "NeverDefined", 1)


def test_a_reference_that_cannot_run_on_fake_tensors_asks_for_a_shape_rule_under_export() -> None:
    """torch.export and torch.compile said only ".numpy() is not supported for tensor subclasses"."""

    @opbridge.op("tests.def::NumpyDouble")
    def numpy_double(x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(x.numpy() * 2)

    class M(torch.nn.Module):
        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return numpy_double(t)

    assert numpy_double(torch.ones(2)).tolist() == [2.0, 2.0]
    with pytest.raises(Exception, match=r"tests.def::NumpyDouble declares no shape rule.*@NumpyDouble.register_shape"):
        torch.export.export(M(), (torch.ones(3),))


@pytest.mark.parametrize(
    ("op", "dtypes"),
    [
        (MyStrangeOp, (torch.float32, torch.float64, torch.float32)),
        (MyStrangeOp, (torch.int64, torch.float32, torch.float32)),
        (MyStrangeOp2, (torch.float16, torch.float32, torch.float32)),
        (MyStrangeOp2, (torch.int32, torch.int64, torch.int64)),
        (MySELU, (torch.int64, torch.float32, torch.float32)),
    ],
    ids=["strange-f32-f64", "strange-i64-f32", "strange2-f16-f32", "strange2-i32-i64", "selu-i64"],
)
def test_built_in_shape_rules_follow_type_promotion(op: opbridge.OpDef, dtypes: tuple[torch.dtype, ...]) -> None:
    """The built-ins' rules gave the first input's dtype where their references promote: a mixed call
    failed, telling the caller to fix the op's register_shape."""
    shapes = {MyStrangeOp: ((2, 3), (3,), (2, 1)), MyStrangeOp2: ((2, 3), (3,), (3,)), MySELU: ((4,), (1,), (1,))}[op]
    args = tuple(torch.ones(s).to(d) for s, d in zip(shapes, dtypes))
    got = op(*args)
    want = op.reference(*args)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert g.dtype == w.dtype and torch.equal(g, w)


@opbridge.op("tests.definition::Steps")
def _steps(x: torch.Tensor, step: float = 0.7, scales: list[float] = (0.1, 2.5)) -> torch.Tensor:
    return x * int(step * 10) + scales[0] * 1e8


def test_float_attributes_reach_the_reference_as_onnx_carries_them() -> None:
    """A FLOAT attribute is a float32 in the ONNX node: PyTorch computed int(0.7 * 10) = 7 from the
    double, every runtime 6 from 0.699999988, and verify failed every backend with no word why."""
    x = torch.ones(2, dtype=torch.float64)
    want = 6 + float(np.float32(0.1)) * 1e8
    assert _steps(x).tolist() == [want, want]
    assert _steps(x, step=0.7, scales=[0.1]).tolist() == [want, want]
    assert _steps(x, step=0.8).tolist()[0] == 8 + float(np.float32(0.1)) * 1e8  # 0.800000011920929


class _CallsSteps(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _steps(x, step=0.7, scales=[0.1])


@pytest.mark.parametrize("path", ["compile", "exported_module", "torch_ops"])
def test_float_attributes_reach_the_reference_as_onnx_carries_them_on_every_torch_path(path: str) -> None:
    """Compiled code, an ExportedProgram's module and a direct torch.ops call gave the reference the double
    0.7 (int(0.7 * 10) = 7), where eager PyTorch and every runtime compute with 0.699999988 (6)."""
    x = torch.ones(2, dtype=torch.float64)
    want = 6 + float(np.float32(0.1)) * 1e8
    if path == "compile":
        got = torch.compile(_CallsSteps(), backend="eager", fullgraph=True)(x)
    elif path == "exported_module":
        got = torch.export.export(_CallsSteps(), (x,)).module()(x)
    else:
        got = getattr(torch.ops.opbridge, _steps.torch_op_name.split("::")[-1])(x, 0.7, [0.1])
    assert got.tolist() == [want, want]


@pytest.mark.parametrize(
    "strings", [(), ("",), ("", ""), ("a:b", "12:x"), ("3:", ":"), ("日本語", "ß", "\n\x00"), ("9" * 12,)]
)
def test_string_lists_reach_the_reference_whole(strings: tuple[str, ...]) -> None:
    """A list[str] travels through torch.library as one string; separators, digits, empty strings and
    non-ASCII text come back as given."""
    seen: list[tuple[str, ...]] = []

    @opbridge.op("tests.strings::Echo")
    def echo(x: torch.Tensor, names: list[str] = []) -> torch.Tensor:  # noqa: B006
        seen.append(tuple(names))
        return x + len(names)

    out = echo(torch.zeros(2), names=list(strings))
    assert seen == [strings]
    assert out.tolist() == [float(len(strings))] * 2


@pytest.mark.parametrize(
    ("given", "why"),
    [("abc", r"at character 0, 'abc' does not start"), ("2:ab5:c", r"at character 4, a length of 5 runs past the end")],
    ids=["plain-string", "short"],
)
def test_a_string_list_not_encoded_for_the_torch_op_is_named(given: str, why: str) -> None:
    """Scripted code calls the torch.library op with a string list encoded as one string; a plain string
    raised "substring not found" from the decoder."""

    @opbridge.op("tests.strings::Names")
    def names_op(x: torch.Tensor, names: list[str] = []) -> torch.Tensor:  # noqa: B006
        return x + len(names)

    op = getattr(torch.ops.opbridge, names_op.torch_op_name.split("::")[1])
    assert op(torch.zeros(1), "2:ab0:").tolist() == [2.0]
    with pytest.raises(
        opbridge.OpCallError,
        match=rf"tests.strings::Names: attribute 'names' \(a list of strings\) reached "
        rf"torch.ops.opbridge.tests_strings__Names_v1 as '{given}'.*\({why}.*\['ab', ''\] is '2:ab0:'",
    ):
        op(torch.zeros(1), given)


def test_defining_and_calling_an_op_leaves_torch_compile_unloaded(tmp_path: Path) -> None:
    """An op of every attribute kind defines and runs without importing torch._dynamo (seconds of
    import time in every process that defines an op)."""
    out = run_script(
        tmp_path,
        """
        import sys, torch, opbridge

        @opbridge.op("tests.light::Op")
        def f(x: torch.Tensor, a: float = 1.0, n: int = 2, s: str = "", fs: list[float] = [],
              ns: list[int] = [], ss: list[str] = ["p", "q"]) -> torch.Tensor:
            return x * a + n + len(ss)

        print(f(torch.ones(2), ss=["a"]).tolist(), "torch._dynamo" in sys.modules)
        """,
    )
    assert out.split() == ["[4.0,", "4.0]", "False"]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_redefining_an_op_recompiles_the_models_compiled_with_the_old_one(backend: str) -> None:
    """A notebook re-runs the cell that defines an op (now giving float64) while a model compiled with the
    first definition is alive: the compiled code ran the new definition into the old buffers (garbage, no
    error), and inductor's graph cache gave the old graph back even after a recompile."""
    name = f"tests.redefine_{backend}::Scale"

    def define(dtype: torch.dtype) -> opbridge.OpDef:
        @opbridge.op(name)
        def scale(x: torch.Tensor) -> torch.Tensor:
            return (x * 2).to(dtype)

        return scale

    op = define(torch.float32)
    compiled = torch.compile(lambda t: op(t) * 3 + 1, backend=backend, fullgraph=True)
    x = torch.arange(8, dtype=torch.float32)
    torch.testing.assert_close(compiled(x), x * 6 + 1)
    define(torch.float64)  # the same torch op runs the new definition now
    got = compiled(x)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, (x * 6 + 1).double())


def test_an_op_edited_between_processes_misses_the_on_disk_compile_cache(tmp_path: Path) -> None:
    """Inductor's on-disk graph cache knew an op by its name: the process after an edit of the op's
    output dtype (here a module constant) got the last process's graph back, and its float32 buffers
    held the float64 results (garbage, no error)."""
    script = tmp_path / "edited.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os, sys
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = {str(tmp_path / "cache")!r}
            import torch, opbridge

            DTYPE = getattr(torch, sys.argv[1])

            @opbridge.op("tests.edited::Scale")
            def scale(x: torch.Tensor) -> torch.Tensor:
                return (x * 2).to(DTYPE)

            got = torch.compile(lambda t: scale(t) * 3 + 1, fullgraph=True)(torch.arange(4.0))
            print(got.dtype, got.tolist())
            """
        ),
        encoding="utf-8",
    )
    for dtype in ("float32", "float64", "float32"):
        done = subprocess.run(
            [sys.executable, str(script), dtype], capture_output=True, text=True, timeout=300, check=False
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.split() == [f"torch.{dtype}", "[1.0,", "7.0,", "13.0,", "19.0]"], dtype


def test_fx_symbolic_trace_records_an_op_call_as_one_node() -> None:
    """torch.fx.symbolic_trace (and FX-mode quantization) called the op with Proxy inputs, which it refused
    as "expects a torch.Tensor, got Proxy; wrap it with torch.as_tensor"."""

    @opbridge.op("tests.fx::Swish")
    def swish(x: torch.Tensor, beta: float = 1.0) -> torch.Tensor:
        return x * torch.sigmoid(beta * x)

    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return swish(x, beta=2.0) + 1

    traced = torch.fx.symbolic_trace(Model())
    calls = [n for n in traced.graph.nodes if n.op == "call_function" and "tests_fx__Swish" in str(n.target)]
    assert len(calls) == 1
    x = torch.randn(3, 4)
    torch.testing.assert_close(traced(x), swish.reference(x, beta=2.0) + 1)


def _positives(k: int) -> opbridge.OpDef:
    @opbridge.op(f"tests.def::Positives{k}", shape=lambda x: opbridge.TensorInfo((opbridge.SymDim(),), torch.int64))
    def positives(x: torch.Tensor) -> torch.Tensor:
        return torch.nonzero(x > 0).flatten()

    return positives


def test_ops_of_data_dependent_sizes_under_torch_compile_without_fullgraph() -> None:
    """An op whose output size depends on the data is a graph break under torch.compile without fullgraph
    (and without capture_dynamic_output_shape_ops). Dynamo then compiled opbridge's own code around each
    such call, one code object for every op: ten ops took 58 frames and hit its recompile limit (and ran
    3x slower than eagerly). That code runs as Python now: only the model's frame is compiled."""
    from torch._dynamo.utils import counters

    ops = [_positives(k) for k in range(10)]  # (more than dynamo's recompile limit of 8)

    def model(x: torch.Tensor) -> torch.Tensor:
        total = x.sum()
        for k, op in enumerate(ops):
            total = total + op(x + k / 10).sum()
        return total

    x = torch.randn(64, generator=torch.Generator().manual_seed(5))
    torch._dynamo.reset()
    counters.clear()
    with torch._dynamo.config.patch(recompile_limit=8):
        compiled = torch.compile(model, backend="eager")
        for _ in range(2):
            assert torch.equal(compiled(x), model(x))
    assert not [k for k in counters["unimplemented"] if "recompile limit" in k]
    assert counters["frames"]["total"] <= 2, dict(counters["frames"])
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        torch._dynamo.reset()
        single = torch.compile(lambda t: ops[0](t).sum() + 1, backend="eager", fullgraph=True)
        assert torch.equal(single(x), ops[0](x).sum() + 1)


def test_a_shape_rule_that_is_not_a_function_is_refused_at_definition() -> None:
    """``shape=5`` was taken, and every call then raised "'int' object is not callable" (export dumped
    torch's fake-tensor traceback); it is refused as register_shape(5) is, and the op is not defined."""

    def five(x: torch.Tensor) -> torch.Tensor:
        return x

    with pytest.raises(OpDefinitionError, match=r"tests\.def::ShapeFive: shape takes a function .* got int\."):
        opbridge.op("tests.def::ShapeFive", shape=5)(five)  # type: ignore[arg-type]
    assert opbridge.find_op("tests.def", "ShapeFive", 1) is None


@pytest.mark.parametrize(
    ("attrs", "want"),
    [
        ({"alpha": np.float32(0.25)}, 0.25 + 3 + 1),
        ({"alpha": np.int64(2)}, 2 + 3 + 1),
        ({"count": np.int64(5)}, 0.5 + 5 + 1),
        ({"count": np.uint8(7)}, 0.5 + 7 + 1),
        ({"flag": np.bool_(False)}, 0.5 + 3),
        ({"weights": [np.float32(1.5), np.float64(2.0)], "dims": (np.int32(1), np.int64(2))}, 0.5 + 3 + 1),
    ],
    ids=["float32-for-float", "int64-for-float", "int64-for-int", "uint8-for-int", "bool_-for-bool", "lists"],
)
def test_numpy_scalars_are_taken_for_attributes_of_their_kind(attrs: dict, want: float) -> None:
    """np.float32(0.5) for a FLOAT attribute was refused ("expects float, got float32"); numpy scalars of
    the attribute's kind are taken as the Python value they hold."""
    extra = len("这是字符串属性") + sum(attrs.get("weights", [1.0, 2.5])) + 3 + 2
    y, _ = everything(torch.ones(2, dtype=torch.float64), None, **attrs)
    assert y.tolist() == [want + extra] * 2
    normalized = [everything.spec.attribute(k).normalize(v) for k, v in attrs.items()]
    for value in normalized:
        for item in value if isinstance(value, tuple) else (value,):
            assert type(item) in (float, int, bool)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("count", np.float32(3.0), "attribute 'count' expects int, got float32"),
        ("count", 3.0, "attribute 'count' expects int, got float"),
        ("alpha", np.bool_(True), "attribute 'alpha' expects float, got bool"),
        ("flag", np.int64(1), "attribute 'flag' expects bool, got int64"),
        ("alpha", np.complex64(1), "attribute 'alpha' expects float, got complex64"),
    ],
    ids=["int-got-np-float32", "int-got-float", "float-got-np-bool", "bool-got-np-int64", "float-got-np-complex64"],
)
def test_numpy_scalars_of_another_kind_are_still_refused(name: str, value: object, message: str) -> None:
    with pytest.raises(opbridge.OpCallError, match=message):
        everything(torch.zeros(2), None, **{name: value})


def test_a_tensor_parameter_with_a_default_is_refused_with_the_optional_form() -> None:
    """``x: torch.Tensor = None`` made a required input, and calling without it said "missing tensor input"."""
    with pytest.raises(OpDefinitionError, match=r"'x' has a default \(None\).*Optional\[torch.Tensor\] = None"):

        @opbridge.op("tests.defaults::Fill")
        def fill(x: torch.Tensor = None, n: int = 3) -> torch.Tensor:  # type: ignore[assignment]
            return x


@pytest.mark.parametrize("shape", [(2, 3), (4,), ()], ids=["2d", "1d", "0d"])
def test_a_shape_rule_returning_a_shape_is_named(shape: tuple[int, ...]) -> None:
    """A rule returning ``x.shape`` was told about output counts (2-D, 0-D) or an int output (1-D)."""

    @opbridge.op("tests.rules::Double")
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    double.register_shape(lambda x: x.shape)
    with pytest.raises(
        OpDefinitionError, match=r"returned a shape \(Size .*return opbridge.TensorInfo\(shape, dtype\)"
    ):
        double(torch.zeros(shape))


@opbridge.op("tests.def::MulRuleless")
def _mul_ruleless(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * w


def test_a_reference_failing_on_meta_tensors_of_an_eager_call_is_named_so() -> None:
    """An eager call on a meta and a CPU tensor blamed "the fake tensors of torch.compile and torch.export",
    which the caller never used."""
    with pytest.raises(OpDefinitionError, match=r"raised RuntimeError on the meta tensors it was called with") as err:
        _mul_ruleless(torch.empty(2, device="meta"), torch.empty(2))
    assert "torch.compile" not in str(err.value)


def test_a_rule_comparing_dynamic_dims_is_told_of_symdim() -> None:
    """A rule broadcasting with max() (or torch.broadcast_shapes) on dynamic dims was told to compute its
    dims arithmetically, which broadcasting cannot, and not of opbridge.SymDim()."""
    with pytest.raises(TypeError, match=r"cannot branch on its value \(max\(\), min\(\), .*opbridge.SymDim\(\)"):
        max(opbridge.SymDim("a"), opbridge.SymDim("b"))
