"""A kill reaches a busy machine at once and frees its slot at once.

On the agent's side, on a test's clock: a machine whose slots are all taken still holds a
poll (a kill wakes it at once), a killed job's cancel goes by the courier at once, and its slot
counts as free for the next poll. Then against the real controller, a real agent and the
example backend, at the default lease and poll wait: the killed job fails with ``cancelled``
and its slot takes the next job at once while the machine's other job runs on, and the backend
sees the killed request's connection closed."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from agent import courier
from agent import main as agent_main
from agent.jobs import JobRun
from agent.protocol import (
    AgentSettings,
    Assignment,
    PollReply,
    PollRequest,
    ResultAck,
    ResultReply,
    ResultRequest,
    Stop,
)
from agent.settings import Settings
from sp00ky_infra.client import Client
from tests.controllers import (
    ControllerProcess,
    backend_app,
    backend_events,
    live_machines,
    project,
    running_controller,
    wait_for,
)
from tests.helpers import cli

LEASE, POLL_WAIT, NOW = 90.0, 20.0, 1_000.0  # the default lease and poll wait


class Clock:
    """The agent's monotonic time: it moves only when a test moves it."""

    def __init__(self) -> None:
        self.t = NOW

    def monotonic(self) -> float:
        return self.t

    def time(self) -> float:
        return self.t


