"""The controller's side of one pool, in memory: the rows the store would hold, and every
decision taken by the same policy functions the controller calls.

The controller reads its store and calls ``policy``; this class keeps the same facts in
dicts and heaps and calls the same functions, in the same order as the tick, the executor
and an agent's poll do:

- the tick: the recovery sweep fails jobs past their queue deadline (``queue_expired``), the
  pool is viewed (``pool_view``, ``queue_cap``) and planned (``plan_pool``), and the plan's
  actions are applied in their order (``Plan.actions``): idle clocks, fails (a failed boot
  feeds the breaker: ``FAILED_BOOTS``), destroys, drains, creates;
- a poll: jobs are admitted in the store's order (``admission_key``) by ``admit`` (head-of-line
  blocking, the table's concurrency), never one at or past its queue deadline (``claimable``);
- every machine move goes through the lifecycle table (``next_state``).

What this class does itself is bookkeeping (counting, ordering) that the store does in SQL.
``tests/simulate/test_simulate_divergence.py`` runs it in lockstep with the real controller on a
real store and fails on the first decision where the two differ.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from sp00ky_infra.policy.breaker import Breaker
from sp00ky_infra.policy.cost import Billing
from sp00ky_infra.policy.jobs import Queued, admission_key, admit, claimable, queue_deadline
from sp00ky_infra.policy.jobs import queue_expired as expired
from sp00ky_infra.policy.machines import FAILED_BOOTS, IdleClock, MachineState, Reason, next_state
from sp00ky_infra.policy.placement import rank_of
from sp00ky_infra.policy.plan import (
    Create,
    Destroy,
    Drain,
    Fail,
    MachineView,
    Plan,
    PoolSettings,
    plan_pool,
    pool_view,
)
from sp00ky_infra.policy.sizing import Shape, queue_cap

REVISION = "simulated"  # one revision: the simulator never deploys


@dataclass(slots=True)
class Job:
    """A job row, as far as the pool's decisions read it."""

    id: str
    created_at: float
    run_after: float
    priority: int = 0
    slots: int = 1
    status: str = "pending"  # pending | processing | done | timed_out
    machine: str | None = None
    deadline: float | None = None  # the queue deadline

    def key(self) -> tuple[int, float, str]:
        return admission_key(self.priority, self.created_at, self.id)


@dataclass(slots=True)
class Machine:
    """A machine row."""

    name: str
    created_at: float
    state: MachineState = "booting"
    busy_slots: int = 0
    idle_since: float | None = None
    drained: bool = False
    seen: MachineView | None = None  # what the last view showed; None once it changed

    def viewed(self) -> MachineView:
        """The row as the tick observes it, rebuilt only after a change (ticks outnumber
        changes by far: a day is 43,200 ticks)."""
        if self.seen is None:
            self.seen = MachineView(
                name=self.name,
                state=self.state,
                created_at=self.created_at,
                revision=REVISION,
                busy_slots=self.busy_slots,
                idle_since=self.idle_since,
                drained=self.drained,
            )
        return self.seen


@dataclass(frozen=True, slots=True)
class TickResult:
    plan: Plan
    created: tuple[str, ...] = ()  # machines asked for, in order
    timed_out: tuple[str, ...] = ()  # jobs the sweep failed (queue timeout)


