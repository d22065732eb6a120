"""Secrets kept in files of their own (dev signing key, embedded servers' passwords).

A secret file is created with mode 0600 from the start (``os.open(..., 0o600)``,
never a chmod after the write), written completely under a temporary name and
then hard-linked into place, so a reader never sees a half-written secret and
two processes racing to create it agree on the winner's value. Reading refuses
a file that is not a regular file owned by us, or that group or others may
read: a secret someone else could have read is not one.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import threading
from pathlib import Path

from signoff.runtime.errors import ConfigError

__all__ = ["new_secret", "read_or_create", "read_secret"]

MODE = 0o600


def new_secret() -> str:
    """A random secret that needs no quoting in URLs, SQL literals or config files."""
    return secrets.token_urlsafe(32)


def read_secret(path: Path) -> str:
    """The secret in ``path``; ``FileNotFoundError`` when there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise ConfigError(f"{path} is a symbolic link", path=str(path)) from exc
    with os.fdopen(fd, "r", encoding="utf-8") as file:
        st = os.fstat(file.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise ConfigError(
                f"{path} must be a regular file owned by uid {os.geteuid()}", path=str(path)
            )
        if st.st_mode & 0o077:
            raise ConfigError(
                f"{path} is readable by others (mode {stat.S_IMODE(st.st_mode):o}); "
                "delete it so a new secret is made, or make it mode 600",
                path=str(path),
            )
        value = file.read().strip()
    if not value:
        raise ConfigError(f"{path} is empty; delete it so a new secret is made", path=str(path))
    return value


def read_or_create(path: Path, value: str | None = None) -> tuple[str, bool]:
    """The secret in ``path``, storing ``value`` (or a new one) first when there is none.

    Returns ``(secret, created)``; ``created`` is true only for the process whose
    value was stored. The folder must exist.
    """
    try:
        return read_secret(path), False
    except FileNotFoundError:
        pass
    staging = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(staging, flags, MODE)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write((value or new_secret()) + "\n")
            file.flush()
            os.fsync(file.fileno())
        try:
            os.link(staging, path)  # never replaces: a concurrent creator's file wins
            created = True
        except FileExistsError:
            created = False
    finally:
        staging.unlink(missing_ok=True)
    return read_secret(path), created
