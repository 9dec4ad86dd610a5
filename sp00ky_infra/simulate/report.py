"""What a simulated run cost: waits, queue, machine-hours, boots and euros, as plain data."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sp00ky_infra.policy.cost import Price, idle_euros, machine_euros
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

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["machines_over_time"] = [list(p) for p in self.machines_over_time]
        return data


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile (q in 0..100) of sorted ``values``; 0 when empty."""
    if not values:
        return 0.0
    rank = max(1, math.ceil(q / 100.0 * len(values)))
    return values[min(rank, len(values)) - 1]


def report(pool: str, outcome: Outcome, price: Price) -> Report:
    waits = sorted(w for w in (job.wait for job in outcome.jobs) if w is not None)
    euros = idle = seconds = 0.0
    for machine in outcome.machines:
        end = machine.destroyed_at if machine.destroyed_at is not None else outcome.end
        life = max(0.0, end - machine.created_at)
        bill = machine_euros(price, life)
        seconds += life
        euros += bill
        idle += idle_euros(bill, life, life - machine.busy_seconds)
    started = len(waits)
    span = max(outcome.end, 1.0)
    return Report(
        pool=pool,
        jobs=len(outcome.jobs),
        started=started,
        queue_timeouts=sum(1 for job in outcome.jobs if job.timed_out),
        refused=sum(1 for job in outcome.jobs if job.refused),
        wait_p50=percentile(waits, 50),
        wait_p95=percentile(waits, 95),
        wait_p99=percentile(waits, 99),
        wait_max=waits[-1] if waits else 0.0,
        longest_queue=outcome.longest_queue,
        machine_hours=seconds / 3600.0,
        boots=len(outcome.machines),
        failed_boots=sum(1 for m in outcome.machines if m.failed or m.ready_at is None),
        euros=euros,
        idle_euros=idle,
        euros_per_job=euros / started if started else 0.0,
        euros_per_day=euros * DAY / span,
        span=outcome.end,
        peak_machines=max((count for _, count in outcome.series), default=0),
        settled=outcome.settled,
        machines_over_time=tuple(outcome.series),
    )


def total(pairs: Sequence[tuple[Report, Outcome]]) -> Report:
    """Every pool together: sums, and the percentiles of all the pools' waits."""
    waits = sorted(
        w for _, outcome in pairs for w in (job.wait for job in outcome.jobs) if w is not None
    )
    reports = [r for r, _ in pairs]
    span = max((r.span for r in reports), default=0.0)
    euros = sum(r.euros for r in reports)
    started = len(waits)
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
        euros_per_day=sum(r.euros_per_day for r in reports),
        span=span,
        peak_machines=sum(r.peak_machines for r in reports),
        settled=all(r.settled for r in reports),
        machines_over_time=(),
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
        ("euros", f"{r.euros:.2f} EUR ({r.idle_euros:.2f} idle, {r.euros_per_job:.4f} per job)"),
        ("euros per day", f"{r.euros_per_day:.2f} EUR"),
        ("simulated", fmt_s(r.span) + ("" if r.settled else " (the pool never settled)")),
    ] + (
        [("machines over time", sparkline(r.machines_over_time, r.span))]
        if r.machines_over_time
        else []
    )


def fmt_s(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.2f}h"
