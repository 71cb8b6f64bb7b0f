"""The test kit's fixture overhead: what ``durafn_app`` adds to each test, on each engine.

A throwaway project with ``--tests`` async tests is run by pytest in a subprocess, once
with each test taking ``durafn_app`` (and reading the empty table: the app's first
connection is part of what a test pays) and once with the same tests taking nothing,
alternating ``--rounds`` times; the overhead is the difference of the median wall times
divided by the number of tests. Run: ``python -m benchmarks.testkit``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PG_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/durafn_testkit_bench"

WITH_APP = """
import pytest

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("n", range({tests}))
async def test_one(durafn_app, n):
    assert (await durafn_app.list()).items == []
"""

WITHOUT = """
import pytest

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("n", range({tests}))
async def test_one(n):
    assert n >= 0
"""


def _run(folder: Path, *args: str) -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=folder,
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - started


def measure(tests: int, rounds: int, engines: list[str]) -> dict[str, float]:
    """Milliseconds of overhead per test, by engine."""
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "test_with.py").write_text(WITH_APP.format(tests=tests))
        (folder / "test_without.py").write_text(WITHOUT.format(tests=tests))
        for engine in engines:
            extra = [f"--durafn-url={PG_URL}"] if engine == "postgres" else []
            _run(folder, "test_with.py", *extra)  # warm: the PostgreSQL database made
            with_app: list[float] = []
            without: list[float] = []
            for _ in range(rounds):
                with_app.append(_run(folder, "test_with.py", *extra))
                without.append(_run(folder, "test_without.py", *extra))
            per_test = (statistics.median(with_app) - statistics.median(without)) / tests
            out[engine] = per_test * 1000
            print(
                f"{engine}: {per_test * 1000:.1f} ms per test "
                f"(medians of {rounds}: {statistics.median(with_app):.2f} s with durafn_app, "
                f"{statistics.median(without):.2f} s without, {tests} tests)"
            )
    return out


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--engines", default="sqlite,postgres")
    args = parser.parse_args()
    measure(args.tests, args.rounds, args.engines.split(","))


if __name__ == "__main__":
    cli()
