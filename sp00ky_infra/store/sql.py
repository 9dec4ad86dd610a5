"""The job store in SQL, written once for SQLite and PostgreSQL: one object over the tables.

The jobs (``jobs.py``), their recovery (``sweep.py``) and retention (``retention.py``),
machines and pools (``machines.py``) are tables on the store's dialect core
(``dialect.py``), whose connections, transactions and locking ``sqlite.py`` and
``postgres.py`` supply. The store answers the jobs' calls itself too, each passed on to its
table.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from sp00ky_infra.store.capacity import CapacityTable
from sp00ky_infra.store.dialect import Dialect
from sp00ky_infra.store.jobs import JobTable
from sp00ky_infra.store.machines import MachineTable, PoolTable
from sp00ky_infra.store.policies import PolicyTable
from sp00ky_infra.store.retention import Retention
from sp00ky_infra.store.sweep import Sweeper

P = ParamSpec("P")
R = TypeVar("R")


class PassedTo(Generic[P, R]):
    """A method of the store that is one of its tables': ``enqueue = PassedTo("jobs",
    JobTable.enqueue)`` makes ``store.enqueue`` the bound ``store.jobs.enqueue``, with its
    signature."""

    def __init__(self, table: str, method: Callable[Concatenate[Any, P], R]) -> None:
        self._table = table
        self._name = method.__name__

    @overload
    def __get__(self, store: None, owner: type) -> PassedTo[P, R]: ...
    @overload
    def __get__(self, store: object, owner: type | None = None) -> Callable[P, R]: ...
    def __get__(
        self, store: object | None, owner: type | None = None
    ) -> PassedTo[P, R] | Callable[P, R]:
        if store is None:  # read on the class
            return self
        method: Callable[P, R] = getattr(getattr(store, self._table), self._name)
        return method


class SqlStore(Dialect):
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
    def jobs(self) -> JobTable:
        return JobTable(self)

    @functools.cached_property
    def sweeper(self) -> Sweeper:
        return Sweeper(self, self.jobs)

    @functools.cached_property
    def retention(self) -> Retention:
        return Retention(self)

    @functools.cached_property
    def machines(self) -> MachineTable:
        return MachineTable(self)

    @functools.cached_property
    def pools(self) -> PoolTable:
        return PoolTable(self)

    @functools.cached_property
    def policies(self) -> PolicyTable:
        return PolicyTable(self)

    @functools.cached_property
    def capacities(self) -> CapacityTable:
        return CapacityTable(self)

    # --- the tables' calls the store answers too (callers name the store, not the table) --

    enqueue = PassedTo("jobs", JobTable.enqueue)
    enqueue_many = PassedTo("jobs", JobTable.enqueue_many)
    claim = PassedTo("jobs", JobTable.claim)
    send_claim = PassedTo("jobs", JobTable.send_claim)
    send_start = PassedTo("jobs", JobTable.send_start)
    renew = PassedTo("jobs", JobTable.renew)
    send_renew = PassedTo("jobs", JobTable.send_renew)
    complete = PassedTo("jobs", JobTable.complete)
    complete_many = PassedTo("jobs", JobTable.complete_many)
    send_complete_many = PassedTo("jobs", JobTable.send_complete_many)
    fail_attempt = PassedTo("jobs", JobTable.fail_attempt)
    confirm_cancel = PassedTo("jobs", JobTable.confirm_cancel)
    kill = PassedTo("jobs", JobTable.kill)
    retry = PassedTo("jobs", JobTable.retry)
    get = PassedTo("jobs", JobTable.get)
    list_jobs = PassedTo("jobs", JobTable.list_jobs)
    queue = PassedTo("jobs", JobTable.queue)
    delayed = PassedTo("jobs", JobTable.delayed)
    counts = PassedTo("jobs", JobTable.counts)
    queued = PassedTo("jobs", JobTable.queued)
    queued_slots = PassedTo("jobs", JobTable.queued_slots)
    queue_stats = PassedTo("jobs", JobTable.queue_stats)
    ahead_of = PassedTo("jobs", JobTable.ahead_of)
    busy_slots = PassedTo("jobs", JobTable.busy_slots)
    running_on = PassedTo("jobs", JobTable.running_on)
    send_running_on = PassedTo("jobs", JobTable.send_running_on)
    send_running = PassedTo("jobs", JobTable.send_running)
    cancelling_machines = PassedTo("jobs", JobTable.cancelling_machines)
    sweep = PassedTo("sweeper", Sweeper.sweep)
    counters = PassedTo("retention", Retention.counters)
    prune = PassedTo("retention", Retention.prune)
    clear = PassedTo("retention", Retention.clear)
    clear_jobs = PassedTo("retention", Retention.clear_jobs)
