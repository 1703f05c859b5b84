"""ONNX -> TensorRT engine builds with generated plugins (CPU: tensorrt_rtx builds, never runs, engines).

Good builds run in this process (opbridge's loader prevents the RTX parser's known abort);
fault builds run through the default child process, so an abort could not end the test run.
"""

from __future__ import annotations

import ast
import json
import logging
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from _detection_cases import CASES, _Call
from conftest import EXPORTERS, run_script
from onnx import TensorProto, helper

import opbridge
from opbridge.cli import main as cli_main
from opbridge.examples.seeds import SEED_MODELS, SeedModel
from opbridge.tensorrt import backend_name, build_engine, parse_with_tensorrt

pytestmark = pytest.mark.skipif(
    backend_name() is None, reason="neither tensorrt nor tensorrt_rtx is installed (pip install tensorrt-rtx-cu13)"
)

USER_OPS = textwrap.dedent(
    '''
    from typing import Optional

    import torch
    import opbridge
    from opbridge import TensorInfo

    @opbridge.op("acme_trt::Blend")
    def Blend(x: torch.Tensor, y: torch.Tensor, alpha: float = 0.1, steps: int = 3, flip: bool = False,
              tag: str = "größe", weights: list[float] = [0.5, 0.25], dims: list[int] = [1, -2, 7],
              names: list[str] = ["a", "", "日本"]) -> torch.Tensor:
        """No shape rule: TensorRT gets "same as input 0" after the reference agrees on meta tensors."""
        return x * alpha + y

    @opbridge.op("acme_trt::Repeat2", shape=lambda x: TensorInfo((*x.shape[:-1], x.shape[-1] * 2), x.dtype))
    def Repeat2(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, x], dim=-1)

    @opbridge.op("acme_trt::EveryOther", shape=lambda x: TensorInfo((*x.shape[:-1], (x.shape[-1] - 1) // 2 + 1), x.dtype))
    def EveryOther(x: torch.Tensor) -> torch.Tensor:
        return x[..., ::2] * 1

    class UserNet(torch.nn.Module):
        def forward(self, x):
            return EveryOther(Repeat2(Blend(x, x, alpha=0.25, tag="größe", names=["a", "", "日本"], dims=[4, -5])))

    def user_net():
        return UserNet(), (torch.randn(2, 3, 6, generator=torch.Generator().manual_seed(0)),)

    @opbridge.op("faults::BadShape")
    def BadShape(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    @BadShape.register_shape
    def _bad(x):
        raise ValueError("this rule fails on purpose")

    @opbridge.op("faults::HalfOnly")
    def HalfOnly(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    HalfOnly.register_gpu_kernel(lambda i, o, a, s: o[0].copy_(i[0] * 2), dtypes=("float16",))

    @opbridge.op("faults::Shrink")
    def FaultsShrink(x: torch.Tensor, lambd: float = 0.5) -> torch.Tensor:
        """Named like the standard Shrink, and not one."""
        return x * 3

    @opbridge.op("acme_trt::AddOpt")
    def AddOpt(x: torch.Tensor, b: Optional[torch.Tensor] = None) -> torch.Tensor:
        return x if b is None else x + b

    @opbridge.op("faults::Lookup")
    def Lookup(x: torch.Tensor, plugin_version: str = "") -> torch.Tensor:
        """An attribute named like one TensorRT's parser takes for itself."""
        return x * 1

    @opbridge.op("faults::Doubled")
    def Doubled(x: torch.Tensor) -> torch.Tensor:
        return torch.cat((x, x))  # dim 0 twice the input's: no input dim, no constant

    @opbridge.op(
        "mixed_trt::ArgTop",
        shape=lambda x: (TensorInfo((x.shape[0], 1), x.dtype), TensorInfo((x.shape[0], 1), torch.int32)),
    )
    def ArgTop(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A floating-point value and an int32 index per row."""
        v, i = x.max(dim=-1, keepdim=True)
        return v, i.to(torch.int32)

    @opbridge.op("mixed_trt::Take", shape=lambda x, idx: TensorInfo((idx.shape[0],), x.dtype))
    def Take(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Float data, int64 indices (an input dtype its GPU kernel declares)."""
        return x[idx]

    Take.register_gpu_kernel(lambda i, o, a, s: o[0].copy_(i[0][i[1]]), dtypes=("float32", "float16", "int64"))

    @opbridge.op("clash_a::Widen", shape=lambda x: TensorInfo((x.shape[0], x.shape[1] * 2), x.dtype))
    def WidenA(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, x], 1)

    @opbridge.op("clash_b::Widen", shape=lambda x: TensorInfo((x.shape[0], x.shape[1] * 3), x.dtype))
    def WidenB(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, x, x], 1)

    @opbridge.op("versioned_trt::Shrink", version=2, shape=lambda x: TensorInfo((x.shape[0], 1), x.dtype))
    def ShrinkV2(x: torch.Tensor) -> torch.Tensor:
        return x.sum(1, keepdim=True)

    @opbridge.op("rules_trt::RowArgmax")
    def RowArgmax(x: torch.Tensor) -> torch.Tensor:
        return x.argmax(1).to(torch.int32)

    @RowArgmax.register_shape
    def _row_argmax(x):
        n, c = x.shape  # a rule for rank 2 only
        return TensorInfo((n,), torch.int32)

    @opbridge.op("rules_trt::TopIdx")
    def TopIdx(x: torch.Tensor, k: int = 2) -> torch.Tensor:
        return x.topk(k, 1).indices.to(torch.int32)

    @TopIdx.register_shape
    def _top_idx(x, k):
        n, c = x.shape
        if c < k:  # branches on the column count: fixed in the model, so an int here
            raise ValueError(f"k={k} exceeds the {c} columns")
        return TensorInfo((n, k), torch.int32)

    @opbridge.op("rules_trt::SumArgmax")
    def SumArgmax(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (x + y).argmax(1).to(torch.int32)

    @SumArgmax.register_shape
    def _sum_argmax(x, y):
        n, c = x.shape
        if (n, c) != tuple(y.shape):  # one named ONNX dim each: equal
            raise ValueError(f"x is {x.shape}, y {y.shape}")
        return TensorInfo((n,), torch.int32)

    @opbridge.op("versioned_trt::Halve", version=2, shape=lambda x: TensorInfo(x.shape, x.dtype))
    def HalveV2(x: torch.Tensor) -> torch.Tensor:
        return x * 0.5

    @opbridge.op("rules_trt::AddSame")
    def AddSame(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y

    @AddSame.register_shape
    def _same(x, y):
        if x.shape[0] != y.shape[0]:  # one named ONNX dim: TensorRT proves them equal
            raise ValueError(f"batch {x.shape[0]} != {y.shape[0]}")
        return TensorInfo(x.shape, x.dtype)

    @opbridge.op("rules_trt::Halves")
    def Halves(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Ceil-division by unary minus, and a remainder."""
        return x[:, ::2] * 1, x[:, : x.shape[1] % 3] * 1

    @Halves.register_shape
    def _halves(x):
        n, w = x.shape
        return TensorInfo((n, -(-w // 2)), x.dtype), TensorInfo((n, w % 3), x.dtype)

    @opbridge.op("faults::BoolDim", shape=lambda x: TensorInfo((True, *x.shape[1:]), x.dtype))
    def BoolDim(x: torch.Tensor) -> torch.Tensor:
        return x[:1] * 1

    @opbridge.op("faults::Rank9", shape=lambda x: TensorInfo((*x.shape, 1, 1, 1, 1, 1, 1), x.dtype))
    def Rank9(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(*x.shape, 1, 1, 1, 1, 1, 1)
    '''
)


def _profile(seed: SeedModel, args: tuple[Any, ...]) -> dict[str, tuple[tuple[int, ...], ...]]:
    """min/opt/max over the example input and the seed's extra shape sets."""
    out = {}
    for name, tensor in zip(seed.input_names, args):
        shapes = [tuple(tensor.shape)] + [tuple(s[name]) for s in seed.shapes]
        out[name] = (
            tuple(min(d) for d in zip(*shapes)),
            tuple(tensor.shape),
            tuple(max(d) for d in zip(*shapes)),
        )
    return out


@pytest.fixture(scope="module")
def user_ops_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("trt_user_ops") / "trt_user_ops.py"
    path.write_text(USER_OPS, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def user_model(user_ops_file: Path) -> Path:
    from opbridge._loading import load_module

    module = load_module(str(user_ops_file))
    model, args = module.user_net()
    out = user_ops_file.with_name("user_net.onnx")
    opbridge.export(
        model,
        args,
        out,
        exporter="torchscript",
        input_names=["x"],
        output_names=["y"],
        dynamic_axes={"x": {0: "batch", 2: "width"}, "y": {0: "batch", 2: "owidth"}},
        functions=False,
    )
    return out


def _single_node_model(path: Path, op_type: str, domain: str, elem: int = TensorProto.FLOAT) -> Path:
    node = helper.make_node(op_type, ["x"], ["y"], domain=domain, name=f"{op_type}_node")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", elem, ["batch", 3, 5])],
        [helper.make_tensor_value_info("y", elem, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)])
    onnx.save(model, path)
    return path


SMALL = {"x": ((1, 3, 5), (2, 3, 5), (3, 3, 5))}


