"""An app defined at module level, as users define theirs (``tests/test_first_hour.py``
tests it with ``app.using``)."""

from __future__ import annotations

import durafn
from durafn import HookEvent, MutationCtx
from durafn.cron import daily

app = durafn.App()  # ./durafn.sqlite3: never opened by the tests, which use app.using

successes: list[str] = []


@app.mutation(name="module:digest")
async def digest(ctx: MutationCtx, to: str) -> str:
    return f"digest for {to} at {ctx.now().isoformat()}"


@app.on("success")
def _count(event: HookEvent) -> None:
    successes.append(event.name)


app.cron("module-digest", daily(hour=2), digest.call("ops"))
