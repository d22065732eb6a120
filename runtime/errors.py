"""One exception root for signoff.

Every error a caller can provoke is a subclass of :class:`SignoffError` and
carries a stable ``code``. The gateway maps each class to one HTTP/WS status
(see ``gateway/errors.py``); nothing below the gateway knows about HTTP.
"""

from __future__ import annotations

import math
from typing import Any, Self


class SignoffError(Exception):
    """Root of every signoff error."""

    code: str = "error"

    def __init__(self, message: str, **detail: Any) -> None:
        super().__init__(message)
        self.message = message
        self.detail: dict[str, Any] = detail
        # What a client is told: the message, unless it carries a driver's words (hosts,
        # ports, statements), which go to the log alone (:meth:`said_as`).
        self.public = message

    def said_as(self, public: str) -> Self:
        """This error, told to clients as ``public`` (the log keeps ``message``)."""
        self.public = public
        return self


class InvalidInput(SignoffError):
    """A payload that does not match its schema (I9: 422)."""

    code = "invalid_input"


class ToolValidationError(InvalidInput):
    """A tool's ``prepare`` refused the model's arguments; the message goes back to the model.

    ``message`` may be one text per language (``{"pt-BR": "...", "en": "..."}``): the
    model is told the ``en`` one (else the first), and a person whose edit the tool
    refused reads theirs (``detail["localized"]``, which the chat page picks from)."""

    code = "tool_validation"

    def __init__(self, message: str | dict[str, str], **detail: Any) -> None:
        if isinstance(message, dict):
            detail["localized"] = dict(message)
            message = message.get("en") or next(iter(message.values()), "")
        super().__init__(message, **detail)


class ToolRefused(SignoffError):
    """A write tool's ``execute`` was refused by its provider, which did nothing (a refund
    larger than what is left of the sale). Its message is the failed card's
    ``result.error``, shown to the person and told to the model. Any other exception a
    tool raises is shown by its kind alone (a driver's or an HTTP client's words may
    name hosts, ports or statements); the worker's log keeps its text."""

    code = "tool_refused"


class ToolTimedOut(SignoffError):
    """A read tool's call or a write's ``prepare`` did not answer within the tool deadline
    (``SIGNOFF_TOOL_TIMEOUT_SECONDS``); nothing was written, the model is told so."""

    code = "tool_timeout"


class ReservedKey(InvalidInput):
    """A payload or step result sets a state key the workflow engine owns (422)."""

    code = "reserved_key"


class Unauthenticated(SignoffError):
    """Missing, expired or forged credentials (401)."""

    code = "unauthenticated"


class BadSignature(Unauthenticated):
    """A channel webhook whose signature does not verify (401)."""

    # Unused until the WhatsApp channel (next issue) verifies X-Hub-Signature-256 with it;
    # kept on purpose, like the store's ``record_delivery`` and the ``deliveries`` table.

    code = "bad_signature"


class Forbidden(SignoffError):
    """Authenticated, but not allowed (403)."""

    code = "forbidden"


class NotOwner(Forbidden):
    """Only the card's owner decides (I3)."""

    code = "not_owner"


class OriginRejected(Forbidden):
    code = "origin_rejected"


class NotFound(SignoffError):
    code = "not_found"


class CardNotFound(NotFound):
    code = "card_not_found"


class WorkflowNotFound(NotFound):
    """No workflow of that name, or no workflow run of that id (404)."""

    code = "workflow_not_found"


class Conflict(SignoffError):
    """The request lost a race or arrived too late (409)."""

    code = "conflict"


class AlreadyDecided(Conflict):
    code = "already_decided"


class StaleCard(Conflict):
    """The decision carried a snapshot hash other than the card's (I2)."""

    code = "stale_hash"


class RunInactive(Conflict):
    """The run was superseded or finished (or, for a fenced write, is no longer held by the
    writing worker) while this step was in flight; nothing was written."""

    code = "run_inactive"


class WorkflowThread(Conflict):
    """A message to a thread a workflow run's agent steps talk on (409): the step owns
    the conversation; its cards are decided as any card, nothing else is accepted."""

    code = "workflow_thread"


class IllegalTransition(Conflict):
    """A move the card state machine does not allow."""

    code = "illegal_transition"


class NotParked(Conflict):
    """A workflow run is not waiting at that gate (still running, resumed by someone else,
    finished): nothing was changed (409)."""

    code = "not_parked"


