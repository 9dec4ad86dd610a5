"""The admin operations on pools: views, pause, resume, a breaker's reset, drain, cancel
waiting work, start."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from sp00ky_infra.client import Client, either
from sp00ky_infra.controller.agents import served_agent
from sp00ky_infra.controller.core import Controller
from sp00ky_infra.controller.costs import pool_cost
from sp00ky_infra.controller.errors import NotLeader, Refusal
from sp00ky_infra.controller.leadership import leader_url
from sp00ky_infra.controller.provisioners import serving
from sp00ky_infra.controller.provisioners.by_pool import runs_on
from sp00ky_infra.controller.reconcile import shape_of
from sp00ky_infra.policy.breaker import Breaker
from sp00ky_infra.policy.machines import LIVE_STATES, Reason
from sp00ky_infra.policy.sizing import capacity, desired_machines, queue_cap
from sp00ky_infra.store import STATUSES, Job
from sp00ky_infra.store.machines import MachineNotFound
from sp00ky_infra.store.policies import (
    TablePolicy,
    declared_policies,
    policy_json,
    policy_rows,
)
from sp00ky_infra.store.retention import counters_json, since_time


class NotFound(Refusal):
    """No such pool, machine or waiting job (404 on the admin API: controller/errors.py)."""


def _pool(controller: Controller, name: str) -> None:
    if name not in controller.pools:
        known = ", ".join(sorted(controller.pools)) or "none"
        raise NotFound(f"no pool {name!r} (pools: {known})")


def require_leader(controller: Controller) -> None:
    """Admin writes act on the leader only: a standby refuses them (503), naming the leader's
    admin URL when the state file knows it, so a write never says done while nothing acts."""
    if controller.leader:
        return
    url = leader_url(controller.settings.state_dir, controller.settings.controller_id)
    where = f"the leader at {url}" if url else "the controller that leads this store"
    raise NotLeader(
        f"this controller is a standby (another one leads this store); send admin writes to "
        f"{where} (SPKY_ADMIN_URL)"
    )


def pool_view(controller: Controller, name: str, machines: bool = True) -> dict[str, Any]:
    """One pool as the admin API and `pools get` show it."""
    _pool(controller, name)
    now = controller.clock()
    pool = controller.declared.pools[name]  # as the file says; a capacity change widens it
    table = controller.table_of(name)
    store = controller.store
    live = store.machines.live(name)
    busy = store.busy_slots(table)
    counts = store.counts(table=table)
    shape = shape_of(controller, name)
    busy_slots = sum(busy.values())
    queued = store.queued(table, now, 10**9)
    queued_slots = store.queued_slots(table, now, queue_cap(shape))  # what the tick sizes with
    state = controller.pool_states.get(name)
    view: dict[str, Any] = {
        "name": name,
        "backend": controller.backends[name].name,
        **provider_of(controller, name),
        "min": pool.min,
        "max": pool.max,
        "autoscale": pool.autoscale,
        "buffer": pool.buffer,
        "slots": pool.slots,
        "paused": state.paused,
        "capacity_change": _capacity_change(controller, name),
        "capacity": capacity(shape, busy_slots, queued_slots),
        "desired": desired_machines(shape, busy_slots, queued_slots),
        "machines": dict(Counter(m.state for m in live if m.state in LIVE_STATES)),
        "busy_machines": sum(1 for m in live if busy.get(m.name)),
        "queue": {"queued": queued, "pending": counts["pending"], "running": counts["processing"]},
        "breaker": breaker_json(state.breaker, now),
        "incidents": [i.as_json() for i in store.pools.incidents(name) if i.closed_at is None],
        "pool_machine_hours": round(store.machines.machine_seconds(name, now) / 3600, 4),
        "cost": cost_view(controller, name, now, counts),
    }
    if machines:
        served = served_agent()  # agent_current: False for a machine on an old agent
        view["machine_list"] = [
            {
                **m.as_json(),
                "busy_slots": busy.get(m.name, 0),
                "agent_current": None if None in (m.agent, served) else m.agent == served,
            }
            for m in live
        ]
        view["waiting"] = waiting_entries(controller, name, now)
        view["recent"] = recent_entries(controller, name)
    return view


def breaker_json(breaker: Breaker, now: float) -> dict[str, Any]:
    return {
        "open": breaker.is_open(now),
        "failures": breaker.failures,
        "open_until": breaker.open_until,
    }


def provider_of(controller: Controller, name: str) -> dict[str, str]:
    """What the pool's machines run on as served (``provider``: hetzner, docker or local),
    what makes them (``provisioner``: pulumi, docker or local) and the provider sp00ky.yml
    declares (``declared_provider``), which SPKY_POOL_PROVIDER or ``dev`` may override."""
    provisioner = serving(controller.provisioner, name)
    return {
        "provider": runs_on(provisioner, controller.settings.stack_provider),
        "provisioner": provisioner.name,
        "declared_provider": controller.pools[name].provider,
    }


def _capacity_change(controller: Controller, name: str) -> dict[str, Any] | None:
    """A lowered capacity that still drains the queue of the higher one, or None."""
    kept = controller.capacities.get(name)
    return kept.to_json() if kept is not None and kept.draining_from is not None else None


WAITING_SHOWN = 50  # the head of the queue; `queue.queued` counts them all
RECENT_SHOWN = 10


def waiting_entries(controller: Controller, name: str, now: float) -> list[dict[str, Any]]:
    """The pool's waiting entries in admission order (the Resource pools docs' pool view: "capacity,
    priorities, deadlines, and cancellation controls"): due jobs first, in the order the claim
    takes them, then delayed ones by due time. ``key`` is what cancels one."""
    store = controller.store
    table = controller.table_of(name)
    due = store.queue(table, now, WAITING_SHOWN)
    room = WAITING_SHOWN - len(due)  # the due ones first; the delayed, soonest due, after
    delayed = store.delayed(table, now, room) if room > 0 else []
    return [
        {
            "key": job.id,
            "job": job.id,
            "priority": job.priority,
            "slots": job.slots,
            "queued_at": job.created_at,
            "due_at": job.run_after,
            "queue_deadline": job.queue_deadline,
            "retries": job.retries,
            "cancel": f"POST /pools/{name}/queue/{job.id}/cancel",
        }
        for job in [*due, *delayed]
    ]


def recent_entries(controller: Controller, name: str) -> list[dict[str, Any]]:
    """The pool's most recent terminal entries, the last finished first, with the error code
    a failed one ended with."""
    table = controller.table_of(name)
    ended = [
        job
        for status in ("success", "failed")
        for job in controller.store.list_jobs(status=status, table=table, limit=RECENT_SHOWN)
    ]
    ended.sort(key=lambda job: (job.finished_at or 0.0, job.id), reverse=True)
    return [
        {
            "key": job.id,
            "status": job.status,
            "priority": job.priority,
            "slots": job.slots,
            "finished_at": job.finished_at,
            "code": job.errors[-1].get("code") if job.status == "failed" and job.errors else None,
        }
        for job in ended[:RECENT_SHOWN]
    ]


def cost_view(
    controller: Controller, name: str, now: float, counts: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """Euros spent, idle and per job, with the price they were computed at (``counts``: the
    pool's jobs by status, if read already); unknown euros when the price is."""
    table = controller.table_of(name)
    return pool_cost(controller.store, controller.config, name, table, now, counts)


def pools_view(controller: Controller) -> list[dict[str, Any]]:
    return [pool_view(controller, name, machines=False) for name in controller.pools]


def set_paused(controller: Controller, name: str, paused: bool) -> dict[str, Any]:
    """Pause: the pool creates and binds nothing new (running jobs finish). Resume undoes it."""
    _pool(controller, name)
    require_leader(controller)
    controller.pool_states.set_paused(name, paused, controller.clock())
    controller.event(name, "paused" if paused else "resumed", "by the admin API")
    if not paused:
        controller.wake.pool(name)
    return pool_view(controller, name, machines=False)


def reset_breaker(controller: Controller, name: str) -> dict[str, Any]:
    """Close the pool's breaker by hand (the backend fixed): new machines may be created at
    once. The pool's view, with what the breaker was (``breaker_before``)."""
    _pool(controller, name)
    require_leader(controller)
    now = controller.clock()
    before = controller.executor.close_breaker(name, now, "reset by the admin API")
    controller.wake.pool(name)
    return {
        **pool_view(controller, name, machines=False),
        "breaker_before": breaker_json(before, now),
    }


def drain_machine(controller: Controller, machine: str) -> dict[str, Any]:
    require_leader(controller)
    try:
        found = controller.store.machines.get(machine)
    except MachineNotFound as exc:
        raise NotFound(str(exc)) from exc
    if not controller.executor.drain(found.pool, machine, Reason.MANUAL, controller.clock()):
        raise Refusal(f"machine {machine} is {found.state}; only a ready machine can be drained")
    return controller.store.machines.get(machine).as_json()


def cancel_queued(controller: Controller, name: str, key: str) -> dict[str, Any]:
    """Cancel a job that waits in the pool's queue (the Resource pools docs' cancel)."""
    _pool(controller, name)
    require_leader(controller)
    job = controller.store.get(key)
    if job.pool != name:
        raise NotFound(f"job {key} is not in pool {name}'s queue")
    if job.status != "pending":
        raise Refusal(f"job {key} is {job.status}, not waiting; use `jobs kill` to stop it")
    return controller.store.kill(key, controller.clock()).as_json()


def start_job(controller: Controller, name: str, body: dict[str, Any]) -> Job:
    """A manual start: a new job on the pool's backend, validated like `run`; every option
    reaches the row (``queuePriority`` / ``poolSlots`` are the docs' names for ``priority`` /
    ``slots``)."""
    _pool(controller, name)
    require_leader(controller)
    client = Client(controller.store, controller.config)
    priority = either(
        ("priority", "queuePriority"), body.get("priority"), body.get("queuePriority"), default=0
    )
    slots = either(("slots", "poolSlots"), body.get("slots"), body.get("poolSlots"), default=1)
    options = {
        key: body[key]
        for key in ("max_retries", "retry_strategy", "timeout", "delay", "assigned_to")
        if body.get(key) is not None
    }
    if body.get("queueTimeout") is not None:  # the docs' name; the job's wins over the pool's
        options["queue_timeout"] = body["queueTimeout"]
    job = client.run(
        controller.backends[name].name,
        body["path"],
        body.get("payload"),
        priority=priority,
        slots=slots,
        **options,
    )
    controller.wake.pool(name)
    return job


def stats_view(controller: Controller, since: str | None, table: str | None) -> dict[str, Any]:
    """The hourly counters retention folds rows into, per table and outcome (GET /stats)."""
    try:
        start = since_time(since, controller.clock())
    except ValueError as exc:
        raise Refusal(str(exc)) from exc
    return counters_json(controller.store.counters(table=table, since=start), start)


def job_policies(controller: Controller) -> list[dict[str, Any]]:
    """Each pool backend's outbox table's job policy as the store keeps it (the file's where
    no controller wrote it yet)."""
    return policy_rows(controller.store.policies.read(), declared_policies(controller.config))


def retune(controller: Controller, table: str, changes: dict[str, Any]) -> dict[str, Any]:
    """Change a table's job policy live; the next tick admits by it."""
    if table not in declared_policies(controller.config):
        raise NotFound(f"no outbox table {table!r} of a pool backend in sp00ky.yml")
    kept = controller.store.policies.retune(table, changes, controller.clock(), "admin API")
    controller.read_policies()  # this controller's claims at once; the others' next tick
    return policy_json(table, kept, TablePolicy())


def jobs_view(
    controller: Controller,
    status: str | None,
    limit: int,
    table: str | None = None,
    pool: str | None = None,
) -> list[dict[str, Any]]:
    """Jobs, newest first (`jobs list --cloud`)."""
    if status is not None and status not in STATUSES:
        raise NotFound(f"no status {status!r} (statuses: {', '.join(STATUSES)})")
    found = controller.store.list_jobs(status=status, limit=limit, table=table, pool=pool)
    return [job.as_json() for job in found]


def kill_job(controller: Controller, key: str) -> dict[str, Any]:
    """`jobs kill --cloud`: a waiting job fails at once, a running one is stopped."""
    return controller.store.kill(key, controller.clock()).as_json()  # the store tells the agent


def retry_job(controller: Controller, key: str) -> dict[str, Any]:
    """`jobs retry --cloud`: a finished job runs again as a new attempt."""
    return controller.store.retry(key, controller.clock()).as_json()
