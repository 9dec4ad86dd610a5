"""Wake-ups for waiting long-polls: any thread may notify, the event loop delivers.

One poll waits per machine at a time; a notification for a pool wakes every machine of it
that waits (one of them claims the job; the others look, find nothing, and wait again).
"""

from __future__ import annotations

import asyncio
import threading


class Hub:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._events: dict[str, asyncio.Event] = {}
        self._pool_of: dict[str, str] = {}
        self._lock = threading.Lock()
        self._closed = False  # stopping: every poll is answered at once (close)

    def waiter(self, machine: str, pool: str) -> asyncio.Event:
        """Called in the loop before a poll looks for work, so that no wake-up is lost."""
        event = asyncio.Event()
        if self._closed:
            event.set()
        with self._lock:
            self._events[machine] = event
            self._pool_of[machine] = pool
        return event

    def done(self, machine: str, event: asyncio.Event) -> None:
        with self._lock:
            if self._events.get(machine) is event:
                del self._events[machine]
                del self._pool_of[machine]

    def waiting_pools(self) -> set[str]:
        with self._lock:
            return set(self._pool_of.values())

    def notify_machine(self, machine: str) -> None:
        with self._lock:
            event = self._events.get(machine)
        if event is not None:
            self.loop.call_soon_threadsafe(event.set)

    def notify_pool(self, pool: str) -> None:
        with self._lock:
            events = [self._events[m] for m, p in self._pool_of.items() if p == pool]
        for event in events:
            self.loop.call_soon_threadsafe(event.set)

    def close(self) -> None:
        """The controller stops: wake every waiting long-poll now (the controller answers
        them as a standby would), and every later one as soon as it waits, so no held poll
        keeps the server's shutdown waiting."""
        with self._lock:
            self._closed = True
            events = list(self._events.values())
        for event in events:
            self.loop.call_soon_threadsafe(event.set)
