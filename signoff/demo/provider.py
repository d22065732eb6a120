"""The demo payments provider: a tiny "bank" in Postgres.

Its charges and refunds tables have a unique idempotency key, so a test can
count that each approved charge exists exactly once at the provider (I4).
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import os
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

import asyncpg

from signoff import ToolRefused
from signoff.demo.money import brl

P = ParamSpec("P")
T = TypeVar("T")

# The provider's database did not answer, or stopped the statement for a reason of its
# own (gone, restarting, shutting down, a statement cancelled, out of resources): the
# caller cannot know whether a write went in. A real provider's client raises a timeout
# or a connection error here; signoff reads those as an unknown outcome and asks again
# with the same idempotency key, where any other error is a failure recorded for good
# (a Postgres restart under load made approvals `failed`, nothing charged).
NO_ANSWER: tuple[type[BaseException], ...] = (
    OSError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.PostgresConnectionError,
    asyncpg.exceptions.InternalClientError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.InsufficientResourcesError,
    asyncpg.exceptions.PostgresSystemError,
    asyncpg.exceptions.InternalServerError,
    # Rolled back for a passing reason (a deadlock, a serialization failure, a session
    # ended idle in its transaction): nothing was written, and asking again with the same
    # key is what a provider would have the caller do, not an approval lost for good.
    asyncpg.exceptions.TransactionRollbackError,
    asyncpg.exceptions.IdleInTransactionSessionTimeoutError,
    # A standby, a demoted primary, a database set read-only: the write was refused, and
    # a session opened then stays read-only for its life (see ``answered``).
    asyncpg.exceptions.ReadOnlySQLTransactionError,
)


def answered(fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """A provider call whose database did not answer raises ``ConnectionError``.

    A read-only refusal also closes the pool's sessions (each is replaced when next
    taken): one opened while the database was read-only stays so after the setting is
    lifted or a new primary takes over, and every write that drew it failed again (a
    third of the approvals after a read-only minute, long after Postgres took writes)."""

    @functools.wraps(fn)
    async def call(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await fn(*args, **kwargs)
        except NO_ANSWER as exc:
            if isinstance(exc, asyncpg.exceptions.ReadOnlySQLTransactionError):
                provider = args[0]
                if isinstance(provider, Provider):
                    await provider.pool.expire_connections()
            raise ConnectionError(f"the provider did not answer: {exc}") from exc

    return call


# Bump when the demo tables change: a dev database with older demo tables is reset.
SCHEMA_VERSION = 2
TABLES = (
    "demo_refunds",
    "demo_charges",
    "demo_appointments",
    "demo_sales",
    "demo_accounts",
    "demo_customers",
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS demo_meta (version int NOT NULL);
CREATE TABLE IF NOT EXISTS demo_customers (
    id        text PRIMARY KEY,
    tenant    text NOT NULL,
    name      text NOT NULL,
    cpf       text NOT NULL,
    email     text NOT NULL,
    active    boolean NOT NULL DEFAULT true
);
CREATE TABLE IF NOT EXISTS demo_accounts (
    tenant    text PRIMARY KEY,
    balance   bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS demo_sales (
    id          text NOT NULL,
    tenant      text NOT NULL,
    customer_id text NOT NULL REFERENCES demo_customers (id),
    amount      bigint NOT NULL,
    refunded    bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, id)
);
CREATE TABLE IF NOT EXISTS demo_appointments (
    id          text NOT NULL,
    tenant      text NOT NULL,
    customer_id text NOT NULL REFERENCES demo_customers (id),
    at          text NOT NULL,
    status      text NOT NULL DEFAULT 'scheduled',
    PRIMARY KEY (tenant, id)
);
CREATE TABLE IF NOT EXISTS demo_charges (
    id               bigserial PRIMARY KEY,
    idempotency_key  text NOT NULL UNIQUE,
    tenant           text NOT NULL,
    customer_id      text NOT NULL,
    amount           bigint NOT NULL,
    description      text NOT NULL DEFAULT '',
    created_at       timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS demo_refunds (
    id               bigserial PRIMARY KEY,
    idempotency_key  text NOT NULL UNIQUE,
    tenant           text NOT NULL,
    sale_id          text NOT NULL,
    amount           bigint NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now()
);
"""

SEED_CUSTOMERS = [
    ("c-joao", "João Silva", "123.123.456-78", "joao@example.com"),
    ("c-maria", "Maria Souza", "987.654.321-00", "maria@example.com"),
    ("c-ana", "Ana Lima", "111.222.333-44", "ana@example.com"),
]


async def _no_reset(conn: Any) -> None:
    """Nothing to reset between uses (see Provider.connect)."""


