"""A request's thread as a WSGI server runs it, for ``tests/test_sync.py``'s kill -9: it
opens a transaction on the user's own sync engine, inserts an effect and schedules a row
through ``app.sync.scheduler(session)``, commits or not (``argv[3]``: ``commit`` or
``hold``), says so on stdout, and waits to be killed."""

from __future__ import annotations

import sys
import threading

from sqlalchemy import create_engine
from sqlalchemy.orm import Session

import durafn
from durafn import MutationCtx
from tests.support.models import Effect

app = durafn.App(sys.argv[1])


@app.mutation(name="sync:double")
async def double(ctx: MutationCtx, n: int) -> int:
    return 2 * n


def request(sync_url: str, then: str) -> None:
    engine = create_engine(sync_url)
    session = Session(engine)
    session.begin()
    session.add(Effect(key=f"killed-{then}"))
    sid = app.sync.scheduler(session).run_after(0, double, 7)
    if then == "commit":
        session.commit()
    print(f"{then} {sid}", flush=True)
    threading.Event().wait()  # killed here: before its commit, or after it


if __name__ == "__main__":
    worker = threading.Thread(target=request, args=(sys.argv[2], sys.argv[3]), daemon=True)
    worker.start()
    worker.join()
