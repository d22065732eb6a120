"""signoff: a runtime that lets AI agents act for people without letting the model approve
its own actions.

This module is the stable, typed public API: what an application imports to define its
tools, its policy and itself. Everything under ``signoff.runtime``, ``signoff.gateway``,
``signoff.store`` and ``signoff.demo`` is internal and may change between releases;
``signoff.testing`` is the public kit for applications' own test suites.

A tool::

    from signoff import Prepared, Revalidation, Risk, Tool, ToolContext

An app::

    from signoff import App, Policy, Registry, Rule
    app = App(name="helpdesk", tools=Registry([...]), policy=Policy([Rule(...)]))

Served with ``signoff dev --app mypackage.module:app``.
"""

from __future__ import annotations

from signoff.runtime.app import App
from signoff.runtime.cards import Risk
from signoff.runtime.errors import (
    AlreadyDecided,
    CardNotFound,
    ConfigError,
    Conflict,
    Expired,
    Forbidden,
    InvalidInput,
    NotFound,
    NotOwner,
    RateLimited,
    SignoffError,
    StaleCard,
    ToolValidationError,
    Unauthenticated,
    Unavailable,
)
from signoff.runtime.policy import Policy, Rule, Verdict
from signoff.runtime.text import one_line
from signoff.runtime.tools import Prepared, Registry, Revalidation, Tool, ToolContext

__version__ = "0.4.0"

__all__ = [
    "AlreadyDecided",
    "App",
    "CardNotFound",
    "ConfigError",
    "Conflict",
    "Expired",
    "Forbidden",
    "InvalidInput",
    "NotFound",
    "NotOwner",
    "Policy",
    "Prepared",
    "RateLimited",
    "Registry",
    "Revalidation",
    "Risk",
    "Rule",
    "SignoffError",
    "StaleCard",
    "Tool",
    "ToolContext",
    "ToolValidationError",
    "Unauthenticated",
    "Unavailable",
    "Verdict",
    "__version__",
    "one_line",
]
