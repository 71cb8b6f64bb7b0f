"""A tiny app for the command-line tests: ``--app tests.apps.cli_app`` (or
``tests.apps.cli_app:app``).

``app`` reads ``$DURAFN_DATABASE_URL`` at import, as a user's module would; tests that need
a fresh app on their own database call ``make_app(url)``.
"""

from __future__ import annotations

import durafn
from durafn import ActionCtx, MutationCtx

ADD = "cli:add"
NOTIFY = "cli:notify"


def make_app(url: str | None = None) -> durafn.App:
    application = durafn.App(url)

    @application.mutation(name=ADD)
    async def add(ctx: MutationCtx, a: int, b: int) -> int:
        if b < 0:
            # Brackets: the CLI must print messages as text, not as rich markup.
            raise ValueError(f"b must not be negative [got {b}]")
        return a + b

    @application.action(name=NOTIFY)
    async def notify(ctx: ActionCtx, to: str) -> str:
        return f"sent to {to}"

    return application


app = make_app()
