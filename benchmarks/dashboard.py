"""The dashboard's page times with 10⁶ rows in ``_scheduled_functions``, on each engine;
and an executor's drain with the dashboard open, against without it (``--drain``).

The rows are written by one ``INSERT ... SELECT`` (90% Success, 5% Failed, 4% Pending,
1% Canceled; 20 function names; a tenth in 50 queues; one ending every second, so 10^6
rows are 11.6 days of them), and rolled up once as the executor's maintenance would
(``_durafn_rollups``: the last 7 days, what the charts and function pages read; the
dashboard's clock is set two minutes after the last row ended). Each page is then loaded
``--loads`` times through the dashboard's ASGI app in this process (no network: what is
measured is the page's own work, its queries first) and its median and p95 reported.
Run: ``python -m benchmarks.dashboard [--rows 1000000] [--loads 50]``.

``--drain N``: ``durafn dashboard`` in a process of its own, with a browser's load
simulated (the overview's live counts streamed, and the overview itself loaded once a
second), while one executor drains N no-op mutations; drains with and without it
alternate ``--rounds`` times, and the ratio of the medians is reported.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import anyio
import httpx2
from sqlalchemy import text

import durafn
from durafn._executor.rollups import RollUps
from durafn.testing import FakeClock

from . import throughput

T0 = 1_900_000_000.0

_STATE = (
    "CASE WHEN {g} % 100 < 90 THEN 'Success' WHEN {g} % 100 < 95 THEN 'Failed' "
    "WHEN {g} % 100 < 99 THEN 'Pending' ELSE 'Canceled' END"
)
_ENDED = "CASE WHEN {g} % 100 < 95 OR {g} % 100 = 99 THEN {t0} + {g} + 1 END"
_STARTED = "CASE WHEN {g} % 100 < 95 THEN {t0} + {g} + ({g} % 7) * 0.1 END"
_QUEUE = "CASE WHEN {g} % 10 = 0 THEN 'q' || ({g} % 50) END"
_COLUMNS = (
    "id, name, kind, args, state, scheduled_time, available_at, completed_time, attempts, "
    "priority, queue_name, started_time"
)

POSTGRES_FILL = f"""
INSERT INTO _scheduled_functions ({_COLUMNS})
SELECT gen_random_uuid(), 'bench:f' || (g % 20), 'mutation', '{{"n": ' || g || '}}',
       {_STATE.format(g="g")}, {T0} + g, {T0} + g + 3600, {_ENDED.format(g="g", t0=T0)},
       1, 0, {_QUEUE.format(g="g")}, {_STARTED.format(g="g", t0=T0)}
FROM generate_series(1, :n) AS g
"""

SQLITE_FILL = f"""
WITH RECURSIVE g(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM g WHERE x < :n)
INSERT INTO _scheduled_functions ({_COLUMNS}, seq)
SELECT lower(substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-7' || substr(h, 14, 3) || '-8'
             || substr(h, 18, 3) || '-' || substr(h, 21, 12)),
       'bench:f' || (x % 20), 'mutation', '{{"n": ' || x || '}}',
       {_STATE.format(g="x")}, {T0} + x, {T0} + x + 3600, {_ENDED.format(g="x", t0=T0)},
       1, 0, {_QUEUE.format(g="x")}, {_STARTED.format(g="x", t0=T0)}, x
