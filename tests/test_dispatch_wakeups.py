"""On SQLite the controller's event loop takes the writers' wake-ups itself: a job another
process writes wakes the pool's held poll with no thread in between, and the dispatcher
thread, whose reads are then only a backstop, binds no socket of its own."""

from __future__ import annotations

import asyncio
import os
import select
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvloop

from sp00ky_infra.config.loader import load_config
from sp00ky_infra.controller import admin
from sp00ky_infra.controller.core import Controller
from sp00ky_infra.controller.hub import Hub
from sp00ky_infra.controller.server import Dispatcher
from sp00ky_infra.controller.settings import ControllerSettings
from sp00ky_infra.store import NewJob, open_store
from sp00ky_infra.store.sqlite import SqliteStore
from tests.controllers import backend_app, leading, project
from tests.test_controller_executor import Recording


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


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Controller]:
    app = backend_app("render", "render_job", tmp_path / "log")
    pools = {"render": {"min": 0, "autoscale": True, "max": 2}}
    config = load_config(project(tmp_path, pools, {"renderer": app}))
    store = open_store(f"sqlite:///{tmp_path}/state.db")
    settings = ControllerSettings(secret="s", state_dir=str(tmp_path))
    provisioner = Recording(delivers_join_token=True)
    with leading(Controller(settings, config, store, provisioner)) as made:
        yield made


def test_a_job_another_process_writes_wakes_the_held_poll_from_the_event_loop(
    tmp_path: Path, controller: Controller
) -> None:
    """The dispatcher thread is never started here: only the loop's listener can wake the
    poll. A pool with nothing due stays asleep through a wake-up (a kill, say)."""
    writer = SqliteStore(str(tmp_path / "state.db"))  # the client's connection

    async def scenario() -> tuple[bool, bool]:
        loop = asyncio.get_running_loop()
        hub = Hub(loop)
        dispatcher = Dispatcher(controller, hub)
        dispatcher.listen(loop)
        try:
            held = hub.waiter("render-m1", "render")
            admin.set_paused(controller, "render", True)  # a wake-up finds no work
            writer.enqueue(_job(1), time.time())
            await asyncio.sleep(0.3)
            asleep = not held.is_set()
            admin.set_paused(controller, "render", False)
            writer.enqueue(_job(2), time.time())
            await asyncio.wait_for(held.wait(), timeout=5)
            return asleep, held.is_set()
        finally:
            dispatcher.stop()

    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            asleep, woken = runner.run(scenario())
    finally:
        writer.close()
    assert asleep, "a paused pool's poll was woken"
    assert woken
    assert os.listdir(tmp_path / "state.db.wake") == []  # stop() closed the listener
