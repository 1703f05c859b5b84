"""opbridge inspect: opsets, I/O, custom nodes with typed attributes, counts, initializers."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _graph_models import make_model, swish_function
from onnx import TensorProto, helper, numpy_helper

from opbridge.cli import main
from opbridge.errors import ModelLoadError
from opbridge.graph import inspect_model


def _rich_model():
    attrs = {
        "alpha": 0.5,
        "count": 7,
        "tag": "这是字符串属性",
        "dims": [1, 2, 3],
        "weights": [0.25, 0.75],
        "table": numpy_helper.from_array(np.arange(3, dtype=np.int32)),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        helper.make_node("Foo", ["c"], ["f1", "f2"], domain="acme", name="foo", **attrs),
        helper.make_node("Swish", ["f1"], ["s"], domain="acme.fn", name="swish"),
        helper.make_node("Add", ["s", "f2"], ["y"], name="add"),
    ]
    return make_model(
        nodes,
        [("x", TensorProto.FLOAT, ["batch", 1, 8, "width"])],
        [("y", TensorProto.FLOAT, ["batch", 1, 8, "width"])],
        initializers=[("w", np.ones((1, 1, 1, 1), np.float32))],
        domains={"acme": 2, "acme.fn": 1},
        functions=[swish_function("acme.fn", "Swish")],
    )


def test_inspect_reports_custom_nodes_with_typed_attributes() -> None:
    report = inspect_model(_rich_model())
    assert report.opsets == {"": 17, "acme": 2, "acme.fn": 1}
    assert [(v.name, v.dtype, v.shape) for v in report.inputs] == [("x", "float", ["batch", 1, 8, "width"])]
    foo, swish = report.custom_nodes
    assert (foo.domain, foo.op_type, foo.version, foo.num_outputs, foo.has_function) == ("acme", "Foo", 2, 2, False)
    attrs = {a.name: (a.type, a.value) for a in foo.attributes}
    assert attrs["alpha"] == ("FLOAT", 0.5)
    assert attrs["count"] == ("INT", 7)
    assert attrs["tag"] == ("STRING", "这是字符串属性")
    assert attrs["dims"] == ("INTS", [1, 2, 3])
    assert attrs["weights"] == ("FLOATS", [0.25, 0.75])
    assert attrs["table"] == ("TENSOR", {"dtype": "int32", "shape": [3], "value": [0, 1, 2]})
    assert (swish.domain, swish.op_type, swish.has_function) == ("acme.fn", "Swish", True)
    assert report.op_counts == {"Conv": 1, "acme::Foo": 1, "acme.fn::Swish": 1, "Add": 1}
    assert [(i.name, i.dtype, i.shape, i.nbytes) for i in report.initializers] == [("w", "float", [1, 1, 1, 1], 4)]
    assert report.functions == ["acme.fn::Swish"]


def test_an_op_onnx_does_not_define_in_one_of_its_own_domains_is_a_custom_node() -> None:
    """ai.onnx.ml::Bogus was taken for a standard op and left out of the custom nodes (ONNX Runtime refuses
    it as no registered op); ai.onnx.ml::Binarizer is ONNX's."""
    nodes = [
        helper.make_node("Bogus", ["x"], ["a"], domain="ai.onnx.ml", name="bogus"),
        helper.make_node("Binarizer", ["a"], ["y"], domain="ai.onnx.ml", name="bin"),
    ]
    model = make_model(
        nodes, [("x", TensorProto.FLOAT, [2])], [("y", TensorProto.FLOAT, [2])], domains={"ai.onnx.ml": 3}
    )
    report = inspect_model(model)
    assert [(c.domain, c.op_type, c.version) for c in report.custom_nodes] == [("ai.onnx.ml", "Bogus", 3)]


