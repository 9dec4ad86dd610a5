"""The controller with real agents and a real backend on loopback, with short test timings:
lease 3 s, idle timeout 2 s, a tick every 200 ms."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from sp00ky_infra.client import Client
from sp00ky_infra.store import SqlStore
from tests.controllers import (
    backend_app,
    backend_events,
    live_machines,
    project,
    running_controller,
    wait_for,
)

RENDER = {"min": 0, "autoscale": True, "max": 2}


@pytest.fixture
def store_path(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/state.db"


def _client(store_url: str, config: Path) -> tuple[Client, SqlStore]:
    client = Client(store_url, config)
    return client, client.store


def _max_overlap(events: list[dict[str, Any]]) -> int:
    """The most jobs the backends ran at once, from their start/end log."""
    running = peak = 0
    for event in sorted(events, key=lambda e: (e["t"], e["event"] == "start")):
        if event["event"] == "start":
            running += 1
            peak = max(peak, running)
        elif event["event"] == "end":
            running -= 1
    return peak


def test_two_jobs_get_two_machines_a_third_waits_and_the_pool_returns_to_zero(
    tmp_path: Path, store_path: str
) -> None:
    log = tmp_path / "backend.jsonl"
    config = project(
        tmp_path, {"render": RENDER}, {"renderer": backend_app("render", "render_job", log)}
    )
    client, store = _client(store_path, config)
    with running_controller(tmp_path, config, store_path) as controller:
        time.sleep(0.6)
        assert live_machines(store, "render") == []  # nothing runs while there is no work
        ids = [
            client.run("renderer", "/render", {"gameId": f"g{n}", "seconds": 1.5}).id
            for n in range(3)
        ]
        wait_for(
            lambda: len(live_machines(store, "render", "ready")) == 2, what="two ready machines"
        )
        wait_for(
            lambda: all(store.get(i).status == "success" for i in ids), timeout=30, what="jobs done"
        )
        events = backend_events(log)
        assert sorted(e["gameId"] for e in events if e["event"] == "start") == ["g0", "g1", "g2"]
        assert _max_overlap(events) == 2  # the third waited for one of the two machines
        assert max(len(live_machines(store, "render")) for _ in range(3)) <= 2
        wait_for(lambda: live_machines(store, "render") == [], timeout=20, what="scale to zero")
        view = controller.pool("render")
        assert view["desired"] == 0 and view["machines"] == {} and view["pool_machine_hours"] > 0
    client.close()


def test_the_docs_four_sizing_pools_reach_their_machine_counts(
    tmp_path: Path, store_path: str
) -> None:
    log = tmp_path / "backend.jsonl"
    pools = {
        "steady": {"min": 2},
        "elastic": {"min": 1, "autoscale": True, "max": 8},
        "instant": {"min": 0, "autoscale": True, "max": 10, "buffer": 2},
        "on-demand": {"min": 0, "autoscale": True, "max": 3},
    }
    apps = {
        f"{name}-app": backend_app(name, f"{name.replace('-', '_')}_job", log) for name in pools
    }
    config = project(tmp_path, pools, apps)
    client, store = _client(store_path, config)

    def counts() -> dict[str, int]:
        return {name: len(live_machines(store, name, "ready")) for name in pools}

    with running_controller(tmp_path, config, store_path):
        at_rest = {"steady": 2, "elastic": 1, "instant": 2, "on-demand": 0}
        wait_for(lambda: counts() == at_rest, what=f"rest {at_rest}")
        jobs = [
            client.run(app, "/render", {"gameId": f"{app}-{n}", "seconds": 4}).id
            for app, count in (("elastic-app", 3), ("instant-app", 1), ("on-demand-app", 5))
            for n in range(count)
        ]
        # elastic: 3 busy -> 3 machines; instant: 1 busy + 2 warm -> 3; on-demand: capped at 3
        busy = {"steady": 2, "elastic": 3, "instant": 3, "on-demand": 3}
        wait_for(lambda: counts() == busy, timeout=30, what=f"busy {busy}")
        wait_for(
            lambda: all(store.get(j).status == "success" for j in jobs), timeout=60, what="jobs"
        )
        wait_for(lambda: counts() == at_rest, timeout=30, what=f"back to rest {at_rest}")
    client.close()


def test_idle_machines_go_and_a_busy_one_is_never_drained(tmp_path: Path, store_path: str) -> None:
    log = tmp_path / "backend.jsonl"
    config = project(
        tmp_path, {"render": RENDER}, {"renderer": backend_app("render", "render_job", log)}
    )
    client, store = _client(store_path, config)
    with running_controller(tmp_path, config, store_path):
        long = client.run("renderer", "/render", {"gameId": "long", "seconds": 7}).id
        short = client.run("renderer", "/render", {"gameId": "short", "seconds": 0.2}).id
        wait_for(lambda: store.get(short).status == "success", what="short job")
        busy_machine = wait_for(lambda: store.get(long).machine, what="long job running")
        # the short job's machine idles for idleTimeout (2 s) and goes; the busy one stays
        wait_for(lambda: live_machines(store, "render") == [busy_machine], timeout=15, what="drain")
        done = wait_for(lambda: store.get(long).status == "success" and store.get(long), timeout=20)
        assert done.attempt_number == 1 and done.machine == busy_machine
        wait_for(lambda: live_machines(store, "render") == [], timeout=15, what="scale to zero")
        gone = store.machines.get(busy_machine)
        assert gone.state == "destroyed" and gone.drain_reason == "idle_surplus"
        assert gone.destroyed_at is not None and gone.destroyed_at > (done.finished_at or 0)
    client.close()


def test_killing_a_running_job_stops_it_on_its_machine(tmp_path: Path, store_path: str) -> None:
    log = tmp_path / "backend.jsonl"
    config = project(
        tmp_path, {"render": {"min": 1}}, {"renderer": backend_app("render", "render_job", log)}
    )
    client, store = _client(store_path, config)
    with running_controller(tmp_path, config, store_path):
        job = client.run("renderer", "/render", {"gameId": "doomed", "seconds": 30})
        wait_for(lambda: any(e["event"] == "start" for e in backend_events(log)), what="started")
        pid_before = next(e["pid"] for e in backend_events(log) if e["event"] == "start")
        killed_at = time.monotonic()
        assert store.kill(job.id, time.time()).cancel_requested
        done = wait_for(
            lambda: store.get(job.id).status == "failed" and store.get(job.id), timeout=10
        )
        assert time.monotonic() - killed_at < 5  # with the next poll, not after the job's 30 s
        assert done.errors[-1]["code"] == "cancelled" and done.retries == 0
        # it was the machine's only job: the backend was restarted, so the work really stopped
        wait_for(
            lambda: any(
                e["event"] == "boot" and e["pid"] != pid_before for e in backend_events(log)
            ),
            what="a new backend process",
        )
        assert not any(e["event"] == "end" and e["gameId"] == "doomed" for e in backend_events(log))
    client.close()


def test_a_refusal_by_the_machine_cap_counts_as_a_failed_boot(
    tmp_path: Path, store_path: str
) -> None:
    log = tmp_path / "backend.jsonl"
    config = project(
        tmp_path, {"render": {"min": 2}}, {"renderer": backend_app("render", "render_job", log)}
    )
    client, store = _client(store_path, config)
    env = {"SPKY_POOL_MAX_MACHINES": "1", "SPKY_BREAKER_PAUSE": "30s"}
    with running_controller(tmp_path, config, store_path, **env) as controller:

        def opened_after_the_good_boot() -> Any:
            # Refusals may open the breaker before the one machine the cap allows is ready;
            # its good boot then closes it, and three more refusals open it again for good.
            good = [m for m in store.machines.recent("render") if m.ready_at is not None]
            incidents = controller.pool("render")["incidents"]
            after = good and incidents and incidents[0]["opened_at"] > (good[0].ready_at or 0)
            return after and (good, incidents)

        (good,), incident = wait_for(opened_after_the_good_boot, timeout=30, what="breaker")
        assert "the project's machine cap is 1" in incident[0]["message"]
        refused = sorted(
            (
                m
                for m in store.machines.recent("render")
                if (m.failed_reason or "").startswith("refused")
            ),
            key=lambda m: m.created_at,
        )
        assert all(m.state == "destroyed" for m in refused)
        # three refusals in a row, after the last good boot (which reset the count), opened it
        assert len([m for m in refused if m.created_at > (good.ready_at or 0)]) == 3
        assert len(live_machines(store, "render")) == 1  # the cap holds
    client.close()
