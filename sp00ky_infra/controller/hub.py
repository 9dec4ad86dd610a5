"""Wake-ups for waiting long-polls: any thread may notify, the event loop delivers.

One poll waits per machine at a time. A notification for a pool that does not pack wakes
every machine of it that waits (one of them claims the job; the others look, find nothing,
and wait again). A pool that packs (``packJobs``) has its job taken by the machine
``policy.placement`` puts first, and only by it:

- a notification wakes that machine alone, "called": its next look claims;
- any other look (a poll that arrives, a wake-up for a kill) claims only if no waiting
  machine of the pool goes before it (``may_claim``); otherwise it calls that one and waits;
- a look that claimed all it asked for calls the next machine (more work may be due); a
  called look that claimed nothing calls the first machine with more free slots (the job at
  the head of the queue may need them). Each hand-on goes down the order, so it ends.

A full machine's poll is held too (so that a kill reaches it at once) but offers no slot: no
wake-up for work reaches it, and it stands in no order. Its results go beside it, on polls
that answer at once and take work for the slots they free; when one leaves a slot unclaimed,
``freed`` answers the held poll, so that the agent polls again offering it.

Each packing pool keeps its waiting machines in placement order (a heap, each entry the
standing a look learnt; one made stale by a later look or a poll's end is dropped when it comes
to the top), so a call finds the first machine without reading every waiting one.

A waiting poll holds a future of the loop's. A notification made on the loop's own thread
(the store's wake-ups on SQLite: ``Dispatcher.listen``) resolves it at once, and the poll
runs in the loop's next pass; from any other thread it goes through
``call_soon_threadsafe``. (An ``asyncio.Event`` under ``wait_for`` took three passes more,
and the self-pipe's write, on every job's way to its machine.)
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from sp00ky_infra.policy.placement import Rank, Standing, before, first, rank_of


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


@dataclass(slots=True)
class _Poll:
    pool: str
    woken: asyncio.Future[None]
    offers: bool = True  # it offers a free slot; else it waits only for kills, drain, freed
    standing: Standing | None = None  # learnt in its look (``may_claim``); None: looking
    entry: int = -1  # its standing's entry in the pool's order (``_Order``); -1: none


def _never(pool: str) -> bool:
    return False


def _stands(polls: dict[str, _Poll], each: tuple[Rank, int, str]) -> bool:
    poll = polls.get(each[2])
    return poll is not None and poll.entry == each[1]


class _Order:
    """A packing pool's waiting machines that offer a slot, in placement order: a heap of
    (rank, entry, machine), where an entry stands while its poll's ``entry`` is its own."""

    def __init__(self) -> None:
        self.heap: list[tuple[Rank, int, str]] = []

    def add(self, polls: dict[str, _Poll], name: str, entry: int) -> None:
        """Under the hub's lock: the new standing of ``name``'s poll, as ``entry``; the heap
        is rebuilt of its standing entries when the stale ones outnumber the waiting polls."""
        poll = polls[name]
        poll.entry = entry
        standing = poll.standing
        if standing is not None and standing.free_slots > 0:
            rank = rank_of(name, standing.busy_slots, standing.idle_since)
            heapq.heappush(self.heap, (rank, entry, name))
        if len(self.heap) > 2 * len(polls) + 64:
            self.heap = [each for each in self.heap if _stands(polls, each)]
            heapq.heapify(self.heap)

    def first(self, polls: dict[str, _Poll], after: Rank | None = None) -> str | None:
        """Under the hub's lock: the first machine that offers a slot (ranked after ``after``,
        when given); stale entries on the way are dropped."""
        heap, passed, found = self.heap, [], None
        while heap:
            rank, _, name = heap[0]
            if not _stands(polls, heap[0]):
                heapq.heappop(heap)
            elif after is not None and rank <= after:
                passed.append(heapq.heappop(heap))
            else:
                found = name
                break
        for each in passed:
            heapq.heappush(heap, each)
        return found


