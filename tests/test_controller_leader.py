"""Two controllers on one store: one leads, the other waits and takes over when it dies."""

from __future__ import annotations

import itertools
import signal
from pathlib import Path

import requests

from sp00ky_infra.client import Client
from tests.controllers import (
    ControllerProcess,
    backend_app,
    kill_machines,
    project,
    wait_for,
)


def test_a_second_controller_stays_passive_then_takes_over_after_kill_9(
    tmp_path: Path, store_url: str
) -> None:
    log = tmp_path / "backend.jsonl"
    pools = {"render": {"min": 0, "autoscale": True, "max": 2}}
    config = project(tmp_path, pools, {"renderer": backend_app("render", "render_job", log)})
    client = Client(store_url, config)
    store = client.store
    first = ControllerProcess(tmp_path / "a", config, store_url, {}).start()
    second: ControllerProcess | None = None
    try:
        wait_for(first.leader, what="the first controller leading")
        second = ControllerProcess(tmp_path / "b", config, store_url, {}).start()
        ids = [
            client.run("renderer", "/render", {"gameId": f"g{n}", "seconds": 0.5}).id
            for n in range(6)
        ]
        wait_for(lambda: store.counts()["success"] >= 2, timeout=30, what="the leader at work")
        assert not second.leader()
        refused = requests.post(
            f"{second.agents_url}/v1/join", json={"machine": "m", "token": "t"}, timeout=5
        )
        assert refused.status_code == 503 and "not the leader" in refused.json()["error"]

        first.stop(signal.SIGKILL)
        wait_for(second.leader, timeout=5, what="the second controller taking over")
        more = [
            client.run("renderer", "/render", {"gameId": f"h{n}", "seconds": 0.2}).id
            for n in range(3)
        ]
        wait_for(
            lambda: all(store.get(i).status == "success" for i in ids + more),
            timeout=60,
            what="every job done",
        )
        for job_id in ids + more:  # never two attempts of one job at once
            attempts = store.get(job_id).attempts
            for earlier, later in itertools.pairwise(attempts):
                assert earlier["ended_at"] is not None
                assert earlier["ended_at"] <= later["started_at"]
    finally:
        first.stop()
        if second is not None:
            second.stop()
        kill_machines(store_url)
        client.close()
