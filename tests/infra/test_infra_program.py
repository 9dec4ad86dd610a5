"""The Pulumi program's shape under pulumi.runtime.set_mocks (the user-data itself:
tests/infra/test_cloud_init.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml
from pulumi.dynamic import ResourceProvider
from pulumi.dynamic.dynamic import serialize_provider

from sp00ky_infra.config.loader import load_config
from sp00ky_infra.infra.firewall import HetznerFirewallProvider
from sp00ky_infra.infra.machine import HetznerMachineProvider
from sp00ky_infra.shared import tokens
from tests.configs import varied


@pytest.fixture(autouse=True)
def event_loop() -> Any:
    """An event loop of the test's own for pulumi's mocks, which take the thread's current one:
    a test before it on this worker may have closed it (asyncio.run)."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield loop
    asyncio.set_event_loop(None)
    loop.close()


SECRET = "pool-secret-for-tests"
BACKEND_SECRET = "s3cret-backend-api-key"


class Mocks(pulumi.runtime.Mocks):
    def __init__(self) -> None:
        self.resources: list[pulumi.runtime.MockResourceArgs] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        self.resources.append(args)
        return f"{args.name}-id", dict(args.inputs)

    def call(
        self, args: pulumi.runtime.MockCallArgs
    ) -> tuple[dict[Any, Any], list[tuple[str, str]] | None]:
        return {}, None


def _config(tmp_path: Path, *changes: tuple[str, Any], batch: dict[str, Any] | None = None) -> Any:
    data = varied(
        ("pools.render.machine", {"type": "cpx42", "locations": ["fsn1", "nbg1"],
                                  "types": ["ccx33"], "image": "sp00ky/agent=abc"}),
        ("apps.renderer.env", {"API_KEY": BACKEND_SECRET, "MODE": "fast-render-mode"}),
        ("pools.batch", {"min": 1, **(batch or {})}),
        ("apps.batcher", {
            "type": "backend", "runOn": {"pool": "batch"},
            "method": {"type": "outbox", "table": "batch_job"},
            "deploy": {"dockerfile": "./Dockerfile", "port": 9000, "healthcheck": "/ok"},
            "env": {"TOKEN": "batch-token-value"},
        }),
        *changes,
    )  # fmt: skip
    data["apps"]["renderer"].pop("spec")
    path = tmp_path / "sp00ky.yml"
    path.write_text(yaml.safe_dump(data))
    return load_config(path)


def _run_program(
    tmp_path: Path, provider: str, machines: dict[str, Any], images: dict[str, str] | None = None,
    *changes: tuple[str, Any], batch: dict[str, Any] | None = None,
) -> Mocks:  # fmt: skip
    from sp00ky_infra.infra.program import build

    mocks = Mocks()
    pulumi.runtime.set_mocks(mocks, project="shop", stack="prod", preview=False)
    config = _config(tmp_path, *changes, batch=batch)

    @pulumi.runtime.test  # type: ignore[untyped-decorator]
    def program() -> pulumi.Output[Any]:
        components = build(
            config, provider, machines, "https://pool.example.com", SECRET, "shop", images
        )
        return pulumi.Output.all(*(c.urn for c in components.values()))

    program()
    return mocks


def _of_type(mocks: Mocks, kind: str) -> list[pulumi.runtime.MockResourceArgs]:
    return [r for r in mocks.resources if r.typ == kind]


def _provided_by(
    mocks: Mocks, provider: type[ResourceProvider]
) -> list[pulumi.runtime.MockResourceArgs]:
    """The dynamic resources whose serialized provider is ``provider`` (every dynamic resource
    has the type ``pulumi-python:dynamic:Resource``; the provider tells them apart)."""
    wanted = serialize_provider(provider())
    return [
        r
        for r in _of_type(mocks, "pulumi-python:dynamic:Resource")
        if _unwrapped(r.inputs.get("__provider")) == wanted
    ]


def _unwrapped(value: Any) -> Any:
    """A secret input travels wrapped in Pulumi's secret envelope."""
    return value["value"] if isinstance(value, dict) else value


MACHINES = {"render": ["render-a1", "render-b2", "render-c3"], "batch": ["batch-x9"]}


def test_every_hetzner_pool_has_a_firewall_with_no_inbound_rule(tmp_path: Path) -> None:
    mocks = _run_program(tmp_path, "hetzner", MACHINES)
    assert not [r for r in mocks.resources if r.typ.startswith("hcloud:")]  # no pulumi_hcloud
    firewalls = _provided_by(mocks, HetznerFirewallProvider)
    assert sorted((f.name, f.inputs["name"]) for f in firewalls) == [
        ("batch-firewall", "sp00ky-shop-batch"),
        ("render-firewall", "sp00ky-shop-render"),
    ]
    for firewall in firewalls:
        pool = firewall.name.removesuffix("-firewall")
        assert firewall.inputs["labels"] == {
            "sp00ky/project": "shop",
            "sp00ky/pool": pool,
            "sp00ky/limit": "2" if pool == "render" else "1",
        }
        # nothing says rules: the provider makes it with none (no inbound, all outbound)
        assert sorted(firewall.inputs) == ["__provider", "labels", "name"]