class Wake(threading.Event):
    """The loop's wake-up: records how long the loop would pause between polls."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        return self.is_set()


class Courier:
    """The courier's controller: the polls beside the held one (each answered with the
    acknowledgements of its results and ``assignments``), and the results posted on their
    own."""

    def __init__(self) -> None:
        self.polled: list[PollRequest] = []
        self.posted: list[tuple[str, str, ResultRequest]] = []
        self.assignments: tuple[Assignment, ...] = ()

    def poll(self, body: PollRequest, timeout: float | None = None) -> PollReply:
        self.polled.append(body)
        acks = tuple(ResultAck(job=each.job, attempt=each.attempt) for each in body.results)
        return PollReply(assignments=self.assignments, lease=LEASE, now=NOW, results=acks)

    def result(self, job: str, attempt: str, body: ResultRequest) -> ResultReply:
        self.posted.append((job, attempt, body))
        return ResultReply(job_status="failed")


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(agent_main, "time", clock)
    return clock


def _busy_agent(clock: Clock) -> agent_main.Agent:
    """An agent of a two-slot pool running two jobs, both renewed just now."""
    settings = Settings(controller_url="http://127.0.0.1:9", machine="m1", join_token="t")
    agent = agent_main.Agent(settings)
    agent.config = AgentSettings(
        slots=2, lease=LEASE, poll_wait=POLL_WAIT, recycle="never", boot_timeout=60, max_offline=270
    )
    agent.work.lease, agent.work.margin = LEASE, 9.0
    agent.backend.alive = lambda: True  # type: ignore[method-assign]
    agent.work.wake = Wake()
    agent.courier.controller = Courier()  # type: ignore[assignment]
    for job in ("j1", "j2"):
        agent.work.runs[job] = JobRun(job, f"a-{job}", "/render", {}, None, clock.t, 9.0)
    return agent


def test_a_full_machine_holds_its_poll_so_a_kill_reaches_it_at_once(clock: Clock) -> None:
    agent = _busy_agent(clock)
    wake = agent.work.wake
    assert isinstance(wake, Wake)
    outgoing = agent.outgoing()
    assert outgoing.request.free_slots == 0 and outgoing.request.wait == POLL_WAIT
    assert agent.work.holding
    # a held poll that comes back empty is followed by the next at once, not after a pause
    agent.pause(PollReply(lease=LEASE, now=clock.t), outgoing)
    assert wake.waits == []
    # later in the lease the held poll answers well before the first job would be given up
    clock.t += LEASE - 9.0 - 10.0  # ten seconds before the give-up point
    assert agent.outgoing().request.wait == 5.0
    # a draining machine's polls are answered at once: not held, paced instead
    clock.t = NOW
    agent.draining = True
    outgoing = agent.outgoing()
    assert outgoing.request.wait == 0 and not agent.work.holding
    agent.pause(PollReply(lease=LEASE, now=clock.t), outgoing)
    assert wake.waits == [1.0]


def test_a_full_machine_s_held_poll_takes_work_into_a_slot_freed_meanwhile(
    clock: Clock,
) -> None:
    """The held poll says the agent starts work in a slot a result posted on its own frees
    (the controller's answer then carries it), unless the backend restarts between jobs, the
    machine drains, or it takes no work now (an upgrade waits, the backend is down)."""
    agent = _busy_agent(clock)
    request = agent.outgoing().request
    assert request.free_slots == 0 and request.wait == POLL_WAIT and request.refill
    # the answer's assignment starts beside the job still running: the one that ended was
    # the courier's, and the slot it freed is the new one's
    agent.work.runs["j1"].report = ResultRequest(status="success", result={})
    agent.work.runs["j1"].done.set()
    agent.work.forget(agent.work.runs["j1"])
    started: list[JobRun] = []
    agent.slots.start = lambda run, *_, **__: started.append(run)  # type: ignore[method-assign]
    agent.backend.runtime = types.SimpleNamespace(port=9)
    reply = PollReply(
        assignments=(
            Assignment(
                job="j3", attempt="a-j3", path="/render", payload={}, deadline=None,
                lease_expires_at=NOW + LEASE,
            ),
        ),
        lease=LEASE,
        now=NOW,
    )  # fmt: skip
    agent.handle(reply, NOW, set())
    assert [run.job for run in started] == ["j3"] and sorted(agent.work.runs) == ["j2", "j3"]
    changes: list[Callable[[agent_main.Agent], None]] = [
        lambda it: setattr(it, "config", dataclasses.replace(it.config, recycle="job")),
        lambda it: setattr(it, "draining", True),
        lambda it: setattr(it, "taking", False),
        lambda it: setattr(it.backend, "alive", lambda: False),
    ]
    for change in changes:
        unfilled = _busy_agent(clock)
        change(unfilled)
        assert not unfilled.outgoing().request.refill


def test_a_killed_job_is_reported_at_once_by_the_courier_and_its_slot_is_free(
    clock: Clock,
) -> None:
    agent = _busy_agent(clock)
    killed, other = agent.work.runs["j1"], agent.work.runs["j2"]
    kill = PollReply(
        stop=(Stop(job="j1", attempt="a-j1", reason="cancelled"),), lease=LEASE, now=NOW
    )
    agent.handle(kill, NOW, set())
    # its request is dropped (its connection shut) and its cancel handed to the courier
    assert killed.stopped == "cancelled" and killed.sending
    assert agent.courier.queue == [(killed, None)]
    assert killed.report == ResultRequest(status="cancelled")
    # the next poll offers its slot although its thread has not ended yet, and reports it
    # neither as running nor as a result: the cancel is the courier's
    assert not killed.done.is_set()
    request = agent.outgoing().request
    assert request.free_slots == 1 and request.results == ()
    assert [each.job for each in request.running] == ["j2"]
    # the courier sends it beside the held poll, and the agent forgets it once recorded
    agent.courier.send([killed])
    (beside,) = agent.courier.controller.polled  # type: ignore[attr-defined]
    ((job, attempt, status),) = [(each.job, each.attempt, each.status) for each in beside.results]
    assert (job, attempt, status) == ("j1", "a-j1", "cancelled")
    assert beside.beside and beside.free_slots == 1
    assert list(agent.work.runs.values()) == [other]
    # the other job runs on: nothing stopped it, and the backend is not recycled
    assert other.stopped is None and not agent.recycle_due


def test_a_finished_job_s_slot_is_free_while_its_result_is_on_its_way(clock: Clock) -> None:
    agent = _busy_agent(clock)
    done = agent.work.runs["j1"]
    done.report = ResultRequest(status="success", result={"ok": True})
    done.done.set()
    with agent.work.lock:
        agent.courier.take(done, agent.work.polls)  # the held poll is out: the courier's
    request = agent.outgoing().request
    assert request.free_slots == 1 and request.results == ()


def _assignment(job: str) -> Assignment:
    return Assignment(
        job=job, attempt=f"a-{job}", path="/render", payload={}, deadline=None,
        lease_expires_at=NOW + LEASE,
    )  # fmt: skip


def test_a_result_under_a_full_machine_s_held_poll_goes_beside_it_for_the_next_job(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The held poll offers no slot, so it will not come back to carry the result: the
    courier sends it at once (no grace) on a poll beside it, whose answer starts the next job
    in the freed slot while the held poll stays out. That job, brought again by an answer
    that crossed the poll that ended it, is not started twice."""
    monkeypatch.setattr(courier, "COURIER_GRACE_SECONDS", 30.0)  # were it waited, it shows
    agent = _busy_agent(clock)
    for run in agent.work.runs.values():
        run.assigned_at = clock.t - 1.0  # started a while ago: no result of theirs to settle for
    started: list[JobRun] = []
    agent.slots.start = lambda run, *_, **__: started.append(run)  # type: ignore[method-assign]
    agent.backend.runtime = types.SimpleNamespace(port=9)
    assert agent.outgoing().request.free_slots == 0
    assert agent.work.holding and agent.work.offered == 0
    done = agent.work.runs["j1"]
    done.report = ResultRequest(status="success", result={"ok": True})
    done.done.set()
    agent.job_done(done)
    assert agent.courier.queue == [(done, agent.work.polls)]
    began = time.monotonic()
    runs = agent.courier._due()
    assert runs == [done] and time.monotonic() - began < 5.0
    remote = agent.courier.controller
    assert isinstance(remote, Courier)
    remote.assignments = (_assignment("j3"),)
    agent.courier.send(runs)
    (beside,) = remote.polled
    assert beside.beside and beside.refill and beside.wait == 0 and beside.free_slots == 1
    assert [(each.job, each.status) for each in beside.results] == [("j1", "success")]
    assert [each.job for each in beside.running] == ["j2"]
    assert [run.job for run in started] == ["j3"] and sorted(agent.work.runs) == ["j2", "j3"]
    assert agent.work.holding and remote.posted == []  # the held poll is still out
    # the held poll's answer brings j3 again and j1, sent before the results crossed it
    agent.handle(PollReply(assignments=(_assignment("j1"), _assignment("j3")), lease=LEASE,
                           now=NOW), NOW, set())  # fmt: skip
    assert [run.job for run in started] == ["j3"] and sorted(agent.work.runs) == ["j2", "j3"]


TIMINGS = "lease=90s,idleTimeout=60s,bootTimeout=15s"  # the default lease and poll wait


def _events(log: Path, event: str, game: str) -> list[dict[str, Any]]:
    return [e for e in backend_events(log) if e["event"] == event and e["gameId"] == game]


@contextmanager
def one_machine(
    tmp_path: Path, slots: int
) -> Iterator[tuple[ControllerProcess, Client, str, dict[str, str]]]:
    """A controller (the default lease) and its one ready machine of ``slots`` slots that
    never recycles, the example backend logging to backend.jsonl: the controller, a client,
    the machine's name and the CLI's environment."""
    log = tmp_path / "backend.jsonl"
    config = project(
        tmp_path,
        {"render": {"min": 1, "slots": slots, "recycle": "never"}},
        {"renderer": backend_app("render", "render_job", log)},
    )
    store_url = f"sqlite:///{tmp_path}/state.db"
    client = Client(store_url, config)
    env = {"SPKY_STORE": store_url, "SPKY_CONFIG": str(config)}
    try:
        with running_controller(tmp_path, config, store_url, SPKY_POOL_TIMINGS=TIMINGS) as proc:
            found = wait_for(
                lambda: live_machines(client.store, "render", "ready"), what="a ready machine"
            )
            (name,) = found
            yield proc, client, name, env
    finally:
        client.close()


def test_a_killed_job_frees_its_slot_for_the_next_at_once_while_the_other_runs_on(
    tmp_path: Path,
) -> None:
    log = tmp_path / "backend.jsonl"
    with one_machine(tmp_path, slots=2) as (controller, client, _, env):
        store = client.store
        killed = client.run("renderer", "/render", {"gameId": "killed", "seconds": 30})
        other = client.run("renderer", "/render", {"gameId": "other", "seconds": 6})
        wait_for(
            lambda: _events(log, "start", "killed") and _events(log, "start", "other"),
            what="both jobs running",
        )
        third = client.run("renderer", "/render", {"gameId": "third", "seconds": 0.1})
        time.sleep(1.5)  # the machine is full: the third job waits, and explain says so
        assert store.get(third.id).status == "pending"
        causes = controller.admin("GET", f"/jobs/{third.id}/explain").json()["causes"]
        assert [each["code"] for each in causes] == ["pool_at_max"], causes  # not "starting"
        (machine,) = controller.pool("render")["machine_list"]
        assert machine["busy_slots"] == 2

        killing = cli("jobs", "kill", killed.id, env=env)
        assert "kill sent to machine" in killing.stdout, killing.stderr
        kill_at = store.get(killed.id).updated_at  # the kill's write
        started = wait_for(
            lambda: _events(log, "start", "third"), timeout=2, what="the third job started"
        )
        assert started[0]["t"] - kill_at < 2
        done = store.get(killed.id)
        assert done.status == "failed" and done.errors[-1]["code"] == "cancelled"
        assert done.finished_at is not None and done.finished_at - kill_at < 2
        assert store.get(other.id).status == "processing"

        (machine,) = controller.pool("render")["machine_list"]
        assert machine["busy_slots"] in (1, 2)  # the other job, and the third until it ends
        wait_for(lambda: store.get(other.id).status == "success", timeout=20, what="the other")
        wait_for(lambda: store.get(third.id).status == "success", timeout=5, what="the third")
        assert [m["busy_slots"] for m in controller.pool("render")["machine_list"]] == [0]
        # the backend saw the killed request's client leave, and stopped its work early
        (closed,) = [e for e in backend_events(log) if e["event"] == "closed"]
        assert closed["gameId"] == "killed" and closed["t"] - kill_at < 2
        assert closed["left"] > 20
        assert not _events(log, "end", "killed")


def test_a_killed_job_s_slot_counts_busy_until_its_agent_reports_the_cancel(
    tmp_path: Path,
) -> None:
    """`explain` and `pools get` count the slot a killed job held as busy while its agent has
    not said the job stopped (the agent frozen here), and as free once the cancel is in."""
    log = tmp_path / "backend.jsonl"
    with one_machine(tmp_path, slots=1) as (controller, client, name, env):
        store = client.store
        killed = client.run("renderer", "/render", {"gameId": "killed", "seconds": 30})
        wait_for(lambda: _events(log, "start", "killed"), what="the job running")
        waiting = client.run("renderer", "/render", {"gameId": "next", "seconds": 0.1})
        agent = int(store.machines.get(name).provider_id or 0)
        os.kill(agent, signal.SIGSTOP)
        try:
            assert cli("jobs", "kill", killed.id, env=env).returncode == 0
            assert store.get(killed.id).status == "processing"  # no cancel from the agent yet
            causes = controller.admin("GET", f"/jobs/{waiting.id}/explain").json()["causes"]
            assert "starting" not in [each["code"] for each in causes], causes
            assert [m["busy_slots"] for m in controller.pool("render")["machine_list"]] == [1]
        finally:
            os.kill(agent, signal.SIGCONT)
        wait_for(lambda: _events(log, "start", "next"), timeout=5, what="the next job started")
        assert store.get(killed.id).errors[-1]["code"] == "cancelled"
        wait_for(lambda: store.get(waiting.id).status == "success", timeout=5, what="the next")
        assert [m["busy_slots"] for m in controller.pool("render")["machine_list"]] == [0]
