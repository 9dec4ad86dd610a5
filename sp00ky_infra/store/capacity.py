"""Each pool's capacity as admission holds it, kept in the store (the Resource pools docs:
"Changing capacity lets existing work drain at the stored capacity before admission switches
to the configured capacity. New enqueue requests fail while the old queue drains; tasks
already queued keep their admission and attempt number").

A pool's capacity is its slots at full size: ``max`` x ``slots`` (``min`` x ``slots`` for a
fixed pool). A controller that starts with a lower one than the store holds does not switch
at once: the pool keeps the stored capacity (``draining_from``) until every job queued before
the change (``changed_at``) has left the queue, and meanwhile refuses new jobs; then the
leader's tick switches it (``settle``). A raise switches at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sp00ky_infra.store.dialect import Dialect
from sp00ky_infra.store.model import QueueFull

COLUMNS = "pool, capacity, draining_from, changed_at, updated_at"


class CapacityChanging(QueueFull):
    """A new job for a pool whose lowered capacity still drains its old queue."""


@dataclass(frozen=True, slots=True)
class KeptCapacity:
    """A pool's capacity in slots; ``draining_from``: the higher one still in force while the
    jobs queued before ``changed_at`` drain."""

    pool: str
    capacity: int
    draining_from: int | None = None
    changed_at: float | None = None

    @property
    def in_force(self) -> int:
        return self.draining_from if self.draining_from is not None else self.capacity

    def refusal(self) -> str:
        """Why a new job is refused while the old queue drains."""
        return (
            f"pool {self.pool!r} is lowering its capacity from {self.draining_from} to "
            f"{self.capacity} slots: the jobs queued before the change drain first, and new "
            "jobs are refused until they have (`pools get` shows when it switched); "
            "try again later"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "slots": self.capacity,
            "draining_from": self.draining_from,
            "changed_at": self.changed_at,
        }


class CapacityTable:
    """The pools' capacities (migration 16's ``pool_capacity``)."""

    def __init__(self, db: Dialect) -> None:
        self._db = db

    def declare(self, configured: Mapping[str, int], now: float) -> list[KeptCapacity]:
        """The configuration's capacities: a new pool's or a raised one's taken at once, a
        lowered one's after the old queue drains; the rows that changed."""
        changed = []
        with self._db.write() as sql:
            for pool, capacity in sorted(configured.items()):
                row = sql.execute(
                    f"SELECT {COLUMNS} FROM pool_capacity WHERE pool = ?", (pool,)
                ).fetchone()
                kept = _kept(row) if row else None
                if kept is not None and kept.capacity == capacity:
                    continue
                draining = kept is not None and capacity < kept.in_force
                after = KeptCapacity(
                    pool,
                    capacity,
                    kept.in_force if kept is not None and draining else None,
                    now if draining else None,
                )
                sql.execute("DELETE FROM pool_capacity WHERE pool = ?", (pool,))
                sql.execute(
                    f"INSERT INTO pool_capacity ({COLUMNS}) VALUES (?, ?, ?, ?, ?)",
                    (pool, capacity, after.draining_from, after.changed_at, now),
                )
                changed.append(after)
        return changed

    def read(self) -> dict[str, KeptCapacity]:
        with self._db.read() as sql:
            rows = sql.execute(f"SELECT {COLUMNS} FROM pool_capacity").fetchall()
        return {row[0]: _kept(row) for row in rows}

    def old_queue_waits(self, kept: KeptCapacity, table: str) -> bool:
        """Whether a job queued before the change still waits."""
        with self._db.read() as sql:
            sql.execute(
                "SELECT 1 FROM jobs WHERE tbl = ? AND status = 'pending' AND created_at <= ? "
                "LIMIT 1",
                (table, kept.changed_at),
            )
            return sql.fetchone() is not None

    def settle(self, pool: str, now: float) -> None:
        """The lowered capacity in force: its old queue has drained."""
        with self._db.write() as sql:
            sql.execute(
                "UPDATE pool_capacity SET draining_from = NULL, changed_at = NULL, "
                "updated_at = ? WHERE pool = ?",
                (now, pool),
            )


def _kept(row: Any) -> KeptCapacity:
    pool, capacity, draining_from, changed_at, _ = row
    return KeptCapacity(
        pool,
        int(capacity),
        None if draining_from is None else int(draining_from),
        None if changed_at is None else float(changed_at),
    )
