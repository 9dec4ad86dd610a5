"""One job on the machine: a POST to the backend on loopback, held open until it answers or
the job's deadline, in a thread of its own so that polls (and so renewals) keep flowing."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent.protocol import ErrorCode, ErrorInfo, ResultRequest

REASON_EXCERPT = 300
# What the controller accepts of a result (its README's "Limits"; mirrored from
# sp00ky_infra.policy.jobs, a test holds them equal): an answer past them fails the attempt
# here, instead of being refused at the controller and left to wait out its lease.
MAX_RESULT_BYTES = 1024 * 1024
MAX_JSON_DEPTH = 64


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
    _conn: http.client.HTTPConnection | None = None

    def start(self, port: int, on_done: Callable[[], None]) -> None:
        threading.Thread(
            target=self._run, args=(port, on_done), name=f"job-{self.job}", daemon=True
        ).start()

    def _run(self, port: int, on_done: Callable[[], None]) -> None:
        try:
            report = self._call(port)
            if self.stopped is None:
                self.report = report
        finally:
            self.done.set()
            on_done()

    def _call(self, port: int) -> ResultRequest | None:
        timeout = None
        if self.deadline is not None:
            timeout = max(0.05, self.deadline - time.time() - self.margin)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        self._conn = conn
        if self.stopped is not None:
            return None
        body = json.dumps(self.payload).encode()
        headers = {
            "Content-Type": "application/json",
            "X-Sp00ky-Job": self.job,
            "X-Sp00ky-Attempt": self.attempt,
        }
        try:
            self.posted_at = time.monotonic()
            conn.request("POST", self.path, body=body, headers=headers)
            answer = conn.getresponse()
            data = answer.read()
        except TimeoutError:
            return _failed("timeout", "the backend did not answer by the job's deadline")
        except (OSError, http.client.HTTPException) as exc:
            return _failed("backend_unreachable", f"POST {self.path}: {exc or type(exc).__name__}")
        finally:
            conn.close()
        if 200 <= answer.status < 300:
            result = _decode(data)
            try:
                self.report_bytes = len(json.dumps(result, allow_nan=False).encode())
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
        self.stopped = reason
        conn = self._conn
        if conn is not None and conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)


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
