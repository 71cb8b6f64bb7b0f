"""A process that writes to a SQLite file through durafn's engine in back-to-back
transactions, as a mutation lane does (``python -m tests.apps.busy_writer URL COUNT HOLD``):
each inserts a row ``('busy')`` into table ``t`` and keeps its transaction open for
``HOLD`` seconds before it commits."""

from __future__ import annotations

import sys

import anyio

from durafn._store import driver_for_url


async def main(url: str, count: int, hold: float) -> None:
    driver = driver_for_url(url)
    engine = driver.create_engine(driver.default_max_connections)
    try:
        for _ in range(count):
            async with engine.begin() as conn:
                await conn.exec_driver_sql("INSERT INTO t (who) VALUES ('busy')")
                await anyio.sleep(hold)
    finally:
        await driver.dispose(engine)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
