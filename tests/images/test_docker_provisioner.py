"""Docker machines end to end against a real dockerd: the controller builds the images, starts
machine containers on a network of the test's own; a restarted controller keeps the live ones,
`dev` removes every one an earlier run left."""

from __future__ import annotations

import secrets
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from docker.models.containers import Container

from sp00ky_infra.client import Client
from sp00ky_infra.controller.server import Runtime
from sp00ky_infra.controller.settings import ControllerSettings
from tests.conftest import BASE_IMAGE
from tests.controllers import (
    ADMIN_TOKEN,
    SECRET,
    ControllerProcess,
    backend_app,
    project,
    wait_for,
)
from tests.helpers import ROOT


@pytest.fixture
def docker_project(
    tmp_path: Path, docker_images: str
) -> Iterator[tuple[Path, str, dict[str, str]]]:
    name = f"t{secrets.token_hex(3)}"
    (tmp_path / "backend").mkdir()
    (tmp_path / "backend" / "server.py").write_text(
        (ROOT / "examples/backend/server.py").read_text()
    )
    (tmp_path / "backend" / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\nCOPY server.py /app/server.py\nENV HOST=127.0.0.1\n"
        'CMD ["python3", "/app/server.py"]\n'
    )
    app = backend_app("render", "render_job", tmp_path / "unused.jsonl")
    app["deploy"]["dockerfile"] = "./backend/Dockerfile"
    config = project(
        tmp_path, {"render": {"min": 0, "autoscale": True, "max": 2}}, {"renderer": app}
    )
    env = {
        "SPKY_POOL_DOCKER": "1",
        "SPKY_POOL_DOCKER_NETWORK": f"sp00ky-{name}",
        "SPKY_PROJECT": name,
        "SPKY_POOL_TIMINGS": "lease=10s,idleTimeout=2s,bootTimeout=60s",
    }
    yield config, name, env
    client = docker.from_env()
    for container in client.containers.list(all=True, filters={"label": f"sp00ky/project={name}"}):
        container.remove(force=True)
    for network in client.networks.list(names=[f"sp00ky-{name}"]):
        network.remove()
    client.close()


def _machines(project_name: str) -> list[Container]:
    client = docker.from_env()
    try:
        selector = [f"sp00ky/project={project_name}", "sp00ky/role=machine"]
        return list(
            client.containers.list(all=True, filters={"label": selector}, ignore_removed=True)
        )
    finally:
        client.close()


def test_docker_machines_scale_from_zero_run_jobs_and_go(
    tmp_path: Path, docker_project: tuple[Path, str, dict[str, str]]
) -> None:
    config, name, env = docker_project
    store_url = f"sqlite:///{tmp_path}/state.db"
    client = Client(store_url, config)
    controller = ControllerProcess(tmp_path, config, store_url, env).start(timeout=300)
    try:
        assert _machines(name) == []
        ids = [
            client.run("renderer", "/render", {"gameId": f"g{n}", "seconds": 1}).id
            for n in range(3)
        ]
        wait_for(lambda: len(_machines(name)) == 2, timeout=60, what="two machine containers")
        wait_for(
            lambda: all(client.store.get(i).status == "success" for i in ids),
            timeout=120,
            what="jobs",
        )
        for container in _machines(name):
            container.reload()
            assert container.attrs["HostConfig"]["PortBindings"] in ({}, None)
            assert not container.ports  # the backend's port is never published
            assert container.labels["sp00ky/pool"] == "render"
            assert container.attrs["NetworkSettings"]["Networks"].keys() == {f"sp00ky-{name}"}
        ps = subprocess.run(["docker", "ps", "--filter", f"label=sp00ky/project={name}", "--format",
                             "{{.Ports}}"], capture_output=True, text=True, check=True)  # fmt: skip
        assert "->" not in ps.stdout, subprocess.run(
            ["docker", "ps", "-a", "--filter", f"label=sp00ky/project={name}", "--format",
             "{{.Names}} {{.Image}} {{.Labels}} {{.Ports}}"], capture_output=True, text=True
        ).stdout  # fmt: skip
        wait_for(lambda: _machines(name) == [], timeout=60, what="idle containers removed")
    finally:
        controller.stop()
        client.close()


