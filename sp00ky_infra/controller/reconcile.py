"""One tick: observe (store, machines) -> plan (pure) -> execute (the executor).

The tick reads the clock once and passes ``now`` down; ``observe`` only reads.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections import defaultdict
from dataclasses import dataclass, field, replace

from sp00ky_infra.config.model import Pool
from sp00ky_infra.controller.capacity import settle_capacities
from sp00ky_infra.controller.core import Controller, last_code
from sp00ky_infra.controller.orphans import maybe_cancel_orphaned
from sp00ky_infra.controller.pricing import maybe_refresh_prices
from sp00ky_infra.controller.provisioners import Routes, serving
from sp00ky_infra.controller.schedules import fire_schedules
from sp00ky_infra.controller.state import Deployment
from sp00ky_infra.hetzner import HetznerAPI
from sp00ky_infra.hetzner.heartbeat import Stamper
from sp00ky_infra.policy.breaker import Breaker
from sp00ky_infra.policy.cost import Billing
from sp00ky_infra.policy.plan import (
    MachineView,
    Plan,
    PoolView,
    Unlisted,
    busy_slots,
    fences,
    plan_pool,
    pool_view,
    queue_cap_at,
)
from sp00ky_infra.policy.sizing import Shape, queue_cap
from sp00ky_infra.store import JobNotFound, SweepReport
from sp00ky_infra.store.tick import PoolMachines, PoolTerms, TickReads

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


@dataclass(frozen=True, slots=True)
class _Observed:
    """A configured pool as the tick reads it: its terms, outbox table and shape."""

    terms: PoolTerms
    table: str
    shape: Shape


_OBSERVED: weakref.WeakKeyDictionary[Controller, tuple[Deployment, list[_Observed]]] = (
    weakref.WeakKeyDictionary()
)


def _observed(controller: Controller) -> list[_Observed]:
    """What each configured pool's machines and queue are read with (``store.tick``): made
    once a deployment, not every tick."""
    deployment = controller.deployment
    cached = _OBSERVED.get(controller)
    if cached is not None and cached[0] is deployment:
        return cached[1]
    observed = [
        _Observed(
            PoolTerms(
                pool=name,
                revision=deployment.revisions[name],
                silence=pool.lease,  # as pool_view has it
                max_lifetime=pool.max_lifetime,
                idle_timeout=pool.idle_timeout,
            ),
            deployment.table_of(name),
            Shape.of(pool),
        )
        for name, pool in deployment.pools.items()
    ]
    _OBSERVED[controller] = (deployment, observed)
    return observed


def terms_of(controller: Controller) -> list[PoolTerms]:
    """What each configured pool's machines are compared with (``store.tick``)."""
    return [each.terms for each in _observed(controller)]


def observe(controller: Controller, now: float) -> list[PoolView]:
    """What every configured pool looks like at ``now``, read from the store (and nothing
    written): every machine listed and each queue counted to ``sizing.queue_cap``, as
    ``explain`` shows them. Three statements, whatever the pools."""
    reads = TickReads(controller.store)
    observed = _observed(controller)
    machines = reads.listed([each.terms for each in observed])
    caps = [queue_cap(each.shape) for each in observed]
    return _views(controller, reads, observed, machines, _listed(machines), caps, now)


def observe_for_tick(controller: Controller, now: float) -> list[PoolView]:
    """``observe`` at a cost that follows the machines that need a decision: the machines
    nothing can happen to are counted, not listed (``policy.plan.steady``), and each queue is
    counted only as far as it can change the pool's desired count at its busy slots
    (``policy.plan.queue_cap_at``). The same plans; three to four statements."""
    reads = TickReads(controller.store)
    observed = _observed(controller)
    machines = reads.summarized([each.terms for each in observed], now)
    listed = _listed(machines)
    caps = [
        queue_cap_at(
            each.shape,
            busy_slots(listed[each.terms.pool], machines[each.terms.pool].steady_busy),
        )
        for each in observed
    ]
    return _views(controller, reads, observed, machines, listed, caps, now)


def _listed(machines: dict[str, PoolMachines]) -> dict[str, list[MachineView]]:
    return {name: [row.view() for row in found.listed] for name, found in machines.items()}


