"""The agent's connection to the controller: it only ever dials out, and speaks the typed
messages of ``agent.protocol``.

The JSON calls go over one keep-alive HTTP/1.1 connection of the standard library per
Controller (each thread that talks to the controller has its own Controller), with Nagle's
algorithm off: a poll costs a write and a read, not a request library's machinery. The
image stream, large and rare, goes through requests.
"""

from __future__ import annotations

import http.client
import json
import random
import socket
import ssl
from typing import Any
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter

from agent.errors import ControllerError, Gone, ProtocolError, Refused
from agent.protocol import (
    Ack,
    JoinReply,
    JoinRequest,
    PollReply,
    PollRequest,
    Problem,
    ReadyRequest,
    RejoinRequest,
    ResultReply,
    ResultRequest,
)

HTTP_SLACK_SECONDS = 10.0  # beyond a long-poll's wait, before a request counts as lost


class _NoDelay(HTTPAdapter):
    """For the image stream: Nagle's algorithm off, TCP keep-alive on."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs["socket_options"] = [
            (socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),
            (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
        ]
        super().init_poolmanager(*args, **kwargs)


# The server closed a kept-alive connection while it was idle: the request never reached it.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


class Link:
    """One keep-alive connection to the controller, opened on first use and again after any
    error; not shared between threads."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.https = parts.scheme == "https"
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if self.https else 80)
        self.prefix = parts.path.rstrip("/")
        self.conn: http.client.HTTPConnection | None = None

    def _open(self, timeout: float) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection
        if self.https:
            context = ssl.create_default_context()
            conn = http.client.HTTPSConnection(
                self.host, self.port, timeout=timeout, context=context
            )
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        conn.connect()
        assert conn.sock is not None
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        return conn

    def post(
        self, path: str, data: bytes, headers: dict[str, str], timeout: float
    ) -> tuple[int, bytes]:
        """(status, body); OSError or HTTPException when there is no answer in ``timeout``."""
        for _ in range(2):
            fresh = self.conn is None
            conn = self.conn = self.conn or self._open(timeout)
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            try:
                conn.request("POST", self.prefix + path, body=data, headers=headers)
                answer = conn.getresponse()
                body = answer.read()
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                if not fresh and isinstance(exc, _STALE):
                    continue  # an idle connection the server had closed: once more, anew
                raise
            if answer.will_close:
                self.close()
            return answer.status, body
        raise ConnectionError("the controller closed the connection twice")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class Controller:
    def __init__(self, url: str, machine: str) -> None:
        self.url = url.rstrip("/")
        self.machine = machine
        self.session_token: str | None = None
        self.link = Link(self.url)
        self.http = requests.Session()  # the image stream and the agent archive only
        for scheme in ("http://", "https://"):
            self.http.mount(scheme, _NoDelay(pool_connections=1, pool_maxsize=1))

    def _post(self, path: str, body: dict[str, Any], timeout: float = HTTP_SLACK_SECONDS) -> Any:
        headers = {"Content-Type": "application/json"}
        if self.session_token:
            headers["Authorization"] = f"Bearer {self.session_token}"
        data = json.dumps(body, separators=(",", ":")).encode()
        try:
            status, raw = self.link.post(path, data, headers, timeout)
        except (OSError, http.client.HTTPException) as exc:
            reason = str(exc) or type(exc).__name__
            raise ControllerError(f"cannot reach the controller: {reason}") from exc
        if status == 410:
            raise Gone(_problem(status, raw), 410)
        if status in (401, 403, 404, 409, 422):
            raise Refused(_problem(status, raw), status)
        if status >= 400:
            raise ControllerError(_problem(status, raw), status)
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise ProtocolError(f"POST {path}: the answer is not JSON ({exc})") from exc

    def join(self, token: str, agent: str | None = None) -> JoinReply:
        """``agent``: the sha256 of the agent archive this agent runs, when it knows."""
        body = JoinRequest(machine=self.machine, token=token, agent=agent)
        reply = JoinReply.from_json(self._post("/v1/join", body.to_json()))
        self.session_token = reply.session
        return reply

    def rejoin(self, credential: str, agent: str | None = None) -> JoinReply:
        """After a reboot or a restart: the machine credential of the first join for a new
        session."""
        body = RejoinRequest(credential=credential, agent=agent)
        path = f"/v1/machines/{self.machine}/rejoin"
        reply = JoinReply.from_json(self._post(path, body.to_json()))
        self.session_token = reply.session
        return reply

    def ready(self, ok: bool, reason: str | None = None) -> Ack:
        body = ReadyRequest(ok=ok, reason=reason)
        return Ack.from_json(self._post(f"/v1/machines/{self.machine}/ready", body.to_json()))

    def poll(self, body: PollRequest, timeout: float | None = None) -> PollReply:
        """``timeout``: the caller's bound (the time left before a lease is given up); at
        most the wait plus HTTP_SLACK_SECONDS."""
        path, longest = f"/v1/machines/{self.machine}/poll", body.wait + HTTP_SLACK_SECONDS
        bound = longest if timeout is None else min(timeout, longest)
        return PollReply.from_json(self._post(path, body.to_json(), timeout=bound))

    def result(
        self, job: str, attempt: str, body: ResultRequest, timeout: float = HTTP_SLACK_SECONDS
    ) -> ResultReply:
        path = f"/v1/machines/{self.machine}/jobs/{job}/attempts/{attempt}/result"
        return ResultReply.from_json(self._post(path, body.to_json(), timeout=timeout))

    def image(self, image_id: str, read_timeout: float = 60.0) -> requests.Response:
        """The controller's stream of a served image (a ``docker save`` tar), still unread:
        the caller reads it chunk by chunk and closes it."""
        return self._get(f"images/{image_id}", read_timeout, stream=True)

    def agent_archive(self, read_timeout: float) -> bytes:
        """The agent archive the controller serves (tar.bz2, tens of KiB), fetched with the
        session, for an upgrade to check and unpack."""
        try:
            return self._get("agent", read_timeout, stream=False).content
        except requests.RequestException as exc:
            raise ControllerError(f"cannot fetch the agent archive: {exc}") from exc

    def _get(self, path: str, read_timeout: float, stream: bool) -> requests.Response:
        """A GET of the machine's ``path`` with the session: the answer when 200."""
        headers = {"Authorization": f"Bearer {self.session_token}"}
        url = f"{self.url}/v1/machines/{self.machine}/{path}"
        try:
            answer = self.http.get(
                url, headers=headers, stream=stream, timeout=(HTTP_SLACK_SECONDS, read_timeout)
            )
        except requests.RequestException as exc:
            raise ControllerError(f"cannot reach the controller: {exc}") from exc
        if answer.status_code == 200:
            return answer
        if answer.status_code == 410:  # an error's body is small: read whole by _error
            raise Gone(_error(answer), 410)
        if answer.status_code in (401, 403, 404, 409):
            raise Refused(_error(answer), answer.status_code)
        raise ControllerError(_error(answer), answer.status_code)

    def drained(self) -> Ack:
        return Ack.from_json(self._post(f"/v1/machines/{self.machine}/drained", {}))


def _error(answer: requests.Response) -> str:
    """The status and the controller's Problem, or whatever else answered."""
    return _problem(answer.status_code, answer.content)


def _problem(status: int, raw: bytes) -> str:
    text = raw.decode(errors="replace")
    try:
        data = json.loads(raw)
    except ValueError:
        return f"{status}: {text[:200]}"
    try:
        return f"{status}: {Problem.from_json(data).error or text}"
    except ProtocolError:  # JSON but no Problem: a validation error's detail, say
        return f"{status}: {text}"


def backoff(attempt: int, base: float = 0.2, cap: float = 10.0) -> float:
    """Seconds before retry ``attempt`` (0-based): exponential, capped, with full jitter."""
    return random.uniform(0.5, 1.0) * min(cap, base * 2.0**attempt)
