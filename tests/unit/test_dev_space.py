"""Each app `signoff dev` serves has its own database and key prefix (runtime/dev.py)."""

from __future__ import annotations

from signoff.runtime.dev import DEMO_APP, app_space


def test_the_demo_keeps_the_first_database_and_prefix() -> None:
    assert app_space(None, "payments") == ("signoff", None)
    assert app_space("", "payments") == ("signoff", None)  # no --app: the demo
    assert app_space(DEMO_APP, "payments") == ("signoff", None)


def test_every_other_app_has_its_own_and_names_never_collide() -> None:
    assert app_space("examples.helpdesk:app", "helpdesk") == ("signoff_helpdesk", "so:helpdesk:")
    # an app of one's own that is also called "payments" is not the demo
    assert app_space("mine:app", "payments") == ("signoff_payments", "so:payments:")
    spaces = {app_space("x:app", n) for n in ("help_desk", "Help Desk", "help-desk", "HELP_DESK")}
    assert len(spaces) == 4, spaces
    for database, prefix in spaces:
        assert database.startswith("signoff_help_desk") and len(database) <= 63
        assert prefix is not None and prefix.startswith("so:help_desk")
    long, _ = app_space("x:app", "é" * 200)
    assert len(long.encode()) <= 63
