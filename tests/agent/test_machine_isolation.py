"""What a machine runs ends with the machine, and sees only its own environment, with
real processes: a controller (or `dev`), local agents, the example
backend, whose own log (BACKEND_LOG: one JSON line per job start, end, and stop) is the
witness of when each attempt's work ran.
"""

from __future__ import annotations

import json
import os
import pty
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import docker

from agent.runtime import PROCESS_BASICS
from sp00ky_infra.client import Client
from sp00ky_infra.controller.provisioners.local import session_members
from sp00ky_infra.shared.names import container_name
from tests.conftest import BASE_IMAGE
from tests.controllers import (
    SERVER,
    ControllerProcess,
    backend_app,
    backend_events,
    project,
    running_controller,
    wait_for,
    work_stopped,
)
from tests.helpers import drain_pty

RENDER = {"min": 0, "autoscale": True, "max": 2}


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def work_of(events: list[dict[str, Any]], attempt: str) -> tuple[float, float | None]:
    """When ``attempt``'s work started and stopped, by the backend's own log: its "end", its
    "closed", or the "stop" of the backend that had it in flight (None: no line says it
    stopped)."""
    start = next(e["t"] for e in events if e["event"] == "start" and e["attempt"] == attempt)
    ended = [e for e in events if e["event"] == "end" and e["attempt"] == attempt]
    stopped = ended + work_stopped(events, attempt)
    return start, min((e["t"] for e in stopped), default=None)


def test_a_dead_agents_backend_is_ended_before_its_job_runs_again(tmp_path: Path) -> None:
    """kill -9 of a busy agent, a second job queued at once (the pool grows, so the
    provisioner reaps the dead agent): the old backend's work stops before the retry starts,
    and nothing of the dead machine is left running."""
    store_url = f"sqlite:///{tmp_path}/state.db"
    log = tmp_path / "backend.jsonl"
    config = project(
        tmp_path, {"render": RENDER}, {"renderer": backend_app("render", "render_job", log)}
    )
    client = Client(store_url, config)
    store = client.store
    try:
        with running_controller(tmp_path, config, store_url):
            job_id = client.run("renderer", "/render", {"gameId": "long", "seconds": 15}).id
            first = wait_for(lambda: store.get(job_id).machine, what="the job running")
            wait_for(
                lambda: any(e["event"] == "start" for e in backend_events(log)),
                what="the backend got the job",
            )
            attempt_1 = store.get(job_id).attempt or ""
            agent_pid = int(store.machines.get(first).provider_id or 0)
            backend_pid = next(e["pid"] for e in backend_events(log) if e["event"] == "start")
            os.kill(agent_pid, signal.SIGKILL)  # the agent dies; its backend is orphaned
            client.run("renderer", "/render", {"gameId": "short", "seconds": 0.2})
            done = wait_for(
                lambda: store.get(job_id).status == "success" and store.get(job_id),
                timeout=40,
                what="the job done by its second attempt",
            )
            assert done.attempt_number == 2 and done.attempt != attempt_1
            events = backend_events(log)
            _, stopped_1 = work_of(events, attempt_1)
            started_2, _ = work_of(events, done.attempt or "")
            assert stopped_1 is not None, f"attempt 1's work never stopped: {events}"
            assert stopped_1 < started_2, (
                f"attempt 1 worked until {stopped_1 - started_2:+.2f}s after attempt 2 began"
            )
            assert not _alive(backend_pid), "the dead machine's backend is still running"
            assert [pid for pid in session_members(agent_pid) if _alive(pid)] == []  # zombies ended
            dead = store.machines.get(first)
            assert dead.state == "destroyed" and dead.failed_reason == "silent"
    finally:
        client.close()


