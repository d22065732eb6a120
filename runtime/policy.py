"""Policy: ALLOW, DENY or ASK for each tool call.

Rules match on tool name, risk, tenant, role and a predicate over the
arguments. Evaluation: any matching DENY wins (DENY is final, I3); otherwise
the first matching rule decides; with no matching rule, reads are ALLOW and
every write is ASK.

A rule may also set how long a card waits for its decision (``ttl``): whenever it
matches, whichever rule decides the verdict, and the shortest of the matching rules'
``ttl`` wins. With none, the card lives for its tool's own ``ttl``. So a deployment
shortens the critical tier for one tenant without touching the tools::

    Rule(Verdict.ASK, risk=Risk.CRITICAL, tenant="acme", ttl=timedelta(minutes=2))
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from signoff.runtime.cards import Risk
from signoff.runtime.errors import ConfigError
from signoff.runtime.tools import Label, Registry, Tool


class Verdict(enum.StrEnum):
    ALLOW = "allow"
    DENY = "deny"
    ASK = "ask"


Predicate = Callable[[Mapping[str, Any]], bool]


@dataclass(frozen=True)
class Rule:
    """One policy rule. ``None`` fields match anything. ``ttl``: the lifetime of the cards
    of the calls it matches (the shortest of the matching rules' wins; none: the tool's)."""

    verdict: Verdict
    tool: str | None = None
    risk: Risk | None = None
    tenant: str | None = None
    role: str | None = None
    when: Predicate | None = None
    # Why, for a DENY: one text, or one per language (a Label): the model reads English,
    # a person whose edit it refuses reads theirs.
    reason: Label = ""
    ttl: timedelta | None = None

    def __post_init__(self) -> None:
        if self.ttl is not None and self.ttl <= timedelta(0):
            raise ConfigError(f"a rule's ttl must be positive, not {self.ttl}")

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
    reason: Label = ""
    rule: Rule | None = None
    ttl: timedelta | None = None  # set by a matching rule; None: the tool's own

    def card_ttl(self, tool: Tool) -> timedelta:
        """How long a card of this call waits for its decision."""
        return self.ttl if self.ttl is not None else tool.ttl


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
            ttls = [r.ttl for r in matching if r.ttl is not None]
            ttl = min(ttls) if ttls else None
            return Outcome(matching[0].verdict, matching[0].reason, matching[0], ttl)
        if tool.risk is Risk.READ:
            return Outcome(Verdict.ALLOW, "reads are allowed by default")
        return Outcome(Verdict.ASK, "writes ask by default")

    def has_explicit_rule(self, tool: Tool) -> bool:
        return any(r.tool == tool.name for r in self.rules)

    def unruled_writes(self, tools: Registry | Iterable[Tool]) -> list[str]:
        """Names of write tools with no rule naming them (they fall back to ASK)."""
        return sorted(t.name for t in tools if t.is_write and not self.has_explicit_rule(t))