def test_a_body_node_taking_an_attribute_from_its_call_builds(user_ops_file: Path, tmp_path: Path) -> None:
    """A node in a function body that takes its attribute by reference (``ref_attr_name``, as a body
    forwarding its op's attribute does) failed opbridge's check before the parse ("Cannot get value of
    reference attribute"), where TensorRT's parser imports the body with the call's value."""
    alpha = helper.make_attribute_ref("alpha", onnx.AttributeProto.FLOAT)
    inner = helper.make_node("Blend", ["x", "x"], ["y"], domain="acme_trt")
    inner.attribute.append(alpha)
    outer = helper.make_function(
        "wrap", "Outer", ["x"], ["y"], [inner], [helper.make_opsetid("acme_trt", 1)], attributes=["alpha"]
    )
    graph = helper.make_graph(
        [helper.make_node("Outer", ["x"], ["y"], domain="wrap", alpha=0.5, name="outer")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("wrap", 1), helper.make_opsetid("acme_trt", 1)]
    path = tmp_path / "ref_attr.onnx"
    onnx.save(helper.make_model(graph, opset_imports=opsets, functions=[outer]), path)
    report = build_engine(path, None, profiles=SMALL, ops=[str(user_ops_file)])
    assert report.ok and report.errors == [], report.describe()


def test_a_body_node_given_an_int_beyond_int32_by_its_call_is_refused(user_ops_file: Path, tmp_path: Path) -> None:
    """The int32 check read the body node's own attribute, a reference with no value: a call passing 2**40,
    which the parser narrows in the plugin field, went through; so it did in lint and compat. The value is
    followed through a call inside another function's body too."""
    inner = helper.make_node("Blend", ["x", "x"], ["y"], domain="acme_trt", name="blend")
    inner.attribute.append(helper.make_attribute_ref("steps", onnx.AttributeProto.INT))
    middle_call = helper.make_node("Inner", ["x"], ["y"], domain="wrap", name="inner_call")
    forwarded = helper.make_attribute_ref("steps", onnx.AttributeProto.INT)
    forwarded.ref_attr_name = "n"  # (Inner's steps is Outer's n)
    middle_call.attribute.append(forwarded)
    opsets = [helper.make_opsetid("acme_trt", 1), helper.make_opsetid("wrap", 1)]
    functions = [
        helper.make_function("wrap", "Inner", ["x"], ["y"], [inner], opsets, attributes=["steps"]),
        helper.make_function("wrap", "Outer", ["x"], ["y"], [middle_call], opsets, attributes=["n"]),
    ]
    graph = helper.make_graph(
        [helper.make_node("Outer", ["x"], ["y"], domain="wrap", n=2**40, name="outer")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), *opsets], functions=functions)
    path = tmp_path / "ref_int.onnx"
    onnx.save(model, path)
    report = build_engine(path, None, profiles=SMALL, ops=[str(user_ops_file)])
    assert not report.ok
    assert any(
        "attribute 'steps' (from call outer) holds 1099511627776, outside int32" in e[2] for e in report.errors
    ), report.describe()
    (finding,) = [f for f in opbridge.graph.lint_model(path) if f.code == "trt-int-attr-overflow"]
    assert finding.node == "wrap::Inner/blend (from call outer)"
    verdicts = opbridge.graph.check_compat(path, "tensorrt", real=False).nodes
    assert any("'steps' = 1099511627776 (from call outer)" in v.reason for v in verdicts), verdicts


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("seed", SEED_MODELS, ids=lambda s: s.name)
def test_seed_model_builds_with_dynamic_profile(
    seed: SeedModel, exporter: str, seed_export: Any, tmp_path: Path
) -> None:
    result = seed_export(seed.name, exporter, functions=False)
    assert result.custom_nodes, "the model must hold the custom nodes TensorRT has to import as plugins"
    _, args = seed.factory()
    profiles = _profile(seed, args)
    engine = tmp_path / f"{seed.name}.engine"
    report = build_engine(result.path, engine, profiles=profiles, isolate=False)
    assert report.ok, report.describe()
    assert engine.stat().st_size == report.engine_bytes > 0
    nodes = {n.name for n in result.custom_nodes}
    assert set(report.plugin_shapes) == nodes, "every custom node must have become a generated plugin layer"
    if seed.name == "super_resolution":
        # The output's spatial range is size_tensor's: the shape rule ran as TensorRT expressions.
        (shapes,) = report.plugin_shapes.values()
        (out_min, out_max), size_range = shapes["outputs"][0], shapes["inputs"][1]
        assert out_min[2:] == size_range[0][2:] and out_max[2:] == size_range[1][2:]
        assert out_min[:2] == shapes["inputs"][0][0][:2]


def test_user_op_model_builds_and_shape_expressions_follow_the_rules(user_model: Path, user_ops_file: Path) -> None:
    profiles = {"x": ((1, 3, 2), (2, 3, 6), (4, 3, 9))}
    report = build_engine(user_model, user_model.with_suffix(".engine"), profiles=profiles, ops=[str(user_ops_file)])
    assert report.ok, report.describe()
    by_op = {v["op"]: v for v in report.plugin_shapes.values()}
    assert by_op["Blend"]["outputs"] == [[[1, 3, 2], [4, 3, 9]]]
    assert by_op["Repeat2"]["outputs"] == [[[1, 3, 4], [4, 3, 18]]]  # W * 2
    assert by_op["EveryOther"]["outputs"] == [[[1, 3, 2], [4, 3, 9]]]  # (W - 1) // 2 + 1 on 4..18


def test_tensorrt_rtx_imported_first_refuses_in_process_plugins_instead_of_aborting(
    user_model: Path, user_ops_file: Path, tmp_path: Path
) -> None:
    """A process that imported tensorrt_rtx itself, before opbridge's loader, has a parser that would abort at
    the first plugin node: in-process work refuses such a model by name, and the child process still builds."""
    out = run_script(
        tmp_path,
        f"""
        import tensorrt_rtx  # before opbridge: its libraries load without the one the parser dlopens
        from opbridge.errors import BackendUnavailableError
        from opbridge.tensorrt import build_engine, parse_with_tensorrt

        try:
            parse_with_tensorrt({str(user_model)!r}, ops=[{str(user_ops_file)!r}], isolate=False)
        except BackendUnavailableError as exc:
            print("refused:", exc)
        print("isolated:", parse_with_tensorrt({str(user_model)!r}, ops=[{str(user_ops_file)!r}]).ok)
        """,
    )
    assert "refused: tensorrt_rtx was imported before opbridge" in out, out
    assert "(acme_trt::Blend)" in out and "isolate=True" in out, out
    assert "isolated: True" in out, out


def test_parser_hands_attributes_to_the_plugin_intact(user_model: Path) -> None:
    """The attributes the plugin decodes from the parser's fields are the node's (UTF-8, lists, bool)."""
    from opbridge._loading import load_module

    module = load_module(str(user_model.with_name("trt_user_ops.py")))
    seen: list[dict[str, Any]] = []

    def rule(x: Any, y: Any, **attrs: Any) -> Any:
        seen.append(attrs)
        return opbridge.TensorInfo(x.shape, x.dtype)

    module.Blend.register_shape(rule)
    try:
        report = parse_with_tensorrt(user_model, isolate=False)
    finally:
        module.Blend.shape_rule = None
    assert report.ok, report.errors
    assert seen[-1] == {
        "alpha": 0.25,
        "steps": 3,
        "flip": False,
        "tag": "größe",
        "weights": (0.5, 0.25),
        "dims": (4, -5),
        "names": ("a", "", "日本"),
    }


@pytest.mark.parametrize(
    ("op_type", "elem", "message"),
    [
        ("BadShape", TensorProto.FLOAT, "opbridge: get_output_shapes: this rule fails on purpose"),
        (
            "HalfOnly",
            TensorProto.FLOAT,
            (
                "input 'x' is float32, but the op's GPU kernel supports only float16; cast the tensor in the model, "
                "or register a kernel for float32"
            ),
        ),
        ("Doubled", TensorProto.FLOAT, "declares no shape rule, and dim 0 of its output 0"),
        ("Unknown", TensorProto.FLOAT, "no op named Unknown is defined"),
    ],
    ids=["raising-shape-rule", "unsupported-dtype", "no-rule-computed-dim", "unknown-op"],
)
def test_faults_fail_the_build_with_opbridge_message(
    op_type: str, elem: int, message: str, user_ops_file: Path, tmp_path: Path
) -> None:
    model = _single_node_model(tmp_path / f"{op_type}.onnx", op_type, "faults", elem)
    engine = tmp_path / "out.engine"
    report = build_engine(model, engine, profiles=SMALL, ops=[str(user_ops_file)])
    assert not report.ok
    assert not engine.exists()
    assert any(message in m for _, _, m in report.errors), report.describe()
    assert all("cudaError 35" not in m for _, _, m in report.errors)
    if op_type != "Unknown":
        assert (f"{op_type}_node", op_type) in [(n, o) for n, o, _ in report.errors]


@opbridge.op("tests.trt::SizedLike")
def sized_like(x: torch.Tensor, size_like: torch.Tensor) -> torch.Tensor:
    """x's first pixel over size_like's last two dims: no shape rule, its output dims are input dims."""
    return x[:, :, :1, :1].expand(x.shape[0], x.shape[1], size_like.shape[2], size_like.shape[3]) * 1


def test_a_plugin_without_a_rule_takes_the_shape_its_reference_gives(tmp_path: Path) -> None:
    """Without a shape rule, a plugin took input 0's shape and refused any other, although the reference's
    derived shape ([in0_d0, in0_d1, in1_d2, in1_d3]) said where each output dim comes from."""
    path = tmp_path / "sized.onnx"
    model = helper.make_model(
        helper.make_graph(
            [helper.make_node("SizedLike", ["x", "size_like"], ["y"], domain="tests.trt", name="sized")],
            "g",
            [
                helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, "h", "w"]),
                helper.make_tensor_value_info("size_like", TensorProto.FLOAT, [1, 1, "ho", "wo"]),
            ],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        ),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("tests.trt", 1)],
    )
    onnx.save(model, path)
    profiles = {
        "x": ((1, 3, 4, 4), (2, 3, 8, 8), (4, 3, 16, 16)),
        "size_like": ((1, 1, 2, 3), (1, 1, 5, 7), (1, 1, 9, 11)),
    }
    report = build_engine(path, None, profiles=profiles, isolate=False)
    assert report.ok, report.describe()
    assert report.plugin_shapes["sized"]["outputs"] == [[[1, 3, 2, 3], [4, 3, 9, 11]]]


@opbridge.op("tests.trt::ThreeDtypes")
def three_dtypes(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """No shape rule, and outputs of other dtypes than its input."""
    return x * 2, (x * 10).floor().to(torch.int64), x > 0


def test_a_plugin_without_a_rule_takes_the_dtypes_its_reference_gives(tmp_path: Path) -> None:
    """Without a shape rule, every output took input 0's dtype, and the build failed on the int64 and bool
    outputs saying the (absent) rule gave dtypes that depend on ranks."""
    path = tmp_path / "three.onnx"
    outputs = [("a", TensorProto.FLOAT), ("b", TensorProto.INT64), ("c", TensorProto.BOOL)]
    model = helper.make_model(
        helper.make_graph(
            [helper.make_node("ThreeDtypes", ["x"], [n for n, _ in outputs], domain="tests.trt", name="three")],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 5])],
            [helper.make_tensor_value_info(n, elem, [4, 5]) for n, elem in outputs],
        ),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("tests.trt", 1)],
    )
    onnx.save(model, path)
    report = build_engine(path, None, isolate=False)
    assert report.ok, report.describe()


@opbridge.op("tests.trt::ByteMask")
def byte_mask(x: torch.Tensor) -> torch.Tensor:
    return (x > 0).to(torch.uint8)


def test_a_uint8_plugin_output_is_refused_by_name(tmp_path: Path) -> None:
    """TensorRT refused a plugin's uint8 output in words that named neither the op nor a way out."""
    path = tmp_path / "bytes.onnx"
    model = helper.make_model(
        helper.make_graph(
            [helper.make_node("ByteMask", ["x"], ["m"], domain="tests.trt", name="mask")],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 5])],
            [helper.make_tensor_value_info("m", TensorProto.UINT8, [4, 5])],
        ),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("tests.trt", 1)],
    )
    onnx.save(model, path)
    report = build_engine(path, None, isolate=False)
    assert not report.ok
    assert "tests.trt::ByteMask: output 0 is uint8, which TensorRT lets no plugin make" in report.describe()


def _narrower_rule(x: Any) -> opbridge.TensorInfo:
    if isinstance(x.shape[1], int) and x.shape[1] > 6:
        raise ValueError(f"Narrower takes up to 6 columns, got {x.shape[1]}")
    return opbridge.TensorInfo((x.shape[0], x.shape[1] - 1), x.dtype)


