"""The reconcile plan of one pool: observed machines and queue in, actions out. Pure.

Every action carries its reason (the lifecycle's, ``policy.machines``). The controller's
executor applies them through its ports (store, provisioner); nothing here does I/O or reads
the clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from sp00ky_infra.policy.breaker import Breaker
from sp00ky_infra.policy.cost import Billing
from sp00ky_infra.policy.machines import IdleClock, MachineState, Reason, idle_since
from sp00ky_infra.policy.sizing import Shape, SizingSettings, desired_machines, queue_cap

__all__ = [
    "Create",
    "Destroy",
    "Drain",
    "Fail",
    "MachineView",
    "Plan",
    "PoolView",
    "Reason",  # the lifecycle's (policy.machines), which every action carries
    "Terms",
    "Unlisted",
    "busy_slots",
    "drainable",
    "fences",
    "idle_past",
    "kept_paid",
    "plan_pool",
    "pool_view",
    "queue_cap_at",
    "silent",
    "steady",
    "summarize",
]


class PoolSettings(SizingSettings, Protocol):
    """What the plan reads of a configured pool (``config.Pool`` is one)."""

    @property
    def idle_timeout(self) -> float: ...
    @property
    def max_lifetime(self) -> float: ...
    @property
    def boot_timeout(self) -> float: ...
    @property
    def lease(self) -> float: ...
    @property
    def keep_paid_hours(self) -> bool: ...
    @property
    def pack_jobs(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class MachineView:
    """What the plan needs to know of one machine."""

    name: str
    state: MachineState
    created_at: float
    revision: str
    busy_slots: int = 0
    idle_since: float | None = None  # the row's idle clock (the plan keeps it: ``idle``)
    last_seen_at: float | None = None  # its agent's last poll
    drained: bool = False  # its agent said it finished its jobs and left


@dataclass(frozen=True, slots=True)
class PoolView:
    """One pool as observed at ``now``."""

    name: str
    shape: Shape
    revision: str
    machines: Sequence[MachineView]
    queued: int  # slots the eligible pending jobs need (counted up to a cap: queue_cap_at)
    idle_timeout: float
    max_lifetime: float
    boot_timeout: float
    silence: float  # a ready machine that has not polled for this long has stopped answering
    breaker: Breaker = field(default_factory=Breaker)
    paused: bool = False
    # How its machines are billed, if they cost anything and the pool keeps paid hours: an
    # idle surplus machine then drains only as its paid hour ends (``Billing.drain_due``).
    billing: Billing | None = None
    # Machines left out of ``machines`` because nothing happens to them at ``now`` but to be
    # counted (``steady``): each counts towards the pool's size, with its busy slots;
    # ``steady_idle`` of them are idle past the idle timeout, which the plan may drain only
    # if they are listed (``Unlisted``). The tick's read summarizes them in the store, so its
    # cost follows the machines that need a decision, not the fleet.
    steady: int = 0
    steady_busy: int = 0
    steady_idle: int = 0


def pool_view(
    name: str,
    settings: PoolSettings,
    revision: str,
    machines: Sequence[MachineView],
    queued: int,
    breaker: Breaker,
    paused: bool = False,
    steady: int = 0,
    steady_busy: int = 0,
    steady_idle: int = 0,
    billing: Billing | None = None,
) -> PoolView:
    """One pool as observed, from its settings: the controller's ``observe`` and the simulator
    both build the plan's input here, so neither can read a setting differently. ``steady``
    machines (``steady_busy`` slots busy) are summarized, not listed (``steady``).
    ``billing`` is how the provider bills its machines (None: they cost nothing); it holds
    only if the pool keeps paid hours."""
    return PoolView(
        name=name,
        shape=Shape.of(settings),
        revision=revision,
        machines=machines,
        queued=queued,
        idle_timeout=settings.idle_timeout,
        max_lifetime=settings.max_lifetime,
        boot_timeout=settings.boot_timeout,
        silence=settings.lease,  # a machine silent for a whole lease has stopped answering
        breaker=breaker,
        paused=paused,
        steady=steady,
        steady_busy=steady_busy,
        steady_idle=steady_idle,
        billing=billing if settings.keep_paid_hours else None,
    )


@dataclass(frozen=True, slots=True)
class Create:
    pool: str
    count: int
    reason: Reason = Reason.SCALE_UP


@dataclass(frozen=True, slots=True)
class Drain:
    machine: str
    reason: Reason


@dataclass(frozen=True, slots=True)
class Fail:
    machine: str
    reason: Reason


@dataclass(frozen=True, slots=True)
class Destroy:
    machine: str
    reason: Reason = Reason.DRAINED


@dataclass(frozen=True, slots=True)
class Plan:
    pool: str
    desired: int
    current: int
    busy_slots: int
    create: Create | None = None
    drain: tuple[Drain, ...] = ()
    fail: tuple[Fail, ...] = ()
    destroy: tuple[Destroy, ...] = ()
    idle: tuple[IdleClock, ...] = ()  # idle clocks to start or stop: bookkeeping, no action
    notes: tuple[str, ...] = field(default=())

    @property
    def empty(self) -> bool:
        return not (self.create or self.drain or self.fail or self.destroy)

    def actions(self) -> tuple[IdleClock | Fail | Destroy | Drain | Create, ...]:
        """The plan's actions in the order they are applied: idle clocks, fails, destroys,
        drains, then the creates (what leaves goes before what comes, so a project's machine
        cap counts the machines that are really left)."""
        create = () if self.create is None else (self.create,)
        return (*self.idle, *self.fail, *self.destroy, *self.drain, *create)


def silent(machine: MachineView, silence: float, now: float) -> bool:
    """A serving machine whose agent has not polled for a whole lease. Its leases ran out
    with its last poll: the store's lease expiry is that poll's time plus the lease, the same
    sum compared the same way, so a machine is silent no later than its jobs are overdue."""
    return (
        machine.state in ("ready", "draining")
        and machine.last_seen_at is not None
        and machine.last_seen_at + silence < now
    )


def fences(pool: PoolView, now: float) -> tuple[Fail, ...]:
    """The machines to fail and destroy before the sweep puts their jobs back in the queue:
    an attempt whose agent is silent may still be working (a dead agent's backend goes on),
    so it must be confirmed ended before the job runs again elsewhere."""
    return tuple(
        Fail(machine.name, Reason.SILENT)
        for machine in pool.machines
        if silent(machine, pool.silence, now)
    )


class Terms(Protocol):
    """What ``steady`` and ``idle_past`` compare a machine with: its pool's revision and
    timings (a ``PoolView``; the store's ``store.tick.PoolTerms``)."""

    @property
    def revision(self) -> str: ...
    @property
    def silence(self) -> float: ...
    @property
    def max_lifetime(self) -> float: ...
    @property
    def idle_timeout(self) -> float: ...


class Unlisted(ValueError):
    """The pool has more machines than it wants and counts idle ones it does not list: the
    plan cannot choose which to drain. List them (a view without ``steady_idle``)."""


def steady(machine: MachineView, pool: Terms, now: float) -> bool:
    """Whether nothing happens to ``machine`` at ``now`` but to be counted: ready, answering,
    on the pool's revision, within its lifetime, its idle clock as it should be (stopped
    while it has a job, running while it has none). ``plan_pool`` gives the same plan whether
    such a machine is listed or counted in ``PoolView.steady`` (``steady_idle`` too when it
    is ``idle_past`` the timeout). The tick's read (``store.tick``) finds in SQL every machine
    that may fail it and makes this test on those."""
    clock_kept = (machine.idle_since is None) == (machine.busy_slots > 0)
    return (
        machine.state == "ready"
        and not silent(machine, pool.silence, now)
        and machine.revision == pool.revision
        and now - machine.created_at < pool.max_lifetime
        and clock_kept
    )


def idle_past(machine: MachineView, pool: Terms, now: float) -> bool:
    """A ready machine idle for the pool's idle timeout: drained if the pool has a surplus."""
    return (
        machine.state == "ready"
        and machine.busy_slots == 0
        and machine.idle_since is not None
        and now - machine.idle_since >= pool.idle_timeout
    )


def summarize(pool: PoolView, now: float) -> PoolView:
    """``pool`` with its steady machines counted instead of listed (the same plan, or
    ``Unlisted`` when it would drain one of them)."""
    counted = [machine for machine in pool.machines if steady(machine, pool, now)]
    return replace(
        pool,
        machines=[machine for machine in pool.machines if not steady(machine, pool, now)],
        steady=pool.steady + len(counted),
        steady_busy=pool.steady_busy + sum(machine.busy_slots for machine in counted),
        steady_idle=pool.steady_idle + sum(idle_past(machine, pool, now) for machine in counted),
    )


def plan_pool(pool: PoolView, now: float) -> Plan:
    """Decide what happens to one pool at ``now``."""
    machines = _with_idle_clocks(pool.machines, now)
    idle_clocks = tuple(
        IdleClock(after.name, after.idle_since)
        for before, after in zip(pool.machines, machines, strict=True)
        if after.idle_since != before.idle_since
    )
    steps = _lifecycle(pool, machines, now)
    busy = busy_slots(machines, pool.steady_busy)
    desired = desired_machines(pool.shape, busy, pool.queued)
    current = pool.steady + len(steps.serving)
    drain = steps.drain + _idle_surplus(pool, steps.serving, current - desired, now)
    create, notes = _create(pool, desired - current, now)
    return Plan(
        pool=pool.name,
        desired=desired,
        current=current,
        busy_slots=busy,
        create=create,
        drain=tuple(drain),
        fail=tuple(steps.fail),
        destroy=tuple(steps.destroy),
        idle=idle_clocks,
        notes=tuple(notes),
    )


@dataclass(slots=True)
class _Lifecycle:
    """Each listed machine's lifecycle step: failed, drained, destroyed, or serving (it
    counts towards the pool's size)."""

    fail: list[Fail] = field(default_factory=list)
    drain: list[Drain] = field(default_factory=list)
    destroy: list[Destroy] = field(default_factory=list)
    serving: list[MachineView] = field(default_factory=list)


def _lifecycle(pool: PoolView, machines: Sequence[MachineView], now: float) -> _Lifecycle:
    out = _Lifecycle()
    for machine in machines:
        if machine.state in ("requested", "booting"):
            if now - machine.created_at > pool.boot_timeout:
                out.fail.append(Fail(machine.name, Reason.BOOT_TIMEOUT))
            else:
                out.serving.append(machine)
        elif machine.state in ("ready", "draining"):
            if silent(machine, pool.silence, now):
                out.fail.append(Fail(machine.name, Reason.SILENT))
            elif machine.state == "draining":
                if machine.drained:
                    out.destroy.append(Destroy(machine.name))
            elif machine.revision != pool.revision:
                out.drain.append(Drain(machine.name, Reason.REVISION_CHANGED))
            elif now - machine.created_at >= pool.max_lifetime:
                out.drain.append(Drain(machine.name, Reason.MAX_LIFETIME))
            else:
                out.serving.append(machine)
        elif machine.state == "failed":  # e.g. its agent said the backend never became ready
            out.destroy.append(Destroy(machine.name, Reason.DESTROYED))
    return out


def drainable(machine: MachineView, pool: PoolView, now: float) -> bool:
    """A machine the pool may drain if it has a surplus: idle past the timeout and, when its
    hours are paid for (``PoolView.billing``), in the last minutes of its paid hour (until
    then it stays ready and takes work: it costs nothing more)."""
    return idle_past(machine, pool, now) and (
        pool.billing is None or pool.billing.drain_due(machine.created_at, now)
    )


def kept_paid(pool: PoolView, plan: Plan, now: float) -> list[MachineView]:
    """The idle machines ``plan`` keeps only because their hour is paid: past the idle
    timeout, not yet in their hour's last minutes, as many as the surplus it did not drain
    (the longest idle first, as they would go)."""
    if pool.billing is None:
        return []
    idle_drains = sum(1 for drain in plan.drain if drain.reason == Reason.IDLE_SURPLUS)
    surplus = plan.current - plan.desired - idle_drains
    kept = _longest_idle_first(
        m for m in pool.machines if idle_past(m, pool, now) and not drainable(m, pool, now)
    )
    return kept[: max(surplus, 0)]


def _longest_idle_first(machines: Iterable[MachineView]) -> list[MachineView]:
    """The order idle surplus machines go in (the seeds' rule), ties by name."""
    return sorted(machines, key=lambda machine: (machine.idle_since, machine.name))


def _idle_surplus(
    pool: PoolView, serving: Sequence[MachineView], surplus: int, now: float
) -> list[Drain]:
    """The longest-idle drainable serving machines, as many as the surplus."""
    if surplus <= 0:
        return []
    if pool.steady_idle:
        raise Unlisted(
            f"pool {pool.name}: {surplus} machine(s) too many and {pool.steady_idle} idle "
            "one(s) counted, not listed: list them to choose which to drain"
        )
    idle = _longest_idle_first(machine for machine in serving if drainable(machine, pool, now))
    return [Drain(machine.name, Reason.IDLE_SURPLUS) for machine in idle[:surplus]]


def _create(pool: PoolView, missing: int, now: float) -> tuple[Create | None, list[str]]:
    """The machines to create, or the note saying why the missing ones are not."""
    if missing <= 0:
        return None, []
    if pool.paused:
        return None, [f"paused: {missing} machine(s) not created"]
    if pool.breaker.is_open(now):
        return None, [f"breaker open: {missing} machine(s) not created"]
    return Create(pool.name, missing), []


def busy_slots(machines: Sequence[MachineView], steady_busy: int = 0) -> int:
    """The pool's busy slots: its serving machines' (ready, draining), listed or counted."""
    return steady_busy + sum(
        machine.busy_slots for machine in machines if machine.state in ("ready", "draining")
    )


def queue_cap_at(shape: Shape, busy: int) -> int:
    """Queued slots beyond this cannot change the desired count of a pool with ``busy`` slots
    busy: from there it wants its top (its max; without autoscale its min, whatever the
    queue). At most ``sizing.queue_cap``; 0 when the busy slots alone reach the top, so that
    a pool at its max with a backlog reads none of it. A count of the first ``cap`` jobs'
    slots (each job needs one or more) is then as good as the whole queue's."""
    if not shape.autoscale:
        return 0
    top = shape.max if shape.max is not None else shape.min
    # desired reaches top once ceil((busy + queued + buffer x slots) / slots) >= top
    reach = (top - 1) * shape.slots + 1 - busy - shape.buffer * shape.slots
    return min(max(0, reach), queue_cap(shape))


def _with_idle_clocks(machines: Sequence[MachineView], now: float) -> list[MachineView]:
    """The machines with their idle clocks kept at ``now`` (kept in the rows: restart-safe).
    Only a machine whose clock starts or stops is copied: the tick runs this for every machine
    every two seconds."""
    kept = []
    for machine in machines:
        clock = idle_since(machine.state, machine.busy_slots, machine.idle_since, now)
        kept.append(machine if clock == machine.idle_since else replace(machine, idle_since=clock))
    return kept
