"""A result a machine posts on its own frees a slot its held poll did not offer: the hub wakes
that poll, and it answers at its next look even with nothing, so that the agent polls again
with the slot free. A full machine's held poll offers no slot: only its own news wakes it. On
a real event loop, with its futures."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from sp00ky_infra.controller.hub import Hub
from sp00ky_infra.policy.placement import Standing


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def test_a_freed_slot_wakes_the_held_poll_which_answers_once(
    loop: asyncio.AbstractEventLoop,
) -> None:
    hub = Hub(loop)
    held = hub.waiter("m1", "render")
    other = hub.waiter("m2", "render")
    assert not hub.answer_now("m1")  # nothing freed: a look that found nothing waits on
    hub.freed("m1")
    assert held.done() and not other.done()
    assert hub.answer_now("m1")  # its look answers, empty
    hub.done("m1", held)
    assert not hub.answer_now("m1")  # once: the agent's next poll waits as before
    assert not hub.answer_now("m2")


def test_a_slot_freed_with_no_poll_held_answers_the_next_one(
    loop: asyncio.AbstractEventLoop,
) -> None:
    hub = Hub(loop)
    hub.freed("m1")  # the poll that did not offer it is on its way
    woken = hub.waiter("m1", "render")
    assert not woken.done()
    assert hub.answer_now("m1")


@pytest.mark.parametrize("packs", [False, True])
def test_a_full_machine_s_held_poll_waits_for_its_own_news_only(
    loop: asyncio.AbstractEventLoop, packs: bool
) -> None:
    """A held poll that offers no slot is woken by its kills and its freed slots, never by
    its pool's work: a poll beside it that looks stands it in no placement order."""
    hub = Hub(loop, packs=lambda pool: packs)
    full = hub.waiter("m1", "render", offers=False)
    assert hub.waiting_pools() == set()
    # a poll beside it claims (packing: nobody waits before it), and m1 stays out of the order
    assert hub.may_claim("render", "m1", Standing(1, None, 1))
    offering = hub.waiter("m2", "render")
    assert hub.may_claim("render", "m2", Standing(0, 100.0, 1))
    assert hub.waiting_pools() == {"render"}
    hub.notify_pool("render")
    assert offering.done() and not full.done()
    hub.notify_machine("m1")  # a kill
    assert full.done()
    hub.done("m1", full)
    again = hub.waiter("m1", "render", offers=False)
    hub.freed("m1")
    assert again.done() and hub.answer_now("m1")
