"""Settings refuse values that cannot work, naming the variable (the operator probe's #6
and #7: each of these was taken and then broke something, or silently meant another)."""

from __future__ import annotations

import pytest

from signoff.runtime.config import from_env
from signoff.runtime.errors import ConfigError

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("SIGNOFF_PORT", "99999"),  # the socket listened on 34463
        ("SIGNOFF_METRICS_PORT", "99999"),  # an OverflowError traceback
        ("SIGNOFF_PORT", "-1"),
        ("SIGNOFF_MAX_IN_FLIGHT", "-1"),  # every request a 503 "limit of -1", /readyz 200
        ("SIGNOFF_DRAIN_SECONDS", "-5"),
        ("SIGNOFF_DB_TIMEOUT_SECONDS", "0"),  # an asyncpg ValueError at start
        ("SIGNOFF_RETENTION_DAYS", "-1"),  # taken by gateways, refused by workers
        ("SIGNOFF_WS_PROTOCOL", "bogus"),  # uvicorn's ImportFromStringError
        ("SIGNOFF_QUOTA_SOCKETS", "-3"),
        ("SIGNOFF_REDIS_MAX_CONNECTIONS", "0"),
        ("SIGNOFF_WS_BURST", "0"),
    ],
)
def test_a_value_that_cannot_work_is_refused_naming_its_variable(var: str, value: str) -> None:
    with pytest.raises(ConfigError) as refused:
        from_env({var: value})
    assert var in str(refused.value), refused.value


@pytest.mark.parametrize("value", ["maybe", "2", "enabled"])
def test_a_switch_is_on_or_off_never_a_guess(value: str) -> None:
    """SIGNOFF_ALLOW_APP_SKEW=maybe was taken as off."""
    with pytest.raises(ConfigError, match="SIGNOFF_ALLOW_APP_SKEW"):
        from_env({"SIGNOFF_ALLOW_APP_SKEW": value})


@pytest.mark.parametrize(("value", "on"), [("1", True), ("on", True), ("NO", False), ("0", False)])
def test_switch_spellings(value: str, on: bool) -> None:
    assert from_env({"SIGNOFF_ALLOW_APP_SKEW": value}).allow_app_skew is on


def test_limits_of_zero_still_mean_none() -> None:
    s = from_env({"SIGNOFF_MAX_IN_FLIGHT": "0", "SIGNOFF_DRAIN_SECONDS": "0", "SIGNOFF_PORT": "0"})
    assert (s.max_in_flight, s.drain_seconds, s.port) == (0, 0.0, 0)


async def test_a_gateway_refuses_a_bad_retention_rule_as_a_worker_does() -> None:
    """One ConfigMap for both pools: gateways came up while workers crash-looped on
    SIGNOFF_RETENTION_TENANTS=acme (no days)."""
    from signoff.demo import app
    from signoff.runtime.node import running

    settings = from_env(
        {
            "SIGNOFF_RETENTION_TENANTS": "acme",
            "SIGNOFF_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none",
            "SIGNOFF_REDIS_URL": "redis://127.0.0.1:1/0",
        }
    )
    with pytest.raises(ConfigError, match="bad retention rule 'acme'"):
        async with running(settings, app(), worker=False, gateway=True):
            pass


def test_a_driver_error_without_a_message_is_named_by_its_kind() -> None:
    """The operator probe read "Postgres unavailable: ;" through PgBouncer (an error
    whose text is empty)."""
    from signoff.runtime.errors import Unavailable
    from signoff.store.connector import _translated

    got = _translated(ConnectionResetError())
    assert isinstance(got, Unavailable)
    assert got.message == "Postgres unavailable: ConnectionResetError"


@pytest.mark.parametrize(
    "error",
    [
        "InvalidSQLStatementNameError",
        "DuplicatePreparedStatementError",
    ],
)
def test_prepared_statements_lost_to_a_pooler_say_which_setting_to_change(error: str) -> None:
    """The operator probe's #5: behind PgBouncer 1.18 in transaction mode with the
    statement cache on, a gateway died with asyncpg's traceback (its hint names asyncpg's
    own option) and a worker settled adopted runs as failed on an untyped error. It is a
    typed Unavailable (retried, never a run's failure) naming signoff's setting."""
    import asyncpg

    from signoff.runtime.errors import Unavailable
    from signoff.store.connector import _translated

    exc = getattr(asyncpg.exceptions, error)('prepared statement "__asyncpg_stmt_7__" ...')
    got = _translated(exc)
    assert isinstance(got, Unavailable)
    assert "SIGNOFF_DB_STATEMENT_CACHE_SIZE=0" in got.message


@pytest.mark.parametrize(
    ("var", "url"),
    [
        ("SIGNOFF_DATABASE_URL", "mysql://root@127.0.0.1/db"),
        ("SIGNOFF_DATABASE_URL", "127.0.0.1:5432/db"),
        ("SIGNOFF_REDIS_URL", "http://127.0.0.1:6379"),
    ],
)
def test_a_url_of_another_kind_is_refused_naming_its_variable(var: str, url: str) -> None:
    """The operator probe's #8: `mysql://` and `http://` URLs ended in drivers' tracebacks
    at the first connection."""
    with pytest.raises(ConfigError, match=var):
        from_env({var: url})


@pytest.mark.parametrize(
    "url",
    ["redis://h:6379/0", "rediss://h", "unix:///run/redis.sock", "redis+cluster://a:1,b:2"],
)
def test_every_redis_url_kind_signoff_serves_is_taken(url: str) -> None:
    assert from_env({"SIGNOFF_REDIS_URL": url}).redis_url == url
    assert from_env({"SIGNOFF_DATABASE_URL": "postgres://u@h/db"}).database_url
