"""The crons' page: each described in words, its last run and outcome, its next fire times
with the clock changes on the way marked; enable, disable, trigger, and remove (after a
confirmation)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .._cron_rules import schedule_of
from .._models import CronInfo
from .surface import Done, Pages, Refused

NEXT_FIRES = 5
CRON_ACTIONS = ("enable", "disable", "trigger", "remove")


def routes(d: Pages) -> list[Route]:
    pages = CronPages(d)
    return [
        Route("/crons", pages.crons),
        Route("/crons/{name}/{action}", pages.cron_action, methods=["GET", "POST"]),
    ]


class CronPages:
    def __init__(self, d: Pages) -> None:
        self.d = d

    async def crons(self, request: Request) -> Response:
        async def body(user: str) -> dict[str, Any]:
            app = self.d.app
            now = app.clock.now()
            found = await app.crons()
            # Each cron's last row, for its outcome: a read by primary key per cron.
            last = {c.name: await app.get(c.last_row_id) for c in found if c.last_row_id}
            return {"crons": [(c, _next_fires(c, now), last.get(c.name)) for c in found]}

        return await self.d.page(request, "crons.html", body)

    async def cron_action(self, request: Request) -> Response:
        name, what = str(request.path_params["name"]), str(request.path_params["action"])
        if request.method == "GET":  # only a removal asks first

            async def confirm(user: str) -> dict[str, Any]:
                if what != "remove":
                    raise Refused(405, f"a cron's {what} is a POST from the crons page")
                cron = await self._cron(name)
                return {
                    "title": f"Remove the cron {name}?",
                    "what": f"It runs {cron.function} ({cron.describe}). Removed, it schedules "
                    "nothing more; rows it scheduled already stay. A cron declared in code "
                    "comes back when a worker of that code starts: remove it from the code too.",
                    "action": f"/crons/{name}/remove",
                    "button": "Remove this cron",
                    "back": "/crons",
                }

            return await self.d.page(request, "confirm_one.html", confirm)

        async def act(user: str, form: Any) -> Done:
            return await self._change(name, what)

        return await self.d.act(request, act)

    async def _change(self, name: str, what: str) -> Done:
        if what not in CRON_ACTIONS:
            raise Refused(404, f"no cron action {what!r}: one of {', '.join(CRON_ACTIONS)}")
        await self._cron(name)
        app, rows = self.d.app, 0
        if what == "enable":
            await app.enable_cron(name)
            said = f"cron {name} enabled"
        elif what == "disable":
            await app.disable_cron(name)
            said = f"cron {name} disabled"
        elif what == "trigger":
            id = await app.trigger_cron(name)
            said, rows = f"cron {name} triggered: row {id}", 1
        else:
            await app.remove_cron(name)
            said = f"cron {name} removed"
        return Done(said, "/crons", f"cron {what}", name, rows)

    async def _cron(self, name: str) -> CronInfo:
        for cron in await self.d.app.crons():
            if cron.name == name:
                return cron
        raise Refused(404, f"no cron {name!r}")


def _next_fires(cron: CronInfo, now: float) -> list[tuple[datetime, str | None]]:
    """The next fire times in the cron's zone, each with what the clock did on the way:
    a fire in a repeated hour (which pass), or the first after a change of UTC offset."""
    if not cron.enabled:
        return []
    schedule = schedule_of(cron.schedule, cron.timezone, cron.source)
    out: list[tuple[datetime, str | None]] = []
    previous = datetime.fromtimestamp(now, schedule.zone)
    for fire in schedule.iter_after(previous):
        out.append((fire, _clock_note(fire, previous)))
        previous = fire
        if len(out) == NEXT_FIRES:
            break
    return out


def _clock_note(fire: datetime, previous: datetime) -> str | None:
    wall = fire.replace(tzinfo=None)
    first = wall.replace(tzinfo=fire.tzinfo, fold=0).utcoffset()
    second = wall.replace(tzinfo=fire.tzinfo, fold=1).utcoffset()
    if first != second and fire.fold == 1:
        return "DST: the second pass of a repeated hour"
    if first != second:
        return "DST: the first pass of a repeated hour"
    if previous.utcoffset() != fire.utcoffset():
        said = (
            f"DST: clocks changed since the previous fire ({_offset(previous)} → {_offset(fire)})"
        )
        skipped = _skipped(previous, fire)
        return said if skipped is None else f"{said}; {skipped}"
    return None


def _skipped(previous: datetime, fire: datetime) -> str | None:
    """Where the clocks jumped forward between two fires and this fire's time of day fell
    in the hour that did not exist that day: the fire of that day was skipped."""
    before, after = previous.utcoffset() or timedelta(0), fire.utcoffset() or timedelta(0)
    if after <= before:
        return None
    low, high = previous.timestamp(), fire.timestamp()
    while high - low > 1:  # the instant of the change, to the second
        middle = (low + high) / 2
        if datetime.fromtimestamp(middle, fire.tzinfo).utcoffset() == before:
            low = middle
        else:
            high = middle
    jump = datetime.fromtimestamp(round(high), fire.tzinfo)  # the first wall time after it
    start = (jump - (after - before)).replace(tzinfo=None).time()
    if not start <= fire.time() < jump.time():
        return None
    return (
        f"the {fire.strftime('%H:%M')} of {jump.date().isoformat()} did not exist "
        f"(clocks went from {start.strftime('%H:%M')} to {jump.strftime('%H:%M')}): skipped"
    )


def _offset(t: datetime) -> str:
    offset = t.utcoffset() or timedelta(0)
    minutes = int(offset.total_seconds() // 60)
    sign = "+" if minutes >= 0 else "-"
    return f"UTC{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"
