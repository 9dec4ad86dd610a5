"""The tick sizes a pool by the slots its queued jobs need, on a real store (a job of
poolSlots 2 needs two slots: resource-pools.txt, "poolSlots")."""

from __future__ import annotations

import time
from pathlib import Path

from sp00ky_infra.config.loader import load_config
from sp00ky_infra.controller import admin
from sp00ky_infra.controller.core import Controller
from sp00ky_infra.controller.reconcile import tick
from sp00ky_infra.controller.settings import ControllerSettings
from sp00ky_infra.store import NewJob, open_store
from tests.controllers import backend_app, project
from tests.test_controller_executor import Recording


def test_queued_jobs_of_two_slots_get_the_machines_they_need(tmp_path: Path) -> None:
    app = backend_app("render", "render_job", tmp_path / "log")
    pools = {"render": {"min": 0, "autoscale": True, "max": 8, "slots": 2}}
    config = load_config(project(tmp_path, pools, {"renderer": app}))
    store = open_store(f"sqlite:///{tmp_path}/state.db")
    provisioner = Recording(delivers_join_token=True)
    controller = Controller(
        ControllerSettings(secret="s", state_dir=str(tmp_path)), config, store, provisioner
    )
    try:
        now = time.time()
        for n in range(3):
            store.enqueue(NewJob("renderer", "render_job", "/render", {"n": n}, slots=2), now)
        report = tick(controller)
        (plan,) = report.plans
        # 3 jobs x 2 slots = 6 slots on 2-slot machines: 3 machines (counting jobs gave 2)
        assert plan.desired == 3
        assert len(provisioner.specs) == 3
        view = admin.pool_view(controller, "render")  # the admin API says the same
        assert (view["capacity"], view["desired"]) == (6, 3)
        assert view["queue"]["queued"] == 3  # it still counts jobs where it shows them
    finally:
        controller.leader_lock.release()
        store.close()
