"""A real controller process for tests: its own project dir, store, ports and short timings.

Every process a test starts is stopped at teardown: the controller, and every machine the
store knows of (agents and backends, found by their session).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import requests
import yaml

from sp00ky_infra.client import Client
from sp00ky_infra.controller.core import Controller
from sp00ky_infra.controller.provisioners.local import session_members
from sp00ky_infra.controller.reconcile import tick
from sp00ky_infra.policy.machines import Reason
from sp00ky_infra.shared import tokens
from sp00ky_infra.store import SqlStore, open_store
from tests.helpers import ROOT

SERVER = ROOT / "examples" / "backend" / "server.py"
LISTENING = re.compile(r"agents' endpoint on (http://[^\s,]+).*, admin API on (http://\S+) ")
SECRET = "test-pool-secret-0123456789abcdef"
ADMIN_TOKEN = "test-admin-token"


def backend_app(
    pool: str,
    table: str,
    log: Path,
    command: list[str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "type": "backend",
        "runOn": {"pool": pool},
        "spec": str(ROOT / "examples" / "backend" / "openapi.yml"),
        "method": {"type": "outbox", "table": table},
        "deploy": {
            "dockerfile": str(ROOT / "examples" / "backend" / "Dockerfile"),
            "port": 8080,
            "healthcheck": "/health",
            "command": command or [sys.executable, str(SERVER)],
        },
        "env": {"BACKEND_LOG": str(log), "RENDER_SECONDS": "0"},
        **extra,
    }


def revision_of(config: Path, pool: str) -> str:
    """The revision the controller expects of ``pool``'s machines (a hand-made machine row
    with another one would be drained and replaced at once)."""
    from sp00ky_infra.config.loader import load_config

    loaded = load_config(config)
    return loaded.backend_for(pool).revision(loaded.pools[pool])


def project(
    folder: Path, pools: dict[str, dict[str, Any]], apps: dict[str, dict[str, Any]]
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "sp00ky.yml"
    path.write_text(yaml.safe_dump({"mode": "cluster", "pools": pools, "apps": apps}))
    return path


class ControllerProcess:
    def __init__(self, folder: Path, config: Path, store_url: str, env: dict[str, str]) -> None:
        self.folder = folder
        self.config = config
        self.store_url = store_url
        self.env = env
        self.proc: subprocess.Popen[str] | None = None
        self.agents_url = ""
        self.admin_url = ""
        self.output: list[str] = []

    def start(self, timeout: float = 30) -> ControllerProcess:
        self.folder.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "SPKY_CONFIG": str(self.config),
            "SPKY_STORE": self.store_url,
            "SPKY_POOL_PORT": "0",
            "SPKY_ADMIN_PORT": "0",
            "SPKY_POOL_PROVIDER": "local",  # every pool as local processes, unless told
            "SPKY_POOL_SECRET": SECRET,
            "SPKY_ADMIN_TOKEN": ADMIN_TOKEN,
            "SPKY_TICK": "200ms",
            "SPKY_POOL_TIMINGS": "lease=3s,idleTimeout=2s,bootTimeout=15s",
            "PYTHONUNBUFFERED": "1",
            **self.env,
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sp00ky_infra", "controller"],
            cwd=self.folder,
            env=env,
            stdout=subprocess.PIPE,
            stderr=open(self.folder / "controller.err", "a"),  # noqa: SIM115
            text=True,
        )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.output.append(line)
            found = LISTENING.search(line)
            if found:
                self.agents_url, self.admin_url = found.group(1), found.group(2)
                return self
        raise AssertionError(
            f"controller did not start: {''.join(self.output)}"
            + (self.folder / "controller.err").read_text()
        )

    def join(self, client: Client, machine: str, pool: str = "render") -> str:
        """A machine row at ``pool``'s revision, joined over the agents' API as an agent would
        (no agent runs): its session token."""
        revision = client.config.backend_for(pool).revision(client.config.pools[pool])
        client.store.machines.add(machine, pool, "local", revision, 1, time.time())
        token = tokens.issue_join_token(SECRET, machine, time.time(), ttl=60)
        joined = requests.post(
            f"{self.agents_url}/v1/join", json={"machine": machine, "token": token}, timeout=10
        )
        assert joined.status_code == 200, joined.text
        session: str = joined.json()["session"]
        return session

    def admin(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        return requests.request(
            method,
            f"{self.admin_url}{path}",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            timeout=30,
            **kwargs,
        )

    def pool(self, name: str) -> dict[str, Any]:
        answer = self.admin("GET", f"/pools/{name}")
        assert answer.status_code == 200, answer.text
        result: dict[str, Any] = answer.json()
        return result

    def leader(self) -> bool:
        try:
            return bool(requests.get(f"{self.agents_url}/v1/health", timeout=5).json()["leader"])
        except requests.RequestException:
            return False

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def log(self) -> str:
        return (self.folder / "controller.err").read_text()


def wait_for(
    check: Callable[[], Any], timeout: float = 30, interval: float = 0.1, what: str = ""
) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or check}: last {last!r}")


def kill_machines(store_url: str) -> None:
    """Stop every machine process the store knows of (agents and their backends)."""
    store = open_store(store_url)
    try:
        with store.read() as cur:
            cur.execute("SELECT provider_id FROM machines WHERE provider_id IS NOT NULL")
            pids = [int(row[0]) for row in cur.fetchall()]
    finally:
        store.close()
    for pid in pids:
        for member in session_members(pid):
            with suppress(ProcessLookupError):
                os.kill(member, signal.SIGKILL)


@contextmanager
def running_controller(
    folder: Path, config: Path, store_url: str, **env: str
) -> Iterator[ControllerProcess]:
    process = ControllerProcess(folder, config, store_url, env).start()
    try:
        yield process
    finally:
        process.stop()
        kill_machines(store_url)


def add_ready_machine(
    store: SqlStore, name: str, revision: str, slots: int, session: str, now: float
) -> None:
    """A machine row of pool ``render`` taken to ready, its agent joined with ``session``
    (the controller's tests that poll it in process)."""
    store.machines.add(name, "render", "local", revision, slots, now)
    store.machines.move(name, Reason.PROVISIONED, now)
    store.machines.join(name, tokens.session_hash(session), now)
    store.machines.move(name, Reason.READY, now)


@contextmanager
def leading(controller: Controller) -> Iterator[Controller]:
    """An in-process controller after its first tick (it leads its store, or this fails);
    its leadership released and its store closed at the end."""
    try:
        assert tick(controller).leader, "another controller leads this store"
        yield controller
    finally:
        controller.leader_lock.release()
        controller.store.close()


@contextmanager
def paused_controller(folder: Path) -> Iterator[tuple[ControllerProcess, Client]]:
    """One controller on a SQLite store in ``folder`` (pool ``render``, 0 to 1 machine, paused,
    so rows stay as written) and a client on that store: for tests of what its APIs accept."""
    store_url = f"sqlite:///{folder}/state.db"
    app = backend_app("render", "render_job", folder / "backend.jsonl")
    config = project(folder, {"render": {"min": 0, "autoscale": True, "max": 1}}, {"renderer": app})
    client = Client(store_url, config)
    try:
        with running_controller(folder, config, store_url) as controller:
            wait_for(controller.leader, what="leadership")
            assert controller.admin("POST", "/pools/render/pause").status_code == 200
            yield controller, client
    finally:
        client.close()


@contextmanager
def two_controllers(
    folder: Path, store_url: str, app: dict[str, Any], env: dict[str, str] | None = None
) -> Iterator[tuple[ControllerProcess, ControllerProcess, Client]]:
    """Controller A leads a ``render`` pool (0 to 2 machines) of ``app``; B has started (and
    read the pools' state) and waits. Both are stopped at the end, and every machine."""
    pools = {"render": {"min": 0, "autoscale": True, "max": 2}}
    config = project(folder, pools, {"renderer": app})
    client = Client(store_url, config)
    first = ControllerProcess(folder / "a", config, store_url, env or {}).start()
    second: ControllerProcess | None = None
    try:
        wait_for(first.leader, what="the first controller leading")
        second = ControllerProcess(folder / "b", config, store_url, env or {}).start()
        yield first, second, client
    finally:
        first.stop()
        if second is not None:
            second.stop()
        kill_machines(store_url)
        client.close()


class Deploy:
    """A controller serving ``folder``'s sp00ky.yml, and ``redeploy`` to change that file and
    restart it on the same agents' port, as a deploy does (the machines stay and reconnect)."""

    def __init__(self, folder: Path, store_url: str, env: dict[str, str]) -> None:
        self.folder, self.store_url, self.env = folder, store_url, env
        self.controllers: list[ControllerProcess] = []

    @property
    def current(self) -> ControllerProcess:
        return self.controllers[-1]

    def start(self, pools: dict[str, Any], apps: dict[str, Any]) -> ControllerProcess:
        config = project(self.folder, pools, apps)
        env = dict(self.env)
        if self.controllers:
            self.current.stop()
            env["SPKY_POOL_PORT"] = self.current.agents_url.rsplit(":", 1)[1]
        self.controllers.append(ControllerProcess(self.folder, config, self.store_url, env).start())
        return self.current


@contextmanager
def deploys(folder: Path, store_url: str, env: dict[str, str] | None = None) -> Iterator[Deploy]:
    """Every controller started is stopped at the end, and every machine."""
    deploy = Deploy(folder, store_url, env or {})
    try:
        yield deploy
    finally:
        for controller in deploy.controllers:
            controller.stop()
        kill_machines(store_url)


def backend_events(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def work_stopped(events: list[dict[str, Any]], attempt: str) -> list[dict[str, Any]]:
    """The backend's lines saying ``attempt``'s work stopped before its end: the "stop" of the
    backend that had it in flight, or its "closed" (the agent closed its request)."""
    return [
        e
        for e in events
        if (e["event"] == "stop" and attempt in e["attempts"])
        or (e["event"] == "closed" and e["attempt"] == attempt)
    ]


def live_machines(store: SqlStore, pool: str, state: str | None = None) -> list[str]:
    return [m.name for m in store.machines.live(pool) if state is None or m.state == state]