@opbridge.op("tests.trt::Narrower", shape=_narrower_rule)
def narrower(x: torch.Tensor) -> torch.Tensor:
    return x[:, 1:] * 1


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        (
            ((2, 0), (2, 3), (2, 5)),
            r"output 0 takes sizes below 0 \(\[2, -1..4\]\) for inputs in the profile \(x \[2, 0..5\]\)",
        ),
        (
            ((2, 1), (2, 3), (2, 100)),
            r"the shape rule refuses the profile's largest inputs \(x \[2, 100\]\): ValueError",
        ),
    ],
    ids=["negative-size", "refused-corner"],
)
def test_a_profile_the_op_does_not_take_fails_the_build(tmp_path: Path, columns: Any, message: str) -> None:
    """The shape rule saw TensorRT's symbolic dims only: a profile reaching sizes it refuses, or where its
    output sizes go below 0, built an engine (the report even listed the negative range)."""
    path = tmp_path / "narrower.onnx"
    model = helper.make_model(
        helper.make_graph(
            [helper.make_node("Narrower", ["x"], ["y"], domain="tests.trt", name="narrow")],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, "c"])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, "c1"])],
        ),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("tests.trt", 1)],
    )
    onnx.save(model, path)
    report = build_engine(path, None, profiles={"x": columns}, isolate=False)
    assert not report.ok
    assert re.search(message, report.describe()), report.describe()
    fine = build_engine(path, None, profiles={"x": ((2, 1), (2, 3), (2, 6))}, isolate=False)
    assert fine.ok, fine.describe()


@opbridge.op("tests.trt::Broadcast")
def broadcast(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y


@broadcast.register_shape
def _broadcast(x: Any, y: Any) -> opbridge.TensorInfo:
    return opbridge.TensorInfo(tuple(b if a == 1 else a for a, b in zip(x.shape, y.shape)), x.dtype)


@opbridge.op("tests.trt::BroadcastInts")
def broadcast_ints(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y


@broadcast_ints.register_shape
def _broadcast_ints(x: Any, y: Any) -> opbridge.TensorInfo:
    # (a dynamic dim is not an int: this takes x's dim even where it is 1)
    return opbridge.TensorInfo(
        tuple(b if isinstance(a, int) and a == 1 else a for a, b in zip(x.shape, y.shape)), x.dtype
    )


def _broadcast_model(path: Path, op_type: str, columns: int | str = "cx") -> Path:
    t = helper.make_tensor_value_info
    return _model(
        path,
        [helper.make_node(op_type, ["x", "y"], ["z"], domain="tests.trt", name="bcast")],
        [t("x", TensorProto.FLOAT, [2, columns]), t("y", TensorProto.FLOAT, [2, 5])],
        [t("z", TensorProto.FLOAT, None)],
        {"tests.trt": 1},
    )


@pytest.mark.parametrize(
    ("op_type", "message"),
    [
        (
            "Broadcast",
            r"tests.trt::Broadcast: the shape rule compares TrtDim\(x.shape\[1\]\) with 1, which TensorRT cannot "
            r"decide while the engine is built .*or make that dim static in the model",
        ),
        (
            "BroadcastInts",
            r"tests.trt::BroadcastInts: at the profile's smallest inputs \(x \[2, 1\], y \[2, 5\]\) the shape "
            r"rule gives output 0 \('output'\) the shape \[2, 5\], but the expressions it gave TensorRT for the "
            r"dynamic dims make it \[2, 1\] \(TensorRT's range for it: \[2, 1..8\]\)",
        ),
    ],
    ids=["undecidable-comparison", "branch-on-dynamic-dim"],
)
def test_a_rule_that_branches_on_a_dynamic_dim_fails_the_build(tmp_path: Path, op_type: str, message: str) -> None:
    """Broadcasting ``b if a == 1 else a`` over a dynamic a: ``a == 1`` was False, and the engine built with
    output [2, 1..8] where PyTorch and ONNX Runtime give [2, 5] at x [2, 1]."""
    path = _broadcast_model(tmp_path / "bcast.onnx", op_type)
    report = build_engine(path, None, profiles={"x": ((2, 1), (2, 1), (2, 8))}, isolate=False)
    assert not report.ok
    assert re.search(message, report.describe()), report.describe()
    # a dim static in the model is an int in the rule, which may branch on it
    static = _broadcast_model(tmp_path / "static.onnx", op_type, 1)
    fixed = build_engine(static, None, isolate=False)
    assert fixed.ok, fixed.describe()
    assert fixed.plugin_shapes["bcast"]["outputs"] == [[[2, 5], [2, 5]]]


@opbridge.op("tests.trt::CountAbove")
def count_above(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """No shape rule; rank-2 data, rank-1 index and an int32 output."""
    n, c = x.shape
    (k,) = index.shape
    return (x[index] > 0).sum(1).to(torch.int32)


def test_a_plugin_without_a_rule_takes_its_dtypes_at_its_inputs_ranks(tmp_path: Path) -> None:
    """Inputs of different ranks: the reference ran only at one rank shared by all inputs, failed, and the
    output was taken to be float32; the build then blamed "the shape rule" (there was none) for an int32."""
    t = helper.make_tensor_value_info

    def model(name: str) -> Path:
        return _model(
            tmp_path / f"count{name or '_unnamed'}.onnx",
            [helper.make_node("CountAbove", ["x", "index"], ["y"], domain="tests.trt", name=name)],
            [t("x", TensorProto.FLOAT, [4, 3]), t("index", TensorProto.INT64, [2])],
            [t("y", TensorProto.INT32, None)],
            {"tests.trt": 1},
        )

    report = build_engine(model("count"), None, isolate=False)
    assert report.ok, report.describe()
    assert report.plugin_shapes["count"]["outputs"] == [[[2], [2]]]
    # a node without a name: the build cannot tell its plugin the ranks, and asks for a rule
    unnamed = build_engine(model(""), None, isolate=False)
    assert not unnamed.ok
    text = unnamed.describe()
    assert "tests.trt::CountAbove declares no shape rule" in text and "@CountAbove.register_shape" in text, text
    assert "the shape rule gives" not in text


@opbridge.op("tests.trt::Doubled64")
def doubled64(x: torch.Tensor) -> torch.Tensor:
    return x.double() * 2


def test_a_batched_nms_node_asking_for_indices_is_refused_by_name(tmp_path: Path) -> None:
    """return_index=1 (a third output) is refused by every CPU path; the build took it, and the GPU kernel
    would have run the node as return_index=0."""
    t = helper.make_tensor_value_info
    node = helper.make_node(
        "TRTBatchedNMS",
        ["boxes", "scores"],
        ["dets", "labels"],
        domain="mmdeploy",
        name="nms",
        num_classes=3,
        keep_topk=4,
        return_index=1,
    )
    path = _model(
        tmp_path / "nms.onnx",
        [node],
        [t("boxes", TensorProto.FLOAT, [1, 6, 1, 4]), t("scores", TensorProto.FLOAT, [1, 6, 3])],
        [t("dets", TensorProto.FLOAT, None), t("labels", TensorProto.INT32, None)],
        {"mmdeploy": 1},
    )
    report = build_engine(path, None, isolate=False)
    assert not report.ok
    assert "return_index=1 (a third output) is not supported" in report.describe(), report.describe()


def test_a_float64_output_is_refused_by_name(tmp_path: Path) -> None:
    """An op without a GPU kernel was told to register one for float64, which TensorRT has no tensors of."""
    path = _model(
        tmp_path / "double.onnx",
        [helper.make_node("Doubled64", ["x"], ["y"], domain="tests.trt", name="double")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)],
        {"tests.trt": 1},
    )
    report = build_engine(path, None, isolate=False)
    assert not report.ok
    text = report.describe()
    assert "tests.trt::Doubled64: output 'output' is float64, and TensorRT has no float64 tensors" in text, text
    assert "register a kernel" not in text


def test_an_op_named_like_a_standard_op_becomes_its_plugin(user_ops_file: Path, tmp_path: Path) -> None:
    """faults::Shrink is no ONNX Shrink: build_engine tags the node with plugin_namespace (in memory),
    which makes the parser take the plugin rather than its own Shrink importer."""
    model = _single_node_model(tmp_path / "shrink.onnx", "Shrink", "faults")
    report = build_engine(model, None, profiles=SMALL, ops=[str(user_ops_file)], isolate=False)
    assert report.ok, report.describe()
    assert report.plugin_shapes["Shrink_node"] == {
        "op": "Shrink",
        "inputs": [[[1, 3, 5], [3, 3, 5]]],
        "outputs": [[[1, 3, 5], [3, 3, 5]]],
    }


def test_a_node_name_with_a_nul_is_refused_by_name(tmp_path: Path) -> None:
    """TensorRT cuts names at a NUL: two nodes "bad\\0a" and "bad\\0b" failed as one "bad"."""
    path = tmp_path / "nul.onnx"
    model = helper.make_model(
        helper.make_graph(
            [
                helper.make_node("Relu", ["x"], ["y"], name="bad\x00a"),
                helper.make_node("Relu", ["y"], ["z"], name="ok"),
            ],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
            [helper.make_tensor_value_info("z", TensorProto.FLOAT, [4])],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    onnx.save(model, path)
    report = build_engine(path, None, isolate=False)
    assert not report.ok
    assert "node name 'bad\\x00a' holds a NUL character; TensorRT cuts names there" in report.describe()


def test_declared_dtype_builds_strongly_typed_fp16(user_ops_file: Path, tmp_path: Path) -> None:
    model = _single_node_model(tmp_path / "half.onnx", "HalfOnly", "faults", TensorProto.FLOAT16)
    report = build_engine(model, None, profiles=SMALL, ops=[str(user_ops_file)])
    assert report.ok, report.describe()


def test_int_attribute_beyond_int32_is_refused(tmp_path: Path) -> None:
    node = helper.make_node("MyStrangeOp2", ["a", "b", "c"], ["y"], domain="opbridge", int_attr1=2**40)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in "abc"],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    path = tmp_path / "wide.onnx"
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("opbridge", 1)]), path
    )
    report = parse_with_tensorrt(path)
    assert not report.ok
    assert "attribute 'int_attr1' holds 1099511627776, outside int32" in report.errors[0][2]


def _model(path: Path, nodes: list[Any], inputs: list[Any], outputs: list[Any], domains: dict[str, int]) -> Path:
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    opsets = [helper.make_opsetid("", 17)] + [helper.make_opsetid(d, v) for d, v in domains.items()]
    onnx.save(helper.make_model(graph, opset_imports=opsets), path)
    return path


@pytest.mark.parametrize("elem", [TensorProto.FLOAT, TensorProto.FLOAT16], ids=["fp32", "fp16"])
def test_integer_tensors_next_to_floating_point_ones_build(elem: int, user_ops_file: Path, tmp_path: Path) -> None:
    """A plugin's integer outputs (indices, labels) have the dtype its shape rule gives, an integer
    input one its kernel declares; its floating-point tensors take the kernel's dtypes."""
    t = helper.make_tensor_value_info
    nodes = [
        helper.make_node("ArgTop", ["x"], ["v", "i"], domain="mixed_trt", name="argtop"),
        helper.make_node("Take", ["x1", "idx"], ["y"], domain="mixed_trt", name="take"),
    ]
    model = _model(
        tmp_path / "mixed.onnx",
        nodes,
        [t("x", elem, [4, 8]), t("x1", elem, [8]), t("idx", TensorProto.INT64, [3])],
        [t("v", elem, None), t("i", TensorProto.INT32, None), t("y", elem, None)],
        {"mixed_trt": 1},
    )
    report = build_engine(model, None, ops=[str(user_ops_file)], isolate=False)
    assert report.ok, report.describe()
    assert report.plugin_shapes["argtop"]["outputs"] == [[[4, 1], [4, 1]], [[4, 1], [4, 1]]]
    assert report.plugin_shapes["take"]["outputs"] == [[[3], [3]]]


