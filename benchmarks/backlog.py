"""Backlog scaling: the drain and the start lag with 10^4..10^6 rows already in
``_scheduled_functions`` (half Pending far in the future, at seven priority levels, a
tenth of them in 997 named queues; half finished and awaiting retention), and the plans
of the hot queries at that size: the claim's statements as the driver issues them.

The cost per job must stay flat: every hot query reads an index whose relevant part does
not grow with the backlog (due rows only, or running actions only).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import text

import durafn

from .options import claim_plans

# Generated in the database: a million rows from Python would take longer than the drain.
_PREFILL = {
    "postgresql": """
        INSERT INTO _scheduled_functions
            (id, name, kind, args, state, scheduled_time, available_at, completed_time,
             priority, queue_name)
        SELECT gen_random_uuid(), 'bench:noop', 'mutation', '{}',
               CASE WHEN g % 2 = 0 THEN 'Pending' ELSE 'Success' END,
               :now + CASE WHEN g % 2 = 0 THEN 86400 + g ELSE -g END,
               :now + CASE WHEN g % 2 = 0 THEN 86400 + g ELSE -g END,
               CASE WHEN g % 2 = 0 THEN NULL ELSE :now - g / 1000.0 END,
               g % 7 - 3, CASE WHEN g % 10 = 0 THEN 'q' || (g % 997) END
          FROM generate_series(1, :rows) AS g
    """,
    "sqlite": """
        WITH RECURSIVE g(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM g WHERE x < :rows),
             base(b) AS (SELECT coalesce(max(rowid), 0) FROM _scheduled_functions)
        INSERT INTO _scheduled_functions
            (id, name, kind, args, state, scheduled_time, available_at, completed_time,
             priority, queue_name, seq)
        SELECT printf('backlog-%010d', x), 'bench:noop', 'mutation', '{}',
               CASE WHEN x % 2 = 0 THEN 'Pending' ELSE 'Success' END,
               :now + CASE WHEN x % 2 = 0 THEN 86400 + x ELSE -x END,
               :now + CASE WHEN x % 2 = 0 THEN 86400 + x ELSE -x END,
               CASE WHEN x % 2 = 0 THEN NULL ELSE :now - x / 1000.0 END,
               x % 7 - 3, CASE WHEN x % 10 = 0 THEN 'q' || (x % 997) END,
               b + x  -- seq: the rowid the row gets, as durafn writes it (_store/sql.py)
          FROM g, base
    """,
}

# Retention's query, as the driver issues it (the claim's come from benchmarks/options.py).
_RETENTION = (
    "SELECT id FROM _scheduled_functions WHERE completed_time < :now - 604800 "
    "AND state IN ('Success', 'Failed', 'Canceled') ORDER BY completed_time LIMIT 1000"
)


def prefill(rows: int) -> Callable[[durafn.App], Any]:
    async def _fill(app: durafn.App) -> None:
        async with app.engine.begin() as conn:
            dialect = conn.dialect.name
            await conn.execute(text(_PREFILL[dialect]), {"rows": rows, "now": time.time()})
            await conn.execute(text("ANALYZE"))

    return _fill


async def plans(app: durafn.App) -> dict[str, str]:
    """EXPLAIN of each hot query on the prefilled table."""
    out = await claim_plans(app)
    async with app.engine.connect() as conn:
        explain = "EXPLAIN" if conn.dialect.name == "postgresql" else "EXPLAIN QUERY PLAN"
        rows = await conn.execute(text(f"{explain} {_RETENTION}"), {"now": time.time()})
        out["retention"] = "\n".join(str(r[-1]) for r in rows)
    return out
