"""The Pulumi program's shape under pulumi.runtime.set_mocks, and its user-data checked by the
real `cloud-init schema`."""

from __future__ import annotations

import ast
import asyncio
import base64
import dataclasses
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import types
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
from sp00ky_infra.shared.cloud_init import (
    USER_DATA_LIMIT,
    UserDataTooLarge,
    shipped_source,
    user_data,
)
from tests.configs import varied
from tests.conftest import need_service
from tests.helpers import ROOT


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


def _config(tmp_path: Path) -> Any:
    data = varied(
        ("pools.render.machine", {"type": "cpx42", "locations": ["fsn1", "nbg1"],
                                  "types": ["ccx33"], "image": "sp00ky/agent=abc"}),
        ("apps.renderer.env", {"API_KEY": BACKEND_SECRET, "MODE": "fast-render-mode"}),
        ("pools.batch", {"min": 1}),
        ("apps.batcher", {
            "type": "backend", "runOn": {"pool": "batch"},
            "method": {"type": "outbox", "table": "batch_job"},
            "deploy": {"dockerfile": "./Dockerfile", "port": 9000, "healthcheck": "/ok"},
            "env": {"TOKEN": "batch-token-value"},
        }),
    )  # fmt: skip
    data["apps"]["renderer"].pop("spec")
    path = tmp_path / "sp00ky.yml"
    path.write_text(yaml.safe_dump(data))
    return load_config(path)


def _run_program(tmp_path: Path, provider: str, machines: dict[str, Any]) -> Mocks:
    from sp00ky_infra.infra.program import build

    mocks = Mocks()
    pulumi.runtime.set_mocks(mocks, project="shop", stack="prod", preview=False)
    config = _config(tmp_path)

    @pulumi.runtime.test  # type: ignore[untyped-decorator]
    def program() -> pulumi.Output[Any]:
        components = build(config, provider, machines, "https://pool.example.com", SECRET, "shop")
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


# --- cloud-init --------------------------------------------------------------------------------


def _agent_settings(text: str) -> dict[str, Any]:
    import json

    document = yaml.safe_load(text)
    (entry,) = [f for f in document["write_files"] if f["path"] == "/etc/sp00ky/agent.json"]
    assert entry["permissions"] == "0600"
    settings: dict[str, Any] = json.loads(entry["content"])
    return settings


@pytest.mark.parametrize("machine", ["render-a1", "a-rather-long-machine-name-0123456789"])
def test_user_data_passes_cloud_init_schema_and_fits_hetzners_limit(
    tmp_path: Path, machine: str
) -> None:
    if shutil.which("cloud-init") is None:
        need_service(
            "cloud-init", "apt-get install cloud-init (its `schema` command checks user-data)"
        )
    token = tokens.issue_join_token(SECRET, machine, 0, ttl=10**10)
    text = user_data(machine, "https://pool.example.com", token)
    assert text.startswith("#cloud-config\n") and len(text.encode()) <= USER_DATA_LIMIT
    path = tmp_path / "user-data.yaml"
    path.write_text(text)
    checked = subprocess.run(
        ["cloud-init", "schema", "--config-file", str(path)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "Valid" in checked.stdout


def _without_docstrings(tree: ast.Module) -> ast.Module:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                node.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]
    return tree


class _Unannotated(ast.NodeTransformer):
    """Every annotation erased, wherever it is: the shipped agent keeps only those a class
    body declares (which the protocol and dataclasses read), and this compares the code."""

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.annotation = None
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        node.returns = None
        self.generic_visit(node)
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.Assign | None:
        if node.value is None:
            return None
        return ast.Assign(targets=[node.target], value=node.value, type_comment=None)


def test_the_shipped_agent_imports_and_fits_with_room(tmp_path: Path) -> None:
    """The agent as user-data ships it (no comments, docstrings or unread annotations) imports
    and runs, and leaves room
    under Hetzner's 32 KiB for the agent to grow."""
    document = yaml.safe_load(user_data("m", "https://pool.example.com", "t"))
    files = {f["path"]: f for f in document["write_files"]}
    archive = base64.b64decode(files["/opt/sp00ky/agent.tar.bz2"]["content"])
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tmp_path, filter="data")
    modules = sorted(
        f"agent.{p.stem}" for p in (tmp_path / "agent").glob("*.py") if p.stem != "__main__"
    )
    imported = subprocess.run(
        [sys.executable, "-c", "import importlib, sys; [importlib.import_module(m) for m in "
         "sys.argv[1:]]; print(sys.modules['agent.main'].__file__)", *modules],
        cwd=tmp_path, capture_output=True, text=True, env={"PATH": os.environ["PATH"]},
    )  # fmt: skip
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip() == str(tmp_path / "agent" / "main.py")
    started = subprocess.run(  # its entry point runs, and says what it lacks
        [sys.executable, "-m", "agent"], cwd=tmp_path, capture_output=True, text=True,
        env={"PATH": os.environ["PATH"]}, timeout=30,
    )  # fmt: skip
    assert started.returncode == 2 and "missing controller_url" in started.stderr, started
    assert len(user_data("m", "https://pool.example.com", "t").encode()) < USER_DATA_LIMIT * 0.85