def test_ops_of_one_name_in_two_domains_and_versions_above_1_build(user_ops_file: Path, tmp_path: Path) -> None:
    """The parser looks for version "1" under namespace "" unless a node says otherwise: the build
    tells it each node's domain and op version, so clash_b::Widen is not clash_a's and a version-2 op
    is found."""
    t = helper.make_tensor_value_info
    nodes = [
        helper.make_node("Widen", ["x"], ["b"], domain="clash_b", name="widen_b"),
        helper.make_node("Widen", ["x"], ["a"], domain="clash_a", name="widen_a"),
        helper.make_node("Shrink", ["x"], ["s"], domain="versioned_trt", name="shrink"),
    ]
    model = _model(
        tmp_path / "clash.onnx",
        nodes,
        [t("x", TensorProto.FLOAT, [2, 4])],
        [t(n, TensorProto.FLOAT, None) for n in "bas"],
        {"clash_a": 1, "clash_b": 1, "versioned_trt": 2},
    )
    report = build_engine(model, None, ops=[str(user_ops_file)], isolate=False)
    assert report.ok, report.describe()
    outputs = {node: shapes["outputs"] for node, shapes in report.plugin_shapes.items()}
    assert outputs == {"widen_b": [[[2, 12], [2, 12]]], "widen_a": [[[2, 8], [2, 8]]], "shrink": [[[2, 1], [2, 1]]]}
    assert not any(a.name.startswith("plugin_") for n in onnx.load(model).graph.node for a in n.attribute)


def test_shape_rules_compare_and_negate_tensorrt_dims(user_ops_file: Path, tmp_path: Path) -> None:
    """``!=`` on dims TensorRT proves equal (one named ONNX dim), unary minus and ``%`` in rules."""
    t = helper.make_tensor_value_info
    nodes = [
        helper.make_node("AddSame", ["x", "y"], ["z"], domain="rules_trt", name="add"),
        helper.make_node("Halves", ["z"], ["h", "r"], domain="rules_trt", name="halves"),
    ]
    model = _model(
        tmp_path / "rules.onnx",
        nodes,
        [t("x", TensorProto.FLOAT, ["N", "W"]), t("y", TensorProto.FLOAT, ["N", "W"])],
        [t("h", TensorProto.FLOAT, None), t("r", TensorProto.FLOAT, None)],
        {"rules_trt": 1},
    )
    profile = ((1, 3), (2, 5), (4, 10))
    report = build_engine(model, None, profiles={"x": profile, "y": profile}, ops=[str(user_ops_file)], isolate=False)
    assert report.ok, report.describe()
    assert report.plugin_shapes["add"]["outputs"] == [[[1, 3], [4, 10]]]
    # ceil(W / 2) over W in 3..10, and W % 3
    assert report.plugin_shapes["halves"]["outputs"] == [[[1, 2], [4, 5]], [[1, 0], [4, 2]]]


def test_nodes_the_plugin_cannot_serve_are_named(tmp_path: Path) -> None:
    """A node with fewer outputs than its op, or an optional input skipped before a given one
    (TensorRT passes plugin inputs without gaps), is named before TensorRT's own error."""
    import opbridge.ops.detection  # noqa: F401 - MMCVMultiLevelRoiAlign

    t = helper.make_tensor_value_info
    fewer = _model(
        tmp_path / "fewer.onnx",
        [helper.make_node("MyStrangeOp", ["a", "b", "c"], ["y"], domain="opbridge", name="strange")],
        [t(n, TensorProto.FLOAT, [2, 3]) for n in "abc"],
        [t("y", TensorProto.FLOAT, None)],
        {"opbridge": 1},
    )
    report = parse_with_tensorrt(fewer)
    assert not report.ok
    assert report.errors[0][:2] == ("strange", "MyStrangeOp")
    assert "the node has 1 output(s), but opbridge::MyStrangeOp has 2" in report.errors[0][2]
    gap = _model(
        tmp_path / "gap.onnx",
        [helper.make_node("MMCVMultiLevelRoiAlign", ["rois", "f0", "", "f2"], ["y"], domain="mmdeploy", name="mlra")],
        [t("rois", TensorProto.FLOAT, [4, 5])] + [t(f"f{i}", TensorProto.FLOAT, [1, 8, 16, 16]) for i in (0, 2)],
        [t("y", TensorProto.FLOAT, None)],
        {"mmdeploy": 1},
    )
    report = parse_with_tensorrt(gap)
    assert not report.ok
    assert "optional input(s) ['feat1'] are skipped before a given one" in report.errors[0][2]


def test_an_attribute_value_the_op_does_not_take_is_named(tmp_path: Path) -> None:
    """mode="mean" on an MMCVRoiAlign node (which takes "avg" or "max") is named before TensorRT parses, as the
    plugin's creator refuses it."""
    import opbridge.ops.detection  # noqa: F401 - MMCVRoiAlign

    t = helper.make_tensor_value_info
    node = helper.make_node("MMCVRoiAlign", ["f", "r"], ["y"], domain="mmdeploy", name="roi", mode="mean")
    model = _model(
        tmp_path / "mean.onnx",
        [node],
        [t("f", TensorProto.FLOAT, [1, 4, 8, 8]), t("r", TensorProto.FLOAT, [3, 5])],
        [t("y", TensorProto.FLOAT, None)],
        {"mmdeploy": 1},
    )
    report = parse_with_tensorrt(model)
    assert not report.ok
    assert report.errors[0][:2] == ("roi", "MMCVRoiAlign")
    assert (
        "the node has attribute 'mode' = 'mean' where mmdeploy::MMCVRoiAlign takes ['avg', 'max']"
        in (report.errors[0][2])
    )


def test_a_required_input_left_out_is_named(user_ops_file: Path, tmp_path: Path) -> None:
    """A node without a required input got "'NoneType' object has no attribute 'shape'" from the plugin's
    shape pass; the build names the input before TensorRT parses."""
    t = helper.make_tensor_value_info
    for inputs in (["x"], ["", "x"]):
        path = _model(
            tmp_path / "take_without_idx.onnx",
            [helper.make_node("Take", inputs, ["y"], domain="mixed_trt", name="take")],
            [t("x", TensorProto.FLOAT, [4])],
            [t("y", TensorProto.FLOAT, None)],
            {"mixed_trt": 1},
        )
        report = parse_with_tensorrt(path, ops=[str(user_ops_file)])
        assert not report.ok
        wanted = "'idx'" if inputs == ["x"] else "'x'"
        assert f"the node gives no {wanted}, which mixed_trt::Take requires (it takes x, idx)" in report.errors[0][2]
        assert not any("optional input" in m for _, _, m in report.errors)


def test_a_trailing_optional_input_named_empty_builds(user_ops_file: Path, tmp_path: Path) -> None:
    """``AddOpt(x, "")`` (the optional input left out by an empty name, valid ONNX) failed inside TensorRT
    ("addPluginV3 ... (input) != nullptr"); the empty name is dropped in memory, as a node of one input."""
    t = helper.make_tensor_value_info
    path = _model(
        tmp_path / "add_opt.onnx",
        [helper.make_node("AddOpt", ["x", ""], ["y"], domain="acme_trt", name="add")],
        [t("x", TensorProto.FLOAT, [2, 3])],
        [t("y", TensorProto.FLOAT, None)],
        {"acme_trt": 1},
    )
    report = parse_with_tensorrt(path, ops=[str(user_ops_file)])
    assert report.ok, report.errors
    assert report.output_shapes == {"y": [2, 3]}
    assert build_engine(path, None, ops=[str(user_ops_file)], isolate=False).ok
    assert list(onnx.load(path).graph.node[0].input) == ["x", ""]  # the file is left as it was


def test_an_op_attribute_the_parser_takes_for_itself_is_refused(user_ops_file: Path, tmp_path: Path) -> None:
    """TensorRT's parser reads ``plugin_version`` and ``plugin_namespace`` for the plugin's lookup and passes
    them to no plugin: an op declaring one would silently see its default."""
    path = _single_node_model(tmp_path / "lookup.onnx", "Lookup", "faults")
    report = parse_with_tensorrt(path, ops=[str(user_ops_file)])
    assert not report.ok
    assert (
        "faults::Lookup declares attribute(s) ['plugin_version'], which TensorRT's ONNX parser takes"
        in (report.errors[0][2])
    )


def test_op_defined_in_main_is_named_when_the_child_cannot_see_it(tmp_path: Path) -> None:
    stdout = run_script(
        tmp_path,
        f"""
        import onnx, torch, opbridge
        from onnx import TensorProto, helper
        from opbridge.tensorrt import parse_with_tensorrt

        @opbridge.op("main_trt::Twice")
        def twice(x: torch.Tensor) -> torch.Tensor:
            return x * 2

        node = helper.make_node("Twice", ["x"], ["y"], domain="main_trt")
        t = helper.make_tensor_value_info
        graph = helper.make_graph([node], "g", [t("x", TensorProto.FLOAT, [2])], [t("y", TensorProto.FLOAT, None)])
        opsets = [helper.make_opsetid("", 17), helper.make_opsetid("main_trt", 1)]
        onnx.save(helper.make_model(graph, opset_imports=opsets), {str(tmp_path / "m.onnx")!r})
        report = parse_with_tensorrt({str(tmp_path / "m.onnx")!r})
        print(report.ok, report.errors[0][2])
        """,
    )
    last = stdout.strip().splitlines()[-1]
    assert last.startswith("False ") and "main_trt::Twice is defined in __main__" in last, last
    assert "no op named" not in last


def test_int_attribute_beyond_int32_in_a_subgraph_is_refused(tmp_path: Path) -> None:
    node = helper.make_node("MyStrangeOp2", ["a", "b", "c"], ["y"], domain="opbridge", int_attr1=2**40)
    t = helper.make_tensor_value_info
    branch = helper.make_graph([node], "then", [], [t("y", TensorProto.FLOAT, [2, 3])])
    other = helper.make_graph(
        [helper.make_node("Identity", ["a"], ["z"])], "else", [], [t("z", TensorProto.FLOAT, [2, 3])]
    )
    choose = helper.make_node("If", ["cond"], ["out"], then_branch=branch, else_branch=other, name="choose")
    path = _model(
        tmp_path / "wide_if.onnx",
        [choose],
        [t("cond", TensorProto.BOOL, [])] + [t(n, TensorProto.FLOAT, [2, 3]) for n in "abc"],
        [t("out", TensorProto.FLOAT, [2, 3])],
        {"opbridge": 1},
    )
    report = parse_with_tensorrt(path)
    assert not report.ok
    assert "attribute 'int_attr1' holds 1099511627776, outside int32" in report.errors[0][2]


def _with_functions(path: Path, functions: list[onnx.FunctionProto]) -> Path:
    model = onnx.load(path)
    model.functions.extend(functions)
    onnx.save(model, path)
    return path


def test_a_build_says_which_ops_ran_as_function_bodies(seed_export: Any, caplog: pytest.LogCaptureFixture) -> None:
    """A model exported with its ops' function bodies builds without any plugin (the parser imports the
    bodies); the build said nothing of it, so a forgotten --no-functions went unnoticed."""
    seed = next(s for s in SEED_MODELS if s.name == "myselu")
    result = seed_export(seed.name, "dynamo", functions=True)
    assert result.model.functions
    with caplog.at_level(logging.WARNING, logger="opbridge.tensorrt._build"):
        report = build_engine(result.path, None, profiles=_profile(seed, seed.factory()[1]), isolate=False)
    assert report.ok, report.describe()
    assert not report.plugin_shapes  # no plugin layer: the body ran
    assert "opbridge::MySELU ran as the model's ONNX function bodies, not as opbridge's plugins" in caplog.text
    assert "leave the bodies out of the model (export with functions=False, --no-functions)" in caplog.text


