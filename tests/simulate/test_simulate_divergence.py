"""The simulator and the controller decide alike: the same workload, boots and agents drive
the real controller (its tick, executor, poll and result, on a real SQLite store, with a
virtual clock) and the simulator's PolicyPool in lockstep; the first decision where they
differ fails the test: a plan (sizing, drains and their choice, creates, fails, destroys,
idle clocks, breaker notes), a claim (admission order, head-of-line, concurrency), a queue
timeout, a refusal (maxQueued)."""

from __future__ import annotations

import random
from collections import deque
from pathlib import Path
from typing import Any

import pytest

from sp00ky_infra.config.loader import load_config
from sp00ky_infra.controller.agents import Agents
from sp00ky_infra.controller.core import Controller
from sp00ky_infra.controller.errors import Gone, Unauthorized
from sp00ky_infra.controller.protocol import PollRequest, ResultRequest, RunningAttempt
from sp00ky_infra.controller.reconcile import tick
from sp00ky_infra.controller.settings import ControllerSettings
from sp00ky_infra.policy.jobs import admission_key
from sp00ky_infra.policy.placement import Standing, packed
from sp00ky_infra.simulate.engine import simulate
from sp00ky_infra.simulate.model import PolicyPool, TickResult
from sp00ky_infra.simulate.providers import ProviderModel
from sp00ky_infra.simulate.workload import Arrival, Distribution
from sp00ky_infra.store import NewJob, QueueFull, SqlStore, open_store
from tests.controller.test_controller_executor import Recording
from tests.controllers import backend_app, project

START = 0.0  # the controller runs on the simulated clock itself: plans compare as they are


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


class Standings:
    """A line that takes note of the standing each look offers, and lets none claim."""

    def __init__(self) -> None:
        self.seen: dict[str, Standing] = {}

    def may_claim(self, pool: str, machine: str, standing: Standing) -> bool:
        self.seen[machine] = standing
        return False

    def freed(self, machine: str) -> None:
        """No poll is held here: a freed slot is offered by the next poll anyway."""


class ControllerPool:
    """The real controller behind the simulator's ``Decisions``: every call goes through the
    controller's own code (tick, join, ready, poll, result, drained)."""

    def __init__(self, controller: Controller, provisioner: Recording, clock: Clock) -> None:
        self.c = controller
        self.agents = Agents(controller)
        self.provisioner = provisioner
        self.clock = clock
        self.store: SqlStore = controller.store
        (self.pool_name,) = controller.pools
        self.pool = controller.pools[self.pool_name]
        self.backend = controller.backends[self.pool_name]
        self.sessions: dict[str, str] = {}
        self.running: dict[str, dict[str, str]] = {}  # machine -> job -> attempt
        self.where: dict[str, str] = {}
        self.failed_seen: set[str] = set()

    def _at(self, now: float) -> None:
        self.clock.now = START + now

    def enqueue(
        self, job_id: str, now: float, delay: float = 0.0, priority: int = 0, slots: int = 1
    ) -> str | None:
        self._at(now)
        new = NewJob(
            self.backend.name,
            self.c.table_of(self.pool_name),
            "/render",
            {},
            delay_ms=round(delay * 1000),
            priority=priority,
            slots=slots,
            pool=self.pool_name,
            queue_timeout=self.pool.queue_timeout,
            max_job_duration=self.pool.max_job_duration,
        )
        try:
            return self.store.enqueue(new, self.clock.now, self.pool.max_queued).id
        except QueueFull:
            return None

    def tick(self, now: float) -> TickResult:
        self._at(now)
        for name, session in list(self.sessions.items()):  # agents keep polling
            try:
                self.agents.poll(name, session, self._request(name, 0))
            except (Gone, Unauthorized):
                del self.sessions[name]
        before = len(self.provisioner.specs)
        report = tick(self.c)
        (plan,) = report.plans
        created = tuple(spec.name for spec in self.provisioner.specs[before:])
        failed = {job.id for job in self.store.list_jobs(status="failed", limit=100_000)}
        timed_out = tuple(sorted(failed - self.failed_seen))
        self.failed_seen |= failed
        return TickResult(plan, created, timed_out)

    def _request(self, name: str, free: int) -> PollRequest:
        running = [RunningAttempt(job=j, attempt=a) for j, a in self.running.get(name, {}).items()]
        return PollRequest(running=running, free_slots=free, wait=0)

    def booted(self, name: str, ok: bool, now: float) -> None:
        self._at(now)
        (spec,) = [s for s in self.provisioner.specs if s.name == name]
        assert spec.join_token is not None
        try:
            session = self.agents.join(name, spec.join_token).session
            self.agents.ready(name, session, ok, None if ok else "the backend did not start")
        except (Gone, Unauthorized):
            return  # failed meanwhile (boot timeout)
        self.sessions[name] = session

    def order(self, offering: dict[str, int]) -> list[str]:
        """The order the controller offers work in: each machine's standing as its poll's
        own look gives it to the hub (``Agents.line``), put in order by the policy."""
        if not self.pool.pack_jobs:
            return list(offering)
        line = Standings()
        looker = Agents(self.c, line)
        for name, free in offering.items():
            looker.look(name, self.sessions[name], self._request(name, free))
        return packed(line.seen.items())

    def claim(self, machine: str, free_slots: int, now: float) -> list[str]:
        self._at(now)
        reply = self.agents.poll(
            machine, self.sessions[machine], self._request(machine, free_slots)
        )
        jobs = []
        for assignment in reply.assignments:
            self.running.setdefault(machine, {})[assignment.job] = assignment.attempt
            self.where[assignment.job] = machine
            jobs.append(assignment.job)
        return jobs

    def finished(self, job_id: str, now: float) -> None:
        self._at(now)
        machine = self.where.pop(job_id)
        attempt = self.running[machine].pop(job_id)
        self.agents.result(
            machine, self.sessions[machine], job_id, attempt, ResultRequest(status="success")
        )

    def drained(self, name: str, now: float) -> None:
        self._at(now)
        self.agents.drained(name, self.sessions[name])

    def draining(self) -> list[str]:
        return sorted(m.name for m in self.store.machines.live() if m.state == "draining")

    def ready(self) -> list[str]:
        return sorted(m.name for m in self.store.machines.live() if m.state == "ready")


