"""Move custom ops out of ONNX's default domain, as TorchScript-era exports wrote them.

``g.op("MYSELU", ...)`` without a domain puts the node in the default domain ""
with no opset import; the checker and every runtime reject it. The fix is to
move such nodes into a domain of their own and import that domain. A model-local
function in the default domain fails alike (the checker and ONNX Runtime look up no
function there): it moves, with its calls, too.

Example:
    >>> import onnx
    >>> from onnx import helper, TensorProto
    >>> node = helper.make_node("MYSELU", ["x"], ["y"])
    >>> g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
    ...                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    >>> fixed, moved = move_default_domain_ops(helper.make_model(g), domain="legacy")
    >>> moved, fixed.graph.node[0].domain
    (['MYSELU'], 'legacy')
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx

__all__ = [
    "DEFAULT_LEGACY_DOMAIN",
    "default_domain_custom_nodes",
    "default_domain_functions",
    "default_domain_opset",
    "first_versions",
    "is_standard_op",
    "move_default_domain_ops",
    "runs_default_domain_kernel",
]

DEFAULT_LEGACY_DOMAIN = "opbridge.legacy"


@functools.cache
def first_versions(domain: str = "") -> dict[str, int]:
    """The first opset version of each op of one of ONNX's domains (``""``: the default one).

    >>> first_versions()["Gelu"], first_versions("ai.onnx.ml")["TreeEnsemble"]
    (20, 5)
    """
    import onnx

    wanted = ("", "ai.onnx") if domain in ("", "ai.onnx") else (domain,)
    first: dict[str, int] = {}
    for s in onnx.defs.get_all_schemas_with_history():
        if s.domain in wanted:
            first[s.name] = min(first.get(s.name, s.since_version), s.since_version)
    return first


def is_standard_op(op_type: str, opset: int | None = None) -> bool:
    """Whether ``op_type`` is an op of ONNX's default domain at opset ``opset`` (defined at that version or
    before), or in any opset when ``opset`` is None. A TorchScript-era custom ``Gelu`` of an opset-11 model
    is no standard op there: ONNX defines Gelu from opset 20 on.

    >>> is_standard_op("Gelu", 11), is_standard_op("Gelu", 20), is_standard_op("Gelu")
    (False, True, True)
    """
    since = first_versions().get(op_type)
    return since is not None and (opset is None or since <= opset)


def default_domain_opset(model: onnx.ModelProto) -> int | None:
    """The version of ONNX's default domain that ``model`` imports (None when it imports none)."""
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    return None


def runs_default_domain_kernel(domain: str, op_type: str, version: int | None, moved: Collection[str] = ()) -> bool:
    """Whether a node of ``domain::op_type`` runs the kernel registered for ONNX's default domain
    (``@opbridge.kernel(op_type, domain="")``): a node in ``DEFAULT_LEGACY_DOMAIN`` whose op type a
    session moved there itself (``moved``, from :func:`move_default_domain_ops`), or that the
    legacy-domain rewrite moved there, when that domain has no op or kernel of its own.

    >>> runs_default_domain_kernel("acme", "MYSELU", 1)
    False
    """
    if domain != DEFAULT_LEGACY_DOMAIN:
        return False
    if op_type in moved:
        return True
    from opbridge.definition import find_op
    from opbridge.kernels import find_kernel

    own = find_op(domain, op_type, version) is not None or find_kernel(domain, op_type, version) is not None
    return not own and find_kernel("", op_type) is not None


def default_domain_custom_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Nodes in the default domain whose op type ONNX does not define at the model's opset of that domain:
    of the main graph, its subgraphs (If/Loop/Scan bodies) and the model-local functions' bodies. A call of
    a model-local function of the default domain is not one."""
    from opbridge.model_io import walk_nodes

    opset = default_domain_opset(model)
    local = {(f.domain, f.name) for f in model.functions}
    bodies = [model.graph.node, *(f.node for f in model.functions)]
    return [
        n
        for nodes in bodies
        for n in walk_nodes(nodes)
        if n.domain in ("", "ai.onnx") and not is_standard_op(n.op_type, opset) and ("", n.op_type) not in local
    ]


def default_domain_functions(model: onnx.ModelProto) -> list[onnx.FunctionProto]:
    """The model-local functions in the default domain under a name ONNX does not define as an op at the
    model's opset of that domain: the checker, ONNX Runtime and onnx's reference evaluator refuse their
    calls ("No Op registered for ...")."""
    opset = default_domain_opset(model)
    return [f for f in model.functions if f.domain in ("", "ai.onnx") and not is_standard_op(f.name, opset)]


def move_default_domain_ops(
    model: onnx.ModelProto, domain: str = DEFAULT_LEGACY_DOMAIN, version: int = 1, *, copy: bool = True
) -> tuple[onnx.ModelProto, list[str]]:
    """Move default-domain custom nodes into ``domain`` and add its opset import (to the model, and to
    each local function whose body holds one); a default-domain local function
    (:func:`default_domain_functions`) moves with its calls.

    Returns the (copied, unless ``copy=False``) model and the sorted op types moved.
    """
    import onnx

    from opbridge.model_io import walk_nodes

    if copy:
        fixed = onnx.ModelProto()
        fixed.CopyFrom(model)
    else:
        fixed = model
    nodes = default_domain_custom_nodes(fixed)
    functions = default_domain_functions(fixed)
    called = {f.name for f in functions}
    nodes += [
        n
        for body in [fixed.graph.node, *(f.node for f in fixed.functions)]
        for n in walk_nodes(body)
        if n.domain in ("", "ai.onnx") and n.op_type in called
    ]
    moved = sorted({n.op_type for n in nodes} | called)
    if not moved:
        return fixed, []
    for node in nodes:
        node.domain = domain
    for fn in functions:
        fn.domain = domain
    owners = [fixed, *(f for f in fixed.functions if any(n.domain == domain for n in walk_nodes(f.node)))]
    for owner in owners:
        if not any(o.domain == domain for o in owner.opset_import):
            entry = owner.opset_import.add()
            entry.domain, entry.version = domain, version
    return fixed, moved
