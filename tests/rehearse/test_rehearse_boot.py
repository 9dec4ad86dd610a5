"""Boot mode of the fake Hetzner cloud, on the real Docker engine: a server made through the
project's own Hetzner client boots its user-data with cloud-init under systemd; the real
user-data installs the agent, which joins a real controller over the network path a VM's
would take, receives the backend's image into its own Docker engine and runs a job."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
import yaml

from sp00ky_infra.client import Client
from sp00ky_infra.hetzner.client import HetznerAPI
from sp00ky_infra.hetzner.errors import HcloudError
from sp00ky_infra.rehearse.boot import CLOUD, Booter
from sp00ky_infra.rehearse.cloud import TOKEN, FakeHetzner
from sp00ky_infra.rehearse.errors import BootError
from sp00ky_infra.rehearse.phases import Timeline
from sp00ky_infra.rehearse.rehearsal import Reading, read_server
from tests.controllers import backend_app, project, running_controller, wait_for
from tests.engines import backend_context
from tests.rehearse.machines import ready_machine


@pytest.fixture
def cloud(rehearsal_image: str) -> Iterator[FakeHetzner]:
    """A fake Hetzner cloud whose servers boot; every container and its network go after."""
    with FakeHetzner(boot=Booter(rehearsal_image)) as fake:
        yield fake
    assert _containers(fake) == []


@pytest.fixture
def bare_cloud(rehearsal_image: str, rehearsal_image_without_docker: str) -> Iterator[FakeHetzner]:
    """A cloud whose debian-12 servers boot without Docker, as Hetzner's do."""
    images = {"debian-12": rehearsal_image_without_docker}
    with FakeHetzner(boot=Booter(rehearsal_image, images=images)) as fake:
        yield fake
    assert _containers(fake) == []


def _containers(fake: FakeHetzner) -> list[str]:
    assert fake.boot is not None
    selector: dict[str, Any] = {"label": f"{CLOUD}={fake.boot.cloud}"}
    return [
        str(c.name)
        for c in docker.from_env().containers.list(all=True, filters=selector, ignore_removed=True)
    ]


def _api(fake: FakeHetzner) -> HetznerAPI:
    return HetznerAPI(TOKEN, fake.url, wait=lambda *_: 0.2)


def _booted(fake: FakeHetzner, server_id: int, timeout: float = 120) -> Timeline:
    """The server's timeline once cloud-init has finished every stage."""
    assert fake.boot is not None
    boot = fake.boot

    def done() -> Timeline | None:
        timeline = boot.timeline(server_id)
        return timeline if timeline.cloud_init_done else None

    found: Timeline = wait_for(done, timeout=timeout, interval=0.5, what="cloud-init done")
    return found


def _until_status(
    cloud: FakeHetzner, api: HetznerAPI, server_id: int, want: str, timeout: float = 120
) -> None:
    """Wait until the API says the server is ``want``; if it never is, fail with what it was
    meanwhile, its actions, and its container's state and console."""
    started, seen = time.monotonic(), list[tuple[float, str]]()

    def check() -> bool:
        status = api.get_server(server_id).status
        if not seen or seen[-1][1] != status:
            seen.append((round(time.monotonic() - started, 1), status))
        return status == want

    try:
        wait_for(check, timeout=timeout, interval=0.2, what=f"server {server_id} {want}")
    except AssertionError as exc:
        assert cloud.boot is not None
        actions = [
            (a["command"], a["status"], a.get("error"))
            for a in list(cloud.actions.values())
            if any(r["id"] == server_id for r in a["resources"])
        ]
        try:
            console = cloud.boot.console(server_id, lines=30)
        except Exception as error:  # the container may be gone: say so instead
            console = f"(no console: {error})"
        raise AssertionError(
            f"{exc}\nstatuses (seconds, status): {seen}\nactions: {actions}\n"
            f"container running: {cloud.boot.running(server_id)}\n{console}"
        ) from None


