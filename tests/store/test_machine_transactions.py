"""PostgreSQL: the transactions that move a machine's running jobs take turns.

The agent's courier posts a job's result while the loop's next poll may still report that
job as running and renew its lease; the tick's sweep fails a job whose lease ran out while
its machine's poll may renew it. The poll's own results take the machine's row (its busy
slots, kept by trigger) before the renewal takes the job's row; the result and the sweep
take the job's row before the machine's. In that order they would deadlock, and the server
would break the cycle after its deadlock_timeout (a second) by failing one of them: all of
them hold the machine's key (``machine_key``) from the start.

The interleaving is forced, not hoped for: a third connection holds the job's row, so the
result (or the sweep) waits there first and the poll comes second; then that connection
lets go.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sp00ky_infra.config.loader import load_config
from sp00ky_infra.controller.agents import Agents
from sp00ky_infra.controller.core import Controller
from sp00ky_infra.controller.protocol import (
    FinishedAttempt,
    PollRequest,
    ResultRequest,
    RunningAttempt,
)
from sp00ky_infra.controller.settings import ControllerSettings
from sp00ky_infra.controller.state import Deployment
from sp00ky_infra.store import NewJob, open_store
from tests.controller.test_controller_executor import Recording
from tests.controller.test_lease_renewals import Clock
from tests.controllers import add_ready_machine, backend_app, leading, project

MACHINE = "render-m1"


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def controller(tmp_path: Path, postgres_url: str, clock: Clock) -> Iterator[Controller]:
    """A leading controller on PostgreSQL at ``clock``'s time, one ready machine of four
    slots whose agent holds the session ``tok``."""
    store = open_store(postgres_url)
    store.migrate()
    app = backend_app("render", "render_job", tmp_path / "log")
    config = load_config(project(tmp_path, {"render": {"min": 1, "slots": 4}}, {"renderer": app}))
    settings = ControllerSettings(secret="s", state_dir=str(tmp_path))
    revision = Deployment.of(config, settings.pool).revisions["render"]
    add_ready_machine(store, MACHINE, revision, 4, "tok", clock.now)
    provisioner = Recording(delivers_join_token=True)
    with leading(Controller(settings, config, store, provisioner, clock=clock)) as made:
        yield made


class Call(threading.Thread):
    """``call`` in a thread of its own (so on a connection of its own): its answer or error."""

    def __init__(self, call: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.call = call
        self.answer: Any = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.answer = self.call()
        except BaseException as exc:  # reported by the test
            self.error = exc


def _waiting_on(watch: psycopg.Connection[Any], blockers: set[int]) -> set[int]:
    """The server processes waiting on a lock that one of ``blockers`` holds."""
    rows = watch.execute(
        "SELECT pid FROM pg_stat_activity WHERE pg_blocking_pids(pid) && %s::int[]",
        (sorted(blockers),),
    ).fetchall()
    return {row[0] for row in rows}


def _busy_slots(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT busy_slots FROM machines WHERE name = %s", (MACHINE,)).fetchone()
    assert row is not None
    return int(row[0])


def _until(what: str, check: Callable[[], set[int]]) -> set[int]:
    ends = time.monotonic() + 10
    while not (found := check()):
        assert time.monotonic() < ends, f"timed out waiting for {what}"
        time.sleep(0.01)
    return found


def _enqueue(controller: Controller) -> None:
    controller.store.enqueue_many(
        [NewJob("renderer", "render_job", "/render", {}, pool="render")], controller.clock()
    )


@pytest.mark.parametrize("other", ["result", "sweep"])
def test_a_poll_renewing_a_job_and_a_change_of_that_job_take_turns_instead_of_deadlocking(
    controller: Controller, postgres_url: str, clock: Clock, other: str
) -> None:
    """``other`` changes job J while the machine's poll carries job K's result and renews J:
    the courier's result of J, or the sweep failing J, whose lease ran out."""
    store = controller.store
    lease = controller.pools["render"].lease
    _enqueue(controller)
    (job,) = Agents(controller).poll(MACHINE, "tok", PollRequest(free_slots=1)).assignments
    clock.now += lease / 2
    _enqueue(controller)
    running = [RunningAttempt(job=job.job, attempt=job.attempt, fresh=True)]  # not renewed
    (done,) = (
        Agents(controller)
        .poll(MACHINE, "tok", PollRequest(free_slots=1, running=running))
        .assignments
    )
    clock.now += lease / 2 + 1  # J's lease has run out, K's has not
    assert _busy_slots(postgres_url) == 2
    change: Callable[[], object]
    if other == "result":
        change = functools.partial(
            Agents(controller).result,
            MACHINE,
            "tok",
            job.job,
            job.attempt,
            ResultRequest(status="success"),
        )
    else:
        change = functools.partial(store.sweep, clock.now)

    with (
        psycopg.connect(postgres_url, autocommit=True) as holder,
        psycopg.connect(postgres_url, autocommit=True) as watch,
    ):
        held = holder.info.backend_pid
        holder.execute("BEGIN")
        holder.execute("SELECT 1 FROM jobs WHERE id = %s FOR UPDATE", (job.job,))
        changing = Call(change)  # it waits for J's row
        (first,) = _until(f"the {other} to wait", lambda: _waiting_on(watch, {held}))
        # The loop's poll: K's result, and J reported running with its lease to renew.
        poll = Call(
            lambda: Agents(controller).poll(
                MACHINE,
                "tok",
                PollRequest(
                    free_slots=0,
                    running=[RunningAttempt(job=job.job, attempt=job.attempt, fresh=False)],
                    results=[FinishedAttempt(job=done.job, attempt=done.attempt, status="success")],
                ),
            )
        )
        _until("the poll to wait", lambda: _waiting_on(watch, {held, first}) - {first})
        holder.execute("COMMIT")
        changing.join(timeout=30)
        poll.join(timeout=30)

    assert not changing.is_alive() and not poll.is_alive()
    assert changing.error is None, f"the {other} failed: {changing.error!r}"
    assert poll.error is None, f"the poll failed: {poll.error!r}"
    assert [(ack.job, ack.job_status) for ack in poll.answer.results] == [(done.job, "success")]
    assert [(stop.job, stop.reason) for stop in poll.answer.stop] == [(job.job, "stale")]
    assert store.get(done.job).status == "success"
    if other == "result":
        assert changing.answer == "success"
        assert store.get(job.job).status == "success"
    else:
        assert changing.answer.lease_expired == (job.job,)
        assert store.get(job.job).status == "pending"  # retried: its lease ran out
    assert _busy_slots(postgres_url) == 0  # the trigger's count, kept through both


def test_a_machine_name_the_database_refuses_leaves_no_transaction_open(
    controller: Controller, postgres_url: str
) -> None:
    """A name with a NUL (which any request may put in its path) fails the poll; the thread's
    connection must come out of it with no transaction open, or every later poll on it would
    be a savepoint of that one, never committed, holding its locks."""
    with pytest.raises(psycopg.DataError):
        Agents(controller).poll("render\x00m1", "tok", PollRequest(free_slots=1))
    _enqueue(controller)
    (work,) = Agents(controller).poll(MACHINE, "tok", PollRequest(free_slots=1)).assignments
    with psycopg.connect(postgres_url) as other:  # committed: another connection sees it
        row = other.execute("SELECT status FROM jobs WHERE id = %s", (work.job,)).fetchone()
    assert row == ("processing",)
