"""A pool with ``machine.image: baked`` against the fake Hetzner API (no boot mode): the
controller's bake runs in the background while the pool's first machine boots docker-ce; once
the snapshot is made, a later machine boots it and the first keeps its own image. A bake
that fails says so in ``explain pool`` and leaves the pool on docker-ce. The stack here runs
the program's own choice of image (``infra/program.py: boot_image``) and the machine
provider's own create (``infra/machine.py: create_server``) on each update."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from sp00ky_infra.config.loader import load_config
from sp00ky_infra.controller.baking import (
    RETRY_SECONDS,
    STOPPED,
    Bakes,
    Outcome,
    baked_requests,
    outcome_line,
    parse_outcome,
    start_bakes,
)
from sp00ky_infra.controller.images import PoolImage
from sp00ky_infra.controller.pricing import refresh_snapshots
from sp00ky_infra.controller.provisioners import MachineSpec
from sp00ky_infra.controller.provisioners.by_pool import ByPool
from sp00ky_infra.controller.provisioners.pulumi import PulumiProvisioner
from sp00ky_infra.controller.settings import ControllerSettings
from sp00ky_infra.hetzner.client import HetznerAPI
from sp00ky_infra.infra.machine import create_server
from sp00ky_infra.infra.program import boot_image
from sp00ky_infra.policy.explain import Bake
from sp00ky_infra.rehearse.cloud import TOKEN, FakeHetzner
from sp00ky_infra.shared.cloud_init import agent_sha256
from sp00ky_infra.shared.recipe import Recipe
from sp00ky_infra.store import open_store
from sp00ky_infra.store.snapshots import SnapshotTable
from tests.controllers import backend_app, project, wait_for

IMAGE = PoolImage("registry", "registry.example/render@sha256:" + "b" * 64)


class ProgramStack:
    """A stack whose ``up`` makes each new machine's server as the program does: the image
    its pool boots read from ``sp00ky:images``, created through the machine provider."""

    def __init__(self, cloud: FakeHetzner, config: Any) -> None:
        self.cloud, self.config = cloud, config
        self.settings: dict[str, Any] = {}
        self.ids: dict[str, str] = {}

    def get_all_config(self) -> dict[str, Any]:
        return dict(self.settings)

    def set_config(self, key: str, value: Any, *, path: bool = False) -> None:
        self.settings[key] = value

    def up(self, *, on_output: Any = None, on_event: Any = None) -> None:
        machines = json.loads(self.settings["sp00ky:machines"].value)
        images = json.loads(getattr(self.settings.get("sp00ky:images"), "value", "{}"))
        for pool, names in machines.items():
            image = boot_image(self.config.pools[pool], images)
            for name in set(names) - set(self.ids):
                server, _ = create_server(_api(self.cloud), {
                    "name": name, "server_type": "cx23", "image": image, "user_data": "",
                })  # fmt: skip
                self.ids[name] = str(server.id)

    def outputs(self) -> dict[str, Any]:
        return {"machines": self.ids}


def _api(cloud: FakeHetzner) -> HetznerAPI:
    return HetznerAPI(TOKEN, cloud.url, wait=lambda *_: 0.0, sleep=lambda _: time.sleep(0.05))


@pytest.fixture
def cloud() -> Iterator[FakeHetzner]:
    with FakeHetzner() as fake:
        yield fake


def _baked_pool(
    tmp_path: Path, cloud: FakeHetzner, retry: float = RETRY_SECONDS, listed: Any = None
) -> tuple[PulumiProvisioner, Bakes, Any]:
    """A controller's provisioner and bakes for a baked pool, started as its leader starts
    them."""
    config = _config(tmp_path)
    provisioner = PulumiProvisioner(lambda: ProgramStack(cloud, config))
    bakes = Bakes(provisioner, lambda: _api(cloud), ("127.0.0.1", "127.0.0.1"), retry=retry,
                  listed=listed)  # fmt: skip
    provisioner.bakes = bakes
    bakes.prepare(baked_requests(config, "shop", {"render": IMAGE}))
    bakes.on_leadership(True)
    return provisioner, bakes, config


def _config(tmp_path: Path) -> Any:
    app = backend_app("render", "render_job", tmp_path / "unused.jsonl")
    app["deploy"] = {"image": "registry.example/render:1", "port": 8080, "healthcheck": "/health"}
    pools = {"render": {"min": 0, "autoscale": True, "max": 2, "machine": {"image": "baked"}}}
    return load_config(project(tmp_path, pools, {"renderer": app}))


def _bake_server(cloud: FakeHetzner) -> dict[str, Any]:
    found: dict[str, Any] = wait_for(
        lambda: next((s for s in list(cloud.servers.values())
                      if s["name"].startswith("sp00ky-bake-shop-render-")), None),
        what="the bake server",
    )  # fmt: skip
    return found


def _created(cloud: FakeHetzner, provisioner: PulumiProvisioner, name: str) -> dict[str, Any]:
    """Ask for machine ``name``; its server once the update made it."""
    provisioner.create(MachineSpec(name, "render", "renderer", "r1", "https://p.example", "t"))
    server: dict[str, Any] = wait_for(
        lambda: next((s for s in list(cloud.servers.values()) if s["name"] == name), None),
        what=f"server {name}",
    )
    return server


def test_the_first_machine_boots_docker_ce_while_the_bake_runs_and_a_later_one_the_snapshot(
    tmp_path: Path, cloud: FakeHetzner, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "sp00ky.controller")
    provisioner, bakes, _ = _baked_pool(tmp_path, cloud)
    try:
        bake_server = _bake_server(cloud)
        assert bake_server["image"]["name"] == "docker-ce"  # the snapshot's base
        first = _created(cloud, provisioner, "render-a1")
        assert first["image"]["name"] == "docker-ce"
        state = bakes.state("render")
        assert state is not None and (state.status, state.image) == ("baking", "docker-ce")
        assert "new machines boot the base image docker-ce until it is made" in state.message()

        # the bake server powers itself off once Docker, the agent and the image are on it
        _api(cloud).request("POST", f"/servers/{bake_server['id']}/actions/poweroff")
        done: Bake = wait_for(
            lambda: (s := bakes.state("render")) is not None and s.status == "baked" and s,
            what="the bake done",
        )  # fmt: skip
        labels = cloud.snapshots[done.snapshot or 0]["labels"]
        recipe = Recipe("docker-ce", agent_sha256(), IMAGE.reference)
        assert labels == recipe.labels("shop", "render")
        assert bake_server["id"] not in cloud.servers  # deleted once snapshotted

        later = _created(cloud, provisioner, "render-b2")
        assert later["image"]["id"] == done.snapshot
        assert cloud.servers[first["id"]]["image"]["name"] == "docker-ce"  # kept, not replaced
        assert (
            done.message() == f"machine.image baked: new machines boot its snapshot {done.snapshot}"
        )
    finally:
        provisioner.close()
    lines = [parse_outcome(r.getMessage()) for r in caplog.records]
    (outcome,) = [o for o in lines if o is not None]
    assert (outcome.pool, outcome.snapshot) == ("render", done.snapshot) and outcome.seconds > 0
    steps = [
        r.getMessage() for r in caplog.records if r.getMessage().startswith("pool render: bake: ")
    ]
    assert any("creating bake server" in line for line in steps), steps


def test_a_snapshot_of_the_recipe_is_booted_at_once_and_no_server_baked(
    tmp_path: Path, cloud: FakeHetzner
) -> None:
    server = cloud.add_server("earlier-bake", {})
    recipe = Recipe("docker-ce", agent_sha256(), IMAGE.reference)
    image, _ = _api(cloud).create_image(server["id"], "render", recipe.labels("shop", "render"))
    del cloud.servers[server["id"]]
    provisioner, bakes, _ = _baked_pool(tmp_path, cloud)
    try:
        wait_for(lambda: (s := bakes.state("render")) is not None and s.status == "baked")
        assert _created(cloud, provisioner, "render-a1")["image"]["id"] == image.id
        assert ("POST", "/v1/servers") in cloud.requests
        assert [s["name"] for s in cloud.servers.values()] == ["render-a1"]  # no bake server
    finally:
        provisioner.close()


def test_a_bake_lists_the_project_s_snapshots_into_the_store_for_their_cost(
    tmp_path: Path, cloud: FakeHetzner
) -> None:
    store = open_store(f"sqlite:///{tmp_path}/state.db")
    listed = lambda api: refresh_snapshots(store, api, "shop", time.time())  # noqa: E731
    provisioner, bakes, _ = _baked_pool(tmp_path, cloud, listed=listed)
    try:
        bake_server = _bake_server(cloud)
        assert SnapshotTable(store).read() is None  # nothing listed before the bake is done
        _api(cloud).request("POST", f"/servers/{bake_server['id']}/actions/poweroff")
        done: Bake = wait_for(
            lambda: (s := bakes.state("render")) is not None and s.status == "baked" and s,
            what="the bake done",
        )  # fmt: skip
        kept = wait_for(SnapshotTable(store).read, what="the snapshots listed")
        assert [(s.id, s.pool) for s in kept.snapshots] == [(done.snapshot, "render")]
    finally:
        provisioner.close()
        store.close()


def _report_failure(bake_server: dict[str, Any], reason: str) -> None:
    """The bake server's own report, as cloud-init/bake.py sends it from its user-data."""
    files = yaml.safe_load(bake_server["user_data"])["write_files"]
    found = next(f for f in files if f["path"] == "/etc/sp00ky/bake.json")
    settings = json.loads(found["content"])
    requests.post(
        f"{settings['url']}/failed", json={"reason": reason},
        headers={"Authorization": f"Bearer {settings['token']}"}, timeout=10,
    ).raise_for_status()  # fmt: skip


