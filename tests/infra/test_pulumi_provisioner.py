"""The Pulumi provisioner at the Automation API seam, and with a real `pulumi up` where the
CLI is installed (it cannot be downloaded here: skipped with the reason)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from sp00ky_infra.config.loader import load_config
from sp00ky_infra.controller.core import Controller
from sp00ky_infra.controller.provisioners import MachineSpec
from sp00ky_infra.controller.provisioners.pulumi import (
    LOCK_HINT_SECONDS,
    Outcome,
    PulumiProvisioner,
)
from sp00ky_infra.controller.reconcile import tick
from sp00ky_infra.controller.settings import ControllerSettings
from sp00ky_infra.policy.machines import Reason
from sp00ky_infra.store import open_store
from sp00ky_infra.store.machines import Change
from tests.controllers import backend_app, project, wait_for


class FakeStack:
    """Speaks like pulumi.automation.Stack; records what the provisioner asked of it."""

    def __init__(self) -> None:
        self.config: list[dict[str, list[str]]] = []  # each update's machine names
        self.written: list[dict[str, dict[str, str | None]]] = []  # ... as written, revisions too
        self.settings: dict[str, Any] = {}  # the stack's other config
        self.running = 0
        self.most_at_once = 0
        self.gate: threading.Event | None = None
        self.fail_with: str | None = None
        self.ids: dict[str, str] = {}

    def get_all_config(self) -> dict[str, Any]:
        return dict(self.settings)

    def set_config(self, key: str, value: Any, *, path: bool = False) -> None:
        assert not path
        if key != "sp00ky:machines":
            self.settings[key] = value
            return
        written = json.loads(value.value)
        self.written.append(written)
        self.config.append({pool: sorted(names) for pool, names in written.items()})

    def up(self, *, on_output: Any = None, on_event: Any = None) -> Any:
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        try:
            if self.gate is not None:
                self.gate.wait(10)
            if self.fail_with:
                raise RuntimeError(self.fail_with)
            wanted = self.config[-1]
            self.ids = {name: f"srv-{name}" for names in wanted.values() for name in names}
            return None
        finally:
            self.running -= 1

    def outputs(self) -> dict[str, Any]:
        return {"machines": self.ids}


def _spec(name: str, pool: str = "render") -> MachineSpec:
    return MachineSpec(name, pool, "renderer", "r1", "https://pool.example.com", "token")


def _drain(provisioner: PulumiProvisioner, count: int) -> list[Outcome]:
    """The provisioner's outcomes, waiting until ``count`` have come."""
    found: list[Outcome] = []

    def enough() -> bool:
        found.extend(provisioner.outcomes())
        return len(found) >= count

    wait_for(enough, timeout=10)
    return found


def test_the_machines_are_written_to_the_stack_config_and_created() -> None:
    stack = FakeStack()
    provisioner = PulumiProvisioner(lambda: stack)
    try:
        for name in ("render-a", "render-b"):
            assert provisioner.create(_spec(name)).provider_state == "pending"
        outcomes = _drain(provisioner, 2)
        assert {(o.machine, o.kind, o.detail) for o in outcomes} == {
            ("render-a", "created", "srv-render-a"),
            ("render-b", "created", "srv-render-b"),
        }
        assert stack.config[-1] == {"render": ["render-a", "render-b"]}
        provisioner.destroy("render-a", "srv-render-a", "created")
        assert _drain(provisioner, 1) == [Outcome("render-a", "destroyed")]
        assert stack.config[-1] == {"render": ["render-b"]}
        assert len(provisioner.durations) == provisioner.updates == len(stack.config)
    finally:
        provisioner.close()


def test_a_burst_coalesces_into_one_update_and_only_one_runs_at_a_time() -> None:
    stack = FakeStack()
    stack.gate = threading.Event()
    provisioner = PulumiProvisioner(lambda: stack)
    try:
        provisioner.create(_spec("render-0"))
        wait_for(lambda: stack.running == 1, what="the first update running")
        for n in range(1, 6):  # while it runs, a burst arrives
            provisioner.create(_spec(f"render-{n}"))
        provisioner.destroy("render-3", None, None)
        stack.gate.set()
        outcomes = _drain(provisioner, 5)
        wait_for(provisioner.idle, what="nothing left to apply")
        assert stack.config == [
            {"render": ["render-0"]},
            {"render": ["render-0", "render-1", "render-2", "render-4", "render-5"]},
        ]  # two updates for six creates and a destroy; the second has the newest set
        assert stack.most_at_once == 1
        assert {o.machine for o in outcomes if o.kind == "created"} == {
            "render-0",
            "render-1",
            "render-2",
            "render-4",
            "render-5",
        }
    finally:
        provisioner.close()


