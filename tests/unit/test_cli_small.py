"""Small operator-facing corners of the command line, without servers: every setting has
its variable, a port in use is one line, a token that would be born expired is refused,
--version, an unset secret named as such, a worker saying it stops."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import logging
import os
import signal
import socket
import subprocess
import sys
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import uvicorn

from signoff.gateway.drain import DrainingServer, ListenFailed
from signoff.runtime import cli, config
from signoff.runtime import node as node_module
from signoff.runtime.config import from_env
from signoff.runtime.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
LOGGER = "signoff.worker"


def _signoff(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SIGNOFF_", "ANTHROPIC"))}
    return subprocess.run(
        [sys.executable, "-m", "signoff", *args],
        capture_output=True,
        text=True,
        env={**base, **env},
        cwd=cwd,
        timeout=60,
        check=False,
    )


def test_every_setting_is_read_from_its_variable_and_listed_in_help() -> None:
    settings = config.from_env({"SIGNOFF_MAX_WS_MESSAGE_BYTES": "1000"})
    assert settings.max_ws_message_bytes == 1000
    # A field without a variable is a setting nobody can set (SIGNOFF_MAX_WS_MESSAGE_BYTES
    # was documented and never read).
    assert set(config.Settings.__struct_fields__) == set(config.env_names())
    assert "SIGNOFF_MAX_WS_MESSAGE_BYTES" in cli.parser().format_help()


async def _asgi(scope: Any, receive: Any, send: Any) -> None:  # never called: no bind
    raise AssertionError("served")


def test_a_port_in_use_is_an_ordinary_error_not_a_system_exit() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config_ = uvicorn.Config(
            _asgi, host="127.0.0.1", port=port, lifespan="off", log_config=None
        )
        server = DrainingServer(config_, SimpleNamespace(), drain_seconds=0)
        # uvicorn's sys.exit(3) escaped the task (and the event loop) as SystemExit.
        with pytest.raises(ListenFailed, match=f"port {port} on 127.0.0.1 is in use"):
            asyncio.run(server.serve())


@pytest.mark.parametrize("ttl", ["0", "-5"])
def test_a_token_ttl_of_zero_or_less_is_refused(
    ttl: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.parser().parse_args(["token", "--user", "demo", "--ttl", ttl])
    assert exit_.value.code == 2
    assert f"--ttl: must be a positive number of seconds, not {ttl}" in capsys.readouterr().err
    assert cli.parser().parse_args(["token", "--user", "demo", "--ttl", "60"]).ttl == 60


@pytest.mark.parametrize(
    ("flag", "value"), [("--user", ""), ("--user", "  "), ("--tenant", "a\x01b")]
)
def test_a_token_for_a_name_no_one_can_have_is_refused(
    flag: str, value: str, tmp_path: Path
) -> None:
    """`signoff token --user ""` printed a token every endpoint then refused."""
    env = {"SIGNOFF_SECRET": "s" * 48}
    args = (
        ["token", "--user", "demo", flag, value] if flag == "--tenant" else ["token", flag, value]
    )
    out = _signoff(*args, cwd=tmp_path, env=env)
    assert out.returncode == 2, out
    assert out.stdout == "" and f"signoff token: {flag} " in out.stderr


def test_a_token_ttl_of_zero_from_the_environment_is_refused(tmp_path: Path) -> None:
    env = {"SIGNOFF_SECRET": "s" * 48, "SIGNOFF_TOKEN_TTL_SECONDS": "0"}
    out = _signoff("token", "--user", "demo", cwd=tmp_path, env=env)
    assert out.returncode == 1, out  # a configuration error, as for any bad setting
    assert out.stdout == "" and "SIGNOFF_TOKEN_TTL_SECONDS" in out.stderr
    assert "Traceback" not in out.stderr, out.stderr


@pytest.mark.parametrize(
    "var",
    [
        "SIGNOFF_POLL_SECONDS",
        "SIGNOFF_SWEEP_SECONDS",
        "SIGNOFF_LEASE_SECONDS",
        "SIGNOFF_POOL_SIZE",
        "SIGNOFF_TOKEN_TTL_SECONDS",
        "SIGNOFF_WHATSAPP_POLL_SECONDS",
    ],
)
def test_intervals_and_sizes_of_zero_are_refused_naming_the_variable(var: str) -> None:
    """0 was taken: a poll or sweep in a tight loop against Postgres, a token born
    expired, a pool of no connections."""
    with pytest.raises(ConfigError, match=var):
        from_env({var: "0"})
    with pytest.raises(ConfigError, match=var):
        from_env({var: "-1"})


def test_version(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.parser().parse_args(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"signoff {importlib.metadata.version('signoff')}\n"

    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    with (ROOT / "pyproject.toml").open("rb") as file:
        declared = tomllib.load(file)["project"]["version"]
    assert cli.version() == declared


def test_the_declared_version_is_the_public_one() -> None:
    """pyproject.toml and ``signoff.__version__`` name one version (they had drifted
    apart: 0.1.0 and 0.4.0)."""
    import signoff

    with (ROOT / "pyproject.toml").open("rb") as file:
        assert tomllib.load(file)["project"]["version"] == signoff.__version__


def test_an_unset_secret_is_said_to_be_required_and_a_short_one_too_short(
    tmp_path: Path,
) -> None:
    app = {"SIGNOFF_APP": "signoff.demo:app"}
    out = _signoff("gateway", cwd=tmp_path, env=app)
    assert out.returncode == 2, out
    assert "SIGNOFF_SECRET is required" in out.stderr
    assert "secrets.token_urlsafe(32)" in out.stderr and "Traceback" not in out.stderr
    out = _signoff("gateway", cwd=tmp_path, env={**app, "SIGNOFF_SECRET": "short"})
    assert out.returncode != 0 and "at least 32 characters" in out.stderr, out


def test_a_worker_says_when_it_starts_draining_and_when_it_has_stopped(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    parked = ["run-1", "run-2"]
    fake = SimpleNamespace(
        model=None, worker=SimpleNamespace(waits=SimpleNamespace(parked_runs=lambda: parked))
    )
    said_before_stop: list[str] = []

    @contextlib.asynccontextmanager
    async def running(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        # SIGTERM once started: the handler `signoff worker` installs catches it.
        asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGTERM)
        yield fake
        # The node stops here: what the worker said so far.
        said_before_stop.extend(r.getMessage() for r in caplog.records if r.name == LOGGER)

    async def no_metrics(node: Any) -> None:
        return None

    monkeypatch.setattr(node_module, "running", running)
    monkeypatch.setattr(node_module, "start_metrics", no_metrics)
    monkeypatch.setattr(cli, "_app", lambda settings, command: SimpleNamespace(name="fake"))
    args = cli.parser().parse_args(["worker", "--app", "fake:app"])
    caplog.set_level(logging.INFO, logger=LOGGER)
    assert asyncio.run(cli._worker(args)) == 0
    said = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(said) == 2, said
    assert said[0].startswith("stopping") and "(2 parked)" in said[0]
    assert said[1].startswith("stopped") and "2 were parked" in said[1]
    assert said_before_stop == [said[0]]  # draining is said before the node stops


def test_help_lists_every_variable_with_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    """Each variable was listed beside its field name only (`SIGNOFF_APP  app`), the
    tests' fault switch among them, and three variables signoff reads were missing."""
    with pytest.raises(SystemExit):
        cli.parser().parse_args(["--help"])
    out = capsys.readouterr().out
    assert "SIGNOFF_QUOTA_SOCKETS" in out and "SIGNOFF_FAULTS" not in out
    line = next(x for x in out.splitlines() if x.strip().startswith("SIGNOFF_PORT "))
    assert line.split()[-1] == "8000"
    for var in ("SIGNOFF_PG_USER", "SIGNOFF_DISABLE", "SIGNOFF_DEMO_CARD_TTL_SECONDS"):
        assert var in out


def test_token_offers_only_what_a_token_needs() -> None:
    """`signoff token --help` offered --database-url and --redis-url, which a token never
    reads (the newcomer took them for required)."""
    from signoff.runtime.cli import parser

    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    flags = {o for a in sub.choices["token"]._actions for o in a.option_strings}
    assert "--data-dir" in flags and "--user" in flags
    assert not flags & {"--database-url", "--redis-url"}
