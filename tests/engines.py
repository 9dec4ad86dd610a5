"""Services the image tests start by hand and stop afterwards: a second, empty Docker engine
(the machine's own: its data-root, exec-root and socket), and a Docker registry (Debian's
``docker-registry``) on 127.0.0.1 with htpasswd credentials. Never through systemd.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

REGISTRY_USER = "machine"
REGISTRY_PASSWORD = "pull-secret-0123"


def _wait(
    what: str, ready: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode}): {log.read_text()[-2000:]}")
        if ready():
            return
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not answer within {timeout:.0f}s: {log.read_text()[-2000:]}")


def _stop(proc: subprocess.Popen[bytes], grace: float = 20.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass(frozen=True)
class Engine:
    socket: str
    host: str  # DOCKER_HOST

    def docker(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "DOCKER_HOST": self.host}
        return subprocess.run(
            ["docker", *args], env=env, capture_output=True, text=True, timeout=300
        )

    def images(self) -> list[str]:
        return self.docker("images", "-q", "--no-trunc").stdout.split()


@contextlib.contextmanager
def second_engine() -> Iterator[Engine]:
    """A dockerd of its own: data-root, exec-root, socket, and a bridge of its own, with no
    iptables rules (the host's engine keeps those). Its directories and bridge are removed
    afterwards.

    Not ``--bridge=none``: a dockerd started so deletes the host's ``docker0`` link (Docker
    20.10, ``removeDefaultBridgeInterface``), which breaks the host's engine for everyone.
    """
    # a short path: the socket's must fit in sun_path (108 bytes)
    root = Path(tempfile.mkdtemp(prefix="spky-engine-", dir="/tmp"))
    sock, log = root / "docker.sock", root / "dockerd.log"
    bridge = f"spky{secrets.token_hex(4)}"  # at most 15 characters
    subnet = f"10.231.{secrets.randbelow(250) + 1}"
    _ip("link", "add", bridge, "type", "bridge")
    command = [
        "dockerd", "--data-root", str(root / "data"), "--exec-root", str(root / "exec"),
        "--pidfile", str(root / "dockerd.pid"), "--host", f"unix://{sock}",
        f"--bridge={bridge}", "--iptables=false", "--ip6tables=false",
    ]  # fmt: skip
    engine = Engine(str(sock), f"unix://{sock}")
    proc = None
    try:
        _ip("addr", "add", f"{subnet}.1/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        with open(log, "wb") as out:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        _wait("dockerd", lambda: engine.docker("version").returncode == 0, proc, log, 60)
        yield engine
    finally:
        if proc is not None:
            with contextlib.suppress(Exception):
                ids = engine.docker("ps", "-aq").stdout.split()
                if ids:
                    engine.docker("rm", "-f", *ids)
            _stop(proc)
        subprocess.run(["umount", "-R", str(root / "data")], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@dataclass(frozen=True)
class Registry:
    host: str  # 127.0.0.1:PORT
    docker_config: Path  # a config.json with the credentials (SPKY_REGISTRY_AUTH)
    auth: bool

    def push(self, image: str, name: str) -> str:
        """Tag ``image`` as HOST/NAME on the host's engine and push it; the pushed digest."""
        target = f"{self.host}/{name}"
        subprocess.run(["docker", "tag", image, target], check=True, capture_output=True)
        env = {**os.environ, "DOCKER_CONFIG": str(self.docker_config.parent)}
        done = subprocess.run(
            ["docker", "push", target], env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr + done.stdout
        subprocess.run(["docker", "rmi", target], capture_output=True)
        return done.stdout.split("digest: ")[1].split()[0]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _answers(host: str) -> bool:
    try:
        with socket.create_connection(tuple(host.split(":")), timeout=0.5):  # type: ignore[arg-type]
            return True
    except OSError:
        return False


@contextlib.contextmanager
def registry(auth: bool = True) -> Iterator[Registry]:
    """docker-registry on 127.0.0.1 (plain HTTP, which Docker allows on loopback), with
    htpasswd (bcrypt) credentials when ``auth``; its storage is removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="spky-registry-", dir="/tmp"))
    host = f"127.0.0.1:{_free_port()}"
    config = {
        "version": 0.1,
        "log": {"level": "warn"},
        "storage": {
            "filesystem": {"rootdirectory": str(root / "data")},
            "delete": {"enabled": True},  # a test takes an image away after it was resolved
        },
        "http": {"addr": host},
    }
    if auth:
        htpasswd = subprocess.run(
            ["htpasswd", "-Bbn", REGISTRY_USER, REGISTRY_PASSWORD],
            check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
        (root / "htpasswd").write_text(htpasswd)
        config["auth"] = {"htpasswd": {"realm": "sp00ky-test", "path": str(root / "htpasswd")}}
    (root / "config.yml").write_text(json.dumps(config))  # JSON is YAML
    docker_config = root / "docker" / "config.json"
    docker_config.parent.mkdir()
    entry = {"auth": base64.b64encode(f"{REGISTRY_USER}:{REGISTRY_PASSWORD}".encode()).decode()}
    docker_config.write_text(json.dumps({"auths": {host: entry} if auth else {}}))
    log = root / "registry.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["docker-registry", "serve", str(root / "config.yml")], stdout=out, stderr=out
        )
    try:
        _wait("docker-registry", lambda: _answers(host), proc, log, 30)
        yield Registry(host, docker_config, auth)
    finally:
        _stop(proc)
        shutil.rmtree(root, ignore_errors=True)


def backend_context(folder: Path) -> None:
    """The example backend as a Docker build context in ``folder``, from the locally made base
    image, listening on every address (in its own container, where the agent reaches it)."""
    from tests.conftest import BASE_IMAGE
    from tests.helpers import ROOT

    folder.mkdir()
    (folder / "server.py").write_text((ROOT / "examples/backend/server.py").read_text())
    (folder / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\nCOPY server.py /app/server.py\nENV HOST=0.0.0.0\n"
        'CMD ["python3", "/app/server.py"]\n'
    )
