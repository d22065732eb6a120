"""Secret files: mode 0600 from creation, one value under races, refused when exposed."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from signoff.runtime.errors import ConfigError
from signoff.runtime.secret_file import read_or_create, read_secret


def test_created_with_mode_600_whatever_the_umask(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    old_umask = os.umask(0)
    try:
        value, created = read_or_create(path)
    finally:
        os.umask(old_umask)
    assert created and len(value) >= 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_or_create(path) == (value, False)
    assert read_secret(path) == value
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret"]  # no staging file left


def test_concurrent_creators_agree_on_one_value(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    results: list[tuple[str, bool]] = []
    start = threading.Barrier(8)

    def create() -> None:
        start.wait()
        results.append(read_or_create(path))

    threads = [threading.Thread(target=create) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({value for value, _ in results}) == 1
    assert [created for _, created in results].count(True) == 1


def test_exposed_empty_or_linked_secrets_are_refused(tmp_path: Path) -> None:
    exposed = tmp_path / "exposed"
    exposed.write_text("a-secret-someone-else-could-read\n")
    exposed.chmod(0o640)
    with pytest.raises(ConfigError, match="readable by others"):
        read_or_create(exposed)
    empty = tmp_path / "empty"
    empty.touch(mode=0o600)
    with pytest.raises(ConfigError, match="empty"):
        read_secret(empty)
    link = tmp_path / "link"
    link.symlink_to(exposed)
    with pytest.raises(ConfigError, match="symbolic link"):
        read_secret(link)
    with pytest.raises(FileNotFoundError):
        read_secret(tmp_path / "missing")
