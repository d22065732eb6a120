"""The store the engine runs on, as the engine sees it.

:class:`Store` lists exactly what the agent loop, the worker, decisions, hint fan-out and
the gateway's service ask of the truth (Postgres in production: ``signoff.store``, wired
in by the composition root, ``runtime/node.py``). Nothing here imports a backend.

What every implementation must keep (the tests in ``tests/integration`` hold the Postgres
one to it):

* Every card transition (``propose``, ``decide``, ``move``, ``begin_execution``,
  ``finish_execution``, ``expire``) is atomic with its ``card_events`` row and its
  thread-log entry, and conditional on the card's current status, so concurrent
  processes race safely: exactly one of them gets a :class:`~signoff.runtime.records.Moved`
  back, the others ``None`` (or a typed error for a decision).
* A run's writes (``run_step``, ``append`` with a run, ``set_run``) happen only while the
  run is active and, given ``holder``, held by that worker; otherwise
  :class:`~signoff.runtime.errors.RunInactive` and nothing is written.
* Locks are taken in one order, the thread, then the run, then cards.
* A backend that does not answer raises :class:`~signoff.runtime.errors.Unavailable`;
  a lost race it could not order (deadlock, serialization failure) is retried inside
  and then answered as a retriable ``Unavailable``, never as a driver error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Protocol

from signoff.runtime.cards import Card, Decision, Status
from signoff.runtime.records import (
    CardEvent,
    Entry,
    Moved,
    NewCard,
    Run,
    Thread,
    ThreadSummary,
    ToolUseOutcome,
)
from signoff.runtime.workflows.definition import WorkflowStatus
from signoff.runtime.workflows.records import GateOpening, Interrupt, Passed, WorkflowRun

# A gate's payload validated for the gate at a step index (raises InvalidInput).
PayloadFor = Callable[[int], dict[str, Any]]


class WorkflowStore(Protocol):
    """Workflow runs, their interrupts (gates) and early events (``store/workflows.py``).

    Every method that changes a run locks the run row first, then its interrupts; a gate
    is resolved by one conditional transaction (the open interrupt and the run's status),
    so of two racing resolutions one commits and the other gets ``NotParked``. A step's
    completion (state merge, step + 1) is one statement fenced by holder and step index.
    """

    async def create_run(
        self, run_id: str, *, tenant: str, owner: str, app: str, workflow: str, input: Any
    ) -> tuple[WorkflowRun, bool]: ...

    async def create_run_within_quota(
        self,
        run_id: str,
        *,
        tenant: str,
        owner: str,
        app: str,
        workflow: str,
        input: Any,
        limit: int,
        window_seconds: float,
    ) -> tuple[WorkflowRun | None, bool, float]: ...

    async def get_workflow_run(self, run_id: str) -> WorkflowRun: ...

    async def interrupts(self, run_id: str) -> list[Interrupt]: ...

    async def list_workflow_runs(
        self,
        *,
        tenant: str | None = None,
        owner: str | None = None,
        status: str | None = None,
        limit: int = 100,
    ) -> list[WorkflowRun]: ...

    async def claim(
        self, run_id: str, holder: str, app: str, workflows: list[str]
    ) -> WorkflowRun | None: ...

    async def complete_step(
        self, run_id: str, holder: str, step: int, name: str, update: dict[str, Any], n_steps: int
    ) -> WorkflowRun: ...

    async def fail_run(self, run_id: str, holder: str, error: str) -> WorkflowRun | None: ...

    async def open_gate(
        self, run_id: str, holder: str, step: int, gate: GateOpening, n_steps: int
    ) -> tuple[WorkflowRun, Interrupt]: ...

    async def resolve_gate(
        self,
        run_id: str,
        *,
        kind: str,
        payload_for: PayloadFor,
        by: str,
        n_steps: int,
        automatic: bool = False,
    ) -> Passed: ...

    async def pass_gate(
        self,
        run_id: str,
        *,
        status: WorkflowStatus,
        step: int,
        payload: dict[str, Any],
        by: str,
        n_steps: int,
        event: str | None = None,
        automatic: bool = False,
    ) -> Passed | None: ...

    async def deliver_event(
        self,
        run_id: str,
        name: str,
        *,
        payload_for: PayloadFor,
        lookback_steps: list[int],
        by: str,
        n_steps: int,
        kept_limit: int = 0,
        kept_window: float = 0.0,
        event_id: str | None = None,
    ) -> Passed: ...

    async def time_out(
        self,
        interrupt_id: str,
        run_id: str,
        *,
        response_for: Callable[[Interrupt], dict[str, Any] | None],
        n_steps: int,
    ) -> Passed | None: ...

    async def retry_gate(
        self, run_id: str, *, timeout_for: Callable[[int], float | None]
    ) -> tuple[WorkflowRun, Interrupt]: ...

    async def cancel_run(self, run_id: str, by: str) -> WorkflowRun: ...

    async def due_runs(self, holder: str, limit: int = 1000) -> list[str]: ...

    async def adopt_workflow_runs(
        self,
        holder: str,
        lease_seconds: float,
        app: str,
        workflows: list[str],
        limit: int = 1000,
        *,
        own: bool = False,
    ) -> list[str]: ...

    async def release_workflow_runs(self, holder: str) -> None: ...

    async def overdue_interrupts(
        self, app: str, workflows: list[str], limit: int = 500
    ) -> list[tuple[str, str]]: ...


class Store(Protocol):
    """Threads and their log, runs and their holders, cards and their audit."""

    @property
    def workflows(self) -> WorkflowStore:
        """Workflow runs and their gates."""
        ...

    async def ping(self, *, writable: bool = False) -> None:
        """Answer or raise ``Unavailable`` (readiness); ``writable``: also when the store
        answers but cannot write (a worker's readiness)."""
        ...

    # -- threads and the thread log ------------------------------------------------

    async def create_thread(self, tenant: str, owner: str, thread_id: str | None = None) -> Thread:
        """A new thread (``thread_id``: of that id, or :class:`Conflict` if it exists)."""
        ...

    async def create_thread_within_quota(
        self,
        tenant: str,
        owner: str,
        *,
        limit: int,
        window_seconds: float,
        thread_id: str | None = None,
    ) -> tuple[Thread | None, float]:
        """A new thread, or ``(None, seconds to wait)`` when ``owner`` made ``limit`` in
        the last ``window_seconds`` (exact across processes); ``thread_id`` as above."""
        ...

    async def get_thread(self, thread_id: str) -> Thread: ...

    async def list_threads(
        self, tenant: str, owner: str, limit: int = 50
    ) -> list[ThreadSummary]: ...

    async def delete_empty_thread(self, thread_id: str) -> bool: ...

    async def append(
        self,
        thread_id: str,
        kind: str,
        body: dict[str, Any],
        run_id: str | None = None,
        *,
        holder: str | None = None,
    ) -> Entry: ...

    async def entries_after(
        self, thread_id: str, after_seq: int, limit: int = 1000
    ) -> list[Entry]: ...

    async def conversation(self, thread_id: str) -> list[Entry]: ...

    # -- runs ------------------------------------------------------------------------

    async def start_run(
        self,
        thread_id: str,
        *,
        owner: str,
        role: str,
        holder: str,
        lease_seconds: float,
        content: list[dict[str, Any]],
        actor: str,
        channel: str | None,
        run_id: str | None = None,
        logged: list[Entry] | None = None,
    ) -> tuple[Run, list[Card], list[Run], bool]:
        """Supersede the thread's active run and its open cards, start a run held by
        ``holder`` and append the user message; returns the run, the cards moved, the
        runs superseded and whether the run is new (a known ``run_id`` is found, I5).
        On a quiet thread (nothing to supersede) it is one statement, and the message's
        log entry is appended to ``logged`` for the thread's hint (else the gateways
        re-read the log)."""
        ...

    async def get_run(self, run_id: str) -> Run: ...

    async def thread_age(self, thread_id: str) -> float | None:
        """Seconds since the thread was created (the database's clock); None: no such thread."""
        ...

    async def run_age(self, run_id: str) -> float | None:
        """Seconds since the run was created (the database's clock); None: no such run."""
        ...

    async def runs_held_among(self, holder: str, run_ids: list[str]) -> set[str]:
        """Which of ``run_ids`` ``holder`` still holds (active and its own)."""
        ...

    async def active_run(self, thread_id: str) -> Run | None: ...

    async def set_run(
        self,
        run_id: str,
        status: str,
        state: dict[str, Any],
        error: str | None = None,
        *,
        holder: str | None = None,
    ) -> Run: ...

    async def run_step(
        self,
        run_id: str,
        thread_id: str,
        items: list[tuple[str, dict[str, Any]]],
        status: str,
        state: dict[str, Any],
        error: str | None = None,
        *,
        holder: str | None = None,
    ) -> tuple[list[Entry], Run]: ...

    async def run_with_cards(self, run_id: str) -> tuple[Run, list[Card], list[Entry]]: ...

    async def turns_in_flight(
        self, tenant: str, owner: str, accepted_run_ids: list[str]
    ) -> tuple[int, list[str]]: ...

    # -- workers (a run is held while its holder's lease is in the future) ----------

    async def renew_leases(self, holder: str, lease_seconds: float) -> None: ...

    async def lease_of(self, holder: str) -> tuple[datetime, float] | None: ...

    async def execution_fence(self, card_id: str, holder: str, lease_seconds: float) -> bool: ...

    async def release_runs(self, holder: str) -> None: ...

    async def release_idle(self, holder: str, busy: list[str]) -> list[str]: ...

    async def adopt_runs(
        self, holder: str, lease_seconds: float, limit: int = 1000, *, own: bool = False
    ) -> list[Run]: ...

    async def hand_over_run(
        self, run_id: str, holder: str, tool: str, live_seconds: float, app: str
    ) -> bool: ...

    async def forget_workers(self, idle_seconds: float = 3600.0) -> int: ...

    # -- cards -----------------------------------------------------------------------

    async def propose(self, new: NewCard) -> tuple[Card, Entry | None]: ...

    async def get_card(self, card_id: str) -> Card: ...

    async def card_input(self, card_id: str) -> dict[str, Any]: ...

    async def cards_of_run(self, run_id: str) -> list[Card]: ...

    async def pending_cards(self, thread_id: str) -> list[Card]: ...

    async def tool_use_outcomes(
        self, thread_id: str, tool_use_ids: list[str]
    ) -> dict[str, ToolUseOutcome]: ...

    async def card_events(self, card_id: str) -> list[CardEvent]: ...

    async def decide(
        self,
        card_id: str,
        *,
        principal: str,
        decision: Decision,
        snapshot_hash: str,
        channel: str,
        reason: str | None = None,
        tenant: str | None = None,
        tools: list[str] | None = None,
    ) -> Moved: ...

    async def edit(
        self,
        card_id: str,
        *,
        principal: str,
        snapshot_hash: str,
        channel: str,
        edits: dict[str, Any],
        new: NewCard,
        tenant: str | None = None,
    ) -> tuple[Card, Card]: ...

    async def move(
        self,
        card_id: str,
        src: Status,
        dst: Status,
        *,
        actor: str,
        result: dict[str, Any] | None = None,
        detail: dict[str, Any] | None = None,
    ) -> Moved | None: ...

    async def begin_execution(
        self,
        card_id: str,
        actor: str,
        holder: str | None = None,
        in_flight_seconds: float | None = None,
        attempt: str | None = None,
    ) -> Moved | None: ...

    async def read_back_begin(self, card_id: str, attempt: str) -> tuple[Card, str | None]: ...

    async def finish_execution(
        self, card_id: str, *, ok: bool, result: dict[str, Any], actor: str
    ) -> Moved | None: ...

    async def expire(self, card_id: str) -> Moved | None: ...

    async def decided_among(self, card_ids: list[str]) -> dict[str, str]: ...

    async def approved_held(
        self, worker_id: str, limit: int = 1000, tools: Sequence[str] | None = None
    ) -> dict[str, str]: ...

    async def overdue_card_ids(self, limit: int = 500) -> list[str]: ...

    async def approved_stale(
        self, older_than_seconds: float, limit: int = 500
    ) -> list[tuple[Card, bool, str | None]]: ...

    async def flag_stuck(self, threshold_seconds: float) -> list[Card]: ...

    async def flag_elsewhere(
        self, run_id: str, holder: str, card_ids: list[str], reason: str = ...
    ) -> list[str]: ...

    async def late_outcome(
        self, card_id: str, outcome: str, result: dict[str, Any], actor: str
    ) -> Status | None: ...
