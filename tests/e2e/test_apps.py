"""Your own app, as a user serves it (issue 11's acceptance).

- ``signoff gateway`` / ``signoff worker`` / ``signoff check-policy`` without an app exit
  non-zero naming ``--app``; a bad ``--app`` is a clear error.
- The wheel: built with ``pip wheel --no-deps``, installed with ``--no-deps`` into a fresh
  venv, it adds exactly one top-level import package, ``signoff``, and its public API
  imports. How the fresh venv gets the dependencies without a download: it is made
  ``--without-pip`` and a ``.pth`` file appends this interpreter's site-packages to its
  path. Lines of a ``.pth`` only extend ``sys.path``: the ``.pth`` files *in* that folder
  (notably the editable install of this checkout) are not run, so ``signoff`` resolves to
  the installed wheel alone. The main venv's pip installs the wheel (``--python``).
- With that installed wheel's ``signoff`` command, ``signoff dev --app
  examples.helpdesk:app`` from the checkout and a tiny app module written in a temporary
  folder both serve their own tools over HTTP: propose -> approve -> executed.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import signoff
from signoff.embedded import free_port, remove_data
from tests.e2e.test_dev import Dev, wait_for

REPO = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("SIGNOFF_", "ANTHROPIC"))}


def _signoff(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "signoff", *args],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=cwd,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("command", ["gateway", "worker", "check-policy"])
def test_commands_that_serve_an_app_refuse_to_start_without_one(command: str) -> None:
    out = _signoff(command, "--database-url", "postgresql://nobody@127.0.0.1:1/none")
    assert out.returncode == 2, out
    assert "no app to serve: pass --app module:attribute (or set SIGNOFF_APP)" in out.stderr
    assert "--app signoff.demo:app" in out.stderr  # the demo only when named
    assert "Traceback" not in out.stderr


def test_a_bad_app_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "notapp.py").write_text("app = 42\n")
    cases = {
        "missing_module_xyz:app": "no module named 'missing_module_xyz'",
        "notapp:nope": "module notapp has no attribute 'nope'",
        "notapp:app": "app is a int, not a signoff App",
        "notapp": "expected module:attribute",
    }
    for spec, says in cases.items():
        out = _signoff("check-policy", "--app", spec, cwd=tmp_path)
        assert out.returncode == 1, (spec, out)
        assert says in out.stderr and "Traceback" not in out.stderr, (spec, out.stderr)
    ok = _signoff("check-policy", "--app", "examples.helpdesk:app", cwd=REPO)
    assert ok.returncode == 0 and "every write tool has an explicit policy rule" in ok.stdout


# -- the wheel -------------------------------------------------------------------------------


TINY_APP = '''
"""A tiny app written against the public API only."""

import msgspec

from signoff import App, Policy, Prepared, Registry, Risk, Rule, Tool, ToolContext, Verdict

NOTES: list[str] = []


class NoteIn(msgspec.Struct):
    text: str


class AddNote(Tool):
    name = "add_note"
    description = "Pin a note to the team board."
    risk = Risk.REVERSIBLE
    input_type = NoteIn

    async def prepare(self, data: NoteIn, ctx: ToolContext) -> Prepared:
        return Prepared(
            args={"text": data.text}, summary="Pin a note to the board", impact={},
            fields={"Note": data.text},
        )

    async def execute(self, args, operation_id, ctx):
        NOTES.append(args["text"])
        return {"pinned": args["text"], "notes": len(NOTES)}


app = App(name="notes", tools=Registry([AddNote()]), policy=Policy([Rule(Verdict.ASK, tool="add_note")]))
'''


def _site_packages(venv: Path) -> Path:
    return Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The wheel built from this checkout, installed into a fresh venv (see the module doc)."""
    root = tmp_path_factory.mktemp("wheel")
    # Built from a copy: setuptools leaves build/ behind, and a build/ of an older tree can
    # put files that no longer exist into the wheel. Symbolic links stay links (the rooms).
    source = root / "src"
    shutil.copytree(
        REPO,
        source,
        symlinks=True,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "build", "*.egg-info", ".signoff", "__pycache__", "*_cache"
        ),
    )
    dist = root / "dist"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = dist.glob("signoff-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = _site_packages(venv)
    before = {p.name for p in purelib.iterdir()}
    (purelib / "zz_signoff_test_deps.pth").write_text(
        "\n".join(site.getsitepackages()) + "\n", encoding="utf-8"
    )
    python = venv / "bin" / "python"
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "-q",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert install.returncode == 0, install.stderr
    after = {p.name for p in purelib.iterdir()}
    yield {
        "wheel": wheel,
        "python": python,
        "signoff": venv / "bin" / "signoff",
        "new": after - before - {"zz_signoff_test_deps.pth"},
        "purelib": purelib,
    }


@pytest.mark.slow
def test_the_wheel_adds_one_import_package_with_the_public_api(
    installed: dict[str, Any], tmp_path: Path
) -> None:
    with zipfile.ZipFile(installed["wheel"]) as wheel:
        names = wheel.namelist()
    assert {n.split("/")[0] for n in names} == {
        "signoff",
        f"signoff-{signoff.__version__}.dist-info",
    }
    for inside in (
        "signoff/py.typed",
        "signoff/runtime/cli.py",  # the linked rooms are real files in the wheel
        "signoff/store/migrations/0005_app_processes.sql",
        "signoff/gateway/static/index.html",
        "signoff/demo/desk.py",
    ):
        assert inside in names
    assert not any(n.startswith(("examples/", "tests/", "runtime/", "store/")) for n in names)
    # the only new top-level entries of the fresh venv's site-packages
    assert {n for n in installed["new"] if not n.endswith(".dist-info")} == {"signoff"}
    probe = subprocess.run(
        [
            str(installed["python"]),
            "-c",
            "import signoff; from signoff import Tool, App, Policy, Rule, Risk; "
            "print(signoff.__file__)",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # not the checkout: only the installed package can answer
        env=_env(),
        timeout=60,
        check=False,
    )
    assert probe.returncode == 0, probe.stderr
    assert Path(probe.stdout.strip()).is_relative_to(installed["purelib"])


def _approve_and_execute(dev: Dev, text: str) -> dict[str, Any]:
    with dev.client() as c:
        thread = c.post("/v1/threads").json()["thread"]["id"]
        assert c.post(f"/v1/threads/{thread}/messages", json={"text": text}).status_code == 202
        card: dict[str, Any] = wait_for(
            lambda: c.get(f"/v1/threads/{thread}").json()["pending_cards"]
        )[0]
        r = c.post(
            f"/v1/cards/{card['id']}/resolve",
            json={"decision": "approve", "snapshot_hash": card["snapshot_hash"]},
        )
        assert r.status_code == 200, r.text
        wait_for(lambda: c.get(f"/v1/cards/{card['id']}").json()["card"]["status"] == "executed")
        done: dict[str, Any] = c.get(f"/v1/cards/{card['id']}").json()["card"]
        return done


@pytest.fixture
def wheel_dev(installed: dict[str, Any], tmp_path: Path) -> Iterator[Dev]:
    d = Dev(tmp_path / "data", free_port(), command=[str(installed["signoff"])])
    yield d
    d.kill()
    remove_data(d.data_dir / "embedded")


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_installed_signoff_serves_the_helpdesk_from_a_checkout(wheel_dev: Dev) -> None:
    wheel_dev.start(args=("--app", "examples.helpdesk:app"), cwd=REPO)
    assert "app:      helpdesk (examples.helpdesk:app)" in wheel_dev.output
    assert "model:    offline-helpdesk" in wheel_dev.output
    card = _approve_and_execute(wheel_dev, "refund order A100, it arrived broken")
    assert card["tool"] == "refund_order"
    assert card["summary"] == (
        "Refund $25.00 for order A100 (Wireless mouse) to the original payment method"
    )
    assert card["result"]["refunded"] == "$25.00"


def readme_first_app() -> str:
    """The `myapp.py` of the README's "Your first app in ten minutes", as printed there."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = text.split("<!-- first-app: begin", 1)[1].split("<!-- first-app: end -->", 1)[0]
    return block.split("```python\n", 1)[1].rsplit("```", 1)[0]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_installed_signoff_serves_an_app_from_the_current_folder(
    wheel_dev: Dev, tmp_path: Path
) -> None:
    (tmp_path / "notes_app.py").write_text(TINY_APP, encoding="utf-8")
    wheel_dev.start({"SIGNOFF_APP": "notes_app:app"}, cwd=tmp_path)
    assert "app:      notes (notes_app:app)" in wheel_dev.output
    assert "model:    offline-commands" in wheel_dev.output
    card = _approve_and_execute(wheel_dev, '/add_note text="ship it on friday"')
    assert card["tool"] == "add_note" and card["summary"] == "Pin a note to the board"
    assert card["result"] == {"pinned": "ship it on friday", "notes": 1}


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_readme_first_app_works_as_written(wheel_dev: Dev, tmp_path: Path) -> None:
    (tmp_path / "myapp.py").write_text(readme_first_app(), encoding="utf-8")
    wheel_dev.start(args=("--app", "myapp:app"), cwd=tmp_path)
    assert "app:      board (myapp:app)" in wheel_dev.output
    card = _approve_and_execute(wheel_dev, '/add_task title="Water the plants"')
    assert card["summary"] == "Add a task to the team board"
    assert card["impact"]["fields"] == [{"label": "Task", "value": "Water the plants"}]
    assert card["result"] == {"added": "Water the plants", "tasks": 1}
    with wheel_dev.client() as c:  # step 6: the board lists it
        thread = c.post("/v1/threads").json()["thread"]["id"]
        c.post(f"/v1/threads/{thread}/messages", json={"text": "/list_tasks"})

        def listed() -> bool:
            events = c.get(f"/v1/threads/{thread}/events?after_seq=0").json()["events"]
            return any(
                "Water the plants" in str(e["data"]) for e in events if e["kind"] == "assistant"
            )

        wait_for(listed)


# -- one app version per deployment --------------------------------------------------------


def _versioned_app(folder: Path, module: str, name: str, extra_field: str) -> None:
    """An app named ``name`` whose tool's input has ``extra_field`` too (another version)."""
    (folder / f"{module}.py").write_text(
        TINY_APP.replace(
            "    text: str\n", f"    text: str\n    {extra_field}: str = ''\n"
        ).replace('App(name="notes"', f'App(name="{name}"'),
        encoding="utf-8",
    )


def test_a_gateway_of_another_app_version_refuses_to_start_unless_skew_is_allowed(
    database_url: str, tmp_path: Path
) -> None:
    import secrets

    from tests import services
    from tests.cluster import cluster

    name = "notes-" + secrets.token_hex(3)
    _versioned_app(tmp_path, "notes_v1", name, "colour")
    _versioned_app(tmp_path, "notes_v2", name, "pinned_by")
    here = str(tmp_path)
    with cluster(database_url, services.redis_url(), tmp_path, gateways=0, workers=0) as c:
        c.add_worker(SIGNOFF_APP="notes_v1:app", PYTHONPATH=here)
        env = c.env(SIGNOFF_APP="notes_v2:app", PYTHONPATH=here)
        refused = subprocess.run(
            [sys.executable, "-m", "signoff", "gateway", "--port", str(free_port())],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
        assert refused.returncode == 1, refused
        assert f"app {name!r}" in refused.stderr and "add_note differs" in refused.stderr
        assert "SIGNOFF_ALLOW_APP_SKEW=1" in refused.stderr
        # the same version joins; another one only with the override, and it says so
        c.add_gateway(SIGNOFF_APP="notes_v1:app", PYTHONPATH=here)
        skewed = c.add_gateway(
            SIGNOFF_APP="notes_v2:app", SIGNOFF_ALLOW_APP_SKEW="1", PYTHONPATH=here
        )
        assert "add_note differs" in skewed.output() and "allowed" in skewed.output()
