"""The job store: outbox rows with the full job lifecycle, on SQLite or PostgreSQL.

    store = open_store()    # $SPKY_STORE, default sqlite:///.sp00ky/state.db next to sp00ky.yml
    job = store.enqueue(NewJob(...), now)     # pending
    [job] = store.claim(table, 1, owner, now, lease=90)      # processing, with an attempt id
    store.complete(job.id, job.attempt, result, now)          # success

The outbox is the queue: nothing is queued in memory, and a restart loses nothing.
"""

from __future__ import annotations

from sp00ky_infra.store.model import (
    STATUSES,
    Conflict,
    InvalidJob,
    Job,
    JobNotFound,
    JobStatus,
    NewJob,
    QueueFull,
    StaleAttempt,
    StoreError,
    StoreUnavailable,
)
from sp00ky_infra.store.opening import DEFAULT_STORE_URL, open_store, store_url
from sp00ky_infra.store.retention import Counter, PruneReport
from sp00ky_infra.store.sql import SqlStore
from sp00ky_infra.store.sweep import SweepReport

__all__ = [
    "DEFAULT_STORE_URL",
    "STATUSES",
    "Conflict",
    "Counter",
    "InvalidJob",
    "Job",
    "JobNotFound",
    "JobStatus",
    "NewJob",
    "PruneReport",
    "QueueFull",
    "SqlStore",
    "StaleAttempt",
    "StoreError",
    "StoreUnavailable",
    "SweepReport",
    "open_store",
    "store_url",
]
