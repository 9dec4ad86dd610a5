"""The tick sizes a pool by the slots its queued jobs need, on a real store (a job of
poolSlots 2 needs two slots: Resource pools docs, "poolSlots"), and the admin API's pool view
shows the same figures, from one count of the pool's jobs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sp00ky_infra.config.loader import load_config
from sp00ky_infra.controller import admin
from sp00ky_infra.controller.core import Controller
from sp00ky_infra.controller.reconcile import tick
from sp00ky_infra.controller.settings import ControllerSettings
from sp00ky_infra.store import NewJob, open_store
from tests.controller.test_controller_executor import Recording
from tests.controllers import backend_app, project


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


def test_the_pool_view_counts_its_tables_jobs_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The view's queue and its bill come from one count of the pool's jobs by status (each
    a walk of the backlog: a second one took 116 ms at 1,000,000 pending)."""
    app = backend_app("render", "render_job", tmp_path / "log")
    config = load_config(project(tmp_path, {"render": {"min": 1}}, {"renderer": app}))
    store = open_store(f"sqlite:///{tmp_path}/state.db")
    controller = Controller(
        ControllerSettings(secret="s", state_dir=str(tmp_path)),
        config,
        store,
        Recording(delivers_join_token=True),
    )
    reads: list[tuple[str | None, str | None]] = []
    counts = store.counts

    def counted(table: str | None = None, pool: str | None = None) -> dict[str, int]:
        reads.append((table, pool))
        return counts(table, pool)

    try:
        now = time.time()
        for n in range(4):
            store.enqueue(NewJob("renderer", "render_job", "/render", {"n": n}), now)
        for job in store.claim("render_job", 3, "controller-1", now, 90.0):
            store.complete(job.id, job.attempt or "", {}, now + 1)
        monkeypatch.setattr(store, "counts", counted)
        view = admin.pool_view(controller, "render")
        assert reads == [("render_job", None)]
        assert view["queue"]["pending"] == 1 and view["cost"]["jobs"] == 3
        # Read on its own (the `dev` summary's bills), the bill counts the jobs itself
        assert admin.cost_view(controller, "render", now + 2)["jobs"] == 3
        assert reads[1:] == [("render_job", None)]
    finally:
        controller.leader_lock.release()
        store.close()
