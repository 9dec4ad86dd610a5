"""A small Hetzner Cloud API client: everything goes through one ``request()`` seam.

Errors are HcloudError with the API's own code and HTTP status (``errors.py``). 429 (honouring
Retry-After) and 5xx answers are retried with backoff; the timing is an injected function, so
tests run without sleeping for real. Listings come back as typed records (``domain.py``).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import requests

from sp00ky_infra.hetzner.domain import Firewall, Server
from sp00ky_infra.hetzner.errors import (
    INVALID_RESPONSE,
    NOT_FOUND,
    UNAUTHORIZED,
    UNREACHABLE,
    HcloudError,
)

DEFAULT_ENDPOINT = "https://api.hetzner.cloud/v1"  # HCLOUD_ENDPOINT, as the Terraform provider
MAX_TRIES = 5
PER_PAGE = 50


def backoff(attempt: int, retry_after: float | None = None) -> float:
    """Seconds before retry ``attempt`` (1-based): Retry-After when the API gave it, else
    exponential from 1 s with jitter, capped at 30 s."""
    if retry_after is not None:
        return retry_after
    return min(30.0, 2.0 ** (attempt - 1)) * random.uniform(0.75, 1.0)


class HetznerAPI:
    def __init__(
        self,
        token: str,
        endpoint: str = DEFAULT_ENDPOINT,
        session: requests.Session | None = None,
        wait: Callable[[int, float | None], float] = backoff,
        sleep: Callable[[float], None] = time.sleep,
        max_tries: int = MAX_TRIES,
        timeout: float = 30.0,
    ) -> None:
        if not token:
            raise HcloudError(UNAUTHORIZED, "HCLOUD_TOKEN is not set; create an API token")
        self.endpoint = endpoint.rstrip("/")
        self.session = session or requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"
        self.wait = wait
        self.sleep = sleep
        self.max_tries = max_tries
        self.timeout = timeout

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **kwargs: Any) -> HetznerAPI:
        """Token and endpoint from HCLOUD_TOKEN and HCLOUD_ENDPOINT, read when called."""
        env = os.environ if env is None else env
        return cls(
            env.get("HCLOUD_TOKEN", ""),
            env.get("HCLOUD_ENDPOINT") or DEFAULT_ENDPOINT,
            **kwargs,
        )

    def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        """One API call; retried on 429 and 5xx, otherwise an HcloudError on any error."""
        for attempt in range(1, self.max_tries + 1):
            try:
                answer = self.session.request(
                    method, f"{self.endpoint}{path}", timeout=self.timeout, **kwargs
                )
            except requests.RequestException as exc:
                if attempt == self.max_tries:
                    raise HcloudError(UNREACHABLE, f"{method} {path}: {exc}") from exc
                self.sleep(self.wait(attempt, None))
                continue
            retryable = answer.status_code == 429 or answer.status_code >= 500
            if retryable and attempt < self.max_tries:
                retry_after = answer.headers.get("Retry-After")
                self.sleep(self.wait(attempt, float(retry_after) if retry_after else None))
                continue
            return _read(answer, method, path)
        raise AssertionError("unreachable")  # pragma: no cover

    def paginate(self, path: str, key: str, **params: Any) -> Iterator[dict[str, Any]]:
        """Every item of a listing, page by page."""
        page: int | None = 1
        while page:
            body = self.request("GET", path, params={**params, "page": page, "per_page": PER_PAGE})
            yield from body.get(key, [])
            pagination = (body.get("meta") or {}).get("pagination") or {}
            page = pagination.get("next_page")

    # --- servers -------------------------------------------------------------------------------

    def create_server(self, **body: Any) -> Server:
        return Server.from_json(self.request("POST", "/servers", json=body)["server"])

    def delete_server(self, server_id: int | str) -> bool:
        """Delete a server; False when it was already gone."""
        return self._delete(f"/servers/{server_id}")

    def servers(self, label_selector: str | None = None) -> list[Server]:
        params = {"label_selector": label_selector} if label_selector else {}
        return [Server.from_json(each) for each in self.paginate("/servers", "servers", **params)]

    def get_server(self, server_id: int | str) -> Server:
        return Server.from_json(self.request("GET", f"/servers/{server_id}")["server"])

    # --- firewalls -----------------------------------------------------------------------------

    def firewalls(self, label_selector: str | None = None) -> list[Firewall]:
        params = {"label_selector": label_selector} if label_selector else {}
        return [
            Firewall.from_json(each) for each in self.paginate("/firewalls", "firewalls", **params)
        ]

    def delete_firewall(self, firewall_id: int | str) -> bool:
        """Delete a firewall; False when it was already gone."""
        return self._delete(f"/firewalls/{firewall_id}")

    def _delete(self, path: str) -> bool:
        try:
            self.request("DELETE", path)
        except HcloudError as exc:
            if exc.code == NOT_FOUND:
                return False
            raise
        return True


def _read(answer: requests.Response, method: str, path: str) -> dict[str, Any]:
    if answer.status_code < 400 and (answer.status_code == 204 or not answer.content):
        return {}
    try:
        body: dict[str, Any] = answer.json()
    except ValueError as exc:
        raise HcloudError(
            INVALID_RESPONSE,
            f"{method} {path}: HTTP {answer.status_code}, not JSON",
            answer.status_code,
        ) from exc
    if answer.status_code >= 400:
        error = body.get("error") or {}
        raise HcloudError(
            error.get("code", "unknown_error"),
            error.get("message", f"{method} {path} failed"),
            answer.status_code,
        )
    return body
