"""The job store in SQL, written once for SQLite and PostgreSQL: one class over the concerns.

Jobs (``jobs.py``), recovery (``sweep.py``) and retention (``retention.py``) are methods of the
store; machines and pools (``machines.py``) are tables on it. All share the dialect core
(``dialect.py``), whose connections, transactions and locking ``sqlite.py`` and
``postgres.py`` supply.
"""

from __future__ import annotations

import functools

from sp00ky_infra.store.machines import MachineTable, PoolTable
from sp00ky_infra.store.retention import Retention
from sp00ky_infra.store.sweep import Sweeper


class SqlStore(Sweeper, Retention):
    """Job rows, machine rows and pool state on a SQL database. Subclasses supply the dialect."""

    # In this process, no network between: a call returns in microseconds (or waits on this
    # process's other writers), so an event loop may make it itself rather than hand it to a
    # thread (the agents' hot routes do).
    embedded = False

    def checkpoint_in_background(self) -> None:
        """A long-running process's store: keep the database's housekeeping off its commits
        where the database leaves it to them (SQLite's checkpoints); nothing elsewhere."""

    def ensure_statistics(self) -> bool:
        """Give the planner statistics for a jobs table that has rows and was never analyzed,
        where the database would otherwise wait to (PostgreSQL's autovacuum); True when it
        analyzed. The controller's tick calls it; nothing to do elsewhere (SQLite)."""
        return False

    @functools.cached_property
    def machines(self) -> MachineTable:
        return MachineTable(self)

    @functools.cached_property
    def pools(self) -> PoolTable:
        return PoolTable(self)
