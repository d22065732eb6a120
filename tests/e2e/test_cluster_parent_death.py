"""A killed test process leaves no cluster process behind (signoff.testing.cluster).

A pytest-like parent starts a small cluster (one gateway, one worker) and is killed with
SIGKILL, so none of its clean-up runs: the parent-death signal must take the gateway and
the worker down with it.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests import services

PARENT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from signoff.testing.cluster import cluster

    with cluster(sys.argv[1], sys.argv[2], Path(sys.argv[3]), gateways=1, workers=1) as c:
        print(" ".join(str(pid) for pid in c.pids()), flush=True)
        time.sleep(600)
    """
)


def _gone(pid: int) -> bool:
    """Exited (a zombie waiting for a reaper counts as exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def test_kill_9_of_the_parent_takes_gateways_and_workers_down(
    database_url: str, tmp_path: Path
) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, database_url, services.redis_url(), str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    pids: list[int] = []
    try:
        assert parent.stdout is not None
        seen: list[str] = []
        deadline = time.monotonic() + 90
        while not pids and time.monotonic() < deadline:
            ready, _, _ = select.select([parent.stdout], [], [], 1)
            line = parent.stdout.readline() if ready else ""
            if ready and not line:
                break  # the parent exited
            words = line.split()
            if words and all(w.isdigit() for w in words):
                pids = [int(w) for w in words]
            elif line:
                seen.append(line)
        assert len(pids) == 2, "the cluster did not start:\n" + "".join(seen)
        assert not any(_gone(pid) for pid in pids)

        parent.send_signal(signal.SIGKILL)
        parent.wait(10)

        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not all(_gone(pid) for pid in pids):
            time.sleep(0.05)
        left = [pid for pid in pids if not _gone(pid)]
        assert left == [], f"cluster processes outlived their parent: {left}"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)
        if parent.stdout is not None:
            parent.stdout.close()
        for pid in pids:  # never leave a process behind, even when the test fails
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
