"""The live ``jobs`` dashboard: jobs by status, the pool tables, the head of each queue and
the recent jobs, read off the store (no controller needed to watch it)."""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from rich.cells import cell_len
from rich.console import Console, Group, JustifyMethod, RenderableType
from rich.live import Live
from rich.table import Table

from sp00ky_infra.config import Config
from sp00ky_infra.store import STATUSES, Job, SqlStore

WAITING_SHOWN = 10
UNBOUNDED = 10_000  # a console's width when it writes to a pipe: lines as long as they are


def when(at: float | None) -> str:
    if at is None:
        return "-"
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S")


@dataclass(frozen=True, slots=True)
class Column:
    """A column of ``fitted``: its values shown whole on one line (ids, names, times, counts),
    or free text that ``wraps`` word by word."""

    header: str
    justify: JustifyMethod = "left"
    wraps: bool = False


def fitted(
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    width: int | None,
    drop: Sequence[str] = (),
    **options: Any,
) -> Table:
    """A table no wider than ``width`` (None: as wide as it needs): the columns named in
    ``drop`` are left out, first first, until every value fits whole (a wrapping one, each of
    its words whole); then the wrapping columns narrowed, the widest first."""
    shown = list(range(len(columns)))
    droppable = [i for name in drop for i, c in enumerate(columns) if c.header == name]
    while width is not None and droppable and _fits(columns, rows, shown) > width:
        shown.remove(droppable.pop(0))
    sizes: list[int | None] = [None] * len(shown)
    if width is not None:
        natural, least = _measures(columns, rows, shown)
        sizes = list(_narrowed(natural, least, width - _rules(len(shown))))
    table = Table(show_edge=False, **options)
    for i, size in zip(shown, sizes, strict=True):
        column = columns[i]
        table.add_column(
            column.header,
            justify=column.justify,
            no_wrap=not column.wraps,
            overflow="fold",
            width=size,
        )
    for row in rows:
        table.add_row(*(row[i] for i in shown))
    return table


def _rules(count: int) -> int:
    """What a table adds to its columns' values: a space either side, a rule between two."""
    return 3 * count - 1


def _fits(columns: Sequence[Column], rows: Sequence[Sequence[str]], shown: list[int]) -> int:
    """The least width the ``shown`` columns take, every value whole."""
    return sum(_measures(columns, rows, shown)[1]) + _rules(len(shown))


def _measures(
    columns: Sequence[Column], rows: Sequence[Sequence[str]], shown: list[int]
) -> tuple[list[int], list[int]]:
    """Each shown column's width on one line, and its least: a whole value's length, a
    wrapping one's longest word."""
    natural, least = [], []
    for i in shown:
        texts = [columns[i].header, *(row[i] for row in rows)]
        natural.append(max(cell_len(text) for text in texts))
        words = [w for text in texts for w in text.split()] if columns[i].wraps else texts
        least.append(max([1, *(cell_len(word) for word in words)]))
    return natural, least


def _narrowed(natural: list[int], least: list[int], room: int) -> list[int]:
    """``natural`` widths narrowed to ``room``, the widest above its least first."""
    sizes = list(natural)
    while sum(sizes) > room:
        wider = [j for j in range(len(sizes)) if sizes[j] > least[j]]
        if not wider:
            break  # it cannot fit: each at its least
        sizes[max(wider, key=lambda j: sizes[j])] -= 1
    return sizes


def output_console() -> Console:
    """A console for a listing: a terminal's width, else (a pipe, a file) as wide as a line
    needs, so that nothing a user copies is cut."""
    return Console(width=None if sys.stdout.isatty() else UNBOUNDED)


def print_listing(
    columns: Sequence[Column], rows: Sequence[Sequence[str]], drop: Sequence[str] = ()
) -> None:
    """A listing fitted to the terminal, or as wide as it needs in a pipe: ids stay whole."""
    console = output_console()
    console.print(fitted(columns, rows, console.width if console.is_terminal else None, drop))


JOB_COLUMNS = (
    Column("id"),
    Column("backend"),
    Column("path"),
    Column("status"),
    Column("tries"),
    Column("machine"),
    Column("created", wraps=True),
)


def jobs_table(found: list[Job], title: str | None = None, width: int | None = None) -> Table:
    """Jobs, one a line; narrower than it needs, path, backend, tries and then the creation
    time are left out (the id, the status and the machine always show)."""
    return fitted(JOB_COLUMNS, job_rows(found), width, JOB_DROPS, title=title)


JOB_DROPS = ("path", "backend", "tries", "created")


def job_rows(found: list[Job]) -> list[tuple[str, ...]]:
    return [
        (
            job.id,
            job.backend,
            job.path,
            job.status + (" (killing)" if job.cancel_requested else ""),
            f"{job.retries}/{job.max_retries}",
            job.machine or "-",
            when(job.created_at),
        )
        for job in found
    ]


def dashboard(store: SqlStore, config: Config | None, refresh: float) -> None:
    console = Console()
    try:
        first = view(store, config, width=console.width)
        with Live(first, console=console, refresh_per_second=4) as live:
            while True:
                time.sleep(refresh)
                live.update(view(store, config, width=console.width))
    except KeyboardInterrupt:
        pass


def view(
    store: SqlStore, config: Config | None, now: float | None = None, width: int | None = None
) -> Group:
    """The dashboard at ``now``, its tables fitted to ``width`` columns."""
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
        parts += [pool_table(store, config, now, width), waiting_table(store, config, now, width)]
    parts.append(jobs_table(store.list_jobs(limit=15), "recent jobs", width))
    stamp = datetime.fromtimestamp(now, UTC).strftime("%H:%M:%S")
    parts.append(f"[dim]{stamp} UTC · Ctrl-C to leave[/dim]")
    return Group(*parts)


def _table_of(config: Config, pool: str) -> str | None:
    backend = next((b for b in config.backends.values() if b.pool == pool), None)
    return backend.method.table if backend is not None and backend.method else None


POOL_COLUMNS = (
    Column("pool"),
    Column("machines", wraps=True),
    Column("slots busy", "right", wraps=True),
    Column("queued", "right"),
    Column("delayed", "right"),
    Column("running", "right"),
    Column("state", "right", wraps=True),
)


def pool_table(store: SqlStore, config: Config, now: float, width: int | None = None) -> Table:
    """Each pool's capacity and queue: machines by state, slots busy of all, waiting jobs."""
    rows = []
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
        rows.append(
            (
                name,
                machines,
                f"{busy}/{states.get('ready', 0) * pool.slots}",
                str(queue.due if queue else 0),
                str(queue.delayed if queue else 0),
                str(queue.processing if queue else 0),
                ", ".join(flags) or "ok",
            )
        )
    return fitted(POOL_COLUMNS, rows, width, ("delayed",), title="pools")


WAITING_COLUMNS = (
    Column("pool"),
    Column("key"),
    Column("priority", "right"),
    Column("slots", "right"),
    Column("queue deadline", wraps=True),
)


def waiting_table(store: SqlStore, config: Config, now: float, width: int | None = None) -> Table:
    """The head of each pool's queue in admission order, with what cancels an entry."""
    rows = []
    for name in config.pools:
        job_table = _table_of(config, name)
        if job_table is None:
            continue
        for job in store.queue(job_table, now, WAITING_SHOWN):
            rows.append((name, job.id, str(job.priority), str(job.slots), when(job.queue_deadline)))
    return fitted(
        WAITING_COLUMNS,
        rows,
        width,
        ("slots", "priority"),
        title="waiting, in admission order",
        caption="cancel one: sp00ky-infra pools cancel POOL KEY (or jobs kill KEY)",
    )
