"""A pool machine's first boot, as real processes: the bootstrap its user-data carries, written
into a temp root as cloud-init writes it and run as cloud-init runs it, fetches the agent from a
real controller on loopback (unreachable at first, then a standby answering 503), checks
it against the user-data's sha256, installs it and starts it; the agent joins and its backend
becomes ready. An archive altered on the way is never unpacked or run, and the machine's boot
fails with the reason, on its row. Stand-ins for systemctl and apt-get on the machine's PATH
record what install-agent.sh asks of them; systemctl's starts the agent as the unit would."""

from __future__ import annotations

import base64
import bz2
import gzip
import hashlib
import http.server
import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests
import yaml

from sp00ky_infra.client import Client
from sp00ky_infra.controller.provisioners.local import session_members
from sp00ky_infra.shared import tokens
from sp00ky_infra.shared.cloud_init import agent_archive, user_data
from tests.controllers import SECRET, backend_app, project, running_controller, wait_for

MACHINE = "render-b00t01"
TIMINGS = "lease=10s,idleTimeout=120s,bootTimeout=60s"

SYSTEMCTL = """#!{python}
import os, subprocess, sys
from pathlib import Path
root = Path({root!r})
with open(root / "systemctl.log", "a") as log:
    print(*sys.argv[1:], file=log)
if sys.argv[1] == "is-enabled":  # apt-get's stand-in installs Docker, enabling nothing
    sys.exit(1)
if sys.argv[1] == "start" and "sp00ky-agent.service" in sys.argv:
    unit = (root / "etc/systemd/system/sp00ky-agent.service").read_text()
    assert "ExecStart=/usr/bin/python3 -m agent" in unit, unit
    env = {{
        **os.environ,
        "PYTHONPATH": str(root / "opt/sp00ky"),
        "PYTHONUNBUFFERED": "1",
        "SPKY_AGENT_SETTINGS_FILE": str(root / "etc/sp00ky/agent.json"),
        "SPKY_AGENT_CREDENTIAL_FILE": str(root / "etc/sp00ky/credential"),
    }}
    with open(root / "agent.log", "a") as out:
        agent = subprocess.Popen(
            [sys.executable, "-m", "agent"], cwd=root / "opt/sp00ky", env=env, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )
    (root / "agent.pid").write_text(str(agent.pid))
"""

# apt-get's stand-in: records the call; installing docker.io leaves a docker command behind
APT_GET = """#!{python}
import sys
from pathlib import Path
with open({root!r} + "/apt-get.log", "a") as log:
    print(*sys.argv[1:], file=log)
if "docker.io" in sys.argv:
    docker = Path({bin!r}, "docker")
    docker.write_text("#!/bin/sh\\nexit 0\\n")
    docker.chmod(0o755)
"""


def _machine_path(root: Path) -> dict[str, str]:
    """The machine's PATH: the few tools the bootstrap and install-agent.sh use, python3 with
    requests, and the stand-ins; no docker (install-agent.sh installs it)."""
    tools = root / "bin"
    tools.mkdir(parents=True)
    for name in ("sh", "dirname", "install"):
        found = shutil.which(name)
        assert found is not None, name
        (tools / name).symlink_to(found)
    scripts = {
        "python3": f'#!/bin/sh\nexec {sys.executable} "$@"\n',
        "systemctl": SYSTEMCTL.format(python=sys.executable, root=str(root)),
        "apt-get": APT_GET.format(python=sys.executable, root=str(root), bin=str(tools)),
    }
    for name, text in scripts.items():
        (tools / name).write_text(text)
        (tools / name).chmod(0o755)
    return {"PATH": str(tools), "HOME": str(root)}


def _written(text: str, root: Path) -> list[str]:
    """The user-data's files written under ``root`` as cloud-init writes them, and its one
    command, as cloud-init would run it, given ``root``."""
    document = yaml.safe_load(text)
    for entry in document["write_files"]:
        path = root / entry["path"].lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        content = entry["content"].encode()
        if entry.get("encoding") == "gz+b64":
            content = gzip.decompress(base64.b64decode(content))
        path.write_bytes(content)
        path.chmod(int(entry["permissions"], 8))
    (command,) = document["runcmd"]
    assert command[:2] == ["python3", "/opt/sp00ky/bootstrap.py"], command
    return ["python3", str(root / "opt/sp00ky/bootstrap.py"), *command[2:], str(root)]


@dataclass
class Hop:
    """Between the machine and the controller: answers 503 to the first ``standby`` requests
    (a standby controller's answer), then forwards each one, the agent archive passed through
    ``alter``."""

    upstream: str
    standby: int = 0
    alter: Callable[[bytes], bytes] = lambda archive: archive
    seen: list[tuple[str, int]] = field(default_factory=list)


