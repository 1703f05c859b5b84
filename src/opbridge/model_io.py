"""Reading ONNX models given as a path, serialized bytes or a ModelProto, with clear errors.

Every part of opbridge that accepts a model (sessions, backends, graph tools,
verify) loads it through :func:`load_model`, so a missing, truncated or foreign
file gets the same :class:`~opbridge.errors.ModelLoadError` everywhere.

Example:
    >>> import onnx
    >>> load_model(onnx.ModelProto())
    Traceback (most recent call last):
    ...
    opbridge.errors.ModelLoadError: the given ModelProto: not a usable ONNX model (ir_version 0, ...
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from opbridge.errors import ModelLoadError, OutputPathError

if TYPE_CHECKING:
    import onnx

__all__ = [
    "PROTO_LIMIT",
    "approximate_size",
    "adopt_function_domains",
    "check_domain_imports",
    "check_graph_order",
    "data_nbytes",
    "elem_types",
    "external_files",
    "has_external_data",
    "infer_and_check_as_files",
    "load_model",
    "native_path",
    "inline_functions",
    "omitted_variadic_inputs",
    "on_files",
    "read_external_data",
    "refuse_unread_external_data",
    "restore_tensors",
    "save_with_data_file",
    "strip_tensors",
    "subgraphs",
    "too_large",
    "value_types",
    "walk_nodes",
    "write_model",
]

T = TypeVar("T")

#: Models at least this large are written with their tensors in a data file: protobuf serializes no
#: message of 2 GiB or more (the margin leaves room for what a write adds).
PROTO_LIMIT = 2**31 - 2**24

#: the (empty) external data file that the tensors :func:`strip_tensors` leaves out refer to
HELD_LOCATION = "opbridge-held-tensors.bin"

logger = logging.getLogger(__name__)


def load_model(
    model: Any, *, copy: bool = False, caller: str = "opbridge", external_data: bool | int = True
) -> onnx.ModelProto:
    """Load ``model``: a path to an .onnx file, serialized bytes, or a ModelProto.

    Args:
        model: what to load.
        copy: return a copy of a given ModelProto (files and bytes are always fresh).
        caller: names the API in the wrong-type error, e.g. ``"ReferenceSession"``.
        external_data: read a file's tensors kept in external data files (``False``: the graph only,
            to check a file without reading its weights; a number: only tensors of at most that many
            bytes, such as scales and shapes, the large ones left in their files).

    Raises:
        ModelLoadError: the file is missing, unreadable, truncated or not an ONNX
            model, or ``model`` is of another type; the message names the file.
    """
    import onnx

    fix = "the file may be truncated or corrupt. Export it again."
    if isinstance(model, onnx.ModelProto):
        _check_structure(model, "the given ModelProto", "build it with onnx.helper.make_model, or export it again.")
        if not copy:
            return model
        copied = onnx.ModelProto()
        copied.CopyFrom(model)
        return copied
    if isinstance(model, (bytes, bytearray, memoryview)):
        where = "the given bytes"
        fix = (
            "bytes are read as a serialized ModelProto (a path to a model file is given as a str or "
            "os.PathLike, not bytes)."
        )
        try:
            loaded = onnx.load_from_string(bytes(model))
        except Exception as exc:  # protobuf's DecodeError, ValueError, RuntimeError...
            raise ModelLoadError(f"{where} are not a valid ONNX model: {exc}; {fix}") from None
    elif isinstance(model, (str, os.PathLike)):
        where = os.fspath(model)
        if os.path.isdir(where):
            raise ModelLoadError(f"{where} is a folder; give the path of an .onnx model file.")
        if os.path.exists(where) and not os.path.isfile(where):
            raise ModelLoadError(
                f"{where} is not a regular file (a device or a pipe); give the path of an .onnx model file."
            )
        if not os.path.isfile(where):
            if os.path.islink(where):
                try:
                    os.path.realpath(where, strict=True)
                except OSError as exc:
                    if not isinstance(exc, FileNotFoundError):  # (a loop)
                        raise ModelLoadError(
                            f"{where} is a symbolic link that cannot be followed ({exc.strerror or exc}); give the "
                            "path of the model file itself."
                        ) from None
                raise ModelLoadError(
                    f"{where} is a symbolic link to {os.readlink(where)}, which does not exist; give the path of "
                    "an .onnx model."
                )
            raise ModelLoadError(f"{where}: no such file; give the path of an .onnx model.")
        try:
            loaded = onnx.load(where, load_external_data=False)
        except PermissionError as exc:
            raise ModelLoadError(
                f"{where}: cannot read it ({exc.strerror}); fix its permissions (chmod u+r) or run as a user who "
                "may read it."
            ) from None
        except Exception as exc:
            raise ModelLoadError(
                f"{where}: not a valid ONNX model ({type(exc).__name__}: {exc}); the file may be truncated "
                "or corrupt. Export it again."
            ) from None
        if external_data is True:
            read_external_data(loaded, where)
        elif external_data is not False and external_data > 0:
            _load_small_external_data(loaded, where, int(external_data))
    else:
        raise ModelLoadError(f"{caller} takes a path, bytes or onnx.ModelProto, got {type(model).__name__}.")
    _check_structure(loaded, where, fix)
    return loaded


def native_path(path: str | os.PathLike[str] | None) -> str | None:
    """``path`` as the C++ libraries (onnx's checker, ONNX Runtime, TensorRT's parser) take a path: UTF-8
    text; None where its file name holds bytes that are not (``os.fsdecode`` makes surrogates of them, which
    those libraries refuse), or where ``path`` is None."""
    if path is None:
        return None
    text = os.fspath(path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return text


def has_external_data(model: onnx.ModelProto) -> bool:
    """Whether ``model`` keeps a tensor in an external data file (read from beside the model's file)."""
    import onnx

    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in _all_tensors(model))