def test_a_server_boots_its_cloud_config_and_goes_when_deleted(cloud: FakeHetzner) -> None:
    assert cloud.boot is not None
    api = _api(cloud)
    config = {
        "write_files": [{"path": "/etc/rehearsal/hello", "content": "hello from user-data\n"}],
        "runcmd": [["sh", "-c", "hostname >> /root/runcmd-ran"]],
    }
    server = api.create_server(
        name="rehearse-a1", server_type="cx22", image="docker-ce", location="fsn1",
        user_data="#cloud-config\n" + yaml.safe_dump(config), labels={"sp00ky/pool": "render"},
    )  # fmt: skip
    assert server.status == "initializing"
    _until_status(cloud, api, server.id, "running")
    address = api.request("GET", f"/servers/{server.id}")["server"]["public_net"]["ipv4"]["ip"]
    timeline = _booted(cloud, server.id)
    assert timeline.cloud_init_errors == ()
    assert set(timeline.stages) == {"init-local", "init", "modules-config", "modules-final"}
    assert timeline.requested is not None and timeline.container_started is not None

    def run(*command: str) -> str:
        assert cloud.boot is not None
        code, output = cloud.boot.exec(server.id, *command)
        assert code == 0, output
        return output.strip()

    assert run("cat", "/etc/rehearsal/hello") == "hello from user-data"
    assert run("cat", "/root/runcmd-ran") == "rehearse-a1"  # runcmd ran, under its hostname
    assert run("cloud-init", "query", "v1.instance_id") == str(server.id)
    assert run("cloud-init", "query", "v1.local_hostname") == "rehearse-a1"
    assert address in run("hostname", "-I").split()  # the address the API gave
    assert run("systemctl", "is-system-running", "--wait") == "running"  # no failed unit
    assert run("docker", "info", "-f", "{{.Driver}} {{.Containers}}") == "overlay2 0"
    assert "modules:final" in cloud.boot.console(server.id)

    # a machine that powers itself off (as a refused agent does) is off, and stays listed
    cloud.boot.exec(server.id, "systemctl", "poweroff")
    _until_status(cloud, api, server.id, "off")
    # powered on again it is the same server: its disk, its instance (per-instance modules
    # do not run twice), a fresh boot
    api.request("POST", f"/servers/{server.id}/actions/poweron")
    _until_status(cloud, api, server.id, "running")
    # (a VM is "running" before its init answers, here too: wait until systemd's bus does)
    boot = cloud.boot
    wait_for(
        lambda: boot.exec(server.id, "systemctl", "is-system-running", "--wait")[1].strip()
        in ("running", "degraded"),
        what="systemd up",
    )  # fmt: skip
    assert run("systemctl", "is-system-running") == "running"
    assert run("cat", "/root/runcmd-ran") == "rehearse-a1"  # runcmd is once an instance
    assert run("cloud-init", "query", "v1.instance_id") == str(server.id)
    assert run("grep", "-c", "running 'modules:final'", "/var/log/cloud-init-output.log") == "2"
    assert api.delete_server(server.id)
    wait_for(lambda: _containers(cloud) == [], what="the container removed")
    with pytest.raises(HcloudError) as gone:
        api.get_server(server.id)
    assert gone.value.code == "not_found"


def test_a_look_at_a_server_going_keeps_what_the_last_look_saw(cloud: FakeHetzner) -> None:
    """A failed boot is destroyed in the tick that fails it: the look that reports it may find
    the server stopping, with no journal to read. What an earlier look saw stays."""
    assert cloud.boot is not None
    boot, api = cloud.boot, _api(cloud)
    unit = (
        "[Service]\nExecStart=/bin/sh -c 'echo event=joined; echo event=image_ready; "
        "exec sleep infinity'\n"
    )
    config = {
        "write_files": [{"path": "/etc/systemd/system/sp00ky-agent.service", "content": unit}],
        "runcmd": [["systemctl", "start", "sp00ky-agent.service"]],
    }
    server = api.create_server(
        name="rehearse-a2", server_type="cx22", image="docker-ce", location="fsn1",
        user_data="#cloud-config\n" + yaml.safe_dump(config), labels={"sp00ky/pool": "render"},
    )  # fmt: skip
    _until_status(cloud, api, server.id, "running")

    def looked() -> Reading | None:
        reading = read_server(boot, server.id, console=True)
        return reading if {"joined", "image_ready"} <= set(reading.events) else None

    seen: Reading = wait_for(looked, timeout=120, interval=0.5, what="the agent's events")
    booted = _booted(cloud, server.id)
    seen = read_server(boot, server.id, console=True, last=seen)
    assert seen.timeline.stages == booted.stages and seen.timeline.agent_started is not None

    boot.exec(server.id, "systemctl", "poweroff")
    wait_for(lambda: boot.running(server.id) is False, what="the server stopped")
    alone = read_server(boot, server.id, console=True)
    assert alone.events == {} and alone.timeline.stages == {}  # all a lone look can see now
    assert alone.timeline.container_started is not None
    after = read_server(boot, server.id, console=True, last=seen)
    assert after.events == seen.events
    assert after.timeline.stages == seen.timeline.stages
    assert after.timeline.agent_started == seen.timeline.agent_started
    assert after.timeline.container_started == alone.timeline.container_started
    assert "is not running" in after.console  # this look's console where it had one
    assert api.delete_server(server.id)
    wait_for(lambda: _containers(cloud) == [], what="the container removed")


@pytest.fixture
def backend(tmp_path: Path, docker_images: str) -> Iterator[str]:
    """A backend of its own (listening on every address, in its container)."""
    name = f"reh{int(time.time() * 1000) % 10**8}"
    backend_context(tmp_path / "backend")
    yield name
    subprocess.run(["docker", "rmi", "-f", f"sp00ky-dev-pool-{name}"], capture_output=True)


