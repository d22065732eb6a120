"""deploy/ works as written: every signoff process of compose.yml, kubernetes.yml and the
Procfile gets the variables it needs (YAML merges resolved), and every command, flag and
variable it uses exists in `signoff --help` and runtime/config.py."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from signoff.runtime import cli, config
from tests import deploy

ROOT = Path(__file__).resolve().parents[2]
ENV = {"SIGNOFF_APP": "myproject.agent:app", "SIGNOFF_SECRET": "s" * 48}
KNOWN_VARIABLES = set(config.env_names().values())


def missing(processes: list[deploy.Process]) -> dict[str, list[str]]:
    """Per process, the variables its role needs that it does not get (or gets empty)."""
    out = {}
    for p in processes:
        lacking = sorted(v for v in deploy.REQUIRED[p.role] if not p.env.get(v))
        if lacking:
            out[p.name] = lacking
    return out


def subcommands() -> dict[str, argparse.ArgumentParser]:
    for action in cli.parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("no subcommands")


def unknown_usage(processes: list[deploy.Process]) -> list[str]:
    """Commands, flags and variables used by the deploy files that signoff does not have."""
    commands = subcommands()
    problems = []
    for p in processes:
        if p.argv[:1] != ["signoff"] or p.argv[1] not in commands:
            problems.append(f"{p.name}: {' '.join(p.argv)} is not a signoff command")
            continue
        options = {o for a in commands[p.argv[1]]._actions for o in a.option_strings}
        problems += [
            f"{p.name}: {p.argv[1]} has no {arg}"
            for arg in p.argv[2:]
            if arg.startswith("--") and arg not in options
        ]
        problems += [
            f"{p.name}: {name} is not a setting"
            for name in p.env
            if name.startswith(("SIGNOFF_", "ANTHROPIC_")) and name not in KNOWN_VARIABLES
        ]
    return problems


def test_every_compose_process_gets_what_it_needs() -> None:
    doc = deploy.compose(ENV)
    processes = deploy.compose_processes(doc)
    roles = sorted(p.role for p in processes)
    assert roles == ["gateway", "gateway", "migrate", "worker", "worker"]
    assert missing(processes) == {}
    for p in processes:
        assert p.env["SIGNOFF_APP"] == ENV["SIGNOFF_APP"]  # the one variable, everywhere
        assert p.env["SIGNOFF_SECRET"] == ENV["SIGNOFF_SECRET"]
    workers = [p.env["SIGNOFF_WORKER_ID"] for p in processes if p.role == "worker"]
    assert len(set(workers)) == 2
    assert unknown_usage(processes) == []


def test_a_worker_environment_that_replaces_the_shared_one_is_caught() -> None:
    """The shallow-merge trap: a service's own `environment:` replaces the merged one."""
    text = deploy.COMPOSE.read_text()
    broken = text.replace(
        "environment: { <<: *env, SIGNOFF_WORKER_ID: worker-1, SIGNOFF_HOST: 0.0.0.0 }",
        "environment: { SIGNOFF_WORKER_ID: worker-1 }",
    )
    assert broken != text
    found = missing(deploy.compose_processes(deploy.compose(ENV, broken)))
    assert found == {"worker-1": ["SIGNOFF_APP", "SIGNOFF_DATABASE_URL", "SIGNOFF_REDIS_URL"]}


def test_compose_needs_the_app_and_the_secret_and_never_defaults_to_the_demo() -> None:
    for name in ("SIGNOFF_APP", "SIGNOFF_SECRET"):
        with pytest.raises(deploy.Unset, match=name):
            deploy.compose({k: v for k, v in ENV.items() if k != name})
    assert "signoff.demo:app" not in deploy.compose(ENV).__repr__()


