"""Machine rows, pool state, incidents, join nonces and the leader lock, on both back ends."""

from __future__ import annotations

import pytest

from sp00ky_infra.policy.breaker import Breaker
from sp00ky_infra.policy.machines import Reason
from sp00ky_infra.store import Conflict, NewJob, SqlStore, open_store
from sp00ky_infra.store.machines import Change, MachineNotFound

T0 = 1_700_000_000.0


def test_a_machine_moves_through_its_states(store: SqlStore) -> None:
    machines = store.machines
    added = machines.add("render-a1", "render", "local", "rev1", 2, T0)
    assert (added.state, added.slots, added.session_hash, added.drained) == (
        "requested",
        2,
        None,
        False,
    )
    assert machines.move("render-a1", Reason.PROVISIONED, T0 + 1, Change(provider_id="4242"))
    assert not machines.move("render-a1", Reason.PROVISIONED, T0 + 1)  # CAS on the state
    joined = machines.join("render-a1", "hash", T0 + 2)
    assert (joined.state, joined.joined_at, joined.provider_id) == ("booting", T0 + 2, "4242")
    with pytest.raises(Conflict, match="cannot join: it joined already"):
        machines.join("render-a1", "other", T0 + 3)
    assert machines.move("render-a1", Reason.READY, T0 + 4)
    machines.seen("render-a1", T0 + 5)
    machines.set_idle("render-a1", T0 + 5)
    assert machines.move("render-a1", Reason.IDLE_SURPLUS, T0 + 6)
    assert machines.move("render-a1", Reason.DESTROYED, T0 + 7)
    final = machines.get("render-a1")
    assert (final.state, final.last_seen_at, final.idle_since) == ("destroyed", T0 + 5, T0 + 5)
    assert machines.live() == [] and machines.recent("render")[0].name == "render-a1"
    assert "session_hash" not in final.as_json()
    with pytest.raises(MachineNotFound, match="no machine 'nope'"):
        machines.get("nope")


def test_a_failed_boot_keeps_when_it_failed_once_destroyed(store: SqlStore) -> None:
    machines = store.machines
    machines.add("render-f1", "render", "local", "rev1", 1, T0)
    assert machines.move("render-f1", Reason.PROVISIONED, T0 + 1)
    assert machines.move("render-f1", Reason.BOOT_FAILED, T0 + 2, Change(detail="it exited"))
    assert machines.move("render-f1", Reason.DESTROYED, T0 + 4)
    gone = machines.get("render-f1")
    assert (gone.failed_reason, gone.failed_at, gone.updated_at) == ("it exited", T0 + 2, T0 + 4)


def test_live_machines_and_machine_time(store: SqlStore) -> None:
    store.machines.add("a", "render", "local", "r", 1, T0)
    store.machines.add("b", "render", "local", "r", 1, T0 + 100)
    store.machines.add("c", "other", "local", "r", 1, T0)
    store.machines.move("a", Reason.LEFT_BEHIND, T0 + 3600)
    assert [m.name for m in store.machines.live("render")] == ["b"]
    assert [m.name for m in store.machines.live()] == ["c", "b"]
    assert store.machines.count_live() == 2
    # a: one hour, destroyed; b: still alive at T0 + 7300 -> two hours
    assert store.machines.machine_seconds("render", T0 + 7300) == 3600 + 7200


def test_a_join_nonce_works_once(store: SqlStore) -> None:
    assert store.machines.use_nonce("n1", "a", T0)
    assert not store.machines.use_nonce("n1", "a", T0 + 1)
    assert store.machines.use_nonce("n2", "a", T0)


def test_pool_state_pause_breaker_and_incidents(store: SqlStore) -> None:
    pools = store.pools
    assert pools.state("render").paused is False and pools.state("render").breaker == Breaker()
    pools.set_paused("render", True, T0)
    opened = Breaker(3, 1, T0 + 60)
    pools.save_breaker("render", opened, T0)
    state = pools.state("render")
    assert state.paused and state.breaker == opened
    pools.set_paused("render", False, T0 + 1)
    assert pools.state("render").breaker == opened  # one setting does not clobber the other
    assert pools.open_incident("render", "pool_breaker_open", "3 failed boots", T0)
    assert not pools.open_incident("render", "pool_breaker_open", "again", T0 + 1)
    assert pools.close_incidents("render", "pool_breaker_open", T0 + 2) == 1
    assert pools.open_incident("render", "pool_breaker_open", "later", T0 + 3)
    found = pools.incidents("render")
    assert [(i.message, i.closed_at) for i in found] == [
        ("later", None),
        ("3 failed boots", T0 + 2),
    ]
    assert pools.incidents("other") == []


def test_queue_counts_busy_slots_and_running_jobs(store: SqlStore) -> None:
    for n in range(5):
        store.enqueue(NewJob("r", "render_job", "/render", {"n": n}, slots=1 + n % 2), T0)
    store.enqueue(NewJob("r", "render_job", "/render", delay_ms=60_000), T0)
    assert store.queued("render_job", T0, cap=100) == 5  # the delayed one is not due
    assert store.queued("render_job", T0, cap=3) == 3
    # sizing counts the slots queued jobs need (slots 1, 2, 1, 2, 1), over the first ``cap``
    assert store.queued_slots("render_job", T0, cap=100) == 7
    assert store.queued_slots("render_job", T0, cap=3) == 4
    taken = {
        machine: sum(
            job.slots for job in store.claim("render_job", 2, "c", T0, 90, machine=machine)
        )
        for machine in ("m1", "m2")
    }
    assert store.busy_slots("render_job") == {m: n for m, n in taken.items() if n}
    assert all(1 <= n <= 2 for n in taken.values())
    assert {job.machine for job in store.running_on("m1")} == {"m1"}


def test_only_one_leader_lock(store_url: str) -> None:
    first, second = open_store(store_url), open_store(store_url)
    try:
        one, two = first.leader_lock(), second.leader_lock()
        assert one.try_acquire() and one.try_acquire()  # held: stays held
        assert not two.try_acquire()
        one.release()
        assert two.try_acquire()
        two.release()
    finally:
        first.close()
        second.close()


def test_a_rejoin_swaps_the_session_of_a_live_machine_with_its_credential(
    store: SqlStore,
) -> None:
    machines = store.machines
    machines.add("render-r1", "render", "local", "rev1", 1, T0)
    joined = machines.join("render-r1", "session-1", T0 + 1, "credential-1")
    assert joined.credential_hash == "credential-1" and "credential_hash" not in joined.as_json()
    assert machines.move("render-r1", Reason.READY, T0 + 2)
    back = machines.rejoin("render-r1", "credential-1", "session-2", T0 + 3)
    assert (back.state, back.session_hash, back.last_seen_at) == ("ready", "session-2", T0 + 3)
    with pytest.raises(Conflict, match="cannot rejoin"):
        machines.rejoin("render-r1", "another", "session-3", T0 + 4)
    assert machines.move("render-r1", Reason.SILENT, T0 + 5)
    with pytest.raises(Conflict, match="cannot rejoin"):
        machines.rejoin("render-r1", "credential-1", "session-3", T0 + 6)
    assert machines.get("render-r1").session_hash == "session-2"
