"""Two controllers on one store: one leads, the other waits and takes over when it dies."""

from __future__ import annotations

import itertools
import signal
from pathlib import Path

import requests

from tests.controllers import backend_app, two_controllers, wait_for


def test_a_second_controller_stays_passive_then_takes_over_after_kill_9(
    tmp_path: Path, store_url: str
) -> None:
    app = backend_app("render", "render_job", tmp_path / "backend.jsonl")
    with two_controllers(tmp_path, store_url, app) as (first, second, client):
        store = client.store
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
        for write in ("/pools/render/pause", "/pools/render/resume"):  # admin writes: refused
            answer = second.admin("POST", write)
            assert answer.status_code == 503, answer.text
            assert "this controller is a standby" in answer.json()["error"]
        assert not store.pools.state("render").paused
        assert second.admin("GET", "/pools/render").status_code == 200  # reads are served

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
