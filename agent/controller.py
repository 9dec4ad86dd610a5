"""The agent's connection to the controller: it only ever dials out."""

from __future__ import annotations

import random
from typing import Any

import requests

HTTP_SLACK_SECONDS = 10.0  # beyond a long-poll's wait, before a request counts as lost


class ControllerError(Exception):
    """The controller could not be reached or answered with an error."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Refused(ControllerError):
    """401/409: this request will never succeed (a bad token, a stale attempt)."""


class Gone(ControllerError):
    """410: the machine is failed or destroyed; the agent must shut down."""


class Controller:
    def __init__(self, url: str, machine: str) -> None:
        self.url = url.rstrip("/")
        self.machine = machine
        self.session_token: str | None = None
        self.http = requests.Session()

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
        return answer.json()

    def join(self, token: str) -> dict[str, Any]:
        reply: dict[str, Any] = self._post("/v1/join", {"machine": self.machine, "token": token})
        self.session_token = reply["session"]
        return reply

    def ready(self, ok: bool, reason: str | None = None) -> None:
        self._post(f"/v1/machines/{self.machine}/ready", {"ok": ok, "reason": reason})

    def poll(self, running: list[dict[str, str]], free_slots: int, wait: float) -> dict[str, Any]:
        body = {"running": running, "free_slots": free_slots, "wait": wait}
        reply: dict[str, Any] = self._post(
            f"/v1/machines/{self.machine}/poll", body, timeout=wait + HTTP_SLACK_SECONDS
        )
        return reply

    def result(self, job: str, attempt: str, body: dict[str, Any]) -> dict[str, Any]:
        reply: dict[str, Any] = self._post(
            f"/v1/machines/{self.machine}/jobs/{job}/attempts/{attempt}/result", body
        )
        return reply

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
        if answer.status_code in (401, 403, 404):
            raise Refused(_error(answer), answer.status_code)
        raise ControllerError(_error(answer), answer.status_code)

    def drained(self) -> None:
        self._post(f"/v1/machines/{self.machine}/drained", {})


def _error(answer: requests.Response) -> str:
    try:
        return f"{answer.status_code}: {answer.json().get('error') or answer.text}"
    except ValueError:
        return f"{answer.status_code}: {answer.text[:200]}"


def backoff(attempt: int, base: float = 0.2, cap: float = 10.0) -> float:
    """Seconds before retry ``attempt`` (0-based): exponential, capped, with full jitter."""
    return random.uniform(0.5, 1.0) * min(cap, base * 2.0**attempt)
