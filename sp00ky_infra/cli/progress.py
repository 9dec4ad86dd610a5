"""Progress where work is long: a bar on stderr when it is a terminal,
nothing otherwise and nothing with ``--json``, so that piped and JSON output stay clean."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

Advance = Callable[[int], None]


def _silent(_: int) -> None:
    return None


def _columns() -> tuple[ProgressColumn, ...]:
    """A bar's columns: spinner, what, bar, done of total, time so far."""
    return (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )


@contextmanager
def progress(description: str, total: int | None, quiet: bool = False) -> Iterator[Advance]:
    """Yield ``advance(n)``: ``n`` more units done of ``total`` (None: not known)."""
    console = Console(stderr=True)
    if quiet or not console.is_terminal:
        yield _silent
        return
    with Progress(*_columns(), console=console) as bar:
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


STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)")
LAYER_DONE = ("Pull complete", "Already exists")
LAYER_STATUS = (  # a layer's way; other events with an id are about the tag
    "Pulling fs layer", "Waiting", "Downloading", "Verifying Checksum", "Download complete",
    "Extracting", *LAYER_DONE,
)  # fmt: skip


class ImageBars:
    """Image builds and pulls on a terminal (engine.Reporter): a bar per image, its build
    steps (``Step 3/5 : RUN ...``) or its layers pulled (``Pull complete``)."""

    def __init__(self, bar: Progress) -> None:
        self.bar = bar
        self.tasks: dict[str, TaskID] = {}
        self.layers: dict[str, dict[str, bool]] = {}  # what -> layer -> done
        self.steps: dict[str, int] = {}  # what -> its build's steps

    def __call__(self, what: str, event: Mapping[str, Any]) -> None:
        if what not in self.tasks:
            self.tasks[what] = self.bar.add_task(what, total=None)
        task = self.tasks[what]
        step = STEP.match(str(event.get("stream", "")))
        if step:
            done, steps, doing = int(step[1]), int(step[2]), step[3].strip()
            self.steps[what] = steps
            self.bar.update(
                task, completed=done - 1, total=steps, description=f"{what}: {doing[:60]}"
            )
        elif str(event.get("stream", "")).startswith("Successfully built"):
            finished = self.steps.get(what, 1)
            self.bar.update(task, completed=finished, total=finished, description=f"{what}: built")
        elif "id" in event and "status" in event:
            layers = self.layers.setdefault(what, {})
            status = str(event["status"])
            layer = str(event["id"])
            if status in LAYER_STATUS:
                layers[layer] = layers.get(layer, False) or status in LAYER_DONE
            self.bar.update(
                task,
                completed=sum(layers.values()),
                total=len(layers) or None,
                description=f"{what}: {status} {layer}",
            )
        elif str(event.get("status", "")).startswith(("Digest:", "Status:")):
            self.bar.update(task, description=f"{what}: {event['status']}")


@contextmanager
def image_progress(quiet: bool = False) -> Iterator[ImageBars | None]:
    """Bars for the image builds and pulls in this context on a terminal's stderr; None (no
    output at all) when quiet (``--json``) or when stdout or stderr is not a terminal (the
    output is piped or logged)."""
    console = Console(stderr=True)
    if quiet or not console.is_terminal or not sys.stdout.isatty():
        yield None
        return
    with Progress(*_columns(), console=console) as bar:
        yield ImageBars(bar)
