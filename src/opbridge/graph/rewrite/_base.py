"""The rule contract: find candidates, check each (saying why not), rewrite those that pass."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from opbridge.errors import OpbridgeError

if TYPE_CHECKING:
    import onnx
    import onnx_ir as ir

__all__ = ["Check", "IRRule", "RewriteError", "RewriteRule", "RuleOutcome", "every_node"]

logger = logging.getLogger(__name__)


class RewriteError(OpbridgeError):
    """A rewrite was asked for that cannot be done, or its result is not a valid model."""


@dataclass(frozen=True)
class RuleOutcome:
    """What one rule did with one candidate node (``node == ""``: the rule as a whole, which found no
    candidate or, as its reason says, was given an option no node used)."""

    rule: str
    node: str
    applied: bool
    reason: str

    def __str__(self) -> str:
        verb = "rewrote" if self.applied else "skipped"
        where = f" {self.node}" if self.node else ""
        return f"{self.rule}: {verb}{where}: {self.reason}"


@dataclass(frozen=True)
class Check:
    """A check's answer: ``ok`` with data for the rewrite, or a reason it does not apply."""

    ok: bool
    reason: str
    data: Any = None

    @classmethod
    def fail(cls, reason: str) -> Check:
        return cls(False, reason)

    @classmethod
    def success(cls, reason: str, data: Any = None) -> Check:
        return cls(True, reason, data)


class RewriteRule:
    """A named rewrite of a whole model. Subclasses set ``name``, ``summary`` and ``options``."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    options: ClassVar[Mapping[str, str]] = {}

    def apply(self, model: onnx.ModelProto, options: Mapping[str, Any]) -> tuple[onnx.ModelProto, list[RuleOutcome]]:
        raise NotImplementedError

    def outcome(self, node: str, applied: bool, reason: str) -> RuleOutcome:
        return RuleOutcome(self.name, node, applied, reason)


class IRRule(RewriteRule):
    """A rule over onnx-ir: ``candidates`` -> ``check`` -> ``rewrite``, one node at a time."""

    #: what the rule looks for, for the "found none" reason (``looking_for`` on an instance overrides it).
    looks_for: ClassVar[str] = ""
    #: the main graph of the model being rewritten, and the model (set by :meth:`apply`)
    root: ir.Graph
    model: ir.Model

    def candidates(self, graph: ir.Graph, options: Mapping[str, Any]) -> list[ir.Node]:
        raise NotImplementedError

    def check(self, node: ir.Node, options: Mapping[str, Any]) -> Check:
        raise NotImplementedError

    def rewrite(self, model: ir.Model, node: ir.Node, check: Check, options: Mapping[str, Any]) -> str:
        """Rewrite ``node`` (in place in ``model``) and return what was done."""
        raise NotImplementedError

    def apply(self, model: onnx.ModelProto, options: Mapping[str, Any]) -> tuple[onnx.ModelProto, list[RuleOutcome]]:
        import onnx_ir as ir

        if len(model.graph.sparse_initializer):
            raise RewriteError(
                f"rule {self.name} edits the graph through onnx-ir, which does not read sparse initializers "
                f"({', '.join(t.values.name for t in model.graph.sparse_initializer)}); make them dense "
                "initializers first."
            )
        try:
            irm = ir.from_proto(model)
        except Exception as exc:  # onnx-ir's SerdeError wraps e.g. "Sparse tensors are not supported yet"
            cause: BaseException = exc
            while cause.__cause__ is not None:  # the innermost error says what onnx-ir cannot do
                cause = cause.__cause__
            raise RewriteError(
                f"rule {self.name} edits the graph through onnx-ir, which cannot read this model "
                f"({type(cause).__name__}: {cause})."
            ) from exc
        # initializers no node read before the rewrite are the user's: kept (the clean-up below would drop them)
        idle = [v for v in irm.graph.initializers.values() if not v.uses() and not v.is_graph_input()]
        # nodes whose outputs something reads: the clean-up removes those the rewrite leaves unread, and
        # no node that was dead already (it is the user's)
        read = {id(n) for n in every_node(irm.graph) if any(o.uses() or o.is_graph_output() for o in n.outputs)}
        # likewise the initializers something reads (of the main graph and its subgraphs)
        read_inits = {id(v) for g in _graphs(irm.graph) for v in g.initializers.values() if _is_read(v)}
        self.root = irm.graph  # (for checks of nodes in subgraphs, which need the main graph)
        self.model = irm  # (for checks that read the model's functions)
        found = self.candidates(irm.graph, options)
        if not found:
            what = getattr(self, "looking_for", "") or self.looks_for
            return model, [self.outcome("", False, getattr(self, "none_found", "") or f"no {what} in the graph")]
        outcomes = []
        for node in found:
            label = node.name or node.op_type
            result = self.check(node, options)
            if not result.ok:
                outcomes.append(self.outcome(label, False, result.reason))
                continue
            outcomes.append(self.outcome(label, True, self.rewrite(irm, node, result, options)))
        outcomes += [self.outcome(label, False, reason) for label, reason in getattr(self, "left_out", [])]
        if not any(o.applied for o in outcomes):
            return model, outcomes
        _remove_unread(irm.graph, read)
        _remove_unread_initializers(irm.graph, read_inits)
        for value in idle:
            if value.name not in irm.graph.initializers:
                irm.graph.register_initializer(value)
        irm.graph.sort()
        out = ir.to_proto(irm)
        out.training_info.extend(model.training_info)  # (onnx-ir does not carry it)
        return out, outcomes


def every_node(graph: ir.Graph) -> list[ir.Node]:
    """The graph's nodes and those of its subgraphs (If branches, Loop and Scan bodies)."""
    import onnx_ir as ir

    return list(ir.traversal.RecursiveGraphIterator(graph))


def _remove_unread(graph: ir.Graph, read: set[int]) -> None:
    """Remove, until none is left, the nodes that something read before the rewrite and nothing reads
    now (no use, no graph output); nodes dead before are kept."""
    changed = True
    while changed:
        changed = False
        for node in reversed(every_node(graph)):
            if id(node) not in read or any(o.uses() or o.is_graph_output() for o in node.outputs):
                continue
            owner = node.graph
            if owner is not None:
                owner.remove(node, safe=True)
                read.discard(id(node))
                changed = True


def _is_read(value: ir.Value) -> bool:
    """Whether a node, or the graph's outputs, read ``value``."""
    return bool(value.uses()) or value.is_graph_output()


def _graphs(graph: ir.Graph) -> list[ir.Graph]:
    """``graph`` and its subgraphs (If branches, Loop and Scan bodies)."""
    found: dict[int, ir.Graph] = {id(graph): graph}
    for node in every_node(graph):
        if node.graph is not None:
            found.setdefault(id(node.graph), node.graph)
    return list(found.values())


def _remove_unread_initializers(graph: ir.Graph, read: set[int]) -> None:
    """Remove the initializers that something read before the rewrite and nothing reads now (their value
    infos go with them); those unread before, and those of graph inputs (an input's default), are kept."""
    for owner in _graphs(graph):
        for name, value in list(owner.initializers.items()):
            if id(value) in read and not _is_read(value) and not value.is_graph_input():
                logger.debug("removing initializer %r, which the rewrite left unread", name)
                owner.initializers.pop(name)
