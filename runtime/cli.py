"""The ``signoff`` command line. Every flag also has a ``SIGNOFF_*`` variable (``--help``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import logging
import os
import signal
import sys
import time
import tomllib
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

from signoff.runtime import (
    banner,
    cli_cards,
    cli_clean,
    cli_ops,
    cli_prune,
    cli_runs,
    cli_token,
    loops,
    prefix_owner,
)
from signoff.runtime import config as cfg
from signoff.runtime.app import App, load_app
from signoff.runtime.dev import DEMO_APP
from signoff.runtime.drain import RECORD_MARGIN_SECONDS
from signoff.runtime.errors import ConfigError, SignoffError


def _env_help() -> str:
    """Each variable with its default (README.md's configuration table says what each
    does); the fault-injection one is for tests only."""
    defaults = cfg.Settings()
    lines = []
    for name, var in cfg.env_names().items():
        if name == "faults":
            continue
        value = getattr(defaults, name)
        shown = "(unset)" if value in (None, "", ()) else str(value)
        lines.append(f"  {var:<40} {shown}")
    return "\n".join(lines)


ENV_HELP = _env_help()
DEMO_HELP = (
    "also read: SIGNOFF_PG_USER (the account the embedded Postgres runs as when signoff "
    "runs as root), SIGNOFF_DISABLE (speed levers off, for bench A/B runs); the built-in "
    "demo (--app signoff.demo:app) reads SIGNOFF_DEMO_CARD_TTL_SECONDS (every card's "
    "lifetime, e.g. 20 to watch one expire). What each variable does: README.md, "
    "Configuration."
)
MAKE_SECRET = 'python -c "import secrets; print(secrets.token_urlsafe(32))"'

log = logging.getLogger("signoff.worker")  # what `signoff worker` says about its own stop


def version() -> str:
    """The installed package's version, else the one pyproject.toml declares (a source
    checkout run without installing it)."""
    try:
        return importlib.metadata.version("signoff")
    except importlib.metadata.PackageNotFoundError:
        pass
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    try:
        with pyproject.open("rb") as file:
            return str(tomllib.load(file)["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"


class NoApp(ConfigError):
    """``gateway``/``worker``/``check-policy`` without ``--app``: production never serves
    the demo by accident."""

    code = "no_app"


def _app(settings: cfg.Settings, command: str) -> App:
    """The app the command serves: ``--app``/``SIGNOFF_APP``; ``dev`` alone falls back to
    the demo (and says so)."""
    if settings.app:
        return load_app(settings.app)
    if command == "dev":
        print(
            f"signoff dev: no --app given: serving the built-in demo ({DEMO_APP}); "
            "serve yours with --app module:attribute",
            flush=True,
        )
        return load_app(DEMO_APP)
    raise NoApp(
        f"{command}: no app to serve: pass --app module:attribute (or set SIGNOFF_APP), "
        f"e.g. --app myproject.agent:app; the built-in demo is --app {DEMO_APP}"
    )


def _settings(args: argparse.Namespace) -> cfg.Settings:
    overrides: dict[str, Any] = {}
    for name in (
        "host",
        "port",
        "database_url",
        "redis_url",
        "worker_id",
        "data_dir",
        "app",
        "metrics_port",
        "log_level",
        "log_format",
    ):
        value = getattr(args, name, None)
        if value is not None:
            overrides[name] = value
    if getattr(args, "offline", False):
        overrides["offline_model"] = True
    if getattr(args, "allow_app_skew", False):
        overrides["allow_app_skew"] = True
    return cfg.from_env(**overrides)


async def _dev(args: argparse.Namespace) -> int:
    from signoff.embedded import redacted
    from signoff.gateway.auth import Tokens
    from signoff.gateway.drain import check_port
    from signoff.runtime.dev import dev_settings
    from signoff.runtime.node import running, serve_gateway, start_metrics

    t0 = time.monotonic()
    settings = _settings(args)
    app = _app(settings, "dev")
    check_port(settings.host, settings.port)  # before the embedded servers start
    settings, closers = dev_settings(settings, app.name)
    tokens = Tokens(settings.secret, settings.token_ttl_seconds)
    try:
        async with running(settings, app) as node:
            token = tokens.issue("demo", settings.tenant)
            started = asyncio.Event()
            metrics = await start_metrics(node)
            serve = asyncio.create_task(
                serve_gateway(node, tokens, settings.host, settings.port, started, metrics)
            )
            await asyncio.wait(
                [serve, asyncio.create_task(started.wait())], return_when=asyncio.FIRST_COMPLETED
            )
            if serve.done():
                await serve
                return 1
            model = node.model.name if node.model else "-"
            url = f"http://{settings.host}:{settings.port}"
            assert settings.database_url is not None
            record = cli_ops.DevRecord(
                pid=os.getpid(),
                database_url=settings.database_url,
                redis_url=settings.redis_url,
                url=url,
            )
            cli_ops.write_record(settings, record)  # operator commands find us here
            redis = redacted(settings.redis_url) if settings.redis_url else None
            print(
                f"signoff dev ready in {time.monotonic() - t0:.2f}s\n"
                f"  chat:     {url}/#token={token}\n"
                f"  api:      {url}/v1   (Authorization: Bearer <token>)\n"
                f"  token:    {token}\n"
                f"  app:      {app.name} ({settings.app or 'the built-in demo, ' + DEMO_APP})\n"
                f"  model:    {model}\n"
                f"  database: {redacted(settings.database_url or '')}\n"
                f"  bus:      {'redis ' + redis if redis else 'in-process'}\n"
                f"  metrics:  {banner.metrics_where(settings, metrics)}\n"
                f"  next:     open the chat link{banner.try_saying(app)}; Ctrl-C stops; "
                f"`signoff clean{banner.data_dir_flag(settings)}` removes the data folder",
                flush=True,
            )
            await serve
            if metrics is not None:
                await metrics.close()
    finally:
        cli_ops.remove_record(settings)
        for closer in closers:
            closer.stop()
    return 0


def _bus_where(settings: cfg.Settings) -> str:
    from signoff.embedded import redacted

    if not settings.redis_url:
        return "in-process"
    return f"redis {redacted(settings.redis_url)} (key prefix {settings.key_prefix!r})"


async def _gateway(args: argparse.Namespace) -> int:
    from signoff.gateway.auth import Tokens
    from signoff.runtime.node import running, serve_gateway, start_metrics

    settings = _settings(args)
    app = _app(settings, "gateway")
    if not settings.secret:
        # Said apart from the length check (Tokens): "at least 32 characters" reads as if
        # one had been given.
        raise cli_ops.NoSecret(
            f"no secret: SIGNOFF_SECRET is required (the key tokens are signed with, the same "
            f"on every gateway, at least 32 characters); make one with: {MAKE_SECRET}"
        )
    tokens = Tokens(settings.secret, settings.token_ttl_seconds)
    async with running(settings, app, worker=False) as node:
        metrics = await start_metrics(node)
        started = asyncio.Event()
        serve = asyncio.create_task(
            serve_gateway(node, tokens, settings.host, settings.port, started, metrics)
        )
        await asyncio.wait(
            [serve, asyncio.create_task(started.wait())], return_when=asyncio.FIRST_COMPLETED
        )
        if not serve.done():
            print(
                f"signoff gateway listening on http://{settings.host}:{settings.port} "
                f"(WebSocket /v1/ws, API /v1, probes /healthz /readyz); "
                f"metrics: {banner.metrics_where(settings, metrics)}; app {app.name}; "
                f"bus {_bus_where(settings)}",
                flush=True,
            )
        await serve
        if metrics is not None:
            await metrics.close()
    logging.getLogger("signoff.gateway").info("stopped")
    return 0


async def _worker(args: argparse.Namespace) -> int:
    from signoff.runtime.node import running, start_metrics

    settings = _settings(args)
    app = _app(settings, "worker")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    parked = 0
    async with running(settings, app, gateway=False) as node:
        metrics = await start_metrics(node)
        model = node.model.name if node.model else "-"
        print(
            f"signoff worker {settings.worker_id} running app {app.name} "
            f"({settings.app}); model {model}; bus {_bus_where(settings)}; "
            f"metrics: {banner.metrics_where(settings, metrics)}",
            flush=True,
        )
        claim = getattr(node, "claim", None)
        lost = claim.lost if claim is not None else asyncio.Event()
        await _first(stop.wait(), lost.wait())
        if claim is not None and lost.is_set():  # the prefix is another's: exit non-zero
            raise prefix_owner.PrefixLost(claim.why)
        # Counted before the stop: Worker.stop drops them from memory as it releases them.
        parked = len(node.worker.waits.parked_runs()) if node.worker is not None else 0
        log.info(  # a SIGTERM is the normal way out (a deploy, a scale-down)
            "stopping: taking no new work; its runs with nothing in flight (%d parked) are "
            "released now (another worker, or this one started again, takes them over); "
            "steps in flight get up to 10 s, a provider call up to its deadline and 5 s "
            "(%g s), then their runs are released too",
            parked,
            settings.tool_timeout_seconds + RECORD_MARGIN_SECONDS,
        )
        if metrics is not None:
            await metrics.close()
    log.info(
        "stopped: released its runs (%d were parked); any live worker of this database "
        "takes them over",
        parked,
    )
    return 0


async def _first(*waits: Coroutine[Any, Any, Any]) -> None:
    """Until the first of ``waits`` ends (the others cancelled)."""
    tasks = [asyncio.create_task(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


async def _migrate(args: argparse.Namespace) -> int:
    from signoff.store.postgres import PostgresStore

    settings = cli_ops.operator_settings(_settings(args))
    url = settings.database_url
    assert url is not None
    store = await PostgresStore.connect(url, statement_cache_size=settings.db_statement_cache_size)
    try:
        applied = await store.migrate()
    finally:
        await store.close()
    print("applied: " + (", ".join(applied) if applied else "nothing (up to date)"))
    return 0


async def _cards(args: argparse.Namespace) -> int:
    return await cli_cards.run(args, _settings(args))


async def _prune(args: argparse.Namespace) -> int:
    return await cli_prune.run(args, _settings(args))


async def _runs(args: argparse.Namespace) -> int:
    return await cli_runs.main(args, _settings(args))


def _check_policy(args: argparse.Namespace) -> int:
    app = _app(_settings(args), "check-policy")
    missing = app.policy.unruled_writes(app.tools)
    if missing:
        print("write tools without an explicit policy rule (they default to ASK):")
        for name in missing:
            print(f"  {name}")
        return 1
    print("every write tool has an explicit policy rule")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="signoff",
        description="Human-in-the-loop runtime for AI agents.",
        epilog="environment variables (and their defaults):\n" + ENV_HELP + "\n\n" + DEMO_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"signoff {version()}")
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--database-url", help="Postgres URL (SIGNOFF_DATABASE_URL)")
        sp.add_argument("--redis-url", help="Redis URL (SIGNOFF_REDIS_URL)")
        sp.add_argument("--data-dir", help="local data folder (SIGNOFF_DATA_DIR, .signoff)")

    def app_flags(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--app",
            help="the app to serve, module:attribute (an App or a zero-argument factory "
            "returning one; the current directory is on the import path) (SIGNOFF_APP)",
        )

    def observe_flags(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--metrics-port",
            type=int,
            help="serve Prometheus /metrics on this port, apart from the public one "
            "(SIGNOFF_METRICS_PORT; 0 or unset: off)",
        )
        sp.add_argument(
            "--log-level",
            choices=["debug", "info", "warning", "error"],
            help="SIGNOFF_LOG_LEVEL (info)",
        )
        sp.add_argument(
            "--log-format",
            choices=["json", "human"],
            help="one JSON object per line, or human text (SIGNOFF_LOG_FORMAT; json for "
            "gateway and worker, human for dev)",
        )

    def skew_flag(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--allow-app-skew",
            action="store_true",
            help="start beside live processes serving another version of the app, with a "
            "warning (rolling deploys) (SIGNOFF_ALLOW_APP_SKEW)",
        )

    dev = sub.add_parser(
        "dev",
        help="gateway + worker + your app (--app; default: the demo) in one process, "
        "embedded servers",
    )
    common(dev)
    app_flags(dev)
    observe_flags(dev)
    skew_flag(dev)
    dev.add_argument("--host", help="bind address (SIGNOFF_HOST, 127.0.0.1)")
    dev.add_argument("--port", type=int, help="port (SIGNOFF_PORT, 8000)")
    dev.add_argument("--offline", action="store_true", help="use the offline demo model")
    gw = sub.add_parser(
        "gateway", help="serve WebSocket and HTTP for --app (needs Postgres and Redis)"
    )
    common(gw)
    app_flags(gw)
    observe_flags(gw)
    skew_flag(gw)
    gw.add_argument("--host", help="bind address (SIGNOFF_HOST, 127.0.0.1)")
    gw.add_argument("--port", type=int, help="port (SIGNOFF_PORT, 8000)")
    wk = sub.add_parser("worker", help="run agent turns of --app (needs Postgres and Redis)")
    common(wk)
    app_flags(wk)
    observe_flags(wk)
    skew_flag(wk)
    wk.add_argument("--worker-id", help="stable worker id (SIGNOFF_WORKER_ID)")
    wk.add_argument(
        "--offline",
        action="store_true",
        help="use the app's offline model, not Claude (SIGNOFF_OFFLINE_MODEL)",
    )
    mg = sub.add_parser("migrate", help="apply SQL migrations")
    common(mg)
    cli_token.add_parser(sub)
    cli_runs.add_parser(sub, common)  # signoff runs list|show
    cli_cards.add_parser(sub, common)
    cli_prune.add_parser(sub, common)
    cli_clean.add_parser(sub)
    cp = sub.add_parser(
        "check-policy", help="list the write tools of --app without an explicit policy rule"
    )
    common(cp)
    app_flags(cp)
    return p


def _observe(args: argparse.Namespace) -> None:
    """Logs (JSON for gateway/worker, human for dev and the operator commands), and
    traces when configured, before anything else runs."""
    from signoff.runtime import logs, telemetry

    settings = _settings(args)
    serving = args.command in ("gateway", "worker")
    fmt = settings.log_format or ("json" if serving else "human")
    level = settings.log_level if serving or args.command == "dev" else "warning"
    static = {"role": args.command}
    if args.command == "worker":
        static["worker_id"] = args.worker_id = settings.worker_id  # the same id from now on
    logs.setup(fmt, level, **static)
    if args.command in ("gateway", "worker", "dev"):
        telemetry.setup(settings.otel, f"signoff-{args.command}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        _observe(args)
        if args.command == "token":
            return cli_token.run(args, _settings(args))
        if args.command == "check-policy":
            return _check_policy(args)
        if args.command == "clean":
            return cli_clean.run(_settings(args), args.yes)
        runner = {
            "dev": _dev,
            "gateway": _gateway,
            "worker": _worker,
            "migrate": _migrate,
            "cards": _cards,
            "runs": _runs,
            "prune": _prune,
        }[args.command]
        with contextlib.suppress(KeyboardInterrupt):
            chosen = _settings(args)  # flags over the environment, as the command sees them
            return loops.run(runner(args), chosen.event_loop, chosen.redis_url)
        return 130
    except NoApp as exc:
        print(f"signoff {exc.message}", file=sys.stderr)
        return 2
    except (cli_ops.NoDatabase, cli_ops.NoSecret) as exc:  # nothing to work on: say where
        print(f"signoff {args.command}: {exc.message}", file=sys.stderr)
        return 2
    except SignoffError as exc:
        print(f"signoff: {exc.message}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # Output piped into a reader that stopped early (`signoff runs show ID | head`):
        # nothing more to say, no traceback. stdout is pointed at /dev/null so the
        # interpreter's own flush at exit does not fail the same way.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports a reader that went away


if __name__ == "__main__":
    sys.exit(main())