def test_compose_topology_proxy_migration_and_order() -> None:
    services = deploy.compose(ENV)["services"]
    assert {"postgres", "redis", "proxy", "migrate", "gateway-a", "gateway-b"} <= set(services)
    assert services["migrate"]["restart"] == "no"
    for name, service in services.items():
        if service.get("command", [None])[:2] in (["signoff", "gateway"], ["signoff", "worker"]):
            assert service["depends_on"]["migrate"] == {
                "condition": "service_completed_successfully"
            }, name
    proxy = services["proxy"]
    (mount,) = proxy["volumes"]
    conf = (deploy.DEPLOY / mount.split(":")[0]).read_text()
    assert "gateway-a:8000" in conf and "gateway-b:8000" in conf
    assert "proxy_set_header Upgrade $http_upgrade" in conf
    assert "proxy_set_header Connection $connection_upgrade" in conf
    assert "proxy_http_version 1.1" in conf
    assert set(proxy["depends_on"]) == {"gateway-a", "gateway-b"}


def test_every_kubernetes_process_gets_what_it_needs() -> None:
    docs = deploy.kubernetes()
    processes = deploy.kubernetes_processes(docs)
    assert sorted(p.role for p in processes) == ["gateway", "migrate", "worker"]
    # the app is one variable (a ConfigMap key), left for the operator: never the demo
    app = {p.env.get("SIGNOFF_APP") for p in processes}
    assert app == {""}, app
    with_app = [
        deploy.Process(p.name, p.argv, {**p.env, "SIGNOFF_APP": "x:app"}) for p in processes
    ]
    assert missing(with_app) == {}
    assert unknown_usage(processes) == []


def test_kubernetes_pools_scale_apart_drain_and_stay_available() -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for d in deploy.kubernetes()}
    gateway = docs[("Deployment", "signoff-gateway")]["spec"]["template"]["spec"]
    worker = docs[("StatefulSet", "signoff-worker")]["spec"]["template"]["spec"]
    job = docs[("Job", "signoff-migrate")]["spec"]["template"]["spec"]
    assert job["containers"][0]["args"] == ["signoff", "migrate"]
    for spec in (gateway, worker, job):
        for c in spec["containers"]:
            assert {"cpu", "memory"} <= set(c["resources"]["requests"])
            assert {"cpu", "memory"} <= set(c["resources"]["limits"])
    (gw,) = gateway["containers"]
    assert gw["readinessProbe"]["httpGet"]["path"] == "/readyz?redis=optional"
    assert gw["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert "preStop" in gw["lifecycle"]
    assert gateway["terminationGracePeriodSeconds"] >= 35  # preStop + the drain
    # a provider call in flight gets its deadline (30 s) + 5 s from the SIGTERM, then the
    # release and the app's teardown (up to 10 s)
    assert worker["terminationGracePeriodSeconds"] >= 50
    assert worker["containers"][0]["readinessProbe"]["httpGet"] == {
        "path": "/readyz",
        "port": "metrics",
    }
    assert worker["containers"][0]["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # the series the autoscalers read must be exported somewhere in signoff's source
    sources = "".join(
        p.read_text() for folder in ("runtime", "gateway") for p in (ROOT / folder).rglob("*.py")
    )
    for target in ("Deployment/signoff-gateway", "StatefulSet/signoff-worker"):
        kind, name = target.split("/")
        (hpa,) = [
            d
            for (k, _), d in docs.items()
            if k == "HorizontalPodAutoscaler" and d["spec"]["scaleTargetRef"]["name"] == name
        ]
        assert hpa["spec"]["scaleTargetRef"]["kind"] == kind
        assert hpa["spec"]["minReplicas"] >= 2
        for metric in hpa["spec"]["metrics"]:
            if metric["type"] == "Pods":  # a series signoff really exports
                assert metric["pods"]["metric"]["name"] in sources
        pdb = docs[("PodDisruptionBudget", name)]
        assert pdb["spec"]["selector"]["matchLabels"] == {"app": name}


def test_the_procfile_and_the_image() -> None:
    processes = deploy.procfile_processes()
    assert sorted(p.role for p in processes) == ["gateway", "migrate", "worker"]
    assert unknown_usage(processes) == []
    dockerfile = (deploy.DEPLOY / "Dockerfile").read_text()
    for link in (ROOT / "signoff").iterdir():  # the package's folders that are links
        if link.is_symlink():
            target = link.resolve().relative_to(ROOT)
            assert f"COPY {target} {target}" in dockerfile, target
