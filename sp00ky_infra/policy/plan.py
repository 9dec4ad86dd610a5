"""The reconcile plan of one pool: observed machines and queue in, actions out. Pure.

Every action carries its reason (the lifecycle's, ``policy.machines``). The controller's
executor applies them through its ports (store, provisioner); nothing here does I/O or reads
the clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from sp00ky_infra.policy.breaker import Breaker
from sp00ky_infra.policy.machines import IdleClock, MachineState, Reason, idle_since
from sp00ky_infra.policy.sizing import Shape, SizingSettings, desired_machines

__all__ = [
    "Create",
    "Destroy",
    "Drain",
    "Fail",
    "MachineView",
    "Plan",
    "PoolView",
    "Reason",  # the lifecycle's (policy.machines), which every action carries
    "fences",
    "plan_pool",
    "pool_view",
    "silent",
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
    queued: int  # slots the eligible pending jobs need (counted up to the sizing cap)
    idle_timeout: float
    max_lifetime: float
    boot_timeout: float
    silence: float  # a ready machine that has not polled for this long has stopped answering
    breaker: Breaker = field(default_factory=Breaker)
    paused: bool = False


def pool_view(
    name: str,
    settings: PoolSettings,
    revision: str,
    machines: Sequence[MachineView],
    queued: int,
    breaker: Breaker,
    paused: bool = False,
) -> PoolView:
    """One pool as observed, from its settings: the controller's ``observe`` and the simulator
    both build the plan's input here, so neither can read a setting differently."""
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


def plan_pool(pool: PoolView, now: float) -> Plan:
    """Decide what happens to one pool at ``now``."""
    fail: list[Fail] = []
    drain: list[Drain] = []
    destroy: list[Destroy] = []
    notes: list[str] = []
    serving: list[MachineView] = []  # machines that count towards the pool's size
    machines = _with_idle_clocks(pool.machines, now)
    idle_clocks = tuple(
        IdleClock(after.name, after.idle_since)
        for before, after in zip(pool.machines, machines, strict=True)
        if after.idle_since != before.idle_since
    )
    for machine in machines:
        if machine.state in ("requested", "booting"):
            if now - machine.created_at > pool.boot_timeout:
                fail.append(Fail(machine.name, Reason.BOOT_TIMEOUT))
            else:
                serving.append(machine)
        elif machine.state in ("ready", "draining"):
            if silent(machine, pool.silence, now):
                fail.append(Fail(machine.name, Reason.SILENT))
            elif machine.state == "draining":
                if machine.drained:
                    destroy.append(Destroy(machine.name))
            elif machine.revision != pool.revision:
                drain.append(Drain(machine.name, Reason.REVISION_CHANGED))
            elif now - machine.created_at >= pool.max_lifetime:
                drain.append(Drain(machine.name, Reason.MAX_LIFETIME))
            else:
                serving.append(machine)
        elif machine.state == "failed":  # e.g. its agent said the backend never became ready
            destroy.append(Destroy(machine.name, Reason.DESTROYED))

    busy = sum(machine.busy_slots for machine in machines if machine.state in ("ready", "draining"))
    desired = desired_machines(pool.shape, busy, pool.queued)
    current = len(serving)

    surplus = current - desired
    if surplus > 0:
        idle = sorted(
            (
                machine
                for machine in serving
                if machine.state == "ready"
                and machine.busy_slots == 0
                and machine.idle_since is not None
                and now - machine.idle_since >= pool.idle_timeout
            ),
            key=lambda machine: (machine.idle_since, machine.name),
        )
        drain.extend(Drain(machine.name, Reason.IDLE_SURPLUS) for machine in idle[:surplus])

    create = None
    missing = desired - current
    if missing > 0:
        if pool.paused:
            notes.append(f"paused: {missing} machine(s) not created")
        elif pool.breaker.is_open(now):
            notes.append(f"breaker open: {missing} machine(s) not created")
        else:
            create = Create(pool.name, missing)
    return Plan(
        pool=pool.name,
        desired=desired,
        current=current,
        busy_slots=busy,
        create=create,
        drain=tuple(drain),
        fail=tuple(fail),
        destroy=tuple(destroy),
        idle=idle_clocks,
        notes=tuple(notes),
    )


def _with_idle_clocks(machines: Sequence[MachineView], now: float) -> list[MachineView]:
    """The machines with their idle clocks kept at ``now`` (kept in the rows: restart-safe).
    Only a machine whose clock starts or stops is copied: the tick runs this for every machine
    every two seconds."""
    kept = []
    for machine in machines:
        clock = idle_since(machine.state, machine.busy_slots, machine.idle_since, now)
        kept.append(machine if clock == machine.idle_since else replace(machine, idle_since=clock))
    return kept
