"""Every combination of some pool settings through the simulator, the Pareto front of waiting
(p95) against euros per day, and the setting to choose with the figure that decided it: as a
table and JSON (the pictures are ``chart``'s)."""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

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


def on_front(points: Sequence[Point]) -> list[bool]:
    """For each point, whether it is on the Pareto front: no other point both waits less (p95)
    and costs less a day (a point with the very figures of one on the front is on it too)."""
    figures = {(p.wait, p.euros) for p in pareto(points)}
    return [(p.wait, p.euros) in figures for p in points]


@dataclass(frozen=True, slots=True)
class Recommendation:
    """The setting a sweep recommends, the figure that decided it, and why, in words."""

    point: Point
    decided_by: Literal["EUR/day", "wait p95"]
    reason: str


def lost_jobs(point: Point) -> int:
    """Jobs the setting did not run: those that hit queueTimeout, and those refused."""
    return point.report.queue_timeouts + point.report.refused


def recommend(points: Sequence[Point], max_wait: float | None = None) -> Recommendation:
    """The cheapest setting whose wait p95 is at most ``max_wait`` (every setting when None),
    decided by its euros a day; when none waits so little, the one that waits least, decided
    by its wait. Settings that lose jobs are left out while one loses none; ties go to the
    setting given first."""
    order = {id(p): i for i, p in enumerate(points)}
    whole = [p for p in points if not lost_jobs(p)] or list(points)
    left_out = "" if len(whole) == len(points) else f"; {_losing(len(points) - len(whole))}"
    meeting = [p for p in whole if max_wait is None or p.wait <= max_wait]
    if not meeting:
        best = min(whole, key=lambda p: (p.wait, p.euros, order[id(p)]))
        reason = (
            f"no setting keeps wait p95 within {fmt_s(max_wait or 0.0)}: this one waits least "
            f"({fmt_s(best.wait)}), at {best.euros:.2f} EUR/day{left_out}"
        )
        return Recommendation(best, "wait p95", reason)
    best = min(meeting, key=lambda p: (p.euros, p.wait, order[id(p)]))
    among = (
        f"of the {len(meeting)} settings whose wait p95 is at most {fmt_s(max_wait)}"
        if max_wait is not None
        else "of them all (give --max-wait to choose the cheapest within a wait)"
    )
    reason = (
        f"the cheapest ({best.euros:.2f} EUR/day, wait p95 {fmt_s(best.wait)}) {among}{left_out}"
    )
    return Recommendation(best, "EUR/day", reason)


def _losing(count: int) -> str:
    return f"{count} setting(s) whose jobs hit queueTimeout or were refused left out"


COLUMNS = ("", "setting", "wait p95", "wait p99", "EUR/day", "idle", "machine-h/day", "timeouts")


def table(points: Sequence[Point]) -> list[list[str]]:
    """Rows for every point, cheapest first (ties: the lower wait, then the order given), a
    ``*`` on those on the front: setting, waits, euros a day, idle share, machine-hours."""
    marks = dict(zip(map(id, points), on_front(points), strict=True))
    order = {id(p): i for i, p in enumerate(points)}
    rows = [list(COLUMNS)]
    for p in sorted(points, key=lambda p: (p.euros, p.wait, order[id(p)])):
        r = p.report
        day = 86400.0 / max(r.window, 1.0)
        idle = r.idle_euros / r.machine_euros if r.machine_euros else 0.0
        rows.append(
            [
                "*" if marks[id(p)] else "",
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
    head = ["front", *head[1:]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines) + "\n"


def summary(points: Sequence[Point], chosen: Recommendation) -> Mapping[str, Any]:
    """The sweep as JSON: every point (``on_front`` marked), the front, the recommendation."""
    marks = on_front(points)
    return {
        "points": [
            {"setting": p.label, "on_front": mark, **p.report.as_dict()}
            for p, mark in zip(points, marks, strict=True)
        ],
        "front": [p.label for p in pareto(points)],
        "recommended": {
            "setting": chosen.point.label,
            "decided_by": chosen.decided_by,
            "reason": chosen.reason,
        },
    }
