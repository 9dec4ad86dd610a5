"""Pure pool decisions: sizing by the docs' rule, the breaker's timings, and the plan."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sp00ky_infra.policy.breaker import Breaker, pause
from sp00ky_infra.policy.plan import Create, MachineView, PoolView, Reason, plan_pool
from sp00ky_infra.policy.sizing import Shape, desired_machines, queue_cap

STEADY = Shape(min=2, max=None, autoscale=False, buffer=0, slots=1)
ELASTIC = Shape(min=1, max=8, autoscale=True, buffer=0, slots=1)
INSTANT = Shape(min=0, max=10, autoscale=True, buffer=2, slots=1)
ON_DEMAND = Shape(min=0, max=3, autoscale=True, buffer=0, slots=1)
RENDER = Shape(min=0, max=2, autoscale=True, buffer=0, slots=1)


@pytest.mark.parametrize(
    ("shape", "busy", "queued", "desired"),
    [
        # Fixed: always two machines, whatever the queue.
        (STEADY, 0, 0, 2),
        (STEADY, 2, 50, 2),
        # Baseline plus on demand: one always, more while jobs queue, never above eight.
        (ELASTIC, 0, 0, 1),
        (ELASTIC, 1, 3, 4),
        (ELASTIC, 5, 100, 8),
        # Warm buffer: two ready machines on top of the busy ones.
        (INSTANT, 0, 0, 2),
        (INSTANT, 3, 0, 5),
        (INSTANT, 8, 5, 10),
        # Scale to zero: nothing until a job arrives.
        (ON_DEMAND, 0, 0, 0),
        (ON_DEMAND, 0, 1, 1),
        (ON_DEMAND, 2, 7, 3),
        # The render pool: two jobs at once get two machines; a third waits for one of them.
        (RENDER, 0, 2, 2),
        (RENDER, 2, 1, 2),
        # Slots: two jobs a machine.
        (Shape(0, 4, True, 0, 2), 3, 2, 3),
        (Shape(0, 4, True, 1, 2), 0, 0, 1),
    ],
)
def test_the_docs_sizing_examples(shape: Shape, busy: int, queued: int, desired: int) -> None:
    assert desired_machines(shape, busy, queued) == desired


shapes = st.builds(
    lambda low, extra, autoscale, buffer, slots: Shape(
        low, low + extra, autoscale, min(buffer, low + extra), slots
    ),
    st.integers(0, 5),
    st.integers(0, 10),
    st.booleans(),
    st.integers(0, 5),
    st.integers(1, 4),
)


@given(shapes, st.integers(0, 60), st.integers(0, 200))
def test_desired_stays_within_bounds(shape: Shape, busy: int, queued: int) -> None:
    desired = desired_machines(shape, busy, queued)
    assert shape.min <= desired <= (shape.max if shape.autoscale else shape.min)  # type: ignore[operator]


@given(shapes, st.integers(0, 60), st.integers(0, 200), st.integers(0, 50))
def test_more_work_never_wants_fewer_machines(
    shape: Shape, busy: int, queued: int, more: int
) -> None:
    assert desired_machines(shape, busy, queued + more) >= desired_machines(shape, busy, queued)
    assert desired_machines(shape, busy + more, queued) >= desired_machines(shape, busy, queued)


@given(shapes, st.integers(0, 60), st.integers(0, 10_000))
def test_counting_the_queue_up_to_the_cap_decides_the_same(
    shape: Shape, busy: int, queued: int
) -> None:
    capped = min(queued, queue_cap(shape))
    assert desired_machines(shape, busy, capped) == desired_machines(shape, busy, queued)


# --- breaker -----------------------------------------------------------------------------------


def test_breaker_opens_after_three_failures_for_one_minute() -> None:
    breaker = Breaker()
    for at in (0.0, 1.0):
        breaker = breaker.failed(at)
        assert breaker.allows(at)
    breaker = breaker.failed(2.0)
    assert breaker.is_open(2.0) and breaker.open_until == 62.0
    assert breaker.is_open(61.9) and breaker.allows(62.0)


def test_breaker_pauses_double_up_to_fifteen_minutes() -> None:
    assert [pause(n) / 60 for n in range(7)] == [1, 2, 4, 8, 15, 15, 15]
    breaker, now, pauses = Breaker(), 0.0, []
    for _ in range(3):
        breaker = breaker.failed(now)
    for _ in range(6):
        assert breaker.open_until is not None
        pauses.append((breaker.open_until - now) / 60)
        now = breaker.open_until
        breaker = breaker.failed(now)  # the next boot after the pause fails again
    assert pauses == [1, 2, 4, 8, 15, 15]


def test_failures_while_open_do_not_extend_it_and_a_good_boot_closes_it() -> None:
    breaker = Breaker().failed(0).failed(0).failed(0)
    assert breaker.failed(30).open_until == 60.0
    assert breaker.succeeded() == Breaker() and breaker.succeeded().allows(1)


# --- plan --------------------------------------------------------------------------------------

NOW = 10_000.0


def pool(
    *machines: MachineView, shape: Shape = RENDER, queued: int = 0, **fields: object
) -> PoolView:
    base = PoolView(
        name="render",
        shape=shape,
        revision="r1",
        machines=machines,
        queued=queued,
        idle_timeout=300,
        max_lifetime=86400,
        boot_timeout=600,
        silence=90,
    )
    return replace(base, **fields)  # type: ignore[arg-type]


def ready(name: str, busy: int = 0, idle_for: float | None = None, **fields: object) -> MachineView:
    idle_since = None if idle_for is None else NOW - idle_for
    machine = MachineView(name, "ready", NOW - 1000, "r1", busy, idle_since, NOW - 1)
    return replace(machine, **fields)  # type: ignore[arg-type]


def test_scale_from_zero_and_the_third_job_waits() -> None:
    assert plan_pool(pool(queued=0), NOW).create is None
    first = plan_pool(pool(queued=3), NOW)
    assert first.desired == 2 and first.create is not None and first.create.count == 2
    booting = MachineView("m1", "booting", NOW - 5, "r1")
    second = plan_pool(pool(booting, booting, queued=3), NOW)
    assert second.create is None and second.current == 2


def test_idle_surplus_drains_longest_idle_first_never_a_busy_one() -> None:
    machines = (
        ready("busy", busy=1),
        ready("short", idle_for=301),
        ready("long", idle_for=900),
        ready("fresh", idle_for=10),
    )
    plan = plan_pool(pool(*machines, shape=Shape(0, 4, True, 0, 1), queued=0), NOW)
    assert plan.desired == 1
    assert [(d.machine, d.reason) for d in plan.drain] == [
        ("long", Reason.IDLE_SURPLUS),
        ("short", Reason.IDLE_SURPLUS),
    ]


def test_empty_queue_scales_to_zero_after_the_idle_timeout() -> None:
    assert plan_pool(pool(ready("m", idle_for=299)), NOW).drain == ()
    assert [d.machine for d in plan_pool(pool(ready("m", idle_for=300)), NOW).drain] == ["m"]


def test_lifetime_revision_boot_timeout_and_silence() -> None:
    plan = plan_pool(
        pool(
            ready("old", busy=1, created_at=NOW - 86400),
            ready("stale", revision="r0", busy=1),
            MachineView("slow", "booting", NOW - 601, "r1"),
            ready("quiet", last_seen_at=NOW - 91),
            MachineView("gone", "draining", NOW - 50, "r1", drained=True),
            shape=Shape(0, 8, True, 0, 1),
        ),
        NOW,
    )
    assert {(d.machine, d.reason) for d in plan.drain} == {
        ("old", Reason.MAX_LIFETIME),
        ("stale", Reason.REVISION_CHANGED),
    }
    assert {(f.machine, f.reason) for f in plan.fail} == {
        ("slow", Reason.BOOT_TIMEOUT),
        ("quiet", Reason.SILENT),
    }
    assert [d.machine for d in plan.destroy] == ["gone"]
    # the two busy machines being replaced still count as busy: two replacements are wanted
    assert plan.busy_slots == 2 and plan.create is not None and plan.create.count == 2


def test_a_failed_machine_is_destroyed_all_the_same() -> None:
    """The Machine pools docs, "Machine lifecycle": a machine that never becomes ready is failed
    instead, "and is destroyed all the same" (its agent reported the failed boot)."""
    plan = plan_pool(pool(MachineView("broken", "failed", NOW - 20, "r1")), NOW)
    assert [(d.machine, d.reason) for d in plan.destroy] == [("broken", Reason.DESTROYED)]
    assert plan.current == 0  # it does not count towards the pool's size


def test_queued_jobs_of_two_slots_get_the_machines_they_need() -> None:
    """The sizing rule's capacity counts the slots queued jobs need: three queued jobs of
    poolSlots 2 on one-slot machines (max 8) need six machines, not three."""
    shape = Shape(0, 8, True, 0, 1)
    assert desired_machines(shape, busy_slots=0, queued=3 * 2) == 6
    assert plan_pool(pool(queued=6, shape=shape), NOW).create == Create("render", 6)


def test_paused_or_open_breaker_creates_nothing() -> None:
    assert plan_pool(pool(queued=2, paused=True), NOW).create is None
    opened = Breaker().failed(NOW).failed(NOW).failed(NOW)
    plan = plan_pool(pool(queued=2, breaker=opened), NOW)
    assert plan.create is None and "breaker open" in plan.notes[0]


machine_lists = st.lists(
    st.builds(
        lambda i, busy, idle, age: MachineView(
            f"m{i}", "ready", NOW - age, "r1", busy, None if busy else NOW - idle, NOW
        ),
        st.integers(0, 10**6),
        st.integers(0, 2),
        st.floats(0, 2000),
        st.floats(0, 90000),
    ),
    max_size=10,
    unique_by=lambda machine: machine.name,
)


@given(machine_lists, st.integers(0, 30), shapes)
def test_a_busy_machine_is_never_drained_for_idleness(
    machines: list[MachineView], queued: int, shape: Shape
) -> None:
    plan = plan_pool(pool(*machines, shape=shape, queued=queued), NOW)
    busy = {machine.name for machine in machines if machine.busy_slots}
    for drained in plan.drain:
        assert drained.machine not in busy or drained.reason != Reason.IDLE_SURPLUS
    # and never below what the pool needs
    idle_drains = sum(1 for d in plan.drain if d.reason == Reason.IDLE_SURPLUS)
    assert plan.current - idle_drains >= min(plan.desired, plan.current)
