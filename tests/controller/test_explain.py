"""`sp00ky-infra explain`: one process test per cause of a waiting job, each cause set up for
real on a running controller, and a pool's explanation with its sizing numbers."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sp00ky_infra.client import Client
from tests.controllers import (
    ADMIN_TOKEN,
    ControllerProcess,
    backend_app,
    project,
    running_controller,
    wait_for,
)
from tests.helpers import cli

LONG = {"gameId": "g", "seconds": 30}  # a job that holds its slot for the whole test


@contextmanager
def pool_of(
    tmp_path: Path,
    pool: dict[str, Any],
    command: list[str] | None = None,
    method: dict[str, Any] | None = None,
    **env: str,
) -> Iterator[tuple[ControllerProcess, Client]]:
    app = backend_app("render", "render_job", tmp_path / "backend.jsonl", command)
    if method:
        app["method"].update(method)
    config = project(tmp_path, {"render": pool}, {"renderer": app})
    store_url = f"sqlite:///{tmp_path}/state.db"
    client = Client(store_url, config)
    try:
        with running_controller(tmp_path / "controller", config, store_url, **env) as controller:
            wait_for(controller.leader, what="the controller leading")
            yield controller, client
    finally:
        client.close()


def explain(controller: ControllerProcess, *target: str) -> dict[str, Any]:
    env = {"SPKY_ADMIN_URL": controller.admin_url, "SPKY_ADMIN_TOKEN": ADMIN_TOKEN}
    done = cli("explain", *target, "--json", env=env)
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def causes(controller: ControllerProcess, job_id: str) -> dict[str, dict[str, Any]]:
    found = explain(controller, job_id)
    assert found["status"] == "pending", found
    return {cause["code"]: cause for cause in found["causes"]}


def running(client: Client, job_id: str) -> bool:
    return client.store.get(job_id).status == "processing"


def test_delayed_until(tmp_path: Path) -> None:
    with pool_of(tmp_path, {"min": 0, "autoscale": True, "max": 1}) as (controller, client):
        job = client.run("renderer", "/render", {"gameId": "g"}, delay=60_000)
        found = causes(controller, job.id)
        assert found["delayed"]["until"] == job.run_after
        assert "delayed until" in found["delayed"]["message"]
        assert "queue_position" not in found


def test_pool_paused(tmp_path: Path) -> None:
    with pool_of(tmp_path, {"min": 0, "autoscale": True, "max": 1}) as (controller, client):
        assert controller.admin("POST", "/pools/render/pause").status_code == 200
        job = client.run("renderer", "/render", {"gameId": "g"})
        found = causes(controller, job.id)
        assert "pools resume render" in found["paused"]["message"]


def test_place_in_the_queue(tmp_path: Path) -> None:
    with pool_of(tmp_path, {"min": 0, "autoscale": True, "max": 1}) as (controller, client):
        first = client.run("renderer", "/render", LONG)
        second = client.run("renderer", "/render", LONG)
        third = client.run("renderer", "/render", LONG)
        wait_for(lambda: running(client, first.id), what="the first job running")
        found = causes(controller, third.id)
        assert found["queue_position"]["ahead"] == 1  # the second; the first runs
        assert found["queue_position"]["position"] == 2
        assert "queue_position" not in causes(controller, second.id)


def test_pool_at_max(tmp_path: Path) -> None:
    with pool_of(tmp_path, {"min": 0, "autoscale": True, "max": 1}) as (controller, client):
        first = client.run("renderer", "/render", LONG)
        second = client.run("renderer", "/render", LONG)
        wait_for(lambda: running(client, first.id), what="the first job running")
        found = causes(controller, second.id)
        assert (found["pool_at_max"]["max"], found["pool_at_max"]["needed"]) == (1, 2)


def test_head_of_line_waits_for_its_slots(tmp_path: Path) -> None:
    pool = {"min": 1, "autoscale": True, "max": 1, "slots": 2}
    with pool_of(tmp_path, pool) as (controller, client):
        small = client.run("renderer", "/render", LONG)
        wait_for(lambda: running(client, small.id), what="the one-slot job running")
        big = client.run("renderer", "/render", {"gameId": "big"}, slots=2)
        behind = client.run("renderer", "/render", {"gameId": "small"})
        found = causes(controller, big.id)
        head = found["head_of_line"]
        assert (head["head"], head["needs"], head["most_free"]) == (big.id, 2, 1)
        assert "it needs 2 slot(s)" in head["message"]
        # the one-slot job behind it would fit, and still waits: nothing overtakes the head
        assert causes(controller, behind.id)["head_of_line"]["head"] == big.id
        assert client.store.get(behind.id).status == "pending"


def test_table_concurrency(tmp_path: Path) -> None:
    pool = {"min": 0, "autoscale": True, "max": 2}
    with pool_of(tmp_path, pool, method={"concurrency": 1}) as (controller, client):
        first = client.run("renderer", "/render", LONG)
        wait_for(lambda: running(client, first.id), what="the first job running")
        second = client.run("renderer", "/render", LONG)
        found = causes(controller, second.id)
        assert (found["concurrency"]["in_flight"], found["concurrency"]["concurrency"]) == (1, 1)


def test_breaker_open_until(tmp_path: Path) -> None:
    failing = [sys.executable, "-c", "raise SystemExit(3)"]  # the backend never starts
    pool = {"min": 0, "autoscale": True, "max": 1}
    with pool_of(tmp_path, pool, failing, SPKY_BREAKER_PAUSE="60s") as (controller, client):
        job = client.run("renderer", "/render", {"gameId": "g"})
        breaker = wait_for(
            lambda: (b := controller.pool("render")["breaker"])["open"] and b,
            timeout=60,
            what="three failed boots opening the breaker",
        )
        found = causes(controller, job.id)
        assert found["breaker_open"]["until"] == breaker["open_until"]
        assert found["breaker_open"]["failures"] >= 3
        # the cause names the last failed boot's reason: the backend exited, and how
        last = found["breaker_open"]["last_failure"]
        assert "exited before it was ready" in last["reason"], last
        assert f"the last, {last['machine']}, failed: " in found["breaker_open"]["message"]
        pool = explain(controller, "pool", "render")
        assert pool["last_failed_boot"] == last and pool["breaker_failures"] >= 3


def test_machine_booting_since(tmp_path: Path) -> None:
    slow = [sys.executable, "-c", "import time; time.sleep(60)"]  # never answers its healthcheck
    timings = "lease=3s,idleTimeout=2s,bootTimeout=60s"
    pool = {"min": 0, "autoscale": True, "max": 1}
    with pool_of(tmp_path, pool, slow, SPKY_POOL_TIMINGS=timings) as (controller, client):
        job = client.run("renderer", "/render", {"gameId": "g"})
        machine = wait_for(
            lambda: next(iter(client.store.machines.live("render")), None),
            what="a machine for the job",
        )
        found = causes(controller, job.id)
        assert found["machine_booting"]["machine"] == machine.name
        assert found["machine_booting"]["since"] == machine.created_at


def test_explain_pool_gives_the_sizing_rule_and_each_machines_reason(tmp_path: Path) -> None:
    pool = {"min": 2, "autoscale": True, "max": 3, "buffer": 1}
    with pool_of(tmp_path, pool) as (controller, _client):
        wait_for(
            lambda: controller.pool("render")["machines"].get("ready") == 2,
            what="the pool's min of 2 ready",
        )
        found = explain(controller, "pool", "render")
        assert found["desired"] == 2 and found["capacity"] == 1 and found["needed"] == 1
        assert "buffer 1 x slots 1 = 1" in found["rule"]
        assert "desired = clamp(1, min 2, max 3) = 2" in found["rule"]
        assert [m["state"] for m in found["machines"]] == ["ready", "ready"]
        assert all(m["reason"].startswith("idle") for m in found["machines"])
        env = {"SPKY_ADMIN_URL": controller.admin_url, "SPKY_ADMIN_TOKEN": ADMIN_TOKEN}
        text = cli("explain", "pool", "render", env=env).stdout
        assert text.startswith("pool render: capacity = busy 0 + queued 0 + buffer 1")
        # a hetzner pool run on local processes (SPKY_POOL_PROVIDER=local): both said
        assert text.splitlines()[1] == (
            "  on local (hetzner in sp00ky.yml), its machines made by local"
        )
