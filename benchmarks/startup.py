"""What a process pays before it does anything: the CPU time (user + system, from the
kernel's accounting of each child) of ``import durafn``, ``durafn --help``, a worker that
starts and exits on an empty SQLite file, and, for scale, of importing durafn's
dependencies alone and of ``python -c pass``.

    python -m benchmarks.startup [--runs 9] [--json PATH]

The commands run in turn, ``--runs`` rounds, so that the machine's drift falls on all of
them; the median of each is reported, with its ratio to the dependencies' import. Run
with the ``.pyc`` files in place (a first run writes them): with
``PYTHONDONTWRITEBYTECODE`` set, every process compiles the package again, 0.3 s more.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

APP = """
import durafn

app = durafn.App()


@app.mutation
async def touch(ctx: durafn.MutationCtx, n: int) -> int:
    return n
"""


def commands(directory: Path) -> dict[str, list[str]]:
    python = sys.executable
    url = f"sqlite:///{directory / 'empty.sqlite3'}"
    return {
        "import durafn": [python, "-c", "import durafn"],
        "durafn --help": [python, "-m", "durafn", "--help"],
        "worker: start and exit on empty SQLite": [
            *(python, "-m", "durafn", "worker", "--app", "startup_app:app"),
            *("--url", url, "--exit-on-complete", "--log-level", "WARNING"),
        ],
        "dependencies: sqlalchemy.ext.asyncio, aiosqlite, pydantic": [
            python,
            "-c",
            "import sqlalchemy.ext.asyncio, aiosqlite, pydantic",
        ],
        "python -c pass": [python, "-c", "pass"],
    }


def cpu_seconds(command: list[str], cwd: Path, env: dict[str, str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, cwd=cwd, env=env, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(runs: int) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        (directory / "startup_app.py").write_text(APP)
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{directory}"}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        todo = commands(directory)
        for command in todo.values():  # once first: the .pyc files, the SQLite file
            cpu_seconds(command, directory, env)
        seconds: dict[str, list[float]] = {name: [] for name in todo}
        for _ in range(runs):
            for name, command in todo.items():
                seconds[name].append(cpu_seconds(command, directory, env))
    base = statistics.median(seconds["dependencies: sqlalchemy.ext.asyncio, aiosqlite, pydantic"])
    return {
        name: {
            "median_s": round(statistics.median(values), 3),
            "min_s": round(min(values), 3),
            "of_dependencies": round(statistics.median(values) / base, 2),
        }
        for name, values in seconds.items()
    }


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = measure(args.runs)
    for name, figures in results.items():
        print(
            f"{figures['median_s']:6.3f} s CPU (min {figures['min_s']:.3f}, "
            f"{figures['of_dependencies']:.2f}x the dependencies)  {name}"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    cli()
