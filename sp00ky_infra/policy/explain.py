"""Why a job still waits, and why a pool has the machines it has. Pure.

Both read the same ``PoolView`` and ``Plan`` the tick builds (``plan_pool``): nothing here
sizes a pool or admits a job again; it reads what the plan decided and says why, with the
numbers. Each cause is data (a stable code, a message, its figures) so that the CLI, the
admin API and the MCP server show the same thing.

Causes of a waiting job, in the order they are told:
- ``delayed``: not due before its delay or retry backoff ends;
- ``paused``: the pool binds nothing new;
- ``concurrency``: its table has ``method.concurrency`` jobs in flight;
- ``queue_position``: due jobs ahead of it, in admission order;
- ``head_of_line``: the queue's head needs more slots than any machine has free, and nothing
  overtakes it;
- ``pool_at_max``: the sizing rule wants more machines than ``max``;
- ``breaker_open``: failed boots stopped new machines until a time (with the last one's
  reason: the backend's own last words when it wrote any);
- ``machine_booting``: a machine is on its way (since a time);
- ``scaling_up``: this tick's plan creates machines;
- ``starting``: a ready machine has a free slot (a killed job's once its cancel is recorded):
  its agent's poll takes the job;
- ``no_free_slot``: every slot is busy (the catch-all when the pool has all it wants).

A pool whose ``machine.image`` is ``baked`` also says what its new machines boot and why
(``Bake``): its snapshot, or the base image while the snapshot is baked or after its bake
failed (with the step, the reason and when it is tried again).
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from sp00ky_infra.policy.plan import MachineView, Plan, PoolView, kept_paid
from sp00ky_infra.policy.sizing import capacity


@dataclass(frozen=True, slots=True)
class Cause:
    code: str
    message: str
    facts: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, **self.facts}


@dataclass(frozen=True, slots=True)
class Waiting:
    """What explain knows of one pending job and its queue (read by the controller)."""

    id: str
    run_after: float
    slots: int
    ahead: int  # due pending jobs before it in admission order
    head_id: str | None  # the queue's head (due), None when nothing is due
    head_slots: int
    in_flight: int  # the table's running jobs
    concurrency: int | None  # its method.concurrency


@dataclass(frozen=True, slots=True)
class FailedBoot:
    """The pool's last failed boot, as its machine row keeps it (read by the controller)."""

    machine: str
    at: float
    reason: str

    def as_json(self) -> dict[str, Any]:
        return {"machine": self.machine, "at": self.at, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class Bake:
    """A baked pool's snapshot as the controller's bake of it stands (read by the controller):
    ``image`` is what the pool's new machines boot now."""

    status: Literal["baking", "baked", "failed"]
    image: str
    since: float  # when the bake started, ended or failed
    snapshot: int | None = None
    step: str = ""  # the step that failed
    reason: str = ""
    retry_at: float | None = None  # when a failed bake is tried again (or at the next deploy)

    def as_json(self) -> dict[str, Any]:
        return {
            "status": self.status, "image": self.image, "since": self.since,
            "snapshot": self.snapshot, "step": self.step or None, "reason": self.reason or None,
            "retry_at": self.retry_at,
        }  # fmt: skip

    def message(self) -> str:
        if self.status == "baked":
            return f"machine.image baked: new machines boot its snapshot {self.snapshot}"
        if self.status == "baking":
            return (f"machine.image baked: its snapshot is being baked since {_at(self.since)}; "
                    f"new machines boot the base image {self.image} until it is made")  # fmt: skip
        retry = f" or at {_at(self.retry_at)}" if self.retry_at is not None else ""
        return (
            f"machine.image baked: new machines boot the base image {self.image} because its "
            f"bake failed at step {self.step or 'start'} ({self.reason}); it is tried again at "
            f"the next deploy{retry}"
        )


def free_slots(machine: MachineView, slots: int) -> int:
    return max(slots - machine.busy_slots, 0) if machine.state == "ready" else 0


def explain_job(
    job: Waiting, pool: PoolView, plan: Plan, now: float, last_failure: FailedBoot | None = None
) -> list[Cause]:
    """Why ``job`` is still pending at ``now``; the pool's view and plan are the tick's;
    ``last_failure`` is the pool's last failed boot, told with an open breaker."""
    slots = pool.shape.slots
    ready = [m for m in pool.machines if m.state == "ready"]
    most_free = max((free_slots(m, slots) for m in ready), default=0)
    causes = _job_causes(job, pool, now)
    causes += _head_of_line(job, most_free)
    causes += _pool_causes(pool, plan, now, last_failure)
    if causes:
        return causes
    if most_free >= job.slots:
        return [
            Cause(
                "starting",
                f"a ready machine has {most_free} free slot(s) (its slots less the jobs "
                "running on it): its agent's poll takes the job",
                {"most_free": most_free},
            )
        ]
    busy = sum(m.busy_slots for m in ready)
    return [
        Cause(
            "no_free_slot",
            f"every slot is busy ({busy} of {len(ready) * slots} on {len(ready)} ready "
            "machine(s)); it starts when one frees",
            {"busy_slots": busy},
        )
    ]


def _job_causes(job: Waiting, pool: PoolView, now: float) -> list[Cause]:
    """What holds the job itself: its delay, its paused pool, its table's concurrency, the
    due jobs ahead of it."""
    causes: list[Cause] = []
    if job.run_after > now:
        causes.append(
            Cause(
                "delayed",
                f"delayed until {_at(job.run_after)} ({job.run_after - now:.0f}s from now): its "
                "delay or a retry's backoff; it is not in the queue before then",
                {"until": job.run_after},
            )
        )
    if pool.paused:
        causes.append(
            Cause(
                "paused",
                f"pool {pool.name} is paused: it creates and binds nothing new "
                f"(`sp00ky-infra pools resume {pool.name}`)",
            )
        )
    if job.concurrency is not None and job.in_flight >= job.concurrency:
        causes.append(
            Cause(
                "concurrency",
                f"its table has {job.in_flight} job(s) in flight, its method.concurrency "
                f"({job.concurrency}); it starts when one ends",
                {"in_flight": job.in_flight, "concurrency": job.concurrency},
            )
        )
    if job.run_after <= now and job.ahead:
        causes.append(
            Cause(
                "queue_position",
                f"{job.ahead} due job(s) ahead of it in the queue (higher priority, then older)",
                {"ahead": job.ahead, "position": job.ahead + 1},
            )
        )
    return causes


def _head_of_line(job: Waiting, most_free: int) -> list[Cause]:
    """The queue's head needs more slots than any ready machine has free (some has some)."""
    causes: list[Cause] = []
    if job.head_id is not None and job.head_slots > most_free and most_free > 0:
        who = "it" if job.head_id == job.id else f"the head of the queue, {job.head_id},"
        causes.append(
            Cause(
                "head_of_line",
                f"{who} needs {job.head_slots} slot(s) on one machine; the most any ready "
                f"machine has free is {most_free}, and nothing behind the head overtakes it",
                {"head": job.head_id, "needs": job.head_slots, "most_free": most_free},
            )
        )
    return causes


def _pool_causes(
    pool: PoolView, plan: Plan, now: float, last_failure: FailedBoot | None
) -> list[Cause]:
    """What holds the pool's size: its max, an open breaker, machines booting, machines this
    tick creates."""
    causes: list[Cause] = []
    slots = pool.shape.slots
    needed = math.ceil(capacity(pool.shape, plan.busy_slots, pool.queued) / slots)
    top = pool.shape.max if pool.shape.autoscale else pool.shape.min
    if top is not None and needed > top and plan.desired == top:
        causes.append(
            Cause(
                "pool_at_max",
                f"pool {pool.name} is at its {'max' if pool.shape.autoscale else 'fixed size'} "
                f"({top} machine(s)); the queue would need {needed}",
                {"max": top, "needed": needed},
            )
        )
    if pool.breaker.is_open(now) and pool.breaker.open_until is not None:
        facts: dict[str, Any] = {
            "until": pool.breaker.open_until,
            "failures": pool.breaker.failures,
        }
        last = ""
        if last_failure is not None:
            facts["last_failure"] = last_failure.as_json()
            last = f"; the last, {last_failure.machine}, failed: {last_failure.reason}"
        causes.append(
            Cause(
                "breaker_open",
                f"the breaker is open until {_at(pool.breaker.open_until)} after "
                f"{pool.breaker.failures} failed boot(s) in a row: no new machine before "
                f"then{last}",
                facts,
            )
        )
    for machine in pool.machines:
        if machine.state in ("requested", "booting"):
            causes.append(
                Cause(
                    "machine_booting",
                    f"machine {machine.name} is {machine.state} since "
                    f"{_at(machine.created_at)} ({now - machine.created_at:.0f}s)",
                    {"machine": machine.name, "since": machine.created_at},
                )
            )
    if plan.create is not None:
        causes.append(
            Cause(
                "scaling_up",
                f"this tick creates {plan.create.count} machine(s) for the queue",
                {"count": plan.create.count},
            )
        )
    return causes


@dataclass(frozen=True, slots=True)
class MachineNote:
    name: str
    state: str
    busy_slots: int
    reason: str

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": self.state,
            "busy_slots": self.busy_slots,
            "reason": self.reason,
        }


