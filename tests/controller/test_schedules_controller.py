"""The leader's tick fires schedules (controller/schedules.py): in process on a virtual clock
over a real store, and as two controller processes where the leader dies mid-cadence."""

from __future__ import annotations

import itertools
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sp00ky_infra.config.loader import load_config
from sp00ky_infra.controller.core import Controller
from sp00ky_infra.controller.reconcile import tick
from sp00ky_infra.controller.schedules import fire_schedules
from sp00ky_infra.controller.settings import ControllerSettings
from sp00ky_infra.store import SqlStore, open_store
from sp00ky_infra.store.schedules import ScheduleTable
from tests.controller.test_controller_executor import Recording
from tests.controllers import ControllerProcess, backend_app, kill_machines, wait_for
from tests.helpers import ROOT, examples

POOLS = {"render": {"min": 0, "autoscale": True, "max": 1}}
RENDER = {"backend": "renderer", "route": "/render", "payload": {"gameId": "nightly"}}
T0 = 1_800_000_000.0  # a multiple of 60: 2027-01-15T08:00:00Z


def write_project(folder: Path, schedules: dict[str, Any], spec: Path | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    app = backend_app("render", "render_job", folder / "backend.jsonl")
    if spec is not None:
        app["spec"] = str(spec)
    path = folder / "sp00ky.yml"
    data = {"mode": "cluster", "pools": POOLS, "apps": {"renderer": app}, "schedules": schedules}
    path.write_text(yaml.safe_dump(data))
    return path


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@contextmanager
def leader(
    tmp_path: Path, store_url: str, schedules: dict[str, Any], spec: Path | None = None
) -> Iterator[tuple[Controller, Clock, SqlStore]]:
    config = load_config(write_project(tmp_path, schedules, spec))
    store = open_store(store_url)
    clock = Clock(T0)
    settings = ControllerSettings(secret="s", state_dir=str(tmp_path))
    controller = Controller(settings, config, store, Recording(True), clock=clock)
    try:
        yield controller, clock, store
    finally:
        controller.leader_lock.release()
        store.close()


def statuses(store: SqlStore, name: str) -> list[tuple[float, str]]:
    return [(run.fire_at - T0, run.status) for run in ScheduleTable(store).runs(name, 100)]


def test_the_leader_fires_each_time_once_and_catches_up_once(
    tmp_path: Path, store_url: str
) -> None:
    schedules = {"sync": {**RENDER, "every": "1m", "concurrency": "allow"}}
    with leader(tmp_path, store_url, schedules) as (controller, clock, store):
        clock.now = T0 + 1  # first seen: fires from the next minute on
        assert tick(controller).errors == ()
        assert statuses(store, "sync") == []
        clock.now = T0 + 60.5
        tick(controller)
        tick(controller)  # a second tick in the same minute makes no second fire
        assert statuses(store, "sync") == [(60.0, "pending")]
        [job] = store.list_jobs(table="render_job")
        assert (job.path, job.payload, job.pool) == ("/render", {"gameId": "nightly"}, "render")
        assert job.queue_deadline is not None  # the pool's queue timeout, as `run` gives it
        clock.now = T0 + 60 * 6 + 10  # down over 4 fire times: one catch-up fire, the latest
        tick(controller)
        assert statuses(store, "sync") == [(360.0, "pending"), (60.0, "pending")]
        assert len(store.list_jobs(table="render_job")) == 2


def test_a_fire_s_job_takes_its_table_s_retries_as_retuned(tmp_path: Path, store_url: str) -> None:
    schedules = {"sync": {**RENDER, "every": "1m", "concurrency": "allow"}}
    with leader(tmp_path, store_url, schedules) as (controller, clock, store):
        clock.now = T0 + 1
        tick(controller)
        store.policies.retune("render_job", {"max_retries": 9, "retry_strategy": "exponential"},
                              T0 + 2, "jobs policy")  # fmt: skip
        clock.now = T0 + 60.5
        tick(controller)  # reads the policy, then fires
        [job] = store.list_jobs(table="render_job")
        assert (job.max_retries, job.retry_strategy) == (9, "exponential")


def test_skip_and_replace_on_the_tick(tmp_path: Path, store_url: str) -> None:
    schedules = {
        "skipper": {**RENDER, "every": "1m"},
        "replacer": {**RENDER, "every": "1m", "concurrency": "replace"},
    }
    with leader(tmp_path, store_url, schedules) as (controller, clock, store):
        for minute in range(3):
            clock.now = T0 + 60 * minute + 1
            tick(controller)
        assert statuses(store, "skipper") == [(120.0, "skipped"), (60.0, "pending")]
        assert statuses(store, "replacer") == [(120.0, "pending"), (60.0, "replaced")]
        replaced = ScheduleTable(store).runs("replacer")[1].job_id or ""
        assert store.get(replaced).status == "failed"  # killed while it waited
        assert store.get(replaced).errors[-1]["code"] == "cancelled"
        assert len(store.list_jobs(table="render_job", status="pending")) == 2


def test_a_payload_the_spec_refuses_fires_nothing_and_says_why(
    tmp_path: Path, store_url: str
) -> None:
    """Lint checks the payload against the spec; a spec changed since (the backend deployed
    anew) is checked again at each fire."""
    spec = tmp_path / "openapi.yml"
    spec.write_text((ROOT / "examples" / "backend" / "openapi.yml").read_text())
    schedules = {"bad": {**RENDER, "every": "1m"}}
    with leader(tmp_path, store_url, schedules, spec) as (controller, clock, store):
        spec.write_text(spec.read_text().replace("required: [gameId]", "required: [gameId, tag]"))
        tick(controller)
        clock.now = T0 + 61
        report = tick(controller)
        assert len(report.errors) == 1
        assert report.errors[0].startswith("schedule bad: payload: refused by backend renderer's")
        assert statuses(store, "bad") == []
        assert store.list_jobs(table="render_job") == []


def test_a_fire_into_a_full_queue_waits_for_room(tmp_path: Path, store_url: str) -> None:
    schedules = {"sync": {**RENDER, "every": "1m", "concurrency": "allow"}}
    with leader(tmp_path, store_url, schedules) as (controller, clock, store):
        controller.load(replace(controller.config, pools=MappingProxyType(
            {"render": replace(controller.config.pools["render"], max_queued=1)}
        )))  # fmt: skip
        tick(controller)
        clock.now = T0 + 61
        assert tick(controller).errors == ()
        clock.now = T0 + 121
        report = tick(controller)
        assert report.errors == (
            "schedule sync: pool 'render' already has 1 jobs waiting (maxQueued 1); the fire "
            "is made when there is room",
        )
        assert statuses(store, "sync") == [(60.0, "pending")]
        store.kill(store.list_jobs(table="render_job")[0].id, clock.now)
        clock.now = T0 + 150
        assert tick(controller).errors == ()
        assert statuses(store, "sync") == [(120.0, "pending"), (60.0, "killed")]


def test_a_follower_fires_nothing(tmp_path: Path, store_url: str) -> None:
    schedules = {"sync": {**RENDER, "every": "1m", "concurrency": "allow"}}
    with (
        leader(tmp_path / "a", store_url, schedules) as (first, clock, store),
        leader(tmp_path / "b", store_url, schedules) as (second, second_clock, _),
    ):
        assert tick(first).leader
        for now in (T0 + 61, T0 + 121):
            clock.now = second_clock.now = now
            assert not tick(second).leader
        assert statuses(store, "sync") == []


# --- two controller processes, the leader killed mid-cadence ---------------------------------

EVERY = 3.0


def fire_times(store: SqlStore) -> list[float]:
    return sorted(run.fire_at for run in ScheduleTable(store).runs("beat", 1000))


@contextmanager
def controllers(
    store_url: str,
) -> Iterator[tuple[Callable[[Path, Path], ControllerProcess], SqlStore]]:
    """A starter of controller processes on ``store_url`` and a store of the test's own; every
    process started is stopped afterwards, with the machines it made."""
    store = open_store(store_url)
    started: list[ControllerProcess] = []

    def start(folder: Path, config: Path) -> ControllerProcess:
        started.append(ControllerProcess(folder, config, store_url, {}))
        return started[-1].start()

    try:
        yield start, store
    finally:
        for each in started:
            each.stop()
        kill_machines(store_url)
        store.close()


def test_a_failover_mid_cadence_loses_no_fire_and_doubles_none(
    tmp_path: Path, store_url: str
) -> None:
    schedules = {"beat": {**RENDER, "every": f"{EVERY:g}s", "concurrency": "allow"}}
    config = write_project(tmp_path, schedules)
    with controllers(store_url) as (start, store):
        first = start(tmp_path / "a", config)
        wait_for(first.leader, what="the first controller leading")
        assert first.admin("POST", "/pools/render/pause").json()["paused"]  # jobs only wait
        second = start(tmp_path / "b", config)
        wait_for(lambda: len(fire_times(store)) >= 2, timeout=20, what="the leader firing")
        made = len(fire_times(store))
        wait_for(lambda: len(fire_times(store)) > made, timeout=10, what="a fire")
        time.sleep(EVERY / 4)  # the middle of a cadence: the next fire is B's to make
        before = fire_times(store)
        first.stop(signal.SIGKILL)
        wait_for(second.leader, timeout=EVERY / 2, what="B taking over within the cadence")
        wait_for(lambda: len(fire_times(store)) >= len(before) + 3, timeout=20, what="B firing")
        second.stop()
        times = fire_times(store)
        assert all(b - a == EVERY for a, b in itertools.pairwise(times)), times  # none lost
        jobs = store.list_jobs(table="render_job", limit=1000)
        runs = ScheduleTable(store).runs("beat", 1000)
        assert len({run.job_id for run in runs}) == len(runs) == len(jobs)  # none doubled
        assert sorted(run.job_id or "" for run in runs) == sorted(job.id for job in jobs)
        assert "schedule beat fired" in second.log()


# --- two controllers that both believe they lead (a split brain), on a virtual clock ----------


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.sampled_from("ab"), st.floats(0.1, 150.0)),
        min_size=1,
        max_size=25,
    )
)
def test_two_controllers_firing_alike_make_each_fire_once(steps: list[tuple[str, float]]) -> None:
    """Whichever of two controllers ticks, at whatever pace, the fires made are the catch-up
    rule's, each once with one job: the store's cursor and key, not leadership, see to it."""
    schedules = {"beat": {**RENDER, "every": "1m", "concurrency": "allow"}}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        config = load_config(write_project(folder, schedules))
        url = f"sqlite:///{folder}/state.db"
        stores = {name: open_store(url) for name in "ab"}
        settings_ = ControllerSettings(secret="s", state_dir=str(folder))
        controllers = {
            name: Controller(settings_, config, store, Recording(True))
            for name, store in stores.items()
        }
        try:
            now = T0 + 1
            expected: list[float] = []
            fire_schedules(controllers["a"], now)  # first seen
            for name, step in steps:
                now += step
                latest = (now // 60) * 60
                if latest > (expected[-1] if expected else T0):
                    expected.append(latest)
                assert fire_schedules(controllers[name], now) == []
            runs = ScheduleTable(stores["a"]).runs("beat", 1000)
            assert sorted(run.fire_at for run in runs) == expected
            jobs = stores["a"].list_jobs(table="render_job", limit=1000)
            assert sorted(job.id for job in jobs) == sorted(run.job_id or "" for run in runs)
        finally:
            for store in stores.values():
                store.close()
