"""The executor with fake provisioners behind the real port, on a real store: declared
capabilities decide what it asks of a provisioner (join tokens, reaping)."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

import pytest

from sp00ky_infra.config.loader import load_config
from sp00ky_infra.controller.core import Controller
from sp00ky_infra.controller.provisioners import (
    Adopts,
    HasGateway,
    MachineSpec,
    Provisioned,
    Reaps,
    ReportsOutcomes,
)
from sp00ky_infra.controller.provisioners.docker import DockerProvisioner
from sp00ky_infra.controller.provisioners.local import LocalProvisioner
from sp00ky_infra.controller.provisioners.pulumi import PulumiProvisioner
from sp00ky_infra.controller.settings import ControllerSettings
from sp00ky_infra.policy.machines import Reason
from sp00ky_infra.shared import tokens
from sp00ky_infra.store import open_store
from tests.controllers import backend_app, project

SECRET = "executor-test-secret"


class Recording:
    """Creates nothing; remembers what it was asked."""

    name = "recording"

    def __init__(self, delivers_join_token: bool) -> None:
        self.delivers_join_token = delivers_join_token
        self.specs: list[MachineSpec] = []
        self.destroyed: list[str] = []

    def create(self, spec: MachineSpec) -> Provisioned:
        self.specs.append(spec)
        return Provisioned(provider_id=spec.name)

    def destroy(self, name: str, provider_id: str | None, provider_state: str | None) -> None:
        self.destroyed.append(name)

    def close(self) -> None:
        pass


MakeController = Callable[[Recording], Controller]


class Reaping(Recording):
    def __init__(self, left: list[str]) -> None:
        super().__init__(delivers_join_token=True)
        self.left = left

    def reap(self, keep: Collection[str] = ()) -> list[str]:
        return [name for name in self.left if name not in keep]


@pytest.fixture
def make_controller(tmp_path: Path) -> Iterator[MakeController]:
    config = load_config(
        project(
            tmp_path,
            {"render": {"min": 1}},
            {"renderer": backend_app("render", "render_job", tmp_path / "log")},
        )
    )
    store = open_store(f"sqlite:///{tmp_path}/state.db")
    made: list[Controller] = []

    def make(provisioner: Recording) -> Controller:
        settings = ControllerSettings(secret=SECRET, state_dir=str(tmp_path))
        made.append(Controller(settings, config, store, provisioner))
        return made[-1]

    yield make
    for controller in made:
        controller.leader_lock.release()
    store.close()


def test_a_join_token_is_issued_only_for_a_provisioner_that_delivers_it(
    make_controller: MakeController,
) -> None:
    delivers, brings_its_own = Recording(True), Recording(False)
    for provisioner in (delivers, brings_its_own):
        controller = make_controller(provisioner)
        assert controller.executor.create(controller.deployment, "render", time.time())
    (spec,) = delivers.specs
    assert spec.join_token is not None
    claim = tokens.verify_join_token(SECRET, spec.join_token, spec.name, time.time())
    assert claim.machine == spec.name
    (other,) = brings_its_own.specs  # the Pulumi program issues the one its machine gets
    assert other.join_token is None


def test_a_restart_keeps_the_live_machines_and_reaps_the_rest_through_the_table(
    make_controller: MakeController,
) -> None:
    provisioner = Reaping(["render-a", "render-b", "render-stray"])
    controller = make_controller(provisioner)
    machines = controller.store.machines
    for name in ("render-a", "render-b"):
        machines.add(name, "render", "recording", "r", 1, 1.0)
    machines.move("render-b", Reason.PROVISIONED, 2.0)
    assert controller.executor.reap(3.0) == 1  # the stray only: the live ones reconnect
    assert {machines.get(n).state for n in ("render-a", "render-b")} == {"requested", "booting"}
    assert controller.executor.reap(3.0, keep_live=False) == 3  # dev: a fresh run
    for name in ("render-a", "render-b"):
        gone = machines.get(name)
        assert (gone.state, gone.destroyed_at) == ("destroyed", 3.0)
        assert gone.failed_reason == "left by an earlier run"


def test_the_provisioners_declare_what_they_can_do() -> None:
    docker = DockerProvisioner.__new__(DockerProvisioner)  # no engine needed to ask
    pulumi = PulumiProvisioner.__new__(PulumiProvisioner)
    local = LocalProvisioner("unused")
    capabilities = (Adopts, Reaps, HasGateway, ReportsOutcomes)
    found = {
        type(p).__name__: (
            [c.__name__ for c in capabilities if isinstance(p, c)],
            p.delivers_join_token,
        )
        for p in (docker, pulumi, local)
    }
    assert found == {
        "DockerProvisioner": (["Reaps", "HasGateway"], True),
        "PulumiProvisioner": (["Adopts", "ReportsOutcomes"], False),
        "LocalProvisioner": ([], True),
    }


def test_a_plan_whose_failed_boots_open_the_breaker_creates_nothing(
    make_controller: MakeController,
) -> None:
    """Three boots time out in one tick and the same plan wants three new machines: the fails
    go first, open the breaker, and the creates wait (Machine pools docs: "stops creating
    machines for a minute"). Seen in a rehearsal: three replacements were requested at once."""
    from sp00ky_infra.policy.plan import Create, Fail, Plan

    provisioner = Recording(True)
    controller = make_controller(provisioner)
    machines = controller.store.machines
    now = time.time()
    for name in ("render-a", "render-b", "render-c"):
        machines.add(name, "render", "recording", "r", 1, now - 100)
        machines.move(name, Reason.PROVISIONED, now - 99)
    plan = Plan(
        pool="render", desired=3, current=3, busy_slots=0,
        create=Create("render", 3),
        fail=tuple(Fail(n, Reason.BOOT_TIMEOUT) for n in ("render-a", "render-b", "render-c")),
    )  # fmt: skip
    assert controller.executor.apply(plan, controller.deployment, now) == []
    assert controller.pool_states.breaker("render").is_open(now)
    assert provisioner.specs == []  # no machine requested while the breaker is open
    assert sorted(provisioner.destroyed) == ["render-a", "render-b", "render-c"]
