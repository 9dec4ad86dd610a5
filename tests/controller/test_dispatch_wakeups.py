"""On SQLite the controller's event loop takes the writers' wake-ups itself: a job another
process writes wakes the pool's held poll with no thread in between, and the dispatcher
thread, whose reads are then only a backstop, binds no socket of its own."""

from __future__ import annotations

import asyncio
import os
import select
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import uvloop

from sp00ky_infra.config.loader import load_config
from sp00ky_infra.controller import admin
from sp00ky_infra.controller.core import Controller
from sp00ky_infra.controller.hub import Hub
from sp00ky_infra.controller.server import Dispatcher
from sp00ky_infra.controller.settings import ControllerSettings
from sp00ky_infra.store import NewJob, open_store
from sp00ky_infra.store.dialect import Watcher
from sp00ky_infra.store.sqlite import SqliteStore, WakeSender
from tests.controller.test_controller_executor import Recording
from tests.controllers import backend_app, leading, project

T = TypeVar("T")


def _job(n: int = 0) -> NewJob:
    return NewJob("renderer", "render_job", "/render", {"n": n}, pool="render")


def test_a_watcher_without_wakeups_binds_nothing_and_still_sees_commits(tmp_path: Path) -> None:
    path = str(tmp_path / "state.db")
    writer = SqliteStore(path)
    writer.migrate()
    listener, backstop = writer.watch(), writer.watch(wakeups=False)
    try:
        fd = listener.fileno()
        assert fd is not None and backstop.fileno() is None
        assert len(os.listdir(tmp_path / "state.db.wake")) == 1  # the listener's socket only
        assert select.select([fd], [], [], 0)[0] == []
        writer.enqueue(_job(), time.time())
        assert select.select([fd], [], [], 5)[0] == [fd]  # readable: an event loop wakes
        listener.drain()
        assert select.select([fd], [], [], 0)[0] == []  # drained: nothing left to read
        assert backstop.wait(5) is True  # the backstop's reads find the same commit
        assert backstop.wait(0.02) is False
    finally:
        listener.close()
        backstop.close()
        writer.close()


def test_a_wake_up_names_the_tables_whose_queues_got_work_due_and_any_other_asks_for_a_look(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "state.db")
    writer = SqliteStore(path)
    writer.migrate()
    listener = writer.watch()
    fd = listener.fileno()
    assert fd is not None

    def woken() -> frozenset[str] | bool | None:
        if select.select([fd], [], [], 5)[0] != [fd]:
            return False  # no wake-up at all
        return listener.drain()

    other = NewJob("mailer", "mail_job", "/send", {}, pool="mail")
    try:
        writer.enqueue(_job(), time.time())
        assert woken() == frozenset({"render_job"})
        writer.enqueue_many([_job(), other], time.time())  # one commit, two queues
        assert woken() == frozenset({"render_job", "mail_job"})
        writer.enqueue(_job(), time.time())
        writer.enqueue(other, time.time())  # two commits, drained together
        time.sleep(0.05)
        assert woken() == frozenset({"render_job", "mail_job"})
        later = NewJob("renderer", "render_job", "/render", {}, pool="render", delay_ms=60_000)
        writer.enqueue(later, time.time())  # due in a minute: nothing to wake a poll for now
        assert woken() is None
        (running,) = writer.claim("render_job", 1, "c", time.time(), 60, machine="render-m1")
        writer.kill(running.id, time.time())
        assert woken() is None  # a kill: a look, for the machines with one to deliver
        assert select.select([fd], [], [], 0)[0] == []
    finally:
        listener.close()
        writer.close()


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Controller]:
    apps = {
        "renderer": backend_app("render", "render_job", tmp_path / "log"),
        "mailer": backend_app("mail", "mail_job", tmp_path / "mail.log"),
    }
    pools = {
        "render": {"min": 0, "autoscale": True, "max": 2},
        "mail": {"min": 0, "autoscale": True, "max": 1},
    }
    config = load_config(project(tmp_path, pools, apps))
    store = open_store(f"sqlite:///{tmp_path}/state.db")
    settings = ControllerSettings(secret="s", state_dir=str(tmp_path))
    provisioner = Recording(delivers_join_token=True)
    with leading(Controller(settings, config, store, provisioner)) as made:
        yield made


