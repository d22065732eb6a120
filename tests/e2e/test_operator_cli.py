"""Operator commands against a real, running `signoff dev`, with no flags and no
environment: they find its database in its data folder (dev.json)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from signoff.embedded import free_port, remove_data
from tests.e2e.test_dev import Dev, wait_for

pytestmark = pytest.mark.timeout(180)


def signoff(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The command exactly as typed in the folder where `signoff dev` runs: no flags, no
    SIGNOFF_* variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SIGNOFF_", "ANTHROPIC"))}
    return subprocess.run(
        [sys.executable, "-m", "signoff", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=60,
        check=False,
    )


@pytest.fixture
def dev_here(tmp_path: Path) -> Iterator[tuple[Dev, Path]]:
    """`signoff dev` started in tmp_path on its default data folder (./.signoff)."""
    d = Dev(Path(".signoff"), free_port())
    d.start(cwd=tmp_path)
    yield d, tmp_path
    d.kill(signal.SIGTERM)
    remove_data(tmp_path / ".signoff" / "embedded")


def test_operator_commands_find_a_running_dev_with_no_flags(dev_here: tuple[Dev, Path]) -> None:
    dev, here = dev_here
    record = here / ".signoff" / "dev.json"
    assert record.stat().st_mode & 0o777 == 0o600
    urls = json.loads(record.read_text())
    assert urls["database_url"].startswith("postgresql://")
    assert urls["redis_url"].startswith("redis://") and urls["pid"] == dev.proc.pid  # type: ignore[union-attr]

    with dev.client() as c:
        thread = c.post("/v1/threads").json()["thread"]["id"]
        c.post(f"/v1/threads/{thread}/messages", json={"text": "cobre 12 do João"})
        card = wait_for(lambda: c.get(f"/v1/threads/{thread}").json()["pending_cards"])[0]

    listed = signoff(here, "cards", "list")
    assert listed.returncode == 0, listed.stderr
    header, *lines = listed.stdout.splitlines()
    assert header.split()[:4] == ["ID", "STATUS", "CREATED", "DECIDED"]
    (line,) = [x for x in lines if x.startswith(card["id"][:8])]
    assert "pending" in line and "create_pix_charge" in line and " 20" in line  # a timestamp

    as_json = json.loads(signoff(here, "cards", "list", "--json").stdout)
    assert card["id"] in [c["id"] for c in as_json]
    filtered = signoff(
        here,
        "cards",
        "list",
        "--status",
        "pending",
        "--tool",
        "create_pix_charge",
        "--thread",
        thread[:8],
        "--newer-than",
        "1h",
        "--json",
    )
    assert [c["id"] for c in json.loads(filtered.stdout)] == [card["id"]]
    assert signoff(here, "cards", "list", "--older-than", "1h").stdout.strip() == "no cards match"
    assert signoff(here, "cards", "list", "--tool", "refund", "--json").stdout.strip() == "[]"

    shown = signoff(here, "cards", "show", card["id"][:8], "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["card"]["id"] == card["id"]
    # without --json, for a person (it printed JSON either way)
    told = signoff(here, "cards", "show", card["id"][:8]).stdout
    assert told.startswith(f"card {card['id']}  create_pix_charge (critical)"), told
    assert "  status:    pending" in told and "-> pending  by" in told, told
    missing = signoff(here, "cards", "show", "ffffffff-ffff")
    assert missing.returncode == 2 and "no card id starts with" in missing.stderr

    assert "nothing (up to date)" in signoff(here, "migrate").stdout
    dry = signoff(here, "prune", "--dry-run", "--days", "1")
    assert dry.returncode == 0 and "would delete 0 threads" in dry.stdout, dry

    token = signoff(here, "token", "--user", "demo")
    assert token.returncode == 0, token.stderr
    with httpx.Client(base_url=dev.url, timeout=10) as http:
        headers = {"Authorization": f"Bearer {token.stdout.strip()}"}
        assert http.get(f"/v1/cards/{card['id']}", headers=headers).status_code == 200

    # A stopped dev's record is not trusted (its pid is gone; uvicorn re-raises SIGTERM
    # after shutdown, so the record may stay on disk).
    dev.kill(signal.SIGTERM)
    gone = signoff(here, "cards", "list")
    assert gone.returncode == 2 and str(here / ".signoff") in gone.stderr
