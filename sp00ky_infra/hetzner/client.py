"""A small Hetzner Cloud API client: everything goes through one ``request()`` seam.

Errors are HcloudError with the API's own code and HTTP status (``errors.py``); listings and
records come back typed (``domain.py``). Waiting is two injected functions, ``wait`` (how long
before retry n) and ``sleep``, and ``clock`` reads the time, so tests never sleep for real.

What is retried, and why (the API reference, https://docs.hetzner.cloud/reference/cloud, and
the official clients: hetznercloud/hcloud-python ``hcloud/_client.py`` retries
rate_limit_exceeded, conflict, bad_gateway, timeout and read timeouts with a capped
exponential backoff; hetznercloud/hcloud-go ``hcloud/client_handler_retry.go`` likewise):

- 429 ``rate_limit_exceeded``, any method: the API refused before doing anything. The wait is
  Retry-After when an answer carries it (the reference does not say the API sends it), else
  until ``RateLimit-Reset``, a unix timestamp (reference, "Rate Limiting"; hcloud-go parses it
  with ``time.Unix``). Reset is when the budget is *full* again and it refills gradually (at
  3600/h one request a second), so the wait is capped at ``rate_limit_wait_cap``: after a
  429 Reset is about an hour away, while a few seconds already buy requests back.
- 5xx and no answer at all (connection error, client-side timeout): retried for GET, PUT and
  DELETE, which are idempotent. Never for POST: a POST that times out or gets a 5xx may have
  taken effect, and ``POST /servers`` and ``POST /firewalls`` are not idempotent, so
  ``create_server`` and ``create_firewall`` look the resource up by name (``GET
  /servers?name=``, ``GET /firewalls?name=``) before they try again, and never create it
  twice (names are unique per project, so a late first attempt makes a second one fail
  with ``uniqueness_error``, which is then answered by the lookup too).
- ``locked`` (423) and ``conflict`` (409) on a delete: tried again ``busy_tries`` times with
  the backoff (a server is locked while an action such as its creation runs). One try by
  default, as before; the Pulumi providers ask for more. A firewall delete also waits out
  ``resource_in_use``: the firewall is still applied to a server, for example one whose
  deletion is still running (hetznercloud/terraform-provider-hcloud
  ``internal/firewall/resource.go`` retries it the same way).

Every request sent, answered or not, is counted twice: on the client (``sent``, by
``budget.pattern``: ``GET /servers/{id}``) and on the process's ``budget.Budget`` (by
``caller`` and method, with the RateLimit its answer carried), which /metrics exports and
whose reserve the controller respects.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, Final, Protocol, TypeVar

import requests

from sp00ky_infra.hetzner.budget import LEDGER, Budget, pattern
from sp00ky_infra.hetzner.domain import (
    Action,
    Firewall,
    Image,
    Pricing,
    RateLimit,
    Server,
    header_number,
    server_type_from_json,
)
from sp00ky_infra.hetzner.errors import (
    BUSY,
    INVALID_RESPONSE,
    NOT_FOUND,
    UNAUTHORIZED,
    UNIQUENESS_ERROR,
    UNREACHABLE,
    HcloudError,
)
from sp00ky_infra.policy.server_types import ServerType

DEFAULT_ENDPOINT = "https://api.hetzner.cloud/v1"  # HCLOUD_ENDPOINT, as the Terraform provider
MAX_TRIES = 5
PER_PAGE = 50  # the API's maximum page size (reference, "Pagination")
TIMEOUT_SECONDS = 30.0
# The longest wait for a 429: RateLimit-Reset is when the budget is full again, about an hour
# after it ran out, while it refills at limit/3600 requests a second.
RATE_LIMIT_WAIT_CAP_SECONDS = 60.0
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE"})
# DELETE /firewalls/{id}'s own code (reference, "Delete a Firewall": "Firewall must not be in
# use to be deleted"; hcloud-go ``hcloud/error.go`` ErrorCodeResourceInUse), answered 422
# "firewall with ID 1103544 is still in use" (ansible-collections/hetzner.hcloud#380). Kept
# here, next to its only use; the other codes live in errors.py.
RESOURCE_IN_USE: Final = "resource_in_use"


class _Labelled(Protocol):
    @property
    def labels(self) -> Mapping[str, str]: ...


Made = TypeVar("Made", bound=_Labelled)


def backoff(attempt: int, retry_after: float | None = None) -> float:
    """Seconds before retry ``attempt`` (1-based): ``retry_after`` when the answer said how
    long, else exponential from 1 s with jitter, capped at 30 s."""
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
        timeout: float = TIMEOUT_SECONDS,
        clock: Callable[[], float] = time.time,
        busy_tries: int = 1,
        rate_limit_wait_cap: float = RATE_LIMIT_WAIT_CAP_SECONDS,
        caller: str = "other",
        budget: Budget = LEDGER,
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
        self.clock = clock
        self.busy_tries = busy_tries
        self.rate_limit_wait_cap = rate_limit_wait_cap
        self.rate_limit: RateLimit | None = None  # as of the last answer
        self.caller = caller  # who spends: the budget counts each caller's requests
        self.budget = budget
        self.sent: Counter[str] = Counter()  # requests sent, by ``pattern``

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
        """One API call, retried as the module docstring says; an HcloudError otherwise."""
        retry_unknown = method.upper() in IDEMPOTENT
        for attempt in range(1, self.max_tries + 1):
            last = attempt == self.max_tries
            self.sent[pattern(method, path)] += 1
            try:
                answer = self.session.request(
                    method, f"{self.endpoint}{path}", timeout=self.timeout, **kwargs
                )
            except requests.RequestException as exc:
                self.budget.spent(self.caller, method, None)
                if last or not retry_unknown:
                    raise HcloudError(UNREACHABLE, f"{method} {path}: {exc}") from exc
                self.sleep(self.wait(attempt, None))
                continue
            told = RateLimit.from_headers(answer.headers)
            self.rate_limit = told or self.rate_limit
            self.budget.spent(self.caller, method, told)
            if answer.status_code == 429 and not last:
                self.sleep(self.wait(attempt, self._rate_limit_delay(answer.headers)))
                continue
            if answer.status_code >= 500 and retry_unknown and not last:
                self.sleep(self.wait(attempt, header_number(answer.headers.get("Retry-After"))))
                continue
            return _read(answer, method, path)
        raise AssertionError("unreachable")  # pragma: no cover

    def _rate_limit_delay(self, headers: Mapping[str, str]) -> float | None:
        """Seconds to wait after a 429: Retry-After if given, else until RateLimit-Reset
        (capped); None (the backoff decides) when neither says anything usable."""
        retry_after = header_number(headers.get("Retry-After"))
        if retry_after is not None:
            return retry_after
        reset = header_number(headers.get("RateLimit-Reset"))
        if reset is None or reset <= self.clock():
            return None
        return min(reset - self.clock(), self.rate_limit_wait_cap)

    def paginate(self, path: str, key: str, **params: Any) -> Iterator[dict[str, Any]]:
        """Every item of a listing, page by page."""
        page: int | None = 1
        while page:
            body = self.request("GET", path, params={**params, "page": page, "per_page": PER_PAGE})
            yield from body.get(key, [])
            pagination = (body.get("meta") or {}).get("pagination") or {}
            page = pagination.get("next_page")

    def _create_once(
        self,
        path: str,
        key: str,
        body: Mapping[str, Any],
        parse: Callable[[Mapping[str, Any]], Made],
        named: Callable[[str], Made | None],
    ) -> Made:
        """POST ``body`` to ``path`` at most once in effect: after an answer that leaves the
        outcome unknown (no answer, a timeout, a 5xx) the resource is looked up by name
        first (``named``), and only created again when it is not there."""
        uncertain = False
        for attempt in range(1, self.max_tries + 1):
            try:
                return parse(self.request("POST", path, json=body)[key])
            except HcloudError as exc:
                if not (exc.outcome_unknown or (uncertain and exc.code == UNIQUENESS_ERROR)):
                    raise
                found = named(body["name"])
                if found is not None and _carries(found, body.get("labels") or {}):
                    return found
                if exc.code == UNIQUENESS_ERROR or attempt == self.max_tries:
                    raise
                uncertain = True
                self.sleep(self.wait(attempt, None))
        raise AssertionError("unreachable")  # pragma: no cover

    # --- servers -------------------------------------------------------------------------------

    def create_server(self, **body: Any) -> Server:
        """Create a server, at most once (``_create_once``)."""
        return self._create_once("/servers", "server", body, Server.from_json, self.server_named)

    def server_named(self, name: str) -> Server | None:
        found = self.request("GET", "/servers", params={"name": name}).get("servers") or []
        return Server.from_json(found[0]) if found else None

    def update_server_labels(self, server_id: int | str, labels: Mapping[str, str]) -> Server:
        """Replace a server's labels (PUT /servers/{id}; the API replaces the whole set)."""
        body = self.request("PUT", f"/servers/{server_id}", json={"labels": dict(labels)})
        return Server.from_json(body["server"])

    def delete_server(self, server_id: int | str) -> bool:
        """Delete a server; False when it was already gone."""
        return self._delete(f"/servers/{server_id}")

    def servers(self, label_selector: str | None = None) -> list[Server]:
        params = {"label_selector": label_selector} if label_selector else {}
        return [Server.from_json(each) for each in self.paginate("/servers", "servers", **params)]

    def get_server(self, server_id: int | str) -> Server:
        return Server.from_json(self.request("GET", f"/servers/{server_id}")["server"])

    # --- images and actions --------------------------------------------------------------------

    def create_image(
        self, server_id: int | str, description: str, labels: Mapping[str, str]
    ) -> tuple[Image, Action]:
        """Take a snapshot of a server's disk (POST /servers/{id}/actions/create_image, type
        ``snapshot``; hcloud-go ``schema.ServerActionCreateImageRequest``). It answers 201
        ``{"image": {...}, "action": {...}}``: the image ``creating`` until the action is done.
        Not retried on an unknown outcome: a snapshot has no name to look it up by, and the
        caller lists its recipe's snapshots before it makes one."""
        body = {"type": "snapshot", "description": description, "labels": dict(labels)}
        answer = self.request("POST", f"/servers/{server_id}/actions/create_image", json=body)
        return Image.from_json(answer["image"]), Action.from_json(answer["action"])

    def images(self, label_selector: str | None = None, type: str | None = None) -> list[Image]:
        """GET /images, every page, newest first (``sort=created:desc``), narrowed by a label
        selector and a type (``system``, ``snapshot``, ``backup``, ``app``)."""
        params = {"sort": "created:desc"}
        params |= {"label_selector": label_selector} if label_selector else {}
        params |= {"type": type} if type else {}
        return [Image.from_json(each) for each in self.paginate("/images", "images", **params)]

    def delete_image(self, image_id: int | str) -> bool:
        """Delete an image (DELETE /images/{id}, 204 No Content); False when it was gone."""
        return self._delete(f"/images/{image_id}")

    def get_action(self, action_id: int | str) -> Action:
        return Action.from_json(self.request("GET", f"/actions/{action_id}")["action"])

    def wait_action(self, action: Action, timeout: float, every: float = 2.0) -> Action:
        """Poll the action until it is no longer ``running``; an HcloudError ``action_failed``
        when it ends in ``error``, ``timeout`` when ``timeout`` seconds pass first."""
        deadline = self.clock() + timeout
        while action.status == "running":
            if self.clock() > deadline:
                raise HcloudError("timeout", f"action {action.id} ({action.command}) still runs")
            self.sleep(every)
            action = self.get_action(action.id)
        if action.status == "error":
            raise HcloudError("action_failed", f"{action.command}: {action.error}")
        return action

    # --- firewalls -----------------------------------------------------------------------------

    def pricing(self) -> Pricing:
        """GET /pricing: every server type's price per location and the primary IPv4's, dated
        today (UTC) by ``clock``."""
        return Pricing.from_json(self.request("GET", "/pricing")["pricing"], self._today())

    def server_types(self) -> list[ServerType]:
        """GET /server_types, every page: each type's specs, locations and prices, dated today."""
        today = self._today()
        return [
            server_type_from_json(t, today) for t in self.paginate("/server_types", "server_types")
        ]

    def _today(self) -> str:
        return datetime.fromtimestamp(self.clock(), UTC).strftime("%Y-%m-%d")

    def firewalls(self, label_selector: str | None = None) -> list[Firewall]:
        params = {"label_selector": label_selector} if label_selector else {}
        return [
            Firewall.from_json(each) for each in self.paginate("/firewalls", "firewalls", **params)
        ]

    def create_firewall(self, name: str, labels: Mapping[str, str]) -> Firewall:
        """Create a firewall with no rules at all, at most once (``_create_once``). With no
        rules Hetzner drops every inbound packet and lets all outbound traffic go (reference,
        "Firewalls": no ``in`` rule means DROP, no ``out`` rule means ACCEPT). POST /firewalls
        answers 201 ``{"firewall": {...}, "actions": [...]}``; the actions only apply the
        firewall to the ``apply_to`` resources, of which there are none here."""
        body = {"name": name, "labels": dict(labels), "rules": []}
        return self._create_once(
            "/firewalls", "firewall", body, Firewall.from_json, self.firewall_named
        )

    def firewall_named(self, name: str) -> Firewall | None:
        found = self.request("GET", "/firewalls", params={"name": name}).get("firewalls") or []
        return Firewall.from_json(found[0]) if found else None

    def get_firewall(self, firewall_id: int | str) -> Firewall:
        return Firewall.from_json(self.request("GET", f"/firewalls/{firewall_id}")["firewall"])

    def update_firewall(
        self,
        firewall_id: int | str,
        *,
        name: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> Firewall:
        """Rename a firewall or replace its labels (PUT /firewalls/{id}; the API replaces the
        whole set of labels). Its rules and what it is applied to stay as they are."""
        body: dict[str, Any] = {}
        if name is not None:
            body["name"] = name
        if labels is not None:
            body["labels"] = dict(labels)
        answer = self.request("PUT", f"/firewalls/{firewall_id}", json=body)
        return Firewall.from_json(answer["firewall"])

    def delete_firewall(self, firewall_id: int | str) -> bool:
        """Delete a firewall; False when it was already gone. ``resource_in_use`` (still
        applied to a server) is waited out like ``locked``, ``busy_tries`` times."""
        return self._delete(f"/firewalls/{firewall_id}", BUSY | {RESOURCE_IN_USE})

    def _delete(self, path: str, busy: frozenset[str] = BUSY) -> bool:
        for attempt in range(1, self.busy_tries + 1):
            try:
                self.request("DELETE", path)
            except HcloudError as exc:
                if exc.code == NOT_FOUND:
                    return False
                if exc.code in busy and attempt < self.busy_tries:
                    self.sleep(self.wait(attempt, None))
                    continue
                raise
            return True
        raise AssertionError("unreachable")  # pragma: no cover


def _carries(found: _Labelled, labels: Mapping[str, str]) -> bool:
    """``found`` is what an earlier attempt made: it carries every label asked for."""
    return all(found.labels.get(k) == v for k, v in labels.items())


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