def test_inspect_text_and_json(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    import onnx

    path = tmp_path / "rich.onnx"
    onnx.save(_rich_model(), path)
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    assert "acme::Foo v2, 1 input(s), 2 output(s), no function body" in text
    assert "acme.fn::Swish v1, 1 input(s), 1 output(s), function body in model" in text
    assert "x: float[batchx1x8xwidth]" in text
    assert main(["inspect", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    tag = next(a for a in data["custom_nodes"][0]["attributes"] if a["name"] == "tag")
    assert tag == {"name": "tag", "type": "STRING", "value": "这是字符串属性"}
    assert data["initializer_bytes"] == 4


def test_inspect_exported_seed(seed_export) -> None:
    result = seed_export("strange_net", "torchscript")
    report = inspect_model(result.path)
    assert report.path == str(result.path)  # (a node's graph path took its place)
    ops = {(c.domain, c.op_type, c.num_outputs) for c in report.custom_nodes}
    assert ops == {("opbridge", "MyStrangeOp", 2)}
    assert report.opsets["opbridge"] == 1
    by_name = {a.name: a for a in report.custom_nodes[0].attributes}
    assert by_name["float_attr"].type == "FLOATS" and by_name["int_attr"].type == "INTS"


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "no such file"), (b"not an onnx model", "not a valid ONNX model")],
    ids=["missing", "garbage"],
)
def test_inspect_bad_file(tmp_path, capsys: pytest.CaptureFixture[str], content: bytes | None, message: str) -> None:
    path = tmp_path / "bad.onnx"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ModelLoadError, match=message):
        inspect_model(path)
    assert main(["inspect", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_json_report_is_strict_json_with_non_finite_attributes() -> None:
    """A NaN or infinite attribute comes out as "nan"/"inf"/"-inf": bare NaN and Infinity are not JSON."""
    node = helper.make_node(
        "Foo", ["x"], ["y"], domain="acme", alpha=float("nan"), beta=float("inf"), gamma=[float("-inf"), 1.0]
    )
    model = make_model([node], [("x", TensorProto.FLOAT, [2])], [("y", TensorProto.FLOAT, [2])], domains={"acme": 1})
    text = inspect_model(model).to_json()
    json.loads(text, parse_constant=lambda name: pytest.fail(f"bare {name} in the JSON"))
    assert '"nan"' in text and '"inf"' in text and '"-inf"' in text


def test_function_bodies_and_unusual_attributes_and_packed_sizes() -> None:
    """Custom nodes inside local functions are listed with their path; TYPE_PROTO and SPARSE_TENSOR
    attributes come out as JSON; int4 initializers count half a byte per element."""
    inner = helper.make_function(
        "acme",
        "Wrap",
        ["x"],
        ["y"],
        [helper.make_node("Baz", ["x"], ["y"], domain="zzz", name="baz")],
        [helper.make_opsetid("", 17), helper.make_opsetid("zzz", 3)],
    )
    values = numpy_helper.from_array(np.array([5.0], np.float32))
    sparse = helper.make_sparse_tensor(values, numpy_helper.from_array(np.array([1], np.int64)), [4])
    node = helper.make_node(
        "Wrap",
        ["x"],
        ["y"],
        domain="acme",
        name="/blk/wrap",
        tp=helper.make_tensor_type_proto(TensorProto.FLOAT, [2]),
        sp=sparse,
    )
    packed = helper.make_tensor("q", TensorProto.INT4, [5], [1, -1, 2, 3, 0])
    model = make_model(
        [node], [("x", TensorProto.FLOAT, [2])], [("y", TensorProto.FLOAT, [2])], domains={"acme": 1}, functions=[inner]
    )
    model.graph.initializer.append(packed)
    report = inspect_model(model)
    listed = {(c.graph_path, c.name, c.domain, c.version) for c in report.custom_nodes}
    # (a name with slashes, as TorchScript writes them, is a name, not a path)
    assert listed == {("", "/blk/wrap", "acme", 1), ("acme::Wrap/", "baz", "zzz", 3)}
    assert report.op_counts == {"acme::Wrap": 1}  # the graph's nodes, not the bodies'
    data = json.loads(report.to_json())
    attrs = {a["name"]: a for a in data["custom_nodes"][0]["attributes"]}
    assert attrs["tp"]["type"] == "TYPE_PROTO" and "FLOAT" in attrs["tp"]["value"]
    assert attrs["sp"]["value"] == {"dtype": "float", "shape": [4], "sparse": True}
    assert [(i.name, i.nbytes) for i in report.initializers] == [("q", 3)]


def test_bytes_input_has_no_path() -> None:
    model = make_model(
        [helper.make_node("Relu", ["x"], ["y"])], [("x", TensorProto.FLOAT, [2])], [("y", TensorProto.FLOAT, [2])]
    )
    assert inspect_model(model.SerializeToString()).path == ""
    assert inspect_model(memoryview(model.SerializeToString())).path == ""  # (was "<memory at 0x...>")


def test_string_tensor_attributes_that_are_not_utf8_and_float6_sizes() -> None:
    """A string tensor attribute holding bytes that are not UTF-8 (the checker passes it) ended inspect in
    a UnicodeDecodeError; float6 initializers, packed four to three bytes, counted a byte each."""
    vocab = helper.make_tensor("v", TensorProto.STRING, [2], [b"\xff", b"ok"])
    node = helper.make_node("Foo", ["x"], ["y"], domain="acme", name="foo", vocab=vocab)
    model = make_model([node], [("x", TensorProto.FLOAT, [2])], [("y", TensorProto.FLOAT, [2])], domains={"acme": 1})
    model.graph.initializer.append(helper.make_tensor("w", TensorProto.FLOAT6E2M3, [1024], [0.5] * 1024))
    report = inspect_model(model)
    (attr,) = report.custom_nodes[0].attributes
    assert attr.value == {"dtype": "string", "shape": [2], "value": ["\ufffd", "ok"]}
    assert [(i.name, i.nbytes) for i in report.initializers] == [("w", 768)]
    json.loads(report.to_json())


def test_sparse_initializers_unknown_types_and_long_values() -> None:
    """A sparse initializer was left out of the list and the total (and listed as an input); an element
    type ONNX does not define ended in a traceback; a 1 MB string attribute was one 1 MB line."""
    values = numpy_helper.from_array(np.ones(3, np.float32), "W")
    indices = numpy_helper.from_array(np.array([0, 5, 7], np.int64), "W_indices")
    odd = TensorProto(name="odd", data_type=999, dims=[2], raw_data=b"ab")
    graph = helper.make_graph(
        [helper.make_node("Foo", ["x", "W", "odd"], ["y"], domain="acme", text="z" * 5000)],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
            helper.make_tensor_value_info("W", TensorProto.FLOAT, [2, 4]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        initializer=[odd],
        sparse_initializer=[helper.make_sparse_tensor(values, indices, [2, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("acme", 1)])
    report = inspect_model(model)
    assert [i.name for i in report.inputs] == ["x"]
    by_name = {i.name: i for i in report.initializers}
    assert (by_name["W"].shape, by_name["W"].nbytes, by_name["W"].sparse) == ([2, 4], 3 * 4 + 3 * 8, True)
    assert by_name["odd"].dtype == "unknown(999)"
    text = report.format_text()
    assert "W: float[2, 4] 36 B (sparse)" in text
    assert "... (5002 characters)" in text and max(len(line) for line in text.splitlines()) < 400
    assert json.loads(report.to_json())["custom_nodes"][0]["attributes"][0]["value"] == "z" * 5000


def test_inspect_names_each_overload_of_a_function() -> None:
    """Two overloads of one function were listed as "acme::Ov, acme::Ov"."""
    opsets = [helper.make_opsetid("", 17)]
    first = helper.make_function("acme", "Ov", ["a"], ["b"], [helper.make_node("Relu", ["a"], ["b"])], opsets)
    second = helper.make_function("acme", "Ov", ["a"], ["b"], [helper.make_node("Neg", ["a"], ["b"])], opsets)
    first.overload, second.overload = "relu", "neg"
    model = make_model(
        [helper.make_node("Relu", ["x"], ["y"])], [("x", TensorProto.FLOAT, [2])], [("y", TensorProto.FLOAT, [2])]
    )
    model.functions.extend([first, second])
    assert inspect_model(model).functions == ["acme::Ov:relu", "acme::Ov:neg"]


def test_initializers_of_if_loop_and_scan_bodies_are_listed() -> None:
    """Only the main graph's initializers were counted: a model holding its weights in If branches (of the
    graph, or of a model-local function's body) read "initializers: 0, 0 B"."""
    weight = np.ones((4, 8), np.float32)
    value = helper.make_tensor_value_info

    def branch(name: str, op: str) -> object:
        return helper.make_graph(
            [helper.make_node(op, ["x", f"w_{name}"], [name])],
            name,
            [],
            [value(name, TensorProto.FLOAT, [4, 8])],
            initializer=[numpy_helper.from_array(weight, f"w_{name}")],
        )

    node = helper.make_node(
        "If", ["c"], ["y"], then_branch=branch("t", "Add"), else_branch=branch("e", "Sub"), name="cond"
    )
    inner = helper.make_node("If", ["c"], ["z"], then_branch=branch("ft", "Add"), else_branch=branch("fe", "Sub"))
    function = helper.make_function("my", "F", ["x", "c"], ["z"], [inner], [helper.make_opsetid("", 17)])
    graph = helper.make_graph(
        [node, helper.make_node("F", ["x", "c"], ["z"], domain="my", name="call")],
        "g",
        [value("x", TensorProto.FLOAT, [4, 8]), value("c", TensorProto.BOOL, [])],
        [value("y", TensorProto.FLOAT, [4, 8]), value("z", TensorProto.FLOAT, [4, 8])],
        initializer=[numpy_helper.from_array(np.zeros(2, np.float32), "unused")],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("my", 1)]
    report = inspect_model(helper.make_model(graph, opset_imports=opsets, functions=[function]))
    assert sorted((i.name, i.nbytes) for i in report.initializers) == [
        ("cond/else_branch/w_e", 128),
        ("cond/then_branch/w_t", 128),
        ("my::F/If#0/else_branch/w_fe", 128),
        ("my::F/If#0/then_branch/w_ft", 128),
        ("unused", 8),
    ]