def test_a_build_says_which_plugin_inputs_the_parser_narrowed_from_float64(
    user_ops_file: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """TensorRT's parser hands a float64 tensor over as float32, without a word: the build passed silently,
    and its docs said it failed."""
    f64, f32 = TensorProto.DOUBLE, TensorProto.FLOAT
    nodes = [
        helper.make_node("Repeat2", ["x"], ["wide"], name="from_input", domain="acme_trt"),
        helper.make_node("Cast", ["y"], ["y64"], to=f64),
        helper.make_node("Repeat2", ["y64"], ["wide2"], name="from_cast", domain="acme_trt"),
        helper.make_node("Cast", ["y"], ["y32"], to=f32),
        helper.make_node("Repeat2", ["y32"], ["wide3"], name="float32", domain="acme_trt"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", f64, [2, 3]), helper.make_tensor_value_info("y", f32, [2, 3])],
        [helper.make_tensor_value_info(n, t, [2, 6]) for n, t in (("wide", f64), ("wide2", f64), ("wide3", f32))],
    )
    path = tmp_path / "f64.onnx"
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("acme_trt", 1)]
    onnx.save(helper.make_model(graph, opset_imports=opsets), path)
    with caplog.at_level(logging.WARNING, logger="opbridge.tensorrt._build"):
        report = build_engine(path, None, ops=[str(user_ops_file)])
    assert report.ok, report.describe()
    (warning,) = [r.getMessage() for r in caplog.records if "float64 in the model" in r.getMessage()]
    assert warning.startswith(
        "node 'from_input' input 'x', node 'from_cast' input 'y64': float64 in the model, float32 in the engine."
    )


def test_function_bodies_and_same_named_functions_of_other_domains(user_ops_file: Path, tmp_path: Path) -> None:
    """The parser finds local functions by op type alone: clash_b::Widen, next to a body of clash_a::Widen,
    took clash_a's body (x2 for x3), silently; tagged with its namespace it is clash_b's plugin. Inside a
    function body the parser takes the local function even so: refused, naming the fix. Without the body
    of clash_a::Widen, clash_b::Widen inside a body is clash_b's plugin."""
    t = helper.make_tensor_value_info
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("clash_a", 1), helper.make_opsetid("clash_b", 1)]
    body_a = helper.make_function(
        "clash_a", "Widen", ["x"], ["y"], [helper.make_node("Concat", ["x", "x"], ["y"], axis=1)], opsets
    )
    outer = helper.make_function(
        "clash_a", "Outer", ["x"], ["y"], [helper.make_node("Widen", ["x"], ["y"], domain="clash_b")], opsets
    )
    nodes = [
        helper.make_node("Widen", ["x"], ["a"], domain="clash_a", name="widen_a"),
        helper.make_node("Widen", ["x"], ["b"], domain="clash_b", name="widen_b"),
        helper.make_node("Outer", ["x"], ["o"], domain="clash_a", name="outer"),
    ]
    path = _model(
        tmp_path / "bodies.onnx",
        nodes,
        [t("x", TensorProto.FLOAT, [2, 4])],
        [t(n, TensorProto.FLOAT, None) for n in "abo"],
        {"clash_a": 1, "clash_b": 1},
    )
    _with_functions(path, [body_a, outer])
    report = parse_with_tensorrt(path, ops=[str(user_ops_file)])
    assert not report.ok
    assert (
        "sits in the body of clash_a::Outer, and the model has a local function clash_a::Widen" in report.errors[0][2]
    )
    model = onnx.load(path)
    del model.graph.node[2]
    del model.graph.output[2]
    onnx.save(model, path)
    report = parse_with_tensorrt(path, ops=[str(user_ops_file)])
    assert report.ok, report.errors
    assert report.output_shapes == {"a": [2, 8], "b": [2, 12]}
    model.graph.node.append(helper.make_node("Outer", ["x"], ["o"], domain="clash_a", name="outer"))
    model.graph.output.append(t("o", TensorProto.FLOAT, None))
    del model.functions[0]  # (clash_a::Widen's body: it is its plugin now)
    onnx.save(model, path)
    report = parse_with_tensorrt(path, ops=[str(user_ops_file)])
    assert report.ok, report.errors
    assert report.output_shapes == {"a": [2, 8], "b": [2, 12], "o": [2, 12]}


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({"alpah": 0.5}, "attribute(s) ['alpah'] that acme_trt::Blend does not declare"),
        ({"plugin_namspace": "acme_trt"}, "attribute(s) ['plugin_namspace'] that acme_trt::Blend does not declare"),
        ({"steps": 2**40}, "attribute 'steps' holds 1099511627776, outside int32"),
        ({"names": ["a\x00b", "c"]}, "attribute 'names' holds a string with a NUL character"),
        (
            {"alpha": onnx.numpy_helper.from_array(np.array([0.5], np.float32))},
            "attribute 'alpha' is TENSOR in the node; the op declares it float",
        ),
    ],
    ids=["misspelt", "misspelt-parser-attribute", "beyond-int32", "nul-in-strings", "tensor-for-float"],
)
def test_node_attributes_the_plugin_would_not_see_are_refused_in_function_bodies_too(
    user_ops_file: Path, tmp_path: Path, attrs: dict[str, Any], message: str
) -> None:
    """An attribute the op does not declare would be dropped by the parser (the plugin then uses its default);
    one beyond int32 narrowed. Both are refused, in the graph and inside a local function's body."""
    t = helper.make_tensor_value_info
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("acme_trt", 1), helper.make_opsetid("wrap", 1)]
    for inside in (False, True):
        blend = helper.make_node("Blend", ["x", "x"], ["y"], domain="acme_trt", name="blend", **attrs)
        if inside:
            body = helper.make_function("wrap", "Wrap", ["x"], ["y"], [blend], opsets)
            node = helper.make_node("Wrap", ["x"], ["y"], domain="wrap", name="wrap")
        else:
            node = blend
        path = _model(
            tmp_path / f"attrs_{inside}.onnx",
            [node],
            [t("x", TensorProto.FLOAT, [2, 3])],
            [t("y", TensorProto.FLOAT, None)],
            {"acme_trt": 1, "wrap": 1},
        )
        if inside:
            _with_functions(path, [body])
        report = parse_with_tensorrt(path, ops=[str(user_ops_file)])
        assert not report.ok and message in report.errors[0][2], (inside, report.errors)


def test_a_rule_for_one_rank_gives_its_output_dtype(user_ops_file: Path, tmp_path: Path) -> None:
    """TensorRT asks for output dtypes before shapes: a rule that unpacks a rank-2 shape failed the rank-8
    probe, and its int32 output was called "float32 when ranks are unknown". Other ranks are probed."""
    t = helper.make_tensor_value_info
    path = _model(
        tmp_path / "row_argmax.onnx",
        [helper.make_node("RowArgmax", ["x"], ["i"], domain="rules_trt", name="argmax")],
        [t("x", TensorProto.FLOAT, [3, 5])],
        [t("i", TensorProto.INT32, None)],
        {"rules_trt": 1},
    )
    report = build_engine(path, None, ops=[str(user_ops_file)], isolate=False)
    assert report.ok, report.describe()
    assert report.plugin_shapes["argmax"]["outputs"] == [[[3], [3]]]


@pytest.mark.parametrize("cols", ["fixed", "dynamic"])
def test_a_rule_branching_on_a_fixed_dim_gives_its_output_dtype(user_ops_file: Path, tmp_path: Path, cols: str) -> None:
    """TensorRT asks for output dtypes before shapes, and the rule was probed with every dim unknown, so one
    that branches on a dim fixed in the model (``if c < k``) failed every probe: its int32 output was taken
    for float32 and the build blamed "the dtype ... when ranks are unknown". The model's fixed dims now reach
    the probe as ints; a dynamic one is refused for what it is."""
    t = helper.make_tensor_value_info
    path = _model(
        tmp_path / f"top_idx_{cols}.onnx",
        [helper.make_node("TopIdx", ["x"], ["i"], domain="rules_trt", name="top", k=3)],
        [t("x", TensorProto.FLOAT, ["batch", 8 if cols == "fixed" else "cols"])],
        [t("i", TensorProto.INT32, None)],
        {"rules_trt": 1},
    )
    dims = ((1, 8), (2, 8), (4, 8)) if cols == "fixed" else ((1, 4), (2, 8), (4, 16))
    report = build_engine(path, None, profiles={"x": dims}, ops=[str(user_ops_file)], isolate=False)
    if cols == "fixed":
        assert report.ok, report.describe()
        assert report.plugin_shapes["top"]["outputs"] == [[[1, 3], [4, 3]]]
    else:
        assert not report.ok
        assert "TrtDim(x.shape[1]) is a dynamic TensorRT dim" in report.describe()
        assert "when ranks are unknown" not in report.describe()


def test_a_rule_comparing_named_dims_gives_its_output_dtype(user_ops_file: Path, tmp_path: Path) -> None:
    """The dtype probe gives a rule the model's dim names: dims of one name compare equal there, as they
    do in TensorRT's shape pass (the probe's unnamed dims did not, and the int32 output was taken for
    float32)."""
    t = helper.make_tensor_value_info
    path = _model(
        tmp_path / "sum_argmax.onnx",
        [helper.make_node("SumArgmax", ["x", "y"], ["i"], domain="rules_trt", name="pick")],
        [t("x", TensorProto.FLOAT, ["batch", "cols"]), t("y", TensorProto.FLOAT, ["batch", "cols"])],
        [t("i", TensorProto.INT32, None)],
        {"rules_trt": 1},
    )
    dims = ((1, 4), (2, 8), (4, 16))
    report = build_engine(path, None, profiles={"x": dims, "y": dims}, ops=[str(user_ops_file)], isolate=False)
    assert report.ok, report.describe()
    assert report.plugin_shapes["pick"]["outputs"] == [[[1], [4]]]


def test_an_op_defined_at_another_version_than_the_model_imports_is_named(user_ops_file: Path, tmp_path: Path) -> None:
    """versioned_trt::Halve is defined at version 2; a model importing versioned_trt at 1 gets no plugin,
    and the report says which versions exist instead of "no op named Halve is defined"."""
    model = _single_node_model(tmp_path / "halve_v1.onnx", "Halve", "versioned_trt")
    report = parse_with_tensorrt(model, ops=[str(user_ops_file)])
    assert not report.ok
    assert any(
        "['versioned_trt::Halve v2'], none of the node's domain at the version" in m for _, _, m in report.errors
    )


def test_the_child_process_imports_ops_used_only_inside_an_if_branch(user_ops_file: Path, tmp_path: Path) -> None:
    """The parsing child imports the modules that defined the caller's ops the model uses: those of If
    branches too (it looked at the main graph only, and the plugin was "not found")."""
    from opbridge._loading import load_module

    load_module(str(user_ops_file))  # defined in this process only, not passed as ops=
    t = helper.make_tensor_value_info
    branch = helper.make_graph(
        [helper.make_node("Repeat2", ["x"], ["r"], domain="acme_trt", name="repeat")],
        "then",
        [],
        [t("r", TensorProto.FLOAT, [2, 6])],
    )
    other = helper.make_graph(
        [helper.make_node("Concat", ["x", "x"], ["c"], axis=1)], "else", [], [t("c", TensorProto.FLOAT, [2, 6])]
    )
    node = helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=other, name="choose")
    path = _model(
        tmp_path / "if_repeat.onnx",
        [node],
        [t("cond", TensorProto.BOOL, []), t("x", TensorProto.FLOAT, [2, 3])],
        [t("y", TensorProto.FLOAT, [2, 6])],
        {"acme_trt": 1},
    )
    report = parse_with_tensorrt(path)
    assert report.ok, report.errors


