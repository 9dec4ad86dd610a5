"""A machine's busy period (what billing counts as not idle) opens when an idle machine takes
work; a busy machine's next claims write nothing to its row (none inside PostgreSQL's
admission lock). A claim that races the tick's idle clock is repaired by the next tick, which
opens the busy period as it stops the clock."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sp00ky_infra.config.loader import load_config
from sp00ky_infra.controller.agents import Agents
from sp00ky_infra.controller.core import Controller
from sp00ky_infra.controller.protocol import FinishedAttempt, PollRequest
from sp00ky_infra.controller.reconcile import tick
from sp00ky_infra.controller.settings import ControllerSettings
from sp00ky_infra.controller.state import Deployment
from sp00ky_infra.store import NewJob, open_store
from sp00ky_infra.store.sqlite import SqliteStore
from tests.controller.test_controller_executor import Recording
from tests.controllers import add_ready_machine, backend_app, leading, project

MACHINE = "render-m1"


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Controller]:
    """A leading controller (idle timeout 5 min: no drain here) with one ready machine of
    two slots whose agent holds the session ``tok``."""
    app = backend_app("render", "render_job", tmp_path / "log")
    pools = {"render": {"min": 1, "slots": 2}}
    config_path = project(tmp_path, pools, {"renderer": app})
    config = load_config(config_path)
    settings = ControllerSettings(secret="s", state_dir=str(tmp_path))
    store = open_store(f"sqlite:///{tmp_path}/state.db")
    store.migrate()
    revision = Deployment.of(config, settings.pool).revisions["render"]
    add_ready_machine(store, MACHINE, revision, 2, "tok", time.time())
    with leading(Controller(settings, config, store, Recording(delivers_join_token=True))) as made:
        yield made


def _poll(controller: Controller, free: int, done: list[str] | None = None) -> list[str]:
    """One poll of the machine: the jobs it reports finished, ``free`` slots; the jobs it got."""
    results = []
    for job_id in done or []:
        job = controller.store.get(job_id)
        assert job.attempt is not None
        results.append(FinishedAttempt(job=job_id, attempt=job.attempt, status="success"))
    request = PollRequest(free_slots=free, results=results)
    return [work.job for work in Agents(controller).poll(MACHINE, "tok", request).assignments]


def _enqueue(controller: Controller) -> None:
    job = NewJob("renderer", "render_job", "/render", {"gameId": "g"}, pool="render")
    controller.store.enqueue(job, time.time())


def test_a_busy_machines_claims_write_nothing_to_its_row(controller: Controller) -> None:
    store = controller.store
    assert isinstance(store, SqliteStore)
    [life] = store.machines.lifetimes("render")
    assert life.busy_since is None and store.machines.get(MACHINE).idle_since is not None
    _enqueue(controller)
    [first] = _poll(controller, free=2)  # an idle machine takes work: its busy period opens
    [life] = store.machines.lifetimes("render")
    opened = life.busy_since
    assert opened is not None and store.machines.get(MACHINE).idle_since is None
    statements: list[str] = []
    store._connection().set_trace_callback(statements.append)  # this thread's: the poll's
    try:
        _enqueue(controller)
        [second] = _poll(controller, free=1, done=[first])
    finally:
        store._connection().set_trace_callback(None)
    assert second != first and store.get(first).status == "success"
    assert not [sql for sql in statements if sql.startswith("UPDATE machines SET idle_since")]
    [life] = store.machines.lifetimes("render")
    assert life.busy_since == opened  # still the one period


def test_the_tick_opens_the_busy_period_a_racing_claim_did_not(controller: Controller) -> None:
    store = controller.store
    _enqueue(controller)
    _poll(controller, free=2)
    # the tick read the machine idle just before that claim and started its clock after it:
    # the claim saw the clock stopped and wrote nothing
    store.machines.set_idle(MACHINE, time.time())
    [life] = store.machines.lifetimes("render")
    assert life.busy_since is None and store.machines.get(MACHINE).idle_since is not None
    before = time.time()
    tick(controller)  # a ready machine running a job: its clock stops, its busy period opens
    [life] = store.machines.lifetimes("render")
    assert store.machines.get(MACHINE).idle_since is None
    assert life.busy_since is not None and life.busy_since >= before
