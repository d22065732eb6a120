"""Whether a Postgres already runs a cluster, read from its ``postmaster.pid`` and ``/proc``.

Used before a start (a stale pid file left by a killed server is removed; a live one
is refused with the signoff process to stop) and by ``signoff clean``.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from signoff.runtime.errors import ConfigError


def clear_stale_pidfile(pgdata: Path) -> None:
    """Remove ``postmaster.pid`` left by a killed server.

    Postgres refuses to start while the pid in that file exists, and in a
    container whose init does not reap, a SIGKILLed postmaster lingers as a
    zombie. A dead or zombie pid (or one that is not a postgres) is stale.
    """
    pidfile = pgdata / "postmaster.pid"
    try:
        pid = int(pidfile.read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return
    if not is_live_postgres(pid):
        with contextlib.suppress(OSError):
            pidfile.unlink()


def refuse_if_running(pgdata: Path, data_dir: Path) -> None:
    """A live server already runs this cluster (another ``signoff dev`` on the same data
    folder): say so, instead of Postgres's own "lock file already exists" refusal."""
    try:
        pid = int((pgdata / "postmaster.pid").read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return
    if is_live_postgres(pid):
        owner = signoff_above(pid)
        who = f"pid {owner}, its Postgres pid {pid}" if owner else f"its Postgres is pid {pid}"
        raise ConfigError(
            f"another signoff dev already runs the data folder {data_dir} ({who}): stop "
            "it, or give this one another --data-dir",
            data_dir=str(data_dir),
        )


def signoff_above(pid: int) -> int | None:
    """The signoff process that started Postgres ``pid`` (its parent, or the parent of the
    account switch between them), or None."""
    for _ in range(3):
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            return None
        if pid <= 1:
            return None
        if b"signoff" in cmdline:
            return pid
    return None


def is_live_postgres(pid: int) -> bool:
    """``pid`` is a running (not zombie) postgres process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        state = stat.rsplit(")", 1)[1].split()[0]
        comm = stat.split("(", 1)[1].rsplit(")", 1)[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X") and "postgres" in comm
