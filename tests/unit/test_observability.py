"""Logs, spans and settings of the operator-facing telemetry (no servers)."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY

from signoff.runtime import config, logs, telemetry
from signoff.runtime.errors import ConfigError
from signoff.runtime.metrics import COUNTERS


@pytest.fixture
def root() -> Iterator[logging.Logger]:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    yield root
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in saved[0]:
        root.addHandler(handler)
    root.setLevel(saved[1])


def test_json_lines_carry_bound_and_given_ids(root: logging.Logger) -> None:
    out = io.StringIO()
    logs.setup("json", "info", out, role="gateway")
    log = logging.getLogger("signoff.test")
    token = logs.bind(run_id="r-1", thread_id="t-1")
    try:
        log.info("card decided", extra={"card_id": "c-1"})
        log.debug("not at info")
    finally:
        logs.unbind(token)
    log.warning("after unbind")
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["message"] == "card decided" and first["level"] == "INFO"
    assert (first["card_id"], first["run_id"], first["thread_id"]) == ("c-1", "r-1", "t-1")
    assert first["role"] == "gateway" and first["logger"] == "signoff.test"
    assert "run_id" not in second and second["level"] == "WARNING"


def test_human_lines_for_dev(root: logging.Logger) -> None:
    out = io.StringIO()
    logs.setup("human", "debug", out)
    logging.getLogger("signoff.test").info("card executed", extra={"card_id": "c-9"})
    line = out.getvalue().strip()
    assert not line.startswith("{")
    assert "INFO signoff.test: card executed" in line and line.endswith("card_id=c-9")
    # What a decision was is on the dev's line too (the newcomer probe: approve or reject?).
    logging.getLogger("signoff.test").info(
        "card decided", extra={"card_id": "c-9", "decision": "reject", "channel": "ws"}
    )
    assert (
        out.getvalue().strip().splitlines()[-1].endswith("card_id=c-9 decision=reject channel=ws")
    )


def test_bad_log_settings_are_refused(root: logging.Logger) -> None:
    with pytest.raises(ConfigError, match="SIGNOFF_LOG_FORMAT"):
        logs.setup("xml", "info")
    with pytest.raises(ConfigError, match="SIGNOFF_LOG_LEVEL"):
        logs.setup("json", "loud")


def test_tracing_is_off_unless_configured() -> None:
    assert config.from_env({}).otel is False
    assert config.from_env({"SIGNOFF_OTEL": "1"}).otel is True
    assert config.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}).otel
    assert config.from_env({"SIGNOFF_METRICS_PORT": "9464"}).metrics_port == 9464
    assert telemetry.setup(False, "signoff-test") is False
    assert not telemetry.enabled() and telemetry.traceparent() == ""


def test_spans_time_into_the_histogram_without_tracing() -> None:
    before = REGISTRY.get_sample_value("signoff_span_seconds_count", {"span": "unit"}) or 0
    with telemetry.span("unit", card_id="c"):
        pass
    after = REGISTRY.get_sample_value("signoff_span_seconds_count", {"span": "unit"})
    assert after == before + 1


def test_counters_keep_their_names_and_values() -> None:
    before = COUNTERS.values["signoff_hints_failed_total"]
    COUNTERS.inc("signoff_hints_failed_total")
    assert COUNTERS.values["signoff_hints_failed_total"] == before + 1
    assert REGISTRY.get_sample_value("signoff_hints_failed_total") == before + 1
    assert "signoff_redis_errors_total" in COUNTERS.values


BLOCK_OTEL = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
from signoff.runtime import telemetry
from signoff.runtime import cli  # the whole command line imports without the packages
assert telemetry.setup(True, "signoff-test") is False
with telemetry.span("resolve"):
    assert telemetry.traceparent() == ""
print("ok")
"""


def test_everything_works_without_the_opentelemetry_packages() -> None:
    done = subprocess.run(
        [sys.executable, "-c", BLOCK_OTEL], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
    assert "pip install 'signoff[otel]'" in done.stderr


def test_a_recurring_failure_is_logged_once_in_a_while() -> None:
    """An operator probe: a Redis outage of 35 s made ~150 warnings per worker, the same
    few lines over and over. A throttled line is written at most every 10 s, saying how
    many like it were left out."""
    from signoff.runtime import logs

    now = [100.0]
    throttle = logs.Throttle(10.0, clock=lambda: now[0])
    assert throttle.allow() == 0
    assert [throttle.allow() for _ in range(3)] == [None, None, None]
    now[0] += 10.0
    assert throttle.allow() == 3
    assert logs.left_out(3).startswith(" (3 more") and logs.left_out(0) == ""


@pytest.mark.anyio
async def test_hints_failing_during_an_outage_are_counted_each_and_logged_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uuid

    from signoff.runtime import notify
    from signoff.runtime.metrics import COUNTERS

    monkeypatch.setattr(notify, "_HINT_FAILURES", {})

    async def down() -> None:
        raise ConnectionError("Redis is away")

    before = COUNTERS.values.get("signoff_hints_failed_total", 0)
    for _ in range(20):  # one kind, many threads
        assert not await notify.quietly(down(), f"thread hint for {uuid.uuid4()}")
    assert not await notify.quietly(down(), "inbox ack")  # another kind: not hidden
    for _ in range(3):  # not a hint: every one logged
        assert not await notify.quietly(down(), "error entry", throttled=False)
    assert COUNTERS.values.get("signoff_hints_failed_total", 0) == before + 24
    assert caplog.text.count("thread hint for") == 1
    assert caplog.text.count("inbox ack failed") == 1
    assert caplog.text.count("error entry failed") == 3
