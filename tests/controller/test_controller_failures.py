"""When things go wrong, with real processes: a machine dies, the controller dies, boots fail."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path

from sp00ky_infra.client import Client
from sp00ky_infra.controller.provisioners.local import session_members
from tests.controllers import (
    ControllerProcess,
    backend_app,
    backend_events,
    deploys,
    kill_machines,
    live_machines,
    project,
    running_controller,
    wait_for,
)

RENDER = {"min": 0, "autoscale": True, "max": 2}


def test_kill_9_of_an_agent_mid_job_runs_the_attempt_again_after_the_lease(tmp_path: Path) -> None:
    store_url = f"sqlite:///{tmp_path}/state.db"
    log = tmp_path / "backend.jsonl"
    config = project(
        tmp_path, {"render": RENDER}, {"renderer": backend_app("render", "render_job", log)}
    )
    client = Client(store_url, config)
    store = client.store
    with running_controller(tmp_path, config, store_url):
        job_id = client.run("renderer", "/render", {"gameId": "g", "seconds": 2}).id
        first = wait_for(lambda: store.get(job_id).machine, what="the job running")
        wait_for(
            lambda: any(e["event"] == "start" for e in backend_events(log)), what="backend got it"
        )
        agent_pid = int(store.machines.get(first).provider_id or 0)
        os.kill(agent_pid, signal.SIGKILL)  # the agent dies; its backend is orphaned
        done = wait_for(
            lambda: store.get(job_id).status == "success" and store.get(job_id), timeout=30
        )
        assert done.attempt_number == 2 and done.machine != first
        assert [e["code"] for e in done.errors] == ["lease_expired"]
        assert done.retries == 1  # it counted against max_retries
        dead = wait_for(
            lambda: store.machines.get(first).state == "destroyed" and store.machines.get(first),
            what="the dead machine destroyed",
        )
        assert dead.failed_reason == "silent"
        assert session_members(agent_pid) == []  # its orphaned backend went with it
    client.close()


def test_kill_9_of_the_controller_under_load_loses_nothing_and_runs_each_job_once(
    tmp_path: Path,
) -> None:
    store_url = f"sqlite:///{tmp_path}/state.db"
    log = tmp_path / "backend.jsonl"
    pools = {"render": {"min": 0, "autoscale": True, "max": 3, "slots": 2}}
    config = project(tmp_path, pools, {"renderer": backend_app("render", "render_job", log)})
    client = Client(store_url, config)
    store = client.store
    # A lease longer than a restart on a loaded machine: an agent cut off for a whole lease
    # gives its jobs up (they run again, rightly), and this test is about the restart alone.
    timings = {"SPKY_POOL_TIMINGS": "lease=30s,idleTimeout=2s,bootTimeout=15s"}
    first = ControllerProcess(tmp_path, config, store_url, timings).start()
    try:
        ids = [
            client.run("renderer", "/render", {"gameId": f"g{n:02d}", "seconds": 0.4}).id
            for n in range(24)
        ]
        wait_for(lambda: store.counts()["success"] >= 4, timeout=30, what="jobs under way")
        first.stop(signal.SIGKILL)  # mid-run: jobs running, results in flight
        time.sleep(1.0)
        # machines reach their controller at a fixed address: restart on the same port
        port = first.agents_url.rsplit(":", 1)[1]
        second = ControllerProcess(
            tmp_path, config, store_url, {**timings, "SPKY_POOL_PORT": port}
        ).start()
        try:
            wait_for(
                lambda: all(store.get(i).status == "success" for i in ids),
                timeout=60,
                what="all jobs",
            )
            starts = Counter(e["gameId"] for e in backend_events(log) if e["event"] == "start")
            assert starts == {f"g{n:02d}": 1 for n in range(24)}  # the backend saw each once
            assert {store.get(i).attempt_number for i in ids} == {1}
        finally:
            second.stop()
    finally:
        first.stop()
        kill_machines(store_url)
        client.close()


def test_the_breaker_opens_after_three_failed_boots_and_closes_after_a_good_one(
    tmp_path: Path,
) -> None:
    store_url = f"sqlite:///{tmp_path}/state.db"
    log = tmp_path / "backend.jsonl"
    allow = tmp_path / "backend-may-start"
    # The backend exits at once until the file exists, then starts for real.
    command = [
        sys.executable,
        "-c",
        f"import os, runpy, sys; os.path.exists({str(allow)!r}) or sys.exit(3); "
        f"sys.argv = ['server']; runpy.run_path({str(backend_app.__globals__['SERVER'])!r}, "
        "run_name='__main__')",
    ]
    pools = {"render": {"min": 1}}
    config = project(
        tmp_path, pools, {"renderer": backend_app("render", "render_job", log, command)}
    )
    client = Client(store_url, config)
    store = client.store
    env = {"SPKY_BREAKER_PAUSE": "2s", "SPKY_BREAKER_MAX_PAUSE": "15s"}
    with running_controller(tmp_path, config, store_url, **env) as controller:
        incident = wait_for(
            lambda: controller.pool("render")["incidents"], timeout=30, what="an incident"
        )[0]
        assert incident["kind"] == "pool_breaker_open"
        assert "3 failed boots in a row" in incident["message"]
        view = controller.pool("render")
        assert view["breaker"]["open"] and view["breaker"]["failures"] >= 3
        failed = [m for m in store.machines.recent("render") if m.failed_reason]
        assert len(failed) >= 3 and "exited before it was ready" in (failed[0].failed_reason or "")
        opened_at = time.monotonic()
        # while open, no new machine is asked for
        time.sleep(1.0)
        assert all(m.state in ("failed", "destroyed") for m in store.machines.recent("render"))
        allow.touch()
        wait_for(
            lambda: len(live_machines(store, "render", "ready")) == 1, timeout=30, what="ready"
        )
        assert time.monotonic() - opened_at >= 1.5  # the pause was honoured
        closed = controller.pool("render")
        assert not closed["breaker"]["open"] and closed["breaker"]["failures"] == 0
        assert closed["incidents"] == []
        incidents = controller.admin("GET", "/incidents").json()
        assert incidents[0]["closed_at"] is not None
    client.close()


def test_a_changed_config_replaces_machines_without_interrupting_a_job(tmp_path: Path) -> None:
    store_url = f"sqlite:///{tmp_path}/state.db"
    log = tmp_path / "backend.jsonl"
    app = backend_app("render", "render_job", log)
    # The lease outlasts a controller restart on a loaded machine (the agent gives a job up a
    # margin before its lease can expire, and a restart takes seconds): a deploy never
    # interrupts a job.
    timings = {"SPKY_POOL_TIMINGS": "lease=12s,idleTimeout=2s,bootTimeout=15s"}
    with deploys(tmp_path, store_url, timings) as deploy:
        first = deploy.start({"render": {"min": 1}}, {"renderer": app})
        client = Client(store_url, first.config)
        store = client.store
        old = wait_for(lambda: live_machines(store, "render", "ready"), what="a machine")[0]
        job_id = client.run("renderer", "/render", {"gameId": "long", "seconds": 4}).id
        wait_for(lambda: store.get(job_id).status == "processing", what="the job running")
        # a deploy: the controller restarts with a new env for the backend
        app["env"]["RENDER_QUALITY"] = "ultra"
        deploy.start({"render": {"min": 1}}, {"renderer": app})
        wait_for(lambda: store.machines.get(old).state == "draining", what="old machine draining")
        assert store.machines.get(old).drain_reason == "revision_changed"
        new = wait_for(
            lambda: [m for m in live_machines(store, "render", "ready") if m != old],
            timeout=20,
            what="a replacement",
        )
        assert store.machines.get(new[0]).revision != store.machines.get(old).revision
        done = wait_for(
            lambda: store.get(job_id).status == "success" and store.get(job_id), timeout=20
        )
        assert done.attempt_number == 1 and done.machine == old  # never interrupted
        wait_for(lambda: store.machines.get(old).state == "destroyed", timeout=20, what="old gone")
        client.close()
