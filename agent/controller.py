"""The agent's connection to the controller: it only ever dials out, and speaks the typed
messages of ``agent.protocol``."""

from __future__ import annotations

import random
import socket
from typing import Any

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
    """Keep-alive connections (one per thread that talks to the controller) with Nagle's
    algorithm off: a request's headers and body leave at once, not after a delayed ACK."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs["socket_options"] = [
            (socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),
            (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
        ]
        super().init_poolmanager(*args, **kwargs)


class Controller:
    def __init__(self, url: str, machine: str) -> None:
        self.url = url.rstrip("/")
        self.machine = machine
        self.session_token: str | None = None
        self.http = requests.Session()
        for scheme in ("http://", "https://"):
            self.http.mount(scheme, _NoDelay(pool_connections=1, pool_maxsize=2))

    def _post(self, path: str, body: dict[str, Any], timeout: float = HTTP_SLACK_SECONDS) -> Any:
        headers = {}
        if self.session_token:
            headers["Authorization"] = f"Bearer {self.session_token}"
        try:
            answer = self.http.post(
                f"{self.url}{path}", json=body, headers=headers, timeout=timeout
            )
        except requests.RequestException as exc:
            raise ControllerError(f"cannot reach the controller: {exc}") from exc
        if answer.status_code == 410:
            raise Gone(_error(answer), 410)
        if answer.status_code in (401, 403, 404, 409, 422):
            raise Refused(_error(answer), answer.status_code)
        if answer.status_code >= 400:
            raise ControllerError(_error(answer), answer.status_code)
        try:
            return answer.json()
        except ValueError as exc:
            raise ProtocolError(f"POST {path}: the answer is not JSON ({exc})") from exc

    def join(self, token: str) -> JoinReply:
        body = JoinRequest(machine=self.machine, token=token)
        reply = JoinReply.from_json(self._post("/v1/join", body.to_json()))
        self.session_token = reply.session
        return reply

    def rejoin(self, credential: str) -> JoinReply:
        """After a reboot or a restart: the machine credential of the first join for a new
        session."""
        body = RejoinRequest(credential=credential)
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
        headers = {"Authorization": f"Bearer {self.session_token}"}
        url = f"{self.url}/v1/machines/{self.machine}/images/{image_id}"
        try:
            answer = self.http.get(
                url, headers=headers, stream=True, timeout=(HTTP_SLACK_SECONDS, read_timeout)
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
    try:
        data = answer.json()
    except ValueError:
        return f"{answer.status_code}: {answer.text[:200]}"
    try:
        return f"{answer.status_code}: {Problem.from_json(data).error or answer.text}"
    except ProtocolError:  # JSON but no Problem: a validation error's detail, say
        return f"{answer.status_code}: {answer.text}"


def backoff(attempt: int, base: float = 0.2, cap: float = 10.0) -> float:
    """Seconds before retry ``attempt`` (0-based): exponential, capped, with full jitter."""
    return random.uniform(0.5, 1.0) * min(cap, base * 2.0**attempt)
