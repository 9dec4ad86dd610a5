"""The job store: outbox rows with the full job lifecycle, on SQLite or PostgreSQL.

    store = open_store()    # $SPKY_STORE, default sqlite:///.sp00ky/state.db next to sp00ky.yml
    job = store.enqueue(NewJob(...), now)     # pending
    [job] = store.claim(table, 1, owner, now, lease=90)      # processing, with an attempt id
    store.complete(job.id, job.attempt, result, now)          # success

The outbox is the queue: nothing is queued in memory, and a restart loses nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

from sp00ky_infra.config.project import default_store_url
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
from sp00ky_infra.store.retention import Counter, PruneReport
from sp00ky_infra.store.sql import SqlStore
from sp00ky_infra.store.sweep import SweepReport

DEFAULT_STORE_URL = "sqlite:///.sp00ky/state.db"  # beside ./sp00ky.yml; see store_url

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


def store_url(explicit: str | None = None, config_file: str | Path | None = None) -> str:
    """The store: ``--store``, else ``$SPKY_STORE``, else the embedded SQLite file in the
    project's state directory, next to its sp00ky.yml (``config_file``, else $SPKY_CONFIG,
    else ./sp00ky.yml) whatever the working directory."""
    return explicit or os.environ.get("SPKY_STORE") or default_store_url(config_file)


def open_store(url: str | None = None, migrate: bool = True) -> SqlStore:
    """Open the store at ``url`` and apply pending migrations.

    ``sqlite:///relative/path``, ``sqlite:////absolute/path``, ``postgresql://user@host/db``.
    """
    url = store_url(url)
    store: SqlStore
    if url.startswith("sqlite:///"):
        from sp00ky_infra.store.sqlite import SqliteStore

        store = SqliteStore(url.removeprefix("sqlite:///"))
    elif url.startswith(("postgresql://", "postgres://")):
        from sp00ky_infra.store.postgres import PostgresStore

        store = PostgresStore(url)
    else:
        raise StoreUnavailable(
            f"store URL {url!r} is not one this knows; use sqlite:///path/to/state.db "
            "or postgresql://user:password@host/database (SPKY_STORE or --store)"
        )
    if migrate:
        try:
            store.migrate()
        except BaseException:
            store.close()
            raise
    return store