_FOLD = "translate(lower({}), 'áàâãäéèêëíìîïóòôõöúùûüçñ', 'aaaaaeeeeiiiiooooouuuucn')"


class RefundRefused(ToolRefused):
    """The provider refuses a refund larger than what is left of the sale (the card fails
    with this message; nothing was moved)."""


class Provider:
    """The demo app's service handle, passed to tools as ``ctx.services``."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    @classmethod
    async def connect(cls, url: str, statement_cache_size: int | None = None) -> Provider:
        """``statement_cache_size``: asyncpg's, by default ``SIGNOFF_DB_STATEMENT_CACHE_SIZE``
        (0 behind PgBouncer < 1.21 in transaction pooling mode) or 100."""
        if statement_cache_size is None:
            statement_cache_size = int(os.environ.get("SIGNOFF_DB_STATEMENT_CACHE_SIZE", "100"))
        # No reset query on release (asyncpg's default costs a round trip per call): the
        # provider's sessions never change settings, LISTEN or keep advisory locks (the
        # schema lock below is a transaction's, which also holds behind PgBouncer).
        pool = await asyncpg.create_pool(
            url,
            min_size=1,
            max_size=5,
            reset=_no_reset,
            statement_cache_size=statement_cache_size,
        )
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(7401553902)")
            await conn.execute(SCHEMA)
            version = await conn.fetchval("SELECT max(version) FROM demo_meta")
            if version != SCHEMA_VERSION:
                # demo data only: start over rather than migrate
                await conn.execute(f"DROP TABLE IF EXISTS {', '.join(TABLES)} CASCADE")
                await conn.execute(SCHEMA)
                await conn.execute("DELETE FROM demo_meta")
                await conn.execute("INSERT INTO demo_meta VALUES ($1)", SCHEMA_VERSION)
        return cls(pool)

    async def close(self) -> None:
        """Closes the pool; connections that do not answer (a half-open link) are cut after
        a few seconds, so a worker's stop is not held up by them."""
        try:
            await asyncio.wait_for(self.pool.close(), 5)
        except (TimeoutError, OSError, asyncpg.InterfaceError):
            self.pool.terminate()

    async def seed(self, tenant: str, balance: int = 500_000) -> None:
        """Idempotent demo data for a tenant (customers, a balance, sales, appointments)."""
        async with self.pool.acquire() as conn, conn.transaction():
            for cid, name, cpf, email in SEED_CUSTOMERS:
                await conn.execute(
                    "INSERT INTO demo_customers (id, tenant, name, cpf, email) "
                    "VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO NOTHING",
                    f"{tenant}:{cid}",
                    tenant,
                    name,
                    cpf,
                    email,
                )
            await conn.execute(
                "INSERT INTO demo_accounts (tenant, balance) VALUES ($1, $2) "
                "ON CONFLICT (tenant) DO NOTHING",
                tenant,
                balance,
            )
            for i, (cid, amount) in enumerate([("c-joao", 15000), ("c-maria", 8990)], start=1):
                await conn.execute(
                    "INSERT INTO demo_sales (id, tenant, customer_id, amount) VALUES ($1, $2, $3, $4) "
                    "ON CONFLICT (tenant, id) DO NOTHING",
                    f"V{i:03d}",
                    tenant,
                    f"{tenant}:{cid}",
                    amount,
                )
            # Appointments ahead of the day the demo is first run (fixed dates went by,
            # and the demo offered to cancel appointments already past: a newcomer probe).
            today = datetime.date.today()
            ahead = [(1, "c-joao", "14:00"), (2, "c-ana", "09:30")]
            for i, (cid, at) in enumerate(
                [(c, f"{today + datetime.timedelta(days=d)} {hm}") for d, c, hm in ahead], start=1
            ):
                await conn.execute(
                    "INSERT INTO demo_appointments (id, tenant, customer_id, at) "
                    "VALUES ($1, $2, $3, $4) ON CONFLICT (tenant, id) DO NOTHING",
                    f"A{i:03d}",
                    tenant,
                    f"{tenant}:{cid}",
                    at,
                )

    @answered
    async def find_customers(self, tenant: str, query: str) -> list[dict[str, Any]]:
        rows = await self.pool.fetch(
            # Accents and case aside: "joao" finds João, as a person typing expects.
            "SELECT id, name, cpf, email, active FROM demo_customers "
            f"WHERE tenant = $1 AND ({_FOLD.format('name')} LIKE {_FOLD.format('$2')} ESCAPE '\\' "
            "OR id = $3) ORDER BY name",
            tenant,
            # "%" or "_" in a name asked for is that character, not every customer (a
            # hostile probe: a model asking for "%" would list the tenant's customers)
            "%" + query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%",
            query,
        )
        return [dict(r) for r in rows]

    @answered
    async def customer(self, customer_id: str) -> dict[str, Any] | None:
        row = await self.pool.fetchrow(
            "SELECT id, tenant, name, cpf, email, active FROM demo_customers WHERE id = $1",
            customer_id,
        )
        return None if row is None else dict(row)

    @answered
    async def balance(self, tenant: str) -> int:
        value = await self.pool.fetchval(
            "SELECT balance FROM demo_accounts WHERE tenant = $1", tenant
        )
        return int(value or 0)

    async def set_balance(self, tenant: str, balance: int) -> None:
        await self.pool.execute(
            "INSERT INTO demo_accounts (tenant, balance) VALUES ($1, $2) "
            "ON CONFLICT (tenant) DO UPDATE SET balance = EXCLUDED.balance",
            tenant,
            balance,
        )

    @answered
    async def sale(self, tenant: str, sale_id: str) -> dict[str, Any] | None:
        row = await self.pool.fetchrow(
            "SELECT s.id, s.amount, s.refunded, c.name, c.cpf FROM demo_sales s "
            "JOIN demo_customers c ON c.id = s.customer_id WHERE s.tenant = $1 AND s.id = $2",
            tenant,
            sale_id,
        )
        return None if row is None else dict(row)

    @answered
    async def appointment(self, tenant: str, appointment_id: str) -> dict[str, Any] | None:
        row = await self.pool.fetchrow(
            "SELECT a.id, a.at, a.status, c.name FROM demo_appointments a "
            "JOIN demo_customers c ON c.id = a.customer_id WHERE a.tenant = $1 AND a.id = $2",
            tenant,
            appointment_id,
        )
        return None if row is None else dict(row)

    @answered
    async def create_charge(
        self, key: str, tenant: str, customer_id: str, amount: int, description: str
    ) -> dict[str, Any]:
        """Idempotent by key: the same key returns the first charge, never a second one."""
        async with self.pool.acquire() as conn:
            row = await conn.fetchrow(
                "INSERT INTO demo_charges (idempotency_key, tenant, customer_id, amount, description) "
                "VALUES ($1, $2, $3, $4, $5) ON CONFLICT (idempotency_key) DO NOTHING "
                "RETURNING id, amount",
                key,
                tenant,
                customer_id,
                amount,
                description,
            )
            if row is None:
                row = await conn.fetchrow(
                    "SELECT id, amount FROM demo_charges WHERE idempotency_key = $1", key
                )
        assert row is not None
        return {
            "charge_id": f"pix-{row['id']}",
            "amount": row["amount"],
            "copy_paste": f"00020126PIX{row['id']:08d}",
        }

    @answered
    async def refund(self, key: str, tenant: str, sale_id: str, amount: int) -> dict[str, Any]:
        async with self.pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                "INSERT INTO demo_refunds (idempotency_key, tenant, sale_id, amount) "
                "VALUES ($1, $2, $3, $4) ON CONFLICT (idempotency_key) DO NOTHING RETURNING id",
                key,
                tenant,
                sale_id,
                amount,
            )
            if row is not None:
                # Never more than the sale: two refunds that both passed revalidation
                # (one in flight while the other checked) cannot both be made.
                status = await conn.execute(
                    "UPDATE demo_sales SET refunded = refunded + $3 WHERE tenant = $1 AND id = $2"
                    " AND refunded + $3 <= amount",
                    tenant,
                    sale_id,
                    amount,
                )
                if status != "UPDATE 1":
                    raise RefundRefused(
                        f"sale {sale_id} has less than {brl(amount)} left to refund"
                    )
                await conn.execute(
                    "UPDATE demo_accounts SET balance = balance - $2 WHERE tenant = $1",
                    tenant,
                    amount,
                )
            else:
                row = await conn.fetchrow(
                    "SELECT id FROM demo_refunds WHERE idempotency_key = $1", key
                )
        assert row is not None
        return {"refund_id": f"rf-{row['id']}", "amount": amount}

    @answered
    async def cancel_appointment(self, tenant: str, appointment_id: str) -> dict[str, Any]:
        await self.pool.execute(
            "UPDATE demo_appointments SET status = 'cancelled' WHERE tenant = $1 AND id = $2",
            tenant,
            appointment_id,
        )
        return {"appointment_id": appointment_id, "status": "cancelled"}

    @answered
    async def update_email(self, customer_id: str, email: str) -> dict[str, Any]:
        await self.pool.execute(
            "UPDATE demo_customers SET email = $2 WHERE id = $1", customer_id, email
        )
        return {"customer_id": customer_id, "email": email}
