"""Fan-out and paused schedules on the leader's tick (controller/schedules.py): in process on
a virtual clock over a real store, and as controller processes where the leader dies mid
fan-out or the controller restarts while a schedule is paused."""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
import yaml

from sp00ky_infra.config.loader import lint_file
from sp00ky_infra.controller.core import Controller
from sp00ky_infra.controller.reconcile import tick
from sp00ky_infra.controller.schedules import set_paused
from sp00ky_infra.store import SqlStore
from sp00ky_infra.store.fan_out import FanOuts
from sp00ky_infra.store.schedules import ScheduleTable
from tests.controller.test_schedules_controller import (
    POOLS,
    RENDER,
    T0,
    Clock,
    controllers,
    statuses,
)
from tests.controller.test_schedules_controller import leader as leader_with_spec
from tests.controller.test_schedules_controller import write_project as project_with_spec
from tests.controllers import wait_for
from tests.helpers import ROOT

# The Jobs docs' example: one job per tenant, every minute.
FOR_EACH_TENANT: dict[str, Any] = {"query": "SELECT id FROM tenant", "key": "id"}
SYNC_EVERY_TENANT: dict[str, Any] = {
    "every": "1m",
    "backend": "renderer",
    "route": "/sync",
    "forEach": FOR_EACH_TENANT,
    "history": {"success": "15m", "failed": "30d"},
}