class WrongEvent(Conflict):
    """An event whose name is not the one the run waits for (409); nothing was changed."""

    code = "wrong_event"


class EventsFull(Conflict):
    """A workflow run keeps as many events for later gates as it may
    (``SIGNOFF_WORKFLOW_EVENTS_KEPT``); this one was not kept (409)."""

    code = "events_full"


class NotRetriable(Conflict):
    """``retry`` on a workflow run that did not fail at a gate (409)."""

    code = "not_retriable"


class Expired(SignoffError):
    """The card's deadline passed, as judged by the database clock (I7) (410)."""

    code = "expired"


class RateLimited(SignoffError):
    """Over a rate or a per-user quota (429); nothing was done. ``retry_after`` is how many
    seconds until the same request may succeed (HTTP ``Retry-After``; ``detail`` on WS)."""

    code = "rate_limited"

    def __init__(self, message: str, *, retry_after: float = 1.0, **detail: Any) -> None:
        self.retry_after = max(math.ceil(retry_after), 1)
        super().__init__(message, retry_after=self.retry_after, **detail)


class RequestTimeout(SignoffError):
    """The client did not send its request (headers or body) in time (408)."""

    code = "request_timeout"


class Unavailable(SignoffError):
    """A backing service (Postgres, Redis) did not answer; retry later (503)."""

    code = "unavailable"
    # The call may have been applied although no answer came (a timeout, a connection
    # lost after the command went out), as opposed to refused or never sent.
    maybe_applied = False

    def unanswered(self) -> Self:
        """This error, marked as maybe applied."""
        self.maybe_applied = True
        return self


class MaybeQueued(Unavailable):
    """A message whose enqueue got no answer: it may be queued (and will run) or not.
    Sent again with the same ``idempotency_key`` it runs at most once; ``detail``
    names its thread."""


class ExecutingElsewhere(Unavailable):
    """A run's card is `executing` in the run's previous holder (which may come back and
    finish it): its continuation is tried again later (design note 49)."""

    code = "executing_elsewhere"


class Overloaded(Unavailable):
    """A gateway at its in-flight limit (``SIGNOFF_MAX_IN_FLIGHT``) refused the request
    before working on it: retry after ``Retry-After`` (503, nothing changed)."""

    code = "overloaded"


class ConfigError(SignoffError):
    code = "config"


class ModelUnavailable(Unavailable):
    """The model's API did not answer (unreachable, timed out, overloaded, 5xx): the turn
    is tried again with backoff, and the chat is told the model cannot be reached."""

    code = "model_unavailable"


class ModelRefused(SignoffError):
    """The model's API refused a request for a reason waiting does not change: a wrong or
    revoked API key (401), no access (403), a model name that does not exist (404), a
    request it will not take (400, 413, 422). The run fails with this error, which the
    chat shows, instead of being tried again for ever behind "working…"."""

    code = "model_refused"


class AppLoadError(ConfigError):
    """``--app`` / ``SIGNOFF_APP`` names no usable application (module not found,
    attribute missing, not an App)."""

    code = "app_load"


class AppMismatch(ConfigError):
    """A live gateway or worker on this database serves the same app with other tools (or
    other versions of them): this process refuses to start (``SIGNOFF_ALLOW_APP_SKEW``)."""

    code = "app_mismatch"


class UnknownTool(SignoffError):
    """A card's tool is not one this process serves (a version skew between processes, or
    a tool removed): it refuses to decide (409) or run it, and changes nothing."""

    code = "unknown_tool"

    def __init__(self, message: str, *, tool: str, **detail: Any) -> None:
        self.tool = tool
        super().__init__(message, tool=tool, **detail)

    @classmethod
    def approved(cls, card_id: str, tool: str, run_id: str, worker_id: str) -> UnknownTool:
        """An approved card this worker cannot run (it is handed over, not run)."""
        return cls(
            f"card {card_id} was approved for the tool {tool!r}, which worker "
            f"{worker_id} does not serve",
            tool=tool,
            card_id=card_id,
            run_id=run_id,
        )


def error_text(exc: BaseException) -> str:
    """What a client is told when a run fails on an error: a typed error's own message,
    only the kind of anything else (the log has the traceback)."""
    if isinstance(exc, SignoffError):
        return f"{exc.code}: {exc.public}"
    return f"internal error ({type(exc).__name__})"
