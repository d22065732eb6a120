"""`signoff cards` ids by unique prefix: an ambiguous prefix is a clear error (exit 2)."""

from __future__ import annotations

import secrets

import pytest

from signoff.runtime import cli
from signoff.runtime.errors import NotFound
from signoff.store.operator import AmbiguousId
from tests.harness import harness
from tests.integration.test_decisions import Scripted, one_card, pix

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

COPY = """
INSERT INTO cards (id, thread_id, run_id, tenant, owner, tool, risk, args_snapshot, summary,
    impact, snapshot_hash, request_key, operation_id, status, expires_at)
SELECT $2::uuid, thread_id, run_id, tenant, owner, tool, risk, args_snapshot, summary, impact,
    snapshot_hash, request_key || $2, gen_random_uuid(), 'rejected', expires_at
FROM cards WHERE id = $1::uuid
"""


async def test_ids_by_unique_prefix_and_a_clear_error_when_ambiguous(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async with harness(database_url, model=Scripted(pix())) as h:
        card = await one_card(h)
        stem = secrets.token_hex(4)
        twins = [f"{stem}-0000-4000-8000-00000000000{i}" for i in (1, 2)]
        for twin in twins:
            await h.store.pool.execute(COPY, card.id, twin)
        operator = h.store.operator
        assert await operator.card_id(twins[0]) == twins[0]
        assert await operator.card_id(twins[1][:-1] + "2") == twins[1]
        assert await operator.card_id(card.id[:13]) == card.id
        with pytest.raises(AmbiguousId, match=f"{twins[0]}, {twins[1]}"):
            await operator.card_id(stem)
        with pytest.raises(NotFound):
            await operator.card_id("0" * 31 + "g")
        assert await operator.thread_id(card.thread_id[:10]) == card.thread_id

        rc = await _cli("cards", "show", stem, "--database-url", database_url)
        err = capsys.readouterr().err
        assert rc == 2 and "ambiguous" in err and twins[0] in err and twins[1] in err


async def _cli(*args: str) -> int:
    import asyncio

    return await asyncio.to_thread(cli.main, list(args))