@pytest.mark.parametrize(
    ("image", "clouds"),
    [("docker-ce", "cloud"), ("debian-12", "bare_cloud")],
    ids=["docker-ce", "debian-12 without docker"],
)
def test_the_real_user_data_installs_an_agent_that_runs_a_job(
    tmp_path: Path, backend: str, image: str, clouds: str, request: pytest.FixtureRequest
) -> None:
    """On the default image Docker is there; on one without it the install script installs
    docker.io first, and the machine still becomes ready."""
    cloud: FakeHetzner = request.getfixturevalue(clouds)
    assert cloud.boot is not None
    app = backend_app("render", "render_job", tmp_path / "unused.jsonl")
    app["deploy"].pop("command")
    app["deploy"]["dockerfile"] = str(tmp_path / "backend" / "Dockerfile")
    config = project(tmp_path, {"render": {"min": 0, "autoscale": True, "max": 1}}, {backend: app})
    store_url = f"sqlite:///{tmp_path}/state.db"
    client = Client(store_url, config)
    machine = "render-vm1"
    with running_controller(
        tmp_path, config, store_url, SPKY_POOL_IMAGES="1", SPKY_POOL_MAX_MACHINES="1",
        SPKY_POOL_TIMINGS="lease=10s,idleTimeout=120s,bootTimeout=240s",
        SPKY_POOL_HOST=cloud.boot.gateway,  # where the servers reach this host
    ) as controller:  # fmt: skip
        image_id = subprocess.run(
            ["docker", "image", "inspect", "-f", "{{.Id}}", f"sp00ky-dev-pool-{backend}"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
        begun = time.monotonic()
        server = ready_machine(cloud, client, controller, config, image_id, machine, image)
        ready = time.monotonic() - begun
        job = client.run(backend, "/render", {"gameId": "rehearsed"})
        done = wait_for(
            lambda: client.store.get(job.id).status == "success" and client.store.get(job.id),
            timeout=60,
        )  # fmt: skip
        assert done.machine == machine and done.result["url"].endswith("/rehearsed.mp4")
        print(f"\nmachine ready {ready:.1f}s, job done {time.monotonic() - begun:.1f}s")
        timeline = _booted(cloud, server.id)
        assert timeline.cloud_init_errors == ()
        assert timeline.runcmd_finished is not None and timeline.agent_started is not None
        _, images = cloud.boot.exec(server.id, "docker", "image", "ls", "-q", "--no-trunc")
        assert image_id in images.split()  # delivered into the machine's own engine
        _, active = cloud.boot.exec(server.id, "systemctl", "is-active", "sp00ky-agent")
        assert active.strip() == "active"
        _, log = cloud.boot.exec(server.id, "cat", "/var/log/cloud-init-output.log")
        assert ("Setting up docker.io" in log) == (image == "debian-12"), log[-2000:]
        _report(timeline)
        assert _api(cloud).delete_server(server.id)
    client.close()


def _report(timeline: Timeline) -> None:
    """The boot's phases, printed (pytest -s) for the record."""
    start = timeline.requested or 0.0

    def at(value: float | None) -> str:
        return "-" if value is None else f"{value - start:6.1f}s"

    print(f"\ncontainer started {at(timeline.container_started)}")
    for stage, (begun, ended) in timeline.stages.items():
        print(f"cloud-init {stage:15} {at(begun)} .. {at(ended)}")
    print(f"runcmd finished {at(timeline.runcmd_finished)}")
    print(f"agent started {at(timeline.agent_started)}")
    print(f"cloud-init done {at(timeline.cloud_init_done)}")


def test_every_exception_of_the_rehearsal_is_a_rehearse_error() -> None:
    """The rehearsal has one exception root, as every part (tests/repo/test_error_roots.py
    checks the others)."""
    import importlib
    import inspect
    import pkgutil

    import sp00ky_infra.rehearse as part
    from sp00ky_infra.rehearse.errors import RehearseError

    seen = []
    for info in pkgutil.walk_packages(part.__path__, prefix="sp00ky_infra.rehearse."):
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            ours = inspect.isclass(value) and value.__module__ == info.name
            if ours and issubclass(value, BaseException):
                seen.append(value.__name__)
                assert issubclass(value, RehearseError), value
    assert {"RehearseError", "ImageBuildError", "BootError"} <= set(seen)


def test_a_missing_image_is_named_with_how_to_build_it(rehearsal_image: str) -> None:
    with pytest.raises(BootError) as missing:
        Booter("sp00ky-rehearse/debian-12:nosuchrecipe").open()
    assert str(missing.value) == (
        "the rehearsal image sp00ky-rehearse/debian-12:nosuchrecipe is missing; build it: "
        "scripts/rehearsal-image"
    )
