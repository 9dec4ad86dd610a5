"""The leader's sweep of the project's servers (controller/sweep.py) against the fake Hetzner
API over loopback: what it deletes and what it leaves, checked on the cloud's own list, and
its count in /metrics."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sp00ky_infra.config.loader import load_config
from sp00ky_infra.controller.core import Controller
from sp00ky_infra.controller.metrics import exposition
from sp00ky_infra.controller.provisioners.local import LocalProvisioner
from sp00ky_infra.controller.reconcile import tick
from sp00ky_infra.controller.settings import ControllerSettings
from sp00ky_infra.controller.sweep import NO_ROW, ROW_ENDED
from sp00ky_infra.policy.machines import Reason
from sp00ky_infra.rehearse.cloud import TOKEN, FakeHetzner
from sp00ky_infra.shared import labels
from sp00ky_infra.store import open_store
from tests.controllers import backend_app, project, wait_for

GRACE = 600.0


def _machine(cloud: FakeHetzner, name: str, age: float, project: str = "shop") -> None:
    made = datetime.now(UTC) - timedelta(seconds=age)
    cloud.add_server(name, {labels.PROJECT: project, labels.MACHINE: name}, made)


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Controller]:
    app = backend_app("render", "render_job", tmp_path / "log")
    config = load_config(project(tmp_path, {"render": {"min": 1}}, {"renderer": app}))
    store = open_store(f"sqlite:///{tmp_path}/state.db")
    settings = ControllerSettings(
        secret="s", state_dir=str(tmp_path), project="shop", sweep_every=0.0, sweep_grace=GRACE,
        heartbeat_every=3600.0,
    )  # fmt: skip
    made = Controller(settings, config, store, LocalProvisioner(tmp_path / "machines"))
    try:
        yield made
    finally:
        made.leader_lock.release()
        store.close()


def test_the_sweep_deletes_only_old_servers_no_live_row_holds(controller: Controller) -> None:
    store = controller.store
    now = time.time()
    revision = controller.revisions["render"]  # the pool's one machine: the plan keeps it
    for name in ("render-live", "render-ended"):
        store.machines.add(name, "render", "local", revision, 1, now)
        store.machines.move(name, Reason.PROVISIONED, now)  # booting: nothing more to start
    store.machines.move("render-ended", Reason.BOOT_FAILED, now)
    store.machines.move("render-ended", Reason.DESTROYED, now)
    with FakeHetzner() as cloud:
        _machine(cloud, "render-live", 2 * GRACE)  # held by its live row
        _machine(cloud, "render-ended", 2 * GRACE)  # its row ended: left behind
        _machine(cloud, "render-unknown", 2 * GRACE)  # no row at all: left behind
        _machine(cloud, "render-young", GRACE / 2)  # may be a create in flight
        _machine(cloud, "render-theirs", 2 * GRACE, project="another")
        cloud.add_server("bake-1", {labels.PROJECT: "shop", labels.ROLE: "bake"})  # not a machine
        saved = dict(os.environ)
        os.environ.update({"HCLOUD_TOKEN": TOKEN, "HCLOUD_ENDPOINT": cloud.url})
        try:
            tick(controller)  # the leader's first tick starts the sweep in the background

            def left() -> list[str]:
                return sorted(s["name"] for s in cloud.servers.values())

            wait_for(lambda: "render-unknown" not in left(), what="the sweep")
            wait_for(lambda: not controller.server_sweep._running.locked(), what="its end")
        finally:
            os.environ.clear()
            os.environ.update(saved)
        assert left() == ["bake-1", "render-live", "render-theirs", "render-young"]
    assert dict(controller.server_sweep.counts) == {NO_ROW: 1, ROW_ENDED: 1}
    metrics = exposition(controller).decode()
    assert f'sp00ky_servers_swept_total{{reason="{NO_ROW}"}} 1.0' in metrics
    assert f'sp00ky_servers_swept_total{{reason="{ROW_ENDED}"}} 1.0' in metrics
