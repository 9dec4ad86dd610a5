"""Stopping. Held long-polls are answered at once; dev's first Ctrl-C (or
SIGTERM, or SIGHUP) drains with a line of progress, a second one aborts, destroys every
machine and puts the running attempts back in the queue without spending a retry."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from sp00ky_infra.controller.stopping import STOPPED
from sp00ky_infra.store import open_store
from tests.controllers import backend_app, project, running_controller, wait_for
from tests.dev_process import Dev, example_project, kill_all_in, processes_in


def test_a_controller_with_warm_idle_machines_stops_without_waiting_for_their_polls(
    tmp_path: Path,
) -> None:
    config = project(
        tmp_path,
        {"render": {"min": 1}},
        {"renderer": backend_app("render", "render_job", tmp_path / "backend.jsonl")},
    )
    store_url = f"sqlite:///{tmp_path}/state.db"
    # a 60 s lease: each idle machine holds a 20 s long-poll, the longest there is
    with running_controller(
        tmp_path, config, store_url, SPKY_POOL_TIMINGS="lease=60s,bootTimeout=15s"
    ) as controller:
        wait_for(
            lambda: controller.pool("render")["machines"].get("ready") == 1,
            what="a ready machine",
        )
        time.sleep(1.0)  # its agent is now waiting in a poll
        assert controller.proc is not None
        began = time.monotonic()
        controller.proc.send_signal(signal.SIGTERM)
        assert controller.proc.wait(timeout=8) == 0  # before: ~19 s, the poll's own wait
        print(f"controller stopped {time.monotonic() - began:.2f}s after SIGTERM")


def test_dev_with_a_warm_idle_machine_stops_at_once(tmp_path: Path) -> None:
    folder = example_project(tmp_path / "project")
    dev = Dev(
        folder, "--burst", "1", "--path", "/render", "--payload", '{"gameId": "w"}',
        "--timings", "lease=60s,idleTimeout=60s",
    )  # fmt: skip
    try:
        dev.wait_line(r"render destroyed|succeeded|is ready", timeout=60)
        store = open_store(f"sqlite:///{folder}/.sp00ky/state.db")
        try:
            wait_for(lambda: store.counts()["success"] == 1, timeout=60, what="the job done")
        finally:
            store.close()
        time.sleep(1.0)  # the idle machine waits in a 20 s poll
        began = time.monotonic()
        dev.signal(signal.SIGINT)
        assert dev.wait(timeout=10) == 0, dev.output
        print(f"dev stopped {time.monotonic() - began:.2f}s after Ctrl-C")
        assert "dev: stopped; 1 machine(s) destroyed" in dev.output
        assert processes_in(folder) == []
    finally:
        dev.stop()
        kill_all_in(folder)


@pytest.mark.parametrize("first", [signal.SIGINT, signal.SIGHUP], ids=["ctrl-c", "hangup"])
def test_dev_first_signal_lets_the_running_job_finish(tmp_path: Path, first: int) -> None:
    folder = example_project(tmp_path / "project")
    dev = Dev(
        folder, "--burst", "1", "--path", "/render",
        "--payload", '{"gameId": "d", "seconds": 4}', "--timings", "lease=30s",
    )  # fmt: skip
    store = open_store(f"sqlite:///{folder}/.sp00ky/state.db")
    try:
        job = wait_for(
            lambda: next(iter(store.list_jobs(status="processing")), None),
            timeout=60,
            what="the job running",
        )
        dev.signal(first)
        dev.wait_line(r"^stopping: 1 machine, 1 job running", timeout=10)
        assert dev.wait(timeout=30) == 0, dev.output
        done = store.get(job.id)
        assert done.status == "success" and len(done.attempts) == 1, done
        assert "dev: stopped; 1 machine(s) destroyed" in dev.output
        assert "1 of 1 job(s) succeeded" in dev.output
        assert store.machines.live() == []
        assert processes_in(folder) == []
    finally:
        dev.stop()
        store.close()
        kill_all_in(folder)


def test_dev_second_ctrl_c_aborts_destroys_and_requeues_without_a_retry(tmp_path: Path) -> None:
    folder = example_project(tmp_path / "project")
    dev = Dev(
        folder, "--burst", "2", "--path", "/render",
        "--payload", '{"gameId": "x", "seconds": 60}', "--timings", "lease=30s",
    )  # fmt: skip
    store = open_store(f"sqlite:///{folder}/.sp00ky/state.db")
    try:
        wait_for(
            lambda: len(store.list_jobs(status="processing")) == 2,
            timeout=60,
            what="both jobs running",
        )
        dev.signal(signal.SIGINT)
        dev.wait_line(r"^stopping: 2 machines, 2 jobs running", timeout=10)
        began = time.monotonic()
        dev.signal(signal.SIGINT)
        assert dev.wait(timeout=15) == 130, dev.output
        print(f"dev aborted {time.monotonic() - began:.2f}s after the second Ctrl-C")
        assert "aborted: 2 machine(s) destroyed, 2 job(s) back in the queue" in dev.output
        assert processes_in(folder) == []  # no agent, no backend left
        assert store.machines.live() == []
        for job in store.list_jobs():
            assert job.status == "pending" and job.retries == 0, job
            assert not job.errors
            assert job.attempts[-1]["outcome"] == STOPPED and job.attempts[-1]["ended_at"]
            assert job.run_after <= time.time()  # due now, not after a lease or a backoff
    finally:
        dev.stop()
        store.close()
        kill_all_in(folder)
