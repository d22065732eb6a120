"""What ``signoff dev``, ``gateway`` and ``worker`` print at start: where each thing is,
and what to do next."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from signoff.runtime import config as cfg
from signoff.runtime.app import App
from signoff.runtime.tools import label_text


def data_dir_flag(settings: cfg.Settings) -> str:
    """`` --data-dir D`` when the data folder is not the default one (a newcomer probe:
    the banner's `signoff clean` would have looked in ./.signoff)."""
    if settings.data_dir == cfg.Settings().data_dir:
        return ""
    return f" --data-dir {shlex.quote(settings.data_dir)}"


def try_saying(app: App) -> str:
    """`` and ask, e.g. "<the app's hint>"`` (its English one), or nothing."""
    hint = app.hint
    if isinstance(hint, Mapping):
        hint = label_text(dict(hint), "en")
    return f" and ask, e.g. {hint}" if hint else ""


def metrics_where(settings: cfg.Settings, metrics: Any) -> str:
    if metrics is None:
        return "off (set SIGNOFF_METRICS_PORT or --metrics-port)"
    return f"http://{settings.metrics_host or settings.host}:{metrics.port}/metrics"