def test_a_failed_bake_is_tried_again_after_its_pause(tmp_path: Path, cloud: FakeHetzner) -> None:
    provisioner, bakes, _ = _baked_pool(tmp_path, cloud, retry=0.5)
    try:
        first = _bake_server(cloud)
        _report_failure(first, "the registry answered 503")
        wait_for(lambda: first["id"] not in cloud.servers, what="the failed bake's server gone")
        again = _bake_server(cloud)
        assert again["id"] != first["id"]
        _api(cloud).request("POST", f"/servers/{again['id']}/actions/poweroff")
        wait_for(lambda: (s := bakes.state("render")) is not None and s.status == "baked")
    finally:
        provisioner.close()


def test_a_bakes_outcome_line_reads_back() -> None:
    for outcome in (
        Outcome("render", 412.0, 4711),
        Outcome("render", 95.2, step="install", reason="bake server 3 failed: apt: exit 100"),
    ):
        assert parse_outcome("2026-12-05 10:45:34,300 INFO " + outcome_line(outcome)) == outcome
    assert parse_outcome("pool render: bake: creating bake server x") is None


def test_a_failed_bake_leaves_the_pool_on_docker_ce_and_explain_says_when_it_is_retried(
    tmp_path: Path, cloud: FakeHetzner
) -> None:
    provisioner, bakes, _ = _baked_pool(tmp_path, cloud)
    try:
        bake_server = _bake_server(cloud)
        _report_failure(bake_server, "apt-get install docker.io exited 100")
        failed: Bake = wait_for(
            lambda: (s := bakes.state("render")) is not None and s.status == "failed" and s,
            what="the bake failed",
        )  # fmt: skip
        assert bake_server["id"] not in cloud.servers
        assert (failed.image, failed.step) == ("docker-ce", "install")
        assert failed.retry_at is not None and failed.retry_at - failed.since == 3600.0
        assert failed.message().startswith(
            "machine.image baked: new machines boot the base image docker-ce because its bake "
            "failed at step install (bake server "
        )
        assert (
            "apt-get install docker.io exited 100); it is tried again at the next deploy or at "
            in failed.message()
        )
        assert _created(cloud, provisioner, "render-a1")["image"]["name"] == "docker-ce"
    finally:
        provisioner.close()


def test_a_stopping_controller_deletes_the_server_of_a_bake_under_way(
    tmp_path: Path, cloud: FakeHetzner
) -> None:
    provisioner, bakes, _ = _baked_pool(tmp_path, cloud)
    bake_server = _bake_server(cloud)
    provisioner.close()
    assert bake_server["id"] not in cloud.servers and cloud.snapshots == {}
    state = bakes.state("render")
    assert state is not None and state.status == "failed" and STOPPED in state.reason


def test_the_bakes_start_on_the_stack_of_a_controller_that_serves_pools_by_provider(
    tmp_path: Path, cloud: FakeHetzner
) -> None:
    config = _config(tmp_path)
    stack = PulumiProvisioner(lambda: ProgramStack(cloud, config))
    routed = ByPool({"render": stack})
    settings = ControllerSettings(secret="s", project="shop", state_dir=str(tmp_path))
    try:
        bakes = start_bakes(settings, config, routed, {"render": IMAGE}, None)
        assert bakes is not None and stack.bakes is bakes
        state = bakes.state("render")
        assert state is not None and (state.status, state.image) == ("baking", "docker-ce")
    finally:
        stack.close()
