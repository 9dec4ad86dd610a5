"""Wake-ups for waiting long-polls: any thread may notify, the event loop delivers.

One poll waits per machine at a time; a notification for a pool wakes every machine of it
that waits (one of them claims the job; the others look, find nothing, and wait again).

A waiting poll holds a future of the loop's. A notification made on the loop's own thread
(the store's wake-ups on SQLite: ``Dispatcher.listen``) resolves it at once, and the poll
runs in the loop's next pass; from any other thread it goes through
``call_soon_threadsafe``. (An ``asyncio.Event`` under ``wait_for`` took three passes more,
and the self-pipe's write, on every job's way to its machine.)
"""

from __future__ import annotations

import asyncio
import threading


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Hub:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._waiting: dict[str, tuple[str, asyncio.Future[None]]] = {}  # machine: pool, poll
        self._lock = threading.Lock()
        self._loop_thread: int | None = None  # learnt in waiter(), which the loop calls
        self._closed = False  # stopping: every poll is answered at once (close)

    def waiter(self, machine: str, pool: str) -> asyncio.Future[None]:
        """Called in the loop before a poll looks for work, so that no wake-up is lost."""
        self._loop_thread = threading.get_ident()
        woken = self.loop.create_future()
        if self._closed:
            woken.set_result(None)
        with self._lock:
            self._waiting[machine] = (pool, woken)
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
            if self._waiting.get(machine, ("", None))[1] is woken:
                del self._waiting[machine]

    def waiting_pools(self) -> set[str]:
        with self._lock:
            return {pool for pool, _ in self._waiting.values()}

    def notify_machine(self, machine: str) -> None:
        with self._lock:
            waiting = self._waiting.get(machine)
        if waiting is not None:
            self._deliver([waiting[1]])

    def notify_pool(self, pool: str) -> None:
        with self._lock:
            futures = [woken for each, woken in self._waiting.values() if each == pool]
        self._deliver(futures)

    def close(self) -> None:
        """The controller stops: wake every waiting long-poll now (the controller answers
        them as a standby would), and every later one as soon as it waits, so no held poll
        keeps the server's shutdown waiting."""
        with self._lock:
            self._closed = True
            futures = [woken for _, woken in self._waiting.values()]
        self._deliver(futures)

    def _deliver(self, futures: list[asyncio.Future[None]]) -> None:
        if threading.get_ident() == self._loop_thread:
            for woken in futures:
                _wake(woken)
            return
        for woken in futures:
            self.loop.call_soon_threadsafe(_wake, woken)
