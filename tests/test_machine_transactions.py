"""PostgreSQL: a machine's polls and results take their transactions one at a time.

The agent's courier posts a job's result while the loop's next poll may still report that
job as running and renew its lease. The poll's own results take the machine's row (its busy
slots, kept by trigger) before the renewal takes the job's row; the result takes the job's
row before the machine's. In that order the two deadlocked: the server broke the cycle after
its deadlock_timeout (a second) by failing one of them, which the bench saw up to three times
in a 3,000-job run. Both now hold the machine's key (``machine_key``) from the start.

The interleaving is forced, not hoped for: a third connection holds the job's row, so the
result waits there first and the poll comes second; then that connection lets go.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sp00ky_infra.config.loader import load_config
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
from tests.controllers import add_ready_machine, backend_app, leading, project
from tests.test_controller_executor import Recording

MACHINE = "render-m1"


@pytest.fixture
def controller(tmp_path: Path, postgres_url: str) -> Iterator[Controller]:
    """A leading controller on PostgreSQL, one ready machine of four slots whose agent holds
    the session ``tok``."""
    store = open_store(postgres_url)
    store.migrate()
    app = backend_app("render", "render_job", tmp_path / "log")
    config = load_config(project(tmp_path, {"render": {"min": 1, "slots": 4}}, {"renderer": app}))
    settings = ControllerSettings(secret="s", state_dir=str(tmp_path))
    revision = Deployment.of(config, settings.pool).revisions["render"]
    add_ready_machine(store, MACHINE, revision, 4, "tok", time.time())
    with leading(Controller(settings, config, store, Recording(delivers_join_token=True))) as made:
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


def test_a_result_and_a_poll_renewing_its_job_take_turns_instead_of_deadlocking(
    controller: Controller, postgres_url: str
) -> None:
    store = controller.store
    now = time.time()
    store.enqueue_many(
        [NewJob("renderer", "render_job", "/render", {"n": n}, pool="render") for n in range(2)],
        now,
    )
    job, other = controller.poll(MACHINE, "tok", PollRequest(free_slots=2)).assignments
    assert _busy_slots(postgres_url) == 2

    with (
        psycopg.connect(postgres_url, autocommit=True) as holder,
        psycopg.connect(postgres_url, autocommit=True) as watch,
    ):
        held = holder.info.backend_pid
        holder.execute("BEGIN")
        holder.execute("SELECT 1 FROM jobs WHERE id = %s FOR UPDATE", (job.job,))
        # The courier's result of the job: it waits for the job's row.
        result = Call(
            lambda: controller.result(
                MACHINE, "tok", job.job, job.attempt, ResultRequest(status="success")
            )
        )
        (courier,) = _until("the result to wait", lambda: _waiting_on(watch, {held}))
        # The loop's poll: the other job's result, and the first job reported running with
        # its lease to renew (the courier's POST is still out).
        poll = Call(
            lambda: controller.poll(
                MACHINE,
                "tok",
                PollRequest(
                    free_slots=0,
                    running=[RunningAttempt(job=job.job, attempt=job.attempt, fresh=False)],
                    results=[
                        FinishedAttempt(job=other.job, attempt=other.attempt, status="success")
                    ],
                ),
            )
        )
        _until("the poll to wait", lambda: _waiting_on(watch, {held, courier}) - {courier})
        holder.execute("COMMIT")
        result.join(timeout=30)
        poll.join(timeout=30)

    assert not result.is_alive() and not poll.is_alive()
    assert result.error is None, f"the result failed: {result.error!r}"
    assert poll.error is None, f"the poll failed: {poll.error!r}"
    assert result.answer == "success"
    assert [(ack.job, ack.job_status) for ack in poll.answer.results] == [(other.job, "success")]
    assert store.get(job.job).status == "success"
    assert store.get(other.job).status == "success"
    assert _busy_slots(postgres_url) == 0  # the trigger's count, kept through both
