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

Served with ``signoff dev --app mypackage.module:app``. A workflow (steps, human and event gates; ``App(workflows=[...])``)::

    from signoff import Workflow, WorkflowContext, await_event, await_human
    from signoff import Edit, agent_step  # the agent loop as a step; its cards park the run

An app may bring its own offline
model (``App(offline_model=...)``, used when no Anthropic key is set): anything with a
``name`` and an ``async respond(...) -> ModelReply``, see :class:`Model`.
"""

from __future__ import annotations

from signoff.runtime.app import App
from signoff.runtime.cards import Risk
from signoff.runtime.errors import (
    AlreadyDecided,
    AppLoadError,
    AppMismatch,
    CardNotFound,
    ConfigError,
    Conflict,
    Expired,
    Forbidden,
    InvalidInput,
    NotFound,
    NotOwner,
    NotParked,
    NotRetriable,
    RateLimited,
    ReservedKey,
    SignoffError,
    StaleCard,
    ToolRefused,
    ToolValidationError,
    Unauthenticated,
    Unavailable,
    UnknownTool,
    WorkflowNotFound,
    WorkflowThread,
    WrongEvent,
)
from signoff.runtime.models.base import Message, Model, ModelReply, TextSink, ToolSpec
from signoff.runtime.policy import Policy, Rule, Verdict
from signoff.runtime.text import one_line
from signoff.runtime.tools import (
    Label,
    Prepared,
    Registry,
    ResultField,
    ResultFormat,
    ResultView,
    Revalidation,
    Tool,
    ToolContext,
    label_text,
)
from signoff.runtime.workflows import (
    EventGate,
    FunctionStep,
    Gate,
    HumanGate,
    Interrupt,
    Step,
    Workflow,
    WorkflowContext,
    WorkflowRun,
    WorkflowStatus,
    await_event,
    await_human,
)
from signoff.runtime.workflows.agent_step import AgentStep, Edit, agent_step

__version__ = "0.4.0"

__all__ = [
    "AgentStep",
    "AlreadyDecided",
    "App",
    "AppLoadError",
    "AppMismatch",
    "CardNotFound",
    "ConfigError",
    "Conflict",
    "Edit",
    "EventGate",
    "Expired",
    "Forbidden",
    "FunctionStep",
    "Gate",
    "HumanGate",
    "Interrupt",
    "InvalidInput",
    "Label",
    "Message",
    "Model",
    "ModelReply",
    "NotFound",
    "NotOwner",
    "NotParked",
    "NotRetriable",
    "Policy",
    "Prepared",
    "RateLimited",
    "Registry",
    "ReservedKey",
    "ResultField",
    "ResultFormat",
    "ResultView",
    "Revalidation",
    "Risk",
    "Rule",
    "SignoffError",
    "StaleCard",
    "Step",
    "TextSink",
    "Tool",
    "ToolContext",
    "ToolRefused",
    "ToolSpec",
    "ToolValidationError",
    "Unauthenticated",
    "Unavailable",
    "UnknownTool",
    "Verdict",
    "Workflow",
    "WorkflowContext",
    "WorkflowNotFound",
    "WorkflowRun",
    "WorkflowStatus",
    "WorkflowThread",
    "WrongEvent",
    "__version__",
    "agent_step",
    "await_event",
    "await_human",
    "label_text",
    "one_line",
]
