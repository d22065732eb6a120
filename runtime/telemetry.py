"""Server-side spans: always a ``signoff_span_seconds`` histogram, and an OpenTelemetry span
when tracing is configured.

Tracing is off unless ``SIGNOFF_OTEL=1`` or ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set
(:func:`setup`, called once by the CLI), and needs the optional extra
``pip install 'signoff[otel]'``; without the packages signoff runs the same and says once
that it traces nothing. The OTLP exporter reads the standard ``OTEL_*`` variables
(endpoint, headers, ``OTEL_SERVICE_NAME``).

One decision is one trace across processes: the gateway's ``signoff.resolve`` span puts
its W3C ``traceparent`` in the signal it publishes to the worker holding the run
(``CardSignal.trace``); the worker continues that run under it, so its
``signoff.continue``/``signoff.execute`` spans are children of the gateway's span.
With tracing off :func:`traceparent` is ``""`` and nothing else is done per decision.
"""

from __future__ import annotations

import contextvars
import logging
import time
from types import TracebackType
from typing import Any

from signoff.runtime.metrics import SPANS

log = logging.getLogger("signoff.telemetry")

_tracer: Any = None  # an opentelemetry Tracer when tracing is on
_propagator: Any = None
_children: dict[str, Any] = {}  # span name -> its histogram child (labels() once)


def enabled() -> bool:
    return _tracer is not None


def setup(on: bool, service: str) -> bool:
    """Trace to the OTLP endpoint configured by the ``OTEL_*`` variables when ``on``;
    True if tracing is on. Without the ``otel`` extra installed it logs why not."""
    if not on:
        return False
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        log.warning(
            "tracing asked for (SIGNOFF_OTEL / OTEL_EXPORTER_OTLP_ENDPOINT) but the "
            "OpenTelemetry packages are missing (pip install 'signoff[otel]'): %s",
            exc,
        )
        return False
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    use(provider)
    return True


def use(provider: Any) -> None:
    """Trace with this TracerProvider (tests pass one with an in-memory exporter); None
    turns tracing off."""
    global _tracer, _propagator
    if provider is None:
        _tracer = _propagator = None
        return
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _tracer = provider.get_tracer("signoff")
    _propagator = TraceContextTextMapPropagator()


class span:
    """``with span("execute", card_id=...)``: times the block into ``signoff_span_seconds``
    and, when tracing is on, makes it the current OpenTelemetry span ``signoff.<name>``."""

    __slots__ = ("_cm", "_name", "_t0", "attrs")

    def __init__(self, name: str, **attrs: str) -> None:
        self._name = name
        self.attrs = attrs
        self._cm: Any = None
        self._t0 = 0.0

    def __enter__(self) -> span:
        if _tracer is not None:
            self._cm = _tracer.start_as_current_span("signoff." + self._name, attributes=self.attrs)
            self._cm.__enter__()
        self._t0 = time.perf_counter()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        child = _children.get(self._name)
        if child is None:
            child = _children[self._name] = SPANS.labels(self._name)
        child.observe(time.perf_counter() - self._t0)
        if self._cm is not None:
            self._cm.__exit__(kind, exc, tb)


def traceparent() -> str:
    """The current span's W3C ``traceparent`` ("" with tracing off), to carry in a signal."""
    if _propagator is None:
        return ""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent", "")


def context_of(parent: str) -> contextvars.Context | None:
    """A copy of the current context under the remote span ``parent`` (a ``traceparent``),
    for a task started on its behalf; None with tracing off or no parent."""
    if not parent or _propagator is None:
        return None
    from opentelemetry import context as otel_context

    remote = _propagator.extract({"traceparent": parent})
    ctx = contextvars.copy_context()
    ctx.run(otel_context.attach, remote)
    return ctx
