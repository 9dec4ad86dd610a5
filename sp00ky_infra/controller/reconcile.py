"""One tick: observe (store, machines, clock) -> plan (pure) -> execute (store, provisioner).

Each action is applied on its own: one that fails is logged and retried next tick, and never
stops the others.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import defaultdict
from dataclasses import dataclass, field

from sp00ky_infra.controller.core import Controller
from sp00ky_infra.controller.provisioners import MachineSpec, ProvisionerError, Refused
from sp00ky_infra.hetzner import HetznerAPI
from sp00ky_infra.hetzner.heartbeat import stamp_heartbeat
from sp00ky_infra.policy.plan import (
    Create,
    Destroy,
    Drain,
    Fail,
    MachineView,
    Plan,
    PoolView,
    Reason,
    plan_pool,
)
from sp00ky_infra.policy.sizing import Shape, queue_cap
from sp00ky_infra.shared import tokens
from sp00ky_infra.shared.names import machine_name
from sp00ky_infra.store.machines import Machine

log = logging.getLogger("sp00ky.controller")


@dataclass(frozen=True, slots=True)
class TickReport:
    leader: bool
    plans: tuple[Plan, ...] = ()
    swept: int = 0
    pruned: int = 0
    errors: tuple[str, ...] = field(default=())


def shape_of(controller: Controller, pool: str) -> Shape:
    config = controller.pools[pool]
    return Shape(config.min, config.max, config.autoscale, config.buffer, config.slots)


def observe(controller: Controller, now: float) -> list[PoolView]:
    """What every configured pool looks like at ``now``, read from the store."""
    by_pool: dict[str, list[Machine]] = defaultdict(list)
    for machine in controller.store.machines.live():
        by_pool[machine.pool].append(machine)
    views = []
    for name, pool in controller.pools.items():
        table = controller.table_of(name)
        busy = controller.store.busy_slots(table)
        shape = shape_of(controller, name)
        machines = []
        for machine in by_pool.get(name, []):
            busy_slots = busy.get(machine.name, 0)
            idle_since = machine.idle_since
            if machine.state == "ready":  # keep the idle clock in the row, restart-safe
                if busy_slots and idle_since is not None:
                    controller.store.machines.update(machine.name, idle_since=None)
                    idle_since = None
                elif not busy_slots and idle_since is None:
                    controller.store.machines.update(machine.name, idle_since=now)
                    idle_since = now
            machines.append(
                MachineView(
                    name=machine.name,
                    state=machine.state,
                    created_at=machine.created_at,
                    revision=machine.revision,
                    busy_slots=busy_slots,
                    idle_since=idle_since,
                    last_seen_at=machine.last_seen_at,
                    drained=machine.drained,
                )
            )
        views.append(
            PoolView(
                name=name,
                shape=shape,
                revision=controller.revisions[name],
                machines=machines,
                queued=controller.store.queued(table, now, queue_cap(shape)),
                idle_timeout=pool.idle_timeout,
                max_lifetime=pool.max_lifetime,
                boot_timeout=pool.boot_timeout,
                silence=pool.lease,
                breaker=controller.breakers[name],
                paused=controller.paused.get(name, False),
            )
        )
    return views


def tick(controller: Controller) -> TickReport:
    """Lead if possible; then sweep leases, size every pool and apply the plans."""
    was_leader = controller.leader
    try:
        controller.leader = controller.leader_lock.try_acquire()
    except Exception as exc:  # the store is unreachable: do nothing this tick
        controller.leader = False
        log.warning("cannot reach the store for leadership: %s", exc)
    if controller.leader != was_leader:
        kind = "leader" if controller.leader else "follower"
        controller.event("*", kind, f"{controller.settings.controller_id} is the {kind}")
    if not controller.leader:
        return TickReport(leader=False)
    now = controller.clock()
    swept = controller.store.sweep(now)
    for job_id in swept.lease_expired:
        log.info("event=lease_expired job=%s", job_id)
    apply_outcomes(controller)
    plans = [plan_pool(view, now) for view in observe(controller, now)]
    errors: list[str] = []
    for plan in plans:
        errors += execute(controller, plan)
    pruned = maybe_prune(controller, now)
    maybe_heartbeat(controller, now)
    for plan in plans:
        controller.notify_pool(plan.pool)  # due jobs (delays, backoffs) reach waiting polls
    return TickReport(True, tuple(plans), swept.total, pruned, tuple(errors))


def execute(controller: Controller, plan: Plan) -> list[str]:
    errors: list[str] = []
    actions: list[Create | Drain | Fail | Destroy] = [*plan.fail, *plan.destroy, *plan.drain]
    if plan.create is not None:
        actions.append(plan.create)
    for action in actions:
        try:
            apply(controller, plan.pool, action)
        except Exception as exc:  # isolate: one failed action never stops the others
            message = f"{type(action).__name__.lower()} in pool {plan.pool} failed: {exc}"
            log.exception(message)
            errors.append(message)
    return errors


def apply(controller: Controller, pool: str, action: Create | Drain | Fail | Destroy) -> None:
    now = controller.clock()
    machines = controller.store.machines
    if isinstance(action, Create):
        for _ in range(action.count):
            if not create_machine(controller, pool):
                break  # refused: the breaker counts it; try again next tick
    elif isinstance(action, Drain):
        if machines.move(
            action.machine, ["ready"], "draining", now, drain_reason=action.reason.value
        ):
            controller.event(pool, "drain", f"{action.machine}: {action.reason.value}")
            controller.notify_machine(action.machine)
    elif isinstance(action, Fail):
        if machines.move(
            action.machine,
            ["requested", "booting", "ready", "draining"],
            "failed",
            now,
            failed_reason=action.reason.value,
        ):
            controller.event(pool, "failed", f"{action.machine}: {action.reason.value}")
            if action.reason == Reason.BOOT_TIMEOUT:
                controller.boot_failed(pool, f"{action.machine} not ready within the boot timeout")
        destroy_machine(controller, pool, action.machine)
    else:
        destroy_machine(controller, pool, action.machine)


def create_machine(controller: Controller, pool: str) -> bool:
    """Ask the provisioner for one machine; False when it was refused (a failed boot)."""
    now = controller.clock()
    settings = controller.settings
    name = machine_name(pool)
    backend = controller.backends[pool]
    machine = controller.store.machines.add(
        name,
        pool,
        controller.provisioner.name,
        controller.revisions[pool],
        controller.pools[pool].slots,
        now,
    )
    live = len(controller.store.machines.live())
    try:
        if settings.max_machines is not None and live > settings.max_machines:
            raise Refused(
                f"the project's machine cap is {settings.max_machines} (all pools, booting and "
                "draining included)"
            )
        token = tokens.issue_join_token(settings.secret, name, now, settings.join_ttl)
        spec = MachineSpec(
            name=name,
            pool=pool,
            backend=backend.name,
            revision=machine.revision,
            controller_url=settings.agents_url,
            join_token=token,
            workdir=controller.config.root,
        )
        made = controller.provisioner.create(spec)
    except ProvisionerError as exc:
        why = f"refused: {exc}"
        machines = controller.store.machines
        machines.move(name, ["requested"], "failed", now, failed_reason=why)
        machines.move(name, ["failed"], "destroyed", now, destroyed_at=now)
        controller.event(pool, "refused", f"{name}: {exc}")
        controller.boot_failed(pool, why)
        return False
    controller.store.machines.move(
        name,
        ["requested"],
        "booting",
        controller.clock(),
        provider_id=made.provider_id,
        provider_state=made.provider_state,
    )
    controller.event(pool, "scale_up", f"{name} requested ({controller.provisioner.name})")
    return True


def destroy_machine(controller: Controller, pool: str, name: str) -> None:
    machine = controller.store.machines.get(name)
    if machine.state == "destroyed":
        return
    controller.provisioner.destroy(name, machine.provider_id, machine.provider_state)
    now = controller.clock()
    if controller.store.machines.move(
        name, ["draining", "failed"], "destroyed", now, destroyed_at=now
    ):
        lived = now - machine.created_at
        controller.event(pool, "destroyed", f"{name} destroyed after {lived:.0f}s")


def maybe_prune(controller: Controller, now: float) -> int:
    if now - controller.last_prune < controller.settings.prune_every:
        return 0
    controller.last_prune = now
    retention = controller.config.retention
    report = controller.store.prune(now, retention.success, retention.failed, retention.max_rows)
    return report.total


def maybe_heartbeat(controller: Controller, now: float) -> None:
    """Stamp the guardian's heartbeat cloud-side every minute, off the tick's thread: a slow
    or failing API never holds the tick up (the guardian waits 30 minutes before it acts)."""
    settings = controller.settings
    if not settings.project or not os.environ.get("HCLOUD_TOKEN"):
        return
    if now - controller.last_heartbeat < settings.heartbeat_every:
        return
    controller.last_heartbeat = now

    def stamp() -> None:
        try:
            stamp_heartbeat(HetznerAPI.from_env(), settings.project, now)
        except Exception as exc:  # logged; the next minute tries again
            log.warning("heartbeat for project %s failed: %s", settings.project, exc)

    threading.Thread(target=stamp, name="heartbeat", daemon=True).start()


def apply_outcomes(controller: Controller) -> None:
    """What an asynchronous provisioner (Pulumi) reports back: servers created (their ids
    go on the rows, so a restarted controller knows what exists) or refused (failed boots)."""
    outcomes = getattr(controller.provisioner, "outcomes", None)
    if outcomes is None:
        return
    machines = controller.store.machines
    for outcome in outcomes():
        try:
            machine = machines.get(outcome.machine)
        except Exception:  # a machine unknown to the store: nothing to record
            continue
        if outcome.kind == "created":
            machines.update(
                outcome.machine, provider_id=outcome.detail or None, provider_state="created"
            )
        elif outcome.kind == "destroyed":
            machines.update(outcome.machine, provider_state="destroyed")
        else:
            now = controller.clock()
            why = f"refused: {outcome.detail}"
            if machines.move(
                outcome.machine, ["requested", "booting"], "failed", now, failed_reason=why
            ):
                controller.event(machine.pool, "refused", f"{outcome.machine}: {outcome.detail}")
                controller.boot_failed(machine.pool, why)
                machines.move(outcome.machine, ["failed"], "destroyed", now, destroyed_at=now)