def _handler(hop: Hop) -> type[http.server.BaseHTTPRequestHandler]:
    class Forward(http.server.BaseHTTPRequestHandler):
        def log_message(self, *_: object) -> None:
            pass

        def do_GET(self) -> None:
            self.forward()

        def do_POST(self) -> None:
            self.forward()

        def forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            if len(hop.seen) < hop.standby:
                status, content, kind = 503, b'{"error": "not the leader"}', "application/json"
            else:
                headers = {
                    k: v for k in ("Authorization", "Content-Type") if (v := self.headers.get(k))
                }
                answer = requests.request(
                    self.command, hop.upstream + self.path, data=body, headers=headers, timeout=120
                )
                status, content = answer.status_code, answer.content
                kind = answer.headers.get("Content-Type", "application/octet-stream")
                if self.path.endswith("/agent") and status == 200:
                    content = hop.alter(content)
            hop.seen.append((self.path, status))
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

    return Forward


@contextmanager
def _hop(hop: Hop, port: int = 0) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _handler(hop))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class Machine:
    root: Path
    client: Client
    agents_url: str


@pytest.fixture
def machine(tmp_path: Path) -> Iterator[Machine]:
    """A controller of a process pool and the row of a machine it asked for (as a provisioner
    writes it); whatever the machine started is stopped at the end."""
    log = tmp_path / "backend.jsonl"
    config = project(
        tmp_path,
        {"render": {"min": 0, "autoscale": True, "max": 1}},
        {"renderer": backend_app("render", "render_job", log)},
    )
    store_url = f"sqlite:///{tmp_path}/state.db"
    client = Client(store_url, config)
    root = tmp_path / "machine"
    env = {"SPKY_POOL_TIMINGS": TIMINGS, "SPKY_POOL_MAX_MACHINES": "1"}
    with running_controller(tmp_path, config, store_url, **env) as controller:
        wait_for(controller.leader, what="leadership")
        revision = client.config.backend_for("render").revision(client.config.pools["render"])
        client.store.machines.add(MACHINE, "render", "local", revision, 1, time.time())
        try:
            yield Machine(root, client, controller.agents_url)
        finally:
            _stop_agent(root)
    client.close()


def _stop_agent(root: Path) -> None:
    pid_file = root / "agent.pid"
    if pid_file.exists():
        for member in session_members(int(pid_file.read_text())):
            with suppress(ProcessLookupError):
                os.kill(member, signal.SIGKILL)


