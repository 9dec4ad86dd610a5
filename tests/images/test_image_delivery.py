"""The image reaches the machine, end to end: a real controller process, a real agent process
whose machine has a second, empty Docker engine of its own, and (for deploy.image) a real
registry on 127.0.0.1 with credentials. Either way the backend runs a job from the image."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from sp00ky_infra.client import Client
from sp00ky_infra.config.loader import load_config
from sp00ky_infra.shared import tokens
from tests.controllers import SECRET, backend_app, project, running_controller, wait_for
from tests.engines import REGISTRY_PASSWORD, REGISTRY_USER, Engine, Registry, backend_context
from tests.helpers import ROOT

TIMINGS = "lease=10s,idleTimeout=60s,bootTimeout=60s"


@pytest.fixture
def backend(tmp_path: Path, docker_images: str) -> Iterator[str]:
    """A pool backend of a name of its own, so its image is this test's alone (other tests
    retag the shared sp00ky-dev-pool-renderer with a backend listening on 127.0.0.1 only)."""
    name = f"img{secrets.token_hex(3)}"
    backend_context(tmp_path / "backend")
    yield name
    subprocess.run(
        ["docker", "rmi", "-f", f"sp00ky-dev-pool-{name}", f"sp00ky-test/{name}:1"],
        capture_output=True,
    )


def _own_image(folder: Path, name: str) -> str:
    """The backend's image built here, for a test to push to its registry."""
    tag = f"sp00ky-test/{name}:1"
    subprocess.run(
        ["docker", "build", "-q", "-t", tag, str(folder / "backend")],
        check=True, capture_output=True,
    )  # fmt: skip
    return tag


def _config(folder: Path, name: str, **deploy: Any) -> Path:
    app = backend_app("render", "render_job", folder / "unused.jsonl")
    app["deploy"].pop("command")
    app["deploy"].update({"dockerfile": str(folder / "backend" / "Dockerfile"), **deploy})
    return project(folder, {"render": {"min": 0, "autoscale": True, "max": 1}}, {name: app})


def _revision(config: Path, image: str) -> str:
    loaded = load_config(config)
    return loaded.backend_for("render").revision(loaded.pools["render"], image)


def _agent(folder: Path, url: str, machine: str, engine: Engine) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "SPKY_AGENT_CONTROLLER_URL": url,
        "SPKY_AGENT_MACHINE": machine,
        "SPKY_AGENT_JOIN_TOKEN": tokens.issue_join_token(SECRET, machine, time.time()),
        "SPKY_AGENT_RUNTIME": "docker",
        "SPKY_AGENT_WORKDIR": str(folder),
        "DOCKER_HOST": engine.host,  # the machine's own engine
    }
    output = open(folder / f"{machine}.log", "w")  # noqa: SIM115 (the agent writes to it)
    return subprocess.Popen(
        [sys.executable, "-m", "agent"], cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT
    )


def _stop(agent: subprocess.Popen[bytes]) -> int:
    if agent.poll() is None:
        agent.send_signal(signal.SIGTERM)
        try:
            return agent.wait(timeout=60)
        except subprocess.TimeoutExpired:
            agent.kill()
    return agent.wait()