def test_nothing_of_a_dead_agent_outlives_dev_ctrl_c(tmp_path: Path) -> None:
    """`dev`: kill -9 of a busy agent, a second job at once, then Ctrl-C before the lease
    runs out: every process any machine started is gone when `dev` returns."""
    log = tmp_path / "backend.jsonl"
    config = project(
        tmp_path, {"render": RENDER}, {"renderer": backend_app("render", "render_job", log)}
    )
    leader, follower = pty.openpty()
    env = {**os.environ, "SPKY_POOL_PORT": "0", "SPKY_ADMIN_PORT": "0", "SPKY_TICK": "200ms"}
    env.pop("SPKY_STORE", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "sp00ky_infra", "dev", str(config),
         "--plain", "--machines", "local",
         "--timings", "lease=30s,idleTimeout=30s,bootTimeout=15s"],
        cwd=tmp_path, env=env, stdin=follower, stdout=follower, stderr=follower, close_fds=True,
    )  # fmt: skip
    os.close(follower)
    seen = bytearray()

    def read() -> bool:
        """What dev printed so far, into ``seen``; False, so ``read() or check`` checks."""
        seen.extend(drain_pty(leader, 0.05))
        return False

    client = Client(f"sqlite:///{tmp_path}/.sp00ky/state.db", config)
    backends: list[int] = []
    try:
        wait_for(lambda: read() or b"dev" in seen, what="dev started")
        job_id = wait_for(
            lambda: _try_run(client, {"gameId": "long", "seconds": 20}), what="a job queued"
        )
        first = wait_for(lambda: read() or client.store.get(job_id).machine, timeout=30)
        wait_for(lambda: read() or any(e["event"] == "start" for e in backend_events(log)))
        agent_pid = int(client.store.machines.get(first).provider_id or 0)
        backends = [e["pid"] for e in backend_events(log) if e["event"] == "start"]
        os.kill(agent_pid, signal.SIGKILL)
        client.run("renderer", "/render", {"gameId": "short", "seconds": 20})
        wait_for(lambda: read() or len(client.store.machines.live()) == 2, timeout=30)
        time.sleep(0.5)  # the second machine's create reaps the dead agent
        proc.send_signal(signal.SIGINT)  # the first Ctrl-C drains (it would wait for the jobs)
        wait_for(lambda: read() or b"stopping:" in seen, what="dev draining")
        proc.send_signal(signal.SIGINT)  # the second aborts: every machine destroyed at once
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            read()
        assert proc.poll() is not None, bytes(seen).decode(errors="replace")
        read()
    finally:
        client.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(leader)
    left = [pid for pid in backends if _alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == [], "a dead agent's backend outlived dev's Ctrl-C"
    assert [pid for pid in session_members(agent_pid) if _alive(pid)] == []  # zombies ended


def _try_run(client: Client, payload: dict[str, Any]) -> str | None:
    try:
        return client.run("renderer", "/render", payload).id
    except Exception:  # the store is created by dev; not there yet
        return None


DUMP_AND_SERVE = (
    "import json, os, runpy, sys; "
    "json.dump(dict(os.environ), open(os.environ['ENV_DUMP'], 'w')); "
    "runpy.run_path(sys.argv[1], run_name='__main__')"
)
CONTROLLER_ONLY = {  # what the controller has and no backend may see
    "HCLOUD_TOKEN": "hcloud-token-of-the-controller",
    "DATABASE_URL": "postgresql://app:app-password@db/app",
    "SOME_CONTROLLER_SETTING": "controller",
}
SPKY_DOCUMENTED = {"SPKY_ENV": "staging", "SPKY_DB_NS": "ns1", "SPKY_DB_NAME": "db1"}


def test_the_backend_sees_only_its_own_env_and_the_documented_variables(tmp_path: Path) -> None:
    """A local machine's backend gets an allow-list: its own env, SPKY_ENV, SPKY_DB_NS,
    SPKY_DB_NAME, PORT, and what a process needs (PATH, HOME, the locale); its agent gets
    none of the controller's environment either."""
    store_url = f"sqlite:///{tmp_path}/state.db"
    dump = tmp_path / "backend-env.json"
    app = backend_app(
        "render",
        "render_job",
        tmp_path / "backend.jsonl",
        command=[sys.executable, "-c", DUMP_AND_SERVE, str(SERVER)],
    )
    app["env"]["ENV_DUMP"] = str(dump)
    config = project(tmp_path, {"render": RENDER}, {"renderer": app})
    client = Client(store_url, config)
    try:
        with running_controller(
            tmp_path, config, store_url, **CONTROLLER_ONLY, **SPKY_DOCUMENTED
        ) as controller:
            job = client.run("renderer", "/render", {"gameId": "env"})
            wait_for(lambda: client.store.get(job.id).status == "success", what="the job")
            seen = json.loads(dump.read_text())
            machine = client.store.get(job.id).machine or ""
            agent_pid = int(client.store.machines.get(machine).provider_id or 0)
            agent_env = _environ(agent_pid)
            controller_env = _environ(controller.proc.pid if controller.proc else 0)
    finally:
        client.close()
    own = {"BACKEND_LOG", "RENDER_SECONDS", "ENV_DUMP"}
    allowed = own | set(SPKY_DOCUMENTED) | {"PORT", *PROCESS_BASICS}
    assert set(seen) <= allowed, f"leaked into the backend: {sorted(set(seen) - allowed)}"
    assert own | set(SPKY_DOCUMENTED) | {"PORT", "PATH"} <= set(seen)
    assert {k: seen[k] for k in SPKY_DOCUMENTED} == SPKY_DOCUMENTED
    assert "SPKY_CONFIG" in controller_env and "HCLOUD_TOKEN" in controller_env  # the premise
    for name in (*CONTROLLER_ONLY, "SPKY_CONFIG", "SPKY_POOL_TIMINGS", "SPKY_STORE"):
        assert name not in agent_env, f"{name} reached the agent"
    assert not set(CONTROLLER_ONLY.values()) & set(agent_env.values())


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (entry.decode().partition("=") for entry in raw.split(b"\0") if b"=" in entry)
    return {name: value for name, _, value in pairs}


def test_a_docker_machines_backend_sees_its_env_and_its_images_env_only(
    tmp_path: Path, docker_images: str
) -> None:
    """A machine container (SPKY_POOL_DOCKER=1): the backend gets its own env, the image's
    ENV, the documented SPKY_* and PORT; not the agent's settings nor its join token."""
    name = f"t{secrets.token_hex(3)}"
    (tmp_path / "backend").mkdir()
    (tmp_path / "backend" / "server.py").write_text(SERVER.read_text())
    (tmp_path / "backend" / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\nCOPY server.py /app/server.py\n"
        "ENV HOST=127.0.0.1 IMAGE_SETTING=from-the-image\n"
        f'CMD ["python3", "-c", "{DUMP_AND_SERVE}", "/app/server.py"]\n'
    )
    app = backend_app("render", "render_job", Path("/tmp/unused.jsonl"))
    app["deploy"]["dockerfile"] = "./backend/Dockerfile"
    app["deploy"].pop("command")
    app["env"]["ENV_DUMP"] = "/tmp/backend-env.json"
    config = project(tmp_path, {"render": RENDER}, {"renderer": app})
    env = {
        "SPKY_POOL_DOCKER": "1",
        "SPKY_POOL_DOCKER_NETWORK": f"sp00ky-{name}",
        "SPKY_PROJECT": name,
        "SPKY_POOL_TIMINGS": "lease=10s,idleTimeout=30s,bootTimeout=60s",
        **CONTROLLER_ONLY,
        **SPKY_DOCUMENTED,
    }
    store_url = f"sqlite:///{tmp_path}/state.db"
    client = Client(store_url, config)
    engine = docker.from_env()
    controller = ControllerProcess(tmp_path, config, store_url, env)
    try:
        controller.start(timeout=300)
        job = client.run("renderer", "/render", {"gameId": "env"})
        wait_for(lambda: client.store.get(job.id).status == "success", timeout=120, what="job")
        machine = client.store.get(job.id).machine or ""
        container = engine.containers.get(container_name(machine))
        dumped = container.exec_run(["cat", "/tmp/backend-env.json"]).output
        assert isinstance(dumped, bytes)
        seen = json.loads(dumped)
    finally:
        controller.stop()
        client.close()
        for leftover in engine.containers.list(
            all=True, filters={"label": f"sp00ky/project={name}"}
        ):
            leftover.remove(force=True)
        for network in engine.networks.list(names=[f"sp00ky-{name}"]):
            network.remove()
        engine.close()
    image_env = {"HOST", "IMAGE_SETTING", "PATH", "LANG", "GPG_KEY", "PYTHON_VERSION"}
    allowed = {"BACKEND_LOG", "RENDER_SECONDS", "ENV_DUMP", "PORT", *SPKY_DOCUMENTED}
    allowed |= image_env | set(PROCESS_BASICS)
    assert set(seen) <= allowed, f"leaked into the backend: {sorted(set(seen) - allowed)}"
    assert seen["IMAGE_SETTING"] == "from-the-image"  # the image's own ENV reaches it
    assert {k: seen[k] for k in SPKY_DOCUMENTED} == SPKY_DOCUMENTED
    assert not any(key.startswith("SPKY_AGENT_") for key in seen)
