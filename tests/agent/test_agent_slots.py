"""The agent's slot workers keep their connection to the backend between jobs, and never send
a job's POST twice: a connection the backend closed meanwhile is replaced before use, and a
stopped job's connection is not used again. A real HTTP/1.1 server on loopback."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from agent.jobs import POST_HERE_BYTES, JobRun, Slots
from tests.controllers import wait_for


class Backend:
    """A keep-alive backend that records each POST with the client's port; a POST to
    /slow waits until ``release`` is set."""

    def __init__(self, port: int = 0) -> None:
        self.posts: list[tuple[str, int]] = []  # (attempt, client port)
        self.connections: list[socket.socket] = []
        self.release = threading.Event()
        backend = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive

            def setup(self) -> None:
                super().setup()
                backend.connections.append(self.connection)

            def do_POST(self) -> None:
                length = int(self.headers["Content-Length"])
                self.rfile.read(length)
                backend.posts.append((self.headers["X-Sp00ky-Attempt"], self.client_address[1]))
                if self.path == "/slow":
                    backend.release.wait(10)
                body = json.dumps({"ok": True}).encode()
                if self.path == "/deep":  # nests past what json's recursion can take
                    body = b"[" * 200_000 + b"]" * 200_000
                with contextlib.suppress(OSError):  # a stopped job's client has left
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Stop serving and close every connection it holds (a backend restart)."""
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        for connection in self.connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def backend() -> Iterator[Backend]:
    served = Backend()
    yield served
    served.stop()


def _job(attempt: str, path: str = "/render", payload: Any = None) -> JobRun:
    payload = {"n": attempt} if payload is None else payload
    return JobRun("j", attempt, path, payload, None, time.monotonic(), 1.0)


def _run(
    slots: Slots, port: int, attempt: str, path: str = "/render", post_here: bool = False
) -> JobRun:
    run = _job(attempt, path)
    slots.start(run, port, on_done=lambda: None, post_here=post_here)
    assert run.done.wait(10)
    return run


@pytest.mark.parametrize("post_here", [False, True])
def test_jobs_one_after_another_share_one_connection_and_one_thread(
    backend: Backend, post_here: bool
) -> None:
    slots = Slots()
    before = [thread.name for thread in threading.enumerate()].count("slot")
    runs = [_run(slots, backend.port, f"a{n}", post_here=post_here) for n in range(5)]
    assert all(run.report is not None and run.report.status == "success" for run in runs)
    assert [attempt for attempt, _ in backend.posts] == ["a0", "a1", "a2", "a3", "a4"]
    assert len({port for _, port in backend.posts}) == 1  # one kept connection
    after = [thread.name for thread in threading.enumerate()].count("slot")
    assert after == before + 1  # one worker for them all, not a thread a job


@pytest.mark.parametrize("post_here", [False, True])
def test_a_connection_the_backend_closed_is_replaced_and_the_post_sent_once(
    post_here: bool,
) -> None:
    first = Backend()
    slots = Slots()
    try:
        assert _run(slots, first.port, "a1").report.status == "success"  # type: ignore[union-attr]
    finally:
        first.stop()  # the backend restarts: its kept connection is closed under the worker
    second = Backend(first.port)
    try:
        time.sleep(0.05)  # the close's FIN reaches the worker's socket
        run = _run(slots, second.port, "a2", post_here=post_here)
        assert run.report is not None and run.report.status == "success", run.report
        assert [attempt for attempt, _ in second.posts] == ["a2"]  # once
    finally:
        second.stop()


def test_a_stopped_job_drops_its_connection_and_the_next_job_opens_another(
    backend: Backend,
) -> None:
    slots = Slots()
    slow = _job("slow", "/slow")
    slots.start(slow, backend.port, on_done=lambda: None)
    deadline = time.monotonic() + 10
    while not backend.posts and time.monotonic() < deadline:
        time.sleep(0.005)
    slow.stop("cancelled")
    assert slow.done.wait(10)
    assert slow.report is None  # a stopped job reports nothing of its own
    backend.release.set()
    run = _run(slots, backend.port, "next")
    assert run.report is not None and run.report.status == "success"
    assert [attempt for attempt, _ in backend.posts] == ["slow", "next"]
    assert backend.posts[0][1] != backend.posts[1][1]  # a new connection