def refuse_unread_external_data(model: onnx.ModelProto, caller: str) -> None:
    """Refuse a model given as a ModelProto or bytes that still refers to tensors in external data files
    (loaded with ``load_external_data=False``), which a session cannot read without the model's folder.

    Raises:
        ModelLoadError: naming the first such tensor and the ways to give its data.
    """
    import onnx

    unread = next((t for t in _all_tensors(model) if t.data_location == onnx.TensorProto.EXTERNAL), None)
    if unread is not None:
        location = next((e.value for e in unread.external_data if e.key == "location"), "?")
        raise ModelLoadError(
            f"{caller}: the given model keeps tensor {unread.name!r} in the external data file {location!r}, which "
            "a ModelProto or its bytes do not hold (one loaded with load_external_data=False, say): give the model's "
            "path instead, or read its data first (onnx.load(path), or "
            "onnx.external_data_helper.load_external_data_for_model(model, folder))."
        )


def _check_structure(model: onnx.ModelProto, where: str, fix: str) -> None:
    """Refuse a model without an ir_version, a graph or graph outputs (fields only: nothing is copied
    or serialized); ``where`` names the model, ``fix`` says what to do about a model that is not one.

    Raises:
        ModelLoadError: naming ``where`` and the missing part.
    """
    if model.ir_version <= 0 or not model.HasField("graph"):
        raise ModelLoadError(
            f"{where}: not a usable ONNX model (ir_version {model.ir_version}, {len(model.graph.node)} node(s), "
            f"{len(model.graph.output)} output(s)); {fix}"
        )
    if not model.graph.output:
        raise ModelLoadError(
            f"{where}: the model's graph has no outputs ({len(model.graph.node)} node(s)); a model computes "
            "nothing without one: declare the values it returns as graph outputs."
        )


def check_graph_order(model: onnx.ModelProto, caller: str) -> None:
    """A :class:`~opbridge.errors.ModelLoadError` where the main graph is not one a runtime runs: two
    inputs of one name, a value that two nodes (or a node and an input) make, a node reading a value no
    input, initializer or earlier node makes (a cycle, or nodes out of order), an input or output of an
    element type ONNX does not define. ONNX Runtime refuses such a model; onnx's evaluator ran some of
    them (the last of two writers won) or failed mid-run in its own words."""
    import onnx

    graph = model.graph
    made: dict[str, str] = {}
    for value in graph.input:
        if value.name in made:
            raise ModelLoadError(f"{caller}: the model has two graph inputs named {value.name!r}; rename one.")
        made[value.name] = "a graph input"
    for tensor in graph.initializer:
        made.setdefault(tensor.name, "an initializer")
    known = set(onnx.TensorProto.DataType.values())
    for value in [*graph.input, *graph.output]:
        if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type not in known:
            raise ModelLoadError(
                f"{caller}: {value.name!r} has element type {value.type.tensor_type.elem_type}, which ONNX does "
                "not define; the file is corrupt or made by a newer tool: export it again."
            )
    for index, node in enumerate(graph.node):
        label = f"node {node.name or index!r} ({node.op_type})"
        for name in node.input:
            if name and name not in made:
                later = any(name in other.output for other in graph.node[index:])
                raise ModelLoadError(
                    f"{caller}: {label} reads {name!r}, which "
                    + (
                        "a later node makes: the graph is out of order or has a cycle (every runtime refuses it); "
                        "sort its nodes, or remove the cycle"
                        if later
                        else "no input, initializer or node makes: give it, or fix the node's input"
                    )
                    + "."
                )
        for name in node.output:
            if name and name in made:
                raise ModelLoadError(
                    f"{caller}: {label} writes {name!r}, which {made[name]} makes too; a value has one maker "
                    "(every runtime refuses the model): rename one of them."
                )
            if name:
                made[name] = f"node {node.name or index!r}"


