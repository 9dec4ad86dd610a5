"""The example pool backend: an ordinary HTTP backend that answers a POST per job.

    GET  /health   200 once the backend can take work
    POST /render   {"gameId": str, "format"?: "mp4"|"gif"|"webm", "seconds"?: float,
                    "fail"?: bool}
                   sleeps `seconds` (default $RENDER_SECONDS or 0.05),
                   answers {"url", "pid", "calls"}

Standard library only, so it runs as a plain process (deploy.command) as well as in its image.
Settings: PORT (default 8080), HOST (default 127.0.0.1; the image sets 0.0.0.0), RENDER_SECONDS,
BACKEND_LOG (a file that gets one JSON line per job start and end, with the attempt id the agent
sends in X-Sp00ky-Attempt, for tests that prove no two attempts overlapped).

A killed job's request is dropped by the agent: it closes the connection. Between steps of its
work the backend looks whether the client is gone, and if so stops and answers nothing (its log
says "closed"): a backend that wants to stop a killed job's work early does the same.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FORMATS = ("mp4", "gif", "webm")
STEP_SECONDS = 0.05  # how often a job's work looks whether its client is still there
_calls = 0
_lock = threading.Lock()
_in_flight: dict[int, str] = {}  # thread -> attempt, for the log of a stop


def _log(event: str, **fields: Any) -> None:
    path = os.environ.get("BACKEND_LOG")
    if not path:
        return
    line = json.dumps({"event": event, "pid": os.getpid(), "t": time.time(), **fields})
    try:
        with _lock, open(path, "a", encoding="utf-8") as out:
            out.write(line + "\n")
    except OSError as exc:  # the log is optional: a backend does not die for it
        print(f"backend: cannot write BACKEND_LOG {path}: {exc}", file=sys.stderr, flush=True)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # http.server writes headers and body separately; without this every keep-alive
    # answer's body waits out the client's delayed-ACK timer.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        sys.stdout.write(f"backend: {self.address_string()} {format % args}\n")
        sys.stdout.flush()

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._answer(200, {"ok": True, "pid": os.getpid()})
        else:
            self._answer(404, {"error": f"no route GET {self.path}"})

    def _work(self, seconds: float) -> float:
        """Work ``seconds`` in steps, stopping early once the client has closed the connection
        (the agent closes it when the job is killed): the seconds of work left then, or 0."""
        ends = time.monotonic() + max(seconds, 0.0)
        while (left := ends - time.monotonic()) > 0:
            if _client_gone(self.connection):
                return left
            time.sleep(min(left, STEP_SECONDS))
        return 0.0

    def do_POST(self) -> None:
        global _calls
        length = int(self.headers.get("Content-Length") or 0)
        try:
            payload = json.loads(self.rfile.read(length) or b"{}")
        except json.JSONDecodeError as exc:
            self._answer(400, {"error": f"body is not JSON: {exc}"})
            return
        if self.path != "/render":
            self._answer(404, {"error": f"no route POST {self.path}"})
            return
        if not isinstance(payload, dict) or not isinstance(payload.get("gameId"), str):
            self._answer(422, {"error": "gameId (string) is required"})
            return
        fmt = payload.get("format", "mp4")
        if fmt not in FORMATS:
            self._answer(422, {"error": f"format must be one of {', '.join(FORMATS)}"})
            return
        with _lock:
            _calls += 1
            calls = _calls
        attempt = self.headers.get("X-Sp00ky-Attempt", "")
        seconds = float(payload.get("seconds", os.environ.get("RENDER_SECONDS", "0.05")))
        _log("start", attempt=attempt, gameId=payload["gameId"])
        _in_flight[threading.get_ident()] = attempt
        try:
            left = self._work(seconds)
        finally:
            _in_flight.pop(threading.get_ident(), None)
        if left:  # the job was killed (or given up): nobody waits for the answer
            _log("closed", attempt=attempt, gameId=payload["gameId"], left=round(left, 3))
            self.close_connection = True
            return
        _log("end", attempt=attempt, gameId=payload["gameId"])
        if payload.get("fail"):
            self._answer(500, {"error": "render failed (asked to by the payload)"})
            return
        url = f"https://renders.example.invalid/{payload['gameId']}.{fmt}"
        self._answer(200, {"url": url, "pid": os.getpid(), "calls": calls})


def _client_gone(sock: socket.socket) -> bool:
    """Whether the client closed the connection: readable with nothing to read (EOF) or reset.
    A client waiting for its answer sends nothing more, so a readable socket means it left."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


def main() -> None:
    host = os.environ.get("HOST", "127.0.0.1")
    port = int(os.environ.get("PORT", "8080"))
    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True

    def stop(*_: Any) -> None:
        # Jobs in flight die with the process: say so, so a test can tell when their work ended.
        # Logged from a thread: the signal may land while this thread holds the log's lock.
        attempts = sorted(_in_flight.values())

        def log_and_shut_down() -> None:
            _log("stop", attempts=attempts)
            server.shutdown()

        threading.Thread(target=log_and_shut_down).start()

    signal.signal(signal.SIGTERM, stop)
    print(f"backend: listening on {host}:{server.server_port} pid={os.getpid()}", flush=True)
    _log("boot")
    try:
        server.serve_forever(poll_interval=0.1)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        print("backend: stopped", flush=True)


if __name__ == "__main__":
    main()
