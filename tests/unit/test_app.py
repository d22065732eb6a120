"""Apps: loading one by ``module:attribute``, fingerprints and the presence check's rules,
card lifetimes set by policy, the demo's configuration, the generic offline model."""

from __future__ import annotations

import asyncio
import json
import secrets
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import pytest

import signoff
from signoff import (
    App,
    AppLoadError,
    AppMismatch,
    ConfigError,
    Policy,
    Prepared,
    Registry,
    Risk,
    Rule,
    Tool,
    ToolContext,
    Verdict,
)
from signoff.demo import CARD_TTL_ENV
from signoff.demo import app as demo_app
from signoff.runtime.app import load_app
from signoff.runtime.models.command import CommandModel, parse_command
from signoff.runtime.presence import AppProcess, check_peers, describe, differences


class NoteIn(msgspec.Struct):
    text: str


class AddNote(Tool):
    name = "add_note"
    description = "Add a note."
    risk = Risk.REVERSIBLE
    input_type: ClassVar[type[msgspec.Struct]] = NoteIn

    async def prepare(self, data: NoteIn, ctx: ToolContext) -> Prepared:
        return Prepared(args={"text": data.text}, summary="Add a note", impact={})


class NoteInV2(msgspec.Struct):
    text: str
    pinned: bool = False


class AddNoteV2(AddNote):
    input_type = NoteInV2


class Wipe(AddNote):
    name = "wipe"
    risk = Risk.CRITICAL


# -- load_app ---------------------------------------------------------------------------


@pytest.fixture
def app_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, str]]:
    """A folder with a fresh module name, the current directory (as for `signoff dev`)."""
    name = "userapp_" + secrets.token_hex(4)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield tmp_path, name
    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        del sys.modules[key]


def _write(folder: Path, name: str, body: str) -> None:
    (folder / f"{name}.py").write_text(
        "from signoff import App, Registry\nfrom tests.unit.test_app import AddNote\n" + body,
        encoding="utf-8",
    )


def test_load_app_takes_an_app_or_a_factory_from_the_current_directory(
    app_dir: tuple[Path, str],
) -> None:
    folder, name = app_dir
    _write(
        folder,
        name,
        "app = App(name='notes', tools=Registry([AddNote()]))\n"
        "def make() -> App:\n    return App(name='made', tools=Registry([AddNote()]))\n"
        "class Holder:\n    inner = app\n",
    )
    assert load_app(f"{name}:app").name == "notes"
    assert load_app(f"{name}:make").name == "made"
    assert load_app(f"{name}:Holder.inner").name == "notes"


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("no_colon", "expected module:attribute"),
        ("{mod}:", "expected module:attribute"),
        ("not_a_module_{hex}:app", "no module named 'not_a_module_"),
        ("{mod}:missing", "has no attribute 'missing'"),
        ("{mod}:TEXT", "TEXT is a str, not a signoff App"),
        ("{mod}:App", "App is a type, not a signoff App"),
        ("{mod}:wrong", "wrong() returned a int, not a signoff App"),
        ("{mod}:needs_args", "calling needs_args() failed: TypeError"),
        ("{mod}_broken:app", "importing {mod}_broken failed: ZeroDivisionError"),
        ("{mod}_dep:app", "importing {mod}_dep failed: No module named 'a_missing_dependency'"),
    ],
)
def test_a_bad_app_is_a_typed_error_saying_what_is_wrong(
    app_dir: tuple[Path, str], spec: str, says: str
) -> None:
    folder, name = app_dir
    _write(folder, name, "TEXT = 'x'\ndef wrong() -> int:\n    return 1\n")
    (folder / f"{name}.py").write_text(
        (folder / f"{name}.py").read_text() + "def needs_args(x: int) -> App: ...\n"
    )
    (folder / f"{name}_broken.py").write_text("1 / 0\n")
    (folder / f"{name}_dep.py").write_text("import a_missing_dependency\n")
    hex_ = secrets.token_hex(3)
    with pytest.raises(AppLoadError) as caught:
        load_app(spec.format(mod=name, hex=hex_))
    assert says.format(mod=name) in caught.value.message
    assert isinstance(caught.value, ConfigError) and caught.value.code == "app_load"


