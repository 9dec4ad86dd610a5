"""A machine's boot on a test's clock: the backend's healthcheck is looked at at once, after
50 ms, then every 100 ms, never past the boot timeout; the Docker
engine is looked for on the same schedule from the agent's start, and a boot that finds no
engine by its deadline fails naming the engine's socket."""

from __future__ import annotations

import http.server
import socket
import socketserver
import threading
from pathlib import Path

import pytest

from agent.clock import looks
from agent.docker import EngineWatch
from agent.errors import DockerError
from agent.runtime import wait_ready

START = 1_000.0  # the monotonic time the backend was started


class Clock:
    """Time moves only when someone waits, by as long as they wait (or until the event)."""

    def __init__(self, now: float = START) -> None:
        self.time = now
        self.waits: list[float] = []

    def now(self) -> float:
        return self.time

    def wait(self, event: threading.Event, seconds: float) -> bool:
        assert seconds >= 0
        if not event.is_set():
            self.waits.append(seconds)
            self.time += seconds
        return event.is_set()


class Backend:
    """A runtime that answers its healthcheck from ``up_at`` on (never, if None)."""

    def __init__(self, clock: Clock, up_at: float | None, exits_at: float | None = None) -> None:
        self.port = 8080
        self.env: dict[str, str] = {}
        self.clock, self.up_at, self.exits_at = clock, up_at, exits_at
        self.looked: list[float] = []  # when the healthcheck was asked, since START

    def probe(self, port: int, healthcheck: str | None) -> bool:
        assert (port, healthcheck) == (8080, "/health")
        self.looked.append(round(self.clock.now() - START, 6))
        return self.up_at is not None and self.clock.now() >= START + self.up_at

    def start(self) -> None: ...
    def stop(self) -> None: ...

    def alive(self) -> bool:
        return self.exits_at is None or self.clock.now() < START + self.exits_at

    def describe(self) -> str:
        return "process pid=1 port=8080"

    def last_output(self) -> list[str]:
        return ["Traceback (most recent call last):", "ImportError: no module named x"]


class Ping(http.server.BaseHTTPRequestHandler):
    """The engine's ``/_ping``, and nothing else."""

    def do_GET(self) -> None:
        assert self.path == "/v1.41/_ping"
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"OK")

    def log_message(self, *args: object) -> None: ...


class Engine(socketserver.UnixStreamServer):
    """A Docker engine's socket, as far as a ping goes."""

    def get_request(self) -> tuple[socket.socket, tuple[str, int]]:
        request, _ = super().get_request()
        return request, ("local", 0)  # the handler wants an address pair


def test_the_pauses_start_at_50_ms_and_double_up_to_a_tenth_of_a_second() -> None:
    pauses = looks()
    assert [next(pauses) for _ in range(5)] == [0.05, 0.1, 0.1, 0.1, 0.1]


@pytest.mark.parametrize(
    ("up_at", "looked"),
    [
        (0.0, [0.0]),  # up at once: seen at once, no pause at all
        (0.04, [0.0, 0.05]),  # a quick start is seen within 50 ms
        (0.3, [0.0, 0.05, 0.15, 0.25, 0.35]),  # then ten looks a second
        (0.62, [0.0, 0.05, 0.15, 0.25, 0.35, 0.45, 0.55, 0.65]),
    ],
)
def test_the_healthcheck_is_looked_at_soon_then_less_often(
    up_at: float, looked: list[float]
) -> None:
    clock = Clock()
    backend = Backend(clock, up_at=up_at)
    assert wait_ready(backend, "/health", START + 60, clock, backend.probe) is None
    assert backend.looked == pytest.approx(looked)


def test_the_last_look_is_at_the_boot_timeout_and_none_after_it() -> None:
    clock = Clock()
    backend = Backend(clock, up_at=None)
    problem = wait_ready(backend, "/health", START + 0.5, clock, backend.probe)
    assert backend.looked == pytest.approx([0.0, 0.05, 0.15, 0.25, 0.35, 0.45, 0.5])
    assert clock.now() == pytest.approx(START + 0.5)
    assert problem is not None
    assert problem.startswith(
        "the backend was not ready within the boot timeout (waited for GET /health answering 2xx); "
    )
    assert "ImportError: no module named x" in problem


def test_a_backend_that_exits_while_booting_is_named_at_the_next_look() -> None:
    clock = Clock()
    backend = Backend(clock, up_at=None, exits_at=0.5)
    problem = wait_ready(backend, "/health", START + 60, clock, backend.probe)
    assert backend.looked == pytest.approx([0.0, 0.05, 0.15, 0.25, 0.35, 0.45])
    assert clock.now() == pytest.approx(START + 0.55)
    assert problem is not None
    assert problem.startswith(
        "the backend exited before it was ready (process pid=1 port=8080); "
    ), problem


def test_the_engine_is_seen_as_soon_as_it_answers(tmp_path: Path) -> None:
    """A real socket that starts answering: the watch, begun before the join, has seen it by
    the time the join is done, so the image's fetch waits for nothing."""
    socket_path = str(tmp_path / "docker.sock")
    watch = EngineWatch(socket_path)
    watch.start()  # no engine yet: it looks again, within a tenth of a second
    assert not watch.up.wait(0.2)
    assert "cannot reach the Docker engine" in watch.last_error
    with Engine(socket_path, Ping) as engine:
        threading.Thread(target=engine.serve_forever, daemon=True).start()
        assert watch.up.wait(2.0)
        watch.ready(deadline=0.0)  # already up: no wait, whatever the deadline
        engine.shutdown()


def test_no_engine_by_the_boot_timeout_is_a_failed_boot_naming_its_socket(
    tmp_path: Path,
) -> None:
    clock = Clock()
    socket_path = str(tmp_path / "absent.sock")
    watch = EngineWatch(socket_path, clock)
    with pytest.raises(DockerError) as failed:
        watch.ready(deadline=START + 30)
    assert str(failed.value).startswith(
        f"the Docker engine at {socket_path} did not answer within the boot timeout ("
    )
    assert str(failed.value).endswith("): is docker.service running?")
    assert watch.given_up.is_set()  # its thread stops looking