def test_a_post_on_a_kept_connection_is_sent_by_the_thread_that_starts_the_job(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``post_here`` the POST is out before ``start`` returns (no thread hand-off on
    the job's way in); the worker takes the answer. A first job, which must connect, and a
    request over POST_HERE_BYTES, are sent by the worker. Each POST exactly once, on the
    one kept connection."""
    senders: dict[str, str] = {}  # attempt: the name of the thread that sent its POST
    post = JobRun.post

    def recorded(run: JobRun, *args: Any) -> Any:
        senders[run.attempt] = threading.current_thread().name
        return post(run, *args)

    monkeypatch.setattr(JobRun, "post", recorded)
    slots = Slots()
    first = _job("connects")
    slots.start(first, backend.port, on_done=lambda: None, post_here=True)
    assert first.done.wait(10) and first.report is not None
    assert first.report.status == "success"

    backend.release.clear()
    held = _job("held", "/slow")  # the backend answers it only once released
    slots.start(held, backend.port, on_done=lambda: None, post_here=True)
    assert held.posted_at is not None  # sent on this thread, before start() returned
    assert not held.done.is_set()  # ... and its answer is the worker's to wait for
    backend.release.set()
    assert held.done.wait(10) and held.report is not None
    assert held.report.status == "success"

    large = _job("large", payload={"blob": "x" * POST_HERE_BYTES})
    slots.start(large, backend.port, on_done=lambda: None, post_here=True)
    assert large.done.wait(10) and large.report is not None
    assert large.report.status == "success"
    assert [attempt for attempt, _ in backend.posts] == ["connects", "held", "large"]
    assert len({port for _, port in backend.posts}) == 1
    here = threading.current_thread().name
    assert senders == {"connects": "slot", "held": here, "large": "slot"}


def test_a_job_stopped_while_its_answer_is_awaited_after_a_post_sent_here_reports_nothing(
    backend: Backend,
) -> None:
    slots = Slots()
    assert _run(slots, backend.port, "warm").report is not None  # the kept connection
    backend.release.clear()
    slow = _job("slow", "/slow")
    slots.start(slow, backend.port, on_done=lambda: None, post_here=True)
    assert slow.posted_at is not None
    # stopped while its answer is awaited: once the backend holds the request
    wait_for(lambda: [attempt for attempt, _ in backend.posts] == ["warm", "slow"])
    slow.stop("cancelled")
    assert slow.done.wait(10)
    assert slow.report is None
    backend.release.set()
    run = _run(slots, backend.port, "next", post_here=True)
    assert run.report is not None and run.report.status == "success"
    assert [attempt for attempt, _ in backend.posts] == ["warm", "slow", "next"]


@pytest.mark.parametrize("post_here", [False, True])
def test_a_post_that_cannot_be_sent_fails_its_job_and_the_worker_runs_the_next(
    backend: Backend, post_here: bool
) -> None:
    """A path http.client cannot put on the wire (not ASCII: the store refuses such a path,
    this is the agent's own guard) fails its job, whichever thread sends; the worker and
    its slot go on to the next job."""
    slots = Slots()
    assert _run(slots, backend.port, "warm").report is not None  # a kept connection
    bad = _run(slots, backend.port, "bad", "/caf\u00e9", post_here=post_here)
    assert bad.report is not None and bad.report.status == "failed"
    assert bad.report.error is not None and "/caf\u00e9" in bad.report.error.reason
    after = _run(slots, backend.port, "after", post_here=post_here)
    assert after.report is not None and after.report.status == "success"
    assert [attempt for attempt, _ in backend.posts] == ["warm", "after"]


@pytest.mark.parametrize("post_here", [False, True])
def test_an_answer_nested_past_pythons_recursion_fails_its_job_and_the_worker_goes_on(
    backend: Backend, post_here: bool
) -> None:
    slots = Slots()
    assert _run(slots, backend.port, "warm").report is not None
    deep = _run(slots, backend.port, "deep", "/deep", post_here=post_here)
    assert deep.report is not None and deep.report.status == "failed"
    assert deep.report.error is not None
    assert deep.report.error.code == "backend_error"
    assert "nests deeper than 64 levels" in deep.report.error.reason
    after = _run(slots, backend.port, "after", post_here=post_here)
    assert after.report is not None and after.report.status == "success"