def _started(machine: Machine, url: str, name: str = MACHINE) -> subprocess.Popen[str]:
    """The machine's first boot begun: its user-data written under its root, and its command
    started as cloud-init starts it."""
    token = tokens.issue_join_token(SECRET, name, time.time())
    command = _written(user_data(name, url, token, runtime="process"), machine.root)
    return subprocess.Popen(
        command,
        env=_machine_path(machine.root),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _boot(machine: Machine, url: str, name: str = MACHINE) -> tuple[int, str]:
    """The machine's first boot, to its end: its exit code and its output."""
    booting = _started(machine, url, name)
    output, _ = booting.communicate(timeout=120)
    return booting.returncode, output


def test_a_machine_fetches_checks_installs_and_starts_the_agent(machine: Machine) -> None:
    port = _free_port()
    booting = _started(machine, f"http://127.0.0.1:{port}")
    time.sleep(1.0)  # nothing listens there yet: the controller is unreachable
    hop = Hop(machine.agents_url, standby=2)  # then a standby answers, then the leader
    with _hop(hop, port):
        output, _ = booting.communicate(timeout=120)
        assert booting.returncode == 0, output
        retries = [line for line in output.splitlines() if "event=retry" in line]
        refused = [line for line in retries if "Connection refused" in line]
        assert refused and len(retries) == len(refused) + 2, output
        assert all("503" in line for line in retries[len(refused) :]), output
        assert f"event=installed sha256={_sha256(agent_archive())}" in output
        installed = machine.root / "opt/sp00ky"
        assert (installed / "agent/main.py").is_file()
        assert not (installed / "agent/bootstrap.py").exists()  # it rode in the user-data
        unit = machine.root / "etc/systemd/system/sp00ky-agent.service"
        assert unit.read_text() == (installed / "sp00ky-agent.service").read_text()
        # install-agent.sh installed Docker, which was missing, and not requests, which was not
        assert (machine.root / "apt-get.log").read_text().splitlines() == [
            "update -q",
            "install -y -q docker.io",
        ]
        calls = (machine.root / "systemctl.log").read_text().splitlines()
        assert calls == [
            "start docker.service sp00ky-agent.service",  # first: enabled for a reboot after
            "is-enabled --quiet docker.service",
            "enable --no-reload docker.service",
            "enable --no-reload sp00ky-agent.service",
        ]
        store = machine.client.store
        try:
            wait_for(lambda: store.machines.get(MACHINE).ready_at is not None, timeout=60)
        except AssertionError:
            raise AssertionError(_agent_log(machine.root)) from None
        agent_pid = int((machine.root / "agent.pid").read_text())
        assert Path(f"/proc/{agent_pid}/cwd").resolve() == installed.resolve()
    assert [path for path, _ in hop.seen[:3]] == [f"/v1/machines/{MACHINE}/agent"] * 3
    assert [status for _, status in hop.seen[:3]] == [503, 503, 200]


def test_a_tampered_agent_is_never_run_and_the_boot_fails_with_the_reason(
    machine: Machine,
) -> None:
    served = agent_archive()
    tampered = _tampered(served)
    with _hop(Hop(machine.agents_url, alter=lambda _: tampered)) as url:
        code, output = _boot(machine, url)
    assert code == 1, output
    reason = (
        f"the agent fetched from the controller has sha256 {_sha256(tampered)}, "
        f"the user-data expects {_sha256(served)}"
    )
    assert f"event=boot_failed reason={reason}" in output
    row = machine.client.store.machines.get(MACHINE)
    assert row.failed_reason == reason and row.state in ("failed", "destroyed")
    assert not (machine.root / "opt/sp00ky/agent").exists()  # never unpacked
    assert not (machine.root / "tampered-ran").exists()  # never run
    assert not (machine.root / "systemctl.log").exists()
    assert not (machine.root / "apt-get.log").exists()


def _tampered(archive: bytes) -> bytes:
    """The archive with an install-agent.sh of someone else's."""
    script = b'#!/bin/sh\ntouch "$1/tampered-ran"\n'
    buffer = io.BytesIO()
    with (
        tarfile.open(fileobj=io.BytesIO(archive), mode="r:bz2") as source,
        tarfile.open(fileobj=buffer, mode="w") as target,
    ):
        for member in source.getmembers():
            data = source.extractfile(member)
            assert data is not None
            content = script if member.name == "install-agent.sh" else data.read()
            member.size = len(content)
            target.addfile(member, io.BytesIO(content))
    return bz2.compress(buffer.getvalue())


def _agent_log(root: Path) -> str:
    log = root / "agent.log"
    return log.read_text()[-2000:] if log.exists() else "(the agent never started)"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_refused_token_is_final_and_installs_nothing(machine: Machine) -> None:
    """A machine the controller does not know (or a spent or expired token): no retry, no
    install, the controller's reason on the console."""
    started = time.monotonic()
    code, output = _boot(machine, machine.agents_url, "render-ghost1")
    assert code == 1, output
    assert "event=retry" not in output and time.monotonic() - started < 10
    assert "event=failed" in output and "401" in output
    assert "unknown machine 'render-ghost1'" in output
    assert not (machine.root / "opt/sp00ky/agent").exists()
    assert not (machine.root / "systemctl.log").exists()


def _baked(root: Path, sha256: str) -> None:
    """The agent unpacked under ``root`` as a bake leaves it, its file saying ``sha256``."""
    home = root / "opt/sp00ky"
    with tarfile.open(fileobj=io.BytesIO(agent_archive()), mode="r:bz2") as tar:
        tar.extractall(home, filter="data")
    (home / "agent.sha256").write_text(sha256 + "\n")


def test_an_agent_present_at_the_user_datas_sha256_is_installed_without_a_fetch(
    machine: Machine,
) -> None:
    expected = _sha256(agent_archive())
    _baked(machine.root, expected)
    hop = Hop(machine.agents_url)
    with _hop(hop) as url:
        code, output = _boot(machine, url)
        assert code == 0, output
        assert f"event=agent_present sha256={expected}" in output
        assert "event=agent_fetched" not in output
        assert f"event=installed sha256={expected}" in output
        store = machine.client.store
        try:
            wait_for(lambda: store.machines.get(MACHINE).ready_at is not None, timeout=60)
        except AssertionError:
            raise AssertionError(_agent_log(machine.root)) from None
    assert f"/v1/machines/{MACHINE}/agent" not in [path for path, _ in hop.seen]
    assert hop.seen  # the agent itself joined through the same hop


def test_an_agent_present_at_another_sha256_is_fetched_and_replaced(machine: Machine) -> None:
    expected = _sha256(agent_archive())
    _baked(machine.root, "0" * 64)  # a snapshot of an older agent
    hop = Hop(machine.agents_url)
    with _hop(hop) as url:
        code, output = _boot(machine, url)
    assert code == 0, output
    assert "event=agent_present" not in output
    assert f"event=agent_fetched sha256={expected}" in output
    assert hop.seen[0] == (f"/v1/machines/{MACHINE}/agent", 200)
    assert (machine.root / "opt/sp00ky/agent.sha256").read_text().strip() == expected