def explain_pool(
    pool: PoolView, plan: Plan, now: float, last_failure: FailedBoot | None = None,
    bake: Bake | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The sizing rule with its numbers, and the plan's reason for each machine; with failed
    boots in a row (the breaker counting or open), the last one's reason (``last_failure``);
    for a baked pool, what its new machines boot and why (``bake``)."""
    shape = pool.shape
    total = capacity(shape, plan.busy_slots, pool.queued)
    needed = math.ceil(total / shape.slots)
    if shape.autoscale:
        top = shape.max if shape.max is not None else shape.min
        rule = (
            f"capacity = busy {plan.busy_slots} + queued {pool.queued} + buffer {shape.buffer} x "
            f"slots {shape.slots} = {total}; needed = ceil({total} / {shape.slots}) = {needed}; "
            f"desired = clamp({needed}, min {shape.min}, max {top}) = {plan.desired}"
        )
    else:
        rule = f"autoscale is off: desired = min = {plan.desired}"
    actions: dict[str, str] = {}
    for fail in plan.fail:
        actions[fail.machine] = f"failing it: {fail.reason.value}"
    for destroy in plan.destroy:
        actions[destroy.machine] = f"destroying it: {destroy.reason.value}"
    for drain in plan.drain:
        actions[drain.machine] = f"draining it: {drain.reason.value}"
    clocks = {clock.machine: clock.since for clock in plan.idle}  # as the tick keeps them
    machines = [
        replace(m, idle_since=clocks[m.name]) if m.name in clocks else m for m in pool.machines
    ]
    for kept in kept_paid(replace(pool, machines=machines), plan, now):
        actions[kept.name] = _paid(kept, pool, now)
    notes = [
        MachineNote(m.name, m.state, m.busy_slots, actions.get(m.name) or _why_kept(m, pool, now))
        for m in machines
    ]
    return {
        "pool": pool.name,
        "rule": rule,
        "busy_slots": plan.busy_slots,
        "queued_slots": pool.queued,
        "capacity": total,
        "needed": needed,
        "desired": plan.desired,
        "current": plan.current,
        "create": plan.create.count if plan.create else 0,
        "paused": pool.paused,
        "breaker_open_until": pool.breaker.open_until if pool.breaker.is_open(now) else None,
        "breaker_failures": pool.breaker.failures,
        "last_failed_boot": (
            last_failure.as_json() if last_failure and pool.breaker.failures else None
        ),
        "notes": [*plan.notes, *([bake.message()] if bake is not None else [])],
        "bake": bake.as_json() if bake is not None else None,
        "machines": [note.as_json() for note in notes],
    }


def _why_kept(machine: MachineView, pool: PoolView, now: float) -> str:
    if machine.state in ("requested", "booting"):
        left = pool.boot_timeout - (now - machine.created_at)
        return f"booting since {_at(machine.created_at)}; fails if not ready in {left:.0f}s"
    if machine.state == "draining":
        return "draining: finishing its jobs, then destroyed"
    if machine.busy_slots:
        return f"busy: {machine.busy_slots} slot(s) running jobs"
    if machine.idle_since is not None:
        idle = now - machine.idle_since
        if idle >= pool.idle_timeout:
            return f"idle {idle:.0f}s, but the pool needs it (desired)"
        return f"idle {idle:.0f}s; drained after idleTimeout ({pool.idle_timeout:.0f}s) if surplus"
    return "serving"


def _paid(machine: MachineView, pool: PoolView, now: float) -> str:
    """A machine kept idle for the rest of its paid hour (``policy.plan.kept_paid``)."""
    assert pool.billing is not None and machine.idle_since is not None
    until = pool.billing.paid_until(machine.created_at, now)
    shown = "%H:%M" if pool.billing.hour >= 3600 else "%H:%M:%S"
    clock = datetime.datetime.fromtimestamp(until, datetime.UTC).strftime(shown)
    return (
        f"kept idle: its hour is paid until {clock} UTC (idle {now - machine.idle_since:.0f}s; "
        "drained then if still surplus)"
    )


def _at(when: float) -> str:
    """A time as UTC ISO 8601 (pure: no local zone)."""
    return datetime.datetime.fromtimestamp(when, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
