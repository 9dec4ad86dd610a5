"""The tick's reads at a flat cost: machines nothing happens to are counted, not listed, and
the plan is the same (``policy.plan.steady``, ``summarize``); the store's SQL makes the same
test as the policy, on both dialects, thresholds included (``store.tick``)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sp00ky_infra.policy.machines import MachineState
from sp00ky_infra.policy.plan import (
    MachineView,
    PoolView,
    Unlisted,
    plan_pool,
    queue_cap_at,
    silent,
    summarize,
)
from sp00ky_infra.policy.sizing import Shape, desired_machines, queue_cap
from sp00ky_infra.store import NewJob, SqlStore
from sp00ky_infra.store.tick import PoolTerms, TickReads

NOW = 100_000.0
LEASE, LIFETIME, IDLE = 90.0, 86_400.0, 300.0
STATES: tuple[MachineState, ...] = ("requested", "booting", "ready", "draining", "failed")
SERVING: tuple[MachineState, ...] = ("ready", "booting", "draining")
OTHERS: tuple[MachineState, ...] = ("requested", "failed", "draining")


def view(machines: list[MachineView], shape: Shape, queued: int) -> PoolView:
    return PoolView(
        name="render",
        shape=shape,
        revision="r1",
        machines=machines,
        queued=queued,
        idle_timeout=IDLE,
        max_lifetime=LIFETIME,
        boot_timeout=600,
        silence=LEASE,
    )


# Ages on and around every threshold, where a machine changes side.
def ages(threshold: float) -> st.SearchStrategy[float]:
    return st.one_of(
        st.sampled_from([0.0, threshold - 1, threshold, threshold + 1e-9, threshold + 1]),
        st.floats(0, 2 * threshold),
    )


machines = st.lists(
    st.builds(
        lambda i, state, revision, age, seen, idle, busy, drained: MachineView(
            f"m{i}",
            state,
            NOW - age,
            revision,
            busy,
            None if idle is None else NOW - idle,
            None if seen is None else NOW - seen,
            drained,
        ),
        st.integers(0, 10**6),
        st.sampled_from(STATES),
        st.sampled_from(["r1", "r1", "r0"]),
        ages(LIFETIME),
        st.none() | ages(LEASE),
        st.none() | ages(IDLE),
        st.integers(0, 2),
        st.booleans(),
    ),
    max_size=12,
    unique_by=lambda machine: machine.name,
)
shapes = st.builds(
    lambda low, extra, autoscale, buffer, slots: Shape(low, low + extra, autoscale, buffer, slots),
    st.integers(0, 4),
    st.integers(0, 8),
    st.booleans(),
    st.integers(0, 2),
    st.integers(1, 3),
)


@given(machines, shapes, st.integers(0, 30))
def test_counting_steady_machines_gives_the_same_plan(
    listed: list[MachineView], shape: Shape, queued: int
) -> None:
    full = view(listed, shape, queued)
    counted = summarize(full, NOW)
    assert counted.steady + len(counted.machines) == len(listed)
    expected = plan_pool(full, NOW)
    try:
        plan = plan_pool(counted, NOW)
    except Unlisted:
        # only when the pool has machines to spare and counted some idle ones
        assert counted.steady_idle and expected.current > expected.desired
        return
    assert plan == expected


def test_a_surplus_with_idle_machines_counted_asks_for_them() -> None:
    idle = MachineView("m1", "ready", NOW - 10, "r1", 0, NOW - IDLE, NOW)
    counted = summarize(view([idle], Shape(0, 2, True, 0, 1), 0), NOW)
    assert (counted.steady, counted.steady_idle, counted.machines) == (1, 1, [])
    with pytest.raises(Unlisted):
        plan_pool(counted, NOW)
    # without a surplus it is counted and the plan keeps it
    kept = summarize(view([idle], Shape(1, 2, True, 0, 1), 0), NOW)
    assert plan_pool(kept, NOW).drain == ()


# --- the store's SQL makes the same test -----------------------------------------------------


def _insert(store: SqlStore, machine: MachineView, pool: str) -> None:
    with store.read() as cur:
        cur.execute(
            "INSERT INTO machines (name, pool, provider, state, revision, slots, created_at, "
            "updated_at, last_seen_at, idle_since, drained) VALUES (?, ?, 'test', ?, ?, 4, ?, ?, "
            "?, ?, ?)",
            (
                machine.name,
                pool,
                machine.state,
                machine.revision,
                machine.created_at,
                machine.created_at,
                machine.last_seen_at,
                machine.idle_since,
                int(machine.drained),
            ),
        )


def _run(store: SqlStore, table: str, machine: str, jobs: int, now: float = NOW) -> None:
    """``jobs`` jobs of ``table`` running on ``machine``."""
    news = [NewJob("app", table, "/run", {"n": n}, pool="any") for n in range(jobs)]
    store.enqueue_many(news, now - 5)
    for _ in range(jobs):
        assert store.claim(table, 1, "test", now - 5, 3600, machine=machine)


# A grid over every threshold the steady test has (silence, lifetime, idle timeout, revision,
# state, busy with or without an idle clock), each value on and beside its threshold, at a
# small clock and at a real one (where a double's step is 2e-7 s).
def grid(now: float) -> list[MachineView]:
    serving = [
        (state, age, revision, busy, idle, seen, False)
        for state in SERVING
        for age in (10.0, LIFETIME - 1e-6, LIFETIME, LIFETIME + 1)
        for revision in ("r1", "r0")
        for busy in (0, 2)
        for idle in (None, now - 5, now - IDLE, now - IDLE + 1e-6)
        for seen in (None, now - 1, now - LEASE, now - LEASE - 1e-6)
    ]
    others: list[tuple[MachineState, float, str, int, float | None, float | None, bool]] = [
        (state, age, "r1", 0, None, seen, drained)
        for state in OTHERS
        for age in (10.0, LIFETIME + 1)
        for seen in (None, now - LEASE - 1)
        for drained in (False, True)
    ]
    return [
        MachineView(f"m{n:04d}", state, now - age, revision, busy, idle, seen, drained)
        for n, (state, age, revision, busy, idle, seen, drained) in enumerate(serving + others)
    ]


@pytest.mark.parametrize("now", [NOW, 1_796_000_000.123])
def test_the_store_counts_the_machines_the_policy_calls_steady(store: SqlStore, now: float) -> None:
    machines = grid(now)
    other = MachineView("o1", "ready", now - 10, "r9", 0, now - 5, now)  # another pool's
    _insert(store, other, "other")
    for machine in machines:
        _insert(store, replace(machine, busy_slots=0), "render")
        if machine.busy_slots > 1:
            _run(store, "render_job", machine.name, machine.busy_slots - 1, now)
    # a job of another table makes a machine busy too: a machine that runs a job is busy
    for machine in machines:
        if machine.busy_slots:
            _run(store, "other_job", machine.name, 1, now)
    terms = [PoolTerms("render", "r1", LEASE, LIFETIME, IDLE)]
    reads = TickReads(store)
    found = reads.summarized(terms, now)["render"]
    pool = view(machines, Shape(0, 2, True, 0, 4), 0)
    want = summarize(pool, now)
    assert found.steady == want.steady > 0
    assert found.steady_busy == want.steady_busy > 0
    assert found.steady_idle == want.steady_idle > 0
    listed = sorted(want.machines, key=lambda m: (m.created_at, m.name))
    assert [row.view() for row in found.listed] == listed
    # every machine listed when not summarizing (explain), other pools' never
    every = reads.listed(terms)["render"]
    assert (every.steady, len(every.listed)) == (0, len(machines))
    assert sorted((row.view() for row in every.listed), key=lambda m: m.name) == machines
    # the fence's read: the serving machines silent for a whole lease, as the policy says
    gone = reads.silent(terms, now)
    assert [row.view() for row in gone] == [m for m in listed if silent(m, LEASE, now)]
    assert gone


@given(
    shapes,
    st.integers(0, 40),
    st.lists(st.integers(1, 3), max_size=60),
)
def test_a_queue_counted_to_its_cap_at_the_busy_slots_sizes_as_the_whole(
    shape: Shape, busy: int, queue: list[int]
) -> None:
    """The tick counts a queue's first ``queue_cap_at`` jobs (their slots): the same desired
    count as the whole queue, whatever the jobs' slots."""
    cap = queue_cap_at(shape, busy)
    assert 0 <= cap <= queue_cap(shape)
    assert desired_machines(shape, busy, sum(queue[:cap])) == desired_machines(
        shape, busy, sum(queue)
    )


def test_every_queue_counted_in_one_statement_as_one_at_a_time(store: SqlStore) -> None:
    for table, count, mixed in (("a_job", 0, True), ("b_job", 7, True), ("c_job", 40, False)):
        news = [
            NewJob("app", table, "/run", {"n": n}, pool=table, slots=1 + n % 2 * mixed)
            for n in range(count)
        ]
        store.enqueue_many(news, NOW - 1)
    store.enqueue_many([NewJob("app", "b_job", "/run", {}, pool="b", delay_ms=60_000)], NOW)
    queues = [("a_job", 21), ("b_job", 21), ("c_job", 21), ("c_job", 5), ("nobody", 3)]
    expected = [store.queued_slots(table, NOW, cap) for table, cap in queues]
    assert TickReads(store).queued_slots(queues, NOW) == expected == [0, 10, 21, 5, 0]
