"""The ``docker`` runtime: the backend's image as a container on the machine's Docker engine.

Spoken to over the Engine API on its unix socket with the standard library. The backend's
port is bound to 127.0.0.1 only (a free port on the host), so nothing outside the machine
reaches it; the container carries labels that name the machine and the pool.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from agent.clock import Clock, Monotonic, looks
from agent.errors import DockerError
from agent.runtime import free_port
from agent.tail import TAIL_LINES

DOCKER_SOCKET = "/var/run/docker.sock"
API_VERSION = "v1.41"  # Docker 20.10 and later
STOP_GRACE_SECONDS = 5
PING_TIMEOUT_SECONDS = 5.0  # an engine still starting may hold a request: look again


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.socket_path)
        self.sock = sock


class DockerAPI:
    def __init__(self, socket_path: str = DOCKER_SOCKET, timeout: float = 60.0) -> None:
        self.socket_path = socket_path
        self.timeout = timeout

    def call(self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = ()) -> Any:
        """An answer's JSON body (None when empty); DockerError on a 4xx or 5xx not in ``ok``."""
        raw = self.raw(method, path, body, ok)
        return json.loads(raw) if raw else None

    def raw(self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = ()) -> bytes:
        """An answer's body as it comes (a container's log), DockerError on a 4xx or 5xx not
        in ``ok``: every request to the engine goes this way."""
        conn = _UnixConnection(self.socket_path, self.timeout)
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": "application/json"} if data is not None else {}
            conn.request(method, f"/{API_VERSION}{path}", body=data, headers=headers)
            answer = conn.getresponse()
            raw = answer.read()
        except OSError as exc:
            raise DockerError(
                f"cannot reach the Docker engine at {self.socket_path}: {exc}"
            ) from exc
        finally:
            conn.close()
        if answer.status >= 400 and answer.status not in ok:
            try:
                message = json.loads(raw).get("message", raw.decode(errors="replace"))
            except (ValueError, AttributeError):  # not JSON, or not an object
                message = raw.decode(errors="replace")
            raise DockerError(f"docker {method} {path}: {answer.status}: {message}")
        return raw


class EngineWatch:
    """Whether the machine's Docker engine answers: looked for in a thread of its own from
    the agent's start, so a VM whose engine is still starting joins meanwhile, and the
    backend's image is fetched the moment both are done (``clock.looks``' schedule)."""

    def __init__(self, socket_path: str, clock: Clock | None = None) -> None:
        self.api = DockerAPI(socket_path, timeout=PING_TIMEOUT_SECONDS)
        self.clock = clock or Monotonic()
        self.up = threading.Event()
        self.given_up = threading.Event()
        self.last_error = "not looked at yet"
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._look, name="docker-engine", daemon=True)
            self._thread.start()

    def _look(self) -> None:
        for pause in looks():
            try:
                self.api.raw("GET", "/_ping")
            except DockerError as exc:
                self.last_error = str(exc)
            else:
                self.up.set()
                return
            if self.clock.wait(self.given_up, pause):
                return

    def ready(self, deadline: float) -> None:
        """Once the engine answers; DockerError naming its socket if it did not by then."""
        self.start()
        if self.clock.wait(self.up, max(0.0, deadline - self.clock.now())):
            return
        self.given_up.set()
        raise DockerError(
            f"the Docker engine at {self.api.socket_path} did not answer within the boot "
            f"timeout ({self.last_error}): is docker.service running?"
        )


def demultiplex(raw: bytes) -> bytes:
    """A container's log as the Engine sends it without a TTY: frames of an 8-byte header
    (stream, 3 zero bytes, the size big-endian) and the payload; raw bytes otherwise."""
    if len(raw) < 8 or raw[0] not in (0, 1, 2) or raw[1:4] != b"\0\0\0":
        return raw
    out, at = bytearray(), 0
    while at + 8 <= len(raw):
        size = int.from_bytes(raw[at + 4 : at + 8], "big")
        out += raw[at + 8 : at + 8 + size]
        at += 8 + size
    return bytes(out)


class DockerRuntime:
    def __init__(
        self,
        image: str,
        env: Mapping[str, str],
        container_port: int,
        labels: Mapping[str, str],
        name: str,
        api: DockerAPI | None = None,
    ) -> None:
        self.image = image
        self.env = dict(env)
        self.container_port = container_port
        self.labels = dict(labels)
        self.name = name
        self.api = api or DockerAPI()
        self.port = 0
        self.container: str | None = None

    def start(self) -> None:
        self.api.call("DELETE", f"/containers/{quote(self.name)}?force=true", ok=(404,))
        self.port = free_port()
        exposed = f"{self.container_port}/tcp"
        created = self.api.call(
            "POST",
            f"/containers/create?name={quote(self.name)}",
            {
                "Image": self.image,
                "Env": [
                    f"{k}={v}" for k, v in {**self.env, "PORT": str(self.container_port)}.items()
                ],
                "Labels": self.labels,
                "ExposedPorts": {exposed: {}},
                "HostConfig": {
                    "PortBindings": {
                        exposed: [{"HostIp": "127.0.0.1", "HostPort": str(self.port)}]
                    },
                },
            },
        )
        self.container = created["Id"]
        self.api.call("POST", f"/containers/{self.container}/start")

    def stop(self) -> None:
        container, self.container = self.container, None
        if container is None:
            return
        self.api.call("POST", f"/containers/{container}/stop?t={STOP_GRACE_SECONDS}", ok=(304, 404))
        self.api.call("DELETE", f"/containers/{container}?force=true", ok=(404,))

    def alive(self) -> bool:
        if self.container is None:
            return False
        try:
            state = self.api.call("GET", f"/containers/{self.container}/json")["State"]
        except DockerError:
            return False
        return bool(state.get("Running"))

    def last_output(self) -> list[str]:
        """The container's last lines of output (the Engine's log, stdout and stderr)."""
        if self.container is None:
            return []
        raw = self.api.raw(
            "GET", f"/containers/{self.container}/logs?stdout=1&stderr=1&tail={TAIL_LINES}"
        )
        return demultiplex(raw).decode(errors="replace").splitlines()

    def describe(self) -> str:
        short = self.container[:12] if self.container else None
        return f"docker container={short} image={self.image} port=127.0.0.1:{self.port}"