@dataclass
class PolicyPool:
    """One pool's controller state, decided by ``policy``."""

    name: str
    settings: PoolSettings
    queue_timeout: float | None
    max_queued: int | None = None
    concurrency: int | None = None
    breaker_first_pause: float = 60.0
    breaker_max_pause: float = 900.0
    names: Callable[[], str] | None = None  # machine names (the divergence test passes the
    # controller's own, so that ties broken by name break the same way)
    billing: Billing | None = None  # how the machines are billed (None: they cost nothing)
    machines: dict[str, Machine] = field(default_factory=dict)
    jobs: dict[str, Job] = field(default_factory=dict)
    breaker: Breaker = field(default_factory=Breaker)
    _queue: list[tuple[tuple[int, float, str], Job]] = field(default_factory=list)
    _delayed: list[tuple[float, int, Job]] = field(default_factory=list)
    _deadlines: list[tuple[float, int, Job]] = field(default_factory=list)
    _seq: Iterator[int] = field(default_factory=itertools.count)
    _machine_numbers: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    pending: int = 0  # due jobs waiting (the store's pending rows with run_after <= now)
    waiting: int = 0  # every pending row, due or not (what maxQueued counts)
    in_flight: int = 0
    _multi_slot_pending: int = 0
    _order: list[Machine] | None = None  # in the store's order, until one comes or goes
    _views: list[MachineView] = field(default_factory=list)
    _index: dict[str, int] = field(default_factory=dict)
    _dirty: list[Machine] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.shape = Shape.of(self.settings)
        self._cap = queue_cap(self.shape)

    # --- jobs --------------------------------------------------------------------------------

    def enqueue(
        self, job_id: str, now: float, delay: float = 0.0, priority: int = 0, slots: int = 1
    ) -> str | None:
        """Write a pending row; None when the pool's queue is full (maxQueued refuses it)."""
        if self.max_queued is not None and self.waiting + 1 > self.max_queued:
            return None
        job = Job(job_id, now, now + delay, priority, slots)
        self.jobs[job_id] = job
        self.waiting += 1
        heapq.heappush(self._delayed, (job.run_after, next(self._seq), job))
        return job_id

    def _promote(self, now: float) -> None:
        """Jobs whose delay or backoff is over join the queue (run_after <= now)."""
        delayed = self._delayed
        while delayed and delayed[0][0] <= now:
            _, seq, job = heapq.heappop(delayed)
            if job.status != "pending":
                continue
            heapq.heappush(self._queue, (job.key(), job))
            self.pending += 1
            if job.slots > 1:
                self._multi_slot_pending += 1
            job.deadline = queue_deadline(job.run_after, self.queue_timeout)
            if job.deadline is not None:
                heapq.heappush(self._deadlines, (job.deadline, seq, job))

    def _leave_queue(self, job: Job, status: str) -> None:
        job.status = status
        self.pending -= 1
        self.waiting -= 1
        if job.slots > 1:
            self._multi_slot_pending -= 1

    def queued_slots(self, now: float) -> int:
        """The slots the first ``queue_cap`` due jobs need (the store's ``queued_slots``)."""
        self._promote(now)
        if not self._multi_slot_pending:
            return min(self.pending, self._cap)
        live = sorted(entry for entry in self._queue if entry[1].status == "pending")
        return sum(job.slots for _, job in live[: self._cap])

    def claim(self, machine: str, free_slots: int, now: float) -> list[str]:
        """An agent's poll offers ``free_slots``: the jobs it starts (the store's ``claim``)."""
        found = self.machines.get(machine)
        if found is None or found.state != "ready" or free_slots < 1:
            return []
        free = min(free_slots, self.settings.slots - found.busy_slots)
        if free < 1:
            return []
        self._promote(now)
        taken: list[Job] = []
        skipped: list[Job] = []  # at or past their queue deadline: the sweep fails them
        queue = self._queue
        while queue and len(taken) < free:  # the store reads at most ``free`` rows
            job = heapq.heappop(queue)[1]
            if job.status != "pending":
                continue
            (taken if claimable(job.deadline, now) else skipped).append(job)
        chosen = set(
            admit(
                (Queued(job.id, job.slots) for job in taken), free, self.in_flight, self.concurrency
            )
        )
        started: list[str] = []
        for job in taken:
            if job.id in chosen:
                self._leave_queue(job, "processing")
                job.machine = machine
                found.busy_slots += job.slots
                self._changed(found)
                self.in_flight += 1
                started.append(job.id)
            else:
                skipped.append(job)
        for job in skipped:
            heapq.heappush(queue, (job.key(), job))
        if started and found.idle_since is not None:
            found.idle_since = None  # the executor's ``claimed``: the idle clock stops
        return started

    def order(self, offering: dict[str, int]) -> list[str]:
        """The machines offering free slots (name: free slots) in the order they are offered
        work: packed (``policy.placement``), or as given (the order their polls began to
        wait) when the pool does not pack."""
        if not self.settings.pack_jobs or len(offering) < 2:
            return list(offering)
        machines = self.machines

        def rank(name: str) -> tuple[int, int, float, str]:
            machine = machines[name]
            return rank_of(name, machine.busy_slots, machine.idle_since)

        return sorted((n for n, free in offering.items() if free > 0 and n in machines), key=rank)

    def finished(self, job_id: str, now: float) -> None:
        """The agent reported the job's answer: its slots are free."""
        job = self.jobs.pop(job_id)
        job.status = "done"
        self.in_flight -= 1
        machine = self.machines.get(job.machine or "")
        if machine is not None:
            machine.busy_slots -= job.slots
            self._changed(machine)

    def _sweep(self, now: float) -> list[str]:
        """The recovery sweep's queue timeouts: due jobs past their queue deadline fail."""
        timed_out: list[str] = []
        deadlines = self._deadlines
        while deadlines and expired(deadlines[0][0], now):
            _, _, job = heapq.heappop(deadlines)
            if job.status == "pending":
                self._leave_queue(job, "timed_out")
                self.jobs.pop(job.id, None)
                timed_out.append(job.id)
        return timed_out

    # --- machines ----------------------------------------------------------------------------

    def _move(self, machine: Machine, reason: Reason) -> bool:
        target = next_state(machine.state, reason)
        if target is None:
            return False
        machine.state = target
        self._changed(machine)
        return True

    def _failed_boot(self, now: float) -> None:
        self.breaker = self.breaker.failed(now, self.breaker_first_pause, self.breaker_max_pause)

    def booted(self, name: str, ok: bool, now: float) -> None:
        """Its agent says the backend is ready (or never became ready: a failed boot)."""
        machine = self.machines.get(name)
        if machine is None:
            return
        if ok:
            if self._move(machine, Reason.READY):
                # The store starts a machine's idle clock when it becomes ready (the READY
                # move's columns, store/machines.py): the divergence test found this one.
                machine.idle_since = now
                self.breaker = self.breaker.succeeded()
        elif self._move(machine, Reason.BOOT_FAILED):
            self._failed_boot(now)

    def drained(self, name: str, now: float) -> None:
        """Its agent finished its jobs after a drain and left."""
        machine = self.machines.get(name)
        if machine is not None and machine.state == "draining":
            machine.drained = True
            self._changed(machine)

    def draining(self) -> list[str]:
        return [m.name for m in self.machines.values() if m.state == "draining"]

    def ready(self) -> list[str]:
        return [m.name for m in self.machines.values() if m.state == "ready"]

    def _new_name(self) -> str:
        if self.names is not None:
            return self.names()
        return f"{self.name}-{next(self._machine_numbers)}"

    # --- the tick ----------------------------------------------------------------------------

    def _changed(self, machine: Machine) -> None:
        machine.seen = None
        self._dirty.append(machine)

    def view(self, now: float) -> list[MachineView]:
        """The pool's machines as the store lists them (oldest first, then by name); only the
        rows that changed since the last tick are looked at again."""
        if self._order is None:
            self._order = sorted(self.machines.values(), key=lambda m: (m.created_at, m.name))
            self._views = [m.viewed() for m in self._order]
            self._index = {m.name: i for i, m in enumerate(self._order)}
        else:
            for machine in self._dirty:
                at = self._index.get(machine.name)
                if at is not None:
                    self._views[at] = machine.viewed()
        self._dirty.clear()
        return list(self._views)

    def tick(self, now: float) -> TickResult:
        """Sweep, observe, plan and apply, as ``controller.reconcile.tick`` does."""
        self._promote(now)
        timed_out = self._sweep(now)
        view = pool_view(
            self.name,
            self.settings,
            REVISION,
            self.view(now),
            self.queued_slots(now),
            self.breaker,
            billing=self.billing,
        )
        plan = plan_pool(view, now)
        created: list[str] = []
        for action in plan.actions():
            if isinstance(action, IdleClock):
                machine = self.machines[action.machine]
                machine.idle_since = action.since
                self._changed(machine)
            elif isinstance(action, Fail):
                machine = self.machines[action.machine]
                if self._move(machine, action.reason) and action.reason in FAILED_BOOTS:
                    self._failed_boot(now)
                self._destroy(machine)
            elif isinstance(action, Destroy):
                self._destroy(self.machines[action.machine])
            elif isinstance(action, Drain):
                self._move(self.machines[action.machine], action.reason)
            elif isinstance(action, Create):
                if not self.breaker.allows(now):
                    continue  # this plan's own failed boots opened the breaker (as executor.py)
                for _ in range(action.count):
                    name = self._new_name()
                    self.machines[name] = Machine(name, now)  # requested, then provisioned
                    self._order = None
                    created.append(name)
        return TickResult(plan, tuple(created), tuple(timed_out))

    def _destroy(self, machine: Machine) -> None:
        if machine.state in ("draining", "failed"):
            machine.state = "destroyed"
            del self.machines[machine.name]
            self._order = None