def test_the_demo_is_an_app_attribute_like_any_other() -> None:
    app = load_app("signoff.demo:app")
    assert app.name == "payments" and app.offline_model is not None


# -- fingerprints and the presence rules -------------------------------------------------


def test_fingerprint_follows_schemas_risk_and_editable_fields_not_descriptions() -> None:
    base = App(name="notes", tools=Registry([AddNote()]))
    same = App(name="notes", tools=Registry([AddNote()]))
    assert base.fingerprint() == same.fingerprint()

    class Described(AddNote):
        description = "Another description."
        ttl = timedelta(seconds=5)

    assert App(name="notes", tools=Registry([Described()])).fingerprint() == base.fingerprint()

    class Editable(AddNote):
        editable = frozenset({"text"})

    class Critical(AddNote):
        risk = Risk.CRITICAL

    for other in (AddNoteV2(), Editable(), Critical()):
        changed = App(name="notes", tools=Registry([other]))
        assert changed.fingerprint() != base.fingerprint(), other
        assert changed.tool_fingerprints()["add_note"] != base.tool_fingerprints()["add_note"]
    assert App(name="other", tools=Registry([AddNote()])).fingerprint() != base.fingerprint()
    assert App(name="notes", tools=Registry([AddNote(), Wipe()])).fingerprint() != (
        base.fingerprint()
    )


def _proc(pid: str, app: App, roles: tuple[str, ...] = ("worker",)) -> AppProcess:
    return describe(app, pid, list(roles))


def test_a_live_process_of_another_version_refuses_the_start_unless_skew_is_allowed() -> None:
    v1 = App(name="notes", tools=Registry([AddNote(), Wipe()]))
    v2 = App(name="notes", tools=Registry([AddNoteV2()]))
    me = _proc("gw-new", v2, ("gateway",))
    assert check_peers(me, [_proc("w-a", v2)], allow_skew=False) == []
    with pytest.raises(AppMismatch) as caught:
        check_peers(me, [_proc("w-old", v1)], allow_skew=False)
    text = caught.value.message
    assert "worker w-old: add_note differs, wipe only there" in text
    assert "SIGNOFF_ALLOW_APP_SKEW" in text
    (warning,) = check_peers(me, [_proc("w-old", v1)], allow_skew=True)
    assert "add_note differs" in warning and "allowed" in warning


def test_other_apps_on_the_database_are_a_warning() -> None:
    notes = App(name="notes", tools=Registry([AddNote()]))
    other = App(name="billing", tools=Registry([Wipe()]))
    (warning,) = check_peers(_proc("a", notes), [_proc("b", other)], allow_skew=False)
    assert "billing" in warning and "own database" in warning
    assert differences({"a": "1", "b": "2"}, {"b": "3", "c": "4"}) == [
        "b differs",
        "a only here",
        "c only there",
    ]


# -- card lifetimes ------------------------------------------------------------------------


def test_a_rule_may_set_the_card_ttl_the_shortest_matching_wins() -> None:
    note, wipe = AddNote(), Wipe()
    policy = Policy(
        [
            Rule(Verdict.ASK, tool="add_note", ttl=timedelta(minutes=30)),
            Rule(Verdict.ASK, risk=Risk.CRITICAL, tenant="acme", ttl=timedelta(minutes=2)),
            Rule(Verdict.ASK, tenant="acme", ttl=timedelta(minutes=5)),
        ]
    )
    # the tool's own ttl when no matching rule sets one
    assert policy.evaluate(wipe, {}, tenant="other").card_ttl(wipe) == wipe.ttl
    assert policy.evaluate(note, {}, tenant="other").card_ttl(note) == timedelta(minutes=30)
    # the critical tier is shorter for acme; the other rules still match
    assert policy.evaluate(wipe, {}, tenant="acme").card_ttl(wipe) == timedelta(minutes=2)
    assert policy.evaluate(note, {}, tenant="acme").card_ttl(note) == timedelta(minutes=5)
    with pytest.raises(ConfigError):
        Rule(Verdict.ASK, ttl=timedelta(0))


