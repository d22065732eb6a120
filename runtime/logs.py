"""Logs: one JSON line per event with ids as fields, or a human line for ``signoff dev``.

``SIGNOFF_LOG_FORMAT`` is ``json`` (the default of ``signoff gateway`` and ``signoff
worker``: one object per line on stderr, via python-json-logger) or ``human`` (the default
of ``signoff dev``); ``SIGNOFF_LOG_LEVEL`` is ``debug``, ``info`` (default), ``warning``
or ``error``.

Ids travel as fields, never only inside the text: a call passes them in ``extra``
(``log.info("card decided", extra={"card_id": ...})``), and code working for one run binds
them for everything it logs meanwhile (:func:`bind`, a context variable, so each asyncio
task has its own). Every line of a process also carries its ``role`` and, for a worker,
its ``worker_id``. The fields: ``card_id`` (with ``decision``), ``run_id``, ``thread_id``, ``worker_id``,
``message_id``, ``channel``, ``user``, ``tenant``, ``role``.
"""

from __future__ import annotations

import contextvars
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

import msgspec

from signoff.runtime.errors import ConfigError

ID_FIELDS = (
    "card_id",
    "decision",  # not an id: what "card decided" says, shown on the human line too
    "run_id",
    "thread_id",
    "worker_id",
    "message_id",
    "channel",
    "user",
    "tenant",
    "role",
)
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}
LEVELS["error"] = logging.ERROR
FORMATS = ("json", "human")

_bound: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "signoff_log_ids", default=None
)


def bind(**ids: str) -> contextvars.Token[dict[str, str] | None]:
    """Add ids to every line logged from this task from now on (until :func:`unbind`)."""
    current = _bound.get()
    return _bound.set({**current, **ids} if current else ids)


def unbind(token: contextvars.Token[dict[str, str] | None]) -> None:
    _bound.reset(token)


class Ids(logging.Filter):
    """Puts the bound ids and the process's own fields on each record (as attributes)."""

    def __init__(self, static: dict[str, str]) -> None:
        super().__init__()
        self.static = static

    def filter(self, record: logging.LogRecord) -> bool:
        fields = record.__dict__
        bound = _bound.get()
        if bound:
            for key, value in bound.items():
                fields.setdefault(key, value)
        for key, value in self.static.items():
            fields.setdefault(key, value)
        return True


class Human(logging.Formatter):
    """``12:00:01 INFO signoff.worker: card executed  card_id=… run_id=…``"""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        ids = [
            f"{k}={record.__dict__[k]}"
            for k in ID_FIELDS
            if k in record.__dict__ and k not in ("role", "worker_id")
        ]
        return text + ("  " + " ".join(ids) if ids else "")


def formatter(fmt: str) -> logging.Formatter:
    if fmt == "human":
        return Human()
    from pythonjsonlogger.json import JsonFormatter

    return JsonFormatter(
        "%(levelname)s %(name)s %(message)s",
        rename_fields={"levelname": "level", "name": "logger"},
        timestamp=True,
        json_serializer=_dumps,  # msgspec: half the formatter's time of the stdlib json
    )


_encoder = msgspec.json.Encoder(enc_hook=str)  # anything else in a field: its str()


def _dumps(data: Any, **options: Any) -> str:
    return _encoder.encode(data).decode()


def setup(fmt: str, level: str, stream: Any = None, **static: str) -> logging.Handler:
    """Send every log line of the process to ``stream`` (stderr) in ``fmt`` at ``level``;
    ``static`` fields go on every line. Replaces handlers set before (idempotent)."""
    if fmt not in FORMATS:
        raise ConfigError(f"SIGNOFF_LOG_FORMAT must be one of {', '.join(FORMATS)}, not {fmt!r}")
    if level.lower() not in LEVELS:
        raise ConfigError(f"SIGNOFF_LOG_LEVEL must be one of {', '.join(LEVELS)}, not {level!r}")
    # The logging HOWTO's optimisations: no thread, process or caller lookups per record
    # (no line prints them), ~2 us of the ~10 us a line costs.
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    logging._srcfile = None
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(formatter(fmt))
    handler.addFilter(Ids({k: v for k, v in static.items() if v}))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(LEVELS[level.lower()])
    # Chatty libraries stay at warning whatever signoff's level (their info is not ours).
    # (httpx2: the HTTP client some anthropic releases use, one info line per model call.)
    for name in ("httpx", "httpx2", "httpcore", "anthropic", "asyncio"):
        logging.getLogger(name).setLevel(max(LEVELS[level.lower()], logging.WARNING))
    return handler


class Throttle:
    """At most one line per ``seconds`` for a failure that recurs while something is down
    (an operator probe: a Redis outage of 35 s made ~150 warnings per worker, the same
    few lines again and again). :meth:`allow` is None for a line to leave out, else how
    many were left out since the last one written."""

    def __init__(self, seconds: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self.clock = clock
        self._next = float("-inf")
        self._held = 0

    def allow(self) -> int | None:
        now = self.clock()
        if now < self._next:
            self._held += 1
            return None
        held, self._held, self._next = self._held, 0, now + self.seconds
        return held


def left_out(held: int) -> str:
    """The tail of a throttled line: how many like it were not written."""
    return f" ({held} more like this in the last while, not logged)" if held else ""
