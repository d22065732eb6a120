"""The built-in demo: a small Brazilian merchant's payments desk (Pix charges, refunds,
appointment cancellations, e-mail changes) on a tiny "bank" in Postgres.

``signoff dev`` serves it when no ``--app`` is given; anywhere else name it explicitly,
``--app signoff.demo:app``. It is an application like any other, configured by its own
environment variables:

- ``SIGNOFF_DEMO_CARD_TTL_SECONDS``: how long every card waits for a decision (default:
  each tool's own, 10 or 30 minutes); e.g. ``20`` to watch a card expire;
- ``SIGNOFF_TENANT``: the tenant whose demo data is seeded (default ``demo``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta

from signoff import App, ConfigError
from signoff.demo.desk import SYSTEM, build, demo_policy

__all__ = ["SYSTEM", "app", "build", "demo_policy"]

CARD_TTL_ENV = "SIGNOFF_DEMO_CARD_TTL_SECONDS"
TENANT_ENV = "SIGNOFF_TENANT"


def app(env: Mapping[str, str] | None = None) -> App:
    """The demo app as its environment configures it (``--app signoff.demo:app``)."""
    source = os.environ if env is None else env
    tenant = source.get(TENANT_ENV) or "demo"
    raw = source.get(CARD_TTL_ENV, "")
    card_ttl = None
    if raw:
        try:
            seconds = float(raw)
        except ValueError:
            seconds = 0.0
        if not seconds > 0:
            raise ConfigError(f"{CARD_TTL_ENV} must be a positive number of seconds, not {raw!r}")
        card_ttl = timedelta(seconds=seconds)
    return build((tenant,), card_ttl)
