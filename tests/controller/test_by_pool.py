"""Each pool on its own provisioner (provisioners/by_pool.py), with fake provisioners behind
the real port and the real executor on a real store: every machine is made, destroyed,
adopted, reaped and reported by its own pool's provisioner, with that one's capabilities."""

from __future__ import annotations

import time
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path

import pytest

from sp00ky_infra.config.loader import load_config
from sp00ky_infra.controller import explain
from sp00ky_infra.controller.admin import provider_of
from sp00ky_infra.controller.core import Controller
from sp00ky_infra.controller.metrics import exposition
from sp00ky_infra.controller.provisioners import (
    MachineSpec,
    Outcome,
    Provisioned,
    ProvisionerError,
    Refused,
    members,
    serving,
)
from sp00ky_infra.controller.provisioners.by_pool import ByPool
from sp00ky_infra.controller.reconcile import billing_of
from sp00ky_infra.controller.settings import ControllerSettings
from sp00ky_infra.policy.machines import Reason
from sp00ky_infra.store import open_store
from tests.controllers import backend_app, project

SECRET = "by-pool-test-secret"


class Engine:
    """Like the docker provisioner: synchronous, delivers the join token, reaps."""

    name = "docker"
    delivers_join_token = True

    def __init__(self, left: Collection[str] = ()) -> None:
        self.specs: list[MachineSpec] = []
        self.destroyed: list[str] = []
        self.left = list(left)
        self.closed = False

    def create(self, spec: MachineSpec) -> Provisioned:
        self.specs.append(spec)
        return Provisioned(provider_id=f"container-{spec.name}")

    def destroy(self, name: str, provider_id: str | None, provider_state: str | None) -> None:
        self.destroyed.append(name)

    def reap(self, keep: Collection[str] = ()) -> list[str]:
        return [name for name in self.left if name not in keep]

    def close(self) -> None:
        self.closed = True


class Stack:
    """Like the pulumi provisioner: asynchronous, issues its own tokens, adopts, reports."""

    name = "pulumi"
    delivers_join_token = False

    def __init__(self) -> None:
        self.specs: list[MachineSpec] = []
        self.destroyed: list[str] = []
        self.adopted: Mapping[str, Mapping[str, str]] = {}
        self.reported: list[Outcome] = []
        self.closed = False

    def create(self, spec: MachineSpec) -> Provisioned:
        self.specs.append(spec)
        return Provisioned(provider_id="", provider_state="pending")

    def destroy(self, name: str, provider_id: str | None, provider_state: str | None) -> None:
        self.destroyed.append(name)

    def adopt(self, machines: Mapping[str, Mapping[str, str]]) -> None:
        self.adopted = machines

    def outcomes(self) -> list[Outcome]:
        found, self.reported = self.reported, []
        return found

    def close(self) -> None:
        self.closed = True
        raise ProvisionerError("the stack's update thread did not stop")


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Controller]:
    """Pool render (hetzner) on the stack, pool thumbs (docker) on the engine."""
    log = tmp_path / "log"
    config = load_config(
        project(
            tmp_path,
            {"render": {"min": 1}, "thumbs": {"min": 1, "provider": "docker"}},
            {
                "renderer": backend_app("render", "render_job", log),
                "thumbnailer": backend_app("thumbs", "thumb_job", log),
            },
        )
    )
    store = open_store(f"sqlite:///{tmp_path}/state.db")
    stack, engine = Stack(), Engine(left=["thumbs-old", "thumbs-live"])
    settings = ControllerSettings(
        provider="", secret=SECRET, state_dir=str(tmp_path), billing_hour=None
    )
    made = Controller(settings, config, store, ByPool({"render": stack, "thumbs": engine}))
    yield made
    made.leader_lock.release()
    store.close()


def _parts(controller: Controller) -> tuple[Stack, Engine]:
    stack, engine = members(controller.provisioner)
    assert isinstance(stack, Stack) and isinstance(engine, Engine)
    return stack, engine


def test_each_pools_machines_are_made_and_destroyed_by_its_own_provisioner(
    controller: Controller,
) -> None:
    stack, engine = _parts(controller)
    executor, now = controller.executor, time.time()
    assert executor.create(controller.deployment, "render", now)
    assert executor.create(controller.deployment, "thumbs", now)
    (vm,), (container,) = stack.specs, engine.specs
    assert (vm.pool, vm.join_token) == ("render", None)  # the stack's program issues it
    assert container.pool == "thumbs" and container.join_token  # the engine passes it on
    machines = controller.store.machines
    assert machines.get(vm.name).provider == "pulumi"
    assert machines.get(container.name).provider == "docker"
    assert machines.get(container.name).provider_id == f"container-{container.name}"
    for name, pool in ((vm.name, "render"), (container.name, "thumbs")):
        assert executor.fail(pool, name, Reason.BOOT_TIMEOUT, now)
        assert executor.destroy(pool, name, now)
    assert (stack.destroyed, engine.destroyed) == ([vm.name], [container.name])


