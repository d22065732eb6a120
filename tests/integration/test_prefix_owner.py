"""One app, on one database, per Redis key prefix (runtime/prefix_owner.py). A newcomer
probe ran two apps with their own databases on one Redis and one prefix, as the README's
"give each app its own database" allowed: each app's workers took the other's inbox
messages, and a message accepted with a 202 whose thread was not in the taker's database
was never run. Real Redis, real processes' start path (``node.running``)."""

from __future__ import annotations

import asyncio
import secrets

import pytest

from signoff.runtime import node as node_module
from signoff.runtime import prefix_owner
from signoff.runtime.bus.redis import RedisBus
from signoff.runtime.config import from_env
from signoff.runtime.keys import Keys
from tests import services

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


def test_a_database_is_named_without_its_credentials() -> None:
    assert (
        prefix_owner.database_identity("postgresql://app:s3cret@DB.example:6432/pay?x=1")
        == "db.example:6432/pay"
    )
    assert prefix_owner.database_identity("postgresql://h/") == "h:5432/<default>"


async def test_a_prefix_held_by_another_app_or_database_is_refused() -> None:
    keys = Keys(f"po-{secrets.token_hex(4)}:")
    bus = RedisBus.from_url(services.redis_url(), keys)
    try:
        mine = prefix_owner.owner_of("payments", "db-1")
        async with prefix_owner.hold(bus, mine, where="test"):
            async with prefix_owner.hold(bus, mine, where="test"):  # its own app's processes
                pass
            for other in (
                prefix_owner.owner_of("helpdesk", "db-2"),
                prefix_owner.owner_of("payments", "db-3"),
            ):
                with pytest.raises(prefix_owner.PrefixTaken, match="app 'payments' on database"):
                    async with prefix_owner.hold(bus, other, where="test"):
                        pass
                async with prefix_owner.hold(bus, other, where="test", allow_skew=True):
                    pass  # a rename in a rolling deploy: warned, not refused
            assert await bus.claim_owner(mine, 1000) == mine
        # Its processes gone, the claim lapses and another app may take the prefix.
        await bus.client.redis.pexpire(keys.owner, 1)
        await asyncio.sleep(0.05)
        other = prefix_owner.owner_of("helpdesk", "db-2")
        async with prefix_owner.hold(bus, other, where="test"):
            assert await bus.claim_owner(mine, 1000) == other
    finally:
        await bus.client.redis.delete(keys.owner)
        await bus.close()


async def test_a_second_apps_process_on_the_same_prefix_refuses_to_start(
    database_url: str,
) -> None:
    from signoff.demo import app as demo_app
    from tests.agent_wf_app import build as other_app

    prefix = f"po-{secrets.token_hex(4)}:"
    env = {
        "SIGNOFF_DATABASE_URL": database_url,
        "SIGNOFF_REDIS_URL": services.redis_url(),
        "SIGNOFF_KEY_PREFIX": prefix,
        "SIGNOFF_DB_STATEMENT_CACHE_SIZE": "0",  # the suite's PgBouncer pass too
    }
    settings = from_env(env)
    # The same database reached by another name (a proxy, PgBouncer, localhost): the same
    # claim (a review: the URL was the database's identity, and such a gateway refused).
    host = "localhost" if "127.0.0.1" in database_url else "127.0.0.1"
    other_url = database_url.replace("127.0.0.1", host).replace("localhost", host, 1)
    async with node_module.running(settings, demo_app(), worker=False, gateway=True):
        elsewhere = settings.with_(database_url=other_url)
        async with node_module.running(elsewhere, demo_app(), worker=True, gateway=False):
            pass
        with pytest.raises(prefix_owner.PrefixTaken, match="SIGNOFF_KEY_PREFIX"):
            async with node_module.running(settings, other_app(), worker=True, gateway=False):
                pass
    bus = node_module.make_bus(settings)
    try:
        await bus.client.redis.delete(Keys(prefix).owner)  # type: ignore[attr-defined]
    finally:
        await bus.close()