def test_the_child_process_imports_the_module_that_defined_an_op_not_its_functions(tmp_path: Path) -> None:
    """An op defined in one module from a function of another (``Twice = opbridge.op(...)(lib.twice)``): the
    child imported the function's module, which defines no op, and the plugin was "not found"."""
    from opbridge._loading import load_module

    (tmp_path / "trt_lib_functions.py").write_text(
        "import torch\n\ndef twice(x: torch.Tensor) -> torch.Tensor:\n    return x * 2\n", encoding="utf-8"
    )
    ops_file = tmp_path / "trt_ops_from_lib.py"
    ops_file.write_text(
        f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\nimport opbridge\nimport trt_lib_functions\n\n"
        'Twice = opbridge.op("defined_in_trt::Twice")(trt_lib_functions.twice)\n',
        encoding="utf-8",
    )
    module = load_module(str(ops_file))  # defined in this process only, not passed as ops=
    assert module.Twice.reference.__module__ == "trt_lib_functions"
    model = _single_node_model(tmp_path / "twice.onnx", "Twice", "defined_in_trt")
    report = parse_with_tensorrt(model)
    assert report.ok, report.errors


@pytest.mark.parametrize(
    ("op_type", "said"),
    [
        ("BoolDim", "shape rule output 0 dim 0: output dim True is a bool, not a size"),
        ("Rank9", "the shape rule gives output 0 9 dims, and a TensorRT tensor has at most 8"),
    ],
    ids=["bool-dim", "nine-dims"],
)
def test_a_shape_rule_trt_cannot_take_is_named(user_ops_file: Path, tmp_path: Path, op_type: str, said: str) -> None:
    """A rule's ``True`` dim was taken as size 1 (the torch paths refuse it); nine dims failed in TensorRT's
    DimsExprs ("Input length 9. Max expected length is 8") without naming the op."""
    model = _single_node_model(tmp_path / f"{op_type}.onnx", op_type, "faults")
    report = build_engine(model, None, profiles=SMALL, ops=[str(user_ops_file)])
    assert not report.ok
    assert any(f"faults::{op_type}: {said}" in e[2] for e in report.errors), report.errors


def test_an_input_without_a_shape_is_named(user_ops_file: Path, tmp_path: Path) -> None:
    """An input the model gives no shape (not even a rank) was taken for a scalar: "input 'x' is  (rank 0)"."""
    model = _single_node_model(tmp_path / "norank.onnx", "Repeat2", "acme_trt")
    proto = onnx.load(model)
    proto.graph.input[0].type.tensor_type.ClearField("shape")
    onnx.save(proto, model)
    with pytest.raises(opbridge.OpbridgeError, match="input 'x' has no shape in the model"):
        build_engine(model, None, profiles=SMALL, ops=[str(user_ops_file)])


def test_profile_dims_beyond_int32_and_engines_over_data_files_are_refused(user_ops_file: Path, tmp_path: Path) -> None:
    """TensorRT's dims are int32: a larger profile dim is a usage error, not a crash of the child process.
    An engine is never written over the model's external data file."""
    model = _single_node_model(tmp_path / "repeat.onnx", "Repeat2", "acme_trt")
    with pytest.raises(opbridge.OpbridgeError, match="has a dim outside 0..2147483647"):
        build_engine(model, None, profiles={"x": ((1, 3, 5), (2, 3, 5), (2**31, 3, 5))}, ops=[str(user_ops_file)])
    weights = onnx.numpy_helper.from_array(np.ones((64, 64), np.float32), "w")
    t = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [t("x", TensorProto.FLOAT, [1, 64])],
        [t("y", TensorProto.FLOAT, [1, 64])],
        [weights],
    )
    path = tmp_path / "ext.onnx"
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
        path,
        save_as_external_data=True,
        location="ext.data",
        size_threshold=0,
    )
    before = (tmp_path / "ext.data").read_bytes()
    with pytest.raises(opbridge.OutputPathError, match="one of the input's own files"):
        build_engine(path, tmp_path / "ext.data")
    assert (tmp_path / "ext.data").read_bytes() == before
    # a data file cut, missing or out of the model's folder is named as the other commands name it (TensorRT's
    # parser said "Failed to import initializer: w", exit 1 as for a failed build)
    (tmp_path / "ext.data").write_bytes(before[:100])
    with pytest.raises(
        opbridge.ModelLoadError,
        match=r"tensor 'w' is kept in .*ext.data, which does not hold it \(16384 bytes at offset 0, 100 there\)",
    ):
        build_engine(path, None)
    (tmp_path / "ext.data").unlink()
    with pytest.raises(opbridge.ModelLoadError, match="tensor 'w' is kept in .*ext.data, which does not hold it"):
        build_engine(path, None)
    proto = onnx.load(path, load_external_data=False)
    proto.graph.initializer[0].external_data[0].value = "../ext.data"
    onnx.save(proto, path)
    with pytest.raises(opbridge.ModelLoadError, match=r"tensor 'w' is kept in '\.\./ext.data', outside the model's"):
        build_engine(path, None)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_detection_op_builds_with_its_shape_rule(case: tuple[Any, ...], tmp_path: Path) -> None:
    """Every detection op exports as a plugin node and builds; TensorRT's output shapes are the op's."""
    name, opdef, args, attrs = case
    model = _Call(opdef, attrs).eval()
    result = opbridge.export(model, args, tmp_path / f"{name}.onnx", exporter="torchscript", functions=False)
    report = build_engine(result.path, tmp_path / f"{name}.engine", isolate=False)
    assert report.ok, report.describe()
    eager = model(*args)
    eager = eager if isinstance(eager, tuple) else (eager,)
    (shapes,) = report.plugin_shapes.values()
    assert shapes["op"] == name
    assert shapes["outputs"] == [[list(e.shape), list(e.shape)] for e in eager]


def test_parse_report_for_the_compat_tool(seed_export: Any) -> None:
    result = seed_export("super_resolution", "torchscript", functions=False)
    report = parse_with_tensorrt(result.path)
    assert report.ok and report.errors == [] and report.backend in ("tensorrt", "tensorrt_rtx")
    assert report.output_shapes == {"output": [-1, 3, -1, -1]}


# --------------------------------------------------------------------------- CLI


def test_cli_trt_build_exit_codes(seed_export: Any, user_ops_file: Path, tmp_path: Path, capsys: Any) -> None:
    model = seed_export("myselu", "torchscript", functions=False).path
    engine = tmp_path / "myselu.engine"
    assert cli_main(["trt-build", str(model), "-o", str(engine), "--profile", "image:1x1x4x4,2x1x8x8,3x1x12x12"]) == 0
    assert engine.stat().st_size > 0
    assert "built" in capsys.readouterr().out

    bad = _single_node_model(tmp_path / "bad.onnx", "BadShape", "faults")
    code = cli_main(
        [
            "trt-build",
            str(bad),
            "-o",
            str(tmp_path / "bad.engine"),
            "--profile",
            "x:1x3x5,2x3x5,3x3x5",
            "--ops",
            str(user_ops_file),
        ]
    )
    out = capsys.readouterr().out
    assert code == 1 and "this rule fails on purpose" in out and not (tmp_path / "bad.engine").exists()

    usage = [
        (["trt-build", str(model), "-o", str(engine)], "give each its range as --profile NAME:MIN,OPT,MAX, e.g. "),
        (["trt-build", str(model), "-o", str(engine), "--profile", "image:1x1x4x4"], "write INPUT:MIN,OPT,MAX"),
        (
            ["trt-build", str(model), "-o", str(engine), "--profile", "image:1x2x4x4,1x2x4x4,1x2x4x4"],
            "the model fixes it at 1",
        ),
        (["trt-build", str(model), "-o", str(engine), "--profile", "nope:1,1,1"], "--profile nope: the model has no"),
        (["trt-build", str(tmp_path / "missing.onnx"), "-o", str(engine)], "no such file"),
        (
            ["trt-build", str(model), "-o", str(model), "--profile", "image:1x1x4x4,2x1x8x8,3x1x12x12"],
            f"-o {model}: that is the input model",
        ),
    ]
    # another model named by -o (a slip): its bytes were replaced by the engine's, and trt-build exited 0
    other = tmp_path / "other.onnx"
    other.write_bytes(model.read_bytes())
    usage.append(
        (
            ["trt-build", str(model), "-o", str(other), "--profile", "image:1x1x4x4,2x1x8x8,3x1x12x12"],
            f"-o {other}: that is an ONNX model, which the engine would replace",
        )
    )
    for argv, message in usage:
        assert cli_main(argv) == 2, argv
        assert message in capsys.readouterr().err, argv
    assert other.read_bytes() == model.read_bytes()


def test_api_usage_errors_name_the_arguments_not_the_command_line_flags(tmp_path: Path) -> None:
    """build_engine and check_profiles named their arguments as trt-build's flags (``--profile x``, ``-o``),
    which a Python caller does not have; trt-build keeps its flags (test_cli_trt_build_exit_codes)."""
    from opbridge.tensorrt import check_profiles

    t = helper.make_tensor_value_info
    path = _model(
        tmp_path / "relu.onnx",
        [helper.make_node("Relu", ["x"], ["y"])],
        [t("x", TensorProto.FLOAT, ["batch", 3, 5])],
        [t("y", TensorProto.FLOAT, None)],
        {},
    )
    cases = [
        (
            {},
            "input 'x' has dynamic dims (batchx3x5): give each its range in profiles as {input: (min, opt, max)}, "
            "e.g. profiles={'x': ((1, 3, 5), (1, 3, 5), (1, 3, 5))}",
        ),
        ({"nope": SMALL["x"]}, "profiles['nope']: the model has no input 'nope'"),
        ({"x": ((1, 3, 5), (2, 3, 5))}, "profiles['x']: give three shapes (min, opt, max)."),
        ({"x": ((1, 3, 5), (2, 3, 5), (3, 4, 5))}, "profiles['x']: the max shape (3, 4, 5) sets axis 1 to 4"),
        ({"x": ((1, 3, 5), (1, 3, 5), (3, 4))}, "profiles['x']: the max shape (3, 4) has rank 2"),
        ({"x": ((2, 3, 5), (1, 3, 5), (3, 3, 5))}, "profiles['x']: need min <= opt <= max on every axis"),
        ({"x": ((1, 3, 5), (1, 3, 5), (2**31, 3, 5))}, "profiles['x']: the max shape (2147483648, 3, 5) has a dim"),
    ]
    for profiles, message in cases:
        with pytest.raises(opbridge.OpbridgeError) as caught:
            check_profiles(path, profiles)
        assert message in str(caught.value) and "--profile" not in str(caught.value), profiles
    with pytest.raises(opbridge.OpbridgeError) as caught:
        build_engine(path, path, profiles=SMALL)
    assert f"output {str(path)!r}: that is the input model" in str(caught.value)
    assert "-o " not in str(caught.value)