class Lockstep:
    """Both sides get every call; any answer that differs fails at once."""

    def __init__(self, real: ControllerPool, names: deque[str], sim: PolicyPool) -> None:
        self.real, self.names, self.sim = real, names, sim
        self.ticks = 0
        self.decisions: dict[str, int] = {}
        self.idle_drains: list[tuple[str, float]] = []  # (machine, when)

    def enqueue(
        self, job_id: str, now: float, delay: float = 0.0, priority: int = 0, slots: int = 1
    ) -> str | None:
        real = self.real.enqueue(job_id, now, delay, priority, slots)
        sim = self.sim.enqueue(real or job_id, now, delay, priority, slots)
        assert (real is None) == (sim is None), f"maxQueued refused one side only at {now}"
        if real is None:
            self.decisions["refused"] = self.decisions.get("refused", 0) + 1
        return real

    def tick(self, now: float) -> TickResult:
        real = self.real.tick(now)
        self.names.extend(real.created)
        sim = self.sim.tick(now)
        assert sim.plan == real.plan, f"plans differ at t={now}:\n{sim.plan}\n{real.plan}"
        assert sim.created == real.created
        assert sorted(sim.timed_out) == sorted(real.timed_out), f"queue timeouts at t={now}"
        self.ticks += 1
        plan = real.plan
        self.idle_drains += [
            (d.machine, now) for d in plan.drain if d.reason.value == "idle_surplus"
        ]
        for kind, count in (
            ("create", plan.create.count if plan.create else 0),
            *((f"drain:{d.reason.value}", 1) for d in plan.drain),
            *((f"fail:{f.reason.value}", 1) for f in plan.fail),
            ("breaker", sum("breaker open" in note for note in plan.notes)),
            ("queue_timeout", len(real.timed_out)),
        ):
            self.decisions[kind] = self.decisions.get(kind, 0) + count
        return real

    def order(self, offering: dict[str, int]) -> list[str]:
        real = self.real.order(offering)
        assert self.sim.order(offering) == real, f"placement differs: {offering}"
        if len(real) > 1:
            self.decisions["placements"] = self.decisions.get("placements", 0) + 1
        return real

    def claim(self, machine: str, free_slots: int, now: float) -> list[str]:
        real = self.real.claim(machine, free_slots, now)
        sim = self.sim.claim(machine, free_slots, now)
        assert sim == real, f"claims differ at t={now} on {machine}: {sim} vs {real}"
        self.decisions["claims"] = self.decisions.get("claims", 0) + len(real)
        return real

    def finished(self, job_id: str, now: float) -> None:
        self.real.finished(job_id, now)
        self.sim.finished(job_id, now)

    def booted(self, name: str, ok: bool, now: float) -> None:
        self.real.booted(name, ok, now)
        self.sim.booted(name, ok, now)
        assert sorted(self.sim.ready()) == self.real.ready(), f"ready machines at t={now}"

    def drained(self, name: str, now: float) -> None:
        self.real.drained(name, now)
        self.sim.drained(name, now)

    def draining(self) -> list[str]:
        real = self.real.draining()
        assert sorted(self.sim.draining()) == real
        return real

    def ready(self) -> list[str]:
        real = self.real.ready()
        assert sorted(self.sim.ready()) == real
        return real


