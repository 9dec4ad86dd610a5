"""Which machine takes the next job, and when an idle machine whose hours are paid goes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sp00ky_infra.config.model import Pool
from sp00ky_infra.policy.breaker import Breaker
from sp00ky_infra.policy.cost import HOUR, Billing
from sp00ky_infra.policy.placement import Standing, before, first, packed
from sp00ky_infra.policy.plan import MachineView, Reason, plan_pool, pool_view


def test_the_fullest_machine_then_the_latest_to_work_then_the_name_goes_first() -> None:
    machines = [
        ("idle-long", Standing(0, 100.0, 1)),
        ("idle-lately", Standing(0, 500.0, 1)),
        ("just-done", Standing(0, None, 1)),
        ("half-full", Standing(1, None, 1)),
        ("full", Standing(2, None, 0)),  # offers no slot: never offered work
        ("b-same", Standing(0, 100.0, 1)),
    ]
    assert packed(machines) == ["half-full", "just-done", "idle-lately", "b-same", "idle-long"]
    assert first(machines) == "half-full"
    assert first([("full", Standing(2, None, 0))]) is None
    assert before(("just-done", Standing(0, None, 1)), ("idle-lately", Standing(0, 500.0, 1)))
    assert not before(("idle-long", Standing(0, 100.0, 1)), ("b-same", Standing(0, 100.0, 1)))


def test_each_started_hour_is_paid_and_the_drain_comes_in_its_last_minutes() -> None:
    billing = Billing(hour=HOUR, margin=120.0)
    assert billing.paid_until(1000.0, 1000.0) == 1000.0 + HOUR  # created: one hour paid
    assert billing.paid_until(1000.0, 1000.0 + HOUR) == 1000.0 + 2 * HOUR  # a second began
    assert not billing.drain_due(0.0, HOUR - 121.0)
    assert billing.drain_due(0.0, HOUR - 120.0) and billing.drain_due(0.0, HOUR - 1.0)
    assert not billing.drain_due(0.0, HOUR + 1.0)  # missed: the next hour is paid, keep it


def test_the_margin_covers_the_drain_and_the_destroy_twice() -> None:
    hetzner = Billing.of("hetzner", tick=2.0)
    assert hetzner.margin == 2 * (2 * 2.0 + 1.0 + 60.0) and hetzner.hour == HOUR
    assert Billing.of("local", tick=0.2, hour=20.0).margin == pytest.approx(4.8)
    assert Billing.of("hetzner", tick=2.0, hour=60.0).margin == 15.0  # a quarter


POOL = Pool("render", min=1, max=4, autoscale=True, idle_timeout=300.0)


def _ready(name: str, created: float, idle_since: float | None, busy: int = 0) -> MachineView:
    return MachineView(name, "ready", created, "r1", busy, idle_since)


def _drains(
    pool: Pool, machines: list[MachineView], now: float, billing: Billing | None
) -> set[str]:
    view = pool_view(pool.name, pool, "r1", machines, 0, Breaker(), billing=billing)
    return {d.machine for d in plan_pool(view, now).drain if d.reason == Reason.IDLE_SURPLUS}


def test_an_idle_surplus_machine_stays_until_its_paid_hour_ends() -> None:
    billing = Billing(HOUR, 120.0)
    busy = _ready("busy", 0.0, None, busy=1)
    machines = [busy, _ready("a", 0.0, 600.0), _ready("b", 1800.0, 600.0)]
    # idle 20 minutes, past idleTimeout: kept, their hours run to 3600 and 5400
    assert _drains(POOL, machines, 2000.0, billing) == set()
    assert _drains(POOL, machines, 3500.0, billing) == {"a"}  # a's hour ends within 120 s
    assert _drains(POOL, machines, 5300.0, billing) == {"b"}  # a missed it: its 2nd hour paid
    # without billing, or with keepPaidHours off, both go at idleTimeout, longest idle first
    assert _drains(POOL, machines, 2000.0, None) == {"a", "b"}
    off = replace(POOL, keep_paid_hours=False)
    assert _drains(off, machines, 2000.0, billing) == {"a", "b"}


def test_the_seeds_rule_still_holds_when_hours_are_kept() -> None:
    billing = Billing(HOUR, 120.0)
    # not idle for idleTimeout yet, though its hour ends: kept
    assert (
        _drains(POOL, [_ready("a", 0.0, 3400.0), _ready("b", 0.0, 3400.0)], 3500.0, billing)
        == set()
    )
    # never below min (1): of two idle machines whose hours end, one goes
    both = [_ready("a", 0.0, 100.0), _ready("b", 0.0, 200.0)]
    assert _drains(POOL, both, 3500.0, billing) == {"a"}  # the longest idle
    # never a busy one
    assert (
        _drains(
            POOL, [_ready("a", 0.0, None, busy=1), _ready("b", 0.0, None, busy=1)], 3500.0, billing
        )
        == set()
    )