def _loop_without_condition(name: str = "loop", body_name: str = "keep_going") -> onnx.NodeProto:
    """A ``Loop(M, "", v0)`` whose body reads its condition (node ``body_name``); the graph holds ``M``."""
    t = helper.make_tensor_value_info
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"], name=body_name),
            helper.make_node("Add", ["v_in", "one"], ["v_out"], name=f"{body_name}_add" if body_name else ""),
        ],
        "body",
        [t("i", TensorProto.INT64, []), t("cond_in", TensorProto.BOOL, []), t("v_in", TensorProto.FLOAT, [2])],
        [t("cond_out", TensorProto.BOOL, []), t("v_out", TensorProto.FLOAT, [2])],
        [helper.make_tensor("one", TensorProto.FLOAT, [2], [1.0, 1.0])],
    )
    return helper.make_node("Loop", ["M", "", "v0"], ["v"], body=body, name=name)


def test_a_failed_parse_names_the_cause_from_the_static_rules(tmp_path: Path) -> None:
    """TensorRT's parser fails a Loop without condition on the body node with "Node input was not
    registered" and an Upsample-9 with run-time scales with an internal assertion, neither naming the cause:
    the report adds the compat rule's reason and fix for the nodes the parser names (and the Loop holding
    one), or for every node the rules fail where it names none."""
    t = helper.make_tensor_value_info
    m = helper.make_tensor("M", TensorProto.INT64, [], [3])
    two = helper.make_tensor("two", TensorProto.FLOAT, [4], [1, 1, 2, 2])

    def save(name: str, nodes: list[Any], inputs: list[Any], outputs: list[Any], opset: int) -> Path:
        graph = helper.make_graph(nodes, "g", inputs, outputs, [m, two])
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), tmp_path / name)
        return tmp_path / name

    v0, v = t("v0", TensorProto.FLOAT, [2]), t("v", TensorProto.FLOAT, [2])
    loop = save("loop.onnx", [_loop_without_condition()], [v0], [v], 17)
    report = build_engine(loop, None)
    assert not report.ok
    parser, explained = report.errors[0], [e for e in report.errors if e[:2] == ("loop", "Loop")]
    assert parser[:2] == ("keep_going", "Identity") and "Node input was not registered" in parser[2]
    assert len(explained) == 1 and explained[0][2].startswith("opbridge: Loop 'loop' has no condition input")
    assert "give the Loop a constant true condition" in explained[0][2]
    assert "trt-loop-empty-condition" in explained[0][2]

    unnamed = save("unnamed.onnx", [_loop_without_condition("", "")], [v0], [v], 17)
    report = build_engine(unnamed, None)
    assert report.errors[0][0] == "" and [e[:2] for e in report.errors[1:]] == [("Loop#0", "Loop")]

    # the parser stops at the Upsample: the Loop after it, which the rules fail too, is not its cause
    up = helper.make_node("Upsample", ["x", "scales"], ["y"], mode="nearest", name="up")
    scales = helper.make_node("Mul", ["factor", "two"], ["scales"], name="mul")
    inputs = [t("x", TensorProto.FLOAT, [1, 1, 4, 4]), t("factor", TensorProto.FLOAT, [4]), v0]
    both = save("up.onnx", [scales, up, _loop_without_condition()], inputs, [t("y", TensorProto.FLOAT, None), v], 9)
    report = build_engine(both, None)
    assert [e[:2] for e in report.errors] == [("up", "Upsample"), ("up", "Upsample")], report.describe()
    assert "isInFlight" in report.errors[0][2]
    assert report.errors[1][2].startswith("opbridge: Upsample of opset 9 takes scales as input 1")
    assert "make 'scales' an initializer" in report.errors[1][2] and "trt-input-not-constant" in report.errors[1][2]


