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


async def test_a_reason_a_person_typed_cannot_drive_the_operators_terminal(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A hostile probe: a rejection's reason printed raw by `signoff cards show` cleared
    the operator's screen, set the terminal's title and overwrote the line (``\\r``)."""
    from signoff.runtime.cards import Decision

    async with harness(database_url, model=Scripted(pix())) as h:
        card = await one_card(h)
        reason = "ok\x1b[2J\x1b]0;PWNED\x07\x1b[31mRED\rFAKE LINE\u202eevil\nstatus: approved"
        await h.store.decide(
            card.id,
            principal="alice",
            decision=Decision.REJECT,
            snapshot_hash=card.snapshot_hash,
            channel="test",
            reason=reason,
        )
        capsys.readouterr()
        for args in (("cards", "show", card.id), ("cards", "list"), ("runs", "show", card.run_id)):
            assert await _cli(*args, "--database-url", database_url) == 0, args
            out = capsys.readouterr().out
            assert not any(ch in out for ch in "\x1b\x07\r\u202e"), (args, out)
        assert await _cli("cards", "show", card.id, "--database-url", database_url) == 0
        shown = capsys.readouterr().out
        assert "ok[2J]0;PWNED[31mRED FAKE LINEevil status: approved" in shown
        assert "\nstatus: approved" not in shown
