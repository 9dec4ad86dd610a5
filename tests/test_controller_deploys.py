"""A deploy replaces machines only for what they run: sizing and timing settings apply to the
machines already there (a real controller restarted with a changed sp00ky.yml)."""

from __future__ import annotations

import time
from pathlib import Path

from sp00ky_infra.client import Client
from tests.controllers import (
    ControllerProcess,
    backend_app,
    kill_machines,
    live_machines,
    project,
    wait_for,
)


def test_changing_sizing_and_timing_settings_keeps_every_machine(tmp_path: Path) -> None:
    store_url = f"sqlite:///{tmp_path}/state.db"
    app = backend_app("render", "render_job", tmp_path / "backend.jsonl")
    before = {"min": 1, "autoscale": True, "max": 2, "idleTimeout": "5m", "maxLifetime": "24h"}
    config = project(tmp_path, {"render": before}, {"renderer": app})
    client = Client(store_url, config)
    store = client.store
    first = ControllerProcess(tmp_path, config, store_url, {}).start()
    try:
        [machine] = wait_for(lambda: live_machines(store, "render", "ready"), what="a machine")
        revision = store.machines.get(machine).revision
        first.stop()  # a deploy: the controller restarts with new sizing and timing settings
        after = {**before, "max": 4, "buffer": 1, "idleTimeout": "15m", "maxLifetime": "48h"}
        project(tmp_path, {"render": after}, {"renderer": app})
        port = first.agents_url.rsplit(":", 1)[1]
        second = ControllerProcess(tmp_path, config, store_url, {"SPKY_POOL_PORT": port}).start()
        try:
            wait_for(second.leader, what="the new controller leading")
            time.sleep(2.0)  # ten ticks at the tests' 200 ms: time enough to drain, if it would
            kept = store.machines.get(machine)
            assert kept.state == "ready" and kept.drain_reason is None
            assert kept.revision == revision
            assert live_machines(store, "render") == [machine]
            job = client.run("renderer", "/render", {"gameId": "after-deploy"})
            done = wait_for(lambda: store.get(job.id).status == "success" and store.get(job.id))
            assert done.machine == machine
        finally:
            second.stop()
    finally:
        first.stop()
        kill_machines(store_url)
        client.close()
