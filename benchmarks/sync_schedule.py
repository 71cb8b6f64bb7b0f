"""What scheduling from synchronous code costs against the async route, per row, inside
a transaction the caller already holds: ``app.sync.scheduler(session).run_after`` on a
SQLAlchemy ``Session`` (psycopg 3 / sqlite3), and on Django's connection inside
``transaction.atomic()``, beside ``await app.scheduler(session).run_after`` on an
``AsyncSession`` (asyncpg / aiosqlite). Same database, same function, rounds interleaved
(async, sync, Django, async, ...), the median round of each reported.

Two figures per route: ``*_call``, one ``run_after`` in a transaction already open
(``ROWS`` calls in one transaction, its commit not timed: what sync scheduling costs in
the caller's transaction), and ``*_txn``, a whole transaction of one row (begin,
``run_after``, commit). On PostgreSQL Django's route is measured twice: with Django's
default, under which psycopg prepares no statement, and with ``prepare_threshold: 5``.

    python -m benchmarks.sync_schedule [--engines sqlite,postgres] [--rounds 15]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import durafn
from durafn import MutationCtx

from . import throughput

ROWS = 200
"""Calls timed in one held transaction, per round."""
TXNS = 50
"""One-row transactions timed, per round."""


def _app(url: str) -> tuple[durafn.App, durafn.MutationRef[[int], None]]:
    app = durafn.App(url)

    @app.mutation(name="bench:noop")
    async def noop(ctx: MutationCtx, n: int) -> None:
        pass

    return app, noop


class Routes:
    """The routes on one database, each on the user's own engine (or Django's)."""

    def __init__(self, url: str) -> None:
        self.app, self.fn = _app(url)
        parsed = make_url(url)
        sqlite = parsed.get_backend_name() == "sqlite"
        sync = parsed.set(drivername="sqlite+pysqlite" if sqlite else "postgresql+psycopg")
        args: dict[str, Any] = {"timeout": 30} if sqlite else {}
        self.sync_engine: Engine = create_engine(sync, connect_args=args)
        self.async_engine: AsyncEngine = create_async_engine(url, connect_args=args)

    async def async_route(self, rows: int) -> float:
        """Seconds per row: ``rows`` calls in one held transaction (0: one-row transactions)."""
        if rows:
            async with AsyncSession(self.async_engine) as session, session.begin():
                scheduler = self.app.scheduler(session)
                await scheduler.run_after(0, self.fn, -1)  # the connection's first statement
                start = time.perf_counter()
                for i in range(rows):
                    await scheduler.run_after(0, self.fn, i)
                return (time.perf_counter() - start) / rows
        start = time.perf_counter()
        for i in range(TXNS):
            async with AsyncSession(self.async_engine) as session, session.begin():
                await self.app.scheduler(session).run_after(0, self.fn, i)
        return (time.perf_counter() - start) / TXNS

    def sync_route(self, rows: int) -> float:
        if rows:
            with Session(self.sync_engine) as session, session.begin():
                scheduler = self.app.sync.scheduler(session)
                scheduler.run_after(0, self.fn, -1)
                start = time.perf_counter()
                for i in range(rows):
                    scheduler.run_after(0, self.fn, i)
                return (time.perf_counter() - start) / rows
        start = time.perf_counter()
        for i in range(TXNS):
            with Session(self.sync_engine) as session, session.begin():
                self.app.sync.scheduler(session).run_after(0, self.fn, i)
        return (time.perf_counter() - start) / TXNS

    def django_route(self, alias: str, rows: int) -> float:
        from django.db import connections, transaction

        if rows:
            with transaction.atomic(using=alias):
                scheduler = self.app.sync.scheduler(connections[alias])
                scheduler.run_after(0, self.fn, -1)
                start = time.perf_counter()
                for i in range(rows):
                    scheduler.run_after(0, self.fn, i)
                return (time.perf_counter() - start) / rows
        start = time.perf_counter()
        for i in range(TXNS):
            with transaction.atomic(using=alias):
                self.app.sync.scheduler(connections[alias]).run_after(0, self.fn, i)
        return (time.perf_counter() - start) / TXNS

    async def close(self) -> None:
        self.sync_engine.dispose()
        await self.async_engine.dispose()
        await self.app.aclose()
        self.app.sync.close()


def _django(databases: dict[str, str]) -> dict[str, list[str]]:
    """Django configured on the bench's databases: per engine, the aliases to measure.
    On PostgreSQL two: Django's default (psycopg prepares nothing: each INSERT planned
    again) and ``OPTIONS={"prepare_threshold": 5}`` (psycopg's own default)."""
    import django
    from django.conf import settings

    config: dict[str, dict[str, Any]] = {}
    aliases: dict[str, list[str]] = {}
    for engine, url in databases.items():
        parsed = make_url(url)
        if parsed.get_backend_name() == "sqlite":
            config[engine] = {
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": parsed.database,
                "OPTIONS": {"timeout": 30, "transaction_mode": "IMMEDIATE"},
            }
            aliases[engine] = [engine]
            continue
        server = {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": parsed.database,
            "USER": parsed.username,
            "HOST": parsed.host,
            "PORT": str(parsed.port),
        }
        config[engine] = server
        config[f"{engine}_prepared"] = {**server, "OPTIONS": {"prepare_threshold": 5}}
        aliases[engine] = [engine, f"{engine}_prepared"]
    config["default"] = next(iter(config.values()))
    settings.configure(DATABASES=config, USE_TZ=True)
    django.setup()
    return aliases


def _cases(
    routes: Routes, loop: asyncio.Runner, aliases: list[str]
) -> list[tuple[str, Callable[[], float]]]:
    cases: list[tuple[str, Callable[[], float]]] = []
    for shape, rows in (("call", ROWS), ("txn", 0)):

        def in_loop(rows: int = rows) -> float:
            return loop.run(routes.async_route(rows))

        cases.append((f"async_{shape}", in_loop))
        cases.append((f"sync_{shape}", functools.partial(routes.sync_route, rows)))
        for alias in aliases:
            name = "django" + alias.removeprefix(alias.split("_")[0])
            cases.append((f"{name}_{shape}", functools.partial(routes.django_route, alias, rows)))
    return cases


PG_DB = "durafn_bench_sync"
"""Its PostgreSQL database: its own, so that it can run beside the suite's others."""


async def _fresh(engine: str, directory: str) -> str:
    if engine == "sqlite":
        return await throughput.fresh_url(engine, directory, "sync")
    await throughput.pg_admin(
        f"DROP DATABASE IF EXISTS {PG_DB} WITH (FORCE)", f"CREATE DATABASE {PG_DB}"
    )
    return throughput.pg_url(PG_DB)


def measure(engines: list[str], rounds: int, directory: str) -> dict[str, Any]:
    """Per engine: each route's median microseconds per row, and its ratio to async's."""
    with asyncio.Runner() as loop:
        urls = {e: loop.run(_fresh(e, directory)) for e in engines}
        try:
            aliases = _django(urls)
        except ImportError:  # Django is a test dependency: without it, the others
            aliases = {}
        out: dict[str, Any] = {}
        for engine, url in urls.items():
            routes = Routes(url)
            loop.run(routes.app.migrate())
            cases = _cases(routes, loop, aliases.get(engine, []))
            times: dict[str, list[float]] = {}
            for _, case in cases:
                case()  # warm: connections, compiled and prepared statements
            for _ in range(rounds):  # interleaved: each round runs every route
                for name, case in cases:
                    times.setdefault(name, []).append(case())
            loop.run(routes.close())
            us = {name: round(statistics.median(t) * 1e6, 1) for name, t in times.items()}
            ratios = {
                name: round(value / us["async_" + name.rsplit("_", 1)[1]], 3)
                for name, value in us.items()
                if not name.startswith("async_")
            }
            out[engine] = {"per_row_us": us, "over_async": ratios, "rounds": rounds}
            print(f"{engine}: {out[engine]}", flush=True)
    return out


def section(results: dict[str, Any]) -> list[str]:
    """Its lines in the suite's report."""
    lines: list[str] = []
    for engine, got in results.items():
        us, over = got["per_row_us"], got["over_async"]
        lines += [
            "",
            f"{engine}: scheduling one row from sync code in a held transaction, against "
            f"the async route (median of {got['rounds']} interleaved rounds; call: in an "
            "open transaction; txn: begin, schedule, commit):",
            "",
        ]
        for name, value in us.items():
            ratio = "" if name.startswith("async_") else f" ({over[name]:.2f}x async)"
            lines.append(f"- {name}: {value:,.1f} us{ratio}")
    return lines


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="sqlite,postgres")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        measure(args.engines.split(","), args.rounds, tmp)


if __name__ == "__main__":
    cli()
