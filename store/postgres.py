"""The Postgres store (asyncpg): the truth of signoff, as the runtime's ``Store``.

The store is procrastinate-shaped:

* ``store/queries.sql`` — every statement, by name (``store/queries.py`` loads them);
* ``store/connector.py`` — one pool, statements and transactions, retries of lost
  races, driver errors translated to ``signoff.runtime.errors``;
* a manager per aggregate — ``threads.py`` (threads and their log), ``runs.py``,
  ``workers.py`` (leases), ``cards.py`` (proposals, decisions, moves) and ``sweeps.py``
  (what the clock and operators look after);
* ``schema.py`` — migrations; ``pool.py`` — the connection pool.

:class:`PostgresStore` composes them into the one object the engine is given, so the
engine's calls read ``store.decide(...)`` whatever the module behind them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from signoff.runtime.errors import Unavailable
from signoff.store.apps import Apps
from signoff.store.cards import Cards
from signoff.store.connector import Connector
from signoff.store.operator import Operator
from signoff.store.queries import SQL
from signoff.store.retention import Retention
from signoff.store.runs import Runs
from signoff.store.schema import migrate
from signoff.store.sweeps import Sweeps
from signoff.store.threads import Threads
from signoff.store.whatsapp import WhatsAppRows
from signoff.store.workers import Workers
from signoff.store.workflows import WorkflowRows


class _ReadOnlySession(Exception):
    """A session that cannot write answered the readiness check."""


if TYPE_CHECKING:
    from signoff.runtime.store import Store


class PostgresStore:
    """The :class:`~signoff.runtime.store.Store` on Postgres: a facade over one
    :class:`~signoff.store.connector.Connector` and the managers. Each protocol method is
    the manager's own (see it for the docs)."""

    def __init__(self, db: Connector) -> None:
        self.db = db
        self.pool = db.pool  # for raw SQL in tools and tests
        self.threads = threads = Threads(db)
        self.runs = runs = Runs(db)
        self.workers = workers = Workers(db)
        self.cards = cards = Cards(db)
        self.sweeps = sweeps = Sweeps(db)
        self.apps = apps = Apps(db)
        self.whatsapp = WhatsAppRows(db)  # the WhatsApp channel's rows (not the engine's)
        self.workflows = WorkflowRows(db)  # workflow runs, interrupts, kept events
        self.retention = Retention(db)  # `signoff prune` and the workers' scheduled prune
        self.operator = Operator(db)  # `signoff cards`: filters, ids by prefix

        self.create_thread = threads.create_thread
        self.create_thread_within_quota = threads.create_thread_within_quota
        self.thread_age = threads.thread_age
        self.get_thread = threads.get_thread
        self.list_threads = threads.list_threads
        self.delete_empty_thread = threads.delete_empty_thread
        self.append = threads.append
        self.entries_after = threads.entries_after
        self.conversation = threads.conversation

        self.start_run = runs.start_run
        self.start_quiet_run = runs.start_quiet_run
        self.get_run = runs.get_run
        self.run_age = runs.run_age
        self.runs_held_among = runs.runs_held_among
        self.active_run = runs.active_run
        self.set_run = runs.set_run
        self.run_step = runs.run_step
        self.run_with_cards = runs.run_with_cards
        self.turns_in_flight = runs.turns_in_flight

        self.renew_leases = workers.renew_leases
        self.lease_of = workers.lease_of
        self.execution_fence = workers.execution_fence
        self.release_runs = workers.release_runs
        self.release_idle = workers.release_idle
        self.adopt_runs = workers.adopt_runs
        self.forget_workers = workers.forget_workers

        self.propose = cards.propose
        self.get_card = cards.get_card
        self.card_input = cards.card_input
        self.cards_of_run = cards.cards_of_run
        self.pending_cards = cards.pending_cards
        self.tool_use_outcomes = cards.tool_use_outcomes
        self.list_cards = cards.list_cards
        self.card_events = cards.card_events
        self.decide = cards.decide
        self.edit = cards.edit
        self.move = cards.move
        self.begin_execution = cards.begin_execution
        self.read_back_begin = cards.read_back_begin
        self.finish_execution = cards.finish_execution
        self.expire = cards.expire
        self.decided_among = cards.decided_among
        self.approved_held = cards.approved_held

        self.overdue_card_ids = sweeps.overdue_card_ids
        self.approved_stale = sweeps.approved_stale
        self.flag_stuck = sweeps.flag_stuck
        self.flag_elsewhere = sweeps.flag_elsewhere
        self.late_outcome = sweeps.late_outcome
        self.reconcile = sweeps.reconcile

        self.join_app = apps.join_app
        self.beat_app = apps.beat_app
        self.leave_app = apps.leave_app
        self.installation_id = apps.installation_id
        self.app_processes = apps.app_processes
        self.hand_over_run = apps.hand_over_run

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        timeout: float | None = None,
        statement_cache_size: int | None = None,
    ) -> PostgresStore:
        """``timeout`` bounds connecting, waiting for a pooled connection and each statement;
        ``statement_cache_size`` 0 behind PgBouncer < 1.21 in transaction pooling mode
        (see :meth:`Connector.connect`)."""
        return cls(
            await Connector.connect(
                url,
                min_size=min_size,
                max_size=max_size,
                timeout=timeout,
                statement_cache_size=statement_cache_size,
            )
        )

    async def close(self) -> None:
        await self.db.close()

    async def migrate(self) -> list[str]:
        """Apply pending migrations in order; return the versions applied now."""
        return await migrate(self.db)

    async def ping(self, *, writable: bool = False) -> None:
        """Postgres answers (``/readyz``); ``writable`` (a worker's): and takes writes. A
        standby, a demoted primary or a database set read-only answers ``SELECT 1`` while
        every write of a step fails. The session that answered read-only is closed, not
        pooled again, and one other session is asked (an idle one may predate the setting
        being lifted; behind PgBouncer its server sessions keep it, as writes do)."""

        async def check(conn: Any) -> None:
            can_write = await conn.fetchval(SQL.ping)  # asked either way: Postgres answers
            if writable and not can_write:
                raise _ReadOnlySession  # not a driver error: the session is not pooled again

        for _ in range(2):
            try:
                await self.db.on_connection(check)
                return
            except _ReadOnlySession:
                continue
        raise Unavailable("Postgres is read-only (a standby?): nothing can be written")


if TYPE_CHECKING:

    def _is_a_store(store: PostgresStore) -> Store:
        return store  # mypy checks the facade against the runtime's protocol here
