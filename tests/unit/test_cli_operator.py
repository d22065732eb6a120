"""The operator CLI without servers: help on every flag, a bogus status refused, the token
secret found in (or refused naming) the data folder, the dev record, durations, id
prefixes."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from signoff.gateway.auth import Tokens
from signoff.runtime import cli, cli_ops, config
from signoff.runtime.config import Settings
from signoff.runtime.errors import NotFound
from signoff.runtime.secret_file import read_or_create
from signoff.store.operator import prefix_range


def walk(
    parser: argparse.ArgumentParser, path: str = "signoff"
) -> list[tuple[str, argparse.Action]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.extend(walk(sub, f"{path} {name}"))
        elif not isinstance(action, argparse._HelpAction):
            found.append((path, action))
    return found


def test_every_flag_and_argument_of_every_command_has_help() -> None:
    actions = walk(cli.parser())
    assert len(actions) > 40
    missing = [
        f"{path} {'/'.join(a.option_strings) or a.dest}"
        for path, a in actions
        if not (a.help and a.help.strip())
    ]
    assert missing == []
    commands = {path for path, _ in actions}
    assert {"signoff cards", "signoff prune", "signoff token", "signoff worker"} <= commands


def test_every_variable_the_help_names_is_a_setting() -> None:
    import re

    names: set[str] = set()
    for _, action in walk(cli.parser()):
        names |= set(re.findall(r"SIGNOFF_[A-Z_]+", action.help or ""))
    known = set(config.env_names().values()) | {"SIGNOFF_DEMO_CARD_TTL_SECONDS"}
    assert names and names <= known, names - known


def _signoff(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SIGNOFF_", "ANTHROPIC"))}
    return subprocess.run(
        [sys.executable, "-m", "signoff", *args],
        capture_output=True,
        text=True,
        env={**base, **(env or {})},
        cwd=cwd,
        timeout=60,
        check=False,
    )


def test_a_bogus_status_is_refused_with_the_real_ones(tmp_path: Path) -> None:
    out = _signoff("cards", "list", "--status", "bogus", cwd=tmp_path)
    assert out.returncode == 2
    assert "unknown status 'bogus'" in out.stderr and "pending" in out.stderr
    assert "executed" in out.stderr and out.stdout == ""


def test_no_database_is_refused_naming_the_data_folder(tmp_path: Path) -> None:
    for command in (("cards", "list"), ("migrate",), ("prune", "--days", "1")):
        out = _signoff(*command, cwd=tmp_path)
        assert out.returncode == 2, (command, out)
        assert str(tmp_path / ".signoff") in out.stderr and "SIGNOFF_DATABASE_URL" in out.stderr
        assert "Traceback" not in out.stderr


def test_token_uses_the_data_folders_secret_or_refuses_and_creates_none(tmp_path: Path) -> None:
    out = _signoff("token", "--user", "ana", cwd=tmp_path)
    assert out.returncode == 2
    assert str(tmp_path / ".signoff" / "secret") in out.stderr
    assert not (tmp_path / ".signoff").exists()  # no new secret made
    (tmp_path / ".signoff").mkdir(mode=0o700)
    secret, _ = read_or_create(tmp_path / ".signoff" / "secret")
    out = _signoff("token", "--user", "ana", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert Tokens(secret, 3600).verify(out.stdout.strip()).user == "ana"
    given = "s" * 48
    out = _signoff("token", "--user", "bo", cwd=tmp_path, env={"SIGNOFF_SECRET": given})
    assert Tokens(given, 3600).verify(out.stdout.strip()).user == "bo"


def test_the_dev_record_is_private_and_only_trusted_while_its_process_lives(
    tmp_path: Path,
) -> None:
    settings = Settings(data_dir=str(tmp_path / "d"))
    record = cli_ops.DevRecord(
        pid=os.getpid(), database_url="postgresql://x/y", redis_url="redis://r"
    )
    path = cli_ops.write_record(settings, record)
    assert path.stat().st_mode & 0o777 == 0o600
    found = cli_ops.operator_settings(settings)
    assert (found.database_url, found.redis_url) == ("postgresql://x/y", "redis://r")
    mine = cli_ops.operator_settings(settings.with_(database_url="postgresql://mine/db"))
    assert mine.database_url == "postgresql://mine/db"  # a URL given wins
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    cli_ops.write_record(
        settings, record.__class__(pid=int(dead.stdout), database_url="postgresql://old/db")
    )
    assert cli_ops.read_record(settings) is None
    with pytest.raises(cli_ops.NoDatabase, match=str(tmp_path / "d")):
        cli_ops.operator_settings(settings)
    cli_ops.write_record(settings, record)
    cli_ops.remove_record(settings)
    assert not path.exists()


def test_durations_and_id_prefixes() -> None:
    assert [cli_ops.duration(t) for t in ("90", "90s", "30m", "2h", "7d", "1.5h")] == [
        90.0,
        90.0,
        1800.0,
        7200.0,
        604800.0,
        5400.0,
    ]
    with pytest.raises(argparse.ArgumentTypeError):
        cli_ops.duration("soon")
    lo, hi = prefix_range("3F2A-1")
    assert lo == "3f2a1000-0000-0000-0000-000000000000"
    assert hi == "3f2a1fff-ffff-ffff-ffff-ffffffffffff"
    for bad in ("", "xyz", "0" * 33):
        with pytest.raises(NotFound):
            prefix_range(bad)
