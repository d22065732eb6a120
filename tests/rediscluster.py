"""A local Redis Cluster for tests: 3 masters + 3 replicas of the machine's redis-server.

Started on free ports in a temporary folder (``redis-cli --cluster create ...
--cluster-replicas 1 --cluster-yes``), with a short ``cluster-node-timeout`` so a
killed master's replica is promoted within about two seconds, and no persistence.
Every server dies with the test process (parent-death signal). :func:`local_cluster`
is a context manager; ``tests/conftest.py`` offers it as the session fixture
``redis_cluster``.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from signoff.embedded.process import popen_with_parent

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"
NODE_TIMEOUT_MS = 1000


def free_ports(n: int) -> list[int]:
    """``n`` ports that are free, each with its cluster bus port (+10000) free too."""
    found: list[int] = []
    while len(found) < n:
        port = random.randrange(20_000, 45_000)
        if port in found or port + 10_000 in found or port - 10_000 in found:
            continue
        if all(_bindable(p) for p in (port, port + 10_000)):
            found.append(port)
    return found


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def cli(port: int, *args: str, timeout: float = 10.0) -> str:
    """redis-cli against one node; its output (raises on failure)."""
    done = subprocess.run(
        [REDIS_CLI, "-p", str(port), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )
    return done.stdout


@dataclass
class LocalCluster:
    root: Path
    ports: list[int]
    processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """``redis+cluster://`` with every node as a seed."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def start_node(self, port: int) -> None:
        folder = self.root / str(port)
        folder.mkdir(exist_ok=True)
        conf = folder / "redis.conf"
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\ncluster-enabled yes\n"
            f"cluster-config-file nodes.conf\ncluster-node-timeout {NODE_TIMEOUT_MS}\n"
            'save ""\nappendonly no\nprotected-mode no\n'
            "cluster-replica-validity-factor 0\ncluster-allow-reads-when-down no\n"
            f"dir {folder}\nlogfile {folder / 'redis.log'}\n"
        )
        log = (folder / "stdout.log").open("ab")
        self.processes[port] = popen_with_parent(
            [REDIS_SERVER, str(conf)], env=dict(os.environ), stdout=log, cwd=folder
        )
        log.close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.processes[port].poll() is not None:
                logged = (folder / "redis.log").read_text(errors="replace")[-1500:]
                raise RuntimeError(f"redis-server on {port} exited: {logged}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                return
            time.sleep(0.02)
        raise RuntimeError(f"redis-server on {port} did not start")

    def create(self) -> None:
        nodes = [f"127.0.0.1:{p}" for p in self.ports]
        cli(
            self.ports[0],
            "--cluster",
            "create",
            *nodes,
            "--cluster-replicas",
            "1",
            "--cluster-yes",
            timeout=60,
        )
        self.wait_ok()

    def info(self, port: int) -> dict[str, str]:
        out = cli(port, "CLUSTER", "INFO")
        return dict(line.split(":", 1) for line in out.split() if ":" in line)

    def wait_ok(self, timeout: float = 30.0) -> float:
        """Until the cluster is settled; the seconds it took.

        Settled: every live node says ``cluster_state:ok`` with every slot served, and
        all of them agree on which node owns which slots; exactly three masters own
        the slots and no live master owns none (a restarted master first comes back
        as one, until gossip makes it a replica of the node promoted in its place);
        and when every node is up, each master has a replica whose link to it is up.
        A later test reads roles, replicas and per-master counters off this topology,
        so "ok" alone (which a node says before the restarted one has settled) left
        it half-formed for them."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            try:
                if self._settled():
                    return time.monotonic() - started
            except (subprocess.SubprocessError, OSError, ValueError, IndexError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"the Redis Cluster did not become ok in {timeout:.0f}s: {self.state()}")

    def slot_map(self, port: int) -> dict[str, list[str]]:
        """Node id -> the slot ranges it owns, as node ``port`` sees them."""
        out: dict[str, list[str]] = {}
        for line in cli(port, "CLUSTER", "NODES").splitlines():
            parts = line.split()
            ranges = [r for r in parts[8:] if not r.startswith("[")]  # not migrations
            if ranges:
                out[parts[0]] = sorted(ranges)
        return out

    def owner_of(self, slot: int) -> int:
        """The port of the master that owns ``slot`` (as the first live node sees it)."""
        for line in cli(self.live()[0], "CLUSTER", "NODES").splitlines():
            parts = line.split()
            for r in parts[8:]:
                if r.startswith("["):
                    continue
                low, _, high = r.partition("-")
                if int(low) <= slot <= int(high or low):
                    return int(parts[1].split("@")[0].rsplit(":", 1)[1])
        raise LookupError(f"no node owns slot {slot}")

    def _settled(self) -> bool:
        live = self.live()
        for port in live:
            info = self.info(port)
            if info.get("cluster_state") != "ok" or info.get("cluster_slots_ok") != "16384":
                return False
        views = [self.slot_map(port) for port in live]
        if any(view != views[0] for view in views[1:]):
            return False  # the nodes do not agree yet on who owns what
        nodes = [line.split() for line in cli(live[0], "CLUSTER", "NODES").splitlines()]
        up = [n for n in nodes if "fail" not in n[2] and "noaddr" not in n[2]]
        masters = [n for n in up if "master" in n[2]]
        if len(masters) != 3 or any(len(n) < 9 for n in masters):
            return False  # a master owning no slot, or a fourth master
        if len(live) < len(self.ports):
            return True  # a node is down on purpose: its master may have no replica now
        for master in masters:
            replicas = [n for n in up if "slave" in n[2] and n[3] == master[0]]
            if not replicas:
                return False
            for replica in replicas:
                port = int(replica[1].split("@")[0].rsplit(":", 1)[1])
                if "master_link_status:up" not in cli(port, "INFO", "replication"):
                    return False
        return True

    def state(self) -> str:
        """What each live node says of the cluster, and the tail of its log (for a failure)."""
        out: list[str] = []
        for port in self.live():
            try:
                info = self.info(port)
                nodes = cli(port, "CLUSTER", "NODES")
            except (subprocess.SubprocessError, OSError) as exc:
                out.append(f"{port}: {exc}")
                continue
            logged = (self.root / str(port) / "redis.log").read_text(errors="replace")
            tail = " | ".join(logged.strip().splitlines()[-6:])
            out.append(
                f"\n{port}: cluster_state={info.get('cluster_state')} "
                f"slots_ok={info.get('cluster_slots_ok')} epoch={info.get('cluster_current_epoch')}"
                f"\n{nodes.strip()}\nlog: {tail}"
            )
        return "".join(out)

    def live(self) -> list[int]:
        return [p for p, proc in self.processes.items() if proc.poll() is None]

    def roles(self) -> dict[int, str]:
        """Port -> "master"/"slave" as the first live node sees it (failed nodes left out)."""
        out = cli(self.live()[0], "CLUSTER", "NODES")
        roles: dict[int, str] = {}
        for line in out.splitlines():
            parts = line.split()
            port = int(parts[1].split("@")[0].rsplit(":", 1)[1])
            flags = parts[2]
            if "fail" in flags or "noaddr" in flags:
                continue
            roles[port] = "master" if "master" in flags else "slave"
        return roles

    def masters(self) -> list[int]:
        return sorted(p for p, role in self.roles().items() if role == "master")

    def replicas(self) -> list[int]:
        return sorted(p for p, role in self.roles().items() if role == "slave")

    def replica_of(self, master: int, timeout: float = 15.0) -> int:
        """A live replica of ``master`` that is in sync (waits for one)."""
        me = cli(master, "CLUSTER", "MYID").strip()
        deadline = time.monotonic() + timeout
        while True:
            for line in cli(master, "CLUSTER", "NODES").splitlines():
                parts = line.split()
                if parts[3] == me and "fail" not in parts[2]:
                    port = int(parts[1].split("@")[0].rsplit(":", 1)[1])
                    if "master_link_status:up" in cli(port, "INFO", "replication"):
                        return port
            if time.monotonic() > deadline:
                raise LookupError(f"no live replica of {master}")
            time.sleep(0.1)

    def wait_replicated(self, master: int, timeout: float = 10.0) -> None:
        """Until every replica of ``master`` has all it wrote so far (asynchronous)."""
        info = cli(master, "INFO", "replication")
        target = int(info.split("master_repl_offset:")[1].split()[0])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lines = [
                line
                for line in cli(master, "INFO", "replication").split()
                if line.startswith("slave")
            ]
            offsets = [
                int(part.split("=")[1])
                for line in lines
                if ":ip=" in line
                for part in line.split(",")
                if part.startswith("offset=")
            ]
            if offsets and min(offsets) >= target:
                return
            time.sleep(0.02)
        raise RuntimeError(f"the replicas of {master} did not catch up")

    def kill(self, port: int) -> None:
        """kill -9 one node."""
        proc = self.processes[port]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def restart(self, port: int) -> None:
        """Start a killed node again (it rejoins as a replica of its promoted one)."""
        self.start_node(port)

    def command_calls(self, port: int, command: str) -> int:
        """``INFO commandstats`` calls of one command on one node (0 if never called)."""
        for line in cli(port, "INFO", "commandstats").splitlines():
            if line.startswith(f"cmdstat_{command}:"):
                stats = dict(kv.split("=") for kv in line.split(":", 1)[1].split(","))
                return int(stats["calls"])
        return 0

    def flush(self) -> None:
        for port in self.masters():
            cli(port, "FLUSHALL")

    def stop(self) -> None:
        for proc in self.processes.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)


@contextlib.contextmanager
def plain_servers(n: int) -> Iterator[list[int]]:
    """``n`` plain (non-cluster) redis-servers on free ports; their ports."""
    root = Path(tempfile.mkdtemp(prefix="signoff-redis-"))
    ports = free_ports(n)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for port in ports:
            folder = root / str(port)
            folder.mkdir()
            log = (folder / "stdout.log").open("ab")
            argv = [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
            argv += ["--appendonly", "no", "--dir", str(folder)]
            procs.append(popen_with_parent(argv, env=dict(os.environ), stdout=log, cwd=folder))
            log.close()
        for port in ports:
            deadline = time.monotonic() + 10
            while cli(port, "PING").strip() != "PONG" if _up(port) else True:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on {port} did not start")
                time.sleep(0.02)
        yield ports
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        shutil.rmtree(root, ignore_errors=True)


def _up(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), 0.2):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def local_cluster() -> Iterator[LocalCluster]:
    root = Path(tempfile.mkdtemp(prefix="signoff-cluster-"))
    cluster = LocalCluster(root, free_ports(6))
    try:
        for attempt in range(3):  # a port taken between the probe and the bind: others
            try:
                for port in cluster.ports:
                    cluster.start_node(port)
                break
            except RuntimeError:
                cluster.stop()
                if attempt == 2:
                    raise
                cluster = LocalCluster(root, free_ports(6))
        cluster.create()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
