"""``signoff clean``: the data folder and the cluster it relocated, only those, never
while a ``signoff dev`` uses them."""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from signoff import embedded
from signoff.runtime.cli import main
from signoff.runtime.cli_clean import DevRunning, places
from signoff.runtime.cli_ops import DevRecord


@pytest.fixture
def relocated(tmp_path: Path) -> Iterator[Path]:
    """The cluster folder signoff would make under /var/tmp for ``tmp_path/.signoff`` when
    run as root (its name is the digest of the folder's ``embedded``), removed after."""
    embedded = tmp_path / ".signoff" / "embedded"
    digest = hashlib.sha256(str(embedded.resolve()).encode()).hexdigest()[:12]
    home = Path("/var/tmp") / f"signoff-pg-{digest}"
    (home / "pg").mkdir(parents=True)
    (home / "pg" / "PG_VERSION").write_text("18\n")
    yield home
    shutil.rmtree(home, ignore_errors=True)


def _data_folder(tmp_path: Path, home: Path | None) -> Path:
    folder = tmp_path / ".signoff"
    (folder / "embedded").mkdir(parents=True)
    (folder / "secret").write_text("x" * 40)
    (folder / "embedded" / "pg.password").write_text("pw")
    if home is not None:
        (folder / "embedded" / "pg.location").write_text(f"{home}\n")
    (folder / "audit").mkdir()
    (folder / "audit" / "demo-2026-12-01.jsonl").write_text("{}\n")
    return folder


def test_clean_removes_the_folder_and_the_cluster_it_names(
    tmp_path: Path, relocated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _data_folder(tmp_path, relocated)
    assert main(["clean", "--data-dir", str(folder), "--yes"]) == 0
    out = capsys.readouterr().out
    assert str(folder) in out and str(relocated) in out and "1 audit archive file" in out
    assert not folder.exists() and not relocated.exists()
    assert tmp_path.exists()


def test_clean_without_yes_and_no_terminal_removes_nothing(
    tmp_path: Path, relocated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _data_folder(tmp_path, relocated)
    assert main(["clean", "--data-dir", str(folder)]) == 1  # pytest's stdin is no terminal
    assert "--yes" in capsys.readouterr().err
    assert (folder / "secret").is_file() and (relocated / "pg" / "PG_VERSION").is_file()


def test_clean_refuses_a_folder_holding_other_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "pyproject.toml").write_text("[project]\n")
    (tmp_path / "secret").write_text("x" * 40)
    assert main(["clean", "--data-dir", str(tmp_path), "--yes"]) == 1
    assert "pyproject.toml" in capsys.readouterr().err
    assert (tmp_path / "pyproject.toml").is_file() and (tmp_path / "secret").is_file()


def test_clean_refuses_while_a_dev_records_itself_on_the_folder(
    tmp_path: Path, relocated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _data_folder(tmp_path, relocated)
    record = DevRecord(pid=os.getpid(), database_url="postgresql://x/y", url="http://h:1")
    (folder / "dev.json").write_bytes(msgspec.json.encode(record))
    (folder / "dev.json").chmod(0o600)  # as signoff dev writes it
    assert main(["clean", "--data-dir", str(folder), "--yes"]) == 1
    assert "stop it first" in capsys.readouterr().err
    assert (folder / "dev.json").is_file() and relocated.exists()


def test_clean_refuses_while_the_folders_postgres_runs(tmp_path: Path) -> None:
    """A Postgres still running the cluster (no dev.json: e.g. started by a test or a
    dev whose record went) is seen from its postmaster.pid."""
    folder = tmp_path / ".signoff"
    pg = embedded.start_postgres(folder / "embedded")
    try:
        with pytest.raises(DevRunning, match=str(pg.pid)):
            places(folder)
        assert main(["clean", "--data-dir", str(folder), "--yes"]) == 1
        assert pg.running and (folder / "embedded" / "pg.password").is_file()
    finally:
        pg.stop()
    home = embedded.postgres.relocated_home(folder / "embedded")
    assert main(["clean", "--data-dir", str(folder), "--yes"]) == 0
    assert not folder.exists() and (home is None or not home.exists())


def test_clean_of_a_missing_folder_says_so(tmp_path: Path) -> None:
    assert main(["clean", "--data-dir", str(tmp_path / "none"), "--yes"]) == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="cluster folders under /var/tmp are root's")
def test_a_location_naming_another_folders_cluster_is_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A review: `pg.location` was trusted, so a copied checkout's (naming the original's
    cluster) or one walking out of /var/tmp had that folder removed."""
    others = [Path("/var/tmp") / f"signoff-pg-other{secrets.token_hex(4)}"]
    outside = tmp_path / "elsewhere" / f"signoff-pg-{secrets.token_hex(4)}"
    try:
        for i, home in enumerate([*others, Path(f"/var/tmp/../..{outside}")]):
            real = Path(os.path.normpath(home))
            (real / "pg").mkdir(parents=True)
            folder = _data_folder(tmp_path / f"copy{i}", home)
            assert main(["clean", "--data-dir", str(folder), "--yes"]) == 0
            assert "left alone" in capsys.readouterr().out
            assert not folder.exists() and (real / "pg").is_dir(), home
    finally:
        for home in [*others, outside]:
            shutil.rmtree(home, ignore_errors=True)
