"""What operator commands share: finding the database of a running ``signoff dev``,
the data folder's secret, durations.

``signoff dev`` records the URLs it serves on (``<data_dir>/dev.json``, mode 0600, with
its pid) and removes the record when it stops. ``signoff cards``, ``migrate``, ``prune``
and ``token`` run with no URL (flag or ``SIGNOFF_*`` variable) find them there.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

import msgspec

from signoff.runtime.config import Settings, data_path
from signoff.runtime.errors import ConfigError
from signoff.runtime.secret_file import read_secret

RECORD = "dev.json"
SECRET = "secret"  # the dev signing key's file in the data folder (runtime/node.py)


class DevRecord(msgspec.Struct, frozen=True, kw_only=True):
    pid: int
    database_url: str
    redis_url: str | None = None
    url: str = ""  # where the gateway listens


class NoDatabase(ConfigError):
    """An operator command with no database URL and no running ``signoff dev`` record."""

    code = "no_database"


class NoSecret(ConfigError):
    """``signoff token`` with no ``SIGNOFF_SECRET`` and no dev secret in the data folder."""

    code = "no_secret"


def record_path(settings: Settings) -> Path:
    return data_path(settings) / RECORD


def write_record(settings: Settings, record: DevRecord) -> Path:
    """Write ``dev.json`` atomically, mode 0600 from the start."""
    path = record_path(settings)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{RECORD}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(msgspec.json.encode(record))
    os.replace(tmp, path)
    return path


def remove_record(settings: Settings) -> None:
    """Remove ``dev.json`` if it is still this process's."""
    record = read_record(settings)
    if record is not None and record.pid == os.getpid():
        with contextlib.suppress(FileNotFoundError):
            record_path(settings).unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_record(settings: Settings) -> DevRecord | None:
    """The record of a ``signoff dev`` still running on this data folder, else None."""
    try:
        record = msgspec.json.decode(read_secret(record_path(settings)), type=DevRecord)
    except (FileNotFoundError, msgspec.ValidationError, msgspec.DecodeError):
        return None
    return record if _alive(record.pid) else None


def operator_settings(settings: Settings) -> Settings:
    """``settings`` with the database (and Redis) URL of a running ``signoff dev`` on its
    data folder when none is configured; :class:`NoDatabase` naming the folder when
    there is neither."""
    if settings.database_url is not None:
        return settings
    record = read_record(settings)
    if record is not None:
        return settings.with_(
            database_url=record.database_url, redis_url=settings.redis_url or record.redis_url
        )
    from signoff.embedded import running_postgres_url

    url = running_postgres_url(data_path(settings) / "embedded")
    if url is not None:
        return settings.with_(database_url=url)
    raise NoDatabase(
        "no database: set SIGNOFF_DATABASE_URL or --database-url, or start `signoff dev` "
        f"on this data folder ({data_path(settings)}; nothing running records itself in "
        f"{record_path(settings)})"
    )


def data_secret(settings: Settings) -> str:
    """The token secret: ``SIGNOFF_SECRET``, else the one ``signoff dev`` keeps in the data
    folder. Never creates one: a new secret would sign tokens no server accepts."""
    if settings.secret:
        return settings.secret
    path = data_path(settings) / SECRET
    try:
        return read_secret(path)
    except FileNotFoundError:
        raise NoSecret(
            f"no secret: set SIGNOFF_SECRET (the servers' secret), or run this where "
            f"`signoff dev` keeps its data folder (--data-dir; looked for {path})"
        ) from None


_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
_UNIT = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def duration(text: str) -> float:
    """Seconds in ``90``, ``90s``, ``30m``, ``2h`` or ``7d`` (argparse ``type=``)."""
    m = _DURATION.fullmatch(text.strip().lower())
    if m is None:
        import argparse

        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (e.g. 90s, 30m, 2h, 7d)")
    return float(m.group(1)) * _UNIT[m.group(2)]
