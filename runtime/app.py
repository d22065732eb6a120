"""What an application hands signoff: its tools, its policy, its own services.

Also how the command line finds one (``--app module:attribute``, :func:`load_app`) and
what identifies the version a process serves (:meth:`App.fingerprint`): gateways and
workers of one deployment must agree on it (``runtime/presence.py``).
"""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from signoff.runtime.canonical import canonical_json
from signoff.runtime.errors import AppLoadError, ConfigError, SignoffError
from signoff.runtime.models.base import Model
from signoff.runtime.policy import Policy
from signoff.runtime.tools import Registry, Tool
from signoff.runtime.workflows.definition import Workflow


@dataclass
class App:
    """An agent application: tools + policy (+ opaque services the tools use).

    ``name`` identifies the application: every gateway and worker on one database that
    serves the same name must serve the same tools (:meth:`fingerprint`).
    ``system``: the system prompt (default: signoff's own, which tells the model that
    writes only propose). ``setup`` is awaited once at start-up with the Postgres URL
    (create the app's own tables, open its pools); what it returns becomes ``services``
    (handed to tools as ``ctx.services``) unless it set them itself. ``teardown`` is
    awaited at shutdown.
    ``offline_model``: the model used when no Anthropic key is configured (a rule-based
    stand-in, so ``signoff dev`` works on a fresh machine); without one, signoff's
    generic offline model offers ``/tool key=value`` commands.
    ``workflows``: the app's durable workflows (:class:`~signoff.Workflow`), started with
    ``POST /v1/workflows/{name}/runs``; names must be unique.
    ``hint``: what to ask, for the chat page's empty thread ("e.g. …"): one text, or one
    per language tag (``{"en": '"charge João 150"', "pt-BR": '"cobre 150 do João"'}``);
    without one the page shows no example (the demo's are not every app's).
    """

    name: str
    tools: Registry
    policy: Policy = field(default_factory=Policy)
    services: Any = None
    system: str | None = None
    # Awaited with the store's Postgres URL at start-up (e.g. to create the app's own tables);
    # what it returns becomes ``services`` unless setup set them itself.
    setup: Callable[[str], Awaitable[Any]] | None = None
    teardown: Callable[[], Awaitable[None]] | None = None
    offline_model: Model | None = None
    workflows: Sequence[Workflow] = ()
    hint: str | Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        names = [w.name for w in self.workflows]
        if len(set(names)) != len(names):
            raise ConfigError(f"app {self.name!r}: two workflows share a name ({names})")
        if self.hint is not None and not isinstance(self.hint, str):
            # A plain dict of texts: it goes out in every chat page's ready frame, and a
            # Mapping the encoder does not know would fail every socket's first answer.
            hint = dict(self.hint)
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in hint.items()):
                raise ConfigError(f"app {self.name!r}: hint must be a text or texts by language")
            self.hint = hint

    def workflow_map(self) -> dict[str, Workflow]:
        return {w.name: w for w in self.workflows}

    def tool_fingerprints(self) -> dict[str, str]:
        """Tool name -> a short hash of what a card of it depends on (see :func:`tool_fingerprint`)."""
        return {tool.name: tool_fingerprint(tool) for tool in self.tools}

    def fingerprint(self) -> str:
        """A hash of the app's name and its tools' fingerprints: two processes with the same
        fingerprint propose, decide and run the same cards the same way."""
        payload: dict[str, object] = {"app": self.name, "tools": self.tool_fingerprints()}
        if self.workflows:  # (apps without workflows keep the fingerprint they had)
            payload["workflows"] = {w.name: w.shape() for w in self.workflows}
        return hashlib.sha256(canonical_json(payload).encode()).hexdigest()[:16]


def tool_fingerprint(tool: Tool) -> str:
    """What a card of ``tool`` depends on across processes: its input schema (what the model
    is offered and what an edit is parsed against), its risk, its editable fields and the
    fields its request key treats as sets. Descriptions and TTLs may differ."""
    payload = {
        "risk": str(tool.risk),
        "input_schema": tool.spec()["input_schema"],
        "editable": sorted(tool.editable),
        "set_fields": sorted(tool.set_fields),
    }
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()[:16]


def load_app(spec: str) -> App:
    """The app named by ``module:attribute`` (``attribute`` may be dotted): an :class:`App`,
    or a zero-argument factory returning one. Like uvicorn, the current directory is put
    first on ``sys.path``, so ``signoff dev --app myapp:app`` finds ``./myapp.py``.

    Raises :class:`AppLoadError` with a message a person can act on."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise AppLoadError(
            f"--app {spec!r}: expected module:attribute, e.g. --app examples.helpdesk:app"
        )
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            raise AppLoadError(
                f"--app {spec!r}: no module named {missing!r} (looked in {cwd} and on sys.path)"
            ) from exc
        raise AppLoadError(f"--app {spec!r}: importing {module_name} failed: {exc}") from exc
    except SignoffError:
        raise
    except Exception as exc:
        raise AppLoadError(
            f"--app {spec!r}: importing {module_name} failed: {type(exc).__name__}: {exc}"
        ) from exc
    found: Any = module
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise AppLoadError(
                f"--app {spec!r}: module {module_name} has no attribute {attribute!r}"
            ) from None
    if isinstance(found, App):
        return found
    if callable(found) and not isinstance(found, type):
        try:
            made = found()
        except SignoffError:
            raise
        except Exception as exc:
            raise AppLoadError(
                f"--app {spec!r}: calling {attribute}() failed: {type(exc).__name__}: {exc}"
            ) from exc
        if isinstance(made, App):
            return made
        raise AppLoadError(
            f"--app {spec!r}: {attribute}() returned a {type(made).__name__}, not a signoff App"
        )
    raise AppLoadError(
        f"--app {spec!r}: {attribute} is a {type(found).__name__}, not a signoff App "
        "or a zero-argument function returning one"
    )