def read_external_data(model: onnx.ModelProto, path: str | os.PathLike[str]) -> None:
    """Read the tensors ``model`` (loaded from ``path`` without them) keeps in external data files, naming
    a file that is missing or out of reach, or a tensor whose data there is not the size of its dims (a
    :class:`~opbridge.errors.ModelLoadError`)."""
    import onnx
    from onnx.external_data_helper import load_external_data_for_model

    base = os.path.dirname(path)
    for tensor in _all_tensors(model):  # (before reading: a short one would be read as it is)
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            info = {e.key: e.value for e in tensor.external_data}
            where = os.path.join(base, info.get("location", ""))
            _check_readable(where, tensor.name, path)
            try:  # (without a length, the data runs to the file's end)
                length = info["length"] if "length" in info else os.path.getsize(where) - int(info.get("offset", 0))
            except (OSError, ValueError):
                continue  # (named by the read below)
            _check_external_size(tensor, length, path)
    try:
        load_external_data_for_model(model, base)
    except Exception as exc:
        raise ModelLoadError(
            f"{path}: the model keeps tensors in external data files, and one cannot be read ({type(exc).__name__}: "
            f"{exc}). The model file itself is fine: put its data files where it says, beside it (a location "
            f"relative to {base or '.'}, inside that folder)."
        ) from None


def _check_readable(where: str, tensor: str, path: str | os.PathLike[str]) -> None:
    """A :class:`~opbridge.errors.ModelLoadError` where the data file ``where`` exists but this process
    may not read it (onnx says "kernel rejected path", which reads as a file out of place)."""
    if os.path.isfile(where) and not os.access(where, os.R_OK):
        raise ModelLoadError(
            f"{path}: tensor {tensor!r} is kept in {where}, which this process may not read (permission denied); "
            "fix its permissions (chmod u+r) or run as a user who may read it."
        )


def _load_small_external_data(model: onnx.ModelProto, path: str, limit: int) -> None:
    """Read the external tensors of at most ``limit`` bytes into ``model`` (as :func:`read_external_data`
    reads them all); larger ones keep their references."""
    import onnx
    from onnx.external_data_helper import load_external_data_for_tensor

    base = os.path.dirname(path)
    for tensor in _all_tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        if os.path.isabs(location) or os.path.normpath(location).split(os.sep)[0] == os.pardir:
            raise ModelLoadError(  # (as onnx refuses to read it)
                f"{path}: tensor {tensor.name!r} is kept in {location!r}, outside the model's folder, where ONNX "
                f"reads no data file; put the data file beside the model and give its location relative to "
                f"{base or '.'}, inside that folder (or export the model again)."
            )
        where = os.path.join(base, location)
        _check_readable(where, tensor.name, path)
        try:
            available = os.path.getsize(where) - int(info.get("offset", 0))
            size = int(info["length"]) if "length" in info else available
        except (OSError, ValueError) as exc:
            available, size = -1, 0
            problem = f"{type(exc).__name__}: {exc}"
        else:
            problem = f"{size} bytes at offset {info.get('offset', 0)}, {max(available, 0)} there"
        if available >= 0:
            _check_external_size(tensor, size, path)
        if available < size or available < 0:  # (named as when every tensor is read, but without reading)
            raise ModelLoadError(
                f"{path}: tensor {tensor.name!r} is kept in {where}, which does not hold it ({problem}). The model "
                f"file itself is fine: put its data files where it says, beside it (a location relative to "
                f"{base or '.'}, inside that folder)."
            )
        if size > limit:
            continue
        try:
            load_external_data_for_tensor(tensor, base)
        except Exception as exc:
            raise ModelLoadError(
                f"{path}: tensor {tensor.name!r} is kept in an external data file that cannot be read "
                f"({type(exc).__name__}: {exc}); put the model's data files beside it, where it says."
            ) from None
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]


def _check_external_size(tensor: onnx.TensorProto, length: int | str, path: str | os.PathLike[str]) -> None:
    """A :class:`~opbridge.errors.ModelLoadError` where an external tensor's data (``length`` bytes) is not
    the size its dims and element type make (ONNX Runtime fails with "Deserialize tensor ... failed")."""

    import numpy as np
    import onnx

    name = (
        onnx.TensorProto.DataType.Name(tensor.data_type)
        if tensor.data_type in onnx.TensorProto.DataType.values()
        else ""
    )
    if not name or tensor.data_type == onnx.TensorProto.STRING:
        return
    try:
        if name not in _PACKED_BITS:
            np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))  # (a type numpy has no size of)
        given = int(length)
    except (KeyError, TypeError, ValueError):
        return
    want = data_nbytes(tensor)  # (types below a byte packed: 1024 float6 in 768 bytes)
    if given != want:
        dims = "x".join(map(str, tensor.dims)) or "a scalar"
        raise ModelLoadError(
            f"{path}: tensor {tensor.name!r} is {dims} {name.lower()} ({want} bytes), but its external data holds "
            f"{given} bytes; the model file and its data file do not belong together (or the file was cut): "
            "export the model again, or fix the tensor's length and dims."
        )


