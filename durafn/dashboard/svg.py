"""Charts drawn on the server as inline SVG: stacked bars (rows ended per minute by
state) and lines on a log scale (start lag p50 and p99), each with its axes, units, a
legend and a title per point for the pointer; no JavaScript, no library. Colours come
from the stylesheet's classes (``s-Success``, ``s-p50``...), so dark mode recolours
them. Every text is escaped (a function's name is a user's string)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from markupsafe import Markup, escape

WIDTH, HEIGHT = 720, 220
LEFT, RIGHT, TOP, BOTTOM = 64, 12, 12, 32


@dataclass(frozen=True)
class Series:
    key: str
    """Its CSS class (``s-<key>``) and its values' key."""
    label: str


def _nice(most: float) -> tuple[float, list[float]]:
    """A round top for a linear axis and its ticks (about 4)."""
    if most <= 0:
        return 1.0, [0.0, 1.0]
    raw = most / 4
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    top = math.ceil(most / step) * step
    return top, [i * step for i in range(round(top / step) + 1)]


def _number(v: float) -> str:
    if v >= 10_000:
        return f"{v / 1000:,.0f}k"
    return f"{v:,.0f}" if v == int(v) else f"{v:,.1f}"


def seconds(v: float) -> str:
    """A duration for a label: 850 ms, 1.2 s, 3.5 min; "< 1 ms" for the histograms'
    first bucket (``_latency.EDGES``), which holds every value below it."""
    if v < 0.001:
        return "< 1 ms"
    if v < 1:
        return f"{v * 1000:.3g} ms"
    if v < 120:
        return f"{v:.3g} s"
    return f"{v / 60:.3g} min"


def _time_label(at: datetime, step: int) -> str:
    return at.strftime("%a %d %H:%M" if step >= 3600 else "%H:%M")


def _frame(
    label: str, unit: str, ticks: list[tuple[float, str]], starts: Sequence[datetime], step: int
) -> list[str]:
    """The title, the y axis with its unit and grid lines, the x axis with about six
    time labels (UTC)."""
    inner_w, inner_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    out = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(label)}" preserveAspectRatio="xMinYMin meet">',
        f"<title>{escape(label)}</title>",
        '<g class="grid">',
    ]
    for y, _ in ticks:
        out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>')
    out.append('</g><g class="axis y-axis">')
    out.append(f'<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{TOP + inner_h}"/>')
    for y, text in ticks:
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(text)}</text>')
    out.append(
        f'<text class="unit" x="12" y="{TOP + inner_h / 2:.0f}" text-anchor="middle" '
        f'transform="rotate(-90 12 {TOP + inner_h / 2:.0f})">{escape(unit)}</text>'
    )
    out.append('</g><g class="axis x-axis">')
    bottom = TOP + inner_h
    out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{bottom}" y2="{bottom}"/>')
    n = len(starts)
    every = max(1, math.ceil(n / 6))
    for i in range(every // 2, n, every):  # not at the corner, where the y axis's 0 is
        x = LEFT + inner_w * (i + 0.5) / n
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{bottom}" y2="{bottom + 4}"/>')
        out.append(
            f'<text x="{x:.1f}" y="{bottom + 17}" text-anchor="middle">'
            f"{_time_label(starts[i], step)}</text>"
        )
    out.append("</g>")
    return out


def stacked_bars(
    starts: Sequence[datetime],
    values: Sequence[dict[str, int]],
    series: Sequence[Series],
    *,
    step: int,
    unit: str,
    label: str,
    id: str,
) -> Markup:
    """Bars per point, one segment per series stacked from the axis up."""
    inner_w, inner_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    totals = [sum(v.get(s.key, 0) for s in series) for v in values]
    top, ticks = _nice(max(totals, default=0))
    scale = inner_h / top
    out = _frame(
        label, unit, [(TOP + inner_h - t * scale, _number(t)) for t in ticks], starts, step
    )
    n = max(len(starts), 1)
    slot = inner_w / n
    bar = max(slot * 0.8, 1.0)
    for i, (at, v) in enumerate(zip(starts, values, strict=True)):
        y: float = TOP + inner_h
        x = LEFT + slot * i + (slot - bar) / 2
        for s in series:
            count = v.get(s.key, 0)
            if not count:
                continue
            h = count * scale
            y -= h
            out.append(
                f'<rect class="s-{s.key}" x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" '
                f'height="{h:.1f}"><title>{_time_label(at, step)} UTC: {count:,} '
                f"{escape(s.label)}</title></rect>"
            )
    out.append("</svg>")
    return _figure(id, out, series, label)


def log_lines(
    starts: Sequence[datetime],
    values: Sequence[dict[str, float | None]],
    series: Sequence[Series],
    *,
    step: int,
    label: str,
    id: str,
) -> Markup:
    """A line per series on a log scale of seconds (a point without a value: a gap)."""
    inner_w, inner_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    seen = [x for v in values for x in v.values() if x is not None and x > 0]
    # The axis starts at 1 ms: the histograms' first bucket holds everything below it.
    low = max(10 ** math.floor(math.log10(min(seen))), 0.001) if seen else 0.001
    high = max(10 ** math.ceil(math.log10(max(seen))), low * 10) if seen else 1.0
    if high <= low:
        high = low * 10
    span = math.log10(high) - math.log10(low)

    def y_of(v: float) -> float:
        return TOP + inner_h - (math.log10(max(v, low)) - math.log10(low)) / span * inner_h

    decades = range(round(math.log10(low)), round(math.log10(high)) + 1)
    ticks = [(y_of(10.0**d), seconds(10.0**d)) for d in decades]
    out = _frame(label, "seconds (log scale)", ticks, starts, step)
    n = max(len(starts), 1)
    for s in series:
        path: list[str] = []
        move = True
        for i, v in enumerate(values):
            value = v.get(s.key)
            if value is None:
                move = True
                continue
            x = LEFT + inner_w * (i + 0.5) / n
            path.append(f"{'M' if move else 'L'}{x:.1f},{y_of(value):.1f}")
            move = False
        if path:
            out.append(f'<path class="line s-{s.key}" d="{" ".join(path)}"/>')
        for i, (at, v) in enumerate(zip(starts, values, strict=True)):
            value = v.get(s.key)
            if value is not None:
                x = LEFT + inner_w * (i + 0.5) / n
                out.append(
                    f'<circle class="s-{s.key}" cx="{x:.1f}" cy="{y_of(value):.1f}" r="2" '
                    f'fill="none"><title>{_time_label(at, step)} UTC: {escape(s.label)} '
                    f"{seconds(value)}</title></circle>"
                )
    out.append("</svg>")
    return _figure(id, out, series, label)


def _figure(id: str, svg: list[str], series: Sequence[Series], label: str) -> Markup:
    legend = "".join(
        f'<li><span class="swatch s-{s.key}"></span>{escape(s.label)}</li>' for s in series
    )
    return Markup(
        f'<figure class="chart" id="{escape(id)}">{"".join(svg)}'
        f'<ul class="legend" aria-label="legend">{legend}</ul>'
        f"<figcaption>{escape(label)}</figcaption></figure>"
    )