def test_the_demo_card_ttl_is_configured_by_its_environment() -> None:
    default = demo_app({})
    tool = default.tools.get("create_pix_charge")
    assert tool is not None
    assert default.policy.evaluate(tool, {}, tenant="demo").card_ttl(tool) == tool.ttl
    short = demo_app({CARD_TTL_ENV: "20"})
    for t in short.tools:
        if t.is_write:
            outcome = short.policy.evaluate(t, {"amount_cents": 100}, tenant="demo")
            assert outcome.card_ttl(t) == timedelta(seconds=20), t.name
    for bad in ("0", "-3", "soon"):
        with pytest.raises(ConfigError, match=CARD_TTL_ENV):
            demo_app({CARD_TTL_ENV: bad})


# -- the public API and the generic offline model -------------------------------------------


def test_the_public_api_lists_what_an_app_needs() -> None:
    for name in ("Tool", "App", "Policy", "Rule", "Risk", "Model", "ModelReply", "UnknownTool"):
        assert name in signoff.__all__ and hasattr(signoff, name)
    assert sorted(signoff.__all__) == signoff.__all__


def test_commands_become_tool_calls() -> None:
    assert parse_command('/add_note text="two words" n=3 ok=true') == (
        "add_note",
        {"text": "two words", "n": 3, "ok": True},
    )
    assert parse_command('/add_note {"text": "x"}') == ("add_note", {"text": "x"})
    for line in ("hello", "/", "/add_note text", "/add_note {bad", '/x "unclosed'):
        assert parse_command(line) is None
    model = CommandModel()
    tools = Registry([AddNote()]).specs()

    def ask(text: str) -> signoff.ModelReply:
        messages = [{"role": "user", "content": [{"type": "text", "text": text}]}]
        return asyncio.run(model.respond(system="", messages=messages, tools=tools))

    (use,) = ask("/add_note text=hi").tool_uses()
    assert use["name"] == "add_note" and use["input"] == {"text": "hi"}
    help_text = ask("what can you do?").text()
    assert "/add_note text=…" in help_text and "ANTHROPIC_API_KEY" in help_text
    assert ask("/unknown_tool a=1").tool_uses() == []


def test_the_command_model_says_a_result_in_words_not_raw_json() -> None:
    """After a card ran, the generic offline model says what happened as a line a person
    reads (status, the card, ``key: value`` pairs), not the tool result's JSON."""
    model = CommandModel()
    executed = {
        "status": "executed",
        "card": "Confirmation card shown to the user: «Add a note».",
        "result": {"note_id": "N7", "text": "hi"},
    }
    result = {"type": "tool_result", "tool_use_id": "t1", "content": json.dumps(executed)}
    messages = [{"role": "user", "content": [result]}]
    said = asyncio.run(model.respond(system="", messages=messages, tools=[])).text()
    assert said == (
        "[offline model] Tool result: Executed — Confirmation card shown to the user: "
        "«Add a note». note_id: N7 · text: hi"
    )
    plain = {**result, "content": "The user REJECTED it; nothing was executed."}
    messages = [{"role": "user", "content": [plain]}]
    said = asyncio.run(model.respond(system="", messages=messages, tools=[])).text()
    assert said.endswith("Tool result: The user REJECTED it; nothing was executed.")


def test_the_command_model_says_why_a_command_was_not_one() -> None:
    """The newcomer probe: `/add_note text=two words` (unquoted) got only the generic
    help, and an app without tools got "e.g.:" followed by nothing."""
    model = CommandModel()
    tools = Registry([AddNote()]).specs()

    def ask(text: str, specs: list[Any]) -> str:
        messages = [{"role": "user", "content": [{"type": "text", "text": text}]}]
        return asyncio.run(model.respond(system="", messages=messages, tools=specs)).text()

    assert 'quoting values with spaces (title="Buy milk")' in ask("/add_note text", tools)
    assert "There is no tool 'nope'" in ask("/nope a=1", tools)
    assert ask("hello", []).endswith("This app has no tools to call as commands.")