def _all_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every tensor of ``model``: initializers (of subgraphs too) and tensor attributes (Constant
    values, of function bodies too)."""

    def of_nodes(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.TensorProto]:
        for node in nodes:
            for attr in node.attribute:
                if attr.HasField("t"):
                    yield attr.t
                yield from attr.tensors
                for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                    yield from sub.initializer
                    yield from of_nodes(sub.node)

    yield from model.graph.initializer
    yield from of_nodes(model.graph.node)
    for fn in model.functions:
        yield from of_nodes(fn.node)


def walk_nodes(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.NodeProto]:
    """Nodes and, recursively, the nodes of their subgraphs (If/Loop/Scan bodies)."""
    import onnx

    for node in nodes:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from walk_nodes(attr.g.node)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from walk_nodes(g.node)


def omitted_variadic_inputs(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """The nodes of ONNX ops in ``model``'s graph, subgraphs and function bodies that leave out (name ``""``)
    one of the inputs of a variadic list (``Sum``, ``Max``, ``Mean``, ``Concat``), or, in a function body,
    read as one a function input that a call leaves out (followed through calls inside other bodies), as
    (the node's label, ``path + name`` of :func:`opbridge.graph.labelled_nodes`; what it leaves out in
    words). onnx's checker passes them, and ONNX Runtime crashes on some (``Sum`` of an input left out ends
    the process once the bodies are inlined)."""
    import onnx

    from opbridge.graph._model import function_key, function_label, labelled_nodes

    nodes = list(labelled_nodes(model))
    functions = {function_key(f): f for f in model.functions}
    # the inputs of each function that a call leaves out: input name -> the label of one such call
    left_out: dict[tuple[str, str, str], dict[str, str]] = {key: {} for key in functions}
    changed = True
    while changed:  # (a call inside a body leaves out what a call of that body left out)
        changed = False
        for path, name, node, fn in nodes:
            callee = functions.get(function_key(node))
            if callee is None:
                continue
            caller = left_out[function_key(fn)] if fn is not None else {}
            for index, formal in enumerate(callee.input):
                given = node.input[index] if index < len(node.input) else ""
                if formal not in left_out[function_key(callee)] and (not given or given in caller):
                    left_out[function_key(callee)][formal] = path + name
                    changed = True
    variadic = onnx.defs.OpSchema.FormalParameterOption.Variadic
    found: list[tuple[str, str]] = []
    for path, name, node, fn in nodes:
        domain = "" if node.domain == "ai.onnx" else node.domain
        omitted = left_out[function_key(fn)] if fn is not None else {}
        if domain not in ("", "ai.onnx.ml") or not any(not i or i in omitted for i in node.input):
            continue
        owner = fn if fn is not None else model
        imports = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in owner.opset_import}
        try:
            params = onnx.defs.get_schema(node.op_type, imports.get(domain, 1), domain).inputs
        except onnx.defs.SchemaError:
            continue
        if not params or params[-1].option != variadic:
            continue
        for index, given in enumerate(node.input):
            if index < len(params) - 1 or (given and given not in omitted):
                continue
            called = (
                "" if not given else f" where {omitted[given]!r} calls {function_label(fn)} without its input {given!r}"  # type: ignore[arg-type]
            )
            found.append(
                (
                    path + name,
                    f"{node.op_type} node {path + name!r} leaves out its input {index}, one of its variadic "
                    f"{params[-1].name!r}, which cannot be left out{called}",
                )
            )
    return found


def inline_functions(model: onnx.ModelProto, selected: Sequence[tuple[str, str]] | None = None) -> onnx.ModelProto:
    """``onnx.inliner.inline_local_functions(model)`` (``inline_selected_functions`` with ``selected``), each
    call first given the defaults of the function's attributes it leaves out: onnx's inliner drops them,
    and a body's ``Resize(mode=@mode)`` whose default is "cubic" came out nearest. ``model`` is not changed.
    """
    import onnx
    import onnx.inliner

    defaults = {
        (f.domain, f.name, getattr(f, "overload", "")): list(f.attribute_proto)
        for f in model.functions
        if len(getattr(f, "attribute_proto", ()))
    }

    def calls(proto: onnx.ModelProto) -> Iterator[tuple[onnx.NodeProto, list[onnx.AttributeProto]]]:
        for node in [*walk_nodes(proto.graph.node), *(n for f in proto.functions for n in walk_nodes(f.node))]:
            given = {a.name for a in node.attribute}
            missing = [
                a
                for a in defaults.get((node.domain, node.op_type, getattr(node, "overload", "")), ())
                if a.name not in given
            ]
            if missing:
                yield node, missing

    if defaults and next(calls(model), None) is not None:
        filled = onnx.ModelProto()
        filled.CopyFrom(model)
        for node, missing in list(calls(filled)):
            node.attribute.extend(missing)
        model = filled
    if selected is None:
        return onnx.inliner.inline_local_functions(model)
    return onnx.inliner.inline_selected_functions(model, list(selected))


def subgraphs(graph: onnx.GraphProto) -> list[onnx.GraphProto]:
    """The If/Loop/Scan bodies in ``graph``, and theirs, depth first."""
    out = []
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                out += [sub, *subgraphs(sub)]
    return out


def _import_holders(proto: onnx.ModelProto) -> list[tuple[str, Any, Any]]:
    """``(who, holder, nodes)`` for each part of ``proto`` with opset imports of its own: the model (for the
    main graph and its subgraphs), then each model-local function (for its body)."""
    return [("the model", proto, proto.graph.node)] + [
        (f"function {f.domain}::{f.name}", f, f.node) for f in proto.functions
    ]


def check_domain_imports(proto: onnx.ModelProto, runtime: str) -> None:
    """Refuse, as ONNX Runtime does at load, a model whose nodes use a domain that the model (for the main
    graph and its subgraphs) or their function (for a function body) does not import.

    Raises:
        ModelLoadError: naming the domain, its nodes and the opset import to add.
    """
    missing: dict[tuple[str, str], list[onnx.NodeProto]] = {}
    for owner, holder, nodes in _import_holders(proto):
        imported = {o.domain for o in holder.opset_import}
        for node in walk_nodes(nodes):
            if node.domain not in ("", "ai.onnx") and node.domain not in imported:
                missing.setdefault((owner, node.domain), []).append(node)
    if not missing:
        return
    from opbridge.definition import find_op

    problems = []
    for (owner, domain), found in missing.items():
        labels = [f"{n.name!r} ({n.op_type})" if n.name else f"unnamed {n.op_type}" for n in found]
        shown = ", ".join(labels[:5]) + (f" and {len(labels) - 5} more" if len(labels) > 5 else "")
        # (the version of the opbridge ops of those names defined here, the highest; else 1)
        defined = [find_op(domain, n.op_type) for n in found]
        version = max((d.spec.version for d in defined if d is not None), default=1)
        problems.append(
            f"domain {domain!r} is used by node(s) {shown} but {owner} has no opset import for it "
            f"(add opset_import {{domain: {domain!r}, version: {version}}} to {owner})"
        )
    raise ModelLoadError(
        f'{runtime} refuses the model, as ONNX Runtime does ("No opset import for domain"): '
        + "; ".join(problems)
        + ". `opbridge lint MODEL` names each such domain; opbridge.export writes the imports of opbridge ops."
    )


def adopt_function_domains(proto: onnx.ModelProto, runtime: str) -> None:
    """Give ``proto`` (in place: a session's own copy) the opset imports of custom domains that only its
    model-local functions import, at their version: a session binds one kernel per op of a domain, at the
    version the model imports (a node of a function importing ``pw`` at 2 ran ``pw``'s version 1 where the
    model did not import it). A custom domain imported at two versions is refused.

    Raises:
        ModelLoadError: naming the domain, its versions and who imports each.
    """
    import onnx

    versions: dict[str, dict[int, list[str]]] = {}
    for owner, holder, _ in _import_holders(proto):
        for o in holder.opset_import:
            if o.domain not in ("", "ai.onnx", "ai.onnx.ml"):
                versions.setdefault(o.domain, {}).setdefault(o.version, []).append(owner)
    for domain, found in versions.items():
        if len(found) > 1:
            who = "; ".join(f"version {v} by {', '.join(owners)}" for v, owners in sorted(found.items()))
            raise ModelLoadError(
                f"{runtime} refuses the model: domain {domain!r} is imported at more than one version ({who}), and a "
                "session runs one version of a domain's ops; import one version everywhere (re-export the model "
                "with the ops of one version)."
            )
    imported = {o.domain for o in proto.opset_import}
    for domain, found in versions.items():
        if domain not in imported:
            proto.opset_import.append(onnx.helper.make_opsetid(domain, next(iter(found))))


def value_types(
    model: onnx.ModelProto, wanted: Sequence[str] = (), known: Callable[[onnx.TypeProto], bool] = lambda t: True
) -> dict[str, onnx.TypeProto]:
    """The tensor type of each value the graph and its subgraphs declare (initializers' from their data), where
    ``known`` takes it; where a ``wanted`` value has none so (a custom node's output feeding another node),
    ONNX shape inference with opbridge's schemas may give it.

    Example:
        >>> ranks = {n: len(t.tensor_type.shape.dim) for n, t in value_types(model).items()}  # doctest: +SKIP
    """
    import onnx

    types: dict[str, onnx.TypeProto] = {}

    def collect(graph: onnx.GraphProto) -> None:
        for g in [graph, *subgraphs(graph)]:  # (the If/Loop/Scan bodies' values too)
            for vi in [*g.value_info, *g.output, *g.input]:
                if vi.type.HasField("tensor_type") and known(vi.type):
                    types[vi.name] = vi.type
            for t in g.initializer:
                types[t.name] = onnx.helper.make_tensor_type_proto(t.data_type, list(t.dims))

    collect(model.graph)
    if any(name not in types for name in wanted):
        import opbridge

        try:
            opbridge.register_onnx_schemas()
            collect(onnx.shape_inference.infer_shapes(model).graph)
        except Exception as exc:  # the types stay unknown
            logger.debug("shape inference could not type the values %s: %s", sorted(set(wanted) - set(types)), exc)
    return types


def elem_types(model: onnx.ModelProto, wanted: Sequence[str] = ()) -> dict[str, int]:
    """Element type of each value the graph (and its subgraphs) declares, as :func:`value_types` gives it."""
    typed = value_types(model, wanted, lambda t: bool(t.tensor_type.elem_type))
    return {name: t.tensor_type.elem_type for name, t in typed.items()}


def external_files(source: Path, model: onnx.ModelProto | None = None) -> list[Path]:
    """The external data files the model file ``source`` refers to (none where it cannot be read);
    ``model``: the file as loaded already, its external data not read, which is then not read again."""
    import onnx

    if model is None:
        try:
            model = onnx.load(source, load_external_data=False)
        except Exception:
            return []
    found: set[Path] = set()
    for tensor in _all_tensors(model):
        for entry in tensor.external_data:
            if entry.key == "location":
                found.add(source.parent / entry.value)
    return sorted(found)


def too_large(model: onnx.ModelProto) -> bool:
    """Whether ``model`` is too large for one protobuf message (whose size protobuf will not even count)."""
    try:
        return approximate_size(model) >= PROTO_LIMIT
    except Exception:  # EncodeError: "Failed to serialize proto"
        return True


def infer_and_check_as_files(model: onnx.ModelProto) -> onnx.ModelProto:
    """ONNX shape inference and the full checker, through files, for a model too large for one protobuf
    message: a copy without the data of its large tensors (:func:`strip_tensors`) is written to a
    temporary folder, their bytes standing in an empty (sparse) file, its smaller tensors in a data file;
    ``model`` is returned with the inferred value infos (its tensors neither copied nor moved). Raises
    what onnx raises."""
    import onnx

    def infer_and_check(path: str) -> onnx.ModelProto:
        inferred_path = os.path.join(os.path.dirname(path), "inferred.onnx")
        onnx.shape_inference.infer_shapes_path(path, inferred_path, check_type=True, strict_mode=True, data_prop=True)
        onnx.checker.check_model(inferred_path, full_check=True)
        return onnx.load(inferred_path, load_external_data=False)

    inferred = on_files(*strip_tensors(model, 1024), infer_and_check)
    del model.graph.value_info[:]
    model.graph.value_info.extend(inferred.graph.value_info)
    return model


def on_files(light: onnx.ModelProto, held: int, action: Callable[[str], T]) -> T:
    """``action(path)`` on ``light`` (a :func:`strip_tensors` copy, and the bytes it holds back) written
    to a temporary folder: its held tensors standing in an empty (sparse) file, its smaller tensors in a
    data file. The folder is removed afterwards. For checks that read a file, not the weights."""
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="opbridge-check-")
    try:
        with open(os.path.join(folder, HELD_LOCATION), "wb") as fh:
            fh.truncate(held)  # (the checker only looks for the file; nothing reads it)
        path = save_with_data_file(light, os.path.join(folder, "model.onnx"), data_name="model.onnx.data")
        return action(str(path))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _copy_fields(target: Any, source: Any, skip: Iterable[str] = ()) -> None:
    """Copy the fields of the protobuf message ``source`` into ``target``, but those named in ``skip``
    (which are not even read: reading a tensor's ``raw_data`` copies it)."""
    skipped = set(skip)
    for field in source.DESCRIPTOR.fields:
        if field.name in skipped:
            continue
        if field.is_repeated:
            if len(getattr(source, field.name)):
                getattr(target, field.name).extend(getattr(source, field.name))
        elif source.HasField(field.name):
            if field.message_type is not None:
                getattr(target, field.name).CopyFrom(getattr(source, field.name))
            else:
                setattr(target, field.name, getattr(source, field.name))


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if not value:
            out.append(low)
            return bytes(out)
        out.append(low | 0x80)


def data_nbytes(tensor: onnx.TensorProto) -> int:
    """The bytes of ``tensor``'s data as stored, from its shape and type (reading ``raw_data`` would copy
    it): types below a byte packed (int4 two to a byte, float6 four to three bytes); an unknown type one
    byte per element.

    Example:
        >>> data_nbytes(onnx.helper.make_tensor("w", onnx.TensorProto.FLOAT6E2M3, [1024], [0] * 1024))  # doctest: +SKIP
        768
    """
    import math

    import onnx

    packed = {getattr(onnx.TensorProto, n, -1): b for n, b in _PACKED_BITS.items()}
    bits = packed.get(tensor.data_type)
    if bits is None:
        try:
            bits = 8 * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
        except Exception:  # (an unknown type: the count only sizes a placeholder file)
            bits = 8
    return (math.prod(max(int(d), 0) for d in tensor.dims) * bits + 7) // 8  # (a negative dim holds nothing)


#: the element types stored in fewer than 8 bits, packed
_PACKED_BITS = {"INT4": 4, "UINT4": 4, "FLOAT4E2M1": 4, "INT2": 2, "UINT2": 2, "FLOAT6E2M3": 6, "FLOAT6E3M2": 6}


def _placeholder(tensor: onnx.TensorProto, offset: int, length: int) -> onnx.TensorProto:
    """``tensor`` without its data, referring to ``length`` bytes at ``offset`` in :data:`HELD_LOCATION`."""
    import onnx

    light = onnx.TensorProto()
    _copy_fields(light, tensor, skip=("raw_data", "external_data", "data_location"))
    for key, value in (("location", HELD_LOCATION), ("offset", str(offset)), ("length", str(length))):
        entry = light.external_data.add()
        entry.key, entry.value = key, value
    light.data_location = onnx.TensorProto.EXTERNAL
    return light


def strip_tensors(model: onnx.ModelProto, min_bytes: int) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` whose main graph's initializers of ``min_bytes`` or more (and those left in
    external data files) hold no data but refer to :data:`HELD_LOCATION`, and how many bytes that file
    would hold; the copy holds none of their bytes (rules and checks read the graph, not the weights).
    :func:`restore_tensors` puts the tensors back."""
    import onnx

    light = onnx.ModelProto()
    _copy_fields(light, model, skip=("graph",))
    _copy_fields(light.graph, model.graph, skip=("initializer",))
    held = 0
    for tensor in model.graph.initializer:
        length = data_nbytes(tensor)
        if tensor.data_location == onnx.TensorProto.EXTERNAL or (tensor.HasField("raw_data") and length >= min_bytes):
            light.graph.initializer.append(_placeholder(tensor, held, length))
            held += length
        else:
            light.graph.initializer.append(tensor)
    return light, held


def approximate_size(model: onnx.ModelProto) -> int:
    """``model``'s serialized size in bytes, to within a few bytes per initializer, counted without
    serializing its large initializers (protobuf's ``ByteSize`` serializes the whole model to count it)."""
    light, held = strip_tensors(model, 1024)
    return light.ByteSize() + held


def _is_held(tensor: onnx.TensorProto) -> bool:
    return any(e.key == "location" and e.value == HELD_LOCATION for e in tensor.external_data)


def restore_tensors(model: onnx.ModelProto, light: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` made into ``light`` (:func:`strip_tensors` of ``model``, then rewritten), in place: every
    field from ``light`` but the main graph's initializers, which are ``light``'s in its order, those it
    left out being ``model``'s own (kept, not copied). Returns ``model``."""
    order = {t.name: k for k, t in enumerate(light.graph.initializer)}
    held = {t.name for t in light.graph.initializer if _is_held(t)}
    inits = model.graph.initializer
    for k in reversed(range(len(inits))):
        if inits[k].name not in held:  # dropped, or one of light's own (appended below)
            del inits[k]
    inits.extend(t for t in light.graph.initializer if not _is_held(t))
    inits.sort(key=lambda t: order[t.name])
    for field in [f.name for f, _ in model.ListFields() if f.name != "graph"]:
        model.ClearField(field)
    for field in [f.name for f, _ in model.graph.ListFields() if f.name != "initializer"]:
        model.graph.ClearField(field)
    _copy_fields(model, light, skip=("graph",))
    _copy_fields(model.graph, light.graph, skip=("initializer",))
    return model


def _has_unknown_fields(*messages: Any) -> bool:
    """Whether any of the protobuf ``messages`` holds fields its schema does not know (written by a newer
    ONNX, say); True where protobuf cannot tell."""
    try:
        from google.protobuf.unknown_fields import UnknownFieldSet
    except ImportError:  # (a protobuf before 4.22)
        return True
    return any(len(UnknownFieldSet(m)) for m in messages)


def write_model(model: onnx.ModelProto, fh: Any) -> None:
    """Write ``model`` serialized (the bytes ``SerializeToString`` gives) to the binary file ``fh``, one
    initializer at a time: never the whole model in one more copy."""
    import onnx

    graph_field = onnx.ModelProto.DESCRIPTOR.fields_by_name["graph"].number
    init_field = onnx.GraphProto.DESCRIPTOR.fields_by_name["initializer"].number
    if not model.HasField("graph") or not model.graph.initializer or _has_unknown_fields(model, model.graph):
        # (the pieces below are built field by field, which leaves out fields this onnx does not know)
        fh.write(model.SerializeToString())
        return

    def split(message: Any, number: int, skip: str) -> tuple[bytes, bytes]:
        """The fields of ``message`` before and after field ``number``, serialized (``skip`` left out)."""
        before, after = type(message)(), type(message)()
        _copy_fields(before, message, skip=[skip, *(f.name for f, _ in message.ListFields() if f.number > number)])
        _copy_fields(after, message, skip=[skip, *(f.name for f, _ in message.ListFields() if f.number < number)])
        return before.SerializeToString(), after.SerializeToString()

    head, tail = split(model, graph_field, "graph")
    graph_head, graph_tail = split(model.graph, init_field, "initializer")
    tag = _varint(init_field << 3 | 2)
    sizes = [t.ByteSize() for t in model.graph.initializer]
    graph_size = len(graph_head) + len(graph_tail) + sum(len(tag) + len(_varint(n)) + n for n in sizes)
    fh.write(head + _varint(graph_field << 3 | 2) + _varint(graph_size) + graph_head)
    for tensor, size in zip(model.graph.initializer, sizes):
        fh.write(tag + _varint(size))
        fh.write(tensor.SerializeToString())
    fh.write(graph_tail + tail)


def save_with_data_file(
    model: onnx.ModelProto,
    path: str | os.PathLike[str],
    *,
    data_name: str,
    protected: Iterable[str | os.PathLike[str]] = (),
    keep_tensors: bool = True,
) -> Path:
    """Write ``model`` to ``path`` with its tensors of 1 KiB or more in ``data_name`` beside it (ONNX's
    external data), both through temporary files renamed into place once both are whole. ``model`` keeps its
    tensors, or with ``keep_tensors=False`` refers to the data file for them (holding no second copy
    while it is written). A data file there that the model already at ``path`` does not use is refused
    (an :class:`~opbridge.errors.OutputPathError`), not overwritten."""
    import onnx
    from onnx.external_data_helper import _get_all_tensors, set_external_data

    from opbridge._files import prepare_output, write_atomic, write_atomic_group

    protected = list(protected)
    target = prepare_output(Path(path), protected=protected, create=True)
    data_path = target.with_name(data_name)
    tensors = [t for t in _get_all_tensors(model) if t.HasField("raw_data") and len(t.raw_data) >= 1024]
    if not tensors:  # nothing to put beside it
        serialized = model.SerializeToString()
        return write_atomic(target, lambda fh: fh.write(serialized), protected=protected)
    if data_path.exists() and data_path.resolve() not in {p.resolve() for p in external_files(target)}:
        raise OutputPathError(
            f"{data_path} exists and is not the data file of a model at {target}: the model's tensors would "
            "overwrite it; move it, or write the model under another name."
        )
    moved: list[tuple[onnx.TensorProto, bytes]] = []

    def write_data(fh: Any) -> None:
        for tensor in tensors:
            raw = tensor.raw_data
            offset = fh.tell()
            fh.write(raw)
            moved.append((tensor, raw if keep_tensors else b""))
            set_external_data(tensor, location=data_path.name, offset=offset, length=len(raw))
            tensor.ClearField("raw_data")
            tensor.data_location = onnx.TensorProto.EXTERNAL

    try:
        # both files whole before either replaces what is there: a full disk while writing the model
        # must not leave an older model beside a new data file
        written = write_atomic_group(
            [(data_path, write_data), (target, lambda fh: fh.write(model.SerializeToString()))], protected=protected
        )
    finally:
        for tensor, raw in moved if keep_tensors else ():  # the caller's model holds its tensors again
            tensor.raw_data = raw
            del tensor.external_data[:]
            tensor.data_location = onnx.TensorProto.DEFAULT
    logger.info("%s keeps its tensors in %s", target.name, data_path)
    return written[1]
