"""`dev --machines docker|local`, docker by default when a Docker engine answers; the first
line says which and why; a failed image build is one clear message with the build's last
lines."""

from __future__ import annotations

import contextlib
import secrets
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from sp00ky_infra.cli.controller import _machines_kind
from sp00ky_infra.store import open_store
from tests.conftest import BASE_IMAGE
from tests.controllers import backend_app, project
from tests.dev_process import Dev, example_project, processes_in
from tests.helpers import ROOT, cli_process

BURST = ("--burst", "1", "--path", "/render", "--payload", '{"gameId": "g", "seconds": 0.2}')


def test_the_machines_kind_and_why() -> None:
    assert _machines_kind("local", {"SPKY_POOL_DOCKER": "1"}) == ("local", "--machines local")
    assert _machines_kind(None, {"SPKY_POOL_DOCKER": "1"}) == ("docker", "SPKY_POOL_DOCKER=1")
    assert _machines_kind(None, {"SPKY_POOL_PROVIDER": "docker"}) == (
        "docker",
        "SPKY_POOL_PROVIDER=docker",
    )
    with pytest.raises(SystemExit) as exited:
        _machines_kind(None, {"SPKY_POOL_PROVIDER": "pulumi"})
    assert exited.value.code == 2


def test_dev_without_a_docker_engine_runs_local_processes_and_says_why(tmp_path: Path) -> None:
    """The README's first command on a machine with no Docker: dev falls back to processes
    (and scripts/demo pins them anyway)."""
    assert "--machines local" in (ROOT / "scripts" / "demo").read_text()
    folder = example_project(tmp_path / "project")
    env = {
        "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock",
        "SPKY_POOL_PORT": "0", "SPKY_ADMIN_PORT": "0", "SPKY_TICK": "200ms", "SPKY_STORE": "",
    }  # fmt: skip
    done = cli_process(
        "dev", "sp00ky.yml", *BURST, "--timings", "idleTimeout=1s", "--exit-when-idle", "--plain",
        cwd=folder, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith("dev: machines are local processes (no Docker engine answers: ")
    assert first.endswith("--machines docker once one runs)")
    assert "dev: sp00ky.yml on local processes;" in done.stdout
    # the file's pool is a hetzner pool: dev says it runs it here all the same
    pool_line = "dev: pool render: provider hetzner in sp00ky.yml, run on local processes by dev"
    assert pool_line in done.stdout.splitlines()
    assert "1 of 1 job(s) succeeded" in done.stdout


@pytest.fixture
def docker_dev(tmp_path: Path, docker_images: str) -> Iterator[tuple[Path, str, dict[str, str]]]:
    """A project whose backend's image builds on the local base image, on a network and
    under a project name of its own; every container and the network go at the end."""
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
    project(tmp_path, {"render": {"min": 0, "autoscale": True, "max": 2}}, {"renderer": app})
    env = {
        "SPKY_POOL_DOCKER_NETWORK": f"sp00ky-{name}", "SPKY_PROJECT": name,
        "SPKY_POOL_PORT": "0", "SPKY_ADMIN_PORT": "0", "SPKY_TICK": "200ms", "SPKY_STORE": "",
        "SPKY_POOL_PROVIDER": "", "SPKY_POOL_DOCKER": "",
    }  # fmt: skip
    yield tmp_path, name, env
    client = docker.from_env()
    try:
        for container in client.containers.list(
            all=True, filters={"label": f"sp00ky/project={name}"}
        ):
            container.remove(force=True)
        for network in client.networks.list(names=[f"sp00ky-{name}"]):
            with contextlib.suppress(docker.errors.APIError):
                network.remove()
    finally:
        client.close()


def _containers(name: str) -> list[str]:
    client = docker.from_env()
    try:
        found = client.containers.list(all=True, filters={"label": f"sp00ky/project={name}"})
        return [str(container.name) for container in found]
    finally:
        client.close()


def test_dev_runs_docker_machines_by_default_and_removes_an_earlier_runs(
    docker_dev: tuple[Path, str, dict[str, str]],
) -> None:
    folder, name, env = docker_dev
    client = docker.from_env()
    try:  # a machine container an earlier run left
        client.containers.run(
            BASE_IMAGE, ["sleep", "300"], detach=True, name=f"sp00ky-{name}-render-left",
            labels={"sp00ky/project": name, "sp00ky/role": "machine",
                    "sp00ky/machine": "render-left"},
        )  # fmt: skip
    finally:
        client.close()
    done = cli_process(
        "dev", "sp00ky.yml", *BURST, "--timings", "idleTimeout=1s,bootTimeout=60s",
        "--exit-when-idle", "--plain", cwd=folder, env=env, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == (
        "dev: machines are Docker containers (a Docker engine answers; --machines local runs "
        "local processes instead)"
    )
    assert "dev: sp00ky.yml on Docker containers;" in done.stdout
    assert "dev: pool render: provider hetzner in sp00ky.yml, run on docker by dev" in lines
    assert "1 of 1 job(s) succeeded" in done.stdout
    assert "render destroyed:" in done.stdout  # idle, by the pool itself
    assert _containers(name) == []  # the leftover went at start, the machine at the end
    assert _networks(name) == []  # dev made the network, and removed it with its machines
    store = open_store(f"sqlite:///{folder}/.sp00ky/state.db")
    try:
        (machine,) = [m for p in ("render",) for m in store.machines.recent(p)]
        assert machine.provider == "docker"
    finally:
        store.close()
    assert processes_in(folder) == []


def _networks(name: str) -> list[str]:
    with contextlib.closing(docker.from_env()) as client:
        return [str(network.name) for network in client.networks.list(names=[f"sp00ky-{name}"])]


def test_a_missing_dockerfile_is_one_line_naming_the_path_and_the_fix(
    docker_dev: tuple[Path, str, dict[str, str]],
) -> None:
    folder, name, env = docker_dev
    (folder / "backend" / "Dockerfile").unlink()
    done = cli_process(
        "dev", "sp00ky.yml", "--machines", "docker", cwd=folder, env=env, timeout=120
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        f"error: backend renderer: no Dockerfile at {folder}/backend/Dockerfile: fix "
        "deploy.dockerfile in sp00ky.yml (a relative path starts at its directory), or add "
        "the file there"
    ]
    assert _networks(name) == []


def _build_containers() -> set[str]:
    """Every container made from the base image (a build's steps are), stopped ones too."""
    client = docker.from_env()
    try:
        found = client.containers.list(all=True, filters={"ancestor": BASE_IMAGE})
        return {str(container.id) for container in found}
    finally:
        client.close()


def test_a_failed_image_build_is_one_message_with_its_last_lines(
    docker_dev: tuple[Path, str, dict[str, str]],
) -> None:
    folder, _, env = docker_dev
    before = _build_containers()
    (folder / "backend" / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\n"
        'RUN echo "resolving the wheels" && echo "boom: no such package: renderr" && exit 3\n'
    )
    done = cli_process(
        "dev", "sp00ky.yml", "--machines", "docker", cwd=folder, env=env, timeout=600
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout.splitlines()[0] == "dev: machines are Docker containers (--machines docker)"
    assert "error: building the image of backend renderer failed" in done.stderr
    tail = done.stderr.split("the build's last lines:", 1)[1]
    assert "boom: no such package: renderr" in tail
    assert "Traceback" not in done.stderr
    assert _build_containers() - before == set()  # the failed step's container went too


def test_ctrl_c_while_the_image_builds_stops_without_a_traceback(
    docker_dev: tuple[Path, str, dict[str, str]],
) -> None:
    folder, name, env = docker_dev
    (folder / "backend" / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\nRUN echo building-slowly && sleep 60\n"
    )
    dev = Dev(folder, "--machines", "docker", env=env, local=False)
    try:
        dev.wait_line(r"^dev: machines are Docker containers \(--machines docker\)")
        time.sleep(2.0)  # the build has begun
        dev.signal(signal.SIGINT)
        assert dev.wait(timeout=30) == 130, dev.output
        assert "interrupted while starting; no machine was created" in dev.output
        assert "Traceback" not in dev.output
        assert _containers(name) == []
    finally:
        dev.stop()