def _image_id(name: str) -> str:
    return subprocess.run(
        ["docker", "image", "inspect", "-f", "{{.Id}}", f"sp00ky-dev-pool-{name}"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip


def _runs_a_job(client: Client, name: str, machine: str) -> None:
    wait_for(lambda: client.store.machines.get(machine).state == "ready", timeout=90, what="ready")
    job = client.run(name, "/render", {"gameId": machine})
    done = wait_for(
        lambda: client.store.get(job.id).status == "success" and client.store.get(job.id),
        timeout=60,
    )
    assert done.machine == machine and done.result["url"].endswith(f"/{machine}.mp4")


def test_a_machine_gets_the_controllers_image_once_and_runs_its_jobs(
    tmp_path: Path, backend: str, machine_engine: Engine
) -> None:
    config = _config(tmp_path, backend)
    store_url = f"sqlite:///{tmp_path}/state.db"
    client = Client(store_url, config)
    with running_controller(
        tmp_path, config, store_url, SPKY_POOL_IMAGES="1", SPKY_POOL_MAX_MACHINES="1",
        SPKY_POOL_TIMINGS=TIMINGS,
    ) as controller:  # fmt: skip
        image_id = _image_id(backend)  # built by the controller at start
        assert image_id not in machine_engine.images()
        for machine in ("img-first", "img-second"):  # two boots on one machine's engine
            client.store.machines.add(
                machine, "render", "local", _revision(config, image_id), 1, time.time()
            )
            agent = _agent(tmp_path, controller.agents_url, machine, machine_engine)
            try:
                _runs_a_job(client, backend, machine)
            finally:
                assert _stop(agent) == 0
        first = (tmp_path / "img-first.log").read_text()
        second = (tmp_path / "img-second.log").read_text()
        assert f"event=image_fetch image={image_id} source=controller" in first
        assert "event=image_progress" in first and f"event=image_ready image={image_id}" in first
        assert f"event=image_cached image={image_id}" in second
        assert "event=image_fetch" not in second  # the same image never travels twice
        assert image_id in machine_engine.images()
        # only a machine's session may fetch, and only its own pool's image
        url = f"{controller.agents_url}/v1/machines/img-second/images/{image_id}"
        assert requests.get(url, timeout=10).status_code == 401
    client.close()


def test_a_registry_image_is_pulled_by_digest_with_the_credentials(
    tmp_path: Path, backend: str, image_registry: Registry, machine_engine: Engine
) -> None:
    digest = image_registry.push(_own_image(tmp_path, backend), "acme/renderer:1")
    tagged = f"{image_registry.host}/acme/renderer:1"
    pinned = f"{image_registry.host}/acme/renderer@{digest}"
    config = _config(tmp_path, backend, image=tagged)
    store_url = f"sqlite:///{tmp_path}/state.db"
    client = Client(store_url, config)
    with running_controller(
        tmp_path, config, store_url, SPKY_POOL_IMAGES="1", SPKY_POOL_MAX_MACHINES="1",
        SPKY_POOL_TIMINGS=TIMINGS, SPKY_REGISTRY_AUTH=str(image_registry.docker_config),
        DOCKER_HOST="unix:///nonexistent.sock",  # a registry image needs no engine here
    ) as controller:  # fmt: skip
        client.store.machines.add("reg-m1", "render", "local", _revision(config, pinned), 1,
                                  time.time())  # fmt: skip
        agent = _agent(tmp_path, controller.agents_url, "reg-m1", machine_engine)
        try:
            _runs_a_job(client, backend, "reg-m1")
        finally:
            assert _stop(agent) == 0
    log = (tmp_path / "reg-m1.log").read_text()
    assert f"event=image_fetch image={pinned} source=registry" in log
    assert f"event=image_ready image={pinned}" in log
    assert REGISTRY_PASSWORD not in log
    found = machine_engine.docker("image", "inspect", "-f", "{{.RepoDigests}}", pinned).stdout
    assert pinned in found
    client.close()


def test_a_missing_image_is_a_failed_boot_naming_it_that_counts_toward_the_breaker(
    tmp_path: Path, backend: str, image_registry: Registry, machine_engine: Engine
) -> None:
    digest = image_registry.push(_own_image(tmp_path, backend), "acme/renderer:1")
    config = _config(tmp_path, backend, image=f"{image_registry.host}/acme/renderer:1")
    pinned = f"{image_registry.host}/acme/renderer@{digest}"
    store_url = f"sqlite:///{tmp_path}/state.db"
    client = Client(store_url, config)
    with running_controller(
        tmp_path, config, store_url, SPKY_POOL_IMAGES="1", SPKY_POOL_MAX_MACHINES="1",
        SPKY_POOL_TIMINGS=TIMINGS, SPKY_REGISTRY_AUTH=str(image_registry.docker_config),
    ) as controller:  # fmt: skip
        # resolved at the controller's start; gone from the registry before the machine boots
        deleted = requests.delete(
            f"http://{image_registry.host}/v2/acme/renderer/manifests/{digest}",
            auth=(REGISTRY_USER, REGISTRY_PASSWORD), timeout=10,
        )  # fmt: skip
        assert deleted.status_code == 202, deleted.text
        client.store.machines.add("reg-gone", "render", "local", _revision(config, pinned), 1,
                                  time.time())  # fmt: skip
        started = time.monotonic()
        agent = _agent(tmp_path, controller.agents_url, "reg-gone", machine_engine)
        try:
            assert agent.wait(timeout=60) == 4  # a failed boot: the unit does not restart it
        finally:
            _stop(agent)
        assert time.monotonic() - started < 30  # no retrying what cannot succeed
        machine = client.store.machines.get("reg-gone")
        assert machine.state in ("failed", "destroyed")  # the tick destroys a failed machine
        assert f"image {pinned} is not in its registry" in (machine.failed_reason or "")
        assert controller.pool("render")["breaker"]["failures"] == 1
    log = (tmp_path / "reg-gone.log").read_text()
    assert f"event=boot_failed reason=image {pinned} is not in its registry" in log
    client.close()


def _start(folder: Path, config: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sp00ky_infra", "controller"],
        cwd=folder, capture_output=True, text=True, timeout=60,
        env={**os.environ, "SPKY_CONFIG": str(config), "SPKY_STORE": f"sqlite:///{folder}/s.db",
             "SPKY_POOL_PORT": "0", "SPKY_ADMIN_PORT": "0", "SPKY_POOL_SECRET": SECRET,
             "SPKY_POOL_IMAGES": "1", "SPKY_POOL_PROVIDER": "local", **env},
    )  # fmt: skip


def test_a_controller_without_an_engine_refuses_a_dockerfile_pool(
    tmp_path: Path, backend: str
) -> None:
    config = _config(tmp_path, backend)
    done = _start(tmp_path, config, DOCKER_HOST="unix:///nonexistent.sock")
    assert done.returncode == 2, done.stdout + done.stderr
    assert (
        f"error: pool render: backend {backend} has no deploy.image, and this controller has "
        "no Docker engine to build its deploy.dockerfile" in done.stderr
    )
    assert f"Set apps.{backend}.deploy.image to a registry image (REGISTRY/NAME:TAG)" in done.stderr


def test_a_controller_without_the_registrys_credentials_refuses_to_start(
    tmp_path: Path, backend: str, image_registry: Registry
) -> None:
    image_registry.push(_own_image(tmp_path, backend), "acme/renderer:1")
    tagged = f"{image_registry.host}/acme/renderer:1"
    config = _config(tmp_path, backend, image=tagged)
    done = _start(tmp_path, config, SPKY_REGISTRY_AUTH="", HOME=str(tmp_path))
    assert done.returncode == 2, done.stdout + done.stderr
    assert (
        f"error: pool render: image {tagged}: the registry {image_registry.host} wants "
        "credentials and there are none for it" in done.stderr
    )