def test_a_restarted_controller_keeps_the_live_machine_containers_and_they_run_jobs(
    tmp_path: Path, docker_project: tuple[Path, str, dict[str, str]]
) -> None:
    """The scheduler restarts, nothing is lost: the store's live machines keep their
    containers and reconnect; a machine container the store does not know as live goes."""
    config, name, env = docker_project
    # A lease longer than a restart on a loaded machine: a machine silent for a lease is
    # fenced and replaced, and the test is about reconnecting, not about silence.
    env = {**env, "SPKY_POOL_TIMINGS": "lease=30s,idleTimeout=120s,bootTimeout=60s"}
    store_url = f"sqlite:///{tmp_path}/state.db"
    client = Client(store_url, config)
    first = ControllerProcess(tmp_path / "a", config, store_url, env).start(timeout=300)
    second: ControllerProcess | None = None
    try:
        job = client.run("renderer", "/render", {"gameId": "g1", "seconds": 1})
        wait_for(lambda: client.store.get(job.id).status == "success", timeout=120, what="job 1")
        (kept,) = _machines(name)
        machine = kept.labels["sp00ky/machine"]
        stray = _stray_container(name)
        first.stop()  # SIGTERM: the machines keep running
        assert first.proc is not None and first.proc.returncode == 0
        port = first.agents_url.rsplit(":", 1)[1]
        second = ControllerProcess(
            tmp_path / "b", config, store_url, {**env, "SPKY_POOL_PORT": port}
        ).start(timeout=300)
        ids = [c.id for c in _machines(name)]
        assert ids == [kept.id] and stray.id not in ids  # the live one kept, the stray gone
        assert client.store.machines.get(machine).state != "destroyed"
        again = client.run("renderer", "/render", {"gameId": "g2", "seconds": 1})
        wait_for(lambda: client.store.get(again.id).status == "success", timeout=120, what="job 2")
        assert client.store.get(again.id).machine == machine  # the machine reconnected
        assert [c.id for c in _machines(name)] == [kept.id]
    finally:
        first.stop()
        if second is not None:
            second.stop()
        client.close()


def test_a_dev_start_removes_every_machine_container_of_an_earlier_run(
    tmp_path: Path, docker_project: tuple[Path, str, dict[str, str]]
) -> None:
    config, name, env = docker_project
    store_url = f"sqlite:///{tmp_path}/state.db"
    client = Client(store_url, config)
    first = ControllerProcess(tmp_path, config, store_url, env).start(timeout=300)
    try:
        job = client.run("renderer", "/render", {"gameId": "g", "seconds": 60})
        wait_for(
            lambda: client.store.get(job.id).status == "processing", timeout=60, what="running"
        )
        (left,) = _machines(name)
        first.stop(signal.SIGKILL)
        assert [c.id for c in _machines(name)] == [left.id]  # still there
        settings = ControllerSettings.from_env(
            {**env, "SPKY_POOL_SECRET": SECRET, "SPKY_ADMIN_TOKEN": ADMIN_TOKEN,
             "SPKY_POOL_PORT": "0", "SPKY_ADMIN_PORT": "0"},
            config_path=str(config), store_url=store_url, state_dir=str(tmp_path / "dev"),
        )  # fmt: skip
        runtime = Runtime(settings, fresh=True)  # as `dev` starts
        try:
            assert _machines(name) == []  # removed at start, though the store had it live
            machine = left.labels["sp00ky/machine"]
            gone = client.store.machines.get(machine)
            assert gone.state == "destroyed" and gone.failed_reason == "left by an earlier run"
        finally:
            runtime.close()
    finally:
        first.stop()
        client.close()


def _stray_container(project_name: str) -> Container:
    """A machine container of the project that the store does not know."""
    client = docker.from_env()
    try:
        return client.containers.run(
            BASE_IMAGE, ["sleep", "300"], detach=True,
            labels={"sp00ky/project": project_name, "sp00ky/role": "machine",
                    "sp00ky/machine": "render-stray"},
        )  # fmt: skip
    finally:
        client.close()


def test_docker_machines_run_a_registry_image_pulled_with_the_credentials(
    tmp_path: Path, docker_project: tuple[Path, str, dict[str, str]], image_registry: Any
) -> None:
    """A self-hosted controller whose backend names deploy.image (no dockerfile) pulls it from
    the registry with SPKY_REGISTRY_AUTH's credentials and runs its machines from it."""
    config, name, env = docker_project
    built = f"sp00ky-test-{name}:src"
    subprocess.run(["docker", "build", "-q", "-t", built, str(tmp_path / "backend")],
                   check=True, capture_output=True, timeout=600)  # fmt: skip
    image_registry.push(built, f"acme/{name}:1")
    subprocess.run(["docker", "rmi", built], capture_output=True)
    app = backend_app("render", "render_job", tmp_path / "unused.jsonl")
    app["deploy"]["image"] = f"{image_registry.host}/acme/{name}:1"  # and no dockerfile
    config = project(
        tmp_path, {"render": {"min": 0, "autoscale": True, "max": 1}}, {"renderer": app}
    )
    store_url = f"sqlite:///{tmp_path}/state.db"
    client = Client(store_url, config)
    without = ControllerProcess(tmp_path / "denied", config, store_url, env)
    with pytest.raises(AssertionError, match="pulling the image of backend renderer failed"):
        without.start(timeout=120)  # no credentials: refused at start, saying what failed
    auth = {"SPKY_REGISTRY_AUTH": str(image_registry.docker_config)}
    controller = ControllerProcess(tmp_path, config, store_url, {**env, **auth}).start(timeout=300)
    try:
        job = client.run("renderer", "/render", {"gameId": "pulled"}).id
        wait_for(lambda: client.store.get(job).status == "success", timeout=120, what="the job")
        (machine,) = _machines(name)
        assert machine.image is not None
        assert machine.image.tags == ["sp00ky-dev-machine-renderer:latest"]
    finally:
        controller.stop()
        client.close()
