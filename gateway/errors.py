"""The one place where error types become HTTP statuses and WS error codes (I9)."""

from __future__ import annotations

import logging
from typing import Any

from signoff.runtime import errors as e

log = logging.getLogger("signoff.gateway")


class Internal(e.SignoffError):
    """An exception nothing else typed: a bug, answered as a typed 500 (never text/plain)."""

    code = "internal"


STATUS: list[tuple[type[e.SignoffError], int]] = [
    (e.InvalidInput, 422),
    (e.Unauthenticated, 401),
    (e.Forbidden, 403),
    (e.NotFound, 404),
    # The card exists but this gateway does not serve its tool (a version skew, or a
    # tool removed): nothing changed; another gateway, or a later deploy, may decide it.
    (e.UnknownTool, 409),
    (e.Expired, 410),
    (e.Conflict, 409),
    (e.RateLimited, 429),
    (e.RequestTimeout, 408),
    (e.Unavailable, 503),
    # The model's API refused a request for good (a wrong key, a request it will not
    # take): a bad answer from upstream, not this server's bug.
    (e.ModelRefused, 502),
    (e.ConfigError, 500),
    (Internal, 500),
]


def status_of(exc: e.SignoffError) -> int:
    for cls, status in STATUS:
        if isinstance(exc, cls):
            return status
    return 500


def typed(exc: Exception) -> e.SignoffError:
    """Any exception on a request's or a socket's path as the error its client gets: a
    timeout or a dropped connection is retriable (503), anything else untyped is a bug."""
    if isinstance(exc, e.SignoffError):
        return exc
    if isinstance(exc, TimeoutError):
        return e.Unavailable("timed out; try again")
    if isinstance(exc, OSError):  # its text names hosts and ports: the log has it, not the client
        log.warning("backing service unavailable: %s: %s", type(exc).__name__, exc)
        return e.Unavailable("backing service unavailable; try again")
    return Internal("internal error")


def error_body(exc: e.SignoffError) -> dict[str, Any]:
    body: dict[str, Any] = {"error": exc.code, "message": exc.public}
    if exc.detail:
        body["detail"] = exc.detail
    return body


def retry_after(exc: e.SignoffError) -> int | None:
    """Seconds for a ``Retry-After`` header: a quota's own wait, 1 for a backing service that
    did not answer; None when retrying the same request cannot help."""
    if isinstance(exc, e.RateLimited):
        return exc.retry_after
    if isinstance(exc, e.Unavailable):
        return 1
    return None