@pytest.mark.parametrize("stack", ["hetzner", "docker"])
def test_a_stack_makes_nothing_for_a_docker_pool(tmp_path: Path, stack: str) -> None:
    """Pool batch is provider docker: its machines are containers the controller makes on its
    own engine; the stack (hetzner, or docker: a hetzner pool's stack run here) serves
    render only, and refuses machines of batch rather than drop them."""
    render = {"render": ["render-a1"]}
    mocks = _run_program(tmp_path, stack, render, batch={"provider": "docker"})
    pools = [r.name for r in mocks.resources if r.typ.startswith("sp00ky:infra:")]
    assert pools == ["render"]
    assert [f.name for f in _provided_by(mocks, HetznerFirewallProvider)] == (
        ["render-firewall"] if stack == "hetzner" else []
    )
    assert all("batch" not in r.name for r in mocks.resources)
    from sp00ky_infra.infra.program import build

    config = _config(tmp_path, batch={"provider": "docker"})
    with pytest.raises(ValueError, match="names pools that are not hetzner pools: batch"):
        build(config, stack, {**render, "batch": ["batch-x9"]}, "https://p", SECRET, "shop")


def test_machines_follow_the_stack_name_for_name_with_firewall_labels_and_x86(
    tmp_path: Path,
) -> None:
    mocks = _run_program(tmp_path, "hetzner", MACHINES)
    machines = _provided_by(mocks, HetznerMachineProvider)
    assert sorted(m.name for m in machines) == sorted(
        n for names in MACHINES.values() for n in names
    )
    config = _config(tmp_path)
    for machine in machines:
        inputs = machine.inputs
        pool = "batch" if machine.name.startswith("batch") else "render"
        assert inputs["firewall_ids"] == [f"{pool}-firewall-id"]
        assert inputs["labels"] == {
            "sp00ky/project": "shop",
            "sp00ky/pool": pool,
            "sp00ky/machine": machine.name,
            "sp00ky/revision": config.backend_for(pool).revision(config.pools[pool]),
            "sp00ky/limit": "2" if pool == "render" else "1",
        }
        assert inputs["server_type"] in ("cpx42", "cx33")
        assert all(
            t.startswith(("cx", "cpx", "ccx"))
            for t in [inputs["server_type"], *inputs["fallback_types"]]
        )
    render = next(m for m in machines if m.name == "render-a1")
    assert (render.inputs["locations"], render.inputs["fallback_types"]) == (
        ["fsn1", "nbg1"],
        ["ccx33"],
    )
    batch = next(m for m in machines if m.name == "batch-x9")
    assert (render.inputs["image"], batch.inputs["image"]) == ("sp00ky/agent=abc", "docker-ce")


def test_a_baked_pool_boots_the_image_the_stack_names_for_it_else_docker_ce(
    tmp_path: Path,
) -> None:
    selector = "sp00ky/project=shop,sp00ky/pool=batch,sp00ky/role=snapshot,sp00ky/recipe=abc"
    for images, wanted in (({}, "docker-ce"), ({"batch": selector}, selector)):
        baked = ("pools.batch.machine", {"image": "baked"})
        mocks = _run_program(tmp_path, "hetzner", MACHINES, images, baked)
        found = {m.name: m.inputs["image"] for m in _provided_by(mocks, HetznerMachineProvider)}
        assert found["batch-x9"] == wanted
        assert found["render-a1"] == "sp00ky/agent=abc"  # its own image: the stack's is not


def test_removing_a_name_removes_exactly_that_machine(tmp_path: Path) -> None:
    mocks = _run_program(tmp_path, "hetzner", {"render": ["render-a1", "render-c3"]})
    assert sorted(m.name for m in _provided_by(mocks, HetznerMachineProvider)) == [
        "render-a1",
        "render-c3",
    ]


def test_user_data_carries_a_join_token_and_no_value_of_the_backends_env(tmp_path: Path) -> None:
    mocks = _run_program(tmp_path, "hetzner", MACHINES)
    for machine in _provided_by(mocks, HetznerMachineProvider):
        text = machine.inputs["user_data"]
        if isinstance(text, dict):  # a secret travels wrapped in Pulumi's secret envelope
            text = text["value"]
        for secret in (BACKEND_SECRET, "fast-render-mode", "batch-token-value", SECRET):
            assert secret not in text
        settings = _agent_settings(text)
        assert settings["machine"] == machine.name
        assert settings["controller_url"] == "https://pool.example.com"
        assert settings["poweroff"] == ["systemctl", "poweroff"]  # out of contact: power off
        claim = tokens.verify_join_token(
            SECRET, settings["join_token"], machine.name, __import__("time").time()
        )
        assert claim.machine == machine.name


