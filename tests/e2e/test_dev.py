"""`signoff dev` as a user runs it: one process, embedded Postgres, the demo app."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from signoff.embedded import free_port, remove_data

pytestmark = pytest.mark.timeout(120)


class Dev:
    """``signoff dev`` as a child process. ``command``: how to run signoff (default: this
    interpreter's ``-m signoff``; e.g. the console script of an installed wheel)."""

    def __init__(self, data_dir: Path, port: int, command: list[str] | None = None) -> None:
        self.data_dir = data_dir
        self.port = port
        self.command = command or [sys.executable, "-m", "signoff"]
        self.proc: subprocess.Popen[str] | None = None
        self.token = ""
        self.ready_line = ""
        self.output = ""

    def start(
        self,
        extra_env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
        cwd: Path | None = None,
    ) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SIGNOFF_", "ANTHROPIC"))}
        env.update(extra_env or {})
        self.proc = subprocess.Popen(
            [
                *self.command,
                "dev",
                "--port",
                str(self.port),
                "--data-dir",
                str(self.data_dir),
                *args,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=cwd,
        )
        assert self.proc.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError("signoff dev exited:\n" + "".join(lines))
            lines.append(line)
            if line.startswith("signoff dev ready"):
                self.ready_line = line
            m = re.match(r"\s+token:\s+(\S+)", line)
            if m:
                self.token = m.group(1)
            if self.token and "metrics:" in line:  # then the banner's last line: what next
                lines.append(self.proc.stdout.readline())
                assert "next:" in lines[-1] and "signoff clean" in lines[-1], lines[-1]
                # Not the default folder: the command that removes it names it.
                if str(self.data_dir) != ".signoff":
                    said = f"signoff clean --data-dir {self.data_dir}`"
                else:
                    said = "`signoff clean` removes"
                assert said in lines[-1], lines[-1]
                self.output = "".join(lines)
                return
        raise AssertionError("signoff dev did not start:\n" + "".join(lines))

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(30)
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=10
        )


@pytest.fixture
def dev(tmp_path: Path) -> Iterator[Dev]:
    d = Dev(tmp_path / "data", free_port())
    yield d
    d.kill(signal.SIGTERM)
    remove_data(d.data_dir / "embedded")


def wait_for(fn: Any, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


def test_dev_serves_the_demo_flow(dev: Dev) -> None:
    dev.start()
    # no --app: the demo, and it says so
    assert "serving the built-in demo (signoff.demo:app)" in dev.output
    assert re.search(r"app:\s+payments \(the built-in demo, signoff.demo:app\)", dev.output)
    with dev.client() as c:
        assert c.get("/healthz").json() == {"ok": True}
        assert c.get("/readyz").status_code == 200
        thread = c.post("/v1/threads").json()["thread"]["id"]
        assert (
            c.post(f"/v1/threads/{thread}/messages", json={"text": "cobre 150 do João"}).status_code
            == 202
        )
        cards = wait_for(lambda: c.get(f"/v1/threads/{thread}").json()["pending_cards"])
        card = cards[0]
        assert card["summary"].startswith("Gerar cobrança Pix · Cliente: João Silva")
        r = c.post(
            f"/v1/cards/{card['id']}/resolve",
            json={"decision": "approve", "snapshot_hash": card["snapshot_hash"]},
        )
        assert r.status_code == 200
        done = wait_for(
            lambda: c.get(f"/v1/cards/{card['id']}").json()["card"]["status"] == "executed"
        )
        assert done
        audit = c.get(f"/v1/cards/{card['id']}/events").json()["events"]
        assert [e["to_status"] for e in audit] == ["pending", "approved", "executing", "executed"]
        assert audit[1]["actor"] == "demo" and audit[1]["hash_seen"] == card["snapshot_hash"]


def test_a_second_dev_on_one_data_folder_says_so(dev: Dev) -> None:
    dev.start()
    second = subprocess.run(
        [*dev.command, "dev", "--port", str(free_port()), "--data-dir", str(dev.data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith(("SIGNOFF_", "ANTHROPIC"))},
    )
    out = second.stdout + second.stderr
    assert second.returncode != 0, out
    assert "another signoff dev already runs the data folder" in out, out
    # The process to stop is named (the newcomer probe: only its Postgres was).
    assert dev.proc is not None
    assert f"(pid {dev.proc.pid}, its Postgres pid " in out, out
    assert "Traceback" not in out and "lock file" not in out, out
    with dev.client() as c:  # the first one is untouched
        assert c.get("/readyz").status_code == 200


def test_dev_restart_continues_parked_run(dev: Dev) -> None:
    env = {"SIGNOFF_LEASE_SECONDS": "1"}
    dev.start(env)
    with dev.client() as c:
        thread = c.post("/v1/threads").json()["thread"]["id"]
        c.post(f"/v1/threads/{thread}/messages", json={"text": "cobre 33 da Maria"})
        card = wait_for(lambda: c.get(f"/v1/threads/{thread}").json()["pending_cards"])[0]
    dev.kill(signal.SIGKILL)  # the process holding the parked run dies
    started = time.monotonic()
    dev.start(env)  # warm start on the same embedded data
    warm = time.monotonic() - started
    with dev.client() as c:
        r = c.post(
            f"/v1/cards/{card['id']}/resolve",
            json={"decision": "approve", "snapshot_hash": card["snapshot_hash"]},
        )
        assert r.status_code == 200
        assert wait_for(
            lambda: c.get(f"/v1/cards/{card['id']}").json()["card"]["status"] == "executed"
        )

        # the card's `executed` commits a moment before the run's last step (reply + done)
        def done() -> bool:
            events = c.get(f"/v1/threads/{thread}/events?after_seq=0").json()["events"]
            return bool(events[-1]["kind"] == "run" and events[-1]["data"]["status"] == "done")

        assert wait_for(done)
    assert warm < 10, f"warm start took {warm:.1f}s"


async def _connect_without_password(port: int) -> None:
    connection = await asyncpg.connect(f"postgresql://signoff@127.0.0.1:{port}/signoff")
    await connection.close()


def _port(pattern: str, text: str) -> int:
    match = re.search(pattern, text)
    assert match is not None, text
    return int(match.group(1))


def _cli(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SIGNOFF_", "ANTHROPIC"))}
    return subprocess.run(
        [sys.executable, "-m", "signoff", *args, "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_two_apps_on_one_data_folder_keep_their_own_database(dev: Dev) -> None:
    """The README's first commands, one after the other: `signoff dev` (the demo), then
    `signoff dev --app examples.helpdesk:app` on the same `.signoff/`. Each app has its
    own database in the embedded cluster: the helpdesk lists none of the demo's threads
    (it adopted the demo's runs, listed its cards as waiting and answered "an update is
    rolling out" to them), and the operator commands follow the app that runs."""
    dev.start()
    assert re.search(r"database: \S+/signoff\n", dev.output), dev.output
    with dev.client() as c:
        thread = c.post("/v1/threads").json()["thread"]["id"]
        c.post(f"/v1/threads/{thread}/messages", json={"text": "cobre 12 do João"})
        demo_card = wait_for(lambda: c.get(f"/v1/threads/{thread}").json()["pending_cards"])[0]
    dev.kill(signal.SIGTERM)
    dev.start(args=("--app", "examples.helpdesk:app"))
    assert re.search(r"database: \S+/signoff_helpdesk", dev.output), dev.output
    assert "took over" not in dev.output  # none of the demo's runs
    with dev.client() as c:
        assert c.get("/v1/threads").json()["threads"] == []
        assert c.get(f"/v1/cards/{demo_card['id']}").status_code == 404
    listed = _cli(dev.data_dir, "cards", "list", "--status", "pending")
    assert listed.returncode == 0 and demo_card["id"][:8] not in listed.stdout, listed.stdout
    dev.kill(signal.SIGTERM)
    dev.start()  # and back: the demo's thread and card are where they were
    with dev.client() as c:
        assert c.get(f"/v1/cards/{demo_card['id']}").json()["card"]["status"] == "pending"


def test_ctrl_c_stops_dev_without_the_pools_drain(dev: Dev) -> None:
    """No load balancer steers clients away from a dev process: Ctrl-C stops it without
    the gateway pools' drain delay (it waited 2 s and warned about /readyz), exit 0."""
    dev.start()
    assert dev.proc is not None and dev.proc.stdout is not None
    dev.proc.send_signal(signal.SIGINT)
    assert dev.proc.wait(30) == 0
    rest = dev.proc.stdout.read()
    assert "no new connections in" not in rest, rest
    assert "Traceback" not in rest, rest


def test_dev_servers_refuse_other_local_users_and_the_cli_uses_the_data_dir(dev: Dev) -> None:
    dev.start()
    embedded = dev.data_dir / "embedded"
    pg_password = (embedded / "pg.password").read_text().strip()
    valkey_password = (embedded / "valkey.password").read_text().strip()
    for path in (embedded / "pg.password", embedded / "valkey.password", dev.data_dir / "secret"):
        assert path.stat().st_mode & 0o777 == 0o600, path
    assert embedded.stat().st_mode & 0o777 == 0o700
    assert pg_password not in dev.output and valkey_password not in dev.output
    pg_port = _port(r"database: \S+@127\.0\.0\.1:(\d+)/", dev.output)
    redis_port = _port(r"bus:\s+redis \S+@127\.0\.0\.1:(\d+)/", dev.output)

    # Someone on the host without the data dir: no database, no inbox.
    with pytest.raises(asyncpg.InvalidAuthorizationSpecificationError):
        asyncio.run(_connect_without_password(pg_port))
    with socket.create_connection(("127.0.0.1", redis_port), timeout=5) as sock:
        sock.sendall(b"XADD so:inbox * job injected\r\n")
        assert sock.recv(64).startswith(b"-NOAUTH")

    # The CLI on the same data dir finds the running servers' credentials there.
    with dev.client() as c:
        thread = c.post("/v1/threads").json()["thread"]["id"]
        c.post(f"/v1/threads/{thread}/messages", json={"text": "cobre 12 do João"})
        card = wait_for(lambda: c.get(f"/v1/threads/{thread}").json()["pending_cards"])[0]
    listed = _cli(dev.data_dir, "cards", "list", "--status", "pending")
    assert listed.returncode == 0, listed.stderr
    assert card["id"][:8] in listed.stdout  # ids are shown short (any unique prefix is accepted)
    for command in ("cards", "runs"):  # the action defaults to list
        bare = _cli(dev.data_dir, command)
        assert bare.returncode == 0, bare.stderr
        assert (card["id"] if command == "cards" else card["run_id"])[:8] in bare.stdout
    # A reader that goes away (`| head`): no traceback, the shell's SIGPIPE status.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SIGNOFF_", "ANTHROPIC"))}
    gone = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "signoff",
            "cards",
            "show",
            card["id"],
            "--data-dir",
            str(dev.data_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert gone.stdout is not None and gone.stderr is not None
    gone.stdout.close()
    assert gone.wait(60) == 141
    with gone.stderr:
        assert b"Traceback" not in gone.stderr.read()
    token = _cli(dev.data_dir, "token", "--user", "demo")
    assert token.returncode == 0, token.stderr
    with httpx.Client(base_url=dev.url, timeout=10) as http:
        headers = {"Authorization": f"Bearer {token.stdout.strip()}"}
        assert http.get(f"/v1/cards/{card['id']}", headers=headers).status_code == 200


def test_dev_serves_metrics_only_on_the_metrics_port(dev: Dev) -> None:
    mport = free_port()
    dev.start(args=("--metrics-port", str(mport)))
    assert f"metrics:  http://127.0.0.1:{mport}/metrics" in dev.output
    with dev.client() as c:
        assert c.get("/metrics").status_code == 404  # never on the public port
    text = httpx.get(f"http://127.0.0.1:{mport}/metrics", timeout=10).text
    from prometheus_client.parser import text_string_to_metric_families

    names = {f.name for f in text_string_to_metric_families(text)}
    # One port for both of dev's roles: the worker's and the gateway's series.
    assert {"signoff_parked_runs", "signoff_websockets", "signoff_decisions"} <= names


def test_dev_says_metrics_are_off_by_default(dev: Dev) -> None:
    dev.start()
    assert "metrics:  off (set SIGNOFF_METRICS_PORT or --metrics-port)" in dev.output
