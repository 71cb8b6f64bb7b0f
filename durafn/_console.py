"""The operator's console on ``App``: the dashboard (``dashboard``), and the audit trail of
what operators did through it and the command line (``record_action``; the pages of it,
newest first: ``audit_log``), kept in ``_durafn_audit`` across restarts for the retention
period."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from ._checks import integer, optional, text
from ._clock import to_datetime
from ._errors import ArgumentError
from ._models import AuditEntry
from ._runtime import Runtime

logger = logging.getLogger("durafn.audit")

VIAS = ("dashboard", "cli", "api")
BOUND = 2000
"""Characters kept of an entry's target and outcome: a bulk change names its filter, a
long cron or queue name its own; neither should make the trail the size of the data."""


class Console:
    """The operator's console on ``App`` (a base class of it)."""

    _rt: Runtime

    def dashboard(
        self,
        *,
        token: str | None = None,
        auth: Callable[[Any], Any] | None = None,
        read_only: bool = False,
        hide_args: bool = False,
        allowed_hosts: Collection[str] = (),
    ) -> Any:
        """The operator's dashboard as an ASGI app (``durafn[dashboard]``), to mount:
        ``web.mount("/durafn", app.dashboard(auth=check, allowed_hosts=["ops.example.com"]))``.
        ``auth(request)`` returns the user's name, or None to refuse (the host's own login
        applies); or ``token``: a login form asks for it once. With neither, anyone who
        reaches it may use it: serve it on the loopback interface only. It answers the
        loopback names and ``allowed_hosts`` (a name, a ``.example.com`` suffix, or ``*``
        where the host application checks ``Host`` itself); any other ``Host`` gets a 400.
        ``read_only``: no action, any POST refused; ``hide_args``: arguments and results
        never shown."""
        from .dashboard import create

        return create(
            self,  # type: ignore[arg-type]  # Console is a part of App
            token=token,
            auth=auth,
            read_only=read_only,
            hide_args=hide_args,
            allowed_hosts=allowed_hosts,
        )

    # -- the audit trail --------------------------------------------------------------

    async def record_action(
        self, *, who: str, action: str, target: str, rows: int, outcome: str, via: str = "api"
    ) -> AuditEntry:
        """Record something an operator did: ``who`` did ``action`` to ``target``
        (``via`` the dashboard, the command line or your own ``api`` tool), changing
        ``rows`` rows, with ``outcome``. Also logged at INFO on ``durafn.audit``. The
        dashboard and the command line's changes record themselves."""
        if via not in VIAS:
            raise ArgumentError(f"via must be one of {', '.join(VIAS)}, not {via!r}")
        fields = {
            "who": _bounded(text("who", who)),
            "action": _bounded(text("action", action)),
            "target": _bounded(text("target", target)),
            "outcome": _bounded(text("outcome", outcome)),
        }
        rows = integer("rows", rows, low=0)
        at = self._rt.clock.now()

        async def _write(conn: AsyncConnection) -> int:
            return await self._rt.driver.record_audit(conn, at=at, via=via, rows=rows, **fields)

        id = await self._rt.transaction(_write, doing="recording an operator's action")
        entry = AuditEntry(id=id, at=to_datetime(at), via=via, rows=rows, **fields)
        logger.info(
            "%s via %s: %s %s (%d rows): %s",
            entry.who,
            via,
            entry.action,
            entry.target,
            rows,
            entry.outcome,
        )
        return entry

    async def audit_log(self, *, limit: int = 50, before: int | None = None) -> list[AuditEntry]:
        """What operators did, newest first: ``limit`` entries, older than the entry
        ``before`` (an ``AuditEntry.id``: the next page starts below the last one shown)."""
        limit = integer("limit", limit, high=10_000)
        before = optional(integer, "before", before)

        async def _read(conn: AsyncConnection) -> list[AuditEntry]:
            return await self._rt.driver.list_audit(conn, limit=limit, before=before)

        return await self._rt.transaction(_read, read_only=True, doing="reading the audit log")


def _bounded(value: str) -> str:
    return value if len(value) <= BOUND else value[: BOUND - 1] + "…"
