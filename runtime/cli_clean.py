"""``signoff clean``: remove what ``signoff dev`` keeps for a data folder.

That is the data folder itself (the embedded Postgres and Valkey, their passwords and
logs, the dev signing key, ``dev.json``, retention's audit archive) and, when run as
root, the Postgres cluster relocated under ``/var/tmp/signoff-pg-*`` that the folder's
``embedded/pg.location`` names (embedded/accounts.py): removing the checkout alone
leaves that one behind.

Refused, changing nothing, while a ``signoff dev`` runs on the folder, when the folder
holds anything signoff did not put there (``--data-dir .`` in a project is not removed),
and without ``--yes`` when no terminal can confirm.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from signoff.embedded.accounts import RELOCATED_PARENT, RELOCATED_PREFIX
from signoff.runtime.cli_ops import RECORD, SECRET, read_record
from signoff.runtime.config import Settings, data_path
from signoff.runtime.errors import ConfigError

EMBEDDED = "embedded"
AUDIT = "audit"
KNOWN = frozenset({EMBEDDED, AUDIT, RECORD, SECRET})


class NotDataFolder(ConfigError):
    """``signoff clean`` on a folder holding files signoff did not put there."""

    code = "not_data_folder"


class DevRunning(ConfigError):
    """``signoff clean`` on a data folder a running ``signoff dev`` uses."""

    code = "dev_running"


def add_parser(
    sub: Any, common: Callable[[argparse.ArgumentParser], None] | None = None
) -> argparse.ArgumentParser:
    cl: argparse.ArgumentParser = sub.add_parser(
        "clean",
        help="remove what signoff dev keeps for a data folder (its databases, signing key, "
        "and the cluster it relocated under /var/tmp when run as root)",
    )
    cl.add_argument("--data-dir", help="local data folder (SIGNOFF_DATA_DIR, .signoff)")
    cl.add_argument(
        "--yes", "-y", action="store_true", help="do not ask; needed when no terminal can answer"
    )
    return cl


def _ours(name: str) -> bool:
    return name in KNOWN or name.startswith(f".{RECORD}.")  # write_record's temporary


def places(folder: Path) -> list[Path]:
    """What would be removed, data folder first; :class:`NotDataFolder` when the folder
    holds something else, :class:`DevRunning` while ``signoff dev`` uses it."""
    from signoff.embedded.postgres import relocated_home, running_pid

    strangers = sorted(entry.name for entry in folder.iterdir() if not _ours(entry.name))
    if strangers:
        shown = ", ".join(strangers[:5]) + (", ..." if len(strangers) > 5 else "")
        raise NotDataFolder(
            f"{folder} holds files signoff did not put there ({shown}): not removed; "
            "give the folder signoff dev uses (--data-dir, SIGNOFF_DATA_DIR)",
            path=str(folder),
        )
    embedded = folder / EMBEDDED
    pid = running_pid(embedded)
    if pid is not None:
        raise DevRunning(
            f"a signoff dev runs on {folder} (its Postgres is pid {pid}): stop it first",
            path=str(folder),
        )
    found = [folder]
    home = relocated_home(embedded)
    if home is not None and _made_for(home, embedded):
        found.append(home)
    return found


def _made_for(home: Path, embedded: Path) -> bool:
    """``home`` (named by the folder's ``pg.location``) is a cluster folder signoff made
    under ``/var/tmp`` for this very folder: a real root-owned folder there, not a link,
    whose name is this folder's digest (a copied checkout's ``pg.location`` names the
    original's cluster, which is not this folder's to remove)."""
    try:
        st = home.lstat()
    except FileNotFoundError:
        return False
    digest = hashlib.sha256(str(embedded.resolve()).encode()).hexdigest()[:12]
    ours = (
        stat.S_ISDIR(st.st_mode)
        and st.st_uid == 0
        and home.parent.resolve() == RELOCATED_PARENT.resolve()
        and home.name == f"{RELOCATED_PREFIX}{digest}"
    )
    if not ours:
        print(
            f"note: {embedded / 'pg.location'} names {home}, which is not the cluster signoff "
            "made for this folder (a copied folder?): left alone"
        )
    return ours


def run(settings: Settings, yes: bool) -> int:
    folder = data_path(settings)
    if not folder.exists():
        print(f"nothing to remove: {folder} does not exist")
        return 0
    if not folder.is_dir():
        raise NotDataFolder(f"{folder} is not a folder: not removed", path=str(folder))
    record = read_record(settings)
    if record is not None:
        raise DevRunning(
            f"a signoff dev runs on {folder} (pid {record.pid}, {record.url}): stop it first",
            path=str(folder),
        )
    found = places(folder)
    print("signoff clean will remove:")
    for place in found:
        print(f"  {place}")
    archive = folder / AUDIT
    if archive.is_dir():
        count = sum(1 for entry in archive.rglob("*") if entry.is_file())
        if count:
            print(f"  (with {count} audit archive file(s) of pruned cards in {archive})")
    if not yes:
        if not sys.stdin.isatty():
            print(
                "not removed: standard input is not a terminal to ask on; pass --yes to "
                "remove without a question",
                file=sys.stderr,
            )
            return 1
        answer = input("remove? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            print("nothing removed")
            return 1
    for place in reversed(found):  # the relocated cluster first: the folder names it
        shutil.rmtree(place)
    print("removed")
    return 0