def _listening(
    controller: Controller, writer: SqliteStore, scenario: Callable[[Hub], Awaitable[T]]
) -> T:
    """``scenario`` on a uvloop loop whose dispatcher takes the store's wake-ups itself (its
    thread never started, so only the loop can wake a poll); the writer closed after."""

    async def listening() -> T:
        loop = asyncio.get_running_loop()
        hub = Hub(loop)
        dispatcher = Dispatcher(controller, hub)
        dispatcher.listen(loop)
        try:
            return await scenario(hub)
        finally:
            dispatcher.stop()

    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(listening())
    finally:
        writer.close()


def test_a_job_another_process_writes_wakes_the_held_poll_from_the_event_loop(
    tmp_path: Path, controller: Controller
) -> None:
    """The dispatcher thread is never started here: only the loop's listener can wake the
    poll. A pool with nothing due stays asleep through a wake-up (a kill, say)."""
    writer = SqliteStore(str(tmp_path / "state.db"))  # the client's connection

    async def scenario(hub: Hub) -> tuple[bool, bool]:
        held = hub.waiter("render-m1", "render")
        admin.set_paused(controller, "render", True)  # a wake-up finds no work
        writer.enqueue(_job(1), time.time())
        await asyncio.sleep(0.3)
        asleep = not held.done()
        admin.set_paused(controller, "render", False)
        writer.enqueue(_job(2), time.time())
        await asyncio.wait_for(held, timeout=5)
        return asleep, held.done()

    asleep, woken = _listening(controller, writer, scenario)
    assert asleep, "a paused pool's poll was woken"
    assert woken
    assert os.listdir(tmp_path / "state.db.wake") == []  # stop() closed the listener


def test_a_kill_another_process_writes_wakes_its_machines_held_poll_from_the_event_loop(
    tmp_path: Path, controller: Controller
) -> None:
    """A kill reaches its machine's held poll from the loop alone (the dispatcher thread is
    never started here), and wakes no other."""
    writer = SqliteStore(str(tmp_path / "state.db"))
    job = writer.enqueue(_job(1), time.time())
    (started,) = writer.claim("render_job", 1, "c", time.time(), 60, machine="render-m1")
    assert started.id == job.id

    async def scenario(hub: Hub) -> tuple[bool, bool, bool]:
        held = hub.waiter("render-m1", "render")
        other = hub.waiter("render-m2", "render")
        await asyncio.sleep(0.05)
        asleep = not held.done()
        writer.kill(job.id, time.time())
        await asyncio.wait_for(held, timeout=5)
        return asleep, held.done(), other.done()

    asleep, woken, other_woken = _listening(controller, writer, scenario)
    assert asleep and woken
    assert not other_woken  # nothing due in the pool: only the killed job's machine wakes


