"""One job on the machine: a POST to the backend on loopback, held open until it answers or
the job's deadline, on a slot worker's thread so that polls (and so renewals) keep flowing.

A slot worker (``Slots``) is a thread that lives as long as the agent and keeps its
keep-alive connection to the backend between jobs: a job costs no thread start, and no
connect, accept and close on either side (the backend's server starts no thread for a new
connection either). Before reusing a connection the worker checks that the backend has not
closed it meanwhile (an idle timeout, a restart), as urllib3 does; a POST is never sent
twice.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import json
import queue
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent.protocol import ErrorCode, ErrorInfo, ResultRequest

REASON_EXCERPT = 300
# What the controller accepts of a result (docs/jobs.md, "Limits"; mirrored from
# sp00ky_infra.policy.jobs, a test holds them equal): an answer past them fails the attempt
# here, instead of being refused at the controller and left to wait out its lease.
MAX_RESULT_BYTES = 1024 * 1024
MAX_JSON_DEPTH = 64
# A POST the poll's thread may send itself (Slots.start): an idle kept-alive connection takes
# this much on loopback without blocking, so the poll loop never waits on a backend's reads.
POST_HERE_BYTES = 16 * 1024
# ... and a send that does not go through within this (a backend that left a request's bytes
# unread on the connection) fails the job rather than hold the poll loop.
POST_HERE_SECONDS = 1.0

Step = Callable[[], ResultRequest | None]  # what a slot worker does for a job it is given


@dataclass(eq=False)
class JobRun:
    job: str
    attempt: str
    path: str
    payload: Any
    deadline: float | None  # unix time
    renewed_at: float  # monotonic send time of the last poll that renewed the lease
    margin: float
    assigned_at: float = field(default_factory=time.monotonic)  # its poll answer came
    posted_at: float | None = None  # monotonic: its POST was sent
    report: ResultRequest | None = None  # what to tell the controller, once done
    report_bytes: int = 0  # its result's size as JSON: a large one goes by courier, not on a poll
    stopped: str | None = None  # cancelled, stale, abandoned, shutdown
    sending: bool = False  # its result is on its way (on a poll, or by the courier)
    done: threading.Event = field(default_factory=threading.Event)
    _conn: http.client.HTTPConnection | None = None  # while its POST is out
    _guard: threading.Lock = field(default_factory=threading.Lock)  # _conn, for stop()

    def _run(
        self,
        link: BackendLink,
        on_done: Callable[[], None],
        step: Step,
    ) -> None:
        try:
            try:
                report = step()
            except Exception as exc:  # the job fails; the worker lives on for the next one
                report = self._lost(link, exc)
            with self._guard:  # a stop after this finds the report, and drop() replaces it
                if self.stopped is None:
                    self.report = report
        finally:
            self.done.set()
            on_done()

    def _call(
        self, link: BackendLink, request: tuple[bytes, dict[str, str]] | None = None
    ) -> ResultRequest | None:
        """POST the job and wait for the answer: the result to report (None if stopped)."""
        failed = self.post(link, request)
        if failed is not None or self._conn is None:  # failed, or stopped before it was sent
            return failed
        return self._answer(link)

    def request(self) -> tuple[bytes, dict[str, str]]:
        """The POST's body and headers."""
        body = json.dumps(self.payload).encode()
        headers = {
            "Content-Type": "application/json",
            "X-Sp00ky-Job": self.job,
            "X-Sp00ky-Attempt": self.attempt,
        }
        return body, headers

    def timeout(self) -> float | None:
        """How long the POST may take: up to the job's deadline, less the safety margin."""
        if self.deadline is None:
            return None
        return max(0.05, self.deadline - time.time() - self.margin)

    def post(
        self,
        link: BackendLink,
        request: tuple[bytes, dict[str, str]] | None = None,
        conn: http.client.HTTPConnection | None = None,
    ) -> ResultRequest | None:
        """Send the POST on ``conn`` (else ``link``'s connection), without waiting for the
        answer: None once it is out (or the job was stopped before, which leaves ``_conn``
        unset), else the failed result (the connection is then dropped: a POST is never
        sent twice)."""
        body, headers = request or self.request()
        conn = conn or link.connection(self.timeout())
        with self._guard:
            if self.stopped is not None:
                return None
            self._conn = conn
        try:
            self.posted_at = time.monotonic()
            conn.request("POST", self.path, body=body, headers=headers)
        except (OSError, http.client.HTTPException, ValueError) as exc:  # ValueError: a path
            return self._lost(link, exc)  # http.client cannot encode
        return None

    def _lost(self, link: BackendLink, exc: BaseException) -> ResultRequest:
        with self._guard:
            self._conn = None
        link.discard()
        if isinstance(exc, TimeoutError):
            return _failed("timeout", "the backend did not answer by the job's deadline")
        if isinstance(exc, OSError | http.client.HTTPException):
            reason = str(exc) or type(exc).__name__
            return _failed("backend_unreachable", f"POST {self.path}: {reason}")
        return _failed("backend_error", f"POST {self.path}: {type(exc).__name__}: {exc}")

    def _answer(self, link: BackendLink) -> ResultRequest | None:
        """The backend's answer to the POST sent on ``_conn``, as the result to report."""
        conn = self._conn
        assert conn is not None
        try:
            answer = conn.getresponse()
            data = answer.read()
        except (OSError, http.client.HTTPException) as exc:
            return self._lost(link, exc)
        with self._guard:
            self._conn = None
        if self.stopped is not None:
            link.discard()  # its socket was shut down under it
        if 200 <= answer.status < 300:
            try:
                result = _decode(data)
                self.report_bytes = len(json.dumps(result, allow_nan=False).encode())
            except RecursionError:  # json's parser and encoder recurse: past Python's limit
                return _failed(
                    "backend_error", f"the answer nests deeper than {MAX_JSON_DEPTH} levels"
                )
            except ValueError:
                return _failed("backend_error", "the answer has NaN or Infinity: not JSON")
            if self.report_bytes > MAX_RESULT_BYTES:
                return _failed(
                    "backend_error",
                    f"the answer is {self.report_bytes} bytes as JSON, over the 1 MiB a result "
                    "may be; store large outputs elsewhere and answer with a reference",
                    answer.status,
                )
            if _depth(result) > MAX_JSON_DEPTH:
                return _failed(
                    "backend_error", f"the answer nests deeper than {MAX_JSON_DEPTH} levels"
                )
            return ResultRequest(status="success", result=result)
        excerpt = data[:REASON_EXCERPT].decode(errors="replace")
        return _failed("backend_error", f"HTTP {answer.status}: {excerpt}", answer.status)

    def posted(self) -> float | None:
        """Seconds from its poll answer to its POST being sent (None until sent): the
        machine's part of the dispatch time, which travels with the polls and the result."""
        return None if self.posted_at is None else self.posted_at - self.assigned_at

    def stop(self, reason: str) -> None:
        """Drop the request: the connection is shut, so the backend sees the client leave."""
        with self._guard:
            self.stopped = reason
            conn = self._conn
            if conn is not None and conn.sock is not None:
                with contextlib.suppress(OSError):
                    conn.sock.shutdown(socket.SHUT_RDWR)


