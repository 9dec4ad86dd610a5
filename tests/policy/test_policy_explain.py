"""explain's reading of the tick's plan, and a pool's bill: pure, from the docs' numbers."""

from __future__ import annotations

import datetime

from sp00ky_infra.policy.breaker import Breaker
from sp00ky_infra.policy.cost import HETZNER_PRICES, pool_bill
from sp00ky_infra.policy.explain import Bake, FailedBoot, Waiting, explain_job, explain_pool
from sp00ky_infra.policy.plan import MachineView, PoolView, plan_pool
from sp00ky_infra.policy.sizing import Shape

NOW = 1_000_000.0


def view(machines: list[MachineView], queued: int, **changes: object) -> PoolView:
    base = dict(
        name="render",
        shape=Shape(min=0, max=2, autoscale=True, buffer=0, slots=2),
        revision="r1",
        machines=machines,
        queued=queued,
        idle_timeout=300.0,
        max_lifetime=86400.0,
        boot_timeout=600.0,
        silence=90.0,
    )
    base.update(changes)
    return PoolView(**base)  # type: ignore[arg-type]


def ready(name: str, busy: int) -> MachineView:
    return MachineView(name, "ready", NOW - 60, "r1", busy_slots=busy, last_seen_at=NOW)


def waiting(**changes: object) -> Waiting:
    base = dict(
        id="j", run_after=NOW - 1, slots=1, ahead=0, head_id="j", head_slots=1, in_flight=0,
        concurrency=None,
    )  # fmt: skip
    base.update(changes)
    return Waiting(**base)  # type: ignore[arg-type]


def codes(job: Waiting, pool: PoolView) -> list[str]:
    return [cause.code for cause in explain_job(job, pool, plan_pool(pool, NOW), NOW)]


def test_a_full_pool_at_max_says_so_with_its_numbers() -> None:
    pool = view([ready("a", 2), ready("b", 2)], queued=3)
    [cause] = explain_job(waiting(ahead=2), pool, plan_pool(pool, NOW), NOW)[1:]
    assert cause.code == "pool_at_max" and cause.facts == {"max": 2, "needed": 4}


def test_head_of_line_names_the_head_and_the_slots() -> None:
    pool = view([ready("a", 1)], queued=2, shape=Shape(1, 1, True, 0, 2))
    found = explain_job(
        waiting(head_id="big", head_slots=2, ahead=1), pool, plan_pool(pool, NOW), NOW
    )
    head = next(cause for cause in found if cause.code == "head_of_line")
    assert head.facts == {"head": "big", "needs": 2, "most_free": 1}


def test_breaker_and_pause_and_delay_each_speak() -> None:
    shut = Breaker(failures=3, opened=1, open_until=NOW + 60)
    pool = view([], queued=1, breaker=shut, paused=True)
    assert codes(waiting(run_after=NOW + 30), pool)[:2] == ["delayed", "paused"]
    assert "breaker_open" in codes(waiting(), pool)
    assert "scaling_up" in codes(waiting(), view([], queued=1))


def test_an_open_breaker_tells_the_last_failed_boots_reason() -> None:
    shut = Breaker(failures=3, opened=1, open_until=NOW + 60)
    pool = view([], queued=1, breaker=shut)
    last = FailedBoot("render-ab12", NOW - 5, "python3: can't open file '/app/wroker.py'")
    [cause] = [
        c for c in explain_job(waiting(), pool, plan_pool(pool, NOW), NOW, last)
        if c.code == "breaker_open"
    ]  # fmt: skip
    assert cause.message.endswith("the last, render-ab12, failed: " + last.reason)
    assert cause.facts["last_failure"] == last.as_json()
    explained = explain_pool(pool, plan_pool(pool, NOW), NOW, last)
    assert explained["last_failed_boot"] == last.as_json()
    assert explained["breaker_failures"] == 3
    # a boot that succeeded since (no failures in a row): the old failure is not told
    healed = view([], queued=1)
    assert explain_pool(healed, plan_pool(healed, NOW), NOW, last)["last_failed_boot"] is None


def test_a_baked_pool_says_what_its_new_machines_boot_and_why() -> None:
    pool = view([], queued=1)
    plan = plan_pool(pool, NOW)
    assert explain_pool(pool, plan, NOW)["bake"] is None
    failed = Bake("failed", "docker-ce", NOW, step="install", reason="apt-get exited 100",
                  retry_at=NOW + 3600)  # fmt: skip
    explained = explain_pool(pool, plan, NOW, bake=failed)
    assert explained["bake"] == {
        "status": "failed", "image": "docker-ce", "since": NOW, "snapshot": None,
        "step": "install", "reason": "apt-get exited 100", "retry_at": NOW + 3600,
    }  # fmt: skip
    retry = datetime.datetime.fromtimestamp(NOW + 3600, datetime.UTC)
    assert explained["notes"][-1] == (
        "machine.image baked: new machines boot the base image docker-ce because its bake failed "
        "at step install (apt-get exited 100); it is tried again at the next deploy or at "
        f"{retry:%Y-%m-%dT%H:%M:%SZ}"
    )
    baked = explain_pool(pool, plan, NOW, bake=Bake("baked", "4711", NOW, snapshot=4711))
    assert baked["notes"][-1] == "machine.image baked: new machines boot its snapshot 4711"
    baking = explain_pool(pool, plan, NOW, bake=Bake("baking", "docker-ce", NOW))
    assert "new machines boot the base image docker-ce until it is made" in baking["notes"][-1]


def test_a_free_slot_means_it_starts_and_none_means_all_are_busy() -> None:
    shape = Shape(min=1, max=3, autoscale=True, buffer=0, slots=2)
    assert codes(waiting(), view([ready("a", 1)], queued=1, shape=shape)) == ["starting"]
    # a job the store sees as due that the tick did not count yet: the pool has what it wants
    assert codes(waiting(), view([ready("a", 2)], queued=0, shape=shape)) == ["no_free_slot"]


def test_explain_pool_is_the_rule_with_its_numbers() -> None:
    pool = view([ready("a", 2), ready("b", 0)], queued=3)
    found = explain_pool(pool, plan_pool(pool, NOW), NOW)
    assert found["rule"] == (
        "capacity = busy 2 + queued 3 + buffer 0 x slots 2 = 5; needed = ceil(5 / 2) = 3; "
        "desired = clamp(3, min 0, max 2) = 2"
    )
    assert [m["reason"] for m in found["machines"]] == [
        "busy: 2 slot(s) running jobs",
        "idle 0s; drained after idleTimeout (300s) if surplus",
    ]


def test_a_pools_bill_is_each_machines_bill_summed_and_its_idle_share() -> None:
    cx33 = HETZNER_PRICES["cx33"]
    bill = pool_bill(cx33, [(1800.0, 900.0), (5400.0, 0.0)], jobs=4)
    assert bill.euros == cx33.hourly * 3  # one started hour, then two
    assert bill.idle_euros == cx33.hourly * 0.5 + cx33.hourly * 2
    assert bill.euros_per_job == bill.euros / 4 and bill.machine_seconds == 7200.0