def spec_with_sync(folder: Path) -> Path:
    """The example backend's spec with a POST /sync taking a tenant's id."""
    spec = yaml.safe_load((ROOT / "examples" / "backend" / "openapi.yml").read_text())
    body = {"type": "object", "required": ["id"], "properties": {"id": {"type": "integer"}}}
    spec["paths"]["/sync"] = {
        "post": {
            "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
            "responses": {"200": {"description": "synced"}},
        }
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "openapi.yml"
    path.write_text(yaml.safe_dump(spec))
    return path


def write_project(
    folder: Path, schedules: dict[str, Any], pools: dict[str, Any] | None = None
) -> Path:
    path = project_with_spec(folder, schedules, spec_with_sync(folder))
    if pools is not None:
        data = yaml.safe_load(path.read_text())
        path.write_text(yaml.safe_dump({**data, "pools": pools}))
    return path


def make_tenants(store: SqlStore, count: int) -> None:
    with store.write() as sql:
        sql.execute("CREATE TABLE tenant (id INTEGER PRIMARY KEY, name TEXT)")
        sql.executemany(
            "INSERT INTO tenant (id, name) VALUES (?, ?)", [(n, f"t{n}") for n in range(count)]
        )


def jobs_by_tenant(store: SqlStore) -> Counter[int]:
    jobs = store.list_jobs(table="render_job", limit=100_000)
    return Counter(job.payload["id"] for job in jobs if job.path == "/sync")


@contextmanager
def leader(
    tmp_path: Path, store_url: str, schedules: dict[str, Any]
) -> Iterator[tuple[Controller, Clock, SqlStore]]:
    with leader_with_spec(tmp_path, store_url, schedules, spec_with_sync(tmp_path)) as found:
        yield found


def test_the_docs_example_lints_clean_and_fires_one_job_per_tenant(
    tmp_path: Path, store_url: str
) -> None:
    assert lint_file(write_project(tmp_path, {"sync-every-tenant": SYNC_EVERY_TENANT})) == []
    with leader(tmp_path, store_url, {"sync-every-tenant": SYNC_EVERY_TENANT}) as (
        controller,
        clock,
        store,
    ):
        make_tenants(store, 25)
        clock.now = T0 + 1
        assert tick(controller).errors == ()  # first seen
        clock.now = T0 + 61
        assert tick(controller).errors == ()
        tick(controller)  # a second tick in the same minute: nothing more
        assert jobs_by_tenant(store) == Counter(range(25))
        [job] = [job for job in store.list_jobs(table="render_job") if job.payload["id"] == 7]
        assert (job.path, job.payload, job.pool) == ("/sync", {"id": 7}, "render")
        runs = ScheduleTable(store).runs("sync-every-tenant", 100)
        assert sorted(int(run.item) for run in runs) == list(range(25))
        clock.now = T0 + 121  # every tenant's job still waits: policy skip, per row
        tick(controller)
        assert jobs_by_tenant(store) == Counter(range(25))
        assert statuses(store, "sync-every-tenant").count((120.0, "skipped")) == 25


def test_a_query_past_its_limits_fails_the_fire_and_fans_out_nothing(
    tmp_path: Path, store_url: str
) -> None:
    small = {**SYNC_EVERY_TENANT, "forEach": {**FOR_EACH_TENANT, "maxRows": 10}}
    with leader(tmp_path, store_url, {"sync": small}) as (controller, clock, store):
        make_tenants(store, 11)
        tick(controller)
        clock.now = T0 + 61
        assert tick(controller).errors == ()  # a failed fire is a run, not a tick's error
        [run] = ScheduleTable(store).runs("sync")
        assert (run.fire_at - T0, run.status, run.job_id) == (60.0, "failed", None)
        assert run.error == (
            "the query returned more than maxRows (10) rows; narrow it or raise forEach.maxRows"
        )
        assert store.list_jobs(table="render_job") == []
        assert any("schedule sync fire" in e.message for e in controller.recent_events(20))


def test_a_paused_schedule_makes_no_fire_and_its_missed_times_are_not_caught_up(
    tmp_path: Path, store_url: str
) -> None:
    schedules = {"sync": {**RENDER, "every": "1m", "concurrency": "allow"}}
    with leader(tmp_path, store_url, schedules) as (controller, clock, store):
        tick(controller)
        clock.now = T0 + 61
        tick(controller)
        assert set_paused(controller, "sync", True)["paused_at"] == T0 + 61
        for minute in range(2, 6):
            clock.now = T0 + 60 * minute + 1
            tick(controller)
        assert statuses(store, "sync") == [(60.0, "pending")]
        clock.now = T0 + 330
        assert set_paused(controller, "sync", False)["paused"] is False
        tick(controller)  # 5:30: no catch-up fire for 2:00..5:00
        assert statuses(store, "sync") == [(60.0, "pending")]
        clock.now = T0 + 361
        tick(controller)
        assert statuses(store, "sync") == [(360.0, "pending"), (60.0, "pending")]


def test_a_paused_fan_out_writes_no_more_of_its_rows(tmp_path: Path, store_url: str) -> None:
    with leader(tmp_path, store_url, {"sync": SYNC_EVERY_TENANT}) as (controller, clock, store):
        make_tenants(store, 5)
        tick(controller)
        FanOuts(store).open("sync", T0 + 60, T0 + 60, ["1", "2"])  # a fire left mid fan-out
        set_paused(controller, "sync", True)
        clock.now = T0 + 121
        tick(controller)
        assert store.list_jobs(table="render_job") == []
        set_paused(controller, "sync", False)
        tick(controller)
        assert jobs_by_tenant(store) == Counter([1, 2])


def test_rows_wait_for_room_in_the_queue_and_are_written_as_it_frees(
    tmp_path: Path, store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with leader(tmp_path, store_url, {"sync": SYNC_EVERY_TENANT}) as (controller, clock, store):
        pool = controller.config.pools["render"]
        pools = MappingProxyType({"render": replace(pool, max_queued=3)})
        controller.load(replace(controller.config, pools=pools))
        make_tenants(store, 5)
        tick(controller)
        clock.now = T0 + 61
        assert tick(controller).errors == ()  # waiting for room is no error
        tick(controller)
        assert sum(jobs_by_tenant(store).values()) == 3
        assert caplog.text.count("fan-out waits for room in pool render's queue") == 1
        for job in store.list_jobs(table="render_job"):
            store.kill(job.id, clock.now)
        clock.now = T0 + 62
        tick(controller)
        assert jobs_by_tenant(store) == Counter(range(5))


# --- controller processes ----------------------------------------------------------------------

TENANTS = 300
ROOM = 40


def fired_rows(store: SqlStore) -> tuple[int, int]:
    """(runs of the schedule's first fire with a job, runs of it waiting for one)."""
    runs = ScheduleTable(store).runs("sync", 100_000)
    first = min((run.fire_at for run in runs), default=None)
    mine = [run for run in runs if run.fire_at == first]
    return sum(1 for run in mine if run.job_id), sum(1 for run in mine if not run.job_id)


def test_a_leader_killed_mid_fan_out_leaves_the_rest_to_the_standby(
    tmp_path: Path, store_url: str
) -> None:
    """A's queue has room for ROOM jobs: it fans out that many of TENANTS rows and waits for
    room. Killed there, B (deployed with more room) takes over and writes the rest: every
    tenant's job once. Later fires find every row's job waiting: skipped, none doubled."""
    schedules = {"sync": {**SYNC_EVERY_TENANT, "every": "5s"}}
    narrow = {"render": {**POOLS["render"], "maxQueued": ROOM}}
    wide = {"render": {**POOLS["render"], "maxQueued": 10 * TENANTS}}
    with controllers(store_url) as (start, store):
        make_tenants(store, TENANTS)
        first = start(tmp_path / "a", write_project(tmp_path / "a", schedules, narrow))
        wait_for(first.leader, what="the first controller leading")
        assert first.admin("POST", "/pools/render/pause").json()["paused"]  # jobs only wait
        second = start(tmp_path / "b", write_project(tmp_path / "b", schedules, wide))
        wait_for(lambda: fired_rows(store) == (ROOM, TENANTS - ROOM), timeout=30, what="A stuck")
        first.stop(signal.SIGKILL)
        wait_for(second.leader, timeout=15, what="B taking over")
        wait_for(lambda: fired_rows(store) == (TENANTS, 0), timeout=60, what="B finishing")
        assert jobs_by_tenant(store) == Counter(range(TENANTS))  # every row once
        assert "schedule sync wrote" in second.log()  # B wrote rows of A's fire


def test_a_pause_survives_a_restart_and_a_deploy(tmp_path: Path, store_url: str) -> None:
    schedules = {"beat": {**RENDER, "every": "1s", "concurrency": "allow"}}
    with controllers(store_url) as (start, store):
        controller = start(tmp_path / "a", write_project(tmp_path / "a", schedules))
        wait_for(controller.leader, what="the controller leading")
        assert controller.admin("POST", "/pools/render/pause").json()["paused"]
        paused = controller.admin("POST", "/schedules/beat/pause")
        assert paused.status_code == 200 and paused.json()["paused"], paused.text
        assert controller.admin("POST", "/schedules/nope/pause").status_code == 404
        made = len(ScheduleTable(store).runs("beat", 1000))
        controller.stop()
        changed = {"beat": {**RENDER, "every": "2s", "concurrency": "skip"}}  # a deploy
        controller = start(tmp_path / "b", write_project(tmp_path / "b", changed))
        wait_for(controller.leader, what="the restarted controller leading")
        time.sleep(5)  # fire times of 1s and 2s pass: a paused schedule makes none
        assert len(ScheduleTable(store).runs("beat", 1000)) == made
        resumed = controller.admin("POST", "/schedules/beat/resume").json()
        assert resumed["paused"] is False
        wait_for(
            lambda: len(ScheduleTable(store).runs("beat", 1000)) > made,
            timeout=15,
            what="a fire after the resume",
        )
