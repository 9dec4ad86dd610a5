"""Every combination of some pool settings through the simulator, and the Pareto front of
waiting (p95) against euros per day: as a table, an SVG picture and a terminal chart."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from html import escape
from typing import Any

from sp00ky_infra.simulate.report import Bill, Report, billed, common_window, fmt_s, report
from sp00ky_infra.simulate.runner import Run, SettingError, setting


@dataclass(frozen=True, slots=True)
class Point:
    label: str  # "min=0 buffer=1 idleTimeout=5m", as given
    report: Report

    @property
    def wait(self) -> float:
        return self.report.wait_p95

    @property
    def euros(self) -> float:
        return self.report.euros_per_day


def parse_axes(texts: Sequence[str]) -> list[tuple[str, list[str]]]:
    """``["min=0,1,2", "idleTimeout=1m,5m"]`` -> [("min", ["0","1","2"]), ...], checked."""
    axes = []
    for text in texts:
        key, _, values = text.partition("=")
        options = [v.strip() for v in values.split(",") if v.strip()]
        if not options:
            raise SettingError(f"{text}: write NAME=V1,V2,..., e.g. idleTimeout=1m,5m,15m")
        for value in options:
            setting(key, value)  # raises on a bad name or value
        axes.append((key, options))
    return axes


def combinations(axes: Sequence[tuple[str, list[str]]]) -> list[dict[str, str]]:
    keys = [key for key, _ in axes]
    return [
        dict(zip(keys, values, strict=True)) for values in itertools.product(*(v for _, v in axes))
    ]


def _one(job: tuple[Run, dict[str, str]]) -> tuple[Point, Bill]:
    run, combo = job
    changes = dict(setting(key, value) for key, value in combo.items())
    changed = run.changed(changes)
    label = " ".join(f"{k}={v}" for k, v in combo.items())
    outcome = changed.outcome()
    found = report(changed.pool.name, outcome, run.price, snapshot=changed.snapshot)
    return Point(label, found), Bill.of(outcome, run.price, changed.snapshot)


def sweep(
    run: Run, axes: Sequence[tuple[str, list[str]]], workers: int | None = None
) -> list[Point]:
    """Every combination of ``axes`` on ``run``'s pool, in the order of the combinations,
    each one's euros over the same window: the latest end among them (a run divided by its
    own span would rank a longer ``idleTimeout``, which ends later, too cheap)."""
    jobs = [(run, combo) for combo in combinations(axes)]
    workers = workers if workers is not None else min(len(jobs), os.cpu_count() or 1)
    if workers <= 1:
        done = [_one(job) for job in jobs]
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            done = list(pool.map(_one, jobs))
    window = common_window(point.report.span for point, _ in done)
    return [Point(point.label, billed(point.report, bill, window)) for point, bill in done]


def pareto(points: Sequence[Point]) -> list[Point]:
    """The points no other point beats on both wait p95 and euros a day, cheapest first."""
    front: list[Point] = []
    for point in sorted(points, key=lambda p: (p.euros, p.wait, p.label)):
        if not front or point.wait < front[-1].wait:
            front.append(point)
    return front


def table(points: Sequence[Point]) -> list[list[str]]:
    """Rows for the front: setting, wait p95, wait p99, euros a day, idle share, machine-hours."""
    rows = [["setting", "wait p95", "wait p99", "EUR/day", "idle", "machine-h/day", "timeouts"]]
    for p in points:
        r = p.report
        day = 86400.0 / max(r.window, 1.0)
        idle = r.idle_euros / r.machine_euros if r.machine_euros else 0.0
        rows.append(
            [
                p.label,
                fmt_s(r.wait_p95),
                fmt_s(r.wait_p99),
                f"{r.euros_per_day:.2f}",
                f"{idle:.0%}",
                f"{r.machine_hours * day:.1f}",
                str(r.queue_timeouts),
            ]
        )
    return rows


def markdown(rows: Sequence[Sequence[str]]) -> str:
    head, *body = rows
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines) + "\n"


# --- pictures ---------------------------------------------------------------------------------


def _scale(lo: float, hi: float, size: float) -> Callable[[float], float]:
    span = hi - lo or 1.0
    return lambda v: (v - lo) / span * size


def svg(points: Sequence[Point], title: str, width: int = 720, height: int = 440) -> str:
    """A scatter of every point (wait p95 across, euros a day up), the front joined and named."""
    front = pareto(points)
    left, right, top, bottom = 70, 30, 40, 55
    w, h = width - left - right, height - top - bottom
    xs = [p.wait for p in points]
    ys = [p.euros for p in points]
    sx = _scale(0.0, max(xs) * 1.05 or 1.0, w)
    sy = _scale(0.0, max(ys) * 1.1 or 1.0, h)

    def at(p: Point) -> tuple[float, float]:
        return left + sx(p.wait), top + h - sy(p.euros)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2}" y="22" text-anchor="middle" font-size="15">{escape(title)}</text>',
        f'<line x1="{left}" y1="{top + h}" x2="{left + w}" y2="{top + h}" stroke="black"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + h}" stroke="black"/>',
        f'<text x="{left + w / 2}" y="{height - 12}" text-anchor="middle">wait p95</text>',
        f'<text x="16" y="{top + h / 2}" text-anchor="middle" '
        f'transform="rotate(-90 16 {top + h / 2})">EUR per day</text>',
    ]
    top_x, top_y = max(xs) * 1.05 or 1.0, max(ys) * 1.1 or 1.0
    for i in range(5):
        vx, vy = top_x * i / 4, top_y * i / 4
        x, y = left + sx(vx), top + h - sy(vy)
        out.append(f'<text x="{x}" y="{top + h + 16}" text-anchor="middle">{fmt_s(vx)}</text>')
        out.append(f'<text x="{left - 6}" y="{y + 4}" text-anchor="end">{vy:.2f}</text>')
        out.append(f'<line x1="{left}" y1="{y}" x2="{left + w}" y2="{y}" stroke="#eee"/>')
    for p in points:
        x, y = at(p)
        out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="#bbb"/>')
    path = " ".join(f"{x:.1f},{y:.1f}" for x, y in map(at, front))
    out.append(f'<polyline points="{path}" fill="none" stroke="#c0392b" stroke-width="1.5"/>')
    for p in front:
        x, y = at(p)
        out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4.5" fill="#c0392b"/>')
        out.append(f'<text x="{x + 7:.1f}" y="{y - 6:.1f}" font-size="10">{escape(p.label)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


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
    lines.append(" " * 9 + f"0{'wait p95':^{width - 12}}{fmt_s(top_x):>10}")
    lines.append(" " * 9 + "EUR/day up; # on the Pareto front, o dominated")
    return "\n".join(lines) + "\n"


def summary(points: Sequence[Point]) -> Mapping[str, Any]:
    front = pareto(points)
    return {
        "points": [{"setting": p.label, **p.report.as_dict()} for p in points],
        "front": [p.label for p in front],
    }
