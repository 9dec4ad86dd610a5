"""A kill, against the real controller, a real agent and the example backend, at the default
lease and poll wait: the killed job fails with ``cancelled`` and its slot takes the next job
at once, while the machine's other job runs on; the backend sees the killed request's
connection closed."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sp00ky_infra.client import Client
from tests.controllers import (
    backend_app,
    backend_events,
    live_machines,
    project,
    running_controller,
    wait_for,
)
from tests.helpers import cli

TIMINGS = "lease=90s,idleTimeout=60s,bootTimeout=15s"  # the default lease (and poll wait)


def _events(log: Path, event: str, game: str) -> list[dict[str, Any]]:
    return [e for e in backend_events(log) if e["event"] == event and e["gameId"] == game]


def test_a_killed_job_frees_its_slot_for_the_next_at_once_while_the_other_runs_on(
    tmp_path: Path,
) -> None:
    log = tmp_path / "backend.jsonl"
    config = project(
        tmp_path,
        {"render": {"min": 1, "slots": 2, "recycle": "never"}},
        {"renderer": backend_app("render", "render_job", log)},
    )
    store_url = f"sqlite:///{tmp_path}/state.db"
    client = Client(store_url, config)
    with running_controller(tmp_path, config, store_url, SPKY_POOL_TIMINGS=TIMINGS):
        store = client.store
        wait_for(lambda: live_machines(store, "render", "ready"), what="a ready machine")
        killed = client.run("renderer", "/render", {"gameId": "killed", "seconds": 30})
        other = client.run("renderer", "/render", {"gameId": "other", "seconds": 6})
        wait_for(
            lambda: _events(log, "start", "killed") and _events(log, "start", "other"),
            what="both jobs running",
        )
        third = client.run("renderer", "/render", {"gameId": "third", "seconds": 0.1})
        time.sleep(1.5)  # the machine is full: the third job waits
        assert store.get(third.id).status == "pending"

        env = {"SPKY_STORE": store_url, "SPKY_CONFIG": str(config)}
        killing = cli("jobs", "kill", killed.id, env=env)
        assert "kill sent to machine" in killing.stdout, killing.stderr
        kill_at = store.get(killed.id).updated_at  # the kill's write
        started = wait_for(
            lambda: _events(log, "start", "third"), timeout=2, what="the third job started"
        )
        assert started[0]["t"] - kill_at < 2
        done = store.get(killed.id)
        assert done.status == "failed" and done.errors[-1]["code"] == "cancelled"
        assert done.finished_at is not None and done.finished_at - kill_at < 2
        assert store.get(other.id).status == "processing"

        wait_for(lambda: store.get(other.id).status == "success", timeout=20, what="the other")
        wait_for(lambda: store.get(third.id).status == "success", timeout=5, what="the third")
        # the backend saw the killed request's client leave, and stopped its work early
        (closed,) = [e for e in backend_events(log) if e["event"] == "closed"]
        assert closed["gameId"] == "killed" and closed["t"] - kill_at < 2
        assert closed["left"] > 20
        assert not _events(log, "end", "killed")
    client.close()