def _views(
    controller: Controller,
    reads: TickReads,
    observed: list[_Observed],
    machines: dict[str, PoolMachines],
    listed: dict[str, list[MachineView]],
    caps: list[int],
    now: float,
) -> list[PoolView]:
    """Each pool's view from its machines and its queue, counted up to its cap."""
    queued = reads.queued_slots(
        [(each.table, cap) for each, cap in zip(observed, caps, strict=True)], now
    )
    views = []
    for each, slots in zip(observed, queued, strict=True):
        name = each.terms.pool
        billing = billing_of(controller, name)
        state = controller.pool_states.get(name)
        found = machines[name]
        views.append(
            pool_view(
                name,
                controller.pools[name],
                each.terms.revision,
                listed[name],
                slots,
                state.breaker,
                state.paused,
                found.steady,
                found.steady_busy,
                found.steady_idle,
                billing,
            )
        )
    return views


def billing_of(controller: Controller, pool: str) -> Billing | None:
    """How the pool's machines are billed: by the provider that serves it, when each pool
    is on its own (a routing provisioner), else by the controller's one."""
    if not isinstance(controller.provisioner, Routes):
        return controller.settings.billing
    return controller.settings.billing_for(serving(controller.provisioner, pool).name)


def plan_of(controller: Controller, view: PoolView, now: float) -> tuple[PoolView, Plan]:
    """The pool's plan and the view it was made from; if the pool has machines to spare and
    counted idle ones instead of listing them (``policy.plan.Unlisted``), its machines are
    read again, all listed, to choose (so a surplus's idle machines are always listed)."""
    try:
        return view, plan_pool(view, now)
    except Unlisted:
        terms = [each for each in terms_of(controller) if each.pool == view.name]
        every = _listed(TickReads(controller.store).listed(terms))[view.name]
        listed = replace(view, machines=every, steady=0, steady_busy=0, steady_idle=0)
        return listed, plan_pool(listed, now)


def tick(controller: Controller) -> TickReport:
    """Lead if possible; then sweep leases, size every pool and apply the plans."""
    if not controller.lead():
        return TickReport(leader=False)
    started = time.perf_counter()
    now = controller.clock()
    executor = controller.executor
    executor.record_outcomes(now)  # servers an asynchronous provisioner reported gone count
    fenced = fence(controller, now)
    controller.read_policies()  # a live retune counts from this tick
    settle_capacities(controller, now)  # a lowered capacity whose old queue drained
    swept = controller.store.sweep(now)
    for job_id in swept.lease_expired:
        log.info("event=lease_expired job=%s", job_id)
    count_swept(controller, swept)
    if controller.store.ensure_statistics():  # a new table's first (store.postgres says why)
        log.info("event=analyzed table=jobs")
    maybe_cancel_orphaned(controller, now)  # before observe: the plan counts no orphan
    scheduled = fire_schedules(controller, now)  # before observe: the plan sees their jobs
    planned = [plan_of(controller, view, now) for view in observe_for_tick(controller, now)]
    plans = [plan for _, plan in planned]
    controller.plans = {plan.pool: plan for plan in plans}
    controller.planned_views = {view.name: view for view, _ in planned}
    errors: list[str] = fenced + scheduled
    for plan in plans:
        errors += executor.apply(plan, controller.deployment, now)
    pruned = maybe_prune(controller, now)
    maybe_heartbeat(controller, now)
    controller.server_sweep.maybe(controller.store.machines, controller.settings.project, now)
    maybe_refresh_prices(controller, now)
    for plan in plans:
        controller.wake.pool(plan.pool)  # due jobs (delays, backoffs) reach waiting polls
    controller.measures.tick.observe(time.perf_counter() - started)
    return TickReport(True, tuple(plans), swept.total, pruned, tuple(errors))


def fence(controller: Controller, now: float) -> list[str]:
    """Before the sweep: the machines silent for a whole lease (``policy.plan.fences``) are
    failed and destroyed, and the jobs of any not yet confirmed gone keep their leases. A
    dead agent's backend goes on working; its job must not start elsewhere until it ended.
    Reads the silent machines only (``store.tick``); the plan that follows sees
    them gone."""
    by_pool: dict[str, list[MachineView]] = defaultdict(list)
    for row in TickReads(controller.store).silent(terms_of(controller), now):
        by_pool[row.pool].append(row.view())
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


# each controller's heartbeat stamps, which keep the firewall's id: one request a stamp
_STAMPERS: weakref.WeakKeyDictionary[Controller, Stamper] = weakref.WeakKeyDictionary()


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
            stamper = _STAMPERS.setdefault(controller, Stamper())
            stamper.stamp(HetznerAPI.from_env(caller="heartbeat"), settings.project, now)
        except Exception as exc:  # logged; the next minute tries again
            log.warning("heartbeat for project %s failed: %s", settings.project, exc)

    threading.Thread(target=stamp, name="heartbeat", daemon=True).start()
