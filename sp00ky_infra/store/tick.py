"""What the controller's tick reads: a few index ranges a pool, whatever its machines.

The tick reads none of the machines nothing can happen to, so that its cost follows the
machines that need a decision: each machine's busy slots are kept on its row by the
database (migration 7's triggers, in the transaction that moves a job), and ``summarized``
counts each pool's ready machines (how many, their busy slots, how many idle past the idle
timeout) from one index alone, then seeks, in indexes that hold a few entries each, the
machines that may need a decision: not ready, or ready and maybe silent, past their
lifetime, on another revision, or with an idle clock to start or stop. The policy's own test
(``policy.plan.steady``) sorts those out; the steady ones among them are counted, the others
listed. ``silent`` seeks the machines to fence the same way, and ``queued_slots`` counts
every pool's queue, each capped, in one statement. None reads a pending job row beyond a
pool's cap, so the cost stays flat in the backlog, and none reads a steady machine's row.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sp00ky_infra.policy.machines import MachineState
from sp00ky_infra.policy.plan import MachineView, idle_past, silent, steady
from sp00ky_infra.store.dialect import Dialect
from sp00ky_infra.store.rows import QUEUE_HEAD_SLOTS

# Seconds added to a threshold to seek a range that holds every machine past it: ``x + s <
# now`` and ``now - x >= t``, computed in doubles, imply ``x < now - s + MARGIN`` and ``x <
# now - t + MARGIN`` while a rounding error stays under a second (times and durations below
# 10**15 s). The range may hold a few machines more, not fewer; the exact test follows.
MARGIN = 1.0


@dataclass(frozen=True, slots=True)
class PoolTerms:
    """What a pool's plan compares its machines with (its configured settings); the
    ``policy.plan.Terms`` of ``steady`` and ``idle_past``."""

    pool: str
    revision: str
    silence: float  # the lease: a serving machine silent this long has stopped answering
    max_lifetime: float
    idle_timeout: float


@dataclass(frozen=True, slots=True)
class MachineRow:
    """A live machine as the plan sees it (``policy.plan.MachineView``'s fields)."""

    name: str
    pool: str
    state: MachineState
    created_at: float
    revision: str
    busy_slots: int
    idle_since: float | None
    last_seen_at: float | None
    drained: bool

    def view(self) -> MachineView:
        return MachineView(
            name=self.name,
            state=self.state,
            created_at=self.created_at,
            revision=self.revision,
            busy_slots=self.busy_slots,
            idle_since=self.idle_since,
            last_seen_at=self.last_seen_at,
            drained=self.drained,
        )


@dataclass(slots=True)
class PoolMachines:
    """One pool's live machines: the ones listed, oldest first, and the steady ones counted
    (with their busy slots, and how many are idle past the idle timeout)."""

    listed: list[MachineRow] = field(default_factory=list)
    steady: int = 0
    steady_busy: int = 0
    steady_idle: int = 0


_COLUMNS = (
    "m.pool, m.name, m.state, m.created_at, m.revision, m.busy_slots, m.idle_since, "
    "m.last_seen_at, m.drained"
)
# The machines that may not be steady, a branch each: a range of an index of migration 7 a
# pool (its terms as the partial index has them). SQLite, without statistics, is told which
# index (it would take machines_ready's range of every busy machine for the last branch).
_MAYBE_UNSTEADY = (
    ("machines_unready", "m.state <> 'ready' AND m.state <> 'destroyed'"),
    ("machines_ready_seen", "m.state = 'ready' AND m.last_seen_at < p.seen_bound"),  # silent?
    ("machines_ready_born", "m.state = 'ready' AND m.created_at < p.born_bound"),  # too old?
    ("machines_ready_revision", "m.state = 'ready' AND m.revision < p.revision"),
    ("machines_ready_revision", "m.state = 'ready' AND m.revision > p.revision"),
    # an idle clock to start, or to stop
    ("machines_ready", "m.state = 'ready' AND m.busy_slots = 0 AND m.idle_since IS NULL"),
    (
        "machines_ready_clock",
        "m.state = 'ready' AND m.busy_slots > 0 AND m.idle_since IS NOT NULL",
    ),
)


@functools.cache
def _with(columns: str, rows: int) -> str:
    """``WITH p (columns) AS (VALUES ...)`` for ``rows`` rows: the statements' text is made
    once for a number of pools, not every tick."""
    marks = "(" + ", ".join("?" for _ in columns.split(",")) + ")"
    return f"WITH p ({columns}) AS (VALUES {', '.join(marks for _ in range(rows))}) "


def _row(found: Sequence[Any]) -> MachineRow:
    pool, name, state, created, revision, busy, idle, seen, drained = found
    return MachineRow(name, pool, state, created, revision, int(busy), idle, seen, bool(drained))


class TickReads:
    """The tick's reads, on the store's connections."""

    def __init__(self, db: Dialect) -> None:
        self._db = db

    def _each_pool(self, index: str, where: str) -> str:
        """``FROM`` the machines of each pool of ``p`` ``where`` it holds (``Dialect.join_each``;
        SQLite told ``index``)."""
        return self._db.join_each("p", "machines m", "m.pool = p.pool", where, index)

    def _fetch(self, sql: str, params: Sequence[Any]) -> list[Any]:
        with self._db.read() as cur:
            return list(cur.execute(sql, params).fetchall())

    def listed(self, terms: Sequence[PoolTerms]) -> dict[str, PoolMachines]:
        """Every configured pool's live machines with their busy slots, each one listed, oldest
        first (in one statement, whatever the pools)."""
        found = {each.pool: PoolMachines() for each in terms}
        if not terms:
            return found
        rows = self._fetch(
            f"{_with('pool', len(terms))}SELECT {_COLUMNS} FROM p JOIN machines m "
            "ON m.pool = p.pool WHERE m.state <> 'destroyed' ORDER BY 4, 2",
            [each.pool for each in terms],
        )
        for row in map(_row, rows):
            found[row.pool].listed.append(row)
        return found

    def summarized(self, terms: Sequence[PoolTerms], now: float) -> dict[str, PoolMachines]:
        """Every configured pool's live machines with their busy slots, the steady ones
        (``policy.plan.steady``) only counted. One statement, whatever the pools; it reads no
        steady machine's row."""
        found = {each.pool: PoolMachines() for each in terms}
        if not terms:
            return found
        maybe = []
        for kind, pool, *machine in self._fetch(*self._summary(terms, now)):
            if kind == 0:
                maybe.append(_row((pool, *machine)))
            elif (into := found.get(pool)) is not None:
                count, summed = int(machine[4]), int(machine[7] or 0)
                if kind == 1:
                    into.steady, into.steady_busy = count, summed
                else:
                    into.steady_idle = count
        by_pool = {each.pool: each for each in terms}
        for row in maybe:
            into = found[row.pool]
            if row.state == "ready":  # counted above: steady, or taken out and listed
                pool, view = by_pool[row.pool], row.view()
                if steady(view, pool, now):
                    continue
                into.steady -= 1
                into.steady_busy -= row.busy_slots
                into.steady_idle -= idle_past(view, pool, now)
            into.listed.append(row)
        return found

    def _summary(self, terms: Sequence[PoolTerms], now: float) -> tuple[str, list[Any]]:
        """``summarized``'s statement, so that the counts and the rows are of one snapshot
        (the rows first: PostgreSQL types the columns of a UNION from the left): every ready
        machine counted, its busy slots summed, from machines_ready alone (every pool's: the
        ones not configured are left out after); the ones idle past the timeout
        (policy.plan.idle_past, the same arithmetic: IEEE doubles on both dialects), a range
        of it a pool; and the rows of the machines that may not be steady. The steady ones
        are the ones counted but these."""
        ready = self._db.indexed("machines m", "machines_ready")
        counted = (
            "SELECT 1, m.pool, NULL, NULL, NULL, NULL, count(*), NULL, NULL, sum(m.busy_slots) "
            f"FROM {ready} WHERE m.state = 'ready' GROUP BY m.pool",
            "SELECT 2, p.pool, NULL, NULL, NULL, NULL, count(*), NULL, NULL, 0 "
            + self._each_pool(
                "machines_ready",
                "m.state = 'ready' AND m.busy_slots = 0 AND m.idle_since < p.idle_bound "
                "AND ? - m.idle_since >= p.idle_timeout",
            )
            + " GROUP BY p.pool",
        )
        listed = (
            f"SELECT 0, {_COLUMNS} {self._each_pool(index, where)}"
            for index, where in _MAYBE_UNSTEADY
        )
        columns = "pool, revision, seen_bound, born_bound, idle_bound, idle_timeout"
        params: list[Any] = [
            value
            for each in terms
            for value in (
                each.pool,
                each.revision,
                now - each.silence + MARGIN,
                now - each.max_lifetime + MARGIN,
                now - each.idle_timeout + MARGIN,
                each.idle_timeout,
            )
        ]
        union = " UNION ".join((*listed, *counted))
        return f"{_with(columns, len(terms))}{union} ORDER BY 5, 3", [*params, now]

    def silent(self, terms: Sequence[PoolTerms], now: float) -> list[MachineRow]:
        """The serving (ready, draining) machines of configured pools silent for a whole lease
        (``policy.plan.silent``), oldest first: the ones to fence (a range of
        machines_ready_seen and machines_unready a pool)."""
        if not terms:
            return []
        union = " UNION ".join(
            f"SELECT {_COLUMNS} {self._each_pool(index, where)}"
            for index, where in (
                ("machines_ready_seen", "m.state = 'ready' AND m.last_seen_at < p.seen_bound"),
                (
                    "machines_unready",
                    "m.state <> 'ready' AND m.state <> 'destroyed' AND m.state = 'draining'",
                ),
            )
        )
        rows = self._fetch(
            f"{_with('pool, seen_bound', len(terms))}{union} ORDER BY 4, 2",
            [value for each in terms for value in (each.pool, now - each.silence + MARGIN)],
        )
        silence = {each.pool: each.silence for each in terms}
        return [row for row in map(_row, rows) if silent(row.view(), silence[row.pool], now)]

    def queued_slots(self, queues: Sequence[tuple[str, int]], now: float) -> list[int]:
        """For each (table, cap): the slots its eligible pending jobs need over the first
        ``cap`` of them (``JobTable.queued_slots``, every queue in one statement): a range of
        the jobs_pending_due index each, never longer than its cap; none for a cap of 0."""
        found = [0] * len(queues)
        counted = [(n, table, cap) for n, (table, cap) in enumerate(queues) if cap > 0]
        if not counted:
            return found
        for n, slots in self._fetch(*self._db.each_queue(QUEUE_HEAD_SLOTS, counted, now)):
            found[int(n)] = int(slots)
        return found
