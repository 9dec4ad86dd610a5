"""The project's snapshots as last listed from the provider's API, with the price of a GB a
month read with them: what each pool's snapshots cost, kept so that a controller that cannot
reach the API shows them as of the last reading.

A reading is saved whole, in one transaction that replaces the one before: a snapshot deleted
since goes with it, and a failed reading (never saved) leaves the last one in place. A pool
with no snapshot in a reading has none (count 0); with no reading at all, its snapshots are
unknown (None), never shown as none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sp00ky_infra.policy.cost import snapshot_euros
from sp00ky_infra.store.dialect import Dialect

READING = "per_gb_month, read_on, read_at, source"
SNAPSHOT = "image_id, pool, gigabytes, created_at"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One snapshot of a pool: its image id, its size (GB, what is billed; None while it is
    being made) and when it was made (unix time)."""

    id: int
    pool: str
    gigabytes: float | None
    created_at: float


@dataclass(frozen=True, slots=True)
class PoolSnapshots:
    """A pool's snapshots in one reading: how many, their GB, what they cost a month (net EUR
    at ``per_gb_month``) and the day they were read on."""

    pool: str
    snapshots: tuple[Snapshot, ...]
    per_gb_month: float
    read_on: str
    read_at: float

    @property
    def count(self) -> int:
        return len(self.snapshots)

    @property
    def gigabytes(self) -> float:
        return sum(s.gigabytes or 0.0 for s in self.snapshots)

    @property
    def monthly_euros(self) -> float:
        return self.gigabytes * self.per_gb_month

    def euros(self, now: float) -> float:
        """What the snapshots it has cost so far, each since it was made (a snapshot deleted
        before the reading is not counted)."""
        return sum(
            snapshot_euros(s.gigabytes or 0.0, self.per_gb_month, now - s.created_at)
            for s in self.snapshots
        )

    def as_json(self, now: float) -> dict[str, Any]:
        return {
            "count": self.count, "gigabytes": round(self.gigabytes, 4),
            "monthly_euros": round(self.monthly_euros, 4), "euros": round(self.euros(now), 4),
            "per_gb_month": self.per_gb_month, "read_on": self.read_on, "read_at": self.read_at,
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class SnapshotReading:
    """One listing of the project's snapshots at ``read_at`` (unix time, on the day
    ``read_on``), and the net price of a GB a month read with it (and where from)."""

    read_at: float
    read_on: str
    per_gb_month: float
    source: str
    snapshots: tuple[Snapshot, ...] = ()

    def pool(self, name: str) -> PoolSnapshots:
        """The pool's snapshots (none: a count of 0)."""
        mine = tuple(s for s in self.snapshots if s.pool == name)
        return PoolSnapshots(name, mine, self.per_gb_month, self.read_on, self.read_at)


class SnapshotTable:
    """The last reading of the project's snapshots (``snapshot_readings`` and
    ``pool_snapshots``)."""

    def __init__(self, db: Dialect) -> None:
        self._db = db

    def save(self, reading: SnapshotReading) -> None:
        """Replace the kept reading with ``reading``, at once."""
        rows = [(s.id, s.pool, s.gigabytes, s.created_at) for s in reading.snapshots]
        with self._db.write() as sql:
            sql.execute("DELETE FROM pool_snapshots")
            sql.execute("DELETE FROM snapshot_readings")
            sql.execute(
                f"INSERT INTO snapshot_readings ({READING}) VALUES (?, ?, ?, ?)",
                (reading.per_gb_month, reading.read_on, reading.read_at, reading.source),
            )
            sql.executemany(f"INSERT INTO pool_snapshots ({SNAPSHOT}) VALUES (?, ?, ?, ?)", rows)

    def read(self) -> SnapshotReading | None:
        """The kept reading; None when the snapshots were never read."""
        with self._db.read() as sql:
            found = sql.execute(f"SELECT {READING} FROM snapshot_readings").fetchone()
            rows = sql.execute(
                f"SELECT {SNAPSHOT} FROM pool_snapshots ORDER BY image_id"
            ).fetchall()
        if found is None:
            return None
        per_gb_month, read_on, read_at, source = found
        snapshots = tuple(
            Snapshot(int(i), pool, None if gb is None else float(gb), float(created))
            for i, pool, gb, created in rows
        )
        return SnapshotReading(float(read_at), read_on, float(per_gb_month), source, snapshots)
