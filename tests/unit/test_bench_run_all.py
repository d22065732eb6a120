"""bench/run_all.py keeps the committed figures: only a full run into bench/results that
failed nowhere regenerates the README tables (a newcomer's `--quick` smoke run on a busy
machine replaced the README's floor, and a run that failed at its first import still
rewrote bench/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import report, run_all
from bench.common import ROOT

READMES = (ROOT / "README.md", ROOT / "bench" / "README.md")


def texts() -> list[str]:
    return [p.read_text() for p in READMES]


@pytest.fixture(autouse=True)
def _extras_present(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test run installs `.[test]` only: the bench's extras are taken as present
    (the test of their absence sets its own)."""
    monkeypatch.setattr(run_all, "BENCH_MODULES", ())


@pytest.mark.parametrize("extra", [["--quick"], []])
def test_a_run_into_another_folder_leaves_the_readmes(extra: list[str], tmp_path: Path) -> None:
    before = texts()
    assert run_all.main([*extra, "--only", "no-such-script", "--out", str(tmp_path)]) == 0
    assert texts() == before
    assert json.loads((tmp_path / "run_all.json").read_text())["failed"] == []
    assert (tmp_path / "summary.json").exists()


def test_a_quick_run_writes_to_its_own_folder_by_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(run_all, "RESULTS", tmp_path)
    seen: list[tuple[Path, object]] = []

    def write(out: Path, readme: Path | None = report.README) -> dict[str, object]:
        seen.append((out, readme))
        return {}

    monkeypatch.setattr("subprocess.run", lambda *a, **k: pytest.fail("ran a script"))
    monkeypatch.setattr(report, "write", write)
    assert run_all.main(["--quick", "--only", "no-such-script"]) == 0
    assert seen == [(tmp_path / "quick", None)]


def test_missing_bench_extras_are_named_before_anything_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr(run_all, "BENCH_MODULES", ("no_such_module_xyz",))
    before = texts()
    assert run_all.main(["--out", str(tmp_path)]) == 2
    assert "pip install -e '.[test,bench]'" in capsys.readouterr().err
    assert texts() == before and not (tmp_path / "run_all.json").exists()
