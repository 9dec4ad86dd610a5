"""The virtual clock: arrivals, boots, jobs and agents as events, and the controller's tick
every ``tick`` seconds, in time order.

The engine models the world (the agents: a boot that takes so long, a job that runs so long,
a backend restarted between jobs, an agent that leaves after a drain); every decision is the
``Decisions``' (``model.PolicyPool``: the policy, in memory). Events at the same instant are
handled in the order they were scheduled, and before a tick at that instant.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, cast

from sp00ky_infra.simulate.model import TickResult
from sp00ky_infra.simulate.providers import ProviderModel
from sp00ky_infra.simulate.workload import Arrival

ARRIVE, DUE, DONE, BOOT, DRAINED, RECYCLED = range(6)
GIVE_UP_AFTER = 7 * 86400.0  # past the workload, a pool that never settles stops here


class Decisions(Protocol):
    """The controller's side of one pool (``PolicyPool``, or the real controller in tests)."""

    def enqueue(
        self, job_id: str, now: float, delay: float = 0.0, priority: int = 0, slots: int = 1
    ) -> str | None: ...
    def order(self, offering: dict[str, int]) -> list[str]: ...
    def claim(self, machine: str, free_slots: int, now: float) -> list[str]: ...
    def finished(self, job_id: str, now: float) -> None: ...
    def booted(self, name: str, ok: bool, now: float) -> None: ...
    def drained(self, name: str, now: float) -> None: ...
    def draining(self) -> list[str]: ...
    def ready(self) -> list[str]: ...
    def tick(self, now: float) -> TickResult: ...


@dataclass(slots=True)
class JobRecord:
    arrival: Arrival
    due: float
    id: str = ""
    start: float | None = None
    end: float | None = None
    machine: int | None = None  # the machine's index, in creation order
    timed_out: bool = False
    refused: bool = False

    @property
    def wait(self) -> float | None:
        return None if self.start is None else self.start - self.due


@dataclass(slots=True)
class Agent:
    """A machine as the world sees it: asked for, booting, running jobs, gone."""

    name: str
    index: int
    created_at: float
    ready_at: float | None = None
    destroyed_at: float | None = None
    failed: bool = False
    busy: int = 0
    busy_since: float | None = None
    busy_seconds: float = 0.0
    told_drain: bool = False
    left: bool = False


@dataclass
class Outcome:
    jobs: list[JobRecord]
    machines: list[Agent]
    series: list[tuple[float, int]]  # (time, live machines) at every tick the count changed
    end: float
    ticks: int
    longest_queue: int
    settled: bool  # the pool came to rest (False: stopped GIVE_UP_AFTER past the workload)
    plans: list[TickResult] = field(default_factory=list)  # only when asked (keep_plans)


def simulate(
    decisions: Decisions,
    arrivals: Sequence[Arrival],
    provider: ProviderModel,
    slots: int,
    recycle: str = "job",
    tick: float = 2.0,
    window: float = 0.0,
    seed: int = 0,
    keep_plans: bool = False,
) -> Outcome:
    """Run ``arrivals`` through ``decisions`` until the workload is done, ``window`` seconds
    have passed and the pool has settled (its plan empty, its size what it wants)."""
    return _Run(decisions, arrivals, provider, slots, recycle, tick, window, seed, keep_plans).run()