def test_creates_a_moment_apart_go_in_one_update() -> None:
    """A tick's creates reach the provisioner one by one, a few store writes apart: one
    update carries them all, not the first alone with the rest waiting for it."""
    stack = FakeStack()
    provisioner = PulumiProvisioner(lambda: stack)
    try:
        for name in ("render-a", "render-b", "render-c"):
            provisioner.create(_spec(name))
            time.sleep(0.03)
        _drain(provisioner, 3)
        assert stack.config == [{"render": ["render-a", "render-b", "render-c"]}]
    finally:
        provisioner.close()


def test_a_steady_trickle_of_creates_holds_the_first_update_back_only_so_long() -> None:
    stack = FakeStack()
    provisioner = PulumiProvisioner(lambda: stack)
    try:
        started = time.monotonic()
        names = [f"render-{n:02}" for n in range(30)]
        for name in names:  # one every 0.1 s for 3 s: never still for SETTLE_SECONDS
            provisioner.create(_spec(name))
            time.sleep(0.1)
        assert stack.config, "no update began while the creates kept coming"
        assert len(stack.config[0]["render"]) < len(names)
        assert time.monotonic() - started >= 3.0
        _drain(provisioner, len(names))
    finally:
        provisioner.close()


def test_failures_come_back_per_machine() -> None:
    stack = FakeStack()
    stack.fail_with = (
        "error: update failed\n  pulumi-python:dynamic:Resource (render-b):\n"
        "    error: creating server render-b (cx33 in fsn1) failed: resource_limit_exceeded: "
        "server limit reached for this project (HTTP 403)"
    )
    provisioner = PulumiProvisioner(lambda: stack)
    try:
        provisioner.create(_spec("render-a"))
        provisioner.create(_spec("render-b"))
        outcomes = {o.machine: o for o in _drain(provisioner, 2)}
        assert outcomes["render-b"].kind == "failed"
        assert "resource_limit_exceeded" in outcomes["render-b"].detail
        assert outcomes["render-a"].kind == "created"  # Pulumi went on with the others
        assert "render-b" not in provisioner.desired["render"]
    finally:
        provisioner.close()


def test_a_stack_that_cannot_be_opened_fails_every_new_machine() -> None:
    def broken() -> FakeStack:
        raise RuntimeError("no pulumi CLI")

    provisioner = PulumiProvisioner(broken)
    try:
        provisioner.create(_spec("render-a"))
        (outcome,) = _drain(provisioner, 1)
        assert outcome.kind == "failed" and "cannot open the Pulumi stack" in outcome.detail
    finally:
        provisioner.close()


@contextmanager
def _ticking(
    folder: Path, machines: int
) -> Iterator[tuple[Controller, PulumiProvisioner, FakeStack]]:
    """A controller over a FakeStack, its pool wanting ``machines`` machines."""
    app = backend_app("render", "render_job", folder / "log")
    config = load_config(project(folder, {"render": {"min": machines}}, {"renderer": app}))
    store = open_store(f"sqlite:///{folder}/state.db")
    stack = FakeStack()
    provisioner = PulumiProvisioner(lambda: stack)
    settings = ControllerSettings(secret="s", state_dir=str(folder))
    controller = Controller(settings, config, store, provisioner)
    try:
        yield controller, provisioner, stack
    finally:
        provisioner.close()
        controller.leader_lock.release()
        store.close()


def test_the_tick_records_ids_and_counts_refusals_towards_the_breaker(tmp_path: Path) -> None:
    with _ticking(tmp_path, 2) as (controller, provisioner, stack):
        store = controller.store
        tick(controller)  # two machines asked for
        wait_for(provisioner.idle, what="the update")
        tick(controller)  # their ids come back onto the rows
        live = store.machines.live("render")
        assert sorted(m.provider_id or "" for m in live) == sorted(f"srv-{m.name}" for m in live)
        assert {m.provider_state for m in live} == {"created"}

        stack.fail_with = "error: resource_limit_exceeded for every new server"
        for machine in live:  # both vanish: the pool asks for replacements, which are refused
            failed = Change(detail="x")
            store.machines.move(machine.name, Reason.BOOT_FAILED, time.time(), failed)
            store.machines.move(machine.name, Reason.DESTROYED, time.time())
        tick(controller)
        wait_for(provisioner.idle, what="the failing update")
        tick(controller)
        assert controller.pool_states.breaker("render").failures == 2
        refused = [
            m
            for m in store.machines.recent("render")
            if (m.failed_reason or "").startswith("refused")
        ]
        assert len(refused) == 2 and "resource_limit_exceeded" in (refused[0].failed_reason or "")


