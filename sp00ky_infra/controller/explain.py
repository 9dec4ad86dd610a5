"""`explain`: what the store and the controller hold, read for ``policy/explain.py``, which
reasons over the same pool view and plan the tick makes (``reconcile.observe``,
``policy.plan.plan_pool``): explain never sizes or admits anything itself."""

from __future__ import annotations

from typing import Any

from sp00ky_infra.controller.admin import NotFound, _pool, provider_of
from sp00ky_infra.controller.core import Controller
from sp00ky_infra.controller.provisioners.pulumi import PulumiProvisioner
from sp00ky_infra.controller.reconcile import observe
from sp00ky_infra.policy.explain import Bake, FailedBoot, Waiting, explain_job, explain_pool
from sp00ky_infra.policy.plan import Plan, PoolView, plan_pool


def _planned(controller: Controller, name: str, now: float) -> tuple[PoolView, Plan]:
    view = next(view for view in observe(controller, now) if view.name == name)
    return view, plan_pool(view, now)


RECENT_LOOKED_AT = 20  # machines, newest first: the last failed boot is among them


def last_failed_boot(controller: Controller, name: str) -> FailedBoot | None:
    """The pool's newest machine that failed before it was ready, with its reason (the
    backend's last output when it wrote any: see provisioners/output.py)."""
    for machine in controller.store.machines.recent(name, RECENT_LOOKED_AT):
        if machine.failed_reason and machine.ready_at is None:
            at = machine.failed_at if machine.failed_at is not None else machine.updated_at
            return FailedBoot(machine.name, at, machine.failed_reason)
    return None


def bake_state(controller: Controller, name: str) -> Bake | None:
    """Where the bake of a pool with ``machine.image: baked`` stands (None: no such bake)."""
    provisioner = controller.provisioner
    bakes = provisioner.bakes if isinstance(provisioner, PulumiProvisioner) else None
    return bakes.state(name) if bakes is not None else None


def pool(controller: Controller, name: str) -> dict[str, Any]:
    _pool(controller, name)
    now = controller.clock()
    view, plan = _planned(controller, name, now)
    last = last_failed_boot(controller, name)
    found = explain_pool(view, plan, now, last, bake_state(controller, name))
    held = controller.executor.budget_holds(name)  # the Hetzner API budget's reserve
    if held is not None:
        found["notes"].append(held)
    return {"at": now, **found, "api_budget_held": held, **provider_of(controller, name)}


def job(controller: Controller, job_id: str) -> dict[str, Any]:
    found = controller.store.get(job_id)
    now = controller.clock()
    answer: dict[str, Any] = {"job": found.id, "status": found.status, "at": now}
    if found.status != "pending":
        answer["causes"] = [_not_waiting(found.status, found.machine, found.started_at)]
        return answer
    name = found.pool
    if name is None or name not in controller.pools:
        raise NotFound(f"job {job_id} runs on no configured pool ({name or 'none'})")
    table = controller.table_of(name)
    store = controller.store
    head = store.queue(table, now, 1)
    waiting = Waiting(
        id=found.id,
        run_after=found.run_after,
        slots=found.slots,
        ahead=store.ahead_of(found, now),
        head_id=head[0].id if head else None,
        head_slots=head[0].slots if head else 0,
        in_flight=store.queue_stats(table, now).processing,
        concurrency=controller.concurrency_of(name),
    )
    view, plan = _planned(controller, name, now)
    last = last_failed_boot(controller, name) if view.breaker.is_open(now) else None
    answer["pool"] = name
    answer["causes"] = [cause.as_json() for cause in explain_job(waiting, view, plan, now, last)]
    held = controller.executor.budget_holds(name)
    if held is not None:
        answer["causes"].append({"code": "api_budget_low", "message": held})
    return answer


def _not_waiting(status: str, machine: str | None, started_at: float | None) -> dict[str, Any]:
    if status == "processing":
        return {
            "code": "running",
            "message": f"it is running on machine {machine} (since {started_at})",
            "machine": machine,
        }
    return {"code": "finished", "message": f"it is not waiting: it ended ({status})"}