def test_a_look_runs_the_polls_it_woke_before_it_looks_for_kills(
    tmp_path: Path, controller: Controller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job written and a kill, drained in one pass: a look. The pool's held poll resumes
    in the loop's next pass, before the store is read for kills."""
    writer = SqliteStore(str(tmp_path / "state.db"))
    job = writer.enqueue(_job(1), time.time())
    writer.claim("render_job", 1, "c", time.time(), 60, machine="render-m1")
    order: list[str] = []
    cancelling = controller.store.cancelling_machines

    def looked() -> set[str]:
        order.append("kills looked for")
        return cancelling()

    monkeypatch.setattr(controller.store, "cancelling_machines", looked)

    async def scenario(hub: Hub) -> bool:

        async def poll() -> None:
            held = hub.waiter("render-m2", "render")
            await hub.wait(held, 60)
            order.append("poll resumed")

        killed = hub.waiter("render-m1", "render")
        polling = asyncio.create_task(poll())
        await asyncio.sleep(0.05)
        writer.enqueue(_job(2), time.time())  # both datagrams wait for the loop's one read
        writer.kill(job.id, time.time())
        await asyncio.wait_for(polling, timeout=5)
        await asyncio.wait_for(hub.wait(killed, 60), timeout=5)
        return killed.done()

    assert _listening(controller, writer, scenario)
    assert order[:2] == ["poll resumed", "kills looked for"]


def test_a_notification_from_another_thread_wakes_a_held_poll_and_a_timeout_ends_a_wait() -> None:
    async def scenario() -> tuple[float, float, bool]:
        loop = asyncio.get_running_loop()
        hub = Hub(loop)
        quiet = hub.waiter("m0", "p")
        began = loop.time()
        await hub.wait(quiet, 0.05)  # nothing notifies it: its timeout ends the wait
        waited = loop.time() - began
        hub.done("m0", quiet)
        held = hub.waiter("m1", "p")
        other = hub.waiter("m2", "q")
        notifier = threading.Thread(target=hub.notify_pool, args=("p",))
        began = loop.time()
        notifier.start()
        await asyncio.wait_for(hub.wait(held, 60), timeout=5)  # its own timeout: far off
        woken_after = loop.time() - began
        notifier.join()
        hub.done("m1", held)
        return waited, woken_after, other.done()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        waited, woken_after, other_woken = runner.run(scenario())
    assert 0.04 <= waited < 5
    assert woken_after < 1 and not other_woken


def test_a_wake_up_that_names_its_table_wakes_that_pools_polls_without_reading_the_store(
    tmp_path: Path, controller: Controller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job's way to its machine: the wake-up says which queue, so the loop goes straight
    to that pool's held polls (another pool's stay asleep), with no look at the store."""
    writer = SqliteStore(str(tmp_path / "state.db"))
    looks: list[str] = []
    queued = controller.store.queued

    def looking(table: str, *args: Any) -> Any:
        looks.append(table)
        return queued(table, *args)

    monkeypatch.setattr(controller.store, "queued", looking)

    async def scenario(hub: Hub) -> tuple[bool, bool]:
        held = hub.waiter("render-m1", "render")
        elsewhere = hub.waiter("mail-m1", "mail")  # the other pool, its own table
        writer.enqueue(_job(1), time.time())
        await asyncio.wait_for(held, timeout=5)
        await asyncio.sleep(0.05)
        asleep = not elsewhere.done()
        writer.enqueue(NewJob("mailer", "mail_job", "/send", {}, pool="mail"), time.time())
        await asyncio.wait_for(elsewhere, timeout=5)
        return held.done(), asleep

    woken, elsewhere_slept = _listening(controller, writer, scenario)
    assert woken and elsewhere_slept
    assert looks == []


def _fd(watcher: Watcher) -> int:
    fd = watcher.fileno()
    assert fd is not None
    return fd


def test_a_writers_wake_ups_reach_watchers_bound_after_its_first_and_drop_gone_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer keeps its socket and the folder's listing: a watcher bound later is reached
    at once (the folder's mtime changed), or within RESCAN_SECONDS where the mtime could not
    tell (here: the listing made to look current); the socket of a process that died without
    closing it is unlinked."""
    monkeypatch.setattr(WakeSender, "RESCAN_SECONDS", 0.2)
    path = str(tmp_path / "state.db")
    folder = tmp_path / "state.db.wake"
    writer = SqliteStore(path)
    writer.migrate()
    first = writer.watch()
    watchers = [first]
    try:
        writer.enqueue(_job(), time.time())
        assert select.select([_fd(first)], [], [], 5)[0] == [_fd(first)]
        first.drain()

        late = writer.watch()  # bound after the writer listed the folder
        watchers.append(late)
        writer.enqueue(_job(), time.time())
        assert select.select([_fd(late)], [], [], 5)[0] == [_fd(late)]
        late.drain(), first.drain()

        dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)  # a killed process's
        dead.bind(str(folder / "1.0"))
        dead.close()  # its file stays
        writer.enqueue(_job(), time.time())
        assert not (folder / "1.0").exists()
        first.drain(), late.drain()

        unseen = writer.watch()
        watchers.append(unseen)
        writer._waker._listed = (os.stat(folder).st_mtime_ns, time.monotonic())  # looks current
        writer.enqueue(_job(), time.time())
        assert select.select([_fd(unseen)], [], [], 0.1)[0] == []  # not listed yet
        time.sleep(0.25)
        writer.enqueue(_job(), time.time())
        assert select.select([_fd(unseen)], [], [], 5)[0] == [_fd(unseen)]
    finally:
        for watcher in watchers:
            watcher.close()
        writer.close()
