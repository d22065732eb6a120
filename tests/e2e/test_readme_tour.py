"""The README's curl tour, run as printed against a started ``signoff dev --port <free>``
(issue 17): the commands are read from README.md, not copied here, so a tour that
drifts from the API fails this test."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from signoff.embedded import free_port, remove_data
from tests.e2e.test_dev import Dev

pytestmark = pytest.mark.timeout(180)

README = Path(__file__).resolve().parents[2] / "README.md"


def tour_blocks() -> list[str]:
    """The ```bash blocks of the README's "Five-minute tour (curl)" section."""
    text = README.read_text()
    start = text.index("## Five-minute tour (curl)")
    end = text.index("\n## ", start + 1)
    return re.findall(r"```bash\n(.*?)```", text[start:end], re.S)


@pytest.fixture
def started(tmp_path: Path) -> Iterator[tuple[Dev, Path]]:
    # The folder the reader works in: dev's data in ./.signoff, where `signoff token` looks.
    d = Dev(tmp_path / ".signoff", free_port())
    yield d, tmp_path
    d.kill(signal.SIGTERM)
    remove_data(d.data_dir / "embedded")


def test_the_readme_curl_tour_runs_as_printed(started: tuple[Dev, Path]) -> None:
    dev, folder = started
    start, tour = tour_blocks()
    # The first block is how the reader starts signoff: on a port they choose.
    assert start.strip() == "signoff dev --port 8765"
    dev.start(cwd=folder)
    assert "token:" in dev.output
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "signoff").exists(), "the tour calls the `signoff` console script"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SIGNOFF_", "ANTHROPIC"))}
    env.update(P=str(dev.port), PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}")
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", tour],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    out = done.stdout
    assert done.returncode == 0, f"stdout:\n{out}\nstderr:\n{done.stderr}"
    lines = out.splitlines()
    summary = "Gerar cobrança Pix · Cliente: João Silva (CPF ***.123.456-**) · Valor: R$ "
    expected = [
        r'\{"accepted":true,"delivery":"[^"]+"\}',  # 1. the message
        re.escape(summary + "150,00"),  # the card, as the tool wrote it
        re.escape(f"('modified', '{summary}200,00')"),  # 2. edit: a new card
        "rejected",  # 3.
        r'\{"accepted":true,"delivery":"[^"]+"\}',
        "approved",  # 4. at once; then, later:
        r"\('executed', \{'amount': 15000, 'charge_id': 'pix-\d+', 'copy_paste': '\w+'\}\)",
        r'\{"accepted":true,"delivery":"[^"]+"\}',
        re.escape("[(True, True), (False, True)]"),  # 5. one result per card
        re.escape("['pending', 'approved', 'executing', 'executed']"),  # 6. the audit trail
        r"\[.*'card', 'card_update'.*'user'\]",
        "True",
    ]
    assert len(lines) == len(expected), out
    for line, pattern in zip(lines, expected, strict=True):
        assert re.fullmatch(pattern, line), (pattern, line, out)
