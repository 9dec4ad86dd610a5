"""A packing pool's work is claimed by the machine the placement puts first, and only by it:
the hub wakes that one alone, a look by any other leaves the work to it, and a look that
claimed hands on down the order. On a real event loop, with its futures."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from dataclasses import replace

import pytest

from sp00ky_infra.controller.hub import Hub
from sp00ky_infra.policy.placement import Standing, first, rank_of


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


class Pool:
    """Machines of one pool holding polls on ``hub``, each after a look with its standing."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.polls: dict[str, asyncio.Future[None]] = {}

    def wait(self, name: str, standing: Standing) -> bool:
        """A poll's pass: registered, it looks (``may_claim``); then it waits."""
        self.polls[name] = self.hub.waiter(name, "render")
        return self.hub.may_claim("render", name, standing)

    def woken(self) -> set[str]:
        return {name for name, poll in self.polls.items() if poll.done()}

    def again(self, name: str, standing: Standing) -> bool:
        """The woken poll's next pass."""
        self.hub.done(name, self.polls[name])
        return self.wait(name, standing)


IDLE_LONG, IDLE_LATELY, JUST_DONE = (
    Standing(0, 100.0, 1),
    Standing(0, 500.0, 1),
    Standing(0, None, 1),
)


def test_a_notification_wakes_the_machine_that_worked_last_alone(
    loop: asyncio.AbstractEventLoop,
) -> None:
    hub = Hub(loop, packs=lambda pool: True)
    pool = Pool(hub)
    assert pool.wait("a", IDLE_LONG)  # nobody waits before it
    assert pool.wait("b", IDLE_LATELY)  # it goes before a
    hub.notify_pool("render")
    assert pool.woken() == {"b"}
    assert pool.again("b", IDLE_LATELY)  # called: it claims
    hub.looked("b", "render", claimed=1, asked=1)  # it took all it asked: more may be due
    assert pool.woken() == {"a"}


def test_a_look_by_a_later_machine_leaves_the_work_to_the_first(
    loop: asyncio.AbstractEventLoop,
) -> None:
    hub = Hub(loop, packs=lambda pool: True)
    pool = Pool(hub)
    pool.wait("a", IDLE_LONG)
    pool.wait("b", IDLE_LATELY)
    pool.polls["a"].set_result(None)  # a's poll ran out: it arrives again, it looks
    assert not pool.again("a", IDLE_LONG)  # b goes first: a claims nothing ...
    assert pool.woken() == {"b"} and pool.again("b", IDLE_LATELY)  # ... and b is called
    hub.looked("b", "render", claimed=0, asked=1)  # nothing was due after all: no hand-on
    assert pool.woken() == set()


def test_the_tick_s_idle_clock_reorders_the_waiting_machines(
    loop: asyncio.AbstractEventLoop,
) -> None:
    hub = Hub(loop, packs=lambda pool: True)
    pool = Pool(hub)
    pool.wait("b", IDLE_LATELY)
    pool.wait("a", JUST_DONE)
    hub.restand("a", 50.0)  # a had finished before b: the tick says so
    hub.notify_pool("render")
    assert pool.woken() == {"b"}


def test_a_called_machine_that_cannot_take_the_head_job_calls_a_roomier_one(
    loop: asyncio.AbstractEventLoop,
) -> None:
    hub = Hub(loop, packs=lambda pool: True)
    pool = Pool(hub)
    pool.wait("roomy", Standing(0, 100.0, 2))
    pool.wait("fuller", Standing(1, None, 1))
    hub.notify_pool("render")
    assert pool.woken() == {"fuller"} and pool.again("fuller", Standing(1, None, 1))
    hub.looked("fuller", "render", claimed=0, asked=1)  # the head job needs two slots
    assert pool.woken() == {"roomy"}
    assert pool.again("roomy", Standing(0, 100.0, 2))  # called: it claims, though later


def test_a_pool_that_does_not_pack_wakes_every_waiting_machine(
    loop: asyncio.AbstractEventLoop,
) -> None:
    hub = Hub(loop)
    pool = Pool(hub)
    assert pool.wait("a", IDLE_LONG) and pool.wait("b", IDLE_LATELY) and pool.wait("c", JUST_DONE)
    hub.notify_pool("render")
    assert pool.woken() == {"a", "b", "c"}
    assert pool.again("a", IDLE_LONG)  # whoever runs first claims


def test_the_kept_order_finds_the_machine_a_read_of_every_waiting_one_would(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Hundreds of machines: polls arriving with new standings, ending, idle clocks moved by
    the tick; after each, the first machine (and the first after any machine's rank) is the
    one placement finds reading every waiting machine."""
    hub = Hub(loop, packs=lambda pool: True)
    rng = random.Random(7)
    polls: dict[str, asyncio.Future[None]] = {}
    standings: dict[str, Standing] = {}
    names = [f"m{n:03d}" for n in range(300)]

    def idle() -> float | None:
        return rng.choice([None, float(rng.randint(0, 99))])

    for _ in range(3000):
        name, action = rng.choice(names), rng.random()
        if action < 0.5:  # its poll arrives, looks and waits
            if name in polls:
                hub.done(name, polls[name])
            polls[name] = hub.waiter(name, "render")
            standings[name] = Standing(rng.randint(0, 2), idle(), rng.randint(0, 2))
            hub.may_claim("render", name, standings[name])
        elif name in polls and action < 0.7:  # its poll ends
            hub.done(name, polls.pop(name))
            del standings[name]
        elif name in polls:  # the tick moved its idle clock
            since = idle()
            hub.restand(name, since)
            standings[name] = replace(standings[name], idle_since=since)
        expected = first(standings.items())
        found = hub._first("render")
        assert (found and found[0]) == expected
        pivot = rng.choice(names)
        after = rank_of(pivot, 1, 50.0)
        later = [
            (n, s) for n, s in standings.items() if rank_of(n, s.busy_slots, s.idle_since) > after
        ]
        found = hub._first("render", after)
        assert (found and found[0]) == first(later)
