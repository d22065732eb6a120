"""Process metrics with prometheus-client, and raw decision-latency samples for the bench.

Every series lives in prometheus-client's default registry; ``runtime/metrics_server.py``
serves it on the metrics port (``SIGNOFF_METRICS_PORT``), never on the gateway's public
port (design note 27). Incremented where the event happens:

* ``signoff_card_transitions_total{status,tool}``: cards entering a status (``pending``
  when proposed), counted where the store reads a committed transition back.
* ``signoff_decisions_total{channel,outcome}``: decisions a gateway took or refused
  (``outcome`` is the decision, or the refusal's error code).
* ``signoff_click_to_executed_seconds``: a card's decision -> its ``executed`` row
  (both Postgres clock times); ``signoff_decision_latency_seconds``: a decision received
  by a gateway -> the parked run's future resolved on its worker.
* ``signoff_span_seconds{span}``: server-side spans (``resolve``, ``continue``, ``execute``,
  ``model``), the same spans OpenTelemetry traces when configured (``runtime/telemetry.py``).
* counters of Redis and Postgres errors and retries, pub/sub reconnects, adoptions,
  hints that failed after their commit, and the rest of :data:`HELP`.

Gauges of one worker or gateway (parked runs, inbox lag, open sockets) are collected when
scraped (``metrics_server``), so nothing is kept up to date on the hot path.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

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
    10.0,
    30.0,
)

CARD_TRANSITIONS = Counter(
    "signoff_card_transitions_total",
    "Cards that entered a status (pending: proposed), by status and tool.",
    ["status", "tool"],
)
DECISIONS = Counter(
    "signoff_decisions_total",
    "Decisions a gateway took (outcome approve/reject/edit) or refused (outcome: the "
    "error code), by channel.",
    ["channel", "outcome"],
)
CLICK_TO_EXECUTED = Histogram(
    "signoff_click_to_executed_seconds",
    "A card's decision -> its executed row (both Postgres clock).",
    buckets=LATENCY_BUCKETS,
)
DECISION_LATENCY = Histogram(
    "signoff_decision_latency_seconds",
    "Decision received by a gateway -> the parked run's future resolved on this worker.",
    buckets=LATENCY_BUCKETS,
)
SPANS = Histogram(
    "signoff_span_seconds",
    "Server-side spans: resolve (gateway), continue, execute, model (worker).",
    ["span"],
    buckets=LATENCY_BUCKETS,
)
OVERLOAD = Counter(
    "signoff_overload_refusals_total",
    "Requests a gateway refused with 503 overloaded, by reason.",
    ["reason"],
)


class Counters:
    """Named process-wide counters (prometheus-client counters without labels), e.g. hints
    that could not be published after a commit. ``inc`` where the event happens;
    ``values[name]`` reads one back (tests)."""

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
        "signoff_postgres_errors_total": "Postgres calls that failed (unreachable, timed "
        "out, connection lost): answered 503 or tried again by the caller.",
        "signoff_redis_retries_total": "Redis calls tried again after a connection error "
        "or timeout.",
        "signoff_redis_errors_total": "Redis calls that failed after their retries.",
        "signoff_pubsub_reconnects_total": "Times the Redis pub/sub connection was opened "
        "again after it was lost.",
        "signoff_runs_adopted_total": "Runs whose holder's lease lapsed, adopted here.",
        "signoff_cards_flagged_total": "Cards flagged for reconciliation: stuck in "
        "executing past SIGNOFF_STUCK_AFTER_SECONDS, or found executing in an adopted run "
        "whose previous holder did not come back within a lease and a tool call "
        "(design note 49).",
        "signoff_begin_answers_lost_total": "Card executions whose begin committed while "
        "its answer was lost, recognised by the begin's own token and sent (design note 50).",
        "signoff_retention_runs_total": "Scheduled prunes this worker ran (SIGNOFF_RETENTION_*; "
        "one worker at a time prunes).",
        "signoff_retention_threads_pruned_total": "Threads the scheduled prunes of this worker "
        "deleted.",
        "signoff_retention_failures_total": "Scheduled prunes that failed (tried again at the "
        "next interval; the log says why).",
        "signoff_tokens_bad_signature_total": "Bearer tokens refused because their signature "
        "does not verify: forged, or signed with another SIGNOFF_SECRET than this gateway's.",
        "signoff_prefix_lost_total": "Times this process found its Redis key prefix held by "
        "another app or database after it started (then it stops).",
        "signoff_late_outcomes_total": "Provider answers that came after their card was "
        "settled (an operator reconciled it while the call was in flight): written to the "
        "card's audit, logged as an ERROR when they disagree with the settled status.",
        "signoff_whatsapp_sent_total": "WhatsApp messages the Graph API accepted.",
        "signoff_whatsapp_failed_total": "WhatsApp messages given up after their attempts.",
        "signoff_group_commit_batches_total": "Statements that wrote several card "
        "transitions at once (group commit, store/group.py).",
        "signoff_group_commit_transitions_total": "Card transitions written by those statements.",
        "signoff_group_commit_fallbacks_total": "Batches that failed as a whole, their "
        "transitions then run one by one.",
    }

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self._registry = registry
        self._counters: dict[str, Counter] = {}
        for name in self.HELP:
            self._make(name)

    def _make(self, name: str) -> Counter:
        counter = self._counters.get(name)
        if counter is None:
            counter = Counter(name, self.HELP.get(name, name), registry=self._registry)
            self._counters[name] = counter
        return counter

    def inc(self, name: str, n: int = 1) -> None:
        counter = self._counters.get(name) or self._make(name)
        counter.inc(n)

    @property
    def values(self) -> Mapping[str, int]:
        """The current value of every counter, by name."""
        return _Values(self)


class _Values(Mapping[str, int]):
    def __init__(self, counters: Counters) -> None:
        self._c = counters

    def __getitem__(self, name: str) -> int:
        if name not in self._c._counters:
            raise KeyError(name)
        value = self._c._registry.get_sample_value(name)
        return int(value or 0)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._c._counters))

    def __len__(self) -> int:
        return len(self._c._counters)


COUNTERS = Counters()


# Labelled children looked up once (``labels()`` costs ~1 µs a call, a child's inc ~0.3 µs).
_cards: dict[tuple[str, str], Any] = {}
_decisions: dict[tuple[str, str], Any] = {}


def card_moved(status: str, tool: str) -> None:
    """A card entered ``status`` (counted where the store reads a transition back)."""
    child = _cards.get((status, tool))
    if child is None:
        child = _cards[(status, tool)] = CARD_TRANSITIONS.labels(status, tool)
    child.inc()


def decided(channel: str, outcome: str) -> None:
    """A gateway took (``outcome``: the decision) or refused (the error code) a decision."""
    child = _decisions.get((channel, outcome))
    if child is None:
        child = _decisions[(channel, outcome)] = DECISIONS.labels(channel, outcome)
    child.inc()


class LatencySamples:
    """Decision latency in ns: the last ``maxlen`` raw samples, a running count and the
    ``signoff_decision_latency_seconds`` histogram.

    Appended to like a deque (``append``); ``after(n)`` returns the samples recorded
    after the n-th one that are still held (the bench reads exact percentiles from them).
    """

    def __init__(self, maxlen: int = 100_000) -> None:
        self._samples: deque[int] = deque(maxlen=maxlen)
        self.count = 0

    def append(self, ns: int) -> None:
        self._samples.append(ns)
        self.count += 1
        DECISION_LATENCY.observe(ns / 1e9)

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