SCENARIOS: dict[str, dict[str, Any]] = {
    # scale to zero, one slot: sizing, boots, idle drains (longest idle first), creates
    "scale-to-zero": {
        "pool": {"min": 0, "autoscale": True, "max": 3, "idleTimeout": "20s"},
        "method": {},
        "boot": Distribution("normal", 15.0, 5.0),
        "failure_rate": 0.0,
        "jobs": 40,
        "minutes": 8,
    },
    # the same, work handed out longest-waiting machine first (packJobs: false)
    "spread": {
        "pool": {"min": 0, "autoscale": True, "max": 3, "idleTimeout": "20s", "packJobs": False},
        "method": {},
        "boot": Distribution("normal", 15.0, 5.0),
        "failure_rate": 0.0,
        "jobs": 40,
        "minutes": 8,
    },
    # machines billed per started minute: work packed, idle surplus machines kept until the
    # end of their paid minute
    "paid-hours": {
        "pool": {"min": 0, "autoscale": True, "max": 4, "idleTimeout": "10s"},
        "method": {},
        "boot": Distribution("normal", 8.0, 2.0),
        "failure_rate": 0.0,
        "jobs": 120,
        "minutes": 8,
        "billing_hour": 60.0,
    },
    # two slots, a buffer, jobs of two slots (head-of-line), priorities and delays, the
    # table's concurrency, maxLifetime renewals, queue timeouts, failed boots feeding the
    # breaker, boots slower than the boot timeout, and maxQueued refusals
    "everything": {
        "pool": {
            "min": 1,
            "autoscale": True,
            "max": 3,
            "buffer": 1,
            "slots": 2,
            "idleTimeout": "10s",
            "maxLifetime": "2m",
            "maxJobDuration": "1m",
            "queueTimeout": "20s",
            "bootTimeout": "25s",
            "maxQueued": 8,
        },
        "method": {"concurrency": 4},
        "boot": Distribution("uniform", 5.0, 30.0),
        "failure_rate": 0.5,
        "jobs": 90,
        "minutes": 5,
    },
}


def _arrivals(count: int, minutes: float, seed: int) -> list[Arrival]:
    rng = random.Random(seed)
    times = sorted(round(rng.uniform(0, minutes * 60), 3) for _ in range(count))
    return [
        Arrival(
            at=t,
            duration=round(rng.uniform(2, 25), 3),
            priority=rng.choice((0, 0, 0, 1, 5)),
            slots=rng.choice((1, 1, 2)),
            delay=rng.choice((0.0, 0.0, 0.0, 4.0)),
        )
        for t in times
    ]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_the_simulator_decides_as_the_controller_does(tmp_path: Path, name: str) -> None:
    scenario = SCENARIOS[name]
    app = backend_app("render", "render_job", tmp_path / "log")
    app["method"].update(scenario["method"])
    config = load_config(project(tmp_path, {"render": scenario["pool"]}, {"renderer": app}))
    store = open_store(f"sqlite:///{tmp_path}/state.db")
    provisioner = Recording(delivers_join_token=True)
    clock = Clock()
    settings = ControllerSettings(
        secret="divergence-secret-0123456789abcdef",
        state_dir=str(tmp_path),
        breaker_first_pause=20.0,
        breaker_max_pause=60.0,
        join_ttl=3600.0,
        billing_hour=scenario.get("billing_hour"),
    )
    controller = Controller(settings, config, store, provisioner, clock=clock)
    pool = config.pools["render"]
    names: deque[str] = deque()
    sim = PolicyPool(
        "render",
        pool,
        queue_timeout=pool.queue_timeout,
        max_queued=pool.max_queued,
        concurrency=scenario["method"].get("concurrency"),
        breaker_first_pause=20.0,
        breaker_max_pause=60.0,
        names=names.popleft,
        billing=settings.billing,
    )
    lockstep = Lockstep(ControllerPool(controller, provisioner, clock), names, sim)
    provider = ProviderModel("test", scenario["boot"], scenario["failure_rate"], 0.5, 0.2)
    try:
        outcome = simulate(
            lockstep,
            _arrivals(scenario["jobs"], scenario["minutes"], seed=len(name)),
            provider,
            pool.slots,
            pool.recycle,
            seed=3,
        )
    finally:
        controller.leader_lock.release()
        store.close()
    assert outcome.settled and lockstep.ticks > 100
    made = lockstep.decisions
    assert made["create"] > 1 and made["claims"] > 20 and made.get("drain:idle_surplus")
    assert made.get("placements") or not pool.pack_jobs, made
    billing = settings.billing
    if billing is not None:  # every idle drain came as its machine's paid minute ended
        created = {m.name: m.created_at for m in outcome.machines}
        drains = lockstep.idle_drains
        assert drains and all(billing.drain_due(created[m], at) for m, at in drains), drains
    if name == "everything":  # the scenario reached what it is for
        assert made.get("drain:max_lifetime"), made
        assert made.get("queue_timeout") and made.get("refused") and made["breaker"], made
        assert sum(1 for m in outcome.machines if m.failed) > 0, made


def test_admission_key_is_the_stores_queue_order(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/state.db")
    try:
        jobs = [
            store.enqueue(NewJob("b", "t", "/p", {}, priority=p), START + at)
            for p, at in ((0, 3), (5, 9), (0, 1), (5, 2), (1, 1), (0, 1))
        ]
        order = [job.id for job in store.queue("t", START + 100)]
        by_key = sorted(jobs, key=lambda j: admission_key(j.priority, j.created_at, j.id))
        assert order == [job.id for job in by_key]
    finally:
        store.close()
