"""The leader's step that cancels waiting jobs no pool will ever take: a backend removed from
sp00ky.yml, moved to another pool (or none), or reading another outbox table (the Resource
pools docs: "A changed job definition, disabled job, or removed job cancels its waiting
entries when the dispatcher observes it"). Each such job fails with ``cancelled`` and the
reason, instead of waiting for its queue timeout; its row and payload stay, so `jobs retry`
can run it again once the configuration takes it. Running jobs are left to finish.

It runs at the leader's first tick (a new leader may hold a new configuration) and then every
``orphans_every`` seconds (five minutes), which also catches the jobs a client with an older
configuration still queues.
"""

from __future__ import annotations

import logging

from sp00ky_infra.config import Config
from sp00ky_infra.controller.core import Controller
from sp00ky_infra.policy.jobs import Route, orphaned
from sp00ky_infra.store.dialect import DEFAULT_BATCH
from sp00ky_infra.store.model import CANCELLED

log = logging.getLogger("sp00ky.controller")


def routes(config: Config) -> dict[str, Route]:
    """Where each declared backend's jobs wait now."""
    return {
        name: Route(backend.method.table if backend.method else None, backend.pool)
        for name, backend in config.backends.items()
    }


def cancel_orphaned(controller: Controller, now: float, batch: int = DEFAULT_BATCH) -> int:
    """Cancel the waiting jobs of every group no pool takes; how many were cancelled."""
    jobs = controller.store.jobs
    total = 0
    for (backend, table, pool), reason in orphaned(
        jobs.waiting_routes(), routes(controller.config)
    ).items():
        count = 0
        while cancelled := jobs.cancel_waiting(backend, table, pool, reason, now, batch):
            count += len(cancelled)
            for _ in cancelled:
                controller.measures.job_finished(pool, "failed", CANCELLED)
        if count:
            log.warning(
                "event=jobs_cancelled backend=%s pool=%s table=%s count=%d reason=%r",
                backend, pool, table, count, reason,
            )  # fmt: skip
        total += count
    return total


def maybe_cancel_orphaned(controller: Controller, now: float) -> int:
    return cancel_orphaned(controller, now) if controller.orphans.due(now) else 0
