"""One controller, two pools, each on its own provider: render (provider hetzner) through the
real Pulumi engine against the fake Hetzner API, thumbs (provider docker) as containers on
this host's Docker engine. No SPKY_POOL_PROVIDER: the file decides.

The fake cloud's servers boot as agent processes on this host (``ProcessBooter``): each runs
the agent with the settings its user-data carries (the machine name, the controller URL and
the join token the stack's program issued), as local processes run it. What is checked is
that the server exists in the cloud, made by `pulumi up`, and that its agent, with the token
only the stack had, joins and runs the hetzner pool's job.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import pytest
import yaml

from sp00ky_infra.rehearse.boot import Booter
from sp00ky_infra.rehearse.cloud import TOKEN, FakeHetzner
from sp00ky_infra.shared import labels
from sp00ky_infra.shared.names import heartbeat_name, network_name
from tests.controllers import ControllerProcess, wait_for
from tests.helpers import ROOT, cli_process
from tests.pulumi_engine import StackProject, example_config

AGENT_SETTINGS = "/etc/sp00ky/agent.json"  # where the user-data writes the agent's settings


class ProcessBooter:
    """Boots each server of the fake cloud as an agent process (in a session of its own) with
    its user-data's settings; the machine's backend runs its deploy.command in ``workdir``."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.agents: dict[int, subprocess.Popen[bytes]] = {}

    def open(self) -> None:
        pass

    def allocate(self) -> str:
        return "127.0.0.1"

    def start(
        self, server_id: int, name: str, user_data: str, address: str,
        on_started: Callable[[int], None], on_failed: Callable[[int, str], None],
        image: str | None = None, snapshot: int | None = None,
    ) -> None:  # fmt: skip
        document = yaml.safe_load(user_data.removeprefix("#cloud-config\n"))
        (written,) = [f for f in document["write_files"] if f["path"] == AGENT_SETTINGS]
        settings = json.loads(written["content"])
        env = {
            "PATH": os.environ["PATH"],
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",
            "SPKY_AGENT_CONTROLLER_URL": settings["controller_url"],
            "SPKY_AGENT_MACHINE": settings["machine"],
            "SPKY_AGENT_JOIN_TOKEN": settings["join_token"],
            "SPKY_AGENT_RUNTIME": "process",
            "SPKY_AGENT_WORKDIR": str(self.workdir),
            "SPKY_AGENT_CREDENTIAL_FILE": str(self.workdir / f"{name}.credential"),
        }
        with (self.workdir / f"{name}.log").open("ab") as log:
            self.agents[server_id] = subprocess.Popen(
                [sys.executable, "-m", "agent"], env=env, cwd=self.workdir,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        # from a thread of its own, as a real boot reports: the fake API starts it under its lock
        threading.Thread(target=on_started, args=(server_id,), daemon=True).start()

    def running(self, server_id: int) -> bool | None:
        agent = self.agents.get(server_id)
        return None if agent is None else agent.poll() is None

    def remove(self, server_id: int) -> None:
        agent = self.agents.pop(server_id, None)
        if agent is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(agent.pid, signal.SIGKILL)
            agent.wait(timeout=10)

    def close(self) -> None:
        for server_id in list(self.agents):
            self.remove(server_id)


def _mixed_config(folder: Path) -> Path:
    """The example's render pool (provider hetzner) and a thumbs pool (provider docker) whose
    backend is the same server under another name and table."""
    path = example_config(folder)
    doc = yaml.safe_load(path.read_text())
    doc["pools"]["thumbs"] = {"provider": "docker", "min": 0, "autoscale": True, "max": 1}
    thumbs = json.loads(json.dumps(doc["apps"]["renderer"]))
    thumbs["runOn"] = {"pool": "thumbs"}
    thumbs["method"]["table"] = "thumb_job"
    doc["apps"]["thumbnailer"] = thumbs
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _prod_stack(folder: Path, pulumi_bin: str, config: Path) -> StackProject:
    project = StackProject.make(folder, pulumi_bin, "prod", {})
    project.config("sp00ky:provider", "hetzner")
    project.config("sp00ky:configFile", str(config))
    return project


def _controller_env(
    project: StackProject, cloud: FakeHetzner, name: str, address: str
) -> dict[str, str]:
    """No SPKY_POOL_PROVIDER: each pool on its own provider. The agents' endpoint listens at
    ``address`` (HOST:PORT), which containers and the cloud's servers both reach."""
    host, port = address.rsplit(":", 1)
    return {
        **{k: v for k, v in project.env.items() if k.startswith(("PULUMI", "PATH"))},
        "SPKY_POOL_PROVIDER": "",
        "SPKY_PULUMI_STACK": "prod",
        "SPKY_PULUMI_DIR": str(project.dir),
        "SPKY_PROJECT": name,
        "SPKY_POOL_HOST": host,
        "SPKY_POOL_PORT": port,
        "SPKY_POOL_PUBLIC_URL": f"http://{address}",
        "SPKY_POOL_TIMINGS": "lease=10s,idleTimeout=60s,bootTimeout=180s",
        "HCLOUD_TOKEN": TOKEN,
        "HCLOUD_ENDPOINT": cloud.url,
    }


def _free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def gateway(docker_images: str) -> str:
    """The host's address on Docker's bridge: containers and host processes both reach it."""
    from sp00ky_infra import engine

    client = engine.connect()
    try:
        return engine.network_gateway(client, "bridge")
    finally:
        client.close()


@pytest.fixture
def project_name(tmp_path: Path) -> Iterator[str]:
    """The sp00ky project of the test: its machine containers and network, removed after."""
    from sp00ky_infra import engine

    name = f"t{tmp_path.name[-8:].lower().replace('_', '')}"
    yield name
    client = engine.connect()
    try:
        for container in engine.machine_containers(client, name):
            container.remove(force=True)
        with contextlib.suppress(Exception):
            client.networks.get(network_name(name)).remove()
    finally:
        client.close()


def test_one_controller_runs_each_pool_on_its_own_provider(
    tmp_path: Path, pulumi_bin: str, gateway: str, project_name: str
) -> None:
    from sp00ky_infra import engine
    from sp00ky_infra.client import Client

    config = _mixed_config(tmp_path)
    store_url = f"sqlite:///{tmp_path}/state.db"
    port = _free_port(gateway)
    with FakeHetzner(boot=cast(Booter, ProcessBooter(tmp_path))) as cloud:
        project = _prod_stack(tmp_path, pulumi_bin, config)
        env = _controller_env(project, cloud, project_name, f"{gateway}:{port}")
        controller = ControllerProcess(tmp_path / "controller", config, store_url, env)
        jobs = Client(store_url, config)
        client = engine.connect()
        try:
            controller.start(timeout=300)
            render = jobs.run("renderer", "/render", {"gameId": "vm", "seconds": 0}).id
            thumb = jobs.run("thumbnailer", "/render", {"gameId": "box", "seconds": 0}).id
            wait_for(
                lambda: all(jobs.store.get(i).status == "success" for i in (render, thumb)),
                timeout=300, interval=0.5, what="a job on each pool to succeed",
            )  # fmt: skip
            on_vm, in_box = jobs.store.get(render).machine, jobs.store.get(thumb).machine
            assert on_vm and in_box
            # render's machine is a server in the (fake) cloud, made by the stack's `pulumi up`
            servers = {s["name"]: s for s in cloud.servers.values()}
            assert list(servers) == [on_vm], servers
            assert servers[on_vm]["labels"][labels.PROJECT] == project_name
            assert jobs.store.machines.get(on_vm).provider == "pulumi"
            # thumbs' machine is a container on this host's engine, not a server
            containers = engine.machine_containers(client, project_name)
            assert [c.labels[labels.MACHINE] for c in containers] == [in_box]
            assert jobs.store.machines.get(in_box).provider == "docker"
            # the stack holds the hetzner pool only: nothing of thumbs, not even a firewall
            written = json.loads(project.pulumi("config", "get", "sp00ky:machines").stdout)
            assert set(written) == {"render"}, written
            pools_firewalls = [
                f["name"]
                for f in cloud.firewalls.values()
                if f["name"] != heartbeat_name(project_name)
            ]  # the other is the guardian's heartbeat, which the controller stamps
            assert pools_firewalls == [f"sp00ky-{project_name}-render"]
            shown = {name: controller.pool(name) for name in ("render", "thumbs")}
            assert {n: (p["provider"], p["provisioner"]) for n, p in shown.items()} == {
                "render": ("hetzner", "pulumi"),
                "thumbs": ("docker", "docker"),
            }
        finally:
            controller.stop()
            jobs.close()
            client.close()
            project.pulumi("destroy", "--yes", "--skip-preview", check=False)


def test_a_controller_without_the_hetzner_settings_refuses_naming_the_pool(
    tmp_path: Path, docker_images: str
) -> None:
    """The same file, no Pulumi project, SPKY_PROJECT or HCLOUD_TOKEN: refused for render, the
    hetzner pool; thumbs' provider (docker: an engine answers) needs nothing more."""
    config = _mixed_config(tmp_path)
    env = {
        "SPKY_CONFIG": str(config), "SPKY_POOL_PROVIDER": "", "SPKY_POOL_SECRET": "s",
        "SPKY_PROJECT": "", "HCLOUD_TOKEN": "", "SPKY_PULUMI_DIR": str(tmp_path / "none"),
        "SPKY_POOL_PUBLIC_URL": "https://pool.example.com",
        "SPKY_POOL_PORT": "0", "SPKY_ADMIN_PORT": "0",
    }  # fmt: skip
    done = cli_process("controller", cwd=tmp_path, env=env, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "cannot start: a pool's provider is not served here; fix first:" in done.stderr
    problems = [line for line in done.stderr.splitlines() if line.startswith("  - ")]
    assert problems and all(
        line.startswith("  - pool render (provider hetzner) needs ") for line in problems
    ), problems
    for needed in ("needs SPKY_PROJECT, which is not set", "needs a Pulumi project"):
        assert any(needed in line for line in problems), problems
    assert "thumbs" not in done.stderr
    assert not (tmp_path / ".sp00ky" / "state.db").exists()  # refused before the store opened
