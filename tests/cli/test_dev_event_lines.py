"""dev's line output: every event once, even several of one instant, and the outcomes of jobs
(retried, killed, failed for good) read from the store."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path
from typing import cast

from rich.console import Console

from sp00ky_infra.cli.dev_events import EventPrinter, Recent, clock, error_line, outcomes
from sp00ky_infra.controller.core import Controller
from sp00ky_infra.controller.state import Event, EventLog
from sp00ky_infra.store import SqlStore, open_store
from sp00ky_infra.store.model import ErrorEntry
from tests.helpers import render_job

NOW = 1_800_000_000.0


class Watched:
    """What the printer reads of a controller: its events, its store and its clock."""

    def __init__(self, store: SqlStore, events: EventLog) -> None:
        self.store = store
        self.events = events

    def recent_events(self, limit: int) -> list[Event]:
        return self.events.recent(limit)

    def clock(self) -> float:
        return NOW


def _printer(store: SqlStore, events: EventLog) -> tuple[EventPrinter, io.StringIO]:
    out = io.StringIO()
    console = Console(file=out, width=300, color_system=None)
    return EventPrinter(cast(Controller, Watched(store, events)), console), out


def test_two_events_of_one_instant_are_both_printed_and_each_once(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/state.db")
    events = EventLog()
    printer, out = _printer(store, events)
    try:
        events.add(Event(NOW, "render", "scale_up", "render-a requested (local)"))
        events.add(Event(NOW, "render", "scale_up", "render-b requested (local)"))
        printer.flush()
        events.add(Event(NOW, "render", "breaker_open", "3 failed boots in a row (last: x)"))
        printer.flush()
        printer.flush()
    finally:
        store.close()
    lines = out.getvalue().splitlines()
    assert [line.split(" ", 1)[1] for line in lines] == [
        "render scale_up: render-a requested (local)",
        "render scale_up: render-b requested (local)",
        "render breaker_open: 3 failed boots in a row (last: x)",
    ]


def test_a_killed_job_is_told_once_and_an_earlier_runs_outcome_not_at_all(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/state.db")
    try:
        earlier = store.enqueue(render_job(), NOW - 60)
        store.kill(earlier.id, NOW - 30)  # before this run began
        printer, out = _printer(store, EventLog())
        job = store.enqueue(render_job(), NOW)
        store.kill(job.id, NOW + 1)
        printer.flush(force=True)
        printer.flush(force=True)
    finally:
        store.close()
    assert out.getvalue().splitlines() == [
        f"{clock(NOW + 1)} render job_killed: {job.id} killed (killed while waiting)"
    ]


def test_each_error_of_a_job_tells_a_retry_a_kill_or_the_failure_for_good(
    tmp_path: Path,
) -> None:
    store = open_store(f"sqlite:///{tmp_path}/state.db")
    try:
        job = store.enqueue(render_job(max_retries=1), NOW)
    finally:
        store.close()
    first: ErrorEntry = {"code": "backend_error", "reason": "HTTP 500", "at": NOW + 1, "attempt": 1}
    second: ErrorEntry = {"code": "timeout", "reason": "over 30s", "at": NOW + 9, "attempt": 2}
    retried = replace(job, errors=(first,), status="pending")
    assert error_line(retried, 0) == (
        "job_retried",
        f"{job.id} attempt 1 failed (backend_error: HTTP 500); retried (1 of 1 retries)",
    )
    failed = replace(job, errors=(first, second), status="failed")
    assert error_line(failed, 0)[0] == "job_retried"
    assert error_line(failed, 1) == (
        "job_failed",
        f"{job.id} failed for good after 2 failed attempt(s): timeout: over 30s",
    )
    told = outcomes(failed, 0, NOW)
    assert [happening.at for happening in told] == [NOW + 1, NOW + 9]
    assert told[1].line() == f"{clock(NOW + 9)} render job_failed: {error_line(failed, 1)[1]}"
    assert outcomes(failed, 1, NOW) == told[1:]  # the first one told already
    assert outcomes(failed, 0, NOW + 5) == told[1:]  # only what came since the run began


def test_the_live_view_keeps_the_last_events_and_outcomes_each_once(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/state.db")
    events = EventLog()
    try:
        recent = Recent(cast(Controller, Watched(store, events)), shown=2)
        for name in ("a", "b", "c"):
            events.add(Event(NOW, "render", "scale_up", f"render-{name} requested (local)"))
        assert [h.message for h in recent.rows()] == [
            "render-b requested (local)",
            "render-c requested (local)",
        ]
        job = store.enqueue(render_job(), NOW)
        store.kill(job.id, NOW + 1)
        recent.happenings.jobs_read_at = float("-inf")  # its once-a-second read is due
        assert [(h.kind, h.message) for h in recent.rows()] == [
            ("scale_up", "render-c requested (local)"),
            ("job_killed", f"{job.id} killed (killed while waiting)"),
        ]
    finally:
        store.close()
