"""What a simulated run cost: waits, queue, machine-hours, boots and euros, as plain data.

The euros are the machines' bill and, for a pool that boots a snapshot, what keeping that
snapshot over the same window costs (``policy.cost.snapshot_euros``: per GB and month,
prorated per started hour), each on a line of its own and together in ``euros``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from sp00ky_infra.policy.cost import Price, idle_euros, machine_euros, snapshot_euros
from sp00ky_infra.simulate.engine import Outcome

DAY = 86400.0


@dataclass(frozen=True, slots=True)
class Report:
    pool: str
    jobs: int
    started: int
    queue_timeouts: int
    refused: int
    wait_p50: float
    wait_p95: float
    wait_p99: float
    wait_max: float
    longest_queue: int
    machine_hours: float
    boots: int
    failed_boots: int
    euros: float
    idle_euros: float
    euros_per_job: float
    euros_per_day: float
    span: float  # seconds simulated
    peak_machines: int
    settled: bool
    machines_over_time: tuple[tuple[float, int], ...]
    window: float = 0.0  # seconds from the trace's start that machine-hours and euros cover
    machine_euros: float = 0.0  # the machines' share of ``euros``
    snapshot_euros: float = 0.0  # the snapshot's share of ``euros``: its storage over window
    snapshot_gigabytes: float = 0.0  # the snapshot the pool boots (0: none)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["machines_over_time"] = [list(p) for p in self.machines_over_time]
        return data


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The snapshot a pool boots, kept the whole window: its size in GB, the net price of a
    GB a month, and where the size comes from."""

    gigabytes: float
    per_gb_month: float
    source: str = ""

    def euros(self, window: float) -> float:
        return snapshot_euros(self.gigabytes, self.per_gb_month, window)


