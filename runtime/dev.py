"""What ``signoff dev`` does differently from the gateway and worker pools.

One process on embedded servers, with no load balancer in front of it: each app gets
its own database in the embedded cluster and its own key prefix in the embedded Valkey
(two apps run one after the other on one data folder would otherwise list, adopt and
take each other's threads, runs and inbox entries), and Ctrl-C stops it at once (no
drain for a load balancer to steer clients away first).
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Any

from signoff.runtime.config import Settings

DEMO_APP = "signoff.demo:app"  # the built-in demo, served when no --app is given


def app_space(spec: str | None, name: str) -> tuple[str, str | None]:
    """(database, key prefix) of an app in the embedded servers: the built-in demo keeps
    ``signoff`` and the default prefix (None); another app ``signoff_<name>`` and
    ``so:<name>:``, its name made a lower-case identifier, with a short hash of the name
    as written when that changed it ("Help Desk" and "help_desk" are two apps)."""
    if not spec or spec == DEMO_APP:
        return "signoff", None
    slug = re.sub(r"[^a-z0-9_]+", "_", name.lower()).strip("_")[:40] or "app"
    if slug != name:
        slug = f"{slug}_{hashlib.sha256(name.encode()).hexdigest()[:6]}"
    return f"signoff_{slug}", f"so:{slug}:"


def dev_settings(settings: Settings, name: str) -> tuple[Settings, list[Any]]:
    """``settings`` for ``signoff dev`` serving the app called ``name`` (``settings.app``
    its spec), with the embedded servers started for what is not configured."""
    from signoff.runtime.node import dev_secret, embedded_urls  # (the engine: not at import)

    database, prefix = app_space(settings.app, name)
    if prefix is not None and "SIGNOFF_KEY_PREFIX" not in os.environ:
        settings = settings.with_(key_prefix=prefix)
    if "SIGNOFF_DRAIN_SECONDS" not in os.environ:
        # Ctrl-C stops it at once (the pools' 2 s drain took 2.4-3.8 s to stop here).
        settings = settings.with_(drain_seconds=0.0)
    settings, closers = embedded_urls(settings, database)
    return settings.with_(secret=dev_secret(settings)), closers
