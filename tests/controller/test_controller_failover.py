"""A failover acts on the store's pool state, not on the copy the new leader read at start.

Controller B starts (and reads the pools' state) while A leads; A then pauses a pool, or opens
its breaker; A dies (kill -9) and B takes over. B must honour what A decided.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from tests.controllers import ControllerProcess, backend_app, two_controllers, wait_for

TICKS = 2.0  # ten ticks of 200 ms: long enough for a leader to create a machine if it would


def take_over(first: ControllerProcess, second: ControllerProcess) -> None:
    first.stop(signal.SIGKILL)
    wait_for(second.leader, timeout=10, what="B taking over")
    time.sleep(TICKS)


def test_a_pool_paused_on_the_leader_stays_paused_after_a_failover(
    tmp_path: Path, store_url: str
) -> None:
    app = backend_app("render", "render_job", tmp_path / "backend.jsonl")
    with two_controllers(tmp_path, store_url, app) as (first, second, client):
        store = client.store
        assert not second.leader()
        assert first.admin("POST", "/pools/render/pause").json()["paused"]
        job_id = client.run("renderer", "/render", {"gameId": "g", "seconds": 0}).id
        time.sleep(TICKS)
        assert store.machines.recent("render") == []  # paused on A: nothing created

        take_over(first, second)
        assert second.pool("render")["paused"]
        assert store.machines.recent("render") == []  # B creates no machine either
        assert store.get(job_id).status == "pending"

        assert not second.admin("POST", "/pools/render/resume").json()["paused"]
        wait_for(
            lambda: store.get(job_id).status == "success", timeout=60, what="the job after resume"
        )


def test_a_breaker_opened_on_the_leader_stays_open_after_a_failover(
    tmp_path: Path, store_url: str
) -> None:
    exits_at_once = [sys.executable, "-c", "import sys; sys.exit(3)"]  # every boot fails
    app = backend_app("render", "render_job", tmp_path / "backend.jsonl", exits_at_once)
    env = {"SPKY_BREAKER_PAUSE": "10m", "SPKY_BREAKER_MAX_PAUSE": "15m"}
    with two_controllers(tmp_path, store_url, app, env) as (first, second, client):
        store = client.store
        assert not second.leader()
        job_id = client.run("renderer", "/render", {"gameId": "g", "seconds": 0}).id
        incident = wait_for(
            lambda: first.pool("render")["incidents"], timeout=60, what="A's breaker opening"
        )[0]
        assert "3 failed boots in a row" in incident["message"]
        assert first.pool("render")["breaker"]["open"]
        time.sleep(TICKS)
        tried = {machine.name for machine in store.machines.recent("render")}
        assert len(tried) == 3  # then A stopped creating machines

        take_over(first, second)
        view = second.pool("render")
        assert view["breaker"]["open"] and view["breaker"]["failures"] == 3
        assert [i["kind"] for i in view["incidents"]] == ["pool_breaker_open"]
        assert {machine.name for machine in store.machines.recent("render")} == tried
        assert store.get(job_id).status == "pending"
