"""Fencing: a machine silent for a whole lease is failed and destroyed
before the sweep puts its jobs back in the queue, and until it is confirmed gone its jobs
keep their leases. The real tick, on a real store, with a provisioner that can fail."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sp00ky_infra.config.loader import load_config
from sp00ky_infra.controller.core import Controller
from sp00ky_infra.controller.provisioners import (
    MachineSpec,
    Outcome,
    Provisioned,
    ProvisionerError,
)
from sp00ky_infra.controller.reconcile import tick
from sp00ky_infra.controller.settings import ControllerSettings
from sp00ky_infra.policy.machines import Reason
from sp00ky_infra.policy.plan import Fail, MachineView, PoolView, fences, silent
from sp00ky_infra.policy.sizing import Shape
from sp00ky_infra.store import open_store
from sp00ky_infra.store.model import NewJob
from tests.controllers import backend_app, project

LEASE = 30.0
T0 = 1_000_000.0


class Flaky:
    """Destroys nothing while ``broken``; remembers what it was asked to destroy."""

    name = "flaky"
    delivers_join_token = True

    def __init__(self) -> None:
        self.broken = True
        self.destroyed: list[str] = []

    def create(self, spec: MachineSpec) -> Provisioned:
        return Provisioned(provider_id=spec.name)

    def destroy(self, name: str, provider_id: str | None, provider_state: str | None) -> None:
        if self.broken:
            raise ProvisionerError(f"machine {name}: the provider does not answer")
        self.destroyed.append(name)

    def close(self) -> None:
        pass


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[tuple[Controller, Flaky, list[float]]]:
    config = load_config(
        project(
            tmp_path,
            {"render": {"min": 0, "autoscale": True, "max": 1, "lease": f"{LEASE:.0f}s"}},
            {"renderer": backend_app("render", "render_job", tmp_path / "log")},
        )
    )
    store = open_store(f"sqlite:///{tmp_path}/state.db")
    clock = [T0]
    provisioner = Flaky()
    made = Controller(
        ControllerSettings(secret="fencing-test-secret", state_dir=str(tmp_path)),
        config,
        store,
        provisioner,
        clock=lambda: clock[0],
    )
    yield made, provisioner, clock
    made.leader_lock.release()
    store.close()


def test_a_silent_machines_job_waits_until_the_machine_is_confirmed_gone(
    controller: tuple[Controller, Flaky, list[float]],
) -> None:
    made, provisioner, clock = controller
    store, machines = made.store, made.store.machines
    machines.add("render-a", "render", "flaky", made.revisions["render"], 1, T0)
    machines.move("render-a", Reason.PROVISIONED, T0)
    machines.join("render-a", "session", T0)
    machines.move("render-a", Reason.READY, T0)
    job = store.enqueue(NewJob(backend="renderer", table="render_job", path="/render"), T0)
    (claimed,) = store.claim("render_job", 1, "c", T0, LEASE, machine="render-a")
    assert claimed.id == job.id

    clock[0] = T0 + LEASE + 1  # its agent said nothing for a whole lease: dead, or cut off
    report = tick(made)
    assert machines.get("render-a").state == "failed"  # fenced before the sweep...
    assert any("render-a" in error for error in report.errors)  # ...but not destroyed
    held = store.get(job.id)
    assert held.status == "processing" and held.machine == "render-a"
    assert (held.lease_expires_at or 0) > clock[0]  # its lease held while it may still work

    clock[0] += LEASE + 1
    tick(made)
    assert store.get(job.id).status == "processing"  # still not gone: still held

    provisioner.broken = False
    clock[0] += 1
    tick(made)  # destroyed this time; the sweep of the next tick may put the job back
    assert machines.get("render-a").state == "destroyed"
    assert provisioner.destroyed == ["render-a"]
    clock[0] += LEASE + 1
    tick(made)
    back = store.get(job.id)
    assert back.status == "pending" and [e["code"] for e in back.errors] == ["lease_expired"]


def _view(machine: MachineView) -> PoolView:
    return PoolView(
        name="render",
        shape=Shape(min=0, max=2, autoscale=True, buffer=0, slots=1),
        revision="r",
        machines=(machine,),
        queued=0,
        idle_timeout=60,
        max_lifetime=3600,
        boot_timeout=60,
        silence=LEASE,
    )


@given(
    seen=st.floats(min_value=0, max_value=1e9, allow_nan=False),
    later=st.floats(min_value=0, max_value=1e4, allow_nan=False),
)
def test_a_machine_is_fenced_no_later_than_the_lease_of_its_last_poll_expires(
    seen: float, later: float
) -> None:
    """The store renews a lease to (poll time + lease) and sweeps it once that is below
    ``now``; the same sum decides silence, so no swept job's machine escapes its fence."""
    now = seen + later
    machine = MachineView("render-a", "ready", 0.0, "r", busy_slots=1, last_seen_at=seen)
    lease_expires_at = seen + LEASE
    if lease_expires_at < now:  # the sweep's condition
        assert silent(machine, LEASE, now)
        assert fences(_view(machine), now) == (Fail("render-a", Reason.SILENT),)


class Asynchronous(Flaky):
    """Like a Pulumi stack: destroy only asks; the server is gone when an outcome says so."""

    def __init__(self) -> None:
        super().__init__()
        self.broken = False
        self.reported: list[Outcome] = []

    def outcomes(self) -> list[Outcome]:
        reported, self.reported = self.reported, []
        return reported


def test_an_asynchronous_destroy_holds_the_job_until_the_server_is_reported_gone(
    tmp_path: Path,
) -> None:
    config = load_config(
        project(
            tmp_path,
            {"render": {"min": 0, "autoscale": True, "max": 1, "lease": f"{LEASE:.0f}s"}},
            {"renderer": backend_app("render", "render_job", tmp_path / "log")},
        )
    )
    store = open_store(f"sqlite:///{tmp_path}/state.db")
    clock = [T0]
    provisioner = Asynchronous()
    made = Controller(
        ControllerSettings(secret="fencing-test-secret", state_dir=str(tmp_path)),
        config, store, provisioner, clock=lambda: clock[0],
    )  # fmt: skip
    try:
        machines = store.machines
        machines.add("render-a", "render", "flaky", made.revisions["render"], 1, T0)
        machines.move("render-a", Reason.PROVISIONED, T0)
        machines.join("render-a", "session", T0)
        machines.move("render-a", Reason.READY, T0)
        job = store.enqueue(NewJob(backend="renderer", table="render_job", path="/render"), T0)
        store.claim("render_job", 1, "c", T0, LEASE, machine="render-a")
        for step in range(3):  # destroyed in the store, but the server may still run
            clock[0] = T0 + (step + 1) * (LEASE + 1)
            tick(made)
            assert machines.get("render-a").state == "destroyed"
            assert store.get(job.id).status == "processing"
        provisioner.reported.append(Outcome("render-a", "destroyed"))
        clock[0] += LEASE + 1
        tick(made)  # the outcome is recorded before the fence: released, then swept
        assert store.get(job.id).status == "pending"
    finally:
        made.leader_lock.release()
        store.close()
