"""The controller process itself (`sp00ky-infra controller` on the prod stack, whose `pulumi
up` is a child of it) killed with SIGKILL while its update is held at one point
(tests/infra/held_updates.py); then another controller on the same store and stack. Two
shapes of that kill:

- the controller and every process under it at once (a container, or a systemd unit's
  cgroup, killed): the next controller takes the dead holder's lock over and converges;
- the controller's pid alone: its `pulumi up` loses the controller's end of its output and
  event stream and ends within seconds, its lock left, while its provider host lives on and
  finishes its create; the next controller takes the lock over once its holder is gone.

And a lock whose holder lives (a `pulumi up` by hand, held at its create) when a controller
starts: never taken; the controller says it waits, and puts the stack right once that update
ended, whether it finished or was killed in its turn.

The fake cloud's servers boot as agent processes (``ProcessBooter``), so the job that asked
for a machine runs on it. Each case checks the cloud's own server list: exactly the servers
the live machine rows want, and that the stack updates again (the idle pool goes back to zero,
and a later job gets a machine).
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import pytest

from sp00ky_infra.client import Client
from sp00ky_infra.controller.provisioners.local import _signal, running, session_members
from sp00ky_infra.rehearse.boot import Booter
from sp00ky_infra.rehearse.cloud import FakeHetzner
from sp00ky_infra.store import open_store
from tests.controllers import ControllerProcess, wait_for
from tests.infra.held_updates import (
    descendants,
    hold_after_the_create,
    hold_before_the_create,
    hold_the_delete,
    kill_tree,
    lock_files,
    started_up,
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
BUSY_SECONDS = 60  # a job that keeps its machine busy past a held update's end


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

    def job(self, seconds: int = 0) -> str:
        return self.jobs.run("renderer", "/render", {"gameId": "vm", "seconds": seconds}).id

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


def _started(deployment: Deployment) -> None:
    """The first controller, once its start's own requests to the cloud are done (the
    heartbeat, the prices, the sweep, the snapshots): a hold armed now is the stack's."""
    deployment.controller("first")
    started = {("POST", "/v1/firewalls"), ("GET", "/v1/servers"), ("GET", "/v1/images")}
    wait_for(
        lambda: started <= set(deployment.cloud.requests), timeout=60, what="the start's requests"
    )


def _held(deployment: Deployment, hold: Callable[[FakeHetzner], Callable[[], bool]]) -> str:
    """The first controller's update held at ``hold``'s point; the job it runs for."""
    _started(deployment)
    job = ""
    if hold is hold_the_delete:  # a machine made and its job run: then the idle pool shrinks
        deployment.succeeded(deployment.job())
    held = hold(deployment.cloud)
    if hold is not hold_the_delete:
        job = deployment.job()
    wait_for(held, timeout=240, interval=0.2, what="the first controller's update held")
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


def _whole_kill(
    deployment: Deployment, hold: Callable[[FakeHetzner], Callable[[], bool]]
) -> ControllerProcess:
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
    """Its `pulumi up` loses the controller's end of its output and event stream and ends
    within seconds, its lock left; its language and provider hosts live on, the provider
    still finishing its create. The next controller takes the lock over once its holder is
    gone; a server the orphaned provider makes after its machine's row ended is swept after
    the grace, with its reason."""
    job = _held(deployment, hold_after_the_create)
    (first,) = deployment.controllers
    assert first.proc is not None
    deployment.orphans += descendants(first.proc.pid)
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait(timeout=10)
    deployment.cloud.create_then_stall = None  # the orphan's own answer stays held
    (lock,) = lock_files(deployment.folder / "state")
    holder = int(json.loads(lock.read_text())["pid"])
    assert holder in deployment.orphans
    wait_for(lambda: not running(holder), timeout=30, what="the orphaned `pulumi up` to end")
    assert lock.exists()
    second = deployment.controller("second", **SWEEP)
    _converges(deployment, job)
    log = second.log()
    assert "event=stack_lock_taken_over" in log and f'"pid":{holder},' in log
    swept = [line for line in log.splitlines() if "event=server_swept" in line]
    assert all(re.search(r" reason=(no_machine_row|machine_row_ended):", s) for s in swept)


def _row_of_a_controller(folder: Path, name: str) -> str:
    """A machine row of pool render as a controller makes it (at the revision it expects:
    its backend's image, built as the controller builds it, pinned in); its revision."""
    from sp00ky_infra import engine
    from sp00ky_infra.config.loader import load_config
    from sp00ky_infra.engine.images import build_pool_image

    config = load_config(folder / "sp00ky.yml")
    backend = config.backend_for("render")
    dockerfile = config.resolve(backend.deploy.dockerfile or "Dockerfile")
    client = engine.connect()
    try:
        image = build_pool_image(
            client, "shop", backend.name, dockerfile, str(Path(dockerfile).parent)
        )
    finally:
        client.close()
    revision = backend.revision(config.pools["render"], str(image.id))
    store = open_store(f"sqlite:///{folder}/state.db")
    try:
        store.machines.add(name, "render", "pulumi", revision, 1, time.time())
    finally:
        store.close()
    return revision


@pytest.mark.parametrize("ends", ["finishes", "is_killed"])
def test_a_controller_leaves_a_live_holders_lock_and_waits(
    deployment: Deployment, ends: str
) -> None:
    """A `pulumi up` whose process lives holds the stack, held after it made the server (by
    hand, or an orphan of a controller killed alone) when a controller starts on the store
    the machine's row is in: the controller leaves that lock alone and says it waits. Once
    that update ended (it finished, or was killed in its turn) the controller looks at the
    stack again: a dead holder's lock is taken over and its pending create adopted, so the
    server is the row's, in the stack, and nothing is left for the sweep."""
    revision = _row_of_a_controller(deployment.folder, "render-a")
    deployment.project.machines({"render": {"render-a": revision}})
    job = deployment.job(seconds=BUSY_SECONDS)  # render-a's, past the holder's end
    made = hold_after_the_create(deployment.cloud)
    up = started_up(deployment.project)
    try:
        wait_for(made, timeout=120, what="the update held after its create")
        (lock,) = lock_files(deployment.folder / "state")
        # a grace past the hold: the stack's own update deletes what the store no longer wants
        controller = deployment.controller("second", **{**SWEEP, "SPKY_SWEEP_GRACE": "2m"})
        wait_for(
            lambda: "event=stack_lock_held" in controller.log(), timeout=60,
            what="the controller to say it waits for the live holder",
        )  # fmt: skip
        assert up.poll() is None and lock.exists()  # not taken from its live holder
        if ends == "is_killed":
            kill_tree(up.pid)
        assert up.wait(timeout=120) == (-signal.SIGKILL if ends == "is_killed" else 0)
        deployment.cloud.create_then_stall = None
    finally:
        _signal(session_members(up.pid), signal.SIGKILL)
        up.wait(timeout=10)
    ((server_id, server),) = deployment.cloud.servers.items()
    assert server["name"] == "render-a"
    if ends == "is_killed":  # its create is made again, by the controller: the same server
        wait_for(
            lambda: deployment.jobs.store.machines.get("render-a").provider_id == str(server_id),
            timeout=120, what="the controller's update to give the row its server",
        )  # fmt: skip
    wait_for(
        lambda: "render-a" in deployment.project.named("render-a"),
        timeout=120, what="the stack to have the server",
    )  # fmt: skip
    _converges(deployment, job)
    log = controller.log()
    assert ("event=stack_lock_taken_over" in log) == (ends == "is_killed")
    assert "event=server_swept" not in log
