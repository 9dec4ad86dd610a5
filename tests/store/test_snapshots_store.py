"""The project's snapshots in the store (store/snapshots.py), on real SQLite and real
PostgreSQL: a listing is kept whole with its date and price of a GB a month, replaces the one
before at once, and says per pool how many, how large and what they cost; never listed is
unknown, not none."""

from __future__ import annotations

import pytest

from sp00ky_infra.policy.cost import snapshot_euros
from sp00ky_infra.store import SqlStore
from sp00ky_infra.store.snapshots import Snapshot, SnapshotReading, SnapshotTable
from tests.helpers import across_a_restart

SOURCE = "Hetzner Pricing API (GET /pricing)"
READ_AT = 1_796_500_000.0  # 2026-12-05, UTC
HOUR, DAY = 3600.0, 86_400.0


def listing(
    *snapshots: Snapshot, read_at: float = READ_AT, on: str = "2026-12-05"
) -> SnapshotReading:
    return SnapshotReading(read_at, on, 0.0119, SOURCE, snapshots)


def test_a_listing_is_kept_whole_and_says_each_pools_count_size_and_euros(store: SqlStore) -> None:
    table = SnapshotTable(store)
    assert table.read() is None  # never listed: unknown, not an empty list
    render = (Snapshot(41, "render", 1.25, READ_AT - DAY), Snapshot(42, "render", 2.5, READ_AT))
    making = Snapshot(43, "north", None, READ_AT)  # still being made: no size yet
    table.save(listing(*render, making))
    kept = table.read()
    assert kept == listing(*render, making)
    mine = kept.pool("render")
    assert (mine.count, mine.gigabytes) == (2, 3.75)
    assert mine.monthly_euros == pytest.approx(3.75 * 0.0119)
    # each one since it was made: the first a day (24 started hours), the second an hour
    two = snapshot_euros(1.25, 0.0119, DAY + HOUR) + snapshot_euros(2.5, 0.0119, HOUR)
    assert mine.euros(READ_AT + HOUR) == pytest.approx(two)
    assert mine.as_json(READ_AT + HOUR) == {
        "count": 2, "gigabytes": 3.75, "monthly_euros": round(3.75 * 0.0119, 4),
        "euros": round(two, 4), "per_gb_month": 0.0119, "read_on": "2026-12-05",
        "read_at": READ_AT,
    }  # fmt: skip
    north = kept.pool("north")
    assert (north.count, north.gigabytes, north.monthly_euros) == (1, 0.0, 0.0)
    none = kept.pool("legacy")  # listed, and it has none: a count of 0, read that day
    assert (none.count, none.gigabytes, none.read_on) == (0, 0.0, "2026-12-05")


def test_a_new_listing_replaces_the_last_one_deleted_snapshots_included(store: SqlStore) -> None:
    table = SnapshotTable(store)
    table.save(listing(Snapshot(41, "render", 1.25, READ_AT), Snapshot(42, "render", 2.5, READ_AT)))
    later = READ_AT + DAY
    table.save(listing(Snapshot(44, "render", 3.0, later), read_at=later, on="2026-12-06"))
    kept = table.read()
    assert kept is not None and (kept.read_at, kept.read_on) == (later, "2026-12-06")
    assert kept.snapshots == (Snapshot(44, "render", 3.0, later),)
    table.save(listing(read_at=later + DAY, on="2026-12-07"))  # the project has none left
    emptied = table.read()
    assert emptied is not None and emptied.snapshots == () and emptied.read_on == "2026-12-07"


def test_a_save_that_fails_leaves_the_last_listing(store: SqlStore) -> None:
    table = SnapshotTable(store)
    table.save(listing(Snapshot(41, "render", 1.25, READ_AT)))
    twice = (Snapshot(50, "render", 1.0, READ_AT), Snapshot(50, "north", 2.0, READ_AT))
    with pytest.raises(Exception):  # noqa: B017 - each dialect's own integrity error
        table.save(listing(*twice, read_at=READ_AT + DAY))
    assert table.read() == listing(Snapshot(41, "render", 1.25, READ_AT))


def test_a_listing_survives_a_restart(store_url: str) -> None:
    kept = across_a_restart(
        store_url,
        lambda store: SnapshotTable(store).save(listing(Snapshot(41, "render", 1.25, READ_AT))),
        lambda store: SnapshotTable(store).read(),
    )
    assert kept == listing(Snapshot(41, "render", 1.25, READ_AT))
