"""Per-process spans: monotonic durations measured inside one process, labelled.

A span is ``(name, path, ns)``: ``name`` says what was timed, ``path`` how it began
(for a worker's wake: which of the ways a parked run learns of its decision woke
it: ``signal``, ``subscribe`` (re-read after a re-subscription), ``park`` (re-read
right after parking), ``poll`` (the slow poll), ``sweep``, ``adoption``,
``deadline``). Durations come from ``time.monotonic_ns`` of one process: no clock
is ever subtracted across processes or hosts.

Workers keep the last ``maxlen`` spans; ``signoff worker`` serves them on
``SIGNOFF_METRICS_PORT`` at ``/metrics/spans?after=N`` (the spans recorded after
the N-th), which is how ``bench/decisions.py`` reads them per phase.
"""

from __future__ import annotations

import time
from collections import deque
from urllib.parse import parse_qs

import msgspec


class Spans:
    """The last ``maxlen`` spans and a running count."""

    def __init__(self, maxlen: int = 100_000) -> None:
        self._items: deque[tuple[str, str, int]] = deque(maxlen=maxlen)
        self.count = 0

    def add(self, name: str, path: str, ns: int) -> None:
        self._items.append((name, path, ns))
        self.count += 1

    def __len__(self) -> int:
        return len(self._items)

    def after(self, n: int) -> list[tuple[str, str, int]]:
        """The spans recorded after the n-th one that are still held."""
        held = min(max(self.count - max(n, 0), 0), len(self._items))
        return list(self._items)[len(self._items) - held :] if held else []


_json = msgspec.json.Encoder()


def after_of(raw: str) -> int:
    """A sample cursor (``?after=``): ASCII digits that fit a 64-bit count, else 0. (A
    Unicode digit such as "²" passes ``str.isdigit`` and failed ``int``: a 500.)"""
    digits = raw.removeprefix("-")
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 18:
        return 0
    return int(raw)


def spans_json(spans: Spans, query: str) -> bytes:
    after = after_of(parse_qs(query).get("after", ["0"])[0])
    return _json.encode({"count": spans.count, "spans": spans.after(after)})


class WakeTimer:
    """When and how each parked run was woken, until the step it set off is done.

    :meth:`woke` notes the first way a run learnt of its decision; :meth:`finished`
    records ``wake_to_step_done`` (woken -> step done) and ``step`` (the step alone,
    from its slot) under that path. A run finished with no note (a deadline, a retry)
    is recorded under ``other`` with its step time only.
    """

    def __init__(self, spans: Spans | None = None) -> None:
        self.spans = spans if spans is not None else Spans()
        self._woken: dict[str, tuple[str, int]] = {}  # run -> (path, monotonic ns)

    def woke(self, run_id: str | None, path: str) -> None:
        if run_id is None:
            return
        if len(self._woken) > 100_000:  # runs dropped before their wake ran: forget
            self._woken.clear()
        self._woken.setdefault(run_id, (path, time.monotonic_ns()))

    def finished(self, run_id: str, started_ns: int) -> None:
        path, woken = self._woken.pop(run_id, ("other", started_ns))
        done = time.monotonic_ns()
        self.spans.add("wake_to_step_done", path, done - woken)
        self.spans.add("step", path, done - started_ns)
