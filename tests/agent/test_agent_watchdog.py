"""The watchdog on a test's clock: at the default 90 s lease it gives a job up at the renewal's
send time + lease - margin (9 s), while the poll that would renew it is blocked, and not
before. The margin is shorter than a blocked poll's slack (HTTP_SLACK_SECONDS, 10 s): only the
watchdog's own clock, never a poll coming back, can end the work in time. One short real run
of the same (tests/agent/test_agent_loop.py, at the minimum lease) proves it on a real clock.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from agent import controller as remote
from agent.backend import Backend
from agent.jobs import JobRun
from agent.leases import MIN_WATCH_SECONDS, safety_margin
from agent.settings import Settings
from agent.watchdog import Watchdog
from agent.work import Work

LEASE = 90.0  # the pool's default
RENEWED = 5_000.0  # the monotonic send time of the last poll that renewed the lease
ENDS = RENEWED + 2 * LEASE  # the test's clock sets the agent's end here, once past it


class Clock:
    """Time moves only when the watchdog waits, by as long as it waits."""

    def __init__(self, now: float) -> None:
        self.time = now

    def now(self) -> float:
        return self.time

    def wait(self, event: threading.Event, seconds: float) -> bool:
        assert seconds > 0
        if not event.is_set():
            self.time += seconds
            if self.time > ENDS:
                event.set()
        return event.is_set()


class Process:
    """The backend's runtime: stopping it is what ends the work."""

    def __init__(self, clock: Clock) -> None:
        self.port = 8080
        self.env: dict[str, str] = {}
        self.clock = clock
        self.stopped: list[float] = []

    def start(self) -> None: ...

    def stop(self) -> None:
        self.stopped.append(self.clock.now())

    def alive(self) -> bool:
        return not self.stopped

    def describe(self) -> str:
        return "a process"

    def last_output(self) -> list[str]:
        return []


@pytest.mark.parametrize("blocked_since", [0.0, LEASE / 30, 40.0, 80.9])
def test_at_the_default_lease_a_job_is_given_up_at_its_margin_whatever_the_blocked_poll(
    blocked_since: float,
) -> None:
    """``blocked_since``: how long after the renewal the poll that would renew the lease again
    was sent (the watchdog looks from then on); it never comes back (a silent partition),
    so no renewal is answered."""
    clock = Clock(RENEWED + blocked_since)
    events: list[tuple[str, float, dict[str, Any]]] = []

    def log(event: str, **fields: Any) -> None:
        events.append((event, clock.now(), fields))

    settings = Settings(controller_url="http://127.0.0.1:9", machine="m1", join_token="t")
    backend = Backend(settings, remote.Controller(settings.controller_url, "m1"), log)
    process = Process(clock)
    backend.runtime = process
    work = Work()
    work.lease, work.margin = LEASE, safety_margin(LEASE)
    assert work.margin == 9.0 < remote.HTTP_SLACK_SECONDS
    run = JobRun(
        job="j1", attempt="a1", path="/render", payload={}, deadline=None,
        renewed_at=RENEWED, margin=work.margin,
    )  # fmt: skip
    work.runs[run.job] = run
    work.poll_sent = RENEWED + blocked_since  # out since then, unanswered

    Watchdog(work, backend, log, clock).watch()  # until the test's clock ends the agent

    give_up = RENEWED + LEASE - work.margin
    abandoned = [(at, fields) for event, at, fields in events if event == "abandon"]
    reason = "lease not renewed"
    assert abandoned == [(abandoned[0][0], {"job": "j1", "attempt": "a1", "reason": reason})]
    at = abandoned[0][0]
    # at the give-up point (to the watchdog's shortest sleep), not before, and strictly
    # before the controller could count the lease expired
    assert give_up <= at <= give_up + MIN_WATCH_SECONDS < RENEWED + LEASE
    assert run.stopped == "abandoned" and "j1" not in work.runs
    assert process.stopped == [at]  # the backend stopped then: the work really ends
    assert ("backend_stop", at, {"reason": "jobs abandoned"}) in events
    assert work.wake.is_set()  # the loop is told