def test_the_local_docker_stack_runs_the_machine_image_and_publishes_no_port(
    tmp_path: Path,
) -> None:
    mocks = _run_program(tmp_path, "docker", {"render": ["render-a1"], "batch": []})
    assert not [r for r in mocks.resources if r.typ.startswith("docker:")]  # no pulumi_docker
    dynamic = _of_type(mocks, "pulumi-python:dynamic:Resource")
    (network,) = [r for r in dynamic if r.name == "sp00ky-network"]
    assert network.inputs["name"] == "sp00ky-shop" and network.inputs["project"] == "shop"
    (container,) = [r for r in dynamic if r.name != "sp00ky-network"]
    inputs = container.inputs
    assert container.name == "render-a1" and inputs["name"] == "render-a1"
    assert inputs["image"] == "sp00ky-dev-machine-renderer"  # the pool image + the agent
    assert inputs["backend"] == "renderer" and inputs["dockerfile"].endswith("Dockerfile")
    assert inputs["ports"] == []  # the backend's port is never published
    assert inputs["extra_hosts"] == {"host.docker.internal": "host-gateway"}
    assert inputs["network"] == "sp00ky-shop"
    assert inputs["controller_url"] == "https://pool.example.com"
    assert inputs["labels"]["sp00ky/machine"] == "render-a1"
    assert inputs["labels"]["sp00ky/pool"] == "render"
    token = inputs["join_token"]
    if isinstance(token, dict):  # a secret travels wrapped in Pulumi's secret envelope
        token = token["value"]
    claim = tokens.verify_join_token(SECRET, token, "render-a1", __import__("time").time())
    assert claim.machine == "render-a1"
    assert BACKEND_SECRET not in repr(inputs)


def test_unknown_pools_in_the_stack_are_refused(tmp_path: Path) -> None:
    with pytest.raises(
        Exception, match=r"sp00ky:machines names pools that sp00ky\.yml does not declare: ghost"
    ):
        _run_program(tmp_path, "hetzner", {"ghost": ["g1"]})


def _agent_settings(text: str) -> dict[str, Any]:
    document = yaml.safe_load(text)
    (entry,) = [f for f in document["write_files"] if f["path"] == "/etc/sp00ky/agent.json"]
    assert entry["permissions"] == "0600"
    settings: dict[str, Any] = json.loads(entry["content"])
    return settings


def test_a_machine_keeps_the_revision_it_runs_until_it_is_destroyed(tmp_path: Path) -> None:
    """After a deploy the old machines drain under their own revision: the program labels each
    machine with the revision the stack gives it, new ones with the pool's."""
    machines = {"render": {"render-old": "r-before", "render-new": None}, "batch": {}}
    mocks = _run_program(tmp_path, "hetzner", machines)
    config = _config(tmp_path)
    current = config.backend_for("render").revision(config.pools["render"])
    revisions = {
        m.name: m.inputs["labels"]["sp00ky/revision"]
        for m in _provided_by(mocks, HetznerMachineProvider)
    }
    assert revisions == {"render-old": "r-before", "render-new": current}


def test_a_run_by_hand_keeps_every_machine_that_exists(monkeypatch: pytest.MonkeyPatch) -> None:
    from sp00ky_infra.infra.existing import CannotTell, machines_for_run
    from sp00ky_infra.rehearse.cloud import TOKEN, FakeHetzner
    from sp00ky_infra.shared.desired import Desired

    stale = Desired.parse({"render": ["render-a1"]})  # a checkout's old sp00ky:machines
    with FakeHetzner() as fake:
        running = {"sp00ky/project": "shop", "sp00ky/pool": "render", "sp00ky/revision": "r0"}
        fake.add_server("render-b2", {**running, "sp00ky/machine": "render-b2"})
        fake.add_server("other-c3", {**running, "sp00ky/project": "other",
                                     "sp00ky/machine": "other-c3"})  # fmt: skip
        monkeypatch.setenv("HCLOUD_ENDPOINT", fake.url)
        monkeypatch.setenv("HCLOUD_TOKEN", TOKEN)
        kept, added = machines_for_run(stale, "hetzner", "shop", None)
        assert kept.as_json() == {"render": {"render-a1": None, "render-b2": "r0"}}
        assert added == ["render-b2"]
        # the controller's own run is the owner: it takes machines away
        assert machines_for_run(stale, "hetzner", "shop", "controller") == (stale, [])
        monkeypatch.setenv("HCLOUD_TOKEN", "wrong")
        with pytest.raises(CannotTell, match="cannot list project shop's servers"):
            machines_for_run(stale, "hetzner", "shop", None)


def test_the_stacks_machines_are_read_in_both_forms_and_refused_otherwise() -> None:
    from sp00ky_infra.shared.desired import Desired, DesiredError

    assert Desired.parse({"render": ["a"]}).of("render") == {"a": None}
    assert Desired.parse({"render": {"a": "r1"}}).of("render") == {"a": "r1"}
    assert Desired.parse(None).pools == []
    with pytest.raises(DesiredError, match=r"sp00ky:machines\.render must be a list"):
        Desired.parse({"render": "a"})
