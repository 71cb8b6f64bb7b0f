"""What ``benchmarks.soak`` reads from a database: the hot table's size and dead tuples
(sampled through the run), and at the end the counts that prove nothing was lost or
doubled (``soak_app`` says what each user table holds)."""

from __future__ import annotations

from typing import Any

import asyncpg

TABLE_STATS = """
SELECT pg_total_relation_size('_scheduled_functions') AS total_bytes,
       pg_relation_size('_scheduled_functions') AS heap_bytes,
       s.n_live_tup, s.n_dead_tup, s.n_tup_ins, s.n_tup_upd, s.n_tup_hot_upd, s.n_tup_del,
       s.autovacuum_count, s.autoanalyze_count,
       extract(epoch FROM s.last_autovacuum)::float8 AS last_autovacuum
FROM pg_stat_user_tables s WHERE s.relname = '_scheduled_functions'
"""


async def table_stats(conn: asyncpg.Connection) -> dict[str, Any]:
    """``_scheduled_functions``' size (with its indexes and TOAST) and tuple counts now."""
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    row = await conn.fetchrow(TABLE_STATS)
    return dict(row) if row is not None else {}


UNSETTLED = """
SELECT count(*) FROM _scheduled_functions
WHERE state NOT IN ('Success', 'Failed', 'Canceled')
  AND scheduled_time <= extract(epoch FROM now())
"""
"""Rows due and not finished (a cron's next tick, not due yet, is left out)."""


async def unsettled(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval(UNSETTLED))


_WRITES = """
SELECT count(*) AS planned, count(e.key) AS applied
FROM soak_planned p LEFT JOIN soak_effects e USING (key) WHERE p.kind = 'write'
"""
_STRAY = """
SELECT count(*) FROM soak_effects e
WHERE e.key NOT LIKE 'tick:%' AND NOT EXISTS (SELECT 1 FROM soak_planned p WHERE p.key = e.key)
"""
_JOINS = """
SELECT count(*) AS planned, count(e.key) AS ran,
       coalesce(max(e.unfinished), 0) AS most_unfinished
FROM soak_planned p LEFT JOIN soak_effects e USING (key) WHERE p.kind = 'join'
"""
_EARLY = """
SELECT e.key, e.detail, e.at FROM soak_effects e WHERE e.unfinished > 0 ORDER BY e.key
"""
"""The joins that ran while a dependency had not finished, with those rows as they were."""
_STATES = """
SELECT name, state, coalesce(error_type, '') AS error, count(*) AS n
FROM _scheduled_functions GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
"""
_ATTEMPT_TWICE = """
SELECT count(*) FROM (
  SELECT row_id, attempt FROM soak_starts WHERE row_id <> 'batch'
  GROUP BY 1, 2 HAVING count(*) > 1) twice
"""
_ACTIONS = """
SELECT count(*) AS planned,
       count(*) FILTER (WHERE started.n IS NULL) AS never_started,
       count(*) FILTER (WHERE started.n > 1) AS started_again,
       coalesce(sum(started.n), 0)::bigint AS starts
FROM soak_planned p
LEFT JOIN (SELECT key, count(*) AS n FROM soak_starts GROUP BY key) started USING (key)
WHERE p.kind = 'action'
"""
_CALL_ROWS = """
SELECT count(*) AS rows,
       count(*) FILTER (WHERE state = 'Success') AS succeeded,
       count(*) FILTER (WHERE state = 'Failed') AS failed,
       coalesce(sum(attempts), 0)::bigint AS attempts
FROM _scheduled_functions WHERE name = 'soak:call'
"""
_BATCHES = """
SELECT count(*) AS planned,
       count(*) FILTER (WHERE started.n IS NULL) AS never_started,
       count(*) FILTER (WHERE started.n > 1) AS started_twice,
       count(*) FILTER (WHERE started.n IS NULL AND lost.key IS NOT NULL) AS never_started_failed
FROM soak_planned p
LEFT JOIN (SELECT key, count(*) AS n FROM soak_starts GROUP BY key) started USING (key)
LEFT JOIN (SELECT args::jsonb ->> 'item' AS key FROM _scheduled_functions
           WHERE name = 'soak:send' AND state = 'Failed') lost USING (key)
WHERE p.kind = 'batch'
"""
_CRONS = """
SELECT (SELECT count(*) FROM soak_effects WHERE key LIKE 'tick:%') AS ticks,
       (SELECT count(*) FROM soak_starts WHERE key LIKE 'ping:%') AS ping_starts,
       (SELECT count(DISTINCT key) FROM soak_starts WHERE key LIKE 'ping:%') AS pings
"""


async def final_counts(conn: asyncpg.Connection) -> dict[str, Any]:
    """The end-of-run proof: every figure under ``problems`` should be 0."""
    writes = dict(await conn.fetchrow(_WRITES) or {})
    joins = dict(await conn.fetchrow(_JOINS) or {})
    actions = dict(await conn.fetchrow(_ACTIONS) or {})
    call_rows = dict(await conn.fetchrow(_CALL_ROWS) or {})
    batches = dict(await conn.fetchrow(_BATCHES) or {})
    crons = dict(await conn.fetchrow(_CRONS) or {})
    states = [dict(r) for r in await conn.fetch(_STATES)]
    early = [dict(r) for r in await conn.fetch(_EARLY)]
    failed_mutations = sum(
        r["n"]
        for r in states
        if r["state"] == "Failed" and r["name"] in ("soak:write", "soak:join", "soak:tick")
    )
    problems = {
        "writes lost (planned, no effect)": writes["planned"] - writes["applied"],
        "effects with no plan": int(await conn.fetchval(_STRAY)),
        "mutation rows Failed (a second run hits the unique key)": failed_mutations,
        "joins lost": joins["planned"] - joins["ran"],
        "joins run before a dependency finished": int(joins["most_unfinished"] > 0),
        "action attempts started twice": int(await conn.fetchval(_ATTEMPT_TWICE)),
        "action rows missing": actions["planned"] - call_rows["rows"],
        "action starts beyond the rows' attempts": max(
            0, actions["starts"] - call_rows["attempts"]
        ),
        "batch items started twice": batches["started_twice"],
        "batch items never started and not Failed": batches["never_started"]
        - batches["never_started_failed"],
        "cron ticks run twice": crons["ping_starts"] - crons["pings"],
        "rows due and not finished": await unsettled(conn),
    }
    return {
        "problems": problems,
        "writes": writes,
        "joins": joins,
        "actions": {**actions, **call_rows},
        "batches": batches,
        "crons": crons,
        "states": states,
        "early_joins": early,
    }
