"""A deploy replaces machines only for what they run: sizing and timing settings apply to the
machines already there (a real controller restarted with a changed sp00ky.yml)."""

from __future__ import annotations

import time
from pathlib import Path

from sp00ky_infra.client import Client
from tests.controllers import backend_app, deploys, live_machines, wait_for


def test_changing_sizing_and_timing_settings_keeps_every_machine(tmp_path: Path) -> None:
    store_url = f"sqlite:///{tmp_path}/state.db"
    app = backend_app("render", "render_job", tmp_path / "backend.jsonl")
    before = {"min": 1, "autoscale": True, "max": 2, "idleTimeout": "5m", "maxLifetime": "24h"}
    # A lease longer than a restart on a loaded machine: a machine that did not poll for a
    # lease counts as silent, and the test is about the revision, not about silence.
    timings = {"SPKY_POOL_TIMINGS": "lease=12s,idleTimeout=2s,bootTimeout=15s"}
    with deploys(tmp_path, store_url, timings) as deploy:
        first = deploy.start({"render": before}, {"renderer": app})
        client = Client(store_url, first.config)
        store = client.store
        [machine] = wait_for(lambda: live_machines(store, "render", "ready"), what="a machine")
        revision = store.machines.get(machine).revision
        # a deploy: the controller restarts with new sizing and timing settings
        after = {**before, "max": 4, "buffer": 1, "idleTimeout": "15m", "maxLifetime": "48h"}
        second = deploy.start({"render": after}, {"renderer": app})
        wait_for(second.leader, what="the new controller leading")
        led = time.time()
        time.sleep(2.0)  # ten ticks at the tests' 200 ms: time enough to drain, if it would
        # The agent lost its controller during the restart and retries with backoff (up to
        # 10 s): a job queued before it polls again would go to the machine the buffer adds.
        wait_for(
            lambda: (store.machines.get(machine).last_seen_at or 0) > led,
            what="the kept machine polling the new controller",
        )
        kept = store.machines.get(machine)
        assert kept.state == "ready" and kept.drain_reason is None
        assert kept.revision == revision
        assert live_machines(store, "render") == [machine]
        job = client.run("renderer", "/render", {"gameId": "after-deploy"})
        done = wait_for(lambda: store.get(job.id).status == "success" and store.get(job.id))
        assert done.machine == machine
        client.close()
