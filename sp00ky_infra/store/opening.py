"""Which store a command opens (``--store``, ``$SPKY_STORE``, else the project's SQLite file),
and opening it, migrated."""

from __future__ import annotations

import os
from pathlib import Path

from sp00ky_infra.config.project import default_store_url
from sp00ky_infra.store.model import StoreUnavailable
from sp00ky_infra.store.sql import SqlStore

DEFAULT_STORE_URL = "sqlite:///.sp00ky/state.db"  # beside ./sp00ky.yml; see store_url


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
