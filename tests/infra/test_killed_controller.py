"""The controller process itself (`sp00ky-infra controller` on the prod stack, whose `pulumi
up` is a child of it) killed with SIGKILL while its update is held at one point
(tests/infra/held_updates.py); then another controller on the same store and stack. Two
shapes of that kill:

- the controller and every process under it at once (a container, or a systemd unit's
  cgroup, killed): the next controller takes the dead holder's lock over and converges;
- the controller's pid alone: its `pulumi up` lives on, an orphan that holds the stack's lock;
  the next controller leaves that lock alone while its holder lives, says it waits, and
  converges once the orphan ended.

The fake cloud's servers boot as agent processes (``ProcessBooter``), so the job that asked
for a machine runs on it. Each case checks the cloud's own server list: exactly the servers
the live machine rows want, and that the stack updates again (the idle pool goes back to zero,
and a later job gets a machine).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import pytest

from sp00ky_infra.client import Client
from sp00ky_infra.controller.provisioners.local import _signal
from sp00ky_infra.rehearse.boot import Booter
from sp00ky_infra.rehearse.cloud import FakeHetzner
from tests.controllers import ControllerProcess, wait_for
from tests.infra.held_updates import (
    descendants,
    hold_after_the_create,
    hold_before_the_create,
    hold_the_delete,
    kill_tree,
    lock_files,
)
from tests.infra.test_pools_on_their_providers import ProcessBooter, _controller_env, _free_port
from tests.infra.test_pulumi_engine import _prod, _servers
from tests.pulumi_engine import StackProject

# Short pool durations, a billed hour of seconds (an idle machine goes at its hour's end), the
# heartbeat once: the controller's only requests to the cloud are its start's and the stack's.
TIMINGS = {
    "SPKY_POOL_TIMINGS": "lease=10s,idleTimeout=2s,bootTimeout=180s",
    "SPKY_BILLING_HOUR": "8s",
    "SPKY_HEARTBEAT": "1h",
}
# The second controller's sweep: often, and a grace far past a create's few seconds here.
SWEEP = {"SPKY_SWEEP_EVERY": "2s", "SPKY_SWEEP_GRACE": "30s"}


@dataclass
class Deployment:
    """The fake cloud, the prod stack (its pool's firewall made), the store, and the
    controllers started on them (every one is stopped at the end)."""

    folder: Path
    cloud: FakeHetzner
    project: StackProject
    env: dict[str, str]
    jobs: Client
    controllers: list[ControllerProcess] = field(default_factory=list)
    orphans: list[int] = field(default_factory=list)

    def controller(self, name: str, **env: str) -> ControllerProcess:
        store_url = f"sqlite:///{self.folder}/state.db"
        process = ControllerProcess(
            self.folder / name, self.folder / "sp00ky.yml", store_url, {**self.env, **env}
        )
        self.controllers.append(process)
        return process.start(timeout=300)

    def job(self) -> str:
        return self.jobs.run("renderer", "/render", {"gameId": "vm", "seconds": 0}).id

    def succeeded(self, job: str) -> None:
        wait_for(
            lambda: self.jobs.store.get(job).status == "success",
            timeout=240, interval=0.5, what=f"job {job} to succeed on a machine of the stack",
        )  # fmt: skip

    def wanted(self) -> list[str]:
        """The machines the store's live rows want."""
        return sorted(m.name for m in self.jobs.store.machines.live())

    def servers(self) -> list[str]:
        return sorted(_servers(self.cloud))

    def close(self) -> None:
        for process in self.controllers:
            if process.proc is not None and process.proc.poll() is None:
                kill_tree(process.proc.pid)
            process.stop()
        _signal(self.orphans, signal.SIGKILL)
        self.jobs.close()


@pytest.fixture
def deployment(tmp_path: Path, pulumi_bin: str, docker_images: str) -> Iterator[Deployment]:
    from sp00ky_infra import engine

    client = engine.connect()
    try:  # the host's address on Docker's bridge: not a loopback address the preflight refuses
        gateway = engine.network_gateway(client, "bridge")
    finally:
        client.close()
    address = f"{gateway}:{_free_port(gateway)}"
    with FakeHetzner(boot=cast(Booter, ProcessBooter(tmp_path))) as cloud:
        project = _prod(tmp_path, pulumi_bin, cloud)
        project.config("sp00ky:poolUrl", f"http://{address}")
        project.machines({"render": {}})
        project.up()
        env = {**_controller_env(project, cloud, "shop", address), **TIMINGS}
        jobs = Client(f"sqlite:///{tmp_path}/state.db", tmp_path / "sp00ky.yml")
        made = Deployment(tmp_path, cloud, project, env, jobs)
        try:
            yield made
        finally:
            made.close()


def _started(deployment: Deployment) -> ControllerProcess:
    """The first controller, once its start's own requests to the cloud are done (the
    heartbeat, the prices, the sweep, the snapshots): a hold armed now is the stack's."""
    first = deployment.controller("first")
    started = {("POST", "/v1/firewalls"), ("GET", "/v1/servers"), ("GET", "/v1/images")}
    wait_for(
        lambda: started <= set(deployment.cloud.requests), timeout=60, what="the start's requests"
    )
    return first


def _held(deployment: Deployment, hold: Callable[[FakeHetzner], Callable[[], bool]]) -> str:
    """The first controller's update held at ``hold``'s point; the job it runs for."""
    first = _started(deployment)
    if hold is hold_the_delete:  # a machine made, its job run, and then the idle pool shrinks
        deployment.succeeded(deployment.job())
        job = ""
    held = hold(deployment.cloud)
    job = job if hold is hold_the_delete else deployment.job()
    wait_for(held, timeout=240, interval=0.2, what="the first controller's update held")
    assert first.proc is not None
    return job


def _converges(deployment: Deployment, job: str) -> None:
    """The job ran, the cloud has exactly the servers the live rows want, and the stack
    updates again: the idle pool goes back to zero, and a later job gets a machine."""
    if job:
        deployment.succeeded(job)
    wait_for(
        lambda: deployment.servers() == deployment.wanted(),
        timeout=120, what="the cloud's servers to be the live rows' machines",
    )  # fmt: skip
    wait_for(lambda: deployment.servers() == [], timeout=120, what="the idle pool back to zero")
    later = deployment.job()
    deployment.succeeded(later)
    assert deployment.servers() == deployment.wanted()
    wait_for(lambda: deployment.servers() == [], timeout=120, what="the pool back to zero again")


def _whole_kill(deployment: Deployment, hold: Callable[[FakeHetzner], Callable[[], bool]]) -> ControllerProcess:
    job = _held(deployment, hold)
    (first,) = deployment.controllers
    assert first.proc is not None
    killed = kill_tree(first.proc.pid)
    first.proc.wait(timeout=10)
    assert len(killed) > 3  # the controller, `pulumi up`, its language and provider hosts
    assert lock_files(deployment.folder / "state")  # the dead update's lock is left
    deployment.cloud.create_then_stall = None
    second = deployment.controller("second", **SWEEP)
    _converges(deployment, job)
    assert "event=stack_lock_taken_over" in second.log()
    return second


def test_whole_controller_killed_before_the_create(deployment: Deployment) -> None:
    second = _whole_kill(deployment, hold_before_the_create)
    assert "event=pending_operations" in second.log()


def test_whole_controller_killed_after_the_server_was_made(deployment: Deployment) -> None:
    second = _whole_kill(deployment, hold_after_the_create)
    assert "event=pending_operations" in second.log()


def test_whole_controller_killed_during_a_delete(deployment: Deployment) -> None:
    _whole_kill(deployment, hold_the_delete)


def test_controller_alone_killed_after_the_server_was_made(deployment: Deployment) -> None:
    """Its `pulumi up` lives on and holds the lock: the next controller waits for it."""
    job = _held(deployment, lambda cloud: hold_after_the_create(cloud, seconds=40.0))
    (first,) = deployment.controllers
    assert first.proc is not None
    deployment.orphans += descendants(first.proc.pid)
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait(timeout=10)
    deployment.cloud.create_then_stall = None
    second = deployment.controller("second", **SWEEP)
    _converges(deployment, job)
    log = second.log()
    assert "event=stack_lock_taken_over" not in log or "holder lives" in log
