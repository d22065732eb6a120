"""Settings: one frozen struct, built once from ``SIGNOFF_*`` env vars and flags.

Library code receives a :class:`Settings`; only :func:`from_env` reads the
environment.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from signoff.runtime import levers
from signoff.runtime.errors import ConfigError

# Intervals, lifetimes and sizes that only make sense above zero: 0 would be a poll or a
# sweep in a tight loop, a token born expired, a pool of no connections. Checked where
# settings come in (from_env), the error naming the variable.
Positive = Annotated[float, msgspec.Meta(gt=0)]
PositiveInt = Annotated[int, msgspec.Meta(gt=0)]
# Limits and waits where 0 means "none" or "at once", never below (a limit of -1 refused
# every request with a 503; a drain of -5 s was taken).
NonNegative = Annotated[float, msgspec.Meta(ge=0)]
NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
Port = Annotated[int, msgspec.Meta(ge=0, le=65535)]  # 99999 wrapped round to 34463


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    # The application served, as module:attribute (an App or a zero-argument factory of one).
    # `signoff gateway` and `signoff worker` refuse to start without one; `signoff dev`
    # serves the built-in demo (signoff.demo:app) and says so.
    app: str = ""
    # Start even when a live process on the database serves another version of the app
    # (a rolling deploy): the mismatch is logged as a warning instead (runtime/presence.py).
    allow_app_skew: bool = False
    database_url: str | None = None  # None: `signoff dev` starts an embedded Postgres
    redis_url: str | None = None  # None: the in-process bus (single process only)
    host: str = "127.0.0.1"
    port: Port = 8000
    data_dir: str = ".signoff"
    secret: str = ""  # token signing key; `signoff dev` makes and keeps one in data_dir
    token_ttl_seconds: PositiveInt = 12 * 3600
    allowed_origins: tuple[str, ...] = ()
    anthropic_api_key: str | None = None
    anthropic_base_url: str | None = None
    model: str = "claude-sonnet-4-5"
    offline_model: bool = False
    worker_id: str = ""
    lease_seconds: Positive = 10.0
    poll_seconds: Positive = 5.0
    sweep_seconds: Positive = 2.0
    stuck_after_seconds: Positive = 300.0
    # A tool's revalidate or execute that takes longer is given up (runtime/execution.py).
    tool_timeout_seconds: Positive = 30.0
    # An approved card not started after this long is looked at by the sweeper.
    approved_stale_seconds: Positive = 5.0
    wait_grace_ms: NonNegativeInt = 30_000
    key_prefix: str = "so:"
    tenant: str = "demo"
    max_ws_message_bytes: PositiveInt = 64 * 1024
    pool_size: PositiveInt = 10
    # Continuations (an approved card's revalidate → execute → the model's next reply) one
    # worker works on at once, in this process and the store; one waiting on the model or
    # a provider past 0.1 s lets its slot go meanwhile (runtime/slots.py, design note 56).
    steps_in_flight: PositiveInt = 10
    # First turns (users' messages) one worker runs at once, their model calls included:
    # past it the worker reads nothing from the inbox, and other workers take the rest
    # (runtime/intake.py, design note 58).
    turns_in_flight: PositiveInt = 256
    # Connect / pool wait / statement timeout: a stalled Postgres answers 503, never hangs.
    db_timeout_seconds: Positive = 5.0
    # asyncpg's prepared-statement cache per connection; 0 behind PgBouncer < 1.21 in
    # transaction pooling mode (design note 32).
    db_statement_cache_size: NonNegativeInt = 100
    ws_frames_per_second: NonNegative = 20.0  # per WebSocket; 0: no limit
    ws_burst: PositiveInt = 40  # frames a socket may send at once before it is rate limited
    claim_idle_ms: PositiveInt = (
        30_000  # inbox entries of a dead consumer idle this long are reclaimed
    )
    # Inbox streams (0: one on a Redis server, 8 on a Redis Cluster; design note 31).
    inbox_partitions: NonNegativeInt = 0
    faults: tuple[str, ...] = ()  # armed fault points (tests only), see runtime/faults.py
    # /metrics (prometheus-client) on a port of its own, never the public one (0: off);
    # bound on metrics_host (default: host). runtime/metrics_server.py, design note 27.
    metrics_port: Port = 0
    metrics_host: str = ""
    # Logs (runtime/logs.py): json (gateway, worker) or human (dev); "" picks by command.
    log_format: str = ""
    log_level: str = "info"
    # OpenTelemetry traces (runtime/telemetry.py): on with SIGNOFF_OTEL=1 or when
    # OTEL_EXPORTER_OTLP_ENDPOINT is set; needs the `otel` extra.
    otel: bool = False
    # A gateway told to stop (SIGTERM) fails /readyz for this long before it stops
    # accepting, so a load balancer sends new clients elsewhere first (gateway/drain.py).
    drain_seconds: NonNegative = 2.0
    # Back-pressure: API requests and WebSocket message/resolve frames one gateway works
    # on at once; past it a typed 503 `overloaded` with Retry-After (0: no limit).
    max_in_flight: NonNegativeInt = 200
    adopt_batch: PositiveInt = 1000  # lapsed runs one worker adopts per lease tick
    event_loop: str = "auto"  # auto (uvloop if installed) | uvloop | asyncio; runtime/loops.py
    # uvicorn's WebSocket implementation: websockets-sansio (the websockets library's
    # protocol, C-accelerated framing) | wsproto (pure Python); bench/README.md, levers
    ws_protocol: Literal["websockets-sansio", "websockets", "wsproto"] = "websockets-sansio"
    # Per-user quotas (per tenant + user; 0: no limit), gateway/quotas.py. Refusals are
    # typed 429s (`rate_limited`, Retry-After) that change nothing.
    quota_threads_per_minute: NonNegativeInt = 30  # threads created in any 60 s
    quota_turns_in_flight: NonNegativeInt = 16  # accepted, unstarted messages + runs `running`
    quota_queued_seconds: NonNegative = (
        120.0  # an accepted message no worker started counts this long
    )
    quota_sockets: NonNegativeInt = 64  # open WebSockets per user, per gateway process
    quota_workflow_runs_per_minute: NonNegativeInt = 30  # workflow runs started in any 60 s
    workflow_events_kept: NonNegativeInt = 100  # events a workflow run keeps for later gates
    # Slow clients (gateway/timeouts.py; 0: no limit): a request's headers must arrive within
    # header_timeout_seconds of its first byte (of the connection, for its first request),
    # its body within body_timeout_seconds of the headers (408, or the connection is cut).
    header_timeout_seconds: NonNegative = 10.0
    body_timeout_seconds: NonNegative = 15.0
    # The WhatsApp Cloud API channel (gateway/channels/whatsapp): off unless the phone
    # number id, token, app secret and verify token are all set.
    whatsapp_phone_number_id: str = ""
    whatsapp_token: str = ""
    whatsapp_app_secret: str = ""
    whatsapp_verify_token: str = ""
    whatsapp_api_version: str = "v21.0"
    whatsapp_base_url: str = "https://graph.facebook.com"  # a fake Graph API in tests
    # Text confirmation ("sim", "ok", ...): off by default; the highest risk it approves.
    whatsapp_text_confirm: bool = False
    whatsapp_text_confirm_max_risk: str = "reversible"
    # A "sim" about to approve waits this long for a text the person wrote before it and
    # Meta delivers after it (Meta does not promise order), then looks again.
    whatsapp_text_confirm_settle_seconds: Annotated[float, msgspec.Meta(ge=0, le=10)] = 2.0
    # Outside the 24-hour window, cards and notices go as this approved template.
    whatsapp_template_name: str = "signoff_notice"
    whatsapp_template_language: str = "pt_BR"
    whatsapp_window_seconds: Positive = 24 * 3600.0
    whatsapp_poll_seconds: Positive = 0.3  # how often a gateway looks for entries to send
    whatsapp_send_attempts: PositiveInt = 4  # per message, with backoff on 5xx/429/network errors
    # A claim never marked sent/failed after this long is taken over by a live gateway
    # (its claimer died between claim and send; a rare duplicate, design note 24).
    whatsapp_claim_lease_seconds: Positive = 30.0
    # An inbound message being handled is claimed this long (design note 64): a redelivery
    # meanwhile is answered 503; one after a claim that lapsed unhandled (its gateway died)
    # handles the message.
    whatsapp_delivery_lease_seconds: Positive = 30.0
    # Redis client pool (runtime/bus/client.py): at most this many pooled connections per
    # process (the pub/sub and pipelined connections are one more each); a call beyond it
    # waits up to redis_pool_timeout_seconds for a free one, then fails as Unavailable.
    redis_max_connections: PositiveInt = 32
    redis_pool_timeout_seconds: Positive = 5.0
    # Retention (runtime/retention.py, `signoff prune`, design note 28): threads whose last
    # activity is older than this many days (fractions allowed) are deleted with their
    # messages, runs and cards; 0 keeps everything. retention_tenants overrides it per
    # tenant ("acme=30,demo=0.5"; 0 keeps that tenant's threads). The audit of executed
    # cards is exported to JSONL files in retention_archive_dir (default <data_dir>/audit)
    # before they are deleted. Workers prune every retention_interval_seconds, one at a time.
    retention_days: NonNegative = 0.0
    retention_tenants: tuple[str, ...] = ()
    retention_archive_dir: str = ""
    retention_interval_seconds: Positive = 3600.0
    retention_batch: PositiveInt = 200

    @property
    def whatsapp_enabled(self) -> bool:
        return bool(
            self.whatsapp_phone_number_id
            and self.whatsapp_token
            and self.whatsapp_app_secret
            and self.whatsapp_verify_token
        )

    def with_(self, **changes: Any) -> Settings:
        return msgspec.structs.replace(self, **changes)


_ENV: dict[str, str] = {
    "app": "SIGNOFF_APP",
    "allow_app_skew": "SIGNOFF_ALLOW_APP_SKEW",
    "database_url": "SIGNOFF_DATABASE_URL",
    "redis_url": "SIGNOFF_REDIS_URL",
    "host": "SIGNOFF_HOST",
    "port": "SIGNOFF_PORT",
    "data_dir": "SIGNOFF_DATA_DIR",
    "secret": "SIGNOFF_SECRET",
    "token_ttl_seconds": "SIGNOFF_TOKEN_TTL_SECONDS",
    "allowed_origins": "SIGNOFF_ALLOWED_ORIGINS",
    "anthropic_api_key": "ANTHROPIC_API_KEY",
    "anthropic_base_url": "SIGNOFF_ANTHROPIC_BASE_URL",
    "model": "SIGNOFF_MODEL",
    "offline_model": "SIGNOFF_OFFLINE_MODEL",
    "worker_id": "SIGNOFF_WORKER_ID",
    "lease_seconds": "SIGNOFF_LEASE_SECONDS",
    "poll_seconds": "SIGNOFF_POLL_SECONDS",
    "sweep_seconds": "SIGNOFF_SWEEP_SECONDS",
    "stuck_after_seconds": "SIGNOFF_STUCK_AFTER_SECONDS",
    "tool_timeout_seconds": "SIGNOFF_TOOL_TIMEOUT_SECONDS",
    "approved_stale_seconds": "SIGNOFF_APPROVED_STALE_SECONDS",
    "wait_grace_ms": "SIGNOFF_WAIT_GRACE_MS",
    "key_prefix": "SIGNOFF_KEY_PREFIX",
    "tenant": "SIGNOFF_TENANT",
    "max_ws_message_bytes": "SIGNOFF_MAX_WS_MESSAGE_BYTES",
    "pool_size": "SIGNOFF_POOL_SIZE",
    "steps_in_flight": "SIGNOFF_STEPS_IN_FLIGHT",
    "turns_in_flight": "SIGNOFF_TURNS_IN_FLIGHT",
    "db_timeout_seconds": "SIGNOFF_DB_TIMEOUT_SECONDS",
    "db_statement_cache_size": "SIGNOFF_DB_STATEMENT_CACHE_SIZE",
    "ws_frames_per_second": "SIGNOFF_WS_FRAMES_PER_SECOND",
    "ws_burst": "SIGNOFF_WS_BURST",
    "claim_idle_ms": "SIGNOFF_CLAIM_IDLE_MS",
    "inbox_partitions": "SIGNOFF_INBOX_PARTITIONS",
    "faults": "SIGNOFF_FAULTS",
    "metrics_port": "SIGNOFF_METRICS_PORT",
    "metrics_host": "SIGNOFF_METRICS_HOST",
    "log_format": "SIGNOFF_LOG_FORMAT",
    "log_level": "SIGNOFF_LOG_LEVEL",
    "otel": "SIGNOFF_OTEL",
    "drain_seconds": "SIGNOFF_DRAIN_SECONDS",
    "max_in_flight": "SIGNOFF_MAX_IN_FLIGHT",
    "adopt_batch": "SIGNOFF_ADOPT_BATCH",
    "event_loop": "SIGNOFF_EVENT_LOOP",
    "ws_protocol": "SIGNOFF_WS_PROTOCOL",
    "quota_threads_per_minute": "SIGNOFF_QUOTA_THREADS_PER_MINUTE",
    "quota_turns_in_flight": "SIGNOFF_QUOTA_TURNS_IN_FLIGHT",
    "quota_queued_seconds": "SIGNOFF_QUOTA_QUEUED_SECONDS",
    "quota_sockets": "SIGNOFF_QUOTA_SOCKETS",
    "quota_workflow_runs_per_minute": "SIGNOFF_QUOTA_WORKFLOW_RUNS_PER_MINUTE",
    "workflow_events_kept": "SIGNOFF_WORKFLOW_EVENTS_KEPT",
    "header_timeout_seconds": "SIGNOFF_HEADER_TIMEOUT_SECONDS",
    "body_timeout_seconds": "SIGNOFF_BODY_TIMEOUT_SECONDS",
    "whatsapp_phone_number_id": "SIGNOFF_WHATSAPP_PHONE_NUMBER_ID",
    "whatsapp_token": "SIGNOFF_WHATSAPP_TOKEN",
    "whatsapp_app_secret": "SIGNOFF_WHATSAPP_APP_SECRET",
    "whatsapp_verify_token": "SIGNOFF_WHATSAPP_VERIFY_TOKEN",
    "whatsapp_api_version": "SIGNOFF_WHATSAPP_API_VERSION",
    "whatsapp_base_url": "SIGNOFF_WHATSAPP_BASE_URL",
    "whatsapp_text_confirm": "SIGNOFF_WHATSAPP_TEXT_CONFIRM",
    "whatsapp_text_confirm_max_risk": "SIGNOFF_WHATSAPP_TEXT_CONFIRM_MAX_RISK",
    "whatsapp_text_confirm_settle_seconds": "SIGNOFF_WHATSAPP_TEXT_CONFIRM_SETTLE_SECONDS",
    "whatsapp_template_name": "SIGNOFF_WHATSAPP_TEMPLATE_NAME",
    "whatsapp_template_language": "SIGNOFF_WHATSAPP_TEMPLATE_LANGUAGE",
    "whatsapp_window_seconds": "SIGNOFF_WHATSAPP_WINDOW_SECONDS",
    "whatsapp_poll_seconds": "SIGNOFF_WHATSAPP_POLL_SECONDS",
    "whatsapp_send_attempts": "SIGNOFF_WHATSAPP_SEND_ATTEMPTS",
    "whatsapp_claim_lease_seconds": "SIGNOFF_WHATSAPP_CLAIM_LEASE_SECONDS",
    "whatsapp_delivery_lease_seconds": "SIGNOFF_WHATSAPP_DELIVERY_LEASE_SECONDS",
    "redis_max_connections": "SIGNOFF_REDIS_MAX_CONNECTIONS",
    "redis_pool_timeout_seconds": "SIGNOFF_REDIS_POOL_TIMEOUT_SECONDS",
    "retention_days": "SIGNOFF_RETENTION_DAYS",
    "retention_tenants": "SIGNOFF_RETENTION_TENANTS",
    "retention_archive_dir": "SIGNOFF_RETENTION_ARCHIVE_DIR",
    "retention_interval_seconds": "SIGNOFF_RETENTION_INTERVAL_SECONDS",
    "retention_batch": "SIGNOFF_RETENTION_BATCH",
}


_BOOLS = frozenset({"offline_model", "allow_app_skew", "whatsapp_text_confirm", "otel"})


_PG_SCHEMES = ("postgresql", "postgres")
_REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")


def _check_url(var: str, url: str | None, schemes: tuple[str, ...]) -> None:
    """A URL of another kind (``mysql://``, ``http://``) is refused here, naming the
    variable, rather than by a driver's traceback at the first connection."""
    if url is None:
        return
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme not in schemes:
        raise ConfigError(
            f"bad setting: {var} must be a {' or '.join(s + '://' for s in schemes)} URL, "
            f"not {scheme + '://' if scheme else repr(url.split('@')[-1])}"
        )


def _boolean(var: str, text: str) -> bool:
    """1/true/yes/on or 0/false/no/off; anything else is refused ("maybe" was false)."""
    word = text.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"bad setting: {var}={text!r}: expected 1/true/yes/on or 0/false/no/off")


