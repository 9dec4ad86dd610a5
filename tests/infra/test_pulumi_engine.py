"""Both stacks under the real Pulumi engine (scripts/pulumi-engine): a ``file://`` backend, a
passphrase, automatic plugin downloads off. The prod stack runs against the fake Hetzner API on
127.0.0.1, the local stack against this machine's Docker engine.

What a user does with a stack, one step at a time, each checked against what the cloud (or the
engine) really holds afterwards: preview, up with N machines, up without one of them, a change
of revision, refresh after a machine vanished behind Pulumi's back, destroy, and an update that
finds the stack locked by another.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from sp00ky_infra.config.loader import load_config
from sp00ky_infra.rehearse.cloud import TOKEN, FakeHetzner
from sp00ky_infra.shared import labels
from sp00ky_infra.shared.desired import CONTROLLER, UPDATED_BY_ENV
from tests.controllers import SECRET, ControllerProcess, wait_for
from tests.pulumi_engine import StackProject, example_config


def _revision(config: Path) -> str:
    loaded = load_config(config)
    return loaded.backend_for("render").revision(loaded.pools["render"])


def _prod(tmp_path: Path, pulumi_bin: str, cloud: FakeHetzner, **env: str) -> StackProject:
    config = example_config(tmp_path)
    project = StackProject.make(
        tmp_path, pulumi_bin, "prod",
        {"HCLOUD_TOKEN": TOKEN, "HCLOUD_ENDPOINT": cloud.url, UPDATED_BY_ENV: CONTROLLER, **env},
    )  # fmt: skip
    project.config("sp00ky:provider", "hetzner")
    project.config("sp00ky:configFile", str(config))
    project.config("sp00ky:project", "shop")
    project.config("sp00ky:poolUrl", "https://pool.shop.example")
    project.config("sp00ky:poolSecret", SECRET, secret=True)
    return project


def _servers(cloud: FakeHetzner) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in cloud.servers.values()}


def test_the_prod_stack_from_preview_to_destroy(tmp_path: Path, pulumi_bin: str) -> None:
    with FakeHetzner() as cloud:
        project = _prod(tmp_path, pulumi_bin, cloud)
        config = tmp_path / "sp00ky.yml"
        revision = _revision(config)
        project.machines({"render": {"render-a": revision, "render-b": revision}})

        # preview: the plan, and not one write to the cloud
        preview = json.loads(project.pulumi("preview", "--json").stdout)
        kinds = [step["op"] for step in preview["steps"]]
        assert kinds.count("create") == 5  # stack, pool, firewall, two servers
        assert not [r for r in cloud.requests if r[0] != "GET"]

        # up with two machines: two servers, one firewall with no rules on both
        assert project.up()["create"] == 5
        servers = _servers(cloud)
        assert sorted(servers) == ["render-a", "render-b"]
        (firewall,) = cloud.firewalls.values()
        assert firewall["rules"] == []
        assert {a["server"]["id"] for a in firewall["applied_to"]} == {
            s["id"] for s in servers.values()
        }
        for name, server in servers.items():
            assert server["labels"][labels.MACHINE] == name
            assert server["labels"][labels.PROJECT] == "shop"
            assert server["labels"][labels.REVISION] == revision
            assert server["user_data"].startswith("#cloud-config")
        ids = {name: s["id"] for name, s in servers.items()}

        # up without render-b: exactly render-b destroyed
        project.machines({"render": {"render-a": revision}})
        changes = project.up()
        assert changes.get("delete") == 1 and "create" not in changes
        assert sorted(_servers(cloud)) == ["render-a"]
        assert _servers(cloud)["render-a"]["id"] == ids["render-a"]

        # a new revision (another command) and another limit: render-a is updated in place,
        # keeps its own revision label, and nothing is replaced or created
        doc = yaml.safe_load(config.read_text())
        doc["apps"]["renderer"]["deploy"]["command"] = ["python3", "backend/server.py", "--v2"]
        doc["pools"]["render"]["max"] = 4
        config.write_text(yaml.safe_dump(doc, sort_keys=False))
        assert _revision(config) != revision
        cloud.requests.clear()
        changes = project.up()
        assert "create" not in changes and "replace" not in changes and "delete" not in changes
        assert changes.get("update", 0) >= 1
        server = _servers(cloud)["render-a"]
        assert server["id"] == ids["render-a"]
        assert server["labels"][labels.LIMIT] == str(load_config(config).pools["render"].limit)
        assert server["labels"][labels.REVISION] == revision
        assert ("POST", "/v1/servers") not in cloud.requests
        assert ("PUT", f"/v1/servers/{ids['render-a']}") in cloud.requests

        # refresh after render-a was deleted behind Pulumi's back: the state forgets it
        assert "render-a" in project.named("render-a")
        del cloud.servers[ids["render-a"]]
        for each in cloud.firewalls.values():
            each["applied_to"] = []
        project.pulumi("refresh", "--yes", "--skip-preview")
        assert "render-a" not in project.named("render-a")

        # destroy: nothing left in the cloud, nothing in the state
        project.pulumi("destroy", "--yes", "--skip-preview")
        assert cloud.servers == {} and cloud.firewalls == {}
        assert [r for r in project.resources() if r["type"] != "pulumi:pulumi:Stack"] == []


def test_an_update_that_finds_the_stack_locked_waits_and_fails_no_machine(
    tmp_path: Path, pulumi_bin: str
) -> None:
    """A `pulumi up` by hand holds the stack's lock (its server create stalls); the controller's
    provisioner, driving the same stack through the Automation API, sees a lock, not failed
    machines, and makes its machine once the lock is gone."""
    from sp00ky_infra.controller.provisioners.base import MachineSpec
    from sp00ky_infra.controller.provisioners.pulumi import PulumiProvisioner, automation_stack

    with FakeHetzner() as cloud:
        project = _prod(tmp_path, pulumi_bin, cloud)
        revision = _revision(tmp_path / "sp00ky.yml")
        project.machines({"render": {"render-a": revision}})
        cloud.create_then_stall = 8.0  # the hand-run up holds the lock while its create stalls
        by_hand = threading.Thread(target=project.up)
        by_hand.start()
        deadline = time.monotonic() + 60
        while not cloud.servers and time.monotonic() < deadline:
            time.sleep(0.1)
        assert cloud.servers, "the hand-run up never reached the cloud"

        # the Automation API runs the CLI with this process's environment
        saved = dict(os.environ)
        os.environ.update(
            {k: v for k, v in project.env.items() if k.startswith(("PULUMI", "HCLOUD", "PATH"))}
        )
        try:
            provisioner = PulumiProvisioner(
                lambda: automation_stack("prod", str(project.dir)), lock_retry=0.5
            )
            try:
                provisioner.adopt({"render": {"render-a": revision}})
                provisioner.create(
                    MachineSpec(
                        name="render-b", pool="render", backend="renderer", revision=revision,
                        controller_url="https://pool.shop.example",
                    )
                )  # fmt: skip
                deadline = time.monotonic() + 60
                while provisioner.locked_since is None and time.monotonic() < deadline:
                    assert provisioner.outcomes() == []  # no machine failed meanwhile
                    time.sleep(0.1)
                assert provisioner.locked_since is not None
                assert "locked" in provisioner.lock_message
                by_hand.join(timeout=120)
                cloud.create_then_stall = None
                outcomes: list[Any] = []
                deadline = time.monotonic() + 120
                while not outcomes and time.monotonic() < deadline:
                    outcomes = provisioner.outcomes()
                    time.sleep(0.2)
                assert [(o.machine, o.kind) for o in outcomes] == [("render-b", "created")]
                assert provisioner.locked_since is None
                assert sorted(_servers(cloud)) == ["render-a", "render-b"]
            finally:
                provisioner.close()
        finally:
            os.environ.clear()
            os.environ.update(saved)


def test_the_local_stack_from_up_to_destroy(
    tmp_path: Path, pulumi_bin: str, docker_engine: None
) -> None:
    from sp00ky_infra import engine

    client = engine.connect()
    config = example_config(tmp_path)
    revision = _revision(config)
    project = StackProject.make(tmp_path, pulumi_bin, "local", {UPDATED_BY_ENV: CONTROLLER})
    name = f"t{tmp_path.name[-8:].lower().replace('_', '')}"
    project.config("sp00ky:provider", "docker")
    project.config("sp00ky:configFile", str(config))
    project.config("sp00ky:project", name)
    project.config("sp00ky:poolUrl", "http://host.docker.internal:9")  # nothing answers there
    project.config("sp00ky:poolSecret", SECRET, secret=True)
    try:
        project.machines({"render": {"render-a": revision, "render-b": revision}})
        preview = json.loads(project.pulumi("preview", "--json").stdout)
        assert [step["op"] for step in preview["steps"]].count("create") == 5  # + the network
        assert engine.machine_containers(client, name) == []  # a preview makes nothing
        project.up()
        running = {c.labels[labels.MACHINE]: c for c in engine.machine_containers(client, name)}
        assert sorted(running) == ["render-a", "render-b"]
        assert running["render-a"].labels[labels.REVISION] == revision

        project.machines({"render": {"render-a": revision}})
        changes = project.up()
        assert changes.get("delete") == 1 and "create" not in changes
        left = engine.machine_containers(client, name)
        assert [c.labels[labels.MACHINE] for c in left] == ["render-a"]
        assert left[0].id == running["render-a"].id

        # a new revision: the running container is left as it is (its labels cannot change,
        # and a deploy is new machines under new names)
        doc = yaml.safe_load(config.read_text())
        doc["apps"]["renderer"]["deploy"]["command"] = ["python3", "/app/server.py", "--v2"]
        config.write_text(yaml.safe_dump(doc, sort_keys=False))
        changes = project.up()
        assert not {"create", "replace", "delete", "update"} & set(changes), changes
        (same,) = engine.machine_containers(client, name)
        assert same.id == left[0].id and same.labels[labels.REVISION] == revision

        assert "render-a" in project.named("render-a")
        left[0].remove(force=True)  # behind Pulumi's back
        project.pulumi("refresh", "--yes", "--skip-preview")
        assert "render-a" not in project.named("render-a")

        project.pulumi("destroy", "--yes", "--skip-preview")
        assert engine.machine_containers(client, name) == []
        assert [r for r in project.resources() if r["type"] != "pulumi:pulumi:Stack"] == []
    finally:
        for container in engine.machine_containers(client, name):
            container.remove(force=True)
        project.pulumi("destroy", "--yes", "--skip-preview", check=False)


def test_a_controller_drives_the_local_stack_through_the_automation_api(
    tmp_path: Path, pulumi_bin: str, docker_engine: None
) -> None:
    """The controller with SPKY_POOL_PROVIDER=pulumi on the local stack: queued jobs make it
    write sp00ky:machines and run `pulumi up`; the containers that update makes join it through
    the host's gateway and run the jobs; idle, the pool goes back to zero by another update."""
    from sp00ky_infra import engine
    from sp00ky_infra.client import Client

    client = engine.connect()
    gateway = engine.network_gateway(client, "bridge")
    with socket.socket() as probe:  # a free port on the gateway: the stack's URL names it
        probe.bind((gateway, 0))
        port = probe.getsockname()[1]
    config = example_config(tmp_path)
    name = f"t{tmp_path.name[-8:].lower().replace('_', '')}"
    project = StackProject.make(tmp_path, pulumi_bin, "local", {})
    project.config("sp00ky:provider", "docker")
    project.config("sp00ky:configFile", str(config))
    store_url = f"sqlite:///{tmp_path}/state.db"
    env = {
        **{k: v for k, v in project.env.items() if k.startswith(("PULUMI", "PATH"))},
        "SPKY_POOL_PROVIDER": "pulumi",
        "SPKY_PULUMI_STACK": "local",
        "SPKY_PULUMI_DIR": str(project.dir),
        "SPKY_PROJECT": name,
        "SPKY_POOL_HOST": gateway,
        "SPKY_POOL_PORT": str(port),
        "SPKY_POOL_PUBLIC_URL": f"http://host.docker.internal:{port}",
        "SPKY_POOL_TIMINGS": "lease=10s,idleTimeout=3s,bootTimeout=120s",
    }
    controller = ControllerProcess(tmp_path / "controller", config, store_url, env)
    jobs = Client(store_url, config)
    try:
        controller.env["SPKY_POOL_PORT"] = str(port)
        controller.start(timeout=300)
        ids = [
            jobs.run("renderer", "/render", {"gameId": f"g{n}", "seconds": 1}).id for n in range(3)
        ]

        def machines() -> list[str]:
            return sorted(c.labels[labels.MACHINE] for c in engine.machine_containers(client, name))

        wait_for(lambda: len(machines()) == 2, timeout=180, what="two machines by pulumi up")
        wait_for(
            lambda: all(jobs.store.get(i).status == "success" for i in ids),
            timeout=180,
            what="the jobs to succeed on the stack's machines",
        )
        wait_for(lambda: machines() == [], timeout=180, what="the pool back to zero")
        written = json.loads(project.pulumi("config", "get", "sp00ky:machines").stdout)
        assert written in ({"render": {}}, {}), written
        assert "pulumi up took" in controller.log()
    finally:
        controller.stop()
        jobs.close()
        for container in engine.machine_containers(client, name):
            container.remove(force=True)
        project.pulumi("destroy", "--yes", "--skip-preview", check=False)
