"""store/queries.sql: named statements, loaded by store/queries.py; its generated blocks
(the one-statement card transitions) are what scripts/generate_queries.py writes."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import generate_queries as gen
from signoff.store import queries

SQL_FILE = Path(queries.__file__).resolve().parent / "queries.sql"


def test_the_checked_in_file_is_what_the_generator_writes() -> None:
    text = SQL_FILE.read_text()
    assert gen.render(text) == text, "run scripts/generate_queries.py"


def test_the_check_fails_on_a_stale_file(tmp_path: Path) -> None:
    stale = tmp_path / "queries.sql"
    stale.write_text(SQL_FILE.read_text().replace("'system:expiry'", "'clock'", 1))
    script = Path(gen.__file__)
    check = [sys.executable, str(script), "--check", "--file", str(stale)]
    result = subprocess.run(check, capture_output=True, text=True, check=False)
    assert result.returncode == 1
    assert "is not current" in result.stderr and "'system:expiry'" in result.stderr
    subprocess.run([sys.executable, str(script), "--file", str(stale)], check=True)
    assert stale.read_text() == SQL_FILE.read_text()


def test_every_generated_statement_is_in_the_file_and_marked() -> None:
    text = SQL_FILE.read_text()
    for name in gen.GENERATED:
        assert f"-- name: {name}\n{gen.MARK}\n" in text
    assert text.count(gen.MARK) == len(gen.GENERATED)


def test_every_statement_is_loaded_by_name() -> None:
    names = {f.name for f in dataclasses.fields(queries.Queries)}
    parsed = queries.parse(SQL_FILE.read_text())
    assert parsed.keys() == names
    for name, statement in parsed.items():
        assert statement == getattr(queries.SQL, name)
        assert not statement.endswith(";") and not statement.startswith("--"), name


def test_a_block_without_its_semicolon_or_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="does not end"):
        queries.parse("-- name: a\nSELECT 1\n")
    with pytest.raises(ValueError, match="twice"):
        queries.parse("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n")
    with pytest.raises(ValueError, match="missing"):
        queries.load("-- name: ping\nSELECT 1;\n")


def test_comments_around_a_statement_are_dropped_inside_kept() -> None:
    text = "-- top\n-- name: a\n-- what a does\nSELECT 1 -- one\n  + 1;\n\n-- == next ==\n"
    assert queries.parse(text) == {"a": "SELECT 1 -- one\n  + 1"}
