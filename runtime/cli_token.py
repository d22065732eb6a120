"""``signoff token``: print a signed bearer token for a user.

Signed with ``SIGNOFF_SECRET``, else the dev secret ``signoff dev`` keeps in the data
folder (never a new one: it would sign tokens no server accepts).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from signoff.runtime import cli_ops
from signoff.runtime.config import Settings


def _positive_seconds(text: str) -> int:
    """``--ttl``: a token that expires at once (0 or less) is useless, refuse it."""
    try:
        seconds = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of seconds") from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {seconds}")
    return seconds


def add_parser(sub: Any) -> argparse.ArgumentParser:
    tk: argparse.ArgumentParser = sub.add_parser(
        "token",
        help="print a signed bearer token (SIGNOFF_SECRET, else the data folder's dev secret)",
    )
    tk.add_argument("--data-dir", help="local data folder (SIGNOFF_DATA_DIR, .signoff)")
    tk.add_argument("--user", required=True, help="the user the token authenticates")
    tk.add_argument("--tenant", help="the user's tenant (SIGNOFF_TENANT, demo)")
    tk.add_argument("--role", default="user", help="the user's role (user)")
    tk.add_argument(
        "--ttl",
        type=_positive_seconds,
        default=None,
        help="lifetime in seconds, more than 0 (SIGNOFF_TOKEN_TTL_SECONDS)",
    )
    return tk


def run(args: argparse.Namespace, settings: Settings) -> int:
    from signoff.gateway.auth import Tokens, name_problem

    for kind, value in (("--user", args.user), ("--tenant", args.tenant)):
        problem = name_problem(value) if value is not None else None
        if problem is not None:
            print(f"signoff token: {kind} {problem}", file=sys.stderr)
            return 2
    # (--ttl is refused by argparse, SIGNOFF_TOKEN_TTL_SECONDS by from_env, unless > 0)
    ttl = args.ttl if args.ttl is not None else settings.token_ttl_seconds
    tokens = Tokens(cli_ops.data_secret(settings), settings.token_ttl_seconds)
    print(tokens.issue(args.user, args.tenant or settings.tenant, args.role, ttl))
    return 0
