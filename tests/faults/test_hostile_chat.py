"""Property-based: any chat message the gateway accepts, sent to the offline demo model,
ends its run `done` or parked on cards — never a crash in the worker's handler (issue 10,
item 6: `cobre <400 nines> do João` left its run `running`)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from signoff.demo.offline_model import OfflineDemoModel
from signoff.gateway.service import message_text
from signoff.runtime.errors import InvalidInput
from signoff.runtime.metrics import COUNTERS
from signoff.runtime.records import RunStatus
from tests.faults.conftest import Invariants
from tests.faults.strategies import nasty_text
from tests.harness import harness

pytestmark = [pytest.mark.timeout(300)]
T = TypeVar("T")

numbers = (
    st.integers(min_value=-(10**30), max_value=10**400).map(str)
    | st.floats(allow_nan=True, allow_infinity=True).map(repr)
    | st.sampled_from(["9" * 400, "1e308", "1.000.000.000.000,99", "0,001", "-5", "1_0"])
)
names = st.sampled_from(["João", "Maria", "Zé", "X" * 300, "\u202eJoão", "ninguém"])
templates = st.sampled_from(
    [
        "cobre {n} do {name}",
        "cobre R$ {n} da {name}",
        "charge {n} to {name}",
        "estorne a venda V001 de {n}",
        "refund sale V{n}",
        "saldo {n}",
        "cancele a consulta A{n}",
        "cobre {n} do {name} e cobre {n} da {name}",
    ]
)
messages = (
    st.builds(lambda t, n, name: t.format(n=n, name=name), templates, numbers, names)
    | nasty_text
    | st.text(min_size=1, max_size=200)
)


def test_chat_messages_to_the_offline_model_never_crash_the_worker(
    database_url: str, invariants: Invariants
) -> None:
    # The harness lives on a loop of its own thread; hypothesis drives it example by
    # example from this (sync) test.
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def run(coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=60)

    entered = harness(database_url, model=OfflineDemoModel(), start_worker=False)
    h = run(entered.__aenter__())
    try:
        invariants.watch(database_url, h.tenant)
        errors_before = COUNTERS.values["signoff_handler_errors_total"]
        seen: list[str] = []

        @settings(
            max_examples=60,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        )
        @example(text="cobre " + "9" * 400 + " do João")
        @example(text="cobre 1e308 do João")
        @given(text=messages)
        def check(text: str) -> None:
            try:
                accepted = message_text(text)  # what the gateway lets through
            except InvalidInput:
                return
            thread_id = run(h.thread("chatter"))
            result = run(h.say(thread_id, accepted, "chatter"))
            assert result is not None, accepted
            assert result.status in (RunStatus.DONE, RunStatus.WAITING), (accepted, result)
            seen.append(accepted)

        check()
        assert seen, "hypothesis sent nothing the gateway accepts"
        assert COUNTERS.values["signoff_handler_errors_total"] == errors_before
        run(invariants.check())
    finally:
        run(entered.__aexit__(None, None, None))
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
