"""Reading deploy/ as compose and Kubernetes would: YAML merges and anchors resolved by
PyYAML, compose's ``${VAR}`` / ``${VAR:-default}`` / ``${VAR:?error}`` interpolation, and
each signoff process's resolved command and environment."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
COMPOSE = DEPLOY / "compose.yml"
KUBERNETES = DEPLOY / "kubernetes.yml"
PROCFILE = DEPLOY / "Procfile"

# What every signoff process needs to reach its peers, and what it serves.
REQUIRED = {
    "gateway": {"SIGNOFF_DATABASE_URL", "SIGNOFF_REDIS_URL", "SIGNOFF_SECRET", "SIGNOFF_APP"},
    "worker": {"SIGNOFF_DATABASE_URL", "SIGNOFF_REDIS_URL", "SIGNOFF_APP"},
    "migrate": {"SIGNOFF_DATABASE_URL"},
}


class Unset(ValueError):
    """A ``${VAR:?message}`` whose variable is not set: compose refuses to start."""


_VAR = re.compile(r"\$\{([A-Z_][A-Z0-9_]*)(?:(:-|:\?)([^}]*))?\}")


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """Compose's variable interpolation over every string of a loaded document."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3) or ""
        if env.get(name):
            return env[name]
        if op == ":?":
            raise Unset(f"{name}: {arg}")
        return arg if op == ":-" else ""

    return _VAR.sub(one, value)


@dataclass
class Process:
    """One signoff process of a deploy file: its command line and its environment."""

    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)

    @property
    def role(self) -> str:
        return self.argv[1]


def compose(env: Mapping[str, str], text: str | None = None) -> dict[str, Any]:
    """deploy/compose.yml loaded (merges resolved) and interpolated with ``env``."""
    loaded = yaml.safe_load(COMPOSE.read_text() if text is None else text)
    result: dict[str, Any] = interpolate(loaded, env)
    return result


def compose_processes(doc: Mapping[str, Any]) -> list[Process]:
    out = []
    for name, service in doc["services"].items():
        command = service.get("command") or []
        if command[:1] != ["signoff"]:
            continue
        environment = service.get("environment") or {}
        assert isinstance(environment, dict), f"{name}: environment as a mapping"
        out.append(Process(name, list(command), {k: str(v) for k, v in environment.items()}))
    return out


def kubernetes() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(KUBERNETES.read_text()) if d]


def kubernetes_processes(docs: list[dict[str, Any]]) -> list[Process]:
    """Every container running signoff, with the variables its envFrom and env give it
    (ConfigMaps and Secrets of the same file; valueFrom counts as set)."""
    maps = {
        (d["kind"], d["metadata"]["name"]): {
            **d.get("data", {}),
            **d.get("stringData", {}),
        }
        for d in docs
        if d["kind"] in ("ConfigMap", "Secret")
    }
    out = []
    for doc in docs:
        if doc["kind"] not in ("Deployment", "StatefulSet", "Job"):
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            argv = list(container.get("args") or container.get("command") or [])
            env: dict[str, str] = {}
            for source in container.get("envFrom", []):
                ref = source.get("configMapRef") or source.get("secretRef")
                kind = "ConfigMap" if "configMapRef" in source else "Secret"
                env.update({k: str(v) for k, v in maps[(kind, ref["name"])].items()})
            for item in container.get("env", []):
                env[item["name"]] = str(item.get("value", "<valueFrom>"))
            out.append(Process(f"{doc['metadata']['name']}/{container['name']}", argv, env))
    return out


def procfile_processes() -> list[Process]:
    out = []
    for line in PROCFILE.read_text().splitlines():
        if line.strip():
            name, _, command = line.partition(":")
            out.append(Process(name.strip(), command.split()))
    return out
