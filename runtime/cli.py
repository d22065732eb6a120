"""The ``signoff`` command line. Every flag also has a ``SIGNOFF_*`` variable (``--help``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

from signoff.runtime import config as cfg
from signoff.runtime import loops
from signoff.runtime.app import App, load_app
from signoff.runtime.errors import ConfigError, SignoffError

ENV_HELP = "\n".join(f"  {var:<30} {name}" for name, var in cfg.env_names().items())
DEMO_APP = "signoff.demo:app"
DEMO_HELP = (
    "the built-in demo (--app signoff.demo:app) also reads SIGNOFF_DEMO_CARD_TTL_SECONDS "
    "(every card's lifetime, e.g. 20 to watch one expire)"
)


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
    for name in ("host", "port", "database_url", "redis_url", "worker_id", "data_dir", "app"):
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
    from signoff.runtime.node import dev_secret, embedded_urls, running, serve_gateway

    t0 = time.monotonic()
    settings = _settings(args)
    app = _app(settings, "dev")
    settings, closers = embedded_urls(settings)
    settings = settings.with_(secret=dev_secret(settings))
    tokens = Tokens(settings.secret, settings.token_ttl_seconds)
    try:
        async with running(settings, app) as node:
            token = tokens.issue("demo", settings.tenant)
            started = asyncio.Event()
            serve = asyncio.create_task(
                serve_gateway(node, tokens, settings.host, settings.port, started)
            )
            await asyncio.wait(
                [serve, asyncio.create_task(started.wait())], return_when=asyncio.FIRST_COMPLETED
            )
            if serve.done():
                await serve
                return 1
            model = node.model.name if node.model else "-"
            url = f"http://{settings.host}:{settings.port}"
            redis = redacted(settings.redis_url) if settings.redis_url else None
            print(
                f"signoff dev ready in {time.monotonic() - t0:.2f}s\n"
                f"  chat:     {url}/#token={token}\n"
                f"  api:      {url}/v1   (Authorization: Bearer <token>)\n"
                f"  token:    {token}\n"
                f"  app:      {app.name} ({settings.app or 'the built-in demo, ' + DEMO_APP})\n"
                f"  model:    {model}\n"
                f"  database: {redacted(settings.database_url or '')}\n"
                f"  bus:      {'redis ' + redis if redis else 'in-process'}",
                flush=True,
            )
            await serve
    finally:
        for closer in closers:
            closer.stop()
    return 0


async def _gateway(args: argparse.Namespace) -> int:
    from signoff.gateway.auth import Tokens
    from signoff.runtime.node import running, serve_gateway

    settings = _settings(args)
    app = _app(settings, "gateway")
    tokens = Tokens(settings.secret, settings.token_ttl_seconds)
    async with running(settings, app, worker=False) as node:
        await serve_gateway(node, tokens, settings.host, settings.port)
    return 0


async def _worker(args: argparse.Namespace) -> int:
    from signoff.runtime.node import running

    settings = _settings(args)
    app = _app(settings, "worker")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with running(settings, app, gateway=False) as node:
        metrics = None
        if settings.metrics_port and node.worker is not None:
            from signoff.runtime import metrics as m

            worker = node.worker
            metrics = await m.serve(
                settings.host,
                settings.metrics_port,
                lambda: m.worker_text(worker),
                worker.decision_latency_ns,
                worker.waits.woken.spans,
            )
        print(f"signoff worker {settings.worker_id} running app {app.name}", flush=True)
        await stop.wait()
        if metrics is not None:
            metrics.close()
    return 0


_NO_DATABASE = (
    "set SIGNOFF_DATABASE_URL or --database-url (or run `signoff dev` on this --data-dir)"
)


async def _migrate(args: argparse.Namespace) -> int:
    from signoff.runtime.node import database_url
    from signoff.store.postgres import PostgresStore

    url = database_url(_settings(args))
    if url is None:
        print(_NO_DATABASE, file=sys.stderr)
        return 2
    store = await PostgresStore.connect(url)
    try:
        applied = await store.migrate()
    finally:
        await store.close()
    print("applied: " + (", ".join(applied) if applied else "nothing (up to date)"))
    return 0


def _token(args: argparse.Namespace) -> int:
    from signoff.gateway.auth import Tokens
    from signoff.runtime.node import dev_secret

    settings = _settings(args)
    secret = settings.secret or dev_secret(settings)
    tokens = Tokens(secret, settings.token_ttl_seconds)
    print(tokens.issue(args.user, args.tenant or settings.tenant, args.role, args.ttl))
    return 0


async def _cards(args: argparse.Namespace) -> int:
    import msgspec

    from signoff.runtime.node import database_url
    from signoff.store.postgres import PostgresStore

    url = database_url(_settings(args))
    if url is None:
        print(_NO_DATABASE, file=sys.stderr)
        return 2
    store = await PostgresStore.connect(url)
    try:
        if args.action == "list":
            for card in await store.list_cards(args.status, None, args.limit):
                flag = " RECONCILE" if card.needs_reconciliation else ""
                print(f"{card.id}  {card.status:<11} {card.owner:<12} {card.summary}{flag}")
        elif args.action == "show":
            card = await store.get_card(args.card_id)
            events = await store.card_events(args.card_id)
            print(
                json.dumps(
                    {"card": card.public(), "events": msgspec.to_builtins(events)},
                    indent=2,
                    ensure_ascii=False,
                    default=str,
                )
            )
        elif args.action == "reconcile":
            if args.outcome is None:
                print(
                    "--outcome executed|failed is required (check the provider first)",
                    file=sys.stderr,
                )
                return 2
            card = await store.reconcile(
                args.card_id,
                executed=args.outcome == "executed",
                actor="operator",
                note=args.note,
            )
            print(f"{card.id} reconciled as {card.status}: {args.note}")
    finally:
        await store.close()
    return 0


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
        epilog="environment variables:\n" + ENV_HELP + "\n\n" + DEMO_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
    skew_flag(dev)
    dev.add_argument("--host", help="bind address (SIGNOFF_HOST, 127.0.0.1)")
    dev.add_argument("--port", type=int, help="port (SIGNOFF_PORT, 8000)")
    dev.add_argument("--offline", action="store_true", help="use the offline demo model")
    gw = sub.add_parser(
        "gateway", help="serve WebSocket and HTTP for --app (needs Postgres and Redis)"
    )
    common(gw)
    app_flags(gw)
    skew_flag(gw)
    gw.add_argument("--host")
    gw.add_argument("--port", type=int)
    wk = sub.add_parser("worker", help="run agent turns of --app (needs Postgres and Redis)")
    common(wk)
    app_flags(wk)
    skew_flag(wk)
    wk.add_argument("--worker-id", help="stable worker id (SIGNOFF_WORKER_ID)")
    wk.add_argument("--offline", action="store_true")
    mg = sub.add_parser("migrate", help="apply SQL migrations")
    common(mg)
    tk = sub.add_parser("token", help="print a signed bearer token for development")
    common(tk)
    tk.add_argument("--user", required=True)
    tk.add_argument("--tenant")
    tk.add_argument("--role", default="user")
    tk.add_argument("--ttl", type=int, default=None, help="seconds")
    cd = sub.add_parser("cards", help="list, show or reconcile cards")
    common(cd)
    cd.add_argument("action", choices=["list", "show", "reconcile"])
    cd.add_argument("card_id", nargs="?")
    cd.add_argument("--status")
    cd.add_argument("--limit", type=int, default=50)
    cd.add_argument("--note", default="checked with the provider")
    cd.add_argument(
        "--outcome",
        choices=["executed", "failed"],
        help="reconcile: what the provider says happened",
    )
    cp = sub.add_parser(
        "check-policy", help="list the write tools of --app without an explicit policy rule"
    )
    common(cp)
    app_flags(cp)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    try:
        if args.command == "token":
            return _token(args)
        if args.command == "check-policy":
            return _check_policy(args)
        if args.command in ("cards",) and args.action in ("show", "reconcile") and not args.card_id:
            print("card_id is required", file=sys.stderr)
            return 2
        runner = {
            "dev": _dev,
            "gateway": _gateway,
            "worker": _worker,
            "migrate": _migrate,
            "cards": _cards,
        }[args.command]
        with contextlib.suppress(KeyboardInterrupt):
            return loops.run(runner(args), cfg.from_env().event_loop)
        return 130
    except NoApp as exc:
        print(f"signoff {exc.message}", file=sys.stderr)
        return 2
    except SignoffError as exc:
        print(f"signoff: {exc.message}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