def test_the_machines_of_one_tick_are_made_by_one_update(tmp_path: Path) -> None:
    with _ticking(tmp_path, 3) as (controller, provisioner, stack):
        tick(controller)  # three machines asked for, one after the other
        wait_for(provisioner.idle, what="the update")
        names = sorted(machine.name for machine in controller.store.machines.live("render"))
        assert len(names) == 3
        assert stack.config == [{"render": names}]


def test_a_restarted_controller_keeps_the_machines_it_already_has() -> None:
    stack = FakeStack()
    provisioner = PulumiProvisioner(lambda: stack)
    try:
        provisioner.adopt({"render": {"render-old": "r0"}})
        assert provisioner.idle() and stack.config == []  # nothing to do yet
        provisioner.create(_spec("render-new"))
        _drain(provisioner, 1)
        assert stack.config == [{"render": ["render-new", "render-old"]}]
        # each machine keeps the revision it runs: the old one drains under its own labels
        assert stack.written == [{"render": {"render-new": "r1", "render-old": "r0"}}]
    finally:
        provisioner.close()


def test_the_stack_says_what_the_controller_says_or_the_controller_refuses() -> None:
    from pulumi.automation import ConfigValue

    from sp00ky_infra.controller.provisioners.pulumi import StackDisagrees

    mine = {
        "sp00ky:project": "shop",
        "sp00ky:poolUrl": "https://shop-pool.example.com",
        "sp00ky:poolSecret": "s3cret-pool",
    }
    stack = FakeStack()
    stack.settings["sp00ky:poolUrl"] = ConfigValue("https://shop-pool.example.com")
    provisioner = PulumiProvisioner(lambda: stack)
    try:
        provisioner.pin(mine)  # what the stack lacks is written, the secret as a secret
        assert stack.settings["sp00ky:project"].value == "shop"
        assert not stack.settings["sp00ky:project"].secret
        assert stack.settings["sp00ky:poolSecret"].secret
        provisioner.pin(mine)  # and a second start finds them the same
    finally:
        provisioner.close()

    for key, theirs, said in (
        ("sp00ky:project", "sp00ky-infra", "the stack's sp00ky:project is 'sp00ky-infra' but "
         "SPKY_PROJECT is 'shop'"),
        ("sp00ky:poolUrl", "https://old.example.com", "SPKY_POOL_PUBLIC_URL is "
         "'https://shop-pool.example.com'"),
        ("sp00ky:poolSecret", "another", "the stack's sp00ky:poolSecret is another secret but "
         "SPKY_POOL_SECRET is set to another"),
    ):  # fmt: skip
        stack = FakeStack()
        stack.settings[key] = ConfigValue(theirs, secret=key.endswith("Secret"))
        provisioner = PulumiProvisioner(lambda stack=stack: stack)  # type: ignore[misc]
        try:
            with pytest.raises(StackDisagrees) as refused:
                provisioner.pin(mine)
            assert said in str(refused.value)
            assert "s3cret-pool" not in str(refused.value)  # a secret is never printed
        finally:
            provisioner.close()


def test_a_stack_locked_for_long_says_how_a_dead_update_is_ended(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stack = FakeStack()
    stack.fail_with = "error: the stack is currently locked by 1 lock(s)"
    later = [0.0]  # added to the clock: the lock's age, without the wait
    provisioner = PulumiProvisioner(
        lambda: stack, clock=lambda: time.monotonic() + later[0], lock_retry=0.01
    )
    try:
        with caplog.at_level("WARNING", logger="sp00ky.controller"):
            provisioner.create(_spec("render-a"))
            wait_for(lambda: provisioner._lock_tries >= 2, timeout=10, what="two tries")
            assert "pulumi cancel" not in caplog.text  # a lock held a while is an update
            later[0] = LOCK_HINT_SECONDS
            tries = provisioner._lock_tries
            wait_for(lambda: provisioner._lock_tries > tries + 1, timeout=10, what="a later try")
        assert "`pulumi cancel --yes --stack STACK` in the project ends it" in caplog.text
        assert provisioner.desired["render"] == {"render-a"}  # the machine still waits
    finally:
        provisioner.close()
