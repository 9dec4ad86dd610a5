"""A poll renews the leases of the attempts the agent reports, but those it says are fresh
(``RunningAttempt.fresh``: renewed a moment ago, agent.leases.renewal_due); every
attempt the machine reports is still checked as current, renewed or not. On SQLite and on
PostgreSQL, through an in-process controller on a clock of the test's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sp00ky_infra.config.loader import load_config
from sp00ky_infra.controller.agents import Agents
from sp00ky_infra.controller.core import Controller
from sp00ky_infra.controller.protocol import Assignment, PollRequest, RunningAttempt
from sp00ky_infra.controller.settings import ControllerSettings
from sp00ky_infra.controller.state import Deployment
from sp00ky_infra.store import NewJob, SqlStore
from tests.controller.test_controller_executor import Recording
from tests.controllers import add_ready_machine, backend_app, leading, project

MACHINE = "render-m1"
T0 = 1_800_000_000.0
LEASE = 90.0  # the pool's default


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def polled(tmp_path: Path, store: SqlStore) -> Iterator[tuple[Controller, Clock]]:
    """A leading controller on the test's clock, one ready machine of two slots (session
    ``tok``) running two jobs it was just given."""
    app = backend_app("render", "render_job", tmp_path / "log")
    config = load_config(project(tmp_path, {"render": {"min": 1, "slots": 2}}, {"renderer": app}))
    settings = ControllerSettings(secret="s", state_dir=str(tmp_path))
    store.migrate()
    revision = Deployment.of(config, settings.pool).revisions["render"]
    add_ready_machine(store, MACHINE, revision, 2, "tok", T0)
    news = [NewJob("renderer", "render_job", "/render", {"n": n}, pool="render") for n in (1, 2)]
    store.enqueue_many(news, T0 - 1)
    clock = Clock()
    provisioner = Recording(delivers_join_token=True)
    with leading(Controller(settings, config, store, provisioner, clock=clock)) as controller:
        yield controller, clock


def _running(work: list[Assignment], fresh: list[bool]) -> PollRequest:
    return PollRequest(
        running=[
            RunningAttempt(job=each.job, attempt=each.attempt, fresh=flag)
            for each, flag in zip(work, fresh, strict=True)
        ]
    )


def _expiry(store: SqlStore, job: str) -> float | None:
    return store.get(job).lease_expires_at


def test_a_poll_leaves_alone_the_leases_the_agent_says_are_fresh(
    polled: tuple[Controller, Clock],
) -> None:
    controller, clock = polled
    work = list(Agents(controller).poll(MACHINE, "tok", PollRequest(free_slots=2)).assignments)
    assert len(work) == 2
    assert [_expiry(controller.store, each.job) for each in work] == [T0 + LEASE] * 2
    clock.now = T0 + 5
    reply = Agents(controller).poll(MACHINE, "tok", _running(work, [False, True]))
    assert reply.stop == []  # both are current: the one left alone is not stale
    renewed, left = (_expiry(controller.store, each.job) for each in work)
    assert renewed == T0 + 5 + LEASE
    assert left == T0 + LEASE  # as the claim set it: the agent did not count this poll
    # An agent of before the flag (no RunningAttempt is fresh by default) renews them all.
    clock.now = T0 + 6
    old_style = PollRequest(
        running=[RunningAttempt(job=each.job, attempt=each.attempt) for each in work]
    )
    assert Agents(controller).poll(MACHINE, "tok", old_style).stop == []
    assert [_expiry(controller.store, each.job) for each in work] == [T0 + 6 + LEASE] * 2


@pytest.mark.parametrize("fresh", [False, True])
def test_an_attempt_that_is_not_current_is_stale_whether_fresh_or_not(
    polled: tuple[Controller, Clock], fresh: bool
) -> None:
    controller, clock = polled
    work = list(Agents(controller).poll(MACHINE, "tok", PollRequest(free_slots=2)).assignments)
    controller.store.kill(work[0].job, T0 + 1)  # killed while it ran: still processing
    ghost = Assignment(  # an attempt this machine never ran
        job=work[1].job,
        attempt="not-the-attempt",
        path="/render",
        payload=None,
        deadline=None,
        lease_expires_at=T0 + LEASE,
    )
    clock.now = T0 + 5
    reply = Agents(controller).poll(MACHINE, "tok", _running([work[0], ghost], [fresh, fresh]))
    stops = {(stop.job, stop.attempt): stop.reason for stop in reply.stop}
    assert stops == {
        (work[0].job, work[0].attempt): "cancelled",
        (ghost.job, ghost.attempt): "stale",
    }
    # the current attempt of the second job is untouched by the ghost's poll
    assert _expiry(controller.store, work[1].job) == T0 + LEASE


def test_an_assignment_sent_again_after_a_lost_answer_has_its_lease_renewed(
    polled: tuple[Controller, Clock],
) -> None:
    """The agent counts a resent job's lease from the poll that brings it: the controller's
    must not be older (the claim's, from the lost answer, may be about to run out)."""
    controller, clock = polled
    lost = list(Agents(controller).poll(MACHINE, "tok", PollRequest(free_slots=2)).assignments)
    assert [_expiry(controller.store, each.job) for each in lost] == [T0 + LEASE] * 2
    clock.now = T0 + 88  # the answer never arrived; the machine polls again, knowing nothing
    again = Agents(controller).poll(MACHINE, "tok", PollRequest(free_slots=2)).assignments
    assert sorted((each.job, each.attempt) for each in again) == sorted(
        (each.job, each.attempt) for each in lost
    )
    assert {each.lease_expires_at for each in again} == {T0 + 88 + LEASE}
    assert [_expiry(controller.store, each.job) for each in lost] == [T0 + 88 + LEASE] * 2
    # and the fresh reports that follow (a lease renewed a moment ago) keep it
    clock.now = T0 + 89
    assert Agents(controller).poll(MACHINE, "tok", _running(list(again), [True, True])).stop == []
