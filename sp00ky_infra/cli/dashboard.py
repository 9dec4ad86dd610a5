"""The live ``jobs`` dashboard: jobs by status, the pool tables, the head of each queue and
the recent jobs, read off the store (no controller needed to watch it)."""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table

from sp00ky_infra.config import Config
from sp00ky_infra.store import STATUSES, Job, SqlStore

WAITING_SHOWN = 10


def when(at: float | None) -> str:
    if at is None:
        return "-"
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S")


def jobs_table(found: list[Job], title: str | None = None) -> Table:
    table = Table(title=title, show_edge=False)
    for column in ("id", "backend", "path", "status", "retries", "machine", "created"):
        table.add_column(column, no_wrap=column in ("id", "created"))
    for job in found:
        table.add_row(
            job.id,
            job.backend,
            job.path,
            job.status + (" (killing)" if job.cancel_requested else ""),
            f"{job.retries}/{job.max_retries}",
            job.machine or "-",
            when(job.created_at),
        )
    return table


def dashboard(store: SqlStore, config: Config | None, refresh: float) -> None:
    console = Console()
    try:
        with Live(view(store, config), console=console, refresh_per_second=4) as live:
            while True:
                time.sleep(refresh)
                live.update(view(store, config))
    except KeyboardInterrupt:
        pass


def view(store: SqlStore, config: Config | None, now: float | None = None) -> Group:
    now = time.time() if now is None else now
    counts = store.counts()
    summary = Table(title="jobs by status", show_edge=False)
    for status in STATUSES:
        summary.add_column(status, justify="right")
    summary.add_row(*(str(counts[status]) for status in STATUSES))
    parts: list[RenderableType] = [summary]
    if config is None:
        parts.append("[dim]pool tables: no sp00ky.yml here (give it with --config)[/dim]")
    elif config.pools:
        parts += [pool_table(store, config, now), waiting_table(store, config, now)]
    parts.append(jobs_table(store.list_jobs(limit=15), title="recent jobs"))
    stamp = datetime.fromtimestamp(now, UTC).strftime("%H:%M:%S")
    parts.append(f"[dim]{stamp} UTC · Ctrl-C to leave[/dim]")
    return Group(*parts)


def _table_of(config: Config, pool: str) -> str | None:
    backend = next((b for b in config.backends.values() if b.pool == pool), None)
    return backend.method.table if backend is not None and backend.method else None


def pool_table(store: SqlStore, config: Config, now: float) -> Table:
    """Each pool's capacity and queue: machines by state, slots busy of all, waiting jobs."""
    table = Table(title="pools", show_edge=False)
    for column in ("pool", "machines", "slots busy", "queued", "delayed", "running", "state"):
        table.add_column(column, justify="left" if column in ("pool", "machines") else "right")
    for name, pool in config.pools.items():
        job_table = _table_of(config, name)
        live = store.machines.live(name)
        states = Counter(machine.state for machine in live)
        machines = ", ".join(f"{n} {state}" for state, n in sorted(states.items())) or "none"
        busy = sum(store.busy_slots(job_table).values()) if job_table else 0
        queue = store.queue_stats(job_table, now) if job_table else None
        state = store.pools.state(name)
        flags = ["paused"] if state.paused else []
        flags += ["breaker open"] if state.breaker.is_open(now) else []
        table.add_row(
            name,
            machines,
            f"{busy}/{states.get('ready', 0) * pool.slots}",
            str(queue.due if queue else 0),
            str(queue.delayed if queue else 0),
            str(queue.processing if queue else 0),
            ", ".join(flags) or "ok",
        )
    return table


def waiting_table(store: SqlStore, config: Config, now: float) -> Table:
    """The head of each pool's queue in admission order, with what cancels an entry."""
    table = Table(title="waiting, in admission order", show_edge=False)
    for column in ("pool", "key", "priority", "slots", "queue deadline"):
        table.add_column(column, no_wrap=column == "key")
    for name in config.pools:
        job_table = _table_of(config, name)
        if job_table is None:
            continue
        for job in store.queue(job_table, now, WAITING_SHOWN):
            table.add_row(name, job.id, str(job.priority), str(job.slots), when(job.queue_deadline))
    table.caption = "cancel one: sp00ky-infra pools cancel POOL KEY (or jobs kill KEY)"
    return table