class BackendLink:
    """A slot worker's keep-alive connection to the backend on loopback."""

    def __init__(self) -> None:
        self.port: int | None = None
        self._conn: http.client.HTTPConnection | None = None

    def connection(self, timeout: float | None) -> http.client.HTTPConnection:
        """The connection for the next POST: the kept one if the backend still holds it
        open at ``port`` (no EOF or stray bytes waiting on it), else a new one."""
        conn = self._conn
        if conn is not None and (conn.port != self.port or not _usable(conn.sock)):
            self.discard()
            conn = None
        if conn is None:
            assert self.port is not None
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
            self._conn = conn
        else:
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
        return conn

    def kept(self, timeout: float | None) -> http.client.HTTPConnection | None:
        """The kept connection, open and usable at ``port``, ready for the next POST; None
        when the next POST would have to connect first (``connection`` then does)."""
        conn = self._conn
        if conn is None or conn.sock is None or conn.port != self.port:
            return None
        if not _usable(conn.sock):
            return None
        conn.timeout = timeout
        conn.sock.settimeout(timeout)
        return conn

    def discard(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _usable(sock: socket.socket | None) -> bool:
    """An idle kept-alive socket is readable only if the peer closed it (EOF) or sent what
    nobody asked for: either way it is not to be used again."""
    if sock is None:
        return True  # closed by http.client after a `Connection: close` answer: reopens
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable


class Slots:
    """The slot workers: a job runs on an idle one, or on a new one when none is idle (at
    most one a slot in steady use; a worker whose job was abandoned and is still stuck in
    its call is not idle, so it never delays a new job)."""

    def __init__(self) -> None:
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()

    def start(
        self, run: JobRun, port: int, on_done: Callable[[], None], post_here: bool = False
    ) -> None:
        """Run ``run`` on a slot worker. With ``post_here`` the caller's thread sends the
        POST itself when the worker's kept connection is open and the request is small
        (POST_HERE_BYTES), and the worker only waits for the answer: the job reaches the
        backend without waiting for a thread to wake. Connecting, and sending a larger
        request, stay on the worker's thread."""
        with self._lock:
            worker = self._idle.pop() if self._idle else _Worker(self)
        worker.give(run, port, on_done, post_here)

    def _rest(self, worker: _Worker) -> None:
        with self._lock:
            self._idle.append(worker)


class _Worker:
    def __init__(self, slots: Slots) -> None:
        self.slots = slots
        self.link = BackendLink()
        self.jobs: queue.SimpleQueue[tuple[JobRun, Callable[[], None], Step]] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="slot", daemon=True).start()

    def give(self, run: JobRun, port: int, on_done: Callable[[], None], post_here: bool) -> None:
        """Called while the worker is idle: its link is the caller's until the job is queued.
        Whatever happens to a POST sent here, the job is queued: its worker reports it."""
        self.link.port = port
        step: Step = functools.partial(run._call, self.link)
        if post_here:
            try:
                step = self._post_here(run)
            except Exception as exc:  # the job fails; nothing was sent twice
                step = functools.partial(_same, run._lost(self.link, exc))
        self.jobs.put((run, functools.partial(self._done, on_done), step))

    def _post_here(self, run: JobRun) -> Step:
        """Send ``run``'s POST from this thread if the kept connection is open and the
        request small: what the worker is left to do."""
        timeout = run.timeout()
        conn = self.link.kept(_shorter(timeout, POST_HERE_SECONDS))
        if conn is None:
            return functools.partial(run._call, self.link)
        request = run.request()
        if len(request[0]) > POST_HERE_BYTES:
            return functools.partial(run._call, self.link, request)
        failed = run.post(self.link, request, conn)
        stuck = failed is not None and failed.error is not None and failed.error.code == "timeout"
        if stuck and (timeout is None or timeout > POST_HERE_SECONDS):
            failed = _failed(
                "backend_unreachable",
                f"POST {run.path}: the backend took no request in {POST_HERE_SECONDS:g} s",
            )
        if failed is not None or run._conn is None:  # failed, or stopped before it was sent
            return functools.partial(_same, failed)
        if conn.sock is not None:
            conn.sock.settimeout(timeout)  # the answer may take up to the job's deadline
        return functools.partial(run._answer, self.link)

    def _serve(self) -> None:
        while True:
            run, on_done, step = self.jobs.get()
            run._run(self.link, on_done, step)

    def _done(self, on_done: Callable[[], None]) -> None:
        """Idle again before the agent hears of it: the job its next poll brings finds this
        worker (queued behind the rest of this call if need be), not a new thread."""
        self.slots._rest(self)
        on_done()


def _same(value: ResultRequest | None) -> ResultRequest | None:
    return value


def _shorter(timeout: float | None, bound: float) -> float:
    return bound if timeout is None else min(timeout, bound)


def _decode(data: bytes) -> Any:
    if not data:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return data.decode(errors="replace")


def _depth(value: Any) -> int:
    """How deep ``value`` nests objects and arrays (without recursion: the answer is foreign)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, level = todo.pop()
        children = (
            item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        )
        for child in children:
            if isinstance(child, dict | list):
                todo.append((child, level + 1))
        if isinstance(item, dict | list):
            deepest = max(deepest, level)
    return deepest


def _failed(code: ErrorCode, reason: str, status: int | None = None) -> ResultRequest:
    return ResultRequest(status="failed", error=ErrorInfo(code=code, reason=reason, status=status))
