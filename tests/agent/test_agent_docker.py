"""The agent's docker runtime against a real Docker engine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from agent.docker import DockerAPI, DockerRuntime
from agent.jobs import JobRun, Slots
from agent.runtime import wait_ready
from sp00ky_infra.client import Client
from sp00ky_infra.shared import tokens
from tests.controllers import (
    SECRET,
    backend_app,
    project,
    revision_of,
    running_controller,
    wait_for,
)
from tests.helpers import ROOT


def _inspect(name: str) -> dict[str, object] | None:
    done = subprocess.run(["docker", "inspect", name], capture_output=True, text=True)
    return json.loads(done.stdout)[0] if done.returncode == 0 else None


def test_the_runtime_runs_the_image_on_loopback_with_labels(docker_images: str) -> None:
    runtime = DockerRuntime(
        image=docker_images,
        env={"RENDER_SECONDS": "0"},
        container_port=8080,
        labels={"sp00ky/machine": "m-test", "sp00ky/pool": "render"},
        name="sp00ky-m-test-backend",
    )
    runtime.start()
    try:
        assert wait_ready(runtime, "/health", time.monotonic() + 60) is None
        found = _inspect("sp00ky-m-test-backend")
        assert found is not None
        bindings = found["HostConfig"]["PortBindings"]  # type: ignore[index]
        assert bindings == {"8080/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(runtime.port)}]}
        assert found["Config"]["Labels"] == {"sp00ky/machine": "m-test", "sp00ky/pool": "render"}  # type: ignore[index]
        assert "PORT=8080" in found["Config"]["Env"]  # type: ignore[index]
        run = JobRun("j", "a1", "/render", {"gameId": "g"}, None, time.monotonic(), 1.0)
        Slots().start(run, runtime.port, on_done=lambda: None)
        assert run.done.wait(30)
        assert run.report is not None and run.report.status == "success"
        assert run.report.result["url"].endswith("/g.mp4")
    finally:
        runtime.stop()
    assert _inspect("sp00ky-m-test-backend") is None  # stopped and removed
    assert not runtime.alive()


def test_an_unknown_image_is_a_clear_error(docker_images: str) -> None:
    runtime = DockerRuntime("sp00ky-no-such-image:1", {}, 8080, {}, "sp00ky-nope-backend")
    try:
        runtime.start()
    except Exception as exc:  # DockerError
        assert "No such image" in str(exc) or "not found" in str(exc)
    else:
        raise AssertionError("an unknown image started")
    finally:
        runtime.stop()
    assert DockerAPI().call("GET", "/containers/sp00ky-nope-backend/json", ok=(404,)) is not None


def test_an_agent_with_the_docker_runtime_serves_the_real_controller(
    tmp_path: Path, docker_images: str
) -> None:
    log = tmp_path / "backend.jsonl"
    config = project(tmp_path, {"render": {"min": 0, "autoscale": True, "max": 1}},
                     {"renderer": backend_app("render", "render_job", log)})  # fmt: skip
    store_url = f"sqlite:///{tmp_path}/state.db"
    client = Client(store_url, config)
    store = client.store
    # The cap keeps the controller's own local machines out: this machine is the one.
    with running_controller(tmp_path, config, store_url, SPKY_POOL_MAX_MACHINES="1") as controller:
        revision = revision_of(config, "render")
        store.machines.add("render-dock", "render", "local", revision, 1, time.time())
        env = {
            **os.environ,
            "SPKY_AGENT_CONTROLLER_URL": controller.agents_url,
            "SPKY_AGENT_MACHINE": "render-dock",
            "SPKY_AGENT_JOIN_TOKEN": tokens.issue_join_token(SECRET, "render-dock", time.time()),
            "SPKY_AGENT_RUNTIME": "docker",
            "SPKY_AGENT_WORKDIR": str(tmp_path),
        }
        output = open(tmp_path / "agent.log", "w")  # noqa: SIM115 (the agent writes to it)
        agent = subprocess.Popen(
            [sys.executable, "-m", "agent"],
            cwd=ROOT,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for(
                lambda: store.machines.get("render-dock").state == "ready", timeout=60, what="ready"
            )
            job = client.run("renderer", "/render", {"gameId": "in-a-container"})
            done = wait_for(
                lambda: store.get(job.id).status == "success" and store.get(job.id), timeout=60
            )
            assert done.machine == "render-dock"
            assert done.result["url"].endswith("/in-a-container.mp4")
            container = _inspect("sp00ky-render-dock-backend")
            assert container is not None
            assert container["Config"]["Labels"]["sp00ky/machine"] == "render-dock"  # type: ignore[index]
            # the machine's env came over the session: the container has the backend's env
            assert "RENDER_SECONDS=0" in container["Config"]["Env"]  # type: ignore[index]
            agent.send_signal(signal.SIGTERM)
            assert agent.wait(timeout=60) == 0
        finally:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
            subprocess.run(
                ["docker", "rm", "-f", "sp00ky-render-dock-backend"], capture_output=True
            )
        assert _inspect("sp00ky-render-dock-backend") is None
        assert "event=drained" in (tmp_path / "agent.log").read_text()
    client.close()
