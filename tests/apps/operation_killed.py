"""A process that takes a page of an operation, changes its rows, and is killed before
it commits (``python -m tests.apps.operation_killed URL``): it prints ``changed N`` once
the page's rows are changed in its open transaction, then waits to be ``kill -9``-ed."""

from __future__ import annotations

import sys
from typing import Any

import anyio

import durafn
from durafn import _operations

original = _operations._apply


async def changed_then_wait(*args: Any, **kwargs: Any) -> int:
    changed = await original(*args, **kwargs)
    print(f"changed {changed}", flush=True)
    await anyio.sleep_forever()
    return changed


async def main(url: str) -> None:
    _operations._apply = changed_then_wait
    app = durafn.App(url)
    try:
        await app.run_operations(pages=1)
    finally:
        await app.aclose()


if __name__ == "__main__":
    anyio.run(main, sys.argv[1])