class Hub:
    def __init__(
        self, loop: asyncio.AbstractEventLoop, packs: Callable[[str], bool] = _never
    ) -> None:
        self.loop = loop
        self.packs = packs  # whether a pool packs its jobs (``packJobs``)
        self._waiting: dict[str, _Poll] = {}  # machine: its waiting poll
        self._pools: dict[str, dict[str, _Poll]] = {}  # the same, by pool
        self._orders: dict[str, _Order] = {}  # a packing pool's offering polls, in order
        self._entries = itertools.count()
        self._called: set[str] = set()  # woken for work: the next look claims
        self._freed: set[str] = set()  # a result posted on its own: the held poll answers
        self._lock = threading.Lock()
        self._loop_thread: int | None = None  # learnt in waiter(), which the loop calls
        self._closed = False  # stopping: every poll is answered at once (close)

    def waiter(self, machine: str, pool: str, offers: bool = True) -> asyncio.Future[None]:
        """Called in the loop before a poll looks for work, so that no wake-up is lost. A poll
        that ``offers`` no free slot (a full machine's, held for its kills) is left out of its
        pool's wake-ups for work and of its placement order."""
        self._loop_thread = threading.get_ident()
        woken = self.loop.create_future()
        if self._closed:
            woken.set_result(None)
        poll = _Poll(pool, woken, offers)
        with self._lock:
            self._waiting[machine] = poll
            self._pools.setdefault(pool, {})[machine] = poll
        return woken

    async def wait(self, woken: asyncio.Future[None], timeout: float) -> None:
        """Until ``woken`` is notified, or ``timeout`` seconds."""
        if woken.done():
            return
        timer = self.loop.call_later(timeout, _wake, woken)
        try:
            await woken
        finally:
            timer.cancel()

    def done(self, machine: str, woken: asyncio.Future[None]) -> None:
        with self._lock:
            found = self._waiting.get(machine)
            if found is not None and found.woken is woken:
                del self._waiting[machine]
                del self._pools[found.pool][machine]

    def freed(self, machine: str) -> None:
        """A result the machine sent beside its held poll freed a slot that nothing claimed
        and the held poll did not offer: that poll (or, if none waits, the next) answers at
        its next look, so that the agent polls again with the slot free."""
        with self._lock:
            self._freed.add(machine)
            waiting = self._waiting.get(machine)
        if waiting is not None:
            self._deliver([waiting.woken])

    def answer_now(self, machine: str) -> bool:
        """Whether a poll of ``machine`` that found nothing answers anyway (``freed``)."""
        with self._lock:
            if machine not in self._freed:
                return False
            self._freed.discard(machine)
            return True

    def waiting_pools(self) -> set[str]:
        """The pools a poll waits in with a free slot to offer."""
        with self._lock:
            return {poll.pool for poll in self._waiting.values() if poll.offers}

    def notify_machine(self, machine: str) -> None:
        with self._lock:
            waiting = self._waiting.get(machine)
        if waiting is not None:
            self._deliver([waiting.woken])

    def notify_pool(self, pool: str) -> None:
        if self.packs(pool):
            with self._lock:
                woken = self._call(pool, self._first(pool))
            self._deliver(woken)
            return
        with self._lock:
            futures = [poll.woken for poll in self._pools.get(pool, {}).values() if poll.offers]
        self._deliver(futures)

    def may_claim(self, pool: str, machine: str, standing: Standing) -> bool:
        """Whether ``machine``, looking for work with ``standing``, claims it now: called,
        or no waiting machine of its pool goes before it. If one does, it is called."""
        packs = self.packs(pool)
        with self._lock:
            found = self._waiting.get(machine)
            if found is not None and found.offers:
                self._stand(found, machine, standing, packs)
            if machine in self._called or not packs:
                return True
            ahead = self._first(pool)
            if ahead is None or not before(ahead, (machine, standing)):
                return True
            woken = self._call(pool, ahead)
        self._deliver(woken)
        return False

    def looked(self, machine: str, pool: str, claimed: int, asked: int) -> None:
        """After a look that claimed ``claimed`` jobs for ``asked`` free slots: hand on."""
        with self._lock:
            called = machine in self._called
            self._called.discard(machine)
            found = self._waiting.get(machine)
            mine = None if found is None else found.standing
            if mine is None or not self.packs(pool):
                return
            woken: list[asyncio.Future[None]] = []
            if claimed and claimed >= asked:  # the next machine in order
                after = rank_of(machine, mine.busy_slots, mine.idle_since)
                woken = self._call(pool, self._first(pool, after))
            elif called and not claimed:  # the first with more free slots (read them all)
                woken = self._call(pool, self._roomier(pool, mine.free_slots))
        self._deliver(woken)

    def _first(self, pool: str, after: Rank | None = None) -> tuple[str, Standing] | None:
        """Under the lock: the first machine of ``pool`` in placement order that waits with
        a free slot (ranked after ``after`` when given), with its standing."""
        polls = self._pools.get(pool, {})
        order = self._orders.get(pool)
        name = None if order is None else order.first(polls, after)
        standing = None if name is None else polls[name].standing
        return None if name is None or standing is None else (name, standing)

    def _roomier(self, pool: str, free_slots: int) -> tuple[str, Standing] | None:
        """Under the lock: the first waiting machine of ``pool`` with more free slots than
        ``free_slots`` (rare: a called look that claimed nothing; every one is read)."""
        roomier = {
            name: poll.standing
            for name, poll in self._pools.get(pool, {}).items()
            if poll.standing is not None and poll.standing.free_slots > free_slots
        }
        chosen = first(roomier.items())
        return None if chosen is None else (chosen, roomier[chosen])

    def _call(self, pool: str, chosen: tuple[str, Standing] | None) -> list[asyncio.Future[None]]:
        """Under the lock: ``chosen`` called (its next look claims); its poll's future, for
        ``_deliver`` once the lock is released (none when nothing was chosen)."""
        if chosen is None:
            return []
        self._called.add(chosen[0])
        return [self._pools[pool][chosen[0]].woken]

    def _stand(self, poll: _Poll, machine: str, standing: Standing, packs: bool) -> None:
        """Under the lock: ``poll``'s standing now, in its packing pool's order."""
        poll.standing = standing
        if packs:
            order = self._orders.setdefault(poll.pool, _Order())
            order.add(self._pools[poll.pool], machine, next(self._entries))

    def restand(self, machine: str, idle_since: float | None) -> None:
        """The tick started or stopped a machine's idle clock: a waiting poll's standing
        follows its row."""
        with self._lock:
            found = self._waiting.get(machine)
            if found is not None and found.standing is not None:
                standing = replace(found.standing, idle_since=idle_since)
                self._stand(found, machine, standing, self.packs(found.pool))

    def close(self) -> None:
        """The controller stops: wake every waiting long-poll now (the controller answers
        them as a standby would), and every later one as soon as it waits, so no held poll
        keeps the server's shutdown waiting."""
        with self._lock:
            self._closed = True
            futures = [poll.woken for poll in self._waiting.values()]
        self._deliver(futures)

    def _deliver(self, futures: list[asyncio.Future[None]]) -> None:
        if threading.get_ident() == self._loop_thread:
            for woken in futures:
                _wake(woken)
            return
        for woken in futures:
            self.loop.call_soon_threadsafe(_wake, woken)
