"""The leader's step that switches a pool to its lowered capacity once the jobs queued before
the change have left the queue (store/capacity.py says the rule); then new jobs are taken
again."""

from __future__ import annotations

import logging

from sp00ky_infra.controller.core import Controller

log = logging.getLogger("sp00ky.controller")


def settle_capacities(controller: Controller, now: float) -> list[str]:
    """Switch each pool whose old queue has drained; the pools switched. Every controller
    then reads the capacities again (``Controller.read_capacities``)."""
    switched = []
    table = controller.store.capacities
    for name, kept in controller.capacities.items():
        if kept.draining_from is None or name not in controller.pools:
            continue
        if table.old_queue_waits(kept, controller.table_of(name)):
            continue
        table.settle(name, now)
        message = f"capacity now {kept.capacity} slots (was {kept.draining_from}): new jobs taken"
        controller.event(name, "capacity", message)
        switched.append(name)
    controller.read_capacities()
    return switched
