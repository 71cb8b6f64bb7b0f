"""The driver seam's conformance suite, in the spirit of River's ``riverdrivertest``.

Every test calls the ``Driver`` interface directly (no executor, no app) on both engines:
what a claim returns and in which order, that every state change is guarded by the state
it expects and says so when it loses a race, the release of unstarted rows, the rescue of
lost workers, retention in bounded batches, and the reads. A new engine passes this file
first. Times are plain numbers passed in: the driver never reads a clock.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import aiosqlite
import pytest
from sqlalchemy import event, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from durafn import (
    ArgumentError,
    ErrorInfo,
    FunctionKind,
    ScheduledFunctionId,
    SchemaError,
    State,
)
from durafn._clock import to_datetime
from durafn._store import (
    SCHEMA_VERSION,
    Claimed,
    ClaimFilter,
    CronMove,
    CronRow,
    Driver,
    LostAction,
    NewCron,
    NewRow,
    NewRowColumns,
    Outcome,
    RowFilter,
    driver_for_url,
    new_id,
)
from durafn._store.claim.queues import queue_heads
from durafn._store.schema.tables import sf
from durafn._store.write.failures import FailureStatements, failures_of

pytestmark = pytest.mark.anyio

T = TypeVar("T")
T0 = 2_000_000_000.0
MUTATION, ACTION = FunctionKind.MUTATION, FunctionKind.ACTION


@dataclass
class Store:
    driver: Driver
    engine: AsyncEngine

    async def run(self, body: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        """``body`` in one committed transaction (SQLite: BEGIN IMMEDIATE, as durafn's)."""
        async with self.engine.begin() as conn:
            return await body(conn)

    async def insert(self, *rows: NewRowColumns) -> list[ScheduledFunctionId]:
        await self.run(lambda conn: self.driver.insert_rows(conn, rows))
        return [r["id"] for r in rows]

    async def claim_actions(self, worker: str, now: float, limit: int = 1) -> list[Claimed]:
        return await self.run(lambda conn: self.driver.claim_actions(conn, now, limit, worker))

    async def row(self, id: str) -> dict[str, Any]:
        async with self.engine.connect() as conn:
            found = (await conn.execute(select(sf).where(sf.c.id == id))).one()
        return {**found._mapping, "id": str(found.id)}

    async def states(self, ids: list[ScheduledFunctionId]) -> list[State]:
        return [State((await self.row(i))["state"]) for i in ids]


def new_row(
    kind: FunctionKind = MUTATION,
    *,
    at: float = T0,
    state: State = State.PENDING,
    parent: str | None = None,
    completed: float | None = None,
    name: str = "f",
    priority: int = 0,
    queue: str | None = None,
) -> NewRowColumns:
    """A row as the scheduler writes it (the keys of ``NEW_ROW_COLUMNS``)."""
    return {
        "id": new_id(at),
        "name": name,
        "kind": kind.value,
        "args": '{"n": 1}',
        "state": state.value,
        "scheduled_time": at,
        "available_at": at,
        "completed_time": completed,
        "parent_id": ScheduledFunctionId(parent) if parent else None,
        "priority": priority,
        "queue_name": queue,
        "job_key": None,
        "flags": None,
        "retry": None,
        "max_attempts": None,
        "on_complete": None,
        "flow_key": None,
        "flow": None,
        "trace_context": None,
        "batch_key": None,
    }


@pytest.fixture
async def bare(db_url: str) -> AsyncIterator[Store]:
    """A driver on an empty database: no system tables yet."""
    driver = driver_for_url(db_url)
    engine = driver.create_engine(driver.default_max_connections)
    try:
        yield Store(driver, engine)
    finally:
        await engine.dispose()


@pytest.fixture
async def store(bare: Store) -> Store:
    await bare.run(lambda conn: bare.driver.migrate(conn, T0))
    return bare


# -- schema ------------------------------------------------------------------------------


async def test_migrate_creates_the_schema_once_and_check_schema_accepts_it(bare: Store) -> None:
    driver = bare.driver
    with pytest.raises(SchemaError, match="do not exist"):
        await bare.run(driver.check_schema)
    assert await bare.run(lambda conn: driver.migrate(conn, T0)) == SCHEMA_VERSION
    assert await bare.run(lambda conn: driver.migrate(conn, T0 + 1)) == SCHEMA_VERSION
    await bare.run(driver.check_schema)


# -- the order rows were written in ------------------------------------------------------


async def test_seq_numbers_rows_in_the_order_they_were_written_by_every_insert(
    store: Store,
) -> None:
    """Plain rows, keyed rows (several in one statement) and a debounced call: each new
    row's ``seq`` is above every earlier row's, in the order the statement lists them,
    whatever their ids (made elsewhere, they may sort any way). SQLite computes a row's
    from the table's largest rowid: this checks that it reads them all before it writes."""
    driver = store.driver

    def keyed(key: str, id: str) -> NewRow:
        extra = {"key_mode": "replace", "debounce": None, "after": None, "after_policy": "run"}
        return cast(NewRow, {**new_row(), "id": id, "job_key": key, **extra})

    first = await store.insert(new_row(), new_row())
    # Ids that sort backwards: as another process's may.
    backwards = ["ffffffff-0000-7000-8000-00000000000" + str(n) for n in (3, 2, 1)]
    keyed_ids = await store.run(
        lambda conn: driver.insert_keyed(
            conn, [keyed(f"k{n}", id) for n, id in enumerate(backwards)]
        )
    )
    last = await store.insert(new_row())
    order = [*first, *keyed_ids, *last]
    seqs = [(await store.row(id))["seq"] for id in order]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


# -- claims ------------------------------------------------------------------------------


async def test_claim_mutations_takes_due_pending_mutations_in_due_order(store: Store) -> None:
    late, tie_a, tie_b, early = await store.insert(
        new_row(at=T0 + 2), new_row(at=T0), new_row(at=T0), new_row(at=T0 - 5)
    )
    await store.insert(
        new_row(at=T0 + 60),  # not due yet
        new_row(ACTION, at=T0 - 10),  # another kind
        new_row(at=T0 - 20, state=State.SUCCESS, completed=T0 - 19),  # finished
    )
    driver = store.driver
    claimed = await store.run(lambda conn: driver.claim_mutations(conn, T0 + 2, 10))
    # Due time, then id (the order of scheduling) among rows due at the same time.
    assert [c.id for c in claimed] == [early, tie_a, tie_b, late]
    first = claimed[0]
    assert (first.name, first.args, first.attempts, first.parent_id) == ("f", '{"n": 1}', 0, None)
    assert first.available_at == T0 - 5
    assert [c.id for c in await store.run(lambda c: driver.claim_mutations(c, T0 + 2, 2))] == [
        early,
        tie_a,
    ]
    # Claiming a mutation only locks it: the batch's own finish moves it out of Pending.
    assert await store.states([early, tie_a]) == [State.PENDING, State.PENDING]


async def test_claim_actions_commits_in_progress_under_the_worker(store: Store) -> None:
    ids = await store.insert(*(new_row(ACTION, at=T0 - i) for i in range(5)))
    await store.insert(new_row(ACTION, at=T0 + 60), new_row(MUTATION, at=T0 - 30))
    driver = store.driver
    first = await store.claim_actions("w1", T0, 3)
    assert [c.id for c in first] == ids[::-1][:3]  # oldest due first
    assert [c.attempts for c in first] == [1, 1, 1]  # counted when claimed
    row = await store.row(first[0].id)
    assert (row["state"], row["worker_id"], row["started_time"]) == ("InProgress", "w1", T0)
    # A second claim takes the rest: never a row twice.
    second = await store.claim_actions("w2", T0, 10)
    assert sorted(c.id for c in second) == sorted(ids[::-1][3:])
    assert await store.claim_actions("w3", T0, 10) == []
    mine = await store.run(lambda conn: driver.claimed_by(conn, "w1"))
    assert [c.id for c in mine] == [c.id for c in first]


async def test_a_claim_takes_the_heads_of_many_queues_in_claim_order(store: Store) -> None:
    """Several queues in one claim (PostgreSQL reads their heads in one statement): a
    serial queue gives an action claim its head, a mutation claim its rows one after
    another; a queue whose head is of the other kind gives nothing, not even later rows."""
    driver = store.driver
    rows = {
        (queue, kind, n): new_row(kind, at=T0 - 100 + 10 * n + i, queue=queue)
        for i, (queue, kind) in enumerate(
            [("a", ACTION), ("b", ACTION), ("c", MUTATION), ("d", ACTION), ("e", MUTATION)]
        )
        for n in range(3)
    }
    rows[("d", MUTATION, -1)] = new_row(MUTATION, at=T0 - 200, queue="d")  # d's head
    rows[("e", ACTION, -1)] = new_row(ACTION, at=T0 - 200, queue="e")  # e's head
    await store.insert(*rows.values())
    await store.run(lambda conn: driver.ensure_queues(conn, dict.fromkeys("abcde", 1), T0))
    ids = {key: row["id"] for key, row in rows.items()}
    actions = await store.claim_actions("w1", T0, 10)
    assert [c.id for c in actions] == [
        ids["e", ACTION, -1],
        ids["a", ACTION, 0],
        ids["b", ACTION, 0],
    ]

    async def mutations(conn: AsyncConnection) -> list[ScheduledFunctionId]:
        return [c.id for c in await driver.claim_mutations(conn, T0, 10)]

    taken = await store.run(mutations)
    assert sorted(taken) == sorted(
        [ids["d", MUTATION, -1]] + [ids["c", MUTATION, n] for n in range(3)]
    )


async def test_a_mutation_claim_finds_every_queue_full_and_takes_nothing(store: Store) -> None:
    """Two serial queues, each running an action, each with a mutation due next: a
    mutation claim takes nothing, and raises nothing. Between a claim's look at which
    queues have room and its lock on them, another process's action may fill them: the
    heads' read then has no queue left to take from (PostgreSQL's statement for many
    queues divided the batch by their number, and the worker stopped on the error)."""
    driver = store.driver
    rows = [
        new_row(kind, at=T0 - 100 + i, queue=queue)
        for queue in ("a", "b")
        for i, kind in enumerate([ACTION, MUTATION])
    ]
    await store.insert(*rows)
    await store.run(lambda conn: driver.ensure_queues(conn, {"a": 1, "b": 1}, T0))
    running = await store.claim_actions("w1", T0, 10)
    assert len(running) == 2  # both queues' heads: their single slots are taken

    async def mutations(conn: AsyncConnection) -> list[Claimed]:
        return await driver.claim_mutations(conn, T0, 10)

    assert await store.run(mutations) == []
    lateral = driver.name == "PostgreSQL"  # its form for many queues (SQLite: a union)

    async def heads(conn: AsyncConnection) -> tuple[list[Claimed], bool]:
        return await queue_heads(conn, MUTATION, T0, ["a", "b"], 10, frozenset(), lateral)

    assert await store.run(heads) == ([], False)


@pytest.mark.postgres_only  # SKIP LOCKED: SQLite's BEGIN IMMEDIATE makes claims take turns
async def test_concurrent_claims_skip_each_others_locked_rows(postgres_url: str) -> None:
    driver = driver_for_url(postgres_url)
    engine = driver.create_engine(driver.default_max_connections)
    store = Store(driver, engine)
    try:
        await store.run(lambda conn: driver.migrate(conn, T0))
        ids = await store.insert(*(new_row(at=T0 - i) for i in range(4)))
        async with engine.begin() as one, engine.begin() as two:
            held = await driver.claim_mutations(one, T0, 2)
            other = await driver.claim_mutations(two, T0, 10)
        assert [c.id for c in held] == ids[::-1][:2]
        assert [c.id for c in other] == ids[::-1][2:]  # the rest, without waiting
    finally:
        await engine.dispose()


# -- finishes: guarded by the state they expect -------------------------------------------


async def test_finish_pending_writes_each_outcome_and_loses_to_a_finished_row(
    store: Store,
) -> None:
    plain, with_result, failing, cancelled = await store.insert(*(new_row() for _ in range(4)))
    driver = store.driver
    await store.run(lambda conn: driver.cancel(conn, cancelled, T0))
    outcomes = [
        Outcome(plain, State.SUCCESS),
        Outcome(with_result, State.SUCCESS, result='{"ok": true}'),
        Outcome(failing, State.FAILED, error_type="ValueError", error_message="no"),
        Outcome(cancelled, State.SUCCESS),  # cancelled meanwhile: the guard says no
    ]
    assert await store.run(lambda conn: driver.finish_pending(conn, T0 + 1, outcomes)) == 3
    rows = [await store.row(i) for i in (plain, with_result, failing, cancelled)]
    assert [r["state"] for r in rows] == ["Success", "Success", "Failed", "Canceled"]
    assert [r["attempts"] for r in rows] == [1, 1, 1, 0]  # a mutation's run counts at its end
    assert [r["completed_time"] for r in rows[:3]] == [T0 + 1] * 3
    assert rows[1]["result"] == '{"ok": true}'
    assert (rows[2]["error_type"], rows[2]["error_message"]) == ("ValueError", "no")
    # Run again (a retry after an unseen outcome): nothing is written twice.
    assert await store.run(lambda conn: driver.finish_pending(conn, T0 + 2, outcomes)) == 0
    assert (await store.row(plain))["completed_time"] == T0 + 1


async def test_finish_in_progress_never_overwrites_a_cancel(store: Store) -> None:
    ids = await store.insert(*(new_row(ACTION) for _ in range(3)))
    driver = store.driver
    await store.claim_actions("w", T0, 10)
    assert await store.run(lambda conn: driver.cancel(conn, ids[0], T0)) is State.IN_PROGRESS
    outcomes = [Outcome(ids[0], State.SUCCESS), Outcome(ids[1], State.SUCCESS)]
    outcomes.append(Outcome(ids[2], State.FAILED, error_type="E", error_message="m"))
    assert await store.run(lambda conn: driver.finish_in_progress(conn, T0 + 1, outcomes)) == 2
    assert await store.states(ids) == [State.CANCELED, State.SUCCESS, State.FAILED]
    assert [(await store.row(i))["attempts"] for i in ids] == [1, 1, 1]  # counted at the claim
    # Finishing a Pending row as if it were running is refused as well.
    pending = (await store.insert(new_row(ACTION, at=T0 + 60)))[0]
    assert (
        await store.run(
            lambda conn: driver.finish_in_progress(conn, T0, [Outcome(pending, State.SUCCESS)])
        )
        == 0
    )


async def test_a_batch_with_retries_writes_each_retry_with_its_failure_only_if_it_moved(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The finish of plain successes and retried runs (each driver's fast form: one
    statement on PostgreSQL, one call on SQLite's thread): a row cancelled meanwhile is
    neither retried nor given a failure; the count and ``unwritten`` say what moved."""
    ids = await store.insert(*(new_row(ACTION) for _ in range(4)))
    plain, gone, retried, cancelled = ids
    driver = store.driver
    await store.claim_actions("w", T0, 10)

    async def cancel(conn: AsyncConnection, id: ScheduledFunctionId) -> State | None:
        return await driver.cancel(conn, id, T0)

    for id in (gone, cancelled):
        assert await store.run(functools.partial(cancel, id=id)) is State.IN_PROGRESS

    def retry(id: ScheduledFunctionId) -> Outcome:
        return Outcome(
            id, State.PENDING, error_type="E", error_message="m", retry_at=T0 + 5, error=None
        )

    outcomes = [
        Outcome(plain, State.SUCCESS),
        Outcome(gone, State.SUCCESS),
        retry(retried),
        retry(cancelled),
    ]
    statements: list[str] = []
    calls: list[object] = []
    own = aiosqlite.Connection._execute

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    async def counted(self: aiosqlite.Connection, fn: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(fn)
        return await own(self, fn, *args, **kwargs)  # type: ignore[no-untyped-call]

    async def finish(conn: AsyncConnection) -> int:
        statements.clear()
        calls.clear()
        event.listen(store.engine.sync_engine, "before_cursor_execute", count)
        monkeypatch.setattr(aiosqlite.Connection, "_execute", counted)
        try:
            return await driver.finish_in_progress(conn, T0 + 1, outcomes)
        finally:
            monkeypatch.undo()
            event.remove(store.engine.sync_engine, "before_cursor_execute", count)

    written = await store.run(finish)
    # Each driver's fast form: PostgreSQL one statement (so the finisher sends it without
    # a transaction of its own), SQLite one call on its connection's thread.
    if driver.name == "PostgreSQL":
        assert driver.finishes_in_one_statement(outcomes, {retried, cancelled})
        assert len(statements) == 1, statements
    else:
        assert len(calls) == 1, calls
    assert written == 2
    assert [o.unwritten for o in outcomes[2:]] == [False, True]
    assert await store.states(ids) == [
        State.SUCCESS,
        State.CANCELED,
        State.PENDING,
        State.CANCELED,
    ]
    found = await store.row(retried)
    assert (found["available_at"], found["failures"], found["worker_id"]) == (T0 + 5, 1, None)
    history = {i: await store.run(functools.partial(failures_of, id=i)) for i in ids}
    assert [(f.attempt, f.error.type, f.worker_id) for f in history[retried]] == [(1, "E", None)]
    assert history[retried][0].retry_at == to_datetime(T0 + 5)
    assert not history[cancelled] and not history[plain]
    # A mutation's run is counted as it finishes: its retry counts it too.
    pending = await store.insert(new_row(), new_row())
    again = [Outcome(pending[0], State.SUCCESS), retry(pending[1])]
    assert await store.run(lambda conn: driver.finish_pending(conn, T0 + 2, again)) == 2
    rows = [await store.row(i) for i in pending]
    assert [(r["state"], r["attempts"], r["failures"]) for r in rows] == [
        ("Success", 1, 0),
        ("Pending", 1, 1),
    ]


async def test_many_plain_successes_finish_in_one_call(store: Store) -> None:
    """More ids than SQLite binds in one statement: the driver splits, the count is whole."""
    ids = await store.insert(*(new_row() for _ in range(1200)))
    driver = store.driver
    outcomes = [Outcome(i, State.SUCCESS) for i in ids]
    assert await store.run(lambda conn: driver.finish_pending(conn, T0, outcomes)) == 1200
    counts = await store.run(driver.count_by_state)
    assert counts[State.SUCCESS] == 1200 and counts[State.PENDING] == 0


@pytest.mark.parametrize("form", ["driver", "portable"])
async def test_failures_go_into_their_rows_history_in_order(store: Store, form: str) -> None:
    """A retried run goes into its row's history with its retry, a final failure by
    ``record_failures`` after the finish that counted it: which failure it was, when, on
    which worker, its error and retry time. The same with the portable statements
    (``FailureStatements``), which each driver overrides with a faster form."""
    driver = store.driver
    statements: Any = FailureStatements if form == "portable" else type(driver)
    id, other = await store.insert(new_row(ACTION), new_row(ACTION))
    await store.claim_actions("w", T0, 10)
    first = Outcome(id, State.FAILED, error_type="E", error_message="one", retry_at=T0 + 5)
    last = Outcome(
        id, State.FAILED, error_type="E", error_message="two", error_traceback="tb", error=None
    )

    async def retry(conn: AsyncConnection) -> set[str]:
        moved = await statements.retry_rows(
            driver, conn, T0 + 1, [first], State.IN_PROGRESS, "w:1", 0, 1
        )
        return set(moved)

    async def fail_for_good(conn: AsyncConnection) -> None:
        # As the finish of its last run leaves it: Failed, the failure counted.
        await conn.execute(
            update(sf).where(sf.c.id == id).values(state="Failed", failures=sf.c.failures + 1)
        )
        await statements.record_failures(driver, conn, T0 + 6, [last], "w:2")

    assert await store.run(retry) == {id}
    assert ((await store.row(id))["state"], (await store.row(id))["failures"]) == ("Pending", 1)
    await store.run(fail_for_good)
    found, untouched = [await store.run(functools.partial(driver.get, id=i)) for i in (id, other)]
    assert found is not None and untouched is not None
    history = [(h.attempt, h.failed_at, h.worker_id, h.error, h.retry_at) for h in found.history]
    assert history == [
        (1, to_datetime(T0 + 1), "w:1", ErrorInfo(type="E", message="one"), to_datetime(T0 + 5)),
        (2, to_datetime(T0 + 6), "w:2", ErrorInfo(type="E", message="two", traceback="tb"), None),
    ]
    assert untouched.history == []


async def test_count_retry_counts_a_run_whatever_the_state_now(store: Store) -> None:
    """A rolled-back run began: it counts even if another lane finished the row since."""
    pending, done, other = await store.insert(
        new_row(), new_row(state=State.SUCCESS, completed=T0), new_row()
    )
    await store.run(lambda conn: store.driver.count_retry(conn, [pending, done]))
    assert [(await store.row(i))["attempts"] for i in (pending, done, other)] == [1, 1, 0]


# -- the hand-off: a queue's slot passed to its next row in the finish's transaction --------


HAND_OFF_CASES = {
    # case: (rows besides the finishing one and its successor, hands off?)
    "the successor is first in claim order": ([], True),
    "an unqueued action due later": ([new_row(ACTION, at=T0 + 5)], True),
    "another queue's action due after it": ([new_row(ACTION, at=T0 - 1, queue="other")], True),
    "a mutation due before it": ([new_row(MUTATION, at=T0 - 50)], True),
    "an unqueued action at a more urgent level": ([new_row(ACTION, priority=-1)], False),
    "the same, not due yet": ([new_row(ACTION, priority=-1, at=T0 + 60)], False),
    "an unqueued action due before it": ([new_row(ACTION, at=T0 - 50)], False),
    "another queue's action due before it": ([new_row(ACTION, at=T0 - 50, queue="o")], False),
    "another queue's action more urgent": ([new_row(ACTION, priority=-1, queue="o")], False),
}


@pytest.mark.parametrize("case", HAND_OFF_CASES)
async def test_hand_off_starts_a_queues_next_action_only_where_the_claim_would(
    store: Store, case: str
) -> None:
    """One serial queue: ``done`` runs under w1 and ends in the transaction that hands its
    slot on; ``next`` is the queue's next row (due at T0 - 10). A claim would start it
    only if nothing due is ahead of it in claim order: neither would the hand-off (the
    guard is conservative: a more urgent row not due yet also sends it to the claim)."""
    others, hands_off = HAND_OFF_CASES[case]
    driver = store.driver
    done, successor, later = await store.insert(
        new_row(ACTION, at=T0 - 20, queue="q"),
        new_row(ACTION, at=T0 - 10, queue="q"),
        new_row(ACTION, at=T0 - 5, queue="q"),
    )
    await store.run(lambda conn: driver.ensure_queues(conn, {"q": 1, "o": 1, "other": 1}, T0))
    assert [c.id for c in await store.claim_actions("w1", T0 - 15)] == [done]
    if others:
        await store.insert(*(cast(NewRowColumns, {**row, "id": new_id(T0)}) for row in others))

    async def finish_and_hand_off(conn: AsyncConnection) -> list[Claimed]:
        await driver.finish_in_progress(conn, T0, [Outcome(done, State.SUCCESS, queue="q")])
        return await driver.hand_off(conn, T0, ["q"], 1, "w1")

    handed = await store.run(finish_and_hand_off)
    assert [c.id for c in handed] == ([successor] if hands_off else [])
    states = await store.states([done, successor, later])
    assert states == [
        State.SUCCESS,
        State.IN_PROGRESS if hands_off else State.PENDING,
        State.PENDING,
    ]
    if hands_off:
        row = await store.row(successor)
        assert (row["worker_id"], row["started_time"], row["attempts"]) == ("w1", T0, 1)


async def test_hand_off_leaves_a_busy_paused_or_foreign_queue_to_the_claim(
    store: Store,
) -> None:
    driver = store.driver

    async def hand_off(queue: str, forbidden: frozenset[str] = frozenset()) -> list[Claimed]:
        serve = ClaimFilter(forbidden_flags=forbidden)
        return await store.run(lambda conn: driver.hand_off(conn, T0, [queue], 5, "w9", serve))

    # A queue of concurrency 2 with both slots taken: nothing; one freed: its next row.
    running = [new_row(ACTION, at=T0 - 30, queue="two") for _ in range(2)]
    waiting = new_row(ACTION, at=T0 - 20, queue="two")
    await store.insert(*running, waiting)
    await store.run(lambda conn: driver.ensure_queues(conn, {"two": 2}, T0))
    await store.claim_actions("w1", T0 - 25, 2)
    assert await hand_off("two") == []
    await store.run(
        lambda conn: driver.finish_in_progress(conn, T0, [Outcome(running[0]["id"], State.SUCCESS)])
    )
    assert [c.id for c in await hand_off("two")] == [waiting["id"]]
    # A mutation at the head: the mutation claim's (nothing after it either).
    mutation, action = await store.insert(
        new_row(MUTATION, at=T0 - 20, queue="m"), new_row(ACTION, at=T0 - 10, queue="m")
    )
    await store.run(lambda conn: driver.ensure_queues(conn, {"m": 1}, T0))
    assert await hand_off("m") == []
    # Paused; a flag the worker refuses; a queue without a limit; not due yet.
    paused, flagged, free, future = await store.insert(
        new_row(ACTION, at=T0 - 10, queue="paused"),
        # Due first: rows of paused or busy queues ahead of it would hold it back too
        # (the guard reads the claim indexes' first entries, not which queues may run).
        {**new_row(ACTION, at=T0 - 40, queue="flagged"), "flags": ",bulk,"},
        new_row(ACTION, at=T0 - 10, queue="free"),
        new_row(ACTION, at=T0 + 10, queue="future"),
    )
    limits = {"paused": 1, "flagged": 1, "free": None, "future": 1}
    await store.run(lambda conn: driver.ensure_queues(conn, limits, T0))
    await store.run(lambda conn: driver.set_paused(conn, {"paused": 1}, True, T0))
    assert await hand_off("paused") == []
    assert await hand_off("flagged", frozenset({"bulk"})) == []
    assert [c.id for c in await hand_off("flagged")] == [flagged]
    assert await hand_off("free") == []
    assert await hand_off("future") == []
    assert await store.states([mutation, action, paused, free, future]) == [State.PENDING] * 5


# -- release of unstarted rows --------------------------------------------------------------


async def test_release_unstarted_returns_only_this_workers_running_rows(store: Store) -> None:
    a1, a2, a3, b1 = await store.insert(*(new_row(ACTION, at=T0 - 4 + i) for i in range(4)))
    driver = store.driver
    await store.claim_actions("a", T0, 3)
    await store.claim_actions("b", T0, 1)
    finished = [Outcome(a3, State.SUCCESS)]
    await store.run(lambda conn: driver.finish_in_progress(conn, T0, finished))
    released = await store.run(lambda conn: driver.release_unstarted(conn, [a1, a2, a3, b1], "a"))
    assert released == 2  # a3 finished, b1 is another worker's
    assert await store.states([a1, a2, a3, b1]) == [
        State.PENDING,
        State.PENDING,
        State.SUCCESS,
        State.IN_PROGRESS,
    ]
    row = await store.row(a1)
    assert (row["attempts"], row["worker_id"], row["started_time"]) == (0, None, None)
    assert await store.run(lambda conn: driver.release_unstarted(conn, [a1, a2], "a")) == 0
    # Released rows are due again for any worker.
    again = await store.claim_actions("c", T0, 10)
    assert [c.id for c in again] == [a1, a2]


# -- workers and the rescue of lost ones ----------------------------------------------------


async def test_heartbeats_renew_a_registered_worker_only(store: Store) -> None:
    driver = store.driver
    assert not await store.run(lambda conn: driver.heartbeat(conn, "w", T0))
    await store.run(lambda conn: driver.register_worker(conn, "w", "host", 42, 8, T0))
    assert await store.run(lambda conn: driver.heartbeat(conn, "w", T0 + 5))
    (info,) = await store.run(driver.list_workers)
    assert (info.id, info.hostname, info.pid, info.concurrency, info.running) == (
        "w",
        "host",
        42,
        8,
        0,
    )
    assert info.heartbeat_at.timestamp() == T0 + 5
    await store.run(lambda conn: driver.unregister_worker(conn, "w"))
    assert await store.run(driver.list_workers) == []
    assert not await store.run(lambda conn: driver.heartbeat(conn, "w", T0 + 10))


async def test_rescue_fails_the_running_actions_of_lost_workers_only(store: Store) -> None:
    driver = store.driver
    await store.run(lambda conn: driver.register_worker(conn, "alive", "h", 1, 1, T0))
    await store.run(lambda conn: driver.register_worker(conn, "dead", "h", 2, 1, T0 - 100))
    old_alive, old_dead, new_dead, gone = await store.insert(
        *(new_row(ACTION, at=T0 - 200 + i) for i in range(4))
    )
    await store.claim_actions("alive", T0 - 90)
    await store.claim_actions("dead", T0 - 90)
    await store.claim_actions("dead", T0 - 1)  # since the cutoff: not lost yet
    await store.claim_actions("never-registered", T0 - 90)
    running = {w.id: w.running for w in await store.run(driver.list_workers)}
    assert running == {"alive": 1, "dead": 2}

    async def rescue(conn: AsyncConnection, now: float, message: str) -> list[LostAction]:
        lost = await driver.find_lost(conn, now - 30, message)
        await driver.fail_lost(conn, now, lost)
        return lost

    lost = await store.run(lambda conn: rescue(conn, T0, "lost {worker}: not retried"))
    # The dead worker's row claimed before the cutoff, and the row of a worker that never
    # registered; not the live worker's, nor one claimed more recently than the cutoff.
    assert sorted((r.id, r.worker_id) for r in lost) == sorted(
        [(old_dead, "dead"), (gone, "never-registered")]
    )
    assert await store.states([old_alive, old_dead, new_dead, gone]) == [
        State.IN_PROGRESS,
        State.FAILED,
        State.IN_PROGRESS,
        State.FAILED,
    ]
    row = await store.row(old_dead)
    assert (row["error_type"], row["error_message"]) == (
        "durafn.WorkerLostError",
        "lost dead: not retried",
    )
    assert row["completed_time"] == T0
    assert await store.run(lambda conn: rescue(conn, T0, "{worker}")) == []
    # The rescue then removes the lost worker's row and records what it did.
    removed = await store.run(
        lambda conn: driver.remove_lost_workers(conn, T0, T0 - 30, "alive", {"dead": (1, 0)})
    )
    assert removed == 1
    assert [w.id for w in await store.run(driver.list_workers)] == ["alive"]  # its row is gone
    [record] = await store.run(lambda conn: driver.list_lost_workers(conn, 10))
    assert (record.id, record.pid, record.rescued_by, record.failed, record.retried) == (
        "dead",
        2,
        "alive",
        1,
        0,
    )
    # Its row claimed since that cutoff is rescued by a later rescue, once as old: counted
    # on the same record (a worker with no record, never declared lost, has none).
    later_lost = await store.run(lambda conn: rescue(conn, T0 + 30, "{worker}"))
    assert [(r.id, r.worker_id) for r in later_lost] == [(new_dead, "dead")]
    counts: dict[str | None, tuple[int, int]] = {"dead": (0, 1), "never-registered": (1, 0)}
    assert not await store.run(
        lambda conn: driver.remove_lost_workers(conn, T0 + 30, T0, "alive", counts)
    )
    [record] = await store.run(lambda conn: driver.list_lost_workers(conn, 10))
    assert (record.id, record.rescued_by, record.failed, record.retried) == ("dead", "alive", 1, 1)
    # Kept 7 days: a rescue a week later forgets it (and finds "alive" silent since).
    week = T0 + 7 * 86400 + 1
    await store.run(lambda conn: driver.remove_lost_workers(conn, week, week - 30, "x", {}))
    later = await store.run(lambda conn: driver.list_lost_workers(conn, 10))
    assert [(w.id, w.rescued_by) for w in later] == [("alive", "x")]


# -- scheduling: cancel ---------------------------------------------------------------------


async def test_cancel_says_what_the_row_was_and_changes_only_unfinished_rows(
    store: Store,
) -> None:
    pending, done = await store.insert(new_row(), new_row(state=State.FAILED, completed=T0))
    driver = store.driver
    assert await store.run(lambda conn: driver.cancel(conn, pending, T0 + 1)) is State.PENDING
    assert await store.run(lambda conn: driver.cancel(conn, pending, T0 + 2)) is State.CANCELED
    assert await store.run(lambda conn: driver.cancel(conn, done, T0 + 1)) is State.FAILED
    assert await store.states([pending, done]) == [State.CANCELED, State.FAILED]
    assert (await store.row(pending))["completed_time"] == T0 + 1
    unknown = new_id(T0)
    assert await store.run(lambda conn: driver.cancel(conn, unknown, T0)) is None
    assert await store.run(lambda conn: driver.cancel(conn, "not-an-id", T0)) is None  # type: ignore[arg-type]


async def test_cancelling_a_running_row_cancels_its_unfinished_descendants(store: Store) -> None:
    (parent,) = await store.insert(new_row(ACTION))
    driver = store.driver
    await store.claim_actions("w", T0, 1)
    child, finished_child = await store.insert(
        new_row(parent=parent, at=T0 + 60),
        new_row(parent=parent, state=State.SUCCESS, completed=T0),
    )
    (grandchild,) = await store.insert(new_row(parent=finished_child, at=T0 + 60))
    (unrelated,) = await store.insert(new_row(at=T0 + 60))
    assert await store.run(lambda conn: driver.cancel(conn, parent, T0)) is State.IN_PROGRESS
    assert await store.states([parent, child, finished_child, grandchild, unrelated]) == [
        State.CANCELED,
        State.CANCELED,
        State.SUCCESS,
        State.CANCELED,  # found through its finished parent
        State.PENDING,
    ]


async def test_state_reads_a_row(store: Store) -> None:
    (id,) = await store.insert(new_row())
    driver = store.driver
    assert await store.run(lambda conn: driver.state(conn, id)) is State.PENDING
    assert await store.run(lambda conn: driver.lock_for_share(conn, id)) is State.PENDING
    missing = new_id(T0)
    assert await store.run(lambda conn: driver.lock_for_share(conn, missing)) is None


# -- the cron registry and the cron lease -------------------------------------------------


def _new(name: str, next_run_at: float | None, *, enabled: bool = True) -> NewCron:
    return NewCron(row=_cron(name, enabled=enabled), next_run_at=next_run_at)


def _cron(name: str, *, enabled: bool = True) -> CronRow:
    return CronRow(
        name=name,
        schedule="* * * * *",
        timezone="UTC",
        function="f",
        kind="mutation",
        args="{}",
        options="{}",
        overlap="skip",
        catch_up="latest",
        enabled=enabled,
        description=None,
    )


async def test_due_crons_are_the_enabled_ones_due_by_now_earliest_first(store: Store) -> None:
    driver = store.driver
    crons = [_new("b", T0 + 60), _new("a", T0 + 120), _new("off", None, enabled=False)]
    await store.run(lambda conn: driver.add_crons(conn, crons, now=T0))
    # A name already there is left as it is.
    await store.run(lambda conn: driver.add_crons(conn, [_new("b", T0 + 999)], now=T0 + 1))
    assert await store.run(driver.next_cron) == T0 + 60
    due = await store.run(lambda conn: driver.due_crons(conn, T0 + 120, 10))
    assert [c.name for c in due] == ["b", "a"]
    assert [c.name for c in await store.run(lambda conn: driver.due_crons(conn, T0 + 60, 10))] == [
        "b"
    ]
    assert [c.name for c in await store.run(driver.stored_crons)] == ["a", "b", "off"]
    b = await store.run(lambda conn: driver.stored_cron(conn, "b"))
    assert b is not None
    assert (b.next_run_at, b.run_count, b.created_at) == (T0 + 60, 0, T0)
    assert await store.run(lambda conn: driver.stored_cron(conn, "none")) is None
    # set_cron sets the columns named and keeps the others.
    await store.run(lambda conn: driver.set_cron(conn, "a", next_run_at=None, updated_at=T0 + 5))
    due = await store.run(lambda conn: driver.due_crons(conn, T0 + 999, 10))
    assert [c.name for c in due] == ["b"]
    a = await store.run(lambda conn: driver.stored_cron(conn, "a"))
    assert a is not None
    assert (a.next_run_at, a.updated_at, a.created_at, a.schedule) == (
        None,
        T0 + 5,
        T0,
        "* * * * *",
    )


async def test_advance_crons_moves_a_cron_only_from_the_next_run_it_was_read_with(
    store: Store,
) -> None:
    driver = store.driver
    await store.run(lambda conn: driver.add_crons(conn, [_new("a", T0), _new("b", T0)], now=T0))
    ran = CronMove(
        name="a", expected=T0, next_run_at=T0 + 60, last_run_at=T0, last_row_id="row-1", runs=1
    )
    skipped = CronMove(
        name="b", expected=T0, next_run_at=T0 + 60, last_skip_at=T0, last_skip_reason="missed"
    )
    assert await store.run(lambda conn: driver.advance_crons(conn, [ran, skipped])) == 2
    # Moved already (another leader's second write of the same ticks): nothing moves.
    assert await store.run(lambda conn: driver.advance_crons(conn, [ran, skipped])) == 0
    a = await store.run(lambda conn: driver.stored_cron(conn, "a"))
    b = await store.run(lambda conn: driver.stored_cron(conn, "b"))
    assert a is not None and b is not None
    assert (a.next_run_at, a.last_run_at, a.last_row_id, a.run_count) == (
        T0 + 60,
        T0,
        "row-1",
        1,
    )
    assert (a.last_skip_at, a.last_skip_reason) == (None, None)
    # A skip leaves the last run as it was, and records itself.
    later = CronMove(
        name="a",
        expected=T0 + 60,
        next_run_at=None,
        last_skip_at=T0 + 60,
        last_skip_reason="paused",
    )
    assert await store.run(lambda conn: driver.advance_crons(conn, [later])) == 1
    a = await store.run(lambda conn: driver.stored_cron(conn, "a"))
    assert a is not None
    assert (a.next_run_at, a.last_run_at, a.last_row_id, a.run_count) == (
        None,
        T0,
        "row-1",
        1,
    )
    assert (a.last_skip_at, a.last_skip_reason) == (T0 + 60, "paused")
    assert (b.last_run_at, b.last_skip_at, b.last_skip_reason) == (None, T0, "missed")


async def test_the_cron_lease_is_one_holders_until_it_expires(store: Store) -> None:
    driver = store.driver

    def take(holder: str, now: float) -> Callable[[AsyncConnection], Awaitable[bool]]:
        return lambda conn: driver.take_lease(conn, "cron", holder=holder, now=now, until=now + 10)

    assert await store.run(take("w1", T0))
    assert not await store.run(take("w2", T0 + 5))
    assert await store.run(take("w1", T0 + 5))  # renewed: until T0 + 15
    assert not await store.run(take("w2", T0 + 12))
    assert await store.run(take("w2", T0 + 16))
    assert not await store.run(take("w1", T0 + 17))


# -- next due, retention and reads ----------------------------------------------------------


async def test_next_due_is_the_first_pending_row_of_its_kind(store: Store) -> None:
    driver = store.driver
    assert await store.run(lambda conn: driver.next_due(conn, MUTATION)) is None
    await store.insert(
        new_row(at=T0 + 10),
        new_row(at=T0 + 5),
        new_row(ACTION, at=T0 + 1),
        new_row(at=T0, state=State.CANCELED, completed=T0),
    )
    assert await store.run(lambda conn: driver.next_due(conn, MUTATION)) == T0 + 5
    assert await store.run(lambda conn: driver.next_due(conn, ACTION)) == T0 + 1
    # ``after``: rows due by then are taken by others; only later ones are waited for.
    assert await store.run(lambda conn: driver.next_due(conn, MUTATION, after=T0 + 5)) == T0 + 10
    assert await store.run(lambda conn: driver.next_due(conn, MUTATION, after=T0 + 10)) is None
    assert await store.run(lambda conn: driver.backlog(conn, T0 + 6)) == (T0 + 1, T0 + 10)


async def test_retention_deletes_finished_rows_in_bounded_batches_oldest_first(
    store: Store,
) -> None:
    # Inserted newest first, so that the table's own order is not the answer.
    failed, *successes = await store.insert(
        new_row(state=State.FAILED, completed=T0 - 50),
        *(new_row(state=State.SUCCESS, completed=T0 - 98 - i) for i in range(3)),
    )
    recent, pending = await store.insert(
        new_row(state=State.CANCELED, completed=T0), new_row(at=T0 - 1000)
    )
    driver = store.driver
    assert await store.run(lambda conn: driver.count_finished(conn, T0 - 10)) == 4
    failed_only = [State.FAILED]
    assert await store.run(lambda conn: driver.count_finished(conn, T0 - 10, failed_only)) == 1
    assert await store.run(lambda conn: driver.delete_finished(conn, T0 - 10, 2)) == 2
    left = {r.id for r in (await store.run(_all_rows(driver))).items}
    assert left == {failed, successes[0], recent, pending}  # the two oldest went first
    assert await store.run(lambda conn: driver.delete_finished(conn, T0 - 10, 2)) == 2
    assert await store.run(lambda conn: driver.delete_finished(conn, T0 - 10, 2)) == 0
    with pytest.raises(ArgumentError, match="only finished rows"):
        await store.run(lambda conn: driver.delete_finished(conn, T0, 10, [State.PENDING]))
    assert await store.states([recent, pending]) == [State.CANCELED, State.PENDING]


async def test_list_pages_through_rows_in_scheduled_order(store: Store) -> None:
    ids = await store.insert(*(new_row(at=T0 + i // 2) for i in range(5)))
    await store.run(lambda conn: store.driver.cancel(conn, ids[4], T0))
    seen: list[str] = []
    cursor: str | None = None
    while True:
        page = await store.run(_all_rows(store.driver, limit=2, cursor=cursor))
        seen += [r.id for r in page.items]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == ids
    canceled = await store.run(_all_rows(store.driver, states=[State.CANCELED]))
    assert [r.id for r in canceled.items] == [ids[4]]
    with pytest.raises(ArgumentError, match="not a cursor"):
        await store.run(_all_rows(store.driver, cursor="nonsense"))
    got = await store.run(lambda conn: store.driver.get(conn, ids[0]))
    assert got is not None and (got.args, got.state, got.attempts) == ({"n": 1}, State.PENDING, 0)
    assert await store.run(lambda conn: store.driver.get(conn, "not-an-id")) is None


def _all_rows(
    driver: Driver,
    *,
    limit: int = 100,
    cursor: str | None = None,
    states: list[State] | None = None,
) -> Callable[[AsyncConnection], Awaitable[Any]]:
    def _list(conn: AsyncConnection) -> Awaitable[Any]:
        return driver.list(conn, where=RowFilter(states=states), limit=limit, cursor=cursor)

    return _list


def test_a_dialect_without_what_durafn_needs_is_refused_naming_what_it_lacks() -> None:
    """A third engine's driver that provides only part of the dialect is refused when it
    is made, naming every part it lacks; and the SQL each engine writes its own way
    refuses to compile for any other, naming itself."""
    from sqlalchemy.dialects import mysql
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import CompileError

    from durafn import DatabaseError
    from durafn._store import Driver
    from durafn._store.sql import carries, next_seq

    class Half(Driver):
        name = "Half"
        max_mutation_lanes = 1

    with pytest.raises(DatabaseError) as refused:
        Half(make_url("mysql+aiomysql://app@db/app"))
    assert str(refused.value) == (
        "durafn cannot run on mysql: its driver Half lacks default_poll_interval, "
        "auto_migrate, default_max_connections, dialect_insert, create_engine, insert_rows, "
        "install_release_trigger, add_seq_column, SQL for within, SQL for next_seq, "
        "SQL for arg_equals, SQL for arg_contains, SQL for minute_start (interface.Dialect "
        "lists what a dialect "
        "must provide)"
    )
    for element, name in ((carries("x"), "within"), (next_seq(), "next_seq")):
        with pytest.raises(CompileError, match=f"durafn has no SQL for '{name}' on mysql"):
            element.compile(dialect=mysql.dialect())
