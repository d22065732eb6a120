"""Policy: ALLOW, DENY or ASK for each tool call.

Rules match on tool name, risk, tenant, role and a predicate over the
arguments. Evaluation: any matching DENY wins (DENY is final, I3); otherwise
the first matching rule decides; with no matching rule, reads are ALLOW and
every write is ASK.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from signoff.runtime.cards import Risk
from signoff.runtime.tools import Registry, Tool


class Verdict(enum.StrEnum):
    ALLOW = "allow"
    DENY = "deny"
    ASK = "ask"


Predicate = Callable[[Mapping[str, Any]], bool]


@dataclass(frozen=True)
class Rule:
    """One policy rule. ``None`` fields match anything."""

    verdict: Verdict
    tool: str | None = None
    risk: Risk | None = None
    tenant: str | None = None
    role: str | None = None
    when: Predicate | None = None
    reason: str = ""

    def matches(self, tool: Tool, args: Mapping[str, Any], tenant: str, role: str) -> bool:
        if self.tool is not None and self.tool != tool.name:
            return False
        if self.risk is not None and self.risk is not tool.risk:
            return False
        if self.tenant is not None and self.tenant != tenant:
            return False
        if self.role is not None and self.role != role:
            return False
        return self.when is None or bool(self.when(args))


@dataclass(frozen=True)
class Outcome:
    verdict: Verdict
    reason: str = ""
    rule: Rule | None = None


@dataclass
class Policy:
    rules: list[Rule] = field(default_factory=list)

    def add(self, rule: Rule) -> Policy:
        self.rules.append(rule)
        return self

    def evaluate(
        self, tool: Tool, args: Mapping[str, Any], *, tenant: str, role: str = "user"
    ) -> Outcome:
        matching = [r for r in self.rules if r.matches(tool, args, tenant, role)]
        for rule in matching:
            if rule.verdict is Verdict.DENY:
                return Outcome(Verdict.DENY, rule.reason or f"{tool.name} is not allowed", rule)
        if matching:
            return Outcome(matching[0].verdict, matching[0].reason, matching[0])
        if tool.risk is Risk.READ:
            return Outcome(Verdict.ALLOW, "reads are allowed by default")
        return Outcome(Verdict.ASK, "writes ask by default")

    def has_explicit_rule(self, tool: Tool) -> bool:
        return any(r.tool == tool.name for r in self.rules)

    def unruled_writes(self, tools: Registry | Iterable[Tool]) -> list[str]:
        """Names of write tools with no rule naming them (they fall back to ASK)."""
        return sorted(t.name for t in tools if t.is_write and not self.has_explicit_rule(t))