FROM (SELECT x, hex(randomblob(16)) AS h FROM g)
"""

PAGES = [
    "/",
    "/rows",
    "/rows?state=Failed",
    "/rows?name=bench:f7",
    "/rows?queue=q30",
    "/rows?state=Pending&queue=q10",
    "/rows?arg=n%3D777",
    "/rows?state=Failed&arg=n~5",
    "/rows/cancel-matching?queue=q30",
    "/rows/retry-matching?name=bench:f7",
    "{row}",
    "/crons",
    "/queues",
    "/workers",
    "/failures",
    "/operations",
    "/search?q=777",
    "/search?q={row}",
    "/charts",
    "/charts?range=day",
    "/charts?range=week",
    "/charts?range=week&name=bench:f7",
    "/charts?range=day&queue=q30",
    "/functions/bench:f7",
    "/functions/bench:f7?range=week",
]


async def measure(engine: str, rows: int, loads: int) -> dict[str, tuple[float, float]]:
    """Page -> (median, p95) in ms."""
    with tempfile.TemporaryDirectory() as tmp:
        url = await throughput.fresh_url(engine, tmp, "dashboard")
        # The clock two minutes after the last row ended: the charts' hour, day and week
        # are the synthetic rows' last ones (a row ends every second).
        clock = FakeClock(T0 + rows + 120)
        app = durafn.App(url, clock=clock)
        await app.migrate()
        started = time.perf_counter()
        async with app.engine.begin() as conn:
            fill = POSTGRES_FILL if engine != "sqlite" else SQLITE_FILL
            await conn.execute(text(fill), {"n": rows})
        async with app.engine.begin() as conn:
            await conn.execute(text("ANALYZE"))
        print(f"{engine}: {rows:,} rows written in {time.perf_counter() - started:.1f} s")
        # The rollups of the charts and function pages: the maintenance pass's step, once
        # (retention itself is left out: it would delete the rows older than 7 days).
        started = time.perf_counter()
        groups = await RollUps(app._rt).run_once(clock.now(), keep=7 * 86400)
        print(f"  rollups: {groups:,} groups written in {time.perf_counter() - started:.1f} s")
        some = (await app.list(limit=1, state=durafn.State.FAILED)).items[0]
        transport = httpx2.ASGITransport(app=app.dashboard())
        out: dict[str, tuple[float, float]] = {}
        async with httpx2.AsyncClient(transport=transport, base_url="http://localhost") as web:
            for page in PAGES:
                path = f"/rows/{some.id}" if page == "{row}" else page.replace("{row}", some.id)
                times: list[float] = []
                for _ in range(loads):
                    t = time.perf_counter()
                    answer = await web.get(path)
                    times.append((time.perf_counter() - t) * 1000)
                    assert answer.status_code in (200, 303), (path, answer.status_code)
                times.sort()
                p95 = times[max(0, int(len(times) * 0.95) - 1)]
                out[page] = (statistics.median(times), p95)
                print(f"  {page:32} median {out[page][0]:7.1f} ms  p95 {p95:7.1f} ms")
        await _operation(app)
        await app.aclose()
    return out


async def _operation(app: durafn.App) -> None:
    """An operation over the whole table (the Pending rows of one function canceled: 1% of
    the table): its pages, each a transaction reading at most 5,000 rows of the primary
    key and changing at most 500."""
    started = time.perf_counter()
    op = await app.start_operation("cancel", who="bench", name="bench:f15")
    counted = time.perf_counter()
    pages: list[float] = []
    while op.state == "Running":
        t = time.perf_counter()
        op = await app.run_operation(op.id, pages=1)
        pages.append((time.perf_counter() - t) * 1000)
    pages.sort()
    print(
        f"  operation: {op.done:,} rows canceled of {op.scanned:,} read; started (counted) in "
        f"{(counted - started) * 1000:.0f} ms; {len(pages)} pages, median "
        f"{statistics.median(pages):.1f} ms, max {pages[-1]:.1f} ms; "
        f"{time.perf_counter() - counted:.1f} s in all"
    )


async def drain_with_page(engine: str, n: int, rounds: int) -> float:
    """The median drain rate with the dashboard open, over the median without it."""
    rates: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(rounds):
            for open_page in (False, True):
                url = await throughput.fresh_url(engine, tmp, f"drain-{i}-{open_page}")
                app = durafn.App(url)
                await app.migrate()
                await app.aclose()
                server = _serve(url) if open_page else None
                try:
                    async with anyio.create_task_group() as tg:
                        if server is not None:
                            watching = anyio.Event()
                            tg.start_soon(_look, server[1], watching)
                            await watching.wait()  # the page is open before the drain
                        result = await throughput.drain(url, n)
                        tg.cancel_scope.cancel()
                finally:
                    if server is not None:
                        server[0].kill()
                        server[0].wait()
                rates[open_page].append(float(result["drained_per_s"] or 0.0))
    ratio = statistics.median(rates[True]) / statistics.median(rates[False])
    print(
        f"{engine}: drain with the dashboard open {ratio:.2f}x of without "
        f"(rows/s, open: {[round(r) for r in rates[True]]}, closed: "
        f"{[round(r) for r in rates[False]]})"
    )
    return ratio


def _serve(url: str) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "_durafn_cli", "dashboard", "--url", url]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DURAFN_")}
    proc = subprocess.Popen([*command, "--port", str(port)], env=env)
    return proc, f"http://127.0.0.1:{port}"


async def _look(base: str, watching: anyio.Event) -> None:
    """A browser on the overview: its live counts streamed, the page loaded each second
    (``watching`` is set at the stream's first event)."""
    async with httpx2.AsyncClient(base_url=base, timeout=None) as web:
        while True:  # until the server answers
            try:
                await web.get("/login")
                break
            except httpx2.TransportError:
                await anyio.sleep(0.05)

        async def stream() -> None:
            async with web.stream("GET", "/events/counts") as events:
                async for _ in events.aiter_lines():
                    watching.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(stream)
            while True:
                await web.get("/")
                await anyio.sleep(1.0)


async def main(engines: list[str], rows: int, loads: int, drain: int | None, rounds: int) -> None:
    results: dict[str, Any] = {}
    for engine in engines:
        if drain:
            results[engine] = await drain_with_page(engine, drain, rounds)
        else:
            results[engine] = await measure(engine, rows, loads)


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="sqlite,postgres")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--loads", type=int, default=50)
    parser.add_argument(
        "--drain", type=int, default=None, help="rows per drain (see above; 100000 is ~3 s)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    engines = args.engines.split(",")
    anyio.run(main, engines, args.rows, args.loads, args.drain, args.rounds)


if __name__ == "__main__":
    cli()
