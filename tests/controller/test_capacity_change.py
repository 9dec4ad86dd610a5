"""A deploy that lowers a pool's capacity (the Resource pools docs, "Changing capacity"): the
jobs queued before it drain at the old capacity, new jobs are refused meanwhile with a clear
error, the queued ones keep their admission and attempt number, and once they have left the
queue the pool switches and takes new jobs (a real controller, on SQLite and PostgreSQL)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sp00ky_infra.client import Client
from sp00ky_infra.store.capacity import CapacityChanging
from tests.controllers import backend_app, deploys, live_machines, wait_for


def test_a_lowered_capacity_drains_the_old_queue_first(tmp_path: Path, store_url: str) -> None:
    app = backend_app("render", "render_job", tmp_path / "backend.jsonl")
    wide = {"min": 0, "autoscale": True, "max": 3}
    with deploys(tmp_path, store_url) as deploy:
        first = deploy.start({"render": wide}, {"renderer": app})
        wait_for(first.leader, what="leadership")
        assert first.admin("POST", "/pools/render/pause").status_code == 200
        client = Client(store_url, first.config)
        try:
            queued = [client.run("renderer", "/render", {"gameId": f"g{i}", "seconds": 1.0})
                      for i in range(3)]  # fmt: skip

            second = deploy.start({"render": {**wide, "max": 1}}, {"renderer": app})
            wait_for(second.leader, what="the new controller leading")
            change = second.pool("render")["capacity_change"]
            assert (change["draining_from"], change["slots"]) == (3, 1)
            fresh = Client(store_url, second.config)
            with pytest.raises(CapacityChanging, match="from 3 to 1 slots"):
                fresh.run("renderer", "/render", {"gameId": "refused"})
            for job in queued:  # untouched: the same admission and attempt
                kept = client.store.get(job.id)
                assert (kept.status, kept.attempt_number, kept.created_at) == (
                    "pending", 0, job.created_at,
                )  # fmt: skip

            assert second.admin("POST", "/pools/render/resume").status_code == 200
            wait_for(lambda: len(live_machines(client.store, "render")) == 3,
                     what="the old capacity's machines")  # fmt: skip
            wait_for(lambda: {client.store.get(j.id).status for j in queued} == {"success"},
                     timeout=60, what="the old queue drained")  # fmt: skip
            wait_for(lambda: second.pool("render")["capacity_change"] is None,
                     what="the switch to the lowered capacity")  # fmt: skip
            assert "capacity now 1 slots (was 3)" in second.log()
            after = Client(store_url, second.config)
            done = after.run("renderer", "/render", {"gameId": "after"})
            wait_for(lambda: client.store.get(done.id).status == "success", what="a new job")
            fresh.close()
            after.close()
        finally:
            client.close()