def env_names() -> dict[str, str]:
    """Setting name -> environment variable (for --help and the README)."""
    return dict(_ENV)


_KINDS = {"int": "a whole number", "float": "a number", "str": "a text", "bool": "1 or 0"}


def _said(error: str, raw: Mapping[str, Any]) -> str:
    """msgspec's refusal as the operator set it: the variable, the value given, what it
    must be (``SIGNOFF_TURNS_IN_FLIGHT='abc': expected a whole number``)."""
    field = re.search(r"`\$\.(\w+)`", error)
    if field is None:
        return error
    name = field.group(1)
    var = _ENV.get(name, name)
    what = error.split(" - at ", 1)[0]
    what = re.sub(r", got `str`$", "", what)
    what = re.sub(r"`(\w+)`", lambda m: _KINDS.get(m.group(1), m.group(1)), what)
    given = raw.get(name)
    if isinstance(given, str):
        shown = repr(given) if len(given) <= 60 else repr(given[:57] + "...")
        return f"{var}={shown}: {what[:1].lower()}{what[1:]}"
    return f"{var}: {what[:1].lower()}{what[1:]}"


def from_env(env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Build settings from the environment, then apply explicit overrides (CLI flags)."""
    source = os.environ if env is None else env
    raw: dict[str, Any] = {}
    for name, var in _ENV.items():
        if var in source and source[var] != "":
            value: Any = source[var]
            if name in ("allowed_origins", "faults", "retention_tenants"):
                value = tuple(o.strip() for o in value.split(",") if o.strip())
            elif name in _BOOLS:
                value = _boolean(var, value)
            raw[name] = value
    if source.get("OTEL_EXPORTER_OTLP_ENDPOINT") and "otel" not in raw:
        raw["otel"] = True  # the standard OpenTelemetry variable turns tracing on too
    raw.update({k: v for k, v in overrides.items() if v is not None})
    try:
        settings = msgspec.convert(raw, Settings, strict=False)
    except msgspec.ValidationError as exc:
        # msgspec names the field (`$.poll_seconds`); the operator set a variable.
        raise ConfigError(f"bad setting: {_said(str(exc), raw)}") from exc
    _check_url("SIGNOFF_DATABASE_URL", settings.database_url, _PG_SCHEMES)
    _check_url("SIGNOFF_REDIS_URL", settings.redis_url, _REDIS_SCHEMES)
    if not settings.worker_id:
        settings = settings.with_(worker_id=f"w-{os.getpid()}-{secrets.token_hex(3)}")
    levers.disabled(source)  # a misspelt SIGNOFF_DISABLE is refused at start-up
    return settings


def data_path(settings: Settings) -> Path:
    return Path(settings.data_dir).resolve()
