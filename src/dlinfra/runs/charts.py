"""Charts of a run as inline SVG text, drawn here in Python: the report page needs no plotting library,
no script and no network to open. Every text is escaped; every mark carries the figure it stands for
(a timeline mark its data-t, a bar its data-value), so a browser test can check where it was drawn
against the run's records."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from html import escape

WIDTH = 900
LEFT, RIGHT = 110, 20  # room for lane names and value ticks; the plot runs from LEFT to WIDTH - RIGHT
LANE = 28
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")


@dataclass
class Mark:
    """One moment on a node's lane: a startup phase, a checkpoint, a fault, a restart, the end."""

    t: float  # seconds after the command started
    kind: str  # phase | checkpoint | fault | restart | resumed | done | straggler | incident
    says: str
    seconds: float = 0.0  # how long it lasted (an incident: its span on the lane)


@dataclass
class Lane:
    node: str
    start: float | None  # its first life's start, seconds after the command (None: it never came up)
    end: float | None
    marks: list[Mark] = field(default_factory=list)


def _x(t: float, t1: float) -> float:
    return LEFT + (WIDTH - LEFT - RIGHT) * (min(max(t, 0.0), t1) / t1 if t1 > 0 else 0.0)


def _ticks(top: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to at least `top`."""
    if top <= 0:
        return [0.0]
    raw = top / count
    step = next(m * 10**e for e in range(-3, 12) for m in (1, 2, 5) if m * 10**e >= raw)
    return [i * step for i in range(int(top / step) + 1)]


def _fmt(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


SHAPES = {
    "phase": '<line x1="{x:.2f}" y1="{top:.1f}" x2="{x:.2f}" y2="{bottom:.1f}" class="tick"/>',
    "checkpoint": '<rect x="{xl:.2f}" y="{mid_l:.1f}" width="6" height="6" class="shape"/>',
    "fault": '<path d="M{xl:.2f},{top:.1f} L{xr:.2f},{bottom:.1f} M{xl:.2f},{bottom:.1f} '
    'L{xr:.2f},{top:.1f}" class="shape"/>',
    "restart": '<circle cx="{x:.2f}" cy="{mid:.1f}" r="5" class="shape"/>',
    "resumed": '<path d="M{x:.2f},{top:.1f} L{xr:.2f},{mid:.1f} L{x:.2f},{bottom:.1f} Z" class="shape"/>',
    "done": '<rect x="{xl:.2f}" y="{top:.1f}" width="6" height="{height:.1f}" class="shape"/>',
    "straggler": '<circle cx="{x:.2f}" cy="{mid:.1f}" r="4" class="shape"/>',
    "incident": '<rect x="{x:.2f}" y="{top:.1f}" width="{width:.2f}" height="{height:.1f}" class="shape"/>',
}


def timeline(lanes: list[Lane], t1: float) -> str:
    """One lane per node on the command's clock: its lives as a bar, its moments as marks."""
    height = 30 + LANE * len(lanes) + 24
    t1 = max(t1, max((m.t for lane in lanes for m in lane.marks), default=0.0), 1e-9)
    out = [
        f'<svg class="timeline" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" '
        f'data-t0="0" data-t1="{t1:.3f}" data-x0="{LEFT}" data-x1="{WIDTH - RIGHT}" role="img" '
        f'xmlns="http://www.w3.org/2000/svg"><title>timeline of each node</title>'
    ]
    bottom_axis = 30 + LANE * len(lanes)
    for tick in _ticks(t1):
        x = _x(tick, t1)
        out.append(
            f'<line x1="{x:.1f}" y1="20" x2="{x:.1f}" y2="{bottom_axis}" class="grid"/>'
            f'<text x="{x:.1f}" y="{bottom_axis + 16}" class="axis" text-anchor="middle">'
            f"{_fmt(tick)} s</text>"
        )
    for i, lane in enumerate(lanes):
        top = 30 + LANE * i
        mid = top + LANE / 2 - 3
        out.append(f'<g class="lane" data-node="{escape(lane.node)}">')
        out.append(f'<text x="{LEFT - 8}" y="{mid + 4:.1f}" class="label" text-anchor="end">')
        out.append(f"{escape(lane.node)}</text>")
        if lane.start is not None:
            x0, x1 = _x(lane.start, t1), _x(lane.end if lane.end is not None else t1, t1)
            out.append(
                f'<rect x="{x0:.2f}" y="{mid - 4:.1f}" width="{max(x1 - x0, 1):.2f}" height="8" '
                'class="life"/>'
            )
        for mark in sorted(lane.marks, key=lambda m: m.t):
            x = _x(mark.t, t1)
            width = max(_x(mark.t + mark.seconds, t1) - x, 2.0)
            shape = SHAPES[mark.kind].format(
                x=x, xl=x - 3, xr=x + 5, top=mid - 8, bottom=mid + 8, mid=mid, mid_l=mid - 3, height=16,
                width=width,
            )  # fmt: skip
            out.append(
                f'<g class="mark {mark.kind}" data-t="{mark.t:.3f}">{shape}'
                f"<title>{escape(lane.node)}: {escape(mark.says)} at {mark.t:.1f} s</title></g>"
            )
        out.append("</g>")
    out.append("</svg>")
    return "".join(out)


def line_chart(
    series: list[tuple[str, list[tuple[float, float]]]],
    x_label: str,
    y_label: str,
    css: str = "chart",
    x_max: float = 0.0,
) -> str:
    """Lines of (x, y) points, one per named series, from zero on both axes (x at least to `x_max`:
    a chart on the timeline's clock spans the run as the timeline does)."""
    points = [p for _, pts in series for p in pts]
    if not points:
        return f'<p class="none">no {escape(y_label)} recorded</p>'
    height, top, bottom = 260, 16, 220
    x1 = max(max(x for x, _ in points), x_max, 1e-9)
    y1 = max(max(y for _, y in points), 1e-9)
    y_ticks = _ticks(y1)
    if len(y_ticks) > 1 and y_ticks[-1] < y1:  # the axis ends on a tick above the highest point
        y1 = y_ticks[-1] + y_ticks[1]
        y_ticks.append(y1)
    out = [
        f'<svg class="{css}" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" role="img" '
        f'xmlns="http://www.w3.org/2000/svg"><title>{escape(y_label)} against {escape(x_label)}</title>'
    ]

    def y_of(y: float) -> float:
        return bottom - (bottom - top) * y / y1

    for tick in y_ticks:
        y = y_of(tick)
        out.append(
            f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" class="grid"/>'
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" class="axis" text-anchor="end">{_fmt(tick)}</text>'
        )
    for tick in _ticks(x1):
        out.append(
            f'<text x="{_x(tick, x1):.1f}" y="{bottom + 16}" class="axis" text-anchor="middle">'
            f"{_fmt(tick)}</text>"
        )
    out.append(
        f'<text x="{(LEFT + WIDTH) / 2:.0f}" y="{bottom + 34}" class="axis" text-anchor="middle">'
        f"{escape(x_label)}</text>"
        f'<text x="14" y="{(top + bottom) / 2:.0f}" class="axis" transform="rotate(-90 14 '
        f'{(top + bottom) / 2:.0f})" text-anchor="middle">{escape(y_label)}</text>'
    )
    for i, (name, pts) in enumerate(series):
        colour = COLOURS[i % len(COLOURS)]
        path = " ".join(f"{_x(x, x1):.1f},{y_of(y):.1f}" for x, y in pts)
        out.append(
            f'<polyline class="series" data-name="{escape(name)}" points="{path}" fill="none" '
            f'stroke="{colour}" stroke-width="1.5"><title>{escape(name)}</title></polyline>'
        )
        if len(series) > 1:
            out.append(
                f'<text x="{LEFT + 10}" y="{top + 14 * (i + 1)}" fill="{colour}" class="legend">'
                f"{escape(name)}</text>"
            )
    out.append("</svg>")
    return "".join(out)


def bars(values: dict[str, float], unit: str, css: str = "bars") -> str:
    """A bar per node, with the fleet's median drawn across them: an odd node shows at a glance."""
    if not values:
        return ""
    height = 20 + 22 * len(values) + 10
    top = max(values.values()) or 1.0
    median = statistics.median(values.values())
    span = WIDTH - LEFT - RIGHT - 80
    out = [
        f'<svg class="{css}" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" role="img" '
        f'data-median="{median:.6g}" xmlns="http://www.w3.org/2000/svg"><title>{escape(unit)} per node, '
        f"against the median</title>"
    ]
    for i, (node, value) in enumerate(values.items()):
        y = 14 + 22 * i
        out.append(
            f'<text x="{LEFT - 8}" y="{y + 13}" class="label" text-anchor="end">{escape(node)}</text>'
            f'<rect x="{LEFT}" y="{y}" width="{span * value / top:.1f}" height="16" class="bar" '
            f'data-node="{escape(node)}" data-value="{value:.6g}"><title>{escape(node)}: {_fmt(value)} '
            f"{escape(unit)}</title></rect>"
            f'<text x="{LEFT + span * value / top + 6:.1f}" y="{y + 13}" class="axis">{_fmt(value)} '
            f"{escape(unit)}</text>"
        )
    x = LEFT + span * median / top
    out.append(
        f'<line x1="{x:.1f}" y1="6" x2="{x:.1f}" y2="{height - 4}" class="median"/>'
        f'<text x="{x + 4:.1f}" y="{height - 2}" class="axis">median {_fmt(median)}</text></svg>'
    )
    return "".join(out)
