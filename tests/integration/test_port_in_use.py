"""`signoff gateway --port P` with P taken: one line saying so and a non-zero exit, not
asyncio's "Task exception was never retrieved" and uvicorn's SystemExit traceback."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path

from tests import pgbouncer, services


def test_a_gateway_on_a_port_in_use_says_so_in_one_line(database_url: str, tmp_path: Path) -> None:
    # (the statement cache setting kept: through PgBouncer < 1.21 a cached statement
    # met another client's of the same name on a shared server connection, a CI flake)
    base = {k: v for k, v in pgbouncer.child_env().items() if not k.startswith("ANTHROPIC")}
    env = {
        **base,
        "SIGNOFF_DATABASE_URL": database_url,
        "SIGNOFF_REDIS_URL": services.redis_url(),
        "SIGNOFF_KEY_PREFIX": f"so-port-{secrets.token_hex(3)}:",
        "SIGNOFF_SECRET": secrets.token_urlsafe(32),
        "SIGNOFF_APP": "signoff.demo:app",
    }
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "signoff", "gateway", "--port", str(port)],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=60,
            check=False,
        )
    assert out.returncode != 0, out
    assert "Traceback" not in out.stderr and "never retrieved" not in out.stderr, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"signoff: port {port} on 127.0.0.1 is in use"), out.stderr


def test_signoff_dev_on_a_port_in_use_starts_nothing_first(tmp_path: Path) -> None:
    """The newcomer's `signoff dev` on a taken port made a whole embedded Postgres (a data
    folder and a cluster under /var/tmp) and only then failed on the port."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SIGNOFF_", "ANTHROPIC"))}
    data = tmp_path / "data"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "signoff", "dev", "--port", str(port), "--data-dir", str(data)],
            capture_output=True,
            text=True,
            env=base,
            cwd=tmp_path,
            timeout=60,
            check=False,
        )
    assert out.returncode != 0, out
    assert f"port {port}" in out.stderr and "in use" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert not (data / "embedded").exists(), sorted(p.name for p in data.rglob("*"))