def test_cli_plugins_lists_generated_creators(user_ops_file: Path, capsys: Any) -> None:
    assert cli_main(["plugins", "--ops", str(user_ops_file)]) == 0
    out = capsys.readouterr().out
    assert "DynamicTRTResize v1 namespace='Test' fields=[align_corners:BOOL as INT32]" in out
    assert "MySELU v1 namespace='' fields=[attr1:STRING as CHAR, attr2:INTS as INT32, attr3:FLOAT as FLOAT32]" in out
    assert "stride:INTS as INT32" in out  # a list tells itself from one value
    assert "Blend v1 namespace='acme_trt'" in out
    assert cli_main(["plugins", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["plugins"]
    dcn = next(p for p in listed if p["name"] == "MMCVModulatedDeformConv2d")
    assert dcn["fields"][0] == {"name": "stride", "type": "INT32", "attribute": "INTS"}


def _relu_model(path: Path) -> Path:
    """A one-Relu model of two floats, saved at ``path``."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_cli_without_the_forced_backend_is_a_usage_error(tmp_path: Path) -> None:
    """With no usable TensorRT, the commands exit 2 and say what to install: trt-build too, whose child
    process reported it as a failed build (exit 1), and compat's real parser is "not available"."""
    import os

    env = dict(os.environ, OPBRIDGE_TENSORRT_BACKEND="tensorrt", PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    if backend_name() == "tensorrt":
        pytest.skip("NVIDIA tensorrt is installed here, so forcing it does not make TensorRT unavailable")
    model = _relu_model(tmp_path / "relu.onnx")
    commands = [
        ["plugins"],
        ["trt-build", str(model), "-o", str(tmp_path / "relu.engine")],
        ["compat", "--target", "tensorrt", str(model), "--json"],
    ]
    for argv in commands:
        proc = subprocess.run(
            [sys.executable, "-m", "opbridge.cli", *argv],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            check=False,
        )
        if argv[0] == "compat":
            assert proc.returncode == 0, proc.stderr  # every node runs natively; the real parser is not there
            assert '"real_ok": null' in proc.stdout and "TensorRT is not installed" in proc.stdout
        else:
            assert proc.returncode == 2, (argv, proc.stderr)
            assert "TensorRT is not installed" in proc.stderr and "opbridge[tensorrt-rtx]" in proc.stderr
    assert not (tmp_path / "relu.engine").exists()


def test_build_warns_of_a_plugin_without_gpu_kernel(
    user_ops_file: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The engine builds (TensorRT does not run enqueue at build time) but could never run: say so."""
    t = helper.make_tensor_value_info
    model = _model(
        tmp_path / "nokernel.onnx",
        [helper.make_node("AddSame", ["x", "y"], ["z"], domain="rules_trt", name="add")],
        [t("x", TensorProto.FLOAT, [2, 5]), t("y", TensorProto.FLOAT, [2, 5])],
        [t("z", TensorProto.FLOAT, None)],
        {"rules_trt": 1},
    )
    with caplog.at_level("WARNING", logger="opbridge.tensorrt._build"):
        report = build_engine(model, None, ops=[str(user_ops_file)], isolate=False)
    assert report.ok, report.describe()
    assert any(
        "rules_trt::AddSame, which have no GPU kernel: each enqueue runs" in r.getMessage() for r in caplog.records
    )


def test_profiles_of_inputs_that_share_named_dims(tmp_path: Path) -> None:
    """Two inputs share 'batch': one profile gives the other its own; two profiles that
    give 'batch' different ranges are refused."""
    from opbridge.tensorrt import check_profiles

    path = tmp_path / "shared.onnx"
    t = helper.make_tensor_value_info
    nodes = [helper.make_node("MyStrangeOp2", ["a", "b", "c"], ["y"], domain="opbridge", name="s2")]
    _model(
        path,
        nodes,
        [t("a", TensorProto.FLOAT, ["batch", 3, 4]), t("b", TensorProto.FLOAT, ["batch", 3, 4])]
        + [t("c", TensorProto.FLOAT, [1, 3, 4])],
        [t("y", TensorProto.FLOAT, None)],
        {"opbridge": 1},
    )
    completed = check_profiles(path, {"a": ((1, 3, 4), (2, 3, 4), (8, 3, 4))})
    assert completed["b"] == ((1, 3, 4), (2, 3, 4), (8, 3, 4)) and "c" not in completed
    with pytest.raises(
        opbridge.OpbridgeError, match=r"profiles\['b'\]: axis 0 is the named dim 'batch', which profiles\['a'\]"
    ):
        check_profiles(path, {"a": ((1, 3, 4), (2, 3, 4), (8, 3, 4)), "b": ((1, 3, 4), (2, 3, 4), (4, 3, 4))})
    report = build_engine(path, None, profiles={"a": ((1, 3, 4), (2, 3, 4), (8, 3, 4))}, isolate=False)
    assert report.ok, report.describe()
    assert report.plugin_shapes["s2"]["inputs"][1] == [[1, 3, 4], [8, 3, 4]]


def test_missing_profiles_are_named_together(tmp_path: Path) -> None:
    from opbridge.tensorrt import check_profiles

    t = helper.make_tensor_value_info
    path = _model(
        tmp_path / "two.onnx",
        [helper.make_node("MyStrangeOp2", ["a", "b", "c"], ["y"], domain="opbridge")],
        [t("a", TensorProto.FLOAT, ["n", 3]), t("b", TensorProto.FLOAT, ["m", 3]), t("c", TensorProto.FLOAT, [1, 3])],
        [t("y", TensorProto.FLOAT, None)],
        {"opbridge": 1},
    )
    with pytest.raises(
        opbridge.OpbridgeError,
        match=r"input 'a' has dynamic dims \(nx3\) and 1 other input\(s\): give each its range in profiles .*"
        r"profiles=\{'a': \(\(1, 3\), \(1, 3\), \(1, 3\)\), 'b': \(\(1, 3\), \(1, 3\), \(1, 3\)\)\}",
    ):
        check_profiles(path, {})


def test_a_missing_profile_is_suggested_with_the_ranges_other_profiles_set(tmp_path: Path) -> None:
    """The suggestion wrote every dynamic dim as 1 (N in the message): a dim another profile already sets
    ('batch' here) then had another range there, and the suggestion given as it was was refused."""
    from opbridge.tensorrt import check_profiles

    t = helper.make_tensor_value_info
    path = _model(
        tmp_path / "shared.onnx",
        [helper.make_node("MyStrangeOp2", ["a", "b", "c"], ["y"], domain="opbridge")],
        [
            t("a", TensorProto.FLOAT, ["batch", 3]),
            t("b", TensorProto.FLOAT, ["batch", "w"]),
            t("c", TensorProto.FLOAT, [1, 3]),
        ],
        [t("y", TensorProto.FLOAT, None)],
        {"opbridge": 1},
    )
    given = {"a": ((1, 3), (2, 3), (4, 3))}
    with pytest.raises(opbridge.OpbridgeError, match=r"input 'b' has dynamic dims \(batchxw\)") as caught:
        check_profiles(path, given)
    suggested = re.search(r"profiles=(\{.*?\}) \(", str(caught.value))
    assert suggested is not None
    triple = ast.literal_eval(suggested.group(1))["b"]
    assert triple == ((1, 1), (2, 1), (4, 1))
    assert check_profiles(path, {**given, "b": triple})["b"] == triple  # taken as suggested


ABORTING_OPS = textwrap.dedent(
    """
    import os, sys
    import torch
    import opbridge
    from opbridge import TensorInfo

    @opbridge.op("crash_trt::Abort")
    def Abort(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    @Abort.register_shape
    def _abort(x):
        if "_worker" in sys.argv[0]:  # TensorRT's child process only, never the caller's
            os.abort()
        return TensorInfo(x.shape, x.dtype)
    """
)


def test_a_worker_that_aborts_is_named_with_its_signal_and_last_step(tmp_path: Path) -> None:
    """A native abort in the child (here: a shape rule calling abort()) is a failed parse that says how the
    process ended and what it was doing, not an exit code and an empty tail."""
    ops = tmp_path / "aborting_ops.py"
    ops.write_text(ABORTING_OPS, encoding="utf-8")
    model = _single_node_model(tmp_path / "abort.onnx", "Abort", "crash_trt")
    report = parse_with_tensorrt(model, ops=[str(ops)])
    assert not report.ok
    message = report.errors[0][2]
    assert message.startswith("TensorRT's process ended (killed by SIGABRT, exit code -6) before reporting"), message
    assert f"opbridge: parsing {model.resolve()}" in message, message
    assert report.backend == "TensorRT (its process ended before it reported)"  # (it read "?")


def test_a_parser_crash_on_a_model_the_static_rules_know_names_their_cause(tmp_path: Path) -> None:
    """TensorRT's parser ends its process (SIGSEGV) on a local function that calls itself: build_engine's
    report said the process ended and no more, where compat's rules name the cause (they were added to a
    failed parse only). parse_with_tensorrt, compat's real parser, reports TensorRT's errors alone."""
    imports = [helper.make_opsetid("", 17), helper.make_opsetid("acme", 1)]
    body = helper.make_function(
        "acme", "Rec", ["x"], ["y"], [helper.make_node("Rec", ["x"], ["y"], domain="acme")], imports
    )
    graph = helper.make_graph(
        [helper.make_node("Rec", ["x"], ["y"], name="r", domain="acme")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    path = tmp_path / "rec.onnx"
    onnx.save(helper.make_model(graph, opset_imports=imports, functions=[body], ir_version=8), path)
    parsed = parse_with_tensorrt(path)
    assert not parsed.ok and not [e for e in parsed.errors if "compat rule" in e[2]], parsed.errors
    report = build_engine(path)
    assert not report.ok
    explained = [e for e in report.errors if "compat rule" in e[2]]
    assert [e[:2] for e in explained] == [("r", "Rec")], report.errors
    assert "calls itself (acme::Rec -> acme::Rec)" in explained[0][2]


def test_an_ops_module_that_builds_when_imported_cannot_start_workers_without_end(tmp_path: Path) -> None:
    """A module defining ops that parses a model when imported: the worker imports it for its ops, and each
    import would start another worker. Inside a worker the parse is refused, so the module's import fails
    there (after its op is defined, which is all the worker needs) and the caller's parse succeeds."""
    ops = tmp_path / "parses_on_import.py"
    model = _single_node_model(tmp_path / "m.onnx", "Twice", "import_trt")
    ops.write_text(
        textwrap.dedent(
            f"""
            import torch, opbridge
            from opbridge.tensorrt import parse_with_tensorrt

            @opbridge.op("import_trt::Twice")
            def twice(x: torch.Tensor) -> torch.Tensor:
                return x * 2

            REPORT = parse_with_tensorrt({str(model)!r})  # no __main__ guard
            """
        ),
        encoding="utf-8",
    )
    stdout = run_script(
        tmp_path,
        f"""
        from opbridge._loading import load_module
        module = load_module({str(ops)!r})
        print(module.REPORT.ok, module.REPORT.errors)
        """,
        timeout=120,
    )
    assert stdout.strip().splitlines()[-1] == "True []"


def test_a_parse_asked_for_inside_the_worker_is_refused_by_name(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("OPBRIDGE_TENSORRT_WORKER", "1")
    model = _single_node_model(tmp_path / "m.onnx", "Twice", "import_trt")
    with pytest.raises(opbridge.OpbridgeError, match="parses or builds a model when imported; put that code under"):
        parse_with_tensorrt(model)


@opbridge.op("tests.trt::TakeRows")
def take_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows of x by an int64 index: no shape rule, no GPU kernel."""
    return torch.index_select(x, 0, index)


def test_an_op_without_a_gpu_kernel_takes_the_dtypes_its_reference_takes(tmp_path: Path) -> None:
    """Its plugin runs the PyTorch reference, which takes an int64 index: the build refused it as a dtype
    "the op's GPU kernel supports" not, for a kernel the op does not have."""
    path = tmp_path / "take.onnx"
    model = helper.make_model(
        helper.make_graph(
            [helper.make_node("TakeRows", ["x", "index"], ["y"], domain="tests.trt", name="take")],
            "g",
            [
                helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4]),
                helper.make_tensor_value_info("index", TensorProto.INT64, ["k"]),
            ],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        ),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("tests.trt", 1)],
    )
    onnx.save(model, path)
    profiles = {"x": ((1, 4), (4, 4), (8, 4)), "index": ((1,), (2,), (3,))}
    report = build_engine(path, None, profiles=profiles, isolate=False)
    assert report.ok, report.describe()
    assert report.plugin_shapes["take"]["outputs"] == [[[1, 4], [3, 4]]]


# --------------------------------------------------------------------------- the calling process


def test_an_in_process_build_keeps_tensorrt_log_in_the_report(seed_export: Any, tmp_path: Path, capfd: Any) -> None:
    """Only the worker process echoes TensorRT's log to stderr (for its caller to show if it dies): a build
    in the calling process (`trt-build --in-process`, isolate=False) keeps it in the report's log."""
    model = seed_export("myselu", "torchscript", functions=False).path
    profile = "image:1x1x4x4,2x1x8x8,3x1x12x12"
    capfd.readouterr()
    report = build_engine(model, None, profiles={"image": ((1, 1, 4, 4), (2, 1, 8, 8), (3, 1, 12, 12))}, isolate=False)
    assert report.ok, report.describe()
    assert any(line.startswith("[VERBOSE]") for line in report.log), "TensorRT logged no VERBOSE line to keep"
    assert (
        cli_main(["trt-build", str(model), "-o", str(tmp_path / "m.engine"), "--profile", profile, "--in-process"]) == 0
    )
    captured = capfd.readouterr()
    assert "built" in captured.out
    assert "[VERBOSE]" not in captured.err and "opbridge: parsing" not in captured.err, captured.err[-2000:]


def test_an_unknown_forced_backend_is_named_with_the_ones_there_are(
    tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    """OPBRIDGE_TENSORRT_BACKEND=rtx is a bad setting, not a missing TensorRT: in this process and through
    trt-build's worker."""
    from opbridge.errors import BackendUnavailableError
    from opbridge.tensorrt import _loader

    monkeypatch.setattr(_loader, "_LOADED", None)
    monkeypatch.setenv("OPBRIDGE_TENSORRT_BACKEND", "rtx")
    expected = "OPBRIDGE_TENSORRT_BACKEND='rtx' is not a TensorRT backend opbridge knows; set it to 'tensorrt' or 'tensorrt_rtx'"
    with pytest.raises(BackendUnavailableError, match=re.escape(expected)):
        _loader.load_tensorrt()
    model = _relu_model(tmp_path / "relu.onnx")
    assert cli_main(["trt-build", str(model), "-o", str(tmp_path / "relu.engine")]) == 2
    err = capsys.readouterr().err
    assert expected in err and "not installed" not in err, err


SLOW_OPS = textwrap.dedent(
    """
    import os
    import time

    import torch

    import opbridge

    @opbridge.op("slow_trt::Wait")
    def Wait(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    if os.environ.get("OPBRIDGE_TENSORRT_WORKER"):  # TensorRT's worker only: say so, then take long
        with open(os.environ["SLOW_TRT_MARK"], "w") as fh:
            fh.write(str(os.getpid()))
        time.sleep(300)
    """
)


def _ended(pid: int) -> bool:
    """Whether the process ``pid`` is gone (or a zombie no one has reaped yet)."""
    try:
        return "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc; the worker ends with its caller on Linux"
)
@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_the_worker_ends_with_its_caller(how: str, tmp_path: Path) -> None:
    """A caller ended while its worker works: SIGTERM kills the worker and removes the request's folder, then
    ends the caller by SIGTERM; after SIGKILL the worker ends itself (the folder stays: nothing could run)."""
    import os
    import signal
    import time

    ops = tmp_path / "slow_ops.py"
    ops.write_text(SLOW_OPS, encoding="utf-8")
    model = _single_node_model(tmp_path / "wait.onnx", "Wait", "slow_trt")
    temp, mark = tmp_path / "temp", tmp_path / "worker.pid"
    temp.mkdir()
    script = tmp_path / "caller.py"
    script.write_text(
        f"from opbridge.tensorrt import parse_with_tensorrt\nparse_with_tensorrt({str(model)!r}, ops=[{str(ops)!r}])\n",
        encoding="utf-8",
    )
    env = dict(
        os.environ, TMPDIR=str(temp), SLOW_TRT_MARK=str(mark), PYTHONPATH=os.pathsep.join(p for p in sys.path if p)
    )
    with open(tmp_path / "caller.err", "w") as err:
        caller = subprocess.Popen([sys.executable, str(script)], env=env, stderr=err)
    worker = 0
    try:
        deadline = time.monotonic() + 240
        while not (mark.exists() and mark.read_text()) and caller.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert caller.poll() is None and mark.exists(), (tmp_path / "caller.err").read_text()[-2000:]
        worker = int(mark.read_text())
        assert [p.name for p in temp.iterdir() if p.name.startswith("opbridge_trt_")], "no request folder"
        caller.send_signal(getattr(signal, how))
        assert caller.wait(timeout=60) == -getattr(signal, how)
        deadline = time.monotonic() + 30
        while not _ended(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _ended(worker), f"the worker {worker} outlived its caller ({how})"
    finally:
        if caller.poll() is None:
            caller.kill()
            caller.wait()
        if worker and not _ended(worker):
            os.kill(worker, signal.SIGKILL)
    if how == "SIGTERM":
        left = [p.name for p in temp.iterdir() if p.name.startswith("opbridge_trt_")]
        assert not left, f"{left} left behind"


def test_ops_may_be_given_as_the_ops_themselves(user_model: Path, user_ops_file: Path) -> None:
    """register_plugins takes OpDefs, and build_engine's ops raised pathlib's TypeError for one; the child
    now imports the file that defined each op given."""
    from opbridge._loading import load_module
    from opbridge.tensorrt._build import _request

    module = load_module(str(user_ops_file))
    ops = [module.Blend, module.Repeat2, module.EveryOther]
    assert _request(user_model, ops)["ops"] == [str(user_ops_file.resolve())]
    profiles = {"x": ((1, 3, 2), (2, 3, 6), (4, 3, 9))}
    report = build_engine(user_model, profiles=profiles, ops=ops)
    assert report.ok, report.describe()
    assert parse_with_tensorrt(user_model, ops=module.Blend).ok
    with pytest.raises(opbridge.OpbridgeError, match=r"ops: 3 is a int; give op files .* or ops defined with"):
        build_engine(user_model, profiles=profiles, ops=[3])  # type: ignore[list-item]


@pytest.mark.parametrize("timeout", [-1, 0, float("nan"), float("inf"), True, "60"])
def test_a_timeout_that_is_not_a_positive_number_is_a_usage_error(timeout: Any, tmp_path: Path) -> None:
    """timeout=-1 was reported as a failed build ("did not finish within -1 s") and nan raised selectors'
    ValueError; both are refused before any work, naming the argument."""
    path = _relu_model(tmp_path / "relu.onnx")
    for call in (
        lambda: build_engine(path, timeout=timeout),
        lambda: parse_with_tensorrt(path, timeout=timeout),
    ):
        with pytest.raises(opbridge.OpbridgeError, match=r"timeout must be a positive finite number of seconds"):
            call()
