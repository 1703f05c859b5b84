"""The compatibility report shared by every target."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = ["CompatReport", "NodeVerdict", "Verdict"]

Verdict = Literal["native", "function", "opbridge", "fail"]

_VERDICT_TEXT = {
    "native": "runs natively",
    "function": "runs through the model's function body",
    "opbridge": "runs through an opbridge kernel/plugin",
    "fail": "FAILS",
}


@dataclass(frozen=True)
class NodeVerdict:
    """What a target does with one node.

    Attributes:
        node: node name (``op_type#index`` when unnamed).
        domain, op_type: the node's op.
        verdict: ``native``, ``function`` (model-local body), ``opbridge``
            (an opbridge kernel, Python op or plugin) or ``fail``.
        reason: why, in words.
        rules: codes of the static rules that decided or annotated it.
        real: the real backend's verdict for this node (``None`` when it was not run).
    """

    node: str
    domain: str
    op_type: str
    verdict: Verdict
    reason: str = ""
    rules: tuple[str, ...] = ()
    real: str | None = None


@dataclass
class CompatReport:
    """A per-node table of what one target does with a model."""

    target: str
    version: str
    nodes: list[NodeVerdict]
    real_backend: str = "not available"
    real_ok: bool | None = None
    notes: list[str] = field(default_factory=list)
    #: whether the real backend runs opbridge's kernels/plugins; when not (an ONNX Runtime session
    #: without opbridge's bridge), its failures on ``opbridge`` nodes are expected and not counted.
    real_includes_opbridge: bool = True

    @property
    def ok(self) -> bool:
        """No node fails by the static rules, and the real backend, when run, failed on no node it should run."""
        if any(n.verdict == "fail" for n in self.nodes):
            return False
        if self.real_ok is not False:
            return True
        failed = [n for n in self.nodes if (n.real or "").startswith("fail")]
        if not failed:
            return False
        return not any(self.real_includes_opbridge or n.verdict != "opbridge" for n in failed)

    def failures(self) -> list[NodeVerdict]:
        return [n for n in self.nodes if n.verdict == "fail"]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["ok"] = self.ok
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False)

    def format_text(self, *, show_native: bool = False) -> str:
        """A table of the nodes that do not simply run natively (all nodes with ``show_native``)."""
        head = f"target: {self.target} ({self.version}); real backend: {self.real_backend}"
        if self.real_ok is not None:
            head += " -> " + ("ok" if self.real_ok else "FAILED")
        lines = [head]
        rows = [
            n
            for n in self.nodes
            if show_native or n.verdict != "native" or n.rules or (n.real or "").startswith("fail")
        ]
        if rows:
            width = max(len(n.node) for n in rows)
            for n in rows:
                op = f"{n.domain}::{n.op_type}" if n.domain else n.op_type
                rule = f" [{', '.join(n.rules)}]" if n.rules else ""
                real = f" | real: {n.real}" if n.real is not None else ""
                lines.append(f"  {n.node:<{width}}  {op:<28} {_VERDICT_TEXT[n.verdict]}{rule}: {n.reason}{real}")
        shown = {id(n) for n in rows}
        native = Counter(n.op_type for n in self.nodes if n.verdict == "native" and id(n) not in shown)
        if native:
            lines.append("  natively: " + ", ".join(f"{k} x{v}" for k, v in sorted(native.items())))
        lines += [f"  note: {note}" for note in self.notes]
        counts = Counter(n.verdict for n in self.nodes)
        summary = "summary: " + ", ".join(f"{counts.get(k, 0)} {k}" for k in ("native", "function", "opbridge", "fail"))
        if self.real_ok is not None:
            real_failed = sum((n.real or "").startswith("fail") for n in self.nodes)
            summary += f"; real backend: {'ok' if self.real_ok else 'FAILED'}"
            if real_failed:
                summary += f" on {real_failed} node(s)"
        lines.append(summary)
        from opbridge._text import printable

        return "\n".join(printable(line) for line in lines)