class _Run:
    def __init__(
        self,
        decisions: Decisions,
        arrivals: Sequence[Arrival],
        provider: ProviderModel,
        slots: int,
        recycle: str,
        tick: float,
        window: float,
        seed: int,
        keep_plans: bool,
    ) -> None:
        self.d = decisions
        self.provider = provider
        self.slots = slots
        self.recycle = recycle == "job"
        self.tick_every = tick
        self.window = max(window, arrivals[-1].at if arrivals else 0.0)
        self.rng = random.Random(seed)
        self.keep_plans = keep_plans
        self.events: list[tuple[float, int, int, object]] = []
        self.seq = itertools.count()
        self.jobs = [JobRecord(a, a.at + a.delay) for a in arrivals]
        self.by_id: dict[str, JobRecord] = {}
        self.agents: dict[str, Agent] = {}
        self.machines: list[Agent] = []
        self.free: dict[str, Agent] = {}  # ready agents that can take a job now
        self.due = 0  # jobs due and waiting
        self.longest = 0
        self.unfinished = 0
        self.series: list[tuple[float, int]] = [(0.0, 0)]
        self.live = 0
        self.plans: list[TickResult] = []
        for record in self.jobs:
            self._at(record.arrival.at, ARRIVE, record)

    def _at(self, when: float, kind: int, data: object) -> None:
        heapq.heappush(self.events, (when, next(self.seq), kind, data))

    def run(self) -> Outcome:
        events = self.events
        now = 0.0
        ticks = 0
        give_up = self.window + GIVE_UP_AFTER
        settled = True
        while True:
            now = ticks * self.tick_every
            while events and events[0][0] <= now:
                when, _, kind, data = heapq.heappop(events)
                self._handle(when, kind, data)
            result = self.d.tick(now)
            ticks += 1
            self._after_tick(now, result)
            if now >= self.window and not events and self.unfinished == 0 and self._settled(result):
                break
            if now > give_up:
                settled = False
                break
        for agent in self.machines:
            if agent.busy_since is not None:
                agent.busy_seconds += now - agent.busy_since
                agent.busy_since = None
        return Outcome(
            self.jobs, self.machines, self.series, now, ticks, self.longest, settled, self.plans
        )

    def _settled(self, result: TickResult) -> bool:
        """The pool is at rest: nothing to do, the size it wants, no machine coming or going."""
        plan = result.plan
        return (
            plan.empty
            and plan.current == plan.desired
            and all(a.ready_at is not None and not a.told_drain for a in self.agents.values())
        )

    # --- events ------------------------------------------------------------------------------

    def _handle(self, now: float, kind: int, data: object) -> None:
        if kind == ARRIVE:
            self._arrive(now, data)  # type: ignore[arg-type]
        elif kind == DUE:
            self._became_due()
        elif kind == DONE:
            self._done(now, data)  # type: ignore[arg-type]
        elif kind == BOOT:
            name, ok = cast(tuple[str, bool], data)
            self._booted(now, name, ok)
        elif kind == DRAINED:
            agent = self.agents.get(data)  # type: ignore[call-overload]
            if agent is not None and agent.destroyed_at is None:
                agent.left = True
                self.d.drained(agent.name, now)
        elif kind == RECYCLED:
            agent = data
            self._maybe_free(agent)  # type: ignore[arg-type]
        self._offer(now)

    def _arrive(self, now: float, record: JobRecord) -> None:
        a = record.arrival
        job_id = None
        if a.slots <= self.slots:  # `run` refuses a job bigger than a machine
            job_id = self.d.enqueue(f"job-{len(self.by_id)}", now, a.delay, a.priority, a.slots)
        if job_id is None:
            record.refused = True
            return
        record.id = job_id
        self.by_id[job_id] = record
        self.unfinished += 1
        if a.delay > 0:
            self._at(record.due, DUE, record)
        else:
            self._became_due()

    def _became_due(self) -> None:
        self.due += 1
        self.longest = max(self.longest, self.due)

    def _booted(self, now: float, name: str, ok: bool) -> None:
        agent = self.agents.get(name)
        if agent is None or agent.destroyed_at is not None:
            return  # failed meanwhile (boot timeout) and destroyed
        self.d.booted(name, ok, now)
        if not ok:
            agent.failed = True
            return
        if name in self.d.ready():
            agent.ready_at = now
            self.free[name] = agent

    def _done(self, now: float, record: JobRecord) -> None:
        record.end = now
        self.unfinished -= 1
        agent = self.machines[record.machine]  # type: ignore[index]
        agent.busy -= record.arrival.slots
        self.d.finished(record.id, now)
        if agent.busy:
            self._maybe_free(agent)
            return
        agent.busy_seconds += now - agent.busy_since  # type: ignore[operator]
        agent.busy_since = None
        if agent.told_drain:
            self._at(now + self.provider.drain, DRAINED, agent.name)
        elif self.recycle and self.provider.recycle > 0:
            self.free.pop(agent.name, None)
            self._at(now + self.provider.recycle, RECYCLED, agent)
        else:
            self._maybe_free(agent)

    def _maybe_free(self, agent: Agent) -> None:
        if (
            agent.destroyed_at is None
            and agent.ready_at is not None
            and not agent.told_drain
            and agent.busy < self.slots
        ):
            self.free[agent.name] = agent

    def _offer(self, now: float) -> None:
        """Every agent with a free slot polls: the decisions say which is offered work first
        and what each one starts."""
        if self.due <= 0 or not self.free:
            return
        free = self.free
        for name in self.d.order({name: self.slots - a.busy for name, a in free.items()}):
            agent = free[name]
            started = self.d.claim(agent.name, self.slots - agent.busy, now)
            for job_id in started:
                record = self.by_id[job_id]
                record.start = now
                record.machine = agent.index
                if agent.busy == 0:
                    agent.busy_since = now
                agent.busy += record.arrival.slots
                self.due -= 1
                self._at(now + record.arrival.duration, DONE, record)
            if agent.busy >= self.slots:
                del self.free[agent.name]
            if self.due <= 0:
                return

    # --- the tick ----------------------------------------------------------------------------

    def _after_tick(self, now: float, result: TickResult) -> None:
        if self.keep_plans:
            self.plans.append(result)
        plan = result.plan
        for job_id in result.timed_out:
            record = self.by_id[job_id]
            record.timed_out = True
            self.due -= 1
            self.unfinished -= 1
        gone = [f.machine for f in plan.fail] + [d.machine for d in plan.destroy]
        for name in gone:
            agent = self.agents.pop(name, None)
            if agent is not None:
                agent.destroyed_at = now
                self.free.pop(name, None)
                if agent.busy_since is not None:
                    agent.busy_seconds += now - agent.busy_since
                    agent.busy_since = None
        for name in result.created:
            agent = Agent(name, len(self.machines), now)
            self.agents[name] = agent
            self.machines.append(agent)
            boot = self.provider.boot.sample(self.rng)
            ok = self.rng.random() >= self.provider.failure_rate
            self._at(now + boot, BOOT, (name, ok))
        if plan.drain:
            for name in self.d.draining():
                agent = self.agents.get(name)
                if agent is None or agent.told_drain:
                    continue
                agent.told_drain = True  # its long-poll is woken: it hears at once
                self.free.pop(name, None)
                if agent.busy == 0:
                    self._at(now + self.provider.drain, DRAINED, name)
        live = len(self.agents)
        if live != self.live:
            self.live = live
            self.series.append((now, live))
        self._offer(now)
