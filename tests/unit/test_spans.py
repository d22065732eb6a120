"""Per-process spans: every wake is recorded under the path that woke the run."""

from __future__ import annotations

import asyncio
import json
import time

from signoff.runtime.spans import Spans, WakeTimer, spans_json
from signoff.runtime.waits import WaitRegistry


def test_each_wake_is_labelled_by_the_path_that_resolved_it() -> None:
    async def main() -> None:
        waits = WaitRegistry(lambda run_id: None)
        waits.park("r1", ["c1"])
        waits.park("r2", ["c2"])
        waits.park("r3", ["c3"])
        assert waits.resolve("c1", "approved")  # the fast path (default label)
        assert waits.resolve("c2", "approved", "poll")
        assert not waits.resolve("c2", "approved", "sweep")  # already woken: first path kept
        assert not waits.resolve("nope", "approved", "poll")  # nothing parked: nothing noted
        waits.woken.woke("r4", "adoption")
        for run_id in ("r1", "r2", "r4"):
            waits.woken.finished(run_id, time.monotonic_ns())
        waits.woken.finished("r5", time.monotonic_ns())  # no note (a deadline, a retry)
        spans = waits.woken.spans.after(0)
        done = {(name, path) for name, path, ns in spans if ns >= 0}
        assert {p for n, p in done if n == "wake_to_step_done"} == {
            "signal",
            "poll",
            "adoption",
            "other",
        }
        assert len(spans) == 8 and waits.woken.spans.count == 8
        waits.woken.finished("r1", time.monotonic_ns())  # its note was used: now "other"
        assert waits.woken.spans.after(8)[0][1] == "other"

    asyncio.run(main())


def test_after_returns_only_later_spans_and_the_json_carries_the_count() -> None:
    spans = Spans(maxlen=3)
    for i in range(5):
        spans.add("step", "signal", i)
    assert [ns for _, _, ns in spans.after(0)] == [2, 3, 4]  # only the last 3 are held
    assert [ns for _, _, ns in spans.after(3)] == [3, 4]
    assert spans.after(5) == [] and spans.after(10**18) == []
    body = json.loads(spans_json(spans, "after=4"))
    assert body == {"count": 5, "spans": [["step", "signal", 4]]}
    assert json.loads(spans_json(spans, "after=junk"))["spans"] == [
        ["step", "signal", i] for i in (2, 3, 4)
    ]


def test_the_timer_forgets_notes_past_its_bound() -> None:
    timer = WakeTimer()
    for i in range(100_002):
        timer.woke(f"r{i}", "signal")
    timer.woke(None, "signal")  # a card with no run: ignored
    assert len(timer._woken) <= 100_001
