"""A packing pool gives its work to the machine that ran work most recently, so the others go
idle and drain; with ``packJobs: false`` the work goes round the machines and none of them
idles long enough to go. A real controller, its agents and backends as local processes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sp00ky_infra.client import Client
from sp00ky_infra.store import SqlStore
from tests.controllers import backend_app, live_machines, project, running_controller, wait_for

IDLE_TIMEOUT = 6.0  # well above the gap between one machine's jobs when they go round three


def _machine_once_done(store: SqlStore, job: str) -> str:
    wait_for(lambda: store.get(job).status == "success", timeout=20, what=f"job {job}")
    return store.get(job).machine or ""


def _one_at_a_time(tmp_path: Path, pack: bool) -> tuple[list[str], list[str], list[str]]:
    """Three machines warmed by three jobs at once, then twelve jobs one at a time: the
    warm machines, the machine of each later job, and the machines live after them."""
    pool = {"min": 0, "autoscale": True, "max": 3, "recycle": "never", "packJobs": pack}
    app = backend_app("render", "render_job", tmp_path / "backend.jsonl")
    config = project(tmp_path, {"render": pool}, {"renderer": app})
    store_url = f"sqlite:///{tmp_path}/state.db"
    client = Client(store_url, config)
    store = client.store
    timings = f"lease=5s,idleTimeout={IDLE_TIMEOUT:g}s,bootTimeout=20s"
    try:
        with running_controller(tmp_path, config, store_url, SPKY_POOL_TIMINGS=timings):
            warm = [
                client.run("renderer", "/render", {"gameId": f"w{n}", "seconds": 1.5}).id
                for n in range(3)
            ]
            wait_for(lambda: all(store.get(i).status == "success" for i in warm), timeout=40)
            machines = sorted({store.get(i).machine or "" for i in warm})
            assert len(machines) == 3, machines  # three ran at once: three machines
            later: list[str] = []
            for n in range(12):
                job = client.run("renderer", "/render", {"gameId": f"j{n}", "seconds": 0.1}).id
                later.append(_machine_once_done(store, job))
                time.sleep(0.3)
            live = live_machines(store, "render")
            if pack:  # the two that took no work go once idle for idleTimeout
                wait_for(
                    lambda: live_machines(store, "render") == [later[0]],
                    timeout=IDLE_TIMEOUT + 15,
                    what="the idle machines drained",
                )
                drained = [store.machines.get(m) for m in machines if m != later[0]]
                assert {m.drain_reason for m in drained} == {"idle_surplus"}
            return machines, later, live
    finally:
        client.close()


@pytest.mark.slow
def test_jobs_one_at_a_time_land_on_one_machine_and_the_others_drain(tmp_path: Path) -> None:
    machines, later, _ = _one_at_a_time(tmp_path, pack=True)
    assert len(set(later)) == 1 and later[0] in machines


@pytest.mark.slow
def test_without_packing_the_jobs_go_round_the_machines_and_none_drains(tmp_path: Path) -> None:
    machines, later, live = _one_at_a_time(tmp_path, pack=False)
    assert set(later) == set(machines)  # each took work: the one that waited longest
    assert sorted(live) == machines  # so none was idle for idleTimeout


@pytest.mark.slow
def test_an_idle_machine_whose_hour_is_paid_stays_until_the_hour_ends(tmp_path: Path) -> None:
    """Billed per started 20 s (SPKY_BILLING_HOUR), a machine idle past idleTimeout (2 s)
    stays, explained and counted as kept, and drains in the last seconds of its paid 20 s
    (the margin: twice two 200 ms ticks, the agent's leaving and a local destroy, 4.8 s)."""
    pool = {"min": 0, "autoscale": True, "max": 1}
    app = backend_app("render", "render_job", tmp_path / "backend.jsonl")
    config = project(tmp_path, {"render": pool}, {"renderer": app})
    store_url = f"sqlite:///{tmp_path}/state.db"
    client = Client(store_url, config)
    store = client.store
    try:
        with running_controller(tmp_path, config, store_url, SPKY_BILLING_HOUR="20s") as ctl:
            job = client.run("renderer", "/render", {"gameId": "g", "seconds": 0.1}).id
            wait_for(lambda: store.get(job).status == "success", timeout=30)
            name = store.get(job).machine or ""
            created = store.machines.get(name).created_at
            wait_for(lambda: time.time() > created + 8.0, timeout=15)  # idle well past 2 s
            assert live_machines(store, "render") == [name]
            (machine,) = ctl.admin("GET", "/pools/render/explain").json()["machines"]
            assert machine["reason"].startswith("kept idle: its hour is paid until")
            metrics = ctl.admin("GET", "/metrics").text
            assert 'sp00ky_pool_idle_paid_machines{pool="render"} 1.0' in metrics
            wait_for(lambda: live_machines(store, "render") == [], timeout=20, what="drain")
            gone = store.machines.get(name)
            assert gone.drain_reason == "idle_surplus" and gone.destroyed_at is not None
            assert 15.2 - 0.5 <= gone.destroyed_at - created <= 20.0
    finally:
        client.close()
