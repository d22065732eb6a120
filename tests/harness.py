"""The project's in-process harness: :class:`signoff.testing.Harness` running the payments
demo on the session's shared database (each harness in a tenant of its own)."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import cast

from signoff.demo import build
from signoff.demo.provider import Provider
from signoff.runtime.bus import Bus, Job
from signoff.runtime.config import Settings
from signoff.runtime.models.base import Model
from signoff.testing import FakeMessagesServer
from signoff.testing import Harness as _Harness

SECRET = "test-secret-" + "x" * 40


class Harness(_Harness):
    provider: Provider  # the demo's payments provider (what the app's setup connected)

    async def __aenter__(self) -> Harness:
        await super().__aenter__()
        self.provider = cast(Provider, self.app.services)
        return self

    def message(self, thread_id: str, user: str, text: str = "cobre") -> Job:
        """A user message as a gateway queues it on the inbox (a fresh message id)."""
        return Job(
            thread_id=thread_id,
            text=text,
            user=user,
            tenant=self.tenant,
            channel="test",
            message_id=str(uuid.uuid4()),
        )

    async def charges(self) -> int:
        value = await self.provider.pool.fetchval(
            "SELECT count(*) FROM demo_charges WHERE tenant = $1", self.tenant
        )
        return int(value)


@asynccontextmanager
async def harness(
    database_url: str,
    *,
    fake: FakeMessagesServer | None = None,
    model: Model | None = None,
    gateway: bool = False,
    worker_id: str | None = None,
    settings: Settings | None = None,
    start_worker: bool = True,
    bus: Bus | None = None,
    leave_runs: bool = False,
) -> AsyncIterator[Harness]:
    """The demo app seeded for a fresh tenant. ``fake`` or ``model`` is required (the
    project's tests script every reply). ``bus``: default an in-process one; closed at the
    end. ``leave_runs``: keep the tenant's active runs for another harness to adopt (the
    recovery tests)."""
    assert fake is not None or model is not None, "give a fake Messages API server or a model"
    tenant = "t-" + secrets.token_hex(4)
    async with Harness(
        build((tenant,)),
        database_url=database_url,
        tenant=tenant,
        fake=fake,
        model=model,
        gateway=gateway,
        worker_id=worker_id,
        settings=settings,
        start_worker=start_worker,
        bus=bus,
        secret=SECRET,
        leave_runs=leave_runs,
    ) as h:
        yield h