@dataclass(frozen=True, slots=True)
class Bill:
    """A run's machines as Hetzner bills them: each one's creation, its end (None: still
    alive when the run settled) and its busy seconds; and the snapshot the pool boots."""

    price: Price
    machines: tuple[tuple[float, float | None, float], ...]
    snapshot: Snapshot | None = None

    @classmethod
    def of(cls, outcome: Outcome, price: Price, snapshot: Snapshot | None = None) -> Bill:
        lives = tuple((m.created_at, m.destroyed_at, m.busy_seconds) for m in outcome.machines)
        return cls(price, lives, snapshot)

    def over(self, window: float) -> tuple[float, float, float]:
        """(euros, idle euros, machine-seconds) up to ``window``: a machine still alive at the
        run's end is billed up to it (a settled pool stays as it is until work arrives)."""
        euros = idle = seconds = 0.0
        for created, destroyed, busy in self.machines:
            life = max(0.0, (window if destroyed is None else destroyed) - created)
            bill = machine_euros(self.price, life)
            seconds += life
            euros += bill
            idle += idle_euros(bill, life, life - busy)
        return euros, idle, seconds


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile (q in 0..100) of sorted ``values``; 0 when empty."""
    if not values:
        return 0.0
    rank = max(1, math.ceil(q / 100.0 * len(values)))
    return values[min(rank, len(values)) - 1]


def common_window(spans: Iterable[float]) -> float:
    """The window that runs compared with one another share: the latest of their spans (each
    run goes on until the trace's window is over and its pool has settled)."""
    return max(spans, default=0.0)


def billed(r: Report, bill: Bill, window: float) -> Report:
    """``r`` with its machine-hours and euros measured over ``window`` (never before the run's
    own end: every machine it created is paid for in full)."""
    window = max(window, r.span)
    machines, idle, seconds = bill.over(window)
    snapshot = bill.snapshot
    stored = snapshot.euros(window) if snapshot is not None else 0.0
    euros = machines + stored
    return replace(
        r,
        machine_hours=seconds / 3600.0,
        euros=euros,
        idle_euros=idle,
        euros_per_job=euros / r.started if r.started else 0.0,
        euros_per_day=euros * DAY / max(window, 1.0),
        window=window,
        machine_euros=machines,
        snapshot_euros=stored,
        snapshot_gigabytes=snapshot.gigabytes if snapshot is not None else 0.0,
    )


def report(
    pool: str, outcome: Outcome, price: Price, window: float = 0.0,
    snapshot: Snapshot | None = None,
) -> Report:  # fmt: skip
    """One pool's run, its euros over ``window`` (at least the run's own span), the
    ``snapshot`` it boots (if any) kept over the same window."""
    waits = sorted(w for w in (job.wait for job in outcome.jobs) if w is not None)
    counted = Report(
        pool=pool,
        jobs=len(outcome.jobs),
        started=len(waits),
        queue_timeouts=sum(1 for job in outcome.jobs if job.timed_out),
        refused=sum(1 for job in outcome.jobs if job.refused),
        wait_p50=percentile(waits, 50),
        wait_p95=percentile(waits, 95),
        wait_p99=percentile(waits, 99),
        wait_max=waits[-1] if waits else 0.0,
        longest_queue=outcome.longest_queue,
        machine_hours=0.0,
        boots=len(outcome.machines),
        failed_boots=sum(1 for m in outcome.machines if m.failed or m.ready_at is None),
        euros=0.0,
        idle_euros=0.0,
        euros_per_job=0.0,
        euros_per_day=0.0,
        span=outcome.end,
        peak_machines=max((count for _, count in outcome.series), default=0),
        settled=outcome.settled,
        machines_over_time=tuple(outcome.series),
    )
    return billed(counted, Bill.of(outcome, price, snapshot), window)


def together(series: Sequence[Sequence[tuple[float, int]]]) -> list[tuple[float, int]]:
    """Machines alive in every pool at once, at each instant any pool's count changed."""
    changes = sorted(
        (t, pool, order, count)
        for pool, points in enumerate(series)
        for order, (t, count) in enumerate(points)
    )
    alive = [0] * len(series)
    merged: list[tuple[float, int]] = []
    for t, pool, _, count in changes:
        alive[pool] = count
        if merged and merged[-1][0] == t:
            merged[-1] = (t, sum(alive))
        else:
            merged.append((t, sum(alive)))
    return merged


def total(pairs: Sequence[tuple[Report, Outcome]]) -> Report:
    """Every pool together over their one window: the bill of all their machines, the most
    machines alive at one instant, and the percentiles of all the pools' waits."""
    reports = [r for r, _ in pairs]
    window = max((r.window for r in reports), default=0.0)
    if any(r.window != window for r in reports):
        raise ValueError("the pools' reports cover different windows: report them over one")
    waits = sorted(
        w for _, outcome in pairs for w in (job.wait for job in outcome.jobs) if w is not None
    )
    euros = sum(r.euros for r in reports)
    started = len(waits)
    series = together([r.machines_over_time for r in reports])
    return Report(
        pool="total",
        jobs=sum(r.jobs for r in reports),
        started=started,
        queue_timeouts=sum(r.queue_timeouts for r in reports),
        refused=sum(r.refused for r in reports),
        wait_p50=percentile(waits, 50),
        wait_p95=percentile(waits, 95),
        wait_p99=percentile(waits, 99),
        wait_max=waits[-1] if waits else 0.0,
        longest_queue=max((r.longest_queue for r in reports), default=0),
        machine_hours=sum(r.machine_hours for r in reports),
        boots=sum(r.boots for r in reports),
        failed_boots=sum(r.failed_boots for r in reports),
        euros=euros,
        idle_euros=sum(r.idle_euros for r in reports),
        euros_per_job=euros / started if started else 0.0,
        euros_per_day=euros * DAY / max(window, 1.0),
        span=max((r.span for r in reports), default=0.0),
        peak_machines=max((count for _, count in series), default=0),
        settled=all(r.settled for r in reports),
        machines_over_time=tuple(series),
        window=window,
        machine_euros=sum(r.machine_euros for r in reports),
        snapshot_euros=sum(r.snapshot_euros for r in reports),
        snapshot_gigabytes=sum(r.snapshot_gigabytes for r in reports),
    )


def sparkline(series: Sequence[tuple[float, int]], end: float, width: int = 60) -> str:
    """Machines over time in ``width`` columns (the most alive in each), 0-9 then +."""
    if end <= 0 or not series:
        return ""
    cols = [0] * width
    for i, (t, count) in enumerate(series):
        until = series[i + 1][0] if i + 1 < len(series) else end
        first = min(width - 1, int(t / end * width))
        last = min(width - 1, int(max(t, until - 1e-9) / end * width))
        for col in range(first, last + 1):
            cols[col] = max(cols[col], count)
    return "".join(str(c) if c < 10 else "+" for c in cols)


def table_rows(r: Report) -> list[tuple[str, str]]:
    """(label, value) rows for one report (the command prints them per pool)."""
    return [
        (
            "jobs",
            f"{r.jobs} ({r.started} started, {r.queue_timeouts} hit queueTimeout, "
            f"{r.refused} refused)",
        ),
        (
            "wait p50 / p95 / p99",
            f"{fmt_s(r.wait_p50)} / {fmt_s(r.wait_p95)} / {fmt_s(r.wait_p99)}",
        ),
        ("longest wait", fmt_s(r.wait_max)),
        ("longest queue", f"{r.longest_queue} jobs"),
        ("machine-hours", f"{r.machine_hours:.2f} h (peak {r.peak_machines} machines)"),
        ("boots", f"{r.boots} ({r.failed_boots} failed)"),
        *_snapshot_rows(r),
        ("euros", f"{r.euros:.2f} EUR ({r.idle_euros:.2f} idle, {r.euros_per_job:.4f} per job)"),
        ("euros per day", f"{r.euros_per_day:.2f} EUR ({window_words(r.window)})"),
        ("simulated", fmt_s(r.span) + ("" if r.settled else " (the pool never settled)")),
    ] + (
        [("machines over time", sparkline(r.machines_over_time, r.span))]
        if r.machines_over_time
        else []
    )


def _snapshot_rows(r: Report) -> list[tuple[str, str]]:
    """The machines' euros and the snapshot's apart, for a pool that boots one."""
    if not r.snapshot_gigabytes:
        return []
    return [
        ("machine euros", f"{r.machine_euros:.2f} EUR"),
        ("snapshot euros", f"{r.snapshot_euros:.4f} EUR ({r.snapshot_gigabytes:g} GB kept "
                           f"{fmt_s(r.window)}, per GB and month by the started hour)"),
    ]  # fmt: skip


def window_words(window: float) -> str:
    """What a per-day figure measures, for the reader."""
    return f"the bill over the first {fmt_s(window)}, scaled to a day"


def short_window(window: float) -> str | None:
    """What a reader of a per-day figure measured over less than a day must know (None for a
    day or more): it is that window's bill multiplied up, as if the whole day were like it."""
    if window >= DAY:
        return None
    return (
        f"the window is {fmt_s(window)}, shorter than a day: EUR/day is its bill x "
        f"{DAY / max(window, 1.0):.1f}, as if the whole day had this work; give --window 24h "
        "to bill a day with only this work (the pool settles and idles after it)"
    )


def fmt_s(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.2f}h"