SOURCE = b'''"""A module."""
from __future__ import annotations
import dataclasses
from typing import get_type_hints
LIMIT: int = 3
@dataclasses.dataclass
class Point:
    """A point."""
    x: int
    y: list[int] = dataclasses.field(default_factory=list)
def scale(point: Point, by: int = LIMIT) -> Point:
    total: int
    total = point.x * by
    return Point(total, [*point.y])
def shadow() -> str:
    LIMIT: int  # declared, never bound here: still local, so reading it fails
    return str(LIMIT)
'''


def test_a_shipped_module_keeps_its_class_fields_and_its_scopes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Stripping leaves what runs as it was: a dataclass's fields (and the hints the protocol
    reads), defaults, and a declaration that makes a name local; functions lose theirs."""
    shipped = shipped_source(SOURCE, "m.py")
    text = shipped.decode()
    assert "-> Point" not in text and "point: Point" not in text and "LIMIT = 3" in text
    assert "total: int" not in text and "LIMIT: int" in text and "A point" not in text
    shipped_module = types.ModuleType("shipped_example")
    monkeypatch.setitem(sys.modules, "shipped_example", shipped_module)  # dataclasses look it up
    exec(compile(shipped, "m.py", "exec"), shipped_module.__dict__)
    module = shipped_module.__dict__
    point = module["scale"](module["Point"](2, [1]))
    assert (point.x, point.y) == (6, [1])
    assert [f.name for f in dataclasses.fields(point)] == ["x", "y"]
    assert module["get_type_hints"](module["Point"]) == {"x": int, "y": list[int]}
    with pytest.raises(UnboundLocalError):
        module["shadow"]()


def test_the_agent_is_embedded_pinned_by_hash_and_installed_as_a_service() -> None:
    document = yaml.safe_load(user_data("m", "https://pool.example.com", "t"))
    files = {f["path"]: f for f in document["write_files"]}
    archive = base64.b64decode(files["/opt/sp00ky/agent.tar.bz2"]["content"])
    (command,) = document["runcmd"]
    assert command == ["/opt/sp00ky/install-agent.sh", hashlib.sha256(archive).hexdigest()]
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        names = set(tar.getnames())
    assert {f"agent/{p.name}" for p in (ROOT / "agent").glob("*.py")} == names
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():  # the code shipped is the code here, less its prose
            shipped = tar.extractfile(member)
            assert shipped is not None
            here = _without_docstrings(ast.parse((ROOT / member.name).read_bytes()))
            code = _Unannotated().visit(ast.parse(shipped.read()))
            assert ast.dump(code) == ast.dump(_Unannotated().visit(here)), member.name
    unit = files["/etc/systemd/system/sp00ky-agent.service"]["content"]
    assert "ExecStart=/usr/bin/python3 -m agent" in unit and "SPKY_AGENT_SETTINGS_FILE" in unit
    # a refused join or rejoin powers off and exits 3, a failed boot exits 4: never restarted
    (prevent,) = [
        line for line in unit.splitlines() if line.startswith("RestartPreventExitStatus=")
    ]
    assert {"3", "4"} <= set(prevent.split("=", 1)[1].split())
    settings = json.loads(files["/etc/sp00ky/agent.json"]["content"])
    assert settings["credential_file"] == "/etc/sp00ky/credential"
    assert settings["poweroff"] == ["systemctl", "poweroff"]
    script = files["/opt/sp00ky/install-agent.sh"]["content"]
    assert "sha256sum" in script and "docker.io" in script and "systemctl enable --now" in script
    assert user_data("m", "u", "t") == user_data("m", "u", "t")  # reproducible, hash and all


def test_user_data_past_the_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from sp00ky_infra.shared import cloud_init

    monkeypatch.setattr(cloud_init, "USER_DATA_LIMIT", 1000)
    with pytest.raises(UserDataTooLarge, match="Hetzner takes at most 1000"):
        cloud_init.user_data("m", "u", "t")


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
