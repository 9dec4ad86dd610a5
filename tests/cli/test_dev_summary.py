"""dev's summary counts the machines it destroyed, and the machine time of machines an earlier
run left that it reconnected to, not only of those it created."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

from sp00ky_infra.store import open_store
from tests.controllers import wait_for
from tests.dev_process import Dev, example_project, kill_all_in
from tests.prometheus import free_port

SUMMARY = re.compile(
    r"This run: (\d+) machine\(s\) destroyed, machine time (\d+)s \(\S+ pool_machine_hours\) "
    r"of (\d+) machine\(s\)(, (\d+) reconnected from an earlier run)?"
)


def test_a_dev_that_reconnects_counts_the_machines_it_took_over(tmp_path: Path) -> None:
    folder = example_project(tmp_path / "project")
    port = {"SPKY_POOL_PORT": str(free_port()), "SPKY_POOL_SECRET": "the-same-for-both"}
    first = Dev(
        folder, "--burst", "1", "--path", "/render",
        "--payload", '{"gameId": "a", "seconds": 4}', env=port,
    )  # fmt: skip
    second: Dev | None = None
    store = open_store(f"sqlite:///{folder}/.sp00ky/state.db")
    try:
        running = wait_for(
            lambda: [j for j in store.list_jobs(limit=10) if j.status == "processing"],
            timeout=60,
            what="the first run's job running",
        )[0]
        machine = store.machines.get(running.machine or "")
        first.proc.kill()  # the run dies; its machine (own process group) lives on
        first.wait(timeout=10)

        second_started = time.time()
        second = Dev(folder, "--timings", "idleTimeout=60s", env=port)
        second.wait_line("admin API")
        done = wait_for(
            lambda: store.get(running.id).status == "success" and store.get(running.id),
            timeout=60,
            what="the job finishing through the run that reconnected",
        )
        assert done.attempts[-1]["machine"] == machine.name  # the same machine, reconnected
        second.signal(signal.SIGINT)
        assert second.wait(timeout=30) == 0, second.output
        summary = SUMMARY.search(second.output)
        assert summary is not None, second.output
        destroyed, seconds, count, _, again = summary.groups()
        assert (int(destroyed), int(count), again) == (1, 1, "1"), second.output
        row = store.machines.get(machine.name)
        assert row.destroyed_at is not None
        # its whole life, from its creation by the first run
        assert row.created_at < second_started
        assert abs(int(seconds) - (row.destroyed_at - row.created_at)) <= 1, second.output
    finally:
        if second is not None:
            second.stop()
        first.stop()
        store.close()
        kill_all_in(folder)


def test_a_dev_counts_every_machine_it_destroyed_on_the_way(tmp_path: Path) -> None:
    """The machines drained for idleness during the run, none left at the stop: the summary
    still counts them as destroyed (the stop line alone says 0)."""
    folder = example_project(tmp_path / "project")
    dev = Dev(
        folder, "--burst", "2", "--path", "/render",
        "--payload", '{"gameId": "a", "seconds": 1}',
        "--timings", "idleTimeout=1s", "--exit-when-idle",
    )  # fmt: skip
    try:
        assert dev.wait(timeout=120) == 0, dev.output
        assert "dev: stopped; 0 machine(s) destroyed" in dev.output, dev.output
        summary = SUMMARY.search(dev.output)
        assert summary is not None, dev.output
        destroyed, _, count, _, again = summary.groups()
        assert int(destroyed) == int(count) >= 1 and again is None, dev.output
    finally:
        dev.stop()
        kill_all_in(folder)
