"""The event loop the signoff processes run on (SIGNOFF_EVENT_LOOP)."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from signoff.runtime import config, loops
from signoff.runtime.errors import ConfigError


async def _loop_type() -> type:
    return type(asyncio.get_running_loop())


def test_auto_and_uvloop_run_on_uvloop_asyncio_on_the_standard_loop() -> None:
    assert loops.run(_loop_type(), "auto") is uvloop.Loop
    assert loops.run(_loop_type(), "uvloop") is uvloop.Loop
    assert not issubclass(loops.run(_loop_type(), "asyncio"), uvloop.Loop)


def test_an_unknown_loop_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        loops.loop_factory("trio")


def test_the_setting_comes_from_the_environment() -> None:
    assert config.from_env({}).event_loop == "auto"
    assert config.from_env({"SIGNOFF_EVENT_LOOP": "asyncio"}).event_loop == "asyncio"


def test_auto_keeps_the_standard_loop_on_a_redis_cluster_bus() -> None:
    """redis-py's cluster client does not retry uvloop's closed-transport RuntimeError."""
    cluster = "redis+cluster://127.0.0.1:7000,127.0.0.1:7001"
    assert not issubclass(loops.run(_loop_type(), "auto", cluster), uvloop.Loop)
    assert loops.run(_loop_type(), "auto", "redis://127.0.0.1:6379") is uvloop.Loop
    assert loops.run(_loop_type(), "uvloop", cluster) is uvloop.Loop  # asked for: kept
