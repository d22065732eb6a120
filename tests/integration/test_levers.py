"""The speed levers of runtime/levers.py, on and off (``SIGNOFF_DISABLE``): what each one
must not change (real Postgres and Redis)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from signoff.runtime import hints, levers
from signoff.runtime.bus.redis import RedisBus
from signoff.runtime.cards import Decision
from signoff.runtime.config import from_env
from signoff.runtime.errors import ConfigError
from signoff.runtime.keys import Keys
from tests import services
from tests.harness import harness
from tests.integration.test_decisions import Scripted, one_card, pix

pytestmark = pytest.mark.anyio

BOTH = ["", "group-commit", "quiet-start"]


@pytest.fixture
def disable(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    def set_(names: str) -> None:
        monkeypatch.setenv("SIGNOFF_DISABLE", names)
        levers.reset()

    yield set_
    monkeypatch.delenv("SIGNOFF_DISABLE", raising=False)
    levers.reset()


def test_a_misspelt_lever_is_refused_at_start_up() -> None:
    with pytest.raises(ConfigError, match="group-comit"):
        from_env({"SIGNOFF_DISABLE": "group-commit,group-comit"})
    assert levers.disabled({"SIGNOFF_DISABLE": " group-commit ,"}) == {"group-commit"}


@pytest.mark.parametrize("off", BOTH)
async def test_a_cards_hints_reach_its_thread_in_log_order(
    database_url: str, disable: Any, off: str
) -> None:
    """With decisions written by the group commit or one by one, the thread's gateways hear
    approved -> executing -> executed, in log order, each entry once."""
    disable(off)
    keys = Keys(f"so-lev-{secrets.token_hex(3)}:")
    bus = RedisBus.from_url(services.redis_url(), keys)
    async with harness(database_url, model=Scripted(pix()), bus=bus) as h:
        keys = Keys(h.settings.key_prefix)
        card = await one_card(h)
        got: list[hints.Hint] = []
        async with bus.subscribe(keys.thread_channel(card.thread_id)) as sub:

            async def listen() -> None:
                async for payload in sub:
                    got.append(hints.decode(payload))

            reader = asyncio.create_task(listen())
            try:
                await h.decide(card, Decision.APPROVE)
                await h.settle()
                for _ in range(100):
                    seen = [e for hint in got for e in hint.entries]
                    if any(e.kind == "assistant" for e in seen):
                        break
                    await asyncio.sleep(0.02)
            finally:
                reader.cancel()
        entries = [e for hint in got for e in hint.entries]
        updates = [
            msgspec.json.decode(e.data)["status"] for e in entries if e.kind == "card_update"
        ]
        assert updates == ["approved", "executing", "executed"]
        seqs = [e.seq for e in entries]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        assert await h.charges() == 1
