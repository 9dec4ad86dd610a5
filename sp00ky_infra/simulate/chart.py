"""A sweep's pictures: wait p95 across (a time axis, in round seconds, minutes or hours) and
euros a day up, every setting a point, the Pareto front joined and numbered, the recommended
setting ringed; as SVG, with a legend of the numbered points, and as text for a terminal.

Settings with the same figures share one marker (``x3`` beside it); the front's numbers are
placed where they overlap no other number nor marker, and the legend under the plot names
each one's settings, so no label runs into another or off the picture.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from sp00ky_infra.simulate.report import fmt_s
from sp00ky_infra.simulate.sweep import Point, Recommendation, pareto

# Steps a time axis may take, in seconds: round to a reader at every scale.
TIME_STEPS = (1, 2, 5, 10, 15, 20, 30, 60, 120, 300, 600, 900, 1200, 1800, 3600, 7200, 10800)
TICKS = 5  # about this many steps along an axis
NUMBER_OFFSETS = ((7, -7), (7, 13), (-15, -7), (-15, 13), (-4, -11), (-4, 19), (11, 3), (-19, 3))
CHAR_WIDTH = 6.0  # px of a character at the legend's and numbers' font size, for boxes


def time_step(top: float) -> float:
    """The smallest round step of ``TIME_STEPS`` that covers ``top`` in about ``TICKS``."""
    for step in TIME_STEPS:
        if top / step <= TICKS:
            return float(step)
    return 3600.0 * math.ceil(top / 3600.0 / TICKS)


def euro_step(top: float) -> float:
    """A 1-2-5 step that covers ``top`` euros in about ``TICKS``."""
    if top <= 0:
        return 0.01
    magnitude = 10.0 ** math.floor(math.log10(top / TICKS))
    return next(m * magnitude for m in (1.0, 2.0, 5.0, 10.0) if top / (m * magnitude) <= TICKS)


def time_label(seconds: float) -> str:
    """A round time with its unit: 0s, 45s, 1m, 1m30s, 2h, 1h30m."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        minutes, rest = divmod(whole, 60)
        return f"{minutes}m" + (f"{rest}s" if rest else "")
    hours, rest = divmod(whole, 3600)
    return f"{hours}h" + (f"{rest // 60}m" if rest // 60 else "")


@dataclass(frozen=True, slots=True)
class Marker:
    """Settings that share one place in the picture: their points, the first one's figures."""

    points: tuple[Point, ...]
    x: float
    y: float
    front: int = 0  # its number on the front (1 the cheapest), 0 when off it


@dataclass(frozen=True, slots=True)
class Frame:
    """The plot's box in the picture and its scales."""

    left: float
    top: float
    width: float
    height: float
    x_top: float  # seconds at the right edge
    y_top: float  # euros a day at the top edge

    def at(self, point: Point) -> tuple[float, float]:
        x = self.left + point.wait / self.x_top * self.width
        return x, self.top + self.height - point.euros / self.y_top * self.height


def _frame(points: Sequence[Point], width: int, plot_height: int) -> Frame:
    top_wait = max((p.wait for p in points), default=0.0) or 1.0
    top_euros = max((p.euros for p in points), default=0.0) or 0.01
    x_top = time_step(top_wait) * math.ceil(top_wait / time_step(top_wait))
    y_step = euro_step(top_euros)
    y_top = y_step * math.ceil(top_euros / y_step + 1e-9)
    return Frame(80.0, 48.0, width - 80.0 - 40.0, float(plot_height), x_top, y_top)


def markers(points: Sequence[Point], frame: Frame) -> list[Marker]:
    """One marker per place (to the pixel), front markers numbered cheapest first."""
    front = {id(p): i for i, p in enumerate(pareto(points), 1)}
    places: dict[tuple[int, int], list[Point]] = {}
    for p in points:
        x, y = frame.at(p)
        places.setdefault((round(x), round(y)), []).append(p)
    found = []
    for group in places.values():
        number = next((front[id(p)] for p in group if id(p) in front), 0)
        found.append(Marker(tuple(group), *frame.at(group[0]), front=number))
    return sorted(found, key=lambda m: (m.front == 0, m.front))


Box = tuple[float, float, float, float]


def _overlaps(a: Box, b: Box) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def place(text: str, x: float, y: float, taken: list[Box], inside: Box) -> tuple[float, float]:
    """Where ``text`` goes beside the marker at (x, y): the first offset whose box overlaps
    nothing ``taken`` and stays ``inside``; the box is then taken."""
    width, height = CHAR_WIDTH * len(text), 11.0
    choice = None
    for dx, dy in NUMBER_OFFSETS:
        box = (x + dx, y + dy - height + 2, x + dx + width, y + dy + 2)
        fits = inside[0] <= box[0] and box[2] <= inside[2] and inside[1] <= box[1]
        if fits and box[3] <= inside[3] and not any(_overlaps(box, t) for t in taken):
            choice = (x + dx, y + dy, box)
            break
    if choice is None:  # crowded: the first spot, the legend still says which point it is
        dx, dy = NUMBER_OFFSETS[0]
        choice = (x + dx, y + dy, (x + dx, y + dy - height + 2, x + dx + width, y + dy + 2))
    taken.append(choice[2])
    return choice[0], choice[1]


def _axes(frame: Frame) -> list[str]:
    """The grid and the euros' ticks, then the time ticks, the axes and their titles."""
    f = frame
    bottom = f.top + f.height
    out = []
    y_step = euro_step(f.y_top)
    decimals = max(2, -math.floor(math.log10(y_step)))  # a step of 0.005 shows as one
    for i in range(round(f.y_top / y_step) + 1):
        y = bottom - i * y_step / f.y_top * f.height
        out.append(f'<line x1="{f.left}" y1="{y:.1f}" x2="{f.left + f.width}" y2="{y:.1f}" '
                   'stroke="#eee"/>')  # fmt: skip
        euros = f"{i * y_step:.{decimals}f}"
        out.append(f'<text x="{f.left - 6}" y="{y + 4:.1f}" text-anchor="end">{euros}</text>')
    step = time_step(f.x_top)
    for i in range(round(f.x_top / step) + 1):
        x = f.left + i * step / f.x_top * f.width
        out.append(f'<line x1="{x:.1f}" y1="{bottom}" x2="{x:.1f}" y2="{bottom + 4}" '
                   'stroke="black"/>')  # fmt: skip
        out.append(
            f'<text x="{x:.1f}" y="{bottom + 18}" text-anchor="middle">'
            f"{time_label(i * step)}</text>"
        )
    right = f.left + f.width
    return [
        *out,
        f'<line x1="{f.left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="black"/>',
        f'<line x1="{f.left}" y1="{f.top}" x2="{f.left}" y2="{bottom}" stroke="black"/>',
        f'<text x="{f.left + f.width / 2}" y="{bottom + 40}" text-anchor="middle">wait p95: '
        "95% of jobs waited at most this long for a slot (time)</text>",
        f'<text x="18" y="{f.top + f.height / 2}" text-anchor="middle" '
        f'transform="rotate(-90 18 {f.top + f.height / 2})">cost (EUR per day)</text>',
    ]


def _legend_line(marker: Marker, chosen: Point | None) -> str:
    first = marker.points[0]
    alike = len(marker.points) - 1
    more = f" (and {alike} more with these figures)" if alike else ""
    mark = " (recommended, ringed)" if chosen is not None and chosen in marker.points else ""
    return (
        f"{marker.front}  {first.label}{more}: wait p95 {fmt_s(first.wait)}, "
        f"{first.euros:.2f} EUR/day{mark}"
    )


def svg(
    points: Sequence[Point],
    title: str,
    chosen: Recommendation | None = None,
    width: int = 760,
    plot_height: int = 340,
) -> str:
    """The scatter (see the module docstring), its legend under it."""
    frame = _frame(points, width, plot_height)
    found = markers(points, frame)
    front = [m for m in found if m.front]
    legend_top = frame.top + frame.height + 66
    height = round(legend_top + 18 * len(front) + 14)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2}" y="24" text-anchor="middle" font-size="15">{escape(title)}</text>',
        *_axes(frame),
    ]
    taken: list[Box] = [(m.x - 5, m.y - 5, m.x + 5, m.y + 5) for m in found]
    inside: Box = (frame.left, frame.top - 8, width - 4.0, frame.top + frame.height)
    out += _dots([m for m in found if not m.front], taken, inside)
    path = " ".join(f"{m.x:.1f},{m.y:.1f}" for m in sorted(front, key=lambda m: m.front))
    out.append(f'<polyline points="{path}" fill="none" stroke="#c0392b" stroke-width="1.5"/>')
    picked = chosen.point if chosen is not None else None
    for m in front:
        out.append(f'<circle cx="{m.x:.1f}" cy="{m.y:.1f}" r="4.5" fill="#c0392b"/>')
        if picked is not None and picked in m.points:
            out.append(f'<circle cx="{m.x:.1f}" cy="{m.y:.1f}" r="9" fill="none" '
                       'stroke="#1f6f3f" stroke-width="2"/>')  # fmt: skip
        x, y = place(str(m.front), m.x, m.y, taken, inside)
        out.append(f'<text x="{x:.1f}" y="{y:.1f}" fill="#c0392b">{m.front}</text>')
    for i, m in enumerate(front):
        line = escape(_legend_line(m, picked))
        out.append(f'<text x="{frame.left}" y="{legend_top + 18 * i:.0f}">{line}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _dots(off_front: Sequence[Marker], taken: list[Box], inside: Box) -> list[str]:
    """The settings off the front, grey, with how many share a marker when several do."""
    out = []
    for m in off_front:
        out.append(f'<circle cx="{m.x:.1f}" cy="{m.y:.1f}" r="3.5" fill="#aaa"/>')
        if len(m.points) > 1:
            x, y = place(f"x{len(m.points)}", m.x, m.y, taken, inside)
            out.append(
                f'<text x="{x:.1f}" y="{y:.1f}" font-size="10" fill="#777">x{len(m.points)}</text>'
            )
    return out


def terminal(points: Sequence[Point], width: int = 60, height: int = 16) -> str:
    """The same scatter in text: ``o`` a point, ``#`` a point on the front."""
    front = {id(p) for p in pareto(points)}
    top_x = max(p.wait for p in points) or 1.0
    top_y = max(p.euros for p in points) or 1.0
    grid = [[" "] * width for _ in range(height)]
    for p in points:
        col = min(width - 1, round(p.wait / top_x * (width - 1)))
        line = height - 1 - min(height - 1, round(p.euros / top_y * (height - 1)))
        if grid[line][col] != "#":
            grid[line][col] = "#" if id(p) in front else "o"
    lines = []
    for i, row in enumerate(grid):
        label = f"{top_y * (height - 1 - i) / (height - 1):7.2f}" if i % 5 == 0 else " " * 7
        lines.append(f"{label} |" + "".join(row))
    lines.append(" " * 8 + "+" + "-" * width)
    lines.append(" " * 9 + f"0s{'wait p95 (time)':^{width - 12}}{fmt_s(top_x):>10}")
    lines.append(" " * 9 + "EUR per day up; # on the Pareto front, o dominated")
    return "\n".join(lines) + "\n"
