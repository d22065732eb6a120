"""Process metrics: Prometheus text for ``/metrics`` and raw decision-latency samples.

No client library: the text exposition format is a few lines, and the one
histogram signoff keeps is observed on the decision hot path, where a plain
bucket search is cheaper than a registry with locks.

The gateway serves ``/metrics`` on its own port (``gateway.app``). A worker has
no HTTP server of its own, so ``signoff worker`` serves the same on
``SIGNOFF_METRICS_PORT`` when it is set (off by default), plus
``/metrics/decision-latency?after=N``: the raw samples (ns) recorded after the
N-th one, which is how ``bench/decisions.py`` reads exact percentiles per phase.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import os
import resource
from collections import deque
from collections.abc import Callable
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlsplit

import msgspec

from signoff.runtime.spans import Spans, spans_json

# Seconds. Dense where signoff should live (sub-millisecond to tens of milliseconds).
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0015,
    0.002,
    0.003,
    0.004,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class Histogram:
    """A cumulative Prometheus histogram (seconds)."""

    def __init__(self, name: str, help_text: str, buckets: tuple[float, ...] = LATENCY_BUCKETS):
        self.name = name
        self.help = help_text
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, seconds)] += 1
        self.sum += seconds
        self.count += 1

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        running = 0
        for bound, n in zip(self.buckets, self.counts, strict=False):
            running += n
            lines.append(f'{self.name}_bucket{{le="{bound}"}} {running}')
        lines.append(f'{self.name}_bucket{{le="+Inf"}} {self.count}')
        lines.append(f"{self.name}_sum {self.sum:.9f}")
        lines.append(f"{self.name}_count {self.count}")
        return lines


class LatencySamples:
    """Decision latency in ns: the last ``maxlen`` raw samples, a running count and a histogram.

    Appended to like a deque (``append``); ``after(n)`` returns the samples recorded
    after the n-th one that are still held.
    """

    def __init__(self, maxlen: int = 100_000) -> None:
        self._samples: deque[int] = deque(maxlen=maxlen)
        self.count = 0
        self.histogram = Histogram(
            "signoff_decision_latency_seconds",
            "Decision received by a gateway -> the parked run's future resolved on this worker.",
        )

    def append(self, ns: int) -> None:
        self._samples.append(ns)
        self.count += 1
        self.histogram.observe(ns / 1e9)

    def __len__(self) -> int:
        return len(self._samples)

    def __iter__(self) -> Any:
        return iter(self._samples)

    def after(self, n: int) -> list[int]:
        wanted = max(self.count - max(n, 0), 0)
        held = min(wanted, len(self._samples))
        if held == 0:
            return []
        return list(self._samples)[-held:]


class Counters:
    """Process-wide event counters (Prometheus counters), e.g. hints that could not be
    published after a commit. Incremented where the event happens, read by /metrics."""

    HELP: ClassVar[dict[str, str]] = {
        "signoff_hints_failed_total": "Publishes, wait-token writes or deletes that failed "
        "after their commit (Redis is a hint: the step went on).",
        "signoff_handler_errors_total": "Inbox messages or continuations that raised.",
        "signoff_runs_failed_by_error_total": "Runs settled as failed after an error.",
        "signoff_inbox_released_total": "Inbox entries handed back for a later retry.",
        "signoff_approved_stale_total": "Approved cards the sweeper found not yet started.",
        "signoff_runs_handed_over_total": "Runs handed to another worker: an approved card "
        "named a tool this worker does not serve (another version of the app).",
        "signoff_store_races_retried_total": "Statements or transactions Postgres rolled "
        "back as a deadlock or serialization victim, tried again.",
    }

    def __init__(self) -> None:
        self.values: dict[str, int] = dict.fromkeys(self.HELP, 0)

    def inc(self, name: str, n: int = 1) -> None:
        self.values[name] = self.values.get(name, 0) + n

    def render(self) -> list[str]:
        lines: list[str] = []
        for name, value in self.values.items():
            lines += [
                f"# HELP {name} {self.HELP.get(name, name)}",
                f"# TYPE {name} counter",
                f"{name} {value}",
            ]
        return lines


COUNTERS = Counters()


def process_lines() -> list[str]:
    """RSS, CPU time and open descriptors of this process (Linux /proc; best effort)."""
    lines: list[str] = []
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * _PAGE
        lines += [
            "# HELP process_resident_memory_bytes Resident memory size in bytes.",
            "# TYPE process_resident_memory_bytes gauge",
            f"process_resident_memory_bytes {rss}",
        ]
    usage = resource.getrusage(resource.RUSAGE_SELF)
    lines += [
        "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.",
        "# TYPE process_cpu_seconds_total counter",
        f"process_cpu_seconds_total {usage.ru_utime + usage.ru_stime:.3f}",
    ]
    with contextlib.suppress(OSError):
        fds = len(os.listdir("/proc/self/fd"))
        lines += [
            "# HELP process_open_fds Number of open file descriptors.",
            "# TYPE process_open_fds gauge",
            f"process_open_fds {fds}",
        ]
    return lines


def gauge(name: str, help_text: str, value: float) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name} {value}"]


def worker_text(worker: Any) -> str:
    """The worker's metrics (``worker`` is a :class:`runtime.worker.Worker`)."""
    lines = [
        *gauge("signoff_parked_runs", "Runs parked on this worker.", len(worker.waits)),
        *gauge(
            "signoff_parked_cards",
            "Cards this worker waits on.",
            len(worker.waits.parked_cards()),
        ),
        *gauge("signoff_steps_in_flight", "Agent steps running now.", len(worker._tasks)),
    ]
    lines += COUNTERS.render()
    samples = worker.decision_latency_ns
    if isinstance(samples, LatencySamples):
        lines += samples.histogram.render()
    lines += process_lines()
    return "\n".join(lines) + "\n"


_json = msgspec.json.Encoder()


def samples_json(samples: LatencySamples, query: str) -> bytes:
    raw = parse_qs(query).get("after", ["0"])[0]
    after = int(raw) if raw.lstrip("-").isdigit() else 0
    return _json.encode({"count": samples.count, "samples_ns": samples.after(after)})


async def serve(
    host: str,
    port: int,
    text: Callable[[], str],
    samples: LatencySamples | None = None,
    spans: Spans | None = None,
) -> asyncio.Server:
    """A minimal HTTP/1.1 server for ``GET /metrics`` (and the raw samples); one request per
    connection. For a process with no web server of its own (the worker)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
            url = urlsplit(target)
            status, ctype, body = "404 Not Found", "text/plain", b"not found\n"
            if method == "GET" and url.path == "/metrics":
                status, body = "200 OK", text().encode()
                ctype = "text/plain; version=0.0.4; charset=utf-8"
            elif (
                method == "GET" and url.path == "/metrics/decision-latency" and samples is not None
            ):
                status, ctype, body = "200 OK", "application/json", samples_json(samples, url.query)
            elif method == "GET" and url.path == "/metrics/spans" and spans is not None:
                status, ctype, body = "200 OK", "application/json", spans_json(spans, url.query)
            elif method == "GET" and url.path == "/healthz":
                status, ctype, body = "200 OK", "application/json", b'{"ok":true}'
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                f"Connection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except TimeoutError:
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    return await asyncio.start_server(handle, host, port)
