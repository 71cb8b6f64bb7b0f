"""The real ``durafn`` command, run as a subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def durafn(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durafn.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_migrate_creates_the_tables_and_is_idempotent(db_url: str) -> None:
    for _ in range(2):
        result = durafn("migrate", "--url", db_url)
        assert result.returncode == 0, result.stderr
        assert "durafn system tables are at version 1" in result.stdout


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://localhost/x", "runs on SQLite or PostgreSQL"),
        ("sqlite+aiosqlite:////nonexistent-dir/x.db", "'/nonexistent-dir' does not exist"),
    ],
)
def test_migrate_errors_are_one_clear_line(url: str, message: str) -> None:
    result = durafn("migrate", "--url", url)
    assert result.returncode == 1
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
