"""Progress where work is long (issue 18, point 7): a bar on stderr when it is a terminal,
nothing otherwise and nothing with ``--json``, so that piped and JSON output stay clean."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

Advance = Callable[[int], None]


def _silent(_: int) -> None:
    return None


@contextmanager
def progress(description: str, total: int | None, quiet: bool = False) -> Iterator[Advance]:
    """Yield ``advance(n)``: ``n`` more units done of ``total`` (None: not known)."""
    console = Console(stderr=True)
    if quiet or not console.is_terminal:
        yield _silent
        return
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as bar:
        task = bar.add_task(description, total=total)
        yield lambda done: bar.advance(task, done)


class PassBar:
    """A guardian pass on a terminal: a spinner while it lists, then one step per destroy."""

    def __init__(self, bar: Progress) -> None:
        self.bar = bar
        self.task = bar.add_task("guardian: listing servers and heartbeats", total=None)

    def listed(self, servers: int, to_destroy: int) -> None:
        self.bar.update(
            self.task,
            description=f"guardian: {servers} machine(s) seen; destroying",
            total=to_destroy,
            completed=0,
        )

    def destroyed(self, server: int) -> None:
        self.bar.advance(self.task, 1)


@contextmanager
def pass_progress(quiet: bool = False) -> Iterator[PassBar | None]:
    """A guardian pass's bar on a terminal's stderr; None when quiet or not a terminal."""
    console = Console(stderr=True)
    if quiet or not console.is_terminal:
        yield None
        return
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, console=console) as bar:
        yield PassBar(bar)
