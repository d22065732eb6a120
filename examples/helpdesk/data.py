"""The helpdesk's own data: a tiny shop in Postgres (orders, accounts, refunds).

Each customer (the signed-in user) gets three sample orders and an open account the
first time the helpdesk looks them up, so any user of any tenant can try it. Every
change is recorded in ``helpdesk_operations`` under signoff's ``operation_id``, in the
same transaction as the change itself: a repeated call with the same id changes nothing
(the provider side of "at most once").
"""

from __future__ import annotations

import json
import os
from typing import Any

import asyncpg

SCHEMA = """
CREATE TABLE IF NOT EXISTS helpdesk_orders (
    tenant          text NOT NULL,
    customer        text NOT NULL,
    id              text NOT NULL,
    item            text NOT NULL,
    total_cents     bigint NOT NULL,
    refunded_cents  bigint NOT NULL DEFAULT 0,
    status          text NOT NULL CHECK (status IN ('processing', 'shipped', 'delivered')),
    address         text NOT NULL,
    PRIMARY KEY (tenant, customer, id)
);
CREATE TABLE IF NOT EXISTS helpdesk_accounts (
    tenant    text NOT NULL,
    customer  text NOT NULL,
    email     text NOT NULL,
    status    text NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'closed')),
    PRIMARY KEY (tenant, customer)
);
CREATE TABLE IF NOT EXISTS helpdesk_operations (
    operation_id  text PRIMARY KEY,
    tenant        text NOT NULL,
    customer      text NOT NULL,
    kind          text NOT NULL,
    detail        jsonb NOT NULL,
    at            timestamptz NOT NULL DEFAULT now()
);
"""

SAMPLE_ORDERS = [
    ("A100", "Wireless mouse", 2_500, "delivered", "221B Baker Street, London"),
    ("A101", "Mechanical keyboard", 8_900, "processing", "221B Baker Street, London"),
    ("A102", "USB-C dock", 14_900, "shipped", "221B Baker Street, London"),
]


def money(cents: int) -> str:
    return f"${cents // 100:,}.{cents % 100:02d}"


class Shop:
    """The helpdesk's provider: reads and idempotent writes on its own tables."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self._seeded: set[tuple[str, str]] = set()

    @classmethod
    async def connect(cls, database_url: str) -> Shop:
        # Behind PgBouncer < 1.21 in transaction mode, deployments set the statement cache
        # to 0 (the same variable signoff's own store reads).
        cache = int(os.environ.get("SIGNOFF_DB_STATEMENT_CACHE_SIZE", "100"))
        pool = await asyncpg.create_pool(
            database_url, min_size=1, max_size=4, statement_cache_size=cache
        )
        async with pool.acquire() as conn, conn.transaction():
            # one process creates the tables at a time (gateways and workers start together)
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext('helpdesk-schema'))")
            await conn.execute(SCHEMA)
        return cls(pool)

    async def close(self) -> None:
        await self.pool.close()

    async def _ensure_customer(self, tenant: str, customer: str) -> None:
        if (tenant, customer) in self._seeded:
            return
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "INSERT INTO helpdesk_accounts (tenant, customer, email) VALUES ($1, $2, $3)"
                " ON CONFLICT DO NOTHING",
                tenant,
                customer,
                f"{customer}@example.com",
            )
            await conn.executemany(
                "INSERT INTO helpdesk_orders"
                " (tenant, customer, id, item, total_cents, status, address)"
                " VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
                [(tenant, customer, *order) for order in SAMPLE_ORDERS],
            )
        self._seeded.add((tenant, customer))

    async def order(self, tenant: str, customer: str, order_id: str) -> dict[str, Any] | None:
        await self._ensure_customer(tenant, customer)
        row = await self.pool.fetchrow(
            "SELECT id, item, total_cents, refunded_cents, status, address FROM helpdesk_orders"
            " WHERE tenant = $1 AND customer = $2 AND id = $3",
            tenant,
            customer,
            order_id,
        )
        return None if row is None else dict(row)

    async def account(self, tenant: str, customer: str) -> dict[str, Any]:
        await self._ensure_customer(tenant, customer)
        row = await self.pool.fetchrow(
            "SELECT customer, email, status FROM helpdesk_accounts"
            " WHERE tenant = $1 AND customer = $2",
            tenant,
            customer,
        )
        assert row is not None
        return dict(row)

    async def _once(
        self, conn: Any, operation_id: str, tenant: str, customer: str, kind: str, detail: Any
    ) -> bool:
        """Record the operation; False when this id was already done (change nothing)."""
        done = await conn.fetchval(
            "INSERT INTO helpdesk_operations (operation_id, tenant, customer, kind, detail)"
            " VALUES ($1, $2, $3, $4, $5::jsonb) ON CONFLICT DO NOTHING RETURNING 1",
            operation_id,
            tenant,
            customer,
            kind,
            json.dumps(detail),
        )
        return done is not None

    async def refund(
        self, tenant: str, customer: str, order_id: str, cents: int, operation_id: str
    ) -> dict[str, Any]:
        async with self.pool.acquire() as conn, conn.transaction():
            detail = {"order_id": order_id, "amount_cents": cents}
            if await self._once(conn, operation_id, tenant, customer, "refund", detail):
                await conn.execute(
                    "UPDATE helpdesk_orders SET refunded_cents = refunded_cents + $4"
                    " WHERE tenant = $1 AND customer = $2 AND id = $3",
                    tenant,
                    customer,
                    order_id,
                    cents,
                )
        return {"refunded": money(cents), "order_id": order_id, "operation_id": operation_id}

    async def change_address(
        self, tenant: str, customer: str, order_id: str, address: str, operation_id: str
    ) -> dict[str, Any]:
        async with self.pool.acquire() as conn, conn.transaction():
            detail = {"order_id": order_id, "address": address}
            if await self._once(conn, operation_id, tenant, customer, "address", detail):
                await conn.execute(
                    "UPDATE helpdesk_orders SET address = $4"
                    " WHERE tenant = $1 AND customer = $2 AND id = $3",
                    tenant,
                    customer,
                    order_id,
                    address,
                )
        return {"order_id": order_id, "address": address}

    async def close_account(
        self, tenant: str, customer: str, reason: str, operation_id: str
    ) -> dict[str, Any]:
        async with self.pool.acquire() as conn, conn.transaction():
            detail = {"reason": reason}
            if await self._once(conn, operation_id, tenant, customer, "close", detail):
                await conn.execute(
                    "UPDATE helpdesk_accounts SET status = 'closed'"
                    " WHERE tenant = $1 AND customer = $2",
                    tenant,
                    customer,
                )
        return {"account": customer, "status": "closed"}

    async def operations(self, tenant: str, customer: str) -> int:
        value = await self.pool.fetchval(
            "SELECT count(*) FROM helpdesk_operations WHERE tenant = $1 AND customer = $2",
            tenant,
            customer,
        )
        return int(value)
