"""Pure parts of the quotas: the gateway predicts the worker's run id, the in-process
ledger's window, the socket slots, the settings."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from signoff.gateway.auth import Principal, Tokens
from signoff.gateway.quotas import MemoryLedger, SocketGate, SocketSlots
from signoff.runtime import agent
from signoff.runtime.canonical import run_id_of
from signoff.runtime.config import from_env

pytestmark = pytest.mark.anyio


def test_the_gateway_derives_the_run_id_the_worker_will_use() -> None:
    message_id = str(uuid.uuid4())
    assert run_id_of(message_id) == str(uuid.uuid5(agent._RUN_NS, message_id))


async def test_memory_ledger_keeps_a_window_per_key() -> None:
    ledger = MemoryLedger()
    assert await ledger.window_add("k", "a", 1_000, 100) == ["a"]
    assert await ledger.window_add("k", "b", 1_050, 100) == ["a", "b"]
    assert await ledger.window_add("other", "x", 1_050, 100) == ["x"]
    assert await ledger.window_add("k", "c", 1_120, 100) == ["b", "c"]  # a left the window
    await ledger.window_remove("k", ["b", "c"])
    assert await ledger.window_add("k", "d", 1_130, 100) == ["d"]


def test_socket_slots_per_tenant_and_user() -> None:
    slots = SocketSlots(2)
    ana, ana_elsewhere = Principal("ana", "t1"), Principal("ana", "t2")
    assert slots.take(ana) and slots.take(ana)
    assert not slots.take(ana)
    assert slots.take(ana_elsewhere)
    slots.give_back(ana)
    assert slots.count(ana) == 1 and slots.take(ana)
    unlimited = SocketSlots(0)
    assert all(unlimited.take(ana) for _ in range(1000))


def test_quota_and_timeout_settings_come_from_the_environment() -> None:
    s = from_env(
        {
            "SIGNOFF_QUOTA_THREADS_PER_MINUTE": "7",
            "SIGNOFF_QUOTA_TURNS_IN_FLIGHT": "0",
            "SIGNOFF_QUOTA_QUEUED_SECONDS": "30",
            "SIGNOFF_QUOTA_SOCKETS": "3",
            "SIGNOFF_HEADER_TIMEOUT_SECONDS": "2.5",
            "SIGNOFF_BODY_TIMEOUT_SECONDS": "4",
        }
    )
    assert (s.quota_threads_per_minute, s.quota_turns_in_flight, s.quota_sockets) == (7, 0, 3)
    assert (s.quota_queued_seconds, s.header_timeout_seconds, s.body_timeout_seconds) == (
        30.0,
        2.5,
        4.0,
    )


def test_the_socket_gate_passes_on_first_frames_that_are_not_a_valid_auth() -> None:
    async def endpoint(ws: Any) -> None:
        raise AssertionError("not called")

    tokens = Tokens("s" * 40)
    gate = SocketGate(SocketSlots(1), tokens, endpoint)
    for frame in (
        {"bytes": b'{"type": "auth", "token": "\xff"}'},  # invalid UTF-8
        {"bytes": b"[" * 100_000},
        {"text": '{"type": "auth", "token": "forged"}'},
        {"text": '{"type": "message", "text": "hi"}'},
        {"text": "\ud800"},
        {"text": '{"type": 1}'},
    ):
        assert gate._principal({"type": "websocket.receive", **frame}) is None, frame
    good = {
        "type": "websocket.receive",
        "text": json.dumps({"type": "auth", "token": tokens.issue("u", "t")}),
    }
    assert gate._principal(good) == Principal("u", "t")
