"""Each pool's capacity in the store: a new or raised one taken at once, a lowered one kept
at the higher one until the jobs queued before the change have left the queue."""

from __future__ import annotations

from sp00ky_infra.store import SqlStore
from sp00ky_infra.store.capacity import KeptCapacity
from tests.helpers import render_job

T0 = 1_700_000_000.0


def test_a_raise_switches_at_once_and_a_lowering_waits_for_its_old_queue(
    store: SqlStore,
) -> None:
    table = store.capacities
    assert table.declare({"render": 4}, T0) == [KeptCapacity("render", 4)]
    assert table.declare({"render": 4}, T0 + 1) == []  # a restart with the same file
    assert table.declare({"render": 8}, T0 + 2) == [KeptCapacity("render", 8)]  # raised
    before = store.enqueue(render_job(), T0 + 3)
    [lowered] = table.declare({"render": 2}, T0 + 4)
    assert lowered == KeptCapacity("render", 2, 8, T0 + 4)
    assert table.read()["render"].in_force == 8
    assert "from 8 to 2 slots" in lowered.refusal()
    assert table.old_queue_waits(lowered, "render_job")
    store.enqueue(render_job(), T0 + 5)  # queued after the change: not the old queue
    (claimed,) = store.claim("render_job", 1, "c", T0 + 6, 90.0, machine="m1")
    assert claimed.id == before.id and claimed.attempt_number == 1  # admitted as it was
    assert not table.old_queue_waits(lowered, "render_job")
    table.settle("render", T0 + 7)
    assert table.read()["render"] == KeptCapacity("render", 2)


def test_lowering_again_while_draining_keeps_the_capacity_in_force(store: SqlStore) -> None:
    table = store.capacities
    table.declare({"render": 8}, T0)
    table.declare({"render": 4}, T0 + 1)
    [again] = table.declare({"render": 2}, T0 + 2)
    assert (again.capacity, again.draining_from) == (2, 8)  # 8 is still what admits
    [raised] = table.declare({"render": 16}, T0 + 3)
    assert raised == KeptCapacity("render", 16)