def test_a_machine_is_destroyed_by_the_provisioner_that_made_it(controller: Controller) -> None:
    """A machine of a pool no more in the file, or whose pool's provider changed since: its
    row names what made it, and that one destroys it."""
    stack, engine = _parts(controller)
    machines, executor = controller.store.machines, controller.executor
    machines.add("gone-1a2b3c", "gone", "docker", "r", 1, 1.0)  # a pool removed since
    machines.add("render-4d5e6f", "render", "docker", "r", 1, 1.0)  # render was docker then
    for name, pool in (("gone-1a2b3c", "gone"), ("render-4d5e6f", "render")):
        assert executor.fail(pool, name, Reason.BOOT_TIMEOUT, 2.0)
        assert executor.destroy(pool, name, 3.0)
    assert (engine.destroyed, stack.destroyed) == (["gone-1a2b3c", "render-4d5e6f"], [])


def test_adopt_reap_and_outcomes_go_to_each_provisioner_that_can(
    controller: Controller,
) -> None:
    stack, _ = _parts(controller)
    machines = controller.store.machines
    machines.add("render-a", "render", "pulumi", "r1", 1, 1.0)
    machines.add("thumbs-live", "thumbs", "docker", "r2", 1, 1.0)
    controller.executor.adopt()
    assert stack.adopted == {"render": {"render-a": "r1"}}  # not the engine's machine
    assert controller.executor.reap(2.0) == 1  # the engine's stray; its live one reconnects
    assert machines.get("thumbs-live").state == "requested"
    stack.reported = [Outcome("render-a", "created", "4711")]
    controller.executor.record_outcomes(3.0)
    assert (machines.get("render-a").provider_id, machines.get("render-a").provider_state) == (
        "4711",
        "created",
    )


def test_each_pool_is_billed_and_shown_as_its_provider(controller: Controller) -> None:
    assert billing_of(controller, "render") is not None  # a hetzner stack: paid hours
    assert billing_of(controller, "thumbs") is None  # containers here cost nothing
    assert provider_of(controller, "render") == {
        "provider": "hetzner",
        "provisioner": "pulumi",
        "declared_provider": "hetzner",
    }
    assert provider_of(controller, "thumbs") == {
        "provider": "docker",
        "provisioner": "docker",
        "declared_provider": "docker",
    }


def test_metrics_and_explain_name_each_pools_provider(controller: Controller) -> None:
    text = exposition(controller).decode()
    assert (
        'sp00ky_pool_info{declared_provider="hetzner",pool="render",provider="hetzner",'
        'provisioner="pulumi"} 1.0' in text
    )
    assert (
        'sp00ky_pool_info{declared_provider="docker",pool="thumbs",provider="docker",'
        'provisioner="docker"} 1.0' in text
    )
    found = explain.pool(controller, "thumbs")
    assert (found["provider"], found["provisioner"], found["declared_provider"]) == (
        "docker",
        "docker",
        "docker",
    )


def test_the_router_routes_by_pool_and_closes_every_member() -> None:
    stack, engine = Stack(), Engine()
    router = ByPool({"render": stack, "batch": stack, "thumbs": engine})
    assert router.members() == [stack, engine]  # each once
    assert serving(router, "thumbs") is engine and serving(engine, "thumbs") is engine
    assert members(engine) == [engine]
    spec = MachineSpec("thumbs-1a2b3c", "thumbs", "thumbnailer", "r", "http://c", "token")
    assert router.create(spec).provider_id == "container-thumbs-1a2b3c"
    router.destroy("thumbs-1a2b3c", None, None)
    router.destroy("batch-4d5e6f", None, None)
    assert (engine.destroyed, stack.destroyed) == (["thumbs-1a2b3c"], ["batch-4d5e6f"])
    with pytest.raises(Refused, match=r"pool other has no provisioner here \(pools served: "):
        router.serving("other")
    with pytest.raises(ProvisionerError, match="update thread did not stop"):
        router.close()
    assert stack.closed and engine.closed  # the engine closed although the stack failed
