"""One tick: observe (store, machines) -> plan (pure) -> execute (the executor).

The tick reads the clock once and passes ``now`` down; ``observe`` only reads.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

from sp00ky_infra.config.model import Pool
from sp00ky_infra.controller.core import Controller, last_code
from sp00ky_infra.controller.schedules import fire_schedules
from sp00ky_infra.hetzner import HetznerAPI
from sp00ky_infra.hetzner.heartbeat import stamp_heartbeat
from sp00ky_infra.policy.breaker import Breaker
from sp00ky_infra.policy.plan import MachineView, Plan, PoolView, fences, plan_pool, pool_view
from sp00ky_infra.policy.sizing import Shape, queue_cap
from sp00ky_infra.store import JobNotFound, SweepReport
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
    return Shape.of(controller.pools[pool])


def observe(controller: Controller, now: float) -> list[PoolView]:
    """What every configured pool looks like at ``now``, read from the store (and nothing
    written: the plan says which idle clocks to keep, the executor keeps them)."""
    by_pool: dict[str, list[Machine]] = defaultdict(list)
    for machine in controller.store.machines.live():
        by_pool[machine.pool].append(machine)
    views = []
    for name, pool in controller.pools.items():
        table = controller.table_of(name)
        busy = controller.store.busy_slots(table)
        shape = shape_of(controller, name)
        state = controller.pool_states.get(name)
        machines = [
            MachineView(
                name=machine.name,
                state=machine.state,
                created_at=machine.created_at,
                revision=machine.revision,
                busy_slots=busy.get(machine.name, 0),
                idle_since=machine.idle_since,
                last_seen_at=machine.last_seen_at,
                drained=machine.drained,
            )
            for machine in by_pool.get(name, [])
        ]
        views.append(
            pool_view(
                name,
                pool,
                controller.revisions[name],
                machines,
                controller.store.queued_slots(table, now, queue_cap(shape)),
                state.breaker,
                state.paused,
            )
        )
    return views


def tick(controller: Controller) -> TickReport:
    """Lead if possible; then sweep leases, size every pool and apply the plans."""
    if not controller.lead():
        return TickReport(leader=False)
    started = time.perf_counter()
    now = controller.clock()
    executor = controller.executor
    executor.record_outcomes(now)  # servers an asynchronous provisioner reported gone count
    fenced = fence(controller, now)
    swept = controller.store.sweep(now)
    for job_id in swept.lease_expired:
        log.info("event=lease_expired job=%s", job_id)
    count_swept(controller, swept)
    scheduled = fire_schedules(controller, now)  # before observe: the plan sees their jobs
    plans = [plan_pool(view, now) for view in observe(controller, now)]
    controller.plans = {plan.pool: plan for plan in plans}
    errors: list[str] = fenced + scheduled
    for plan in plans:
        errors += executor.apply(plan, controller.deployment, now)
    pruned = maybe_prune(controller, now)
    maybe_heartbeat(controller, now)
    for plan in plans:
        controller.wake.pool(plan.pool)  # due jobs (delays, backoffs) reach waiting polls
    controller.measures.tick.observe(time.perf_counter() - started)
    return TickReport(True, tuple(plans), swept.total, pruned, tuple(errors))


def fence(controller: Controller, now: float) -> list[str]:
    """Before the sweep: the machines silent for a whole lease (``policy.plan.fences``) are
    failed and destroyed, and the jobs of any not yet confirmed gone keep their leases. A
    dead agent's backend goes on working; its job must not start elsewhere until it ended
    (issue 17). Reads the machine rows only; the plan that follows sees them gone."""
    by_pool: dict[str, list[MachineView]] = defaultdict(list)
    for machine in controller.store.machines.live():
        if machine.state in ("ready", "draining"):
            by_pool[machine.pool].append(
                MachineView(
                    name=machine.name,
                    state=machine.state,
                    created_at=machine.created_at,
                    revision=machine.revision,
                    last_seen_at=machine.last_seen_at,
                )
            )
    executor = controller.executor
    for name, pool in controller.pools.items():
        if name in by_pool:
            view = pool_view(name, pool, controller.revisions[name], by_pool[name], 0, Breaker())
            executor.fence(name, fences(view, now), now)
    return executor.hold_fenced(now, lambda name: _lease_of(controller, name))


def _lease_of(controller: Controller, pool: str) -> float:
    found = controller.pools.get(pool)
    return (found or Pool(pool)).lease


def count_swept(controller: Controller, swept: SweepReport) -> None:
    """Jobs the sweep ended for good (out of retries, or waiting past queueTimeout) count as
    finished; the ones it put back in the queue do not."""
    for job_id in (*swept.lease_expired, *swept.timed_out, *swept.queue_timed_out):
        try:
            job = controller.store.get(job_id)
        except JobNotFound:
            continue
        if job.status == "failed" and job.pool is not None:
            controller.measures.job_finished(job.pool, "failed", last_code(job))


def maybe_prune(controller: Controller, now: float) -> int:
    if not controller.prune.due(now):
        return 0
    retention = controller.config.retention
    report = controller.store.prune(now, retention.success, retention.failed, retention.max_rows)
    return report.total


def maybe_heartbeat(controller: Controller, now: float) -> None:
    """Stamp the guardian's heartbeat cloud-side every minute, off the tick's thread: a slow
    or failing API never holds the tick up (the guardian waits 30 minutes before it acts)."""
    settings = controller.settings
    if not settings.project or not os.environ.get("HCLOUD_TOKEN"):
        return
    if not controller.heartbeat.due(now):
        return

    def stamp() -> None:
        try:
            stamp_heartbeat(HetznerAPI.from_env(), settings.project, now)
        except Exception as exc:  # logged; the next minute tries again
            log.warning("heartbeat for project %s failed: %s", settings.project, exc)

    threading.Thread(target=stamp, name="heartbeat", daemon=True).start()
