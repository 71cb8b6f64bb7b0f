"""What commands print: tables and key/value blocks for people, JSON for programs, and
the formatting of states, times and errors."""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click
from rich import box
from rich.console import Console, RenderableType
from rich.table import Column, Table
from rich.text import Text

from .._kinds import State

if TYPE_CHECKING:
    from .._models import ErrorInfo, FailedAttempt

PIPE_WIDTH = 1000
"""Console width when stdout is not a terminal: there is no screen to fit, and an id folded
over two lines would defeat grep and copy-paste."""


class Output:
    """Tables and key/value blocks for people, or JSON for programs (``--json``)."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.console = Console(highlight=False, soft_wrap=False)
        if not self.console.is_terminal:
            self.console.width = PIPE_WIDTH

    def json(self, value: Any) -> None:
        click.echo(json.dumps(value, indent=2, default=str))

    @property
    def width(self) -> int:
        return self.console.width

    @width.setter
    def width(self, columns: int) -> None:
        self.console.width = columns

    def table(
        self,
        columns: Sequence[str | Column],
        rows: Iterable[Sequence[Any]],
        title: str = "",
        *,
        compact: bool = False,
    ) -> None:
        """``columns``: names, or rich ``Column``s made for this table (they keep its cells).
        ``compact``: no vertical rules, to fit a narrow terminal."""
        table = Table(
            *(Column(c, overflow="fold") if isinstance(c, str) else c for c in columns),
            title=title or None,
            title_justify="left",
            header_style="bold",
        )
        if compact:  # no rules, one space between columns: 9 more for the name at 80
            table.box, table.padding, table.pad_edge = box.SIMPLE_HEAD, (0, 0, 0, 0), False
            table.show_edge = False
        for row in rows:
            table.add_row(*map(cell, row))
        self.console.print(table)

    def fields(self, pairs: Iterable[tuple[str, Any]]) -> None:
        """A key/value block, one row per field."""
        table = Table(show_header=False)
        table.add_column(style="bold", no_wrap=True)
        table.add_column(overflow="fold")
        for key, value in pairs:
            table.add_row(key, cell(value))
        self.console.print(table)

    def line(self, text: str) -> None:
        self.console.print(text, markup=False)


def cell(value: Any) -> RenderableType:
    # Text, not str: rich would read "[...]" in an error message or an argument as markup.
    if isinstance(value, Text):
        return value
    return Text("" if value is None else str(value))


# -- formatting --------------------------------------------------------------------------

STATE_STYLES = {
    State.PENDING: "",
    State.IN_PROGRESS: "cyan",
    State.SUCCESS: "green",
    State.FAILED: "red",
    State.CANCELED: "yellow",
}

ERROR_WIDTH = 60
"""How much of an error ``ls`` shows; ``show`` has all of it."""


def iso(when: datetime | None) -> str:
    """UTC to the millisecond: one zone and one width, so that columns line up and sort."""
    if when is None:
        return ""
    return when.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def plural(count: int, noun: str) -> str:
    """``1 finished row``, ``4 finished rows``."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def duration(seconds: float) -> str:
    """For people: ``0.4 s``, ``12 min 5 s``, ``2 h 10 min``, ``3 d 4 h`` (``--json`` has
    the exact seconds)."""
    if abs(seconds) < 60:
        return f"{seconds:.1f} s"
    whole = round(abs(seconds))
    sign = "-" if seconds < 0 else ""
    for unit, size, sub_unit, sub_size in (
        ("d", 86400, "h", 3600),
        ("h", 3600, "min", 60),
        ("min", 60, "s", 1),
    ):
        if whole >= size:
            return f"{sign}{whole // size} {unit} {whole % size // sub_size} {sub_unit}"
    return f"{seconds:.1f} s"  # pragma: no cover - every whole >= 60 is matched above


def short_time(when: datetime) -> str:
    """UTC to the second, for a narrow table: ``2030-01-31 12:00:00``."""
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def state_text(state: State) -> Text:
    return Text(state.value, style=STATE_STYLES[state])


def error_text(error: ErrorInfo | None) -> str:
    return "" if error is None else f"{error.type}: {error.message}"


def shorten(text: str, width: int) -> str:
    """The first line of ``text``, at most ``width`` characters; "…" says something was cut."""
    first, *rest = text.splitlines() or [""]
    if len(first) <= width and not rest:
        return first
    return first[: width - 1] + "…"


SHOW_BOUND = 4000
"""Characters of a field ``show`` prints unless ``--full``: an argument may hold 8 MB, a
group callback's the ids of hundreds of rows."""


def field_value(name: str, value: Any, bound: int | None = SHOW_BOUND) -> RenderableType:
    """One field of a row, as ``show`` prints it: at most ``bound`` characters (None: all)."""
    if isinstance(value, State):
        return state_text(value)
    return cell(bounded(_field_text(name, value), bound))


def _field_text(name: str, value: Any) -> Any:
    if name in ("args", "result"):
        return json.dumps(value, indent=2, ensure_ascii=False, default=str)
    if isinstance(value, datetime):
        return iso(value)
    from .._models import ErrorInfo  # pydantic's: when there is an error to show

    if isinstance(value, ErrorInfo):
        traceback = f"\n\n{value.traceback.rstrip()}" if value.traceback else ""
        return error_text(value) + traceback
    if isinstance(value, enum.Enum):
        return value.value
    if name == "history":
        return "\n".join(history_line(attempt) for attempt in value) or "-"
    if name == "progress" and value is not None:
        return f"{value:.0%}"
    return value


def bounded(value: Any, bound: int | None) -> Any:
    """``value``'s text cut at ``bound`` characters, saying how much was left out."""
    if bound is None or not isinstance(value, str) or len(value) <= bound:
        return value
    return f"{value[:bound]}… ({len(value) - bound:,} more characters: --full shows them all)"


def history_line(attempt: FailedAttempt) -> str:
    """One failed attempt, as ``show`` lists them: which, when, where, what, what next."""
    then = f"retried at {iso(attempt.retry_at)}" if attempt.retry_at else "not retried"
    where = attempt.worker_id or "-"
    error = error_text(attempt.error)
    return f"attempt {attempt.attempt} at {iso(attempt.failed_at)} on {where}: {error} ({then})"
