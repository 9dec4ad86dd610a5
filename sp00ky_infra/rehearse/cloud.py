"""A fake Hetzner Cloud API on 127.0.0.1: servers, firewalls, actions, images (the public ones,
and snapshots: create_image, DELETE /images), locations, server types and their prices (GET
/pricing), labels and label selectors, pagination, rate limiting, and the API's error answers
in their real JSON shapes (the official ``hcloud`` client accepts them). The tests' fake
cloud, and the rehearsal's: with ``boot`` (a ``boot.Booter``) each server it creates really
boots its user-data in a container (``boot.py`` says how, and why that is faithful). Where
each answer comes from is ``catalog.py``'s docstring.

Knobs: ``unavailable`` {(server_type, location)} answers ``resource_unavailable``;
``misplaced`` {(server_type, location)} answers ``placement_error``; ``offered``
{server_type: {locations}} narrows where a type is sold (the catalog's locations otherwise),
answering ``invalid_input`` "unsupported location for server type" elsewhere; ``quota`` caps
servers (``resource_limit_exceeded``); ``fail_next`` queues (status, code, retry_after)
answers for the next requests (429, 5xx, locked, ...);
``create_then_fail`` queues (status, code) answers that POST /servers or POST /firewalls gives
AFTER it made the resource, and ``create_then_stall`` seconds POST /servers waits after making
one before it answers (past a client's timeout); ``server_delete_lag`` is for how many further
requests a deleted server's delete_server action runs, its firewalls still applied to it;
``rate_limit`` and ``rate_limit_remaining`` are the budget, ``clock`` the time it refills by;
``boot`` makes servers boot; ``add_snapshot`` makes a snapshot (labels, created) that GET
/images lists and POST /servers boots by its id.

Every request it answers is in ``requests`` (method, path); ``counted()`` sums them by kind
(``GET /servers/{id}``), as a Hetzner bill of requests would.

Boot mode: POST /servers answers at once with the server ``initializing``, its address already
given (as Hetzner's is), and a ``create_server`` action ``running``; the container starts in
the background and then the server is ``running`` and the action ``success`` (or, if it could
not start, ``off`` and ``error``). A server whose machine powered itself off reads ``off``.
DELETE removes the container; ``create_image`` commits it (``Booter.commit``) and a server
created with the snapshot's id as its image boots that; the ``poweroff``, ``shutdown``,
``poweron`` and ``reboot`` actions stop or start it. Leaving the ``with`` block removes every
container, snapshot and the network.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from sp00ky_infra.config.machine_images import (
    SelectorError,
    image_kind,
    labels_matching,
    parse_selector,
)
from sp00ky_infra.hetzner.budget import pattern
from sp00ky_infra.policy.server_types import SERVER_TYPES
from sp00ky_infra.rehearse.boot import Booter
from sp00ky_infra.rehearse.catalog import (
    LOCATIONS,
    MESSAGES,
    STATUS_OF,
    TOKEN,
    UNSUPPORTED_LOCATION,
    error_body,
    image_json,
    iso,
    location_json,
    matches,
    pricing_json,
    public_images_json,
    select_images,
    server_type_json,
)

__all__ = [
    "LOCATIONS", "MESSAGES", "SERVER_TYPES", "STATUS_OF", "TOKEN", "UNSUPPORTED_LOCATION",
    "FakeHetzner", "iso", "matches",
]  # fmt: skip

# a power action's status while it runs (boot mode), and after
POWER = {
    "poweroff": ("stopping", "off"), "shutdown": ("stopping", "off"),
    "poweron": ("starting", "running"), "reboot": ("starting", "running"),
}  # fmt: skip
HOUR = 3600.0
SNAPSHOT_GB = 0.42  # a snapshot's image_size without boot mode (nothing is committed)
Answer = tuple[int, Any, dict[str, str]]


class FakeHetzner:
    def __init__(self, boot: Booter | None = None) -> None:
        self.boot = boot
        self.servers: dict[int, dict[str, Any]] = {}
        self.firewalls: dict[int, dict[str, Any]] = {}
        self.images: dict[int, dict[str, Any]] = {i["id"]: i for i in public_images_json()}
        self.actions: dict[int, dict[str, Any]] = {}
        # snapshots made by create_image, by id: GET /images lists them, POST /servers boots one
        self.snapshots: dict[int, dict[str, Any]] = {}
        self.unavailable: set[tuple[str, str]] = set()
        self.misplaced: set[tuple[str, str]] = set()
        self.offered: dict[str, set[str]] = {}
        self.quota: int | None = None
        self.fail_next: list[tuple[int, str, float | None]] = []
        self.create_then_fail: list[tuple[int, str]] = []
        self.create_then_stall: float | None = None
        self.server_delete_lag = 0
        self._deleting: dict[int, tuple[int, int]] = {}  # server id -> (requests left, action)
        self.rate_limit = 3600
        self.rate_limit_remaining = float(self.rate_limit)
        self.clock: Callable[[], float] = time.time
        self._refilled_at: float | None = None
        self.requests: list[tuple[str, str]] = []
        self.stall_now: float | None = None
        self._next_id = 1000
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHetzner:
        if self.boot is not None:
            self.boot.open()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        if self.boot is not None:
            self.boot.close()

    def counted(self) -> Counter[str]:
        """The requests answered so far, by method and path pattern (``GET /servers/{id}``)."""
        with self._lock:
            answered = list(self.requests)
        return Counter(pattern(method, path.removeprefix("/v1")) for method, path in answered)

    # --- state -----------------------------------------------------------------------------

    def _id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _action(
        self, command: str, resources: list[dict[str, Any]], running: bool = False
    ) -> dict[str, Any]:
        now = iso(datetime.now(UTC))
        action: dict[str, Any] = {
            "id": self._id(), "command": command, "status": "running" if running else "success",
            "progress": 0 if running else 100, "started": now, "finished": None if running else now,
            "resources": resources, "error": None,
        }  # fmt: skip
        self.actions[action["id"]] = action
        return action

    def _finish(self, action_id: int, error: str | None = None) -> None:
        action = self.actions[action_id]
        action.update(status="error" if error else "success", progress=100,
                      finished=iso(datetime.now(UTC)))  # fmt: skip
        if error:
            action["error"] = {"code": "action_failed", "message": error}

    def _in_background(
        self, work: Callable[[], None], action_id: int, server_id: int, status: str | None = None
    ) -> None:
        """Boot-mode work that takes seconds, outside the lock; the action says when it is
        done, and the server then has ``status``."""

        def run() -> None:
            error = None
            try:
                work()
            except Exception as exc:  # an action that failed, as the API would report it
                error = str(exc)
            with self._lock:
                self._finish(action_id, error)
                if status and not error and server_id in self.servers:
                    self.servers[server_id]["status"] = status

        threading.Thread(target=run, name=f"action-{action_id}", daemon=True).start()

    def _booted(self, server_id: int, action_id: int) -> None:
        with self._lock:
            if server_id in self.servers:
                self.servers[server_id]["status"] = "running"
            self._finish(action_id)

    def _not_booted(self, server_id: int, action_id: int, message: str) -> None:
        with self._lock:
            if server_id in self.servers:
                self.servers[server_id]["status"] = "off"
            self._finish(action_id, message)

    def _boot(self, server: dict[str, Any], action_id: int, snapshot: int | None = None) -> None:
        """Boot mode: the server gets its container's address now and boots meanwhile (from
        ``snapshot``'s committed container when it was created from one)."""
        assert self.boot is not None
        address = self.boot.allocate()
        server["status"] = "initializing"
        server["public_net"]["ipv4"]["ip"] = address
        server_id = server["id"]
        image = server["image"]
        self.boot.start(
            server_id, server["name"], server["user_data"], address,
            on_started=lambda _: self._booted(server_id, action_id),
            on_failed=lambda _, message: self._not_booted(server_id, action_id, message),
            image=image["name"] or str(image["id"]), snapshot=snapshot,
        )  # fmt: skip

    def _refresh(self, server: dict[str, Any]) -> dict[str, Any]:
        """A booted server whose container stopped (it powered itself off) is ``off``."""
        running = self.boot is not None and server["status"] == "running"
        if running and self.boot is not None and self.boot.running(server["id"]) is False:
            server["status"] = "off"
        return server

    def add_server(
        self, name: str, labels: dict[str, str], created: datetime | None = None,
        server_type: str = "cx33", location: str = "fsn1",
    ) -> dict[str, Any]:  # fmt: skip
        server_id = self._id()
        server = {
            "id": server_id, "name": name, "status": "running",
            "created": iso(created or datetime.now(UTC)),
            "public_net": {
                "ipv4": {"id": server_id, "ip": f"198.51.100.{server_id % 250}", "blocked": False,
                         "dns_ptr": f"static.{server_id}.example.invalid"},
                "ipv6": None, "floating_ips": [], "firewalls": [],
            },
            "private_net": [], "server_type": server_type_json(server_type),
            "location": location_json(location),
            "datacenter": {"id": 1, "name": f"{location}-dc1", "description": location,
                           "location": location_json(location),
                           "server_types": {"supported": [], "available": [],
                                            "available_for_migration": []}},
            "image": self._image("debian-12"),
            "iso": None, "rescue_enabled": False, "locked": False, "backup_window": None,
            "outgoing_traffic": 0, "ingoing_traffic": 0, "included_traffic": 21990232555520,
            "protection": {"delete": False, "rebuild": False}, "labels": dict(labels),
            "volumes": [], "load_balancers": [], "primary_disk_size": 80, "placement_group": None,
        }  # fmt: skip
        self.servers[server_id] = server
        return server

    def add_snapshot(
        self, labels: dict[str, str], created: datetime | None = None, description: str = "",
        image_id: int | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """A snapshot of this project's, as a server's create_image action would leave it."""
        made = iso(created or datetime.now(UTC))
        image = image_json(image_id or self._id(), "snapshot", None, description or "snapshot",
                           "debian", "12", labels, made)  # fmt: skip
        self.images[image["id"]] = image
        return image

    def stand_in(self, image: str) -> dict[str, Any]:
        """For a rehearsal: the image a pool's ``machine.image`` names, made here when this
        fake lacks it: a snapshot of that id, one that its label selector matches, or a
        system image of that name."""
        kind = image_kind(image)
        known = self._image(image) if kind != "selector" else None
        if known is not None:
            return known
        if kind == "id":
            return self.add_snapshot({}, description="stand-in", image_id=int(image))
        if kind == "selector":
            return self.add_snapshot(labels_matching(image), description="stand-in")
        made = image_json(self._id(), "system", image, image, "unknown", None, {},
                          iso(datetime.now(UTC)))  # fmt: skip
        self.images[made["id"]] = made
        return made

    def _image(self, ref: object) -> dict[str, Any] | None:
        """POST /servers' image: an id (a number or a string of digits) or a public image's
        name (a snapshot has none)."""
        if isinstance(ref, int) or (isinstance(ref, str) and ref.isdigit()):
            return self.images.get(int(ref))
        return next((i for i in self.images.values() if i["name"] == ref), None)

    # --- the API ----------------------------------------------------------------------------

    def answer(
        self, method: str, path: str, query: dict[str, str], raw: bytes, auth: str
    ) -> Answer:
        """The answer to one request, with the rate-limit headers every answer carries."""
        allowed = self._spend()
        self._finish_deletions()
        try:
            status, body, headers = self._answer(allowed, method, path, query, raw, auth)
        except SelectorError as exc:  # the API's answer to a bad selector is not confirmed
            status, body, headers = self._error("invalid_input", f"invalid label_selector: {exc}")
        return status, body, {**headers, **self.rate_limit_headers()}

    def _finish_deletions(self) -> None:
        """One request later: a delete_server action whose time is up detaches the server from
        its firewalls and succeeds."""
        for server_id, (left, action_id) in list(self._deleting.items()):
            if left > 0:
                self._deleting[server_id] = (left - 1, action_id)
                continue
            del self._deleting[server_id]
            self._detach(server_id)
            action = self.actions[action_id]
            action.update(status="success", progress=100, finished=iso(datetime.now(UTC)))

    def _detach(self, server_id: int) -> None:
        for firewall in self.firewalls.values():
            firewall["applied_to"] = [
                a for a in firewall["applied_to"] if a["server"]["id"] != server_id
            ]

    def _answer(
        self, allowed: bool, method: str, path: str, query: dict[str, str], raw: bytes, auth: str
    ) -> Answer:
        if not allowed:
            return self._error("rate_limit_exceeded")
        if auth != f"Bearer {TOKEN}":
            return self._error("unauthorized")
        if self.fail_next:
            status, code, retry_after = self.fail_next.pop(0)
            headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
            return status, error_body(code, MESSAGES.get(code, f"injected {code}")), headers
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            return self._error("json_error", "invalid JSON")
        parts = [p for p in path.split("/") if p]
        resource = parts[0] if parts else ""
        item = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
        if resource == "locations":
            return self._page("locations", [location_json(n) for n in LOCATIONS], query)
        if resource == "server_types":
            return self._server_types(item, query)
        if resource == "images" and method == "GET":
            return self._images(item, query)
        if resource == "pricing" and method == "GET":
            return 200, {"pricing": pricing_json()}, {}
        if resource == "actions" and item is not None:
            action = self.actions.get(item)
            return (
                (200, {"action": action}, {})
                if action
                else self._error("not_found", "action not found")
            )
        if resource == "servers":
            verb = parts[3] if len(parts) == 4 and parts[2] == "actions" else None
            return self._servers(method, item, query, body, verb)
        if resource == "firewalls":
            return self._firewalls(method, item, query, body)
        if resource == "images" and method == "DELETE":
            return self._delete_image(item)
        return self._error("not_found", f"no route {method} {path}")

    def _server_types(self, item: int | None, query: dict[str, str]) -> Answer:
        """GET /server_types (``name`` filters, as the API's does) and /server_types/{id}."""
        every = [server_type_json(n) for n in SERVER_TYPES]
        if item is not None:
            found = next((t for t in every if t["id"] == item), None)
            if found is None:
                return self._error("not_found", f"server_type with ID '{item}' not found")
            return 200, {"server_type": found}, {}
        if "name" in query:
            every = [t for t in every if t["name"] == query["name"]]
        return self._page("server_types", every, query)

    def _images(self, item: int | None, query: dict[str, str]) -> Answer:
        """GET /images (catalog.select_images' filters) and GET /images/{id}."""
        if item is not None:
            image = self.images.get(item)
            if image is None:
                return self._error("not_found", f"image with ID '{item}' not found")
            return 200, {"image": image}, {}
        try:
            found = select_images(list(self.images.values()), query)
        except ValueError as exc:
            return self._error("invalid_input", str(exc))
        return self._page("images", found, query)

    def _error(self, code: str, message: str | None = None) -> Answer:
        return STATUS_OF[code], error_body(code, message or MESSAGES[code]), {}

    # --- rate limiting (reference, "Rate Limiting") ----------------------------------------

    def _spend(self) -> bool:
        """Refill the budget for the time gone by, then take one request from it."""
        now = self.clock()
        if self._refilled_at is not None:
            refill = (now - self._refilled_at) * self.rate_limit / HOUR
            self.rate_limit_remaining = min(self.rate_limit, self.rate_limit_remaining + refill)
        self._refilled_at = now
        if self.rate_limit_remaining < 1:
            return False
        self.rate_limit_remaining -= 1
        return True

    def rate_limit_headers(self) -> dict[str, str]:
        missing = self.rate_limit - self.rate_limit_remaining
        reset = self.clock() + missing * HOUR / self.rate_limit
        return {
            "RateLimit-Limit": str(self.rate_limit),
            "RateLimit-Remaining": str(math.floor(self.rate_limit_remaining)),
            "RateLimit-Reset": str(math.ceil(reset)),
        }

    def _page(self, key: str, items: list[dict[str, Any]], query: dict[str, str]) -> Answer:
        per_page = min(int(query.get("per_page", 25)), 50)
        page = int(query.get("page", 1))
        last = max(1, -(-len(items) // per_page))
        chunk = items[(page - 1) * per_page : page * per_page]
        pagination = {
            "page": page, "per_page": per_page, "previous_page": page - 1 if page > 1 else None,
            "next_page": page + 1 if page < last else None, "last_page": last,
            "total_entries": len(items),
        }  # fmt: skip
        return 200, {key: chunk, "meta": {"pagination": pagination}}, {}

    def _select(self, items: list[dict[str, Any]], query: dict[str, str]) -> list[dict[str, Any]]:
        """GET /servers' and /firewalls' filters; a selector that does not parse raises
        SelectorError, answered by ``answer`` as invalid input."""
        if "label_selector" in query:
            parse_selector(query["label_selector"])  # refused even when nothing is listed
            items = [i for i in items if matches(i["labels"], query["label_selector"])]
        if "name" in query:
            items = [i for i in items if i["name"] == query["name"]]
        return sorted(items, key=lambda i: i["id"])

    def _servers(
        self, method: str, item: int | None, query: dict[str, str], body: dict[str, Any],
        action: str | None = None,
    ) -> Answer:  # fmt: skip
        if item is None and method == "GET":
            servers = [self._refresh(s) for s in self.servers.values()]
            return self._page("servers", self._select(servers, query), query)
        if item is None and method == "POST":
            return self._create_server(body)
        server = self.servers.get(item or -1)
        if server is None:
            return self._error("not_found", f"server with ID '{item}' not found")
        if action is not None:
            return self._server_action(server, action, method, body)
        if method == "GET":
            return 200, {"server": self._refresh(server)}, {}
        if method == "PUT":
            server["labels"] = body.get("labels", server["labels"])
            server["name"] = body.get("name", server["name"])
            return 200, {"server": server}, {}
        if method == "DELETE":
            del self.servers[server["id"]]
            resources = [{"id": server["id"], "type": "server"}]
            lag = bool(self.server_delete_lag)
            deleted = self._action("delete_server", resources, running=lag or self.boot is not None)
            if lag:
                self._deleting[server["id"]] = (self.server_delete_lag, deleted["id"])
            else:
                self._detach(server["id"])
            if self.boot is not None:
                boot, server_id = self.boot, server["id"]
                self._in_background(lambda: boot.remove(server_id), deleted["id"], server_id)
            return 200, {"action": deleted}, {}
        return self._error("method_not_allowed")

    def _server_action(
        self, server: dict[str, Any], action: str, method: str, body: dict[str, Any]
    ) -> Answer:
        """POST /servers/{id}/actions/{poweroff|shutdown|poweron|reboot|create_image}."""
        if method == "POST" and action == "create_image":
            return self._create_image(server, body)
        if method != "POST" or action not in POWER:
            return self._error("not_found", f"no server action {method} {action}")
        meanwhile, then = POWER[action]
        server["status"] = then if self.boot is None else meanwhile
        resources = [{"id": server["id"], "type": "server"}]
        done = self._action(
            {"poweroff": "stop_server", "shutdown": "shutdown_server",
             "poweron": "start_server", "reboot": "reboot_server"}[action],
            resources, running=self.boot is not None,
        )  # fmt: skip
        if self.boot is not None:
            boot, server_id = self.boot, server["id"]

            def work() -> None:
                if action in ("poweroff", "shutdown", "reboot"):
                    boot.power_off(server_id, graceful=action != "poweroff")
                if action in ("poweron", "reboot"):
                    boot.power_on(server_id)

            self._in_background(work, done["id"], server_id, then)
        return 201, {"action": done}, {}

    # --- snapshots -------------------------------------------------------------------------

    def _create_image(self, server: dict[str, Any], body: dict[str, Any]) -> Answer:
        """POST /servers/{id}/actions/create_image (reference, "Create Image from a Server";
        hcloud-go ``schema.ServerActionCreateImageResponse``): 201 with the image
        ``creating`` (no size yet) and a ``create_image`` action ``running``; when the action
        succeeds the image is ``available`` with its ``image_size``. Type ``backup`` needs
        backups enabled, which no server here has: only ``snapshot`` is made. In boot mode
        the server's container (and its Docker engine's disk) is committed meanwhile."""
        if body.get("type", "snapshot") != "snapshot":
            return self._error("invalid_input", "invalid input in field 'type'")
        image_id = self._id()
        image: dict[str, Any] = {
            "id": image_id, "type": "snapshot", "status": "creating", "name": None,
            "description": body.get("description") or f"{server['name']} snapshot",
            "image_size": None, "disk_size": server["primary_disk_size"],
            "created": iso(datetime.now(UTC)),
            "created_from": {"id": server["id"], "name": server["name"]},
            "bound_to": None, "os_flavor": "debian", "os_version": "12", "architecture": "x86",
            "rapid_deploy": False, "protection": {"delete": False}, "deprecated": None,
            "deleted": None, "labels": dict(body.get("labels") or {}),
        }  # fmt: skip
        self.snapshots[image_id] = image
        self.images[image_id] = image
        resources = [{"id": server["id"], "type": "server"}, {"id": image_id, "type": "image"}]
        action = self._action("create_image", resources, running=self.boot is not None)
        if self.boot is None:
            image.update(status="available", image_size=SNAPSHOT_GB)
        else:
            boot, server_id = self.boot, server["id"]

            def work() -> None:
                size = boot.commit(server_id, image_id)
                with self._lock:
                    image.update(status="available", image_size=math.ceil(size / 1e7) / 100)

            self._in_background(work, action["id"], server_id)
        return 201, {"image": image, "action": action}, {}

    def _delete_image(self, item: int | None) -> Answer:
        """DELETE /images/{id} (204, reference "Delete an Image"): a snapshot; a public image
        is not the project's to delete (403 forbidden)."""
        image = self.images.get(item or -1)
        if image is None:
            return self._error("not_found", f"image with ID '{item}' not found")
        if image["type"] != "snapshot":
            return self._error("forbidden")
        del self.images[image["id"]]
        self.snapshots.pop(image["id"], None)
        if self.boot is not None:
            self.boot.forget(image["id"])
        return 204, None, {}

    def _create_server(self, body: dict[str, Any]) -> Answer:
        for field in ("name", "server_type", "image"):
            if not body.get(field):
                return self._error("invalid_input", f"invalid input in field '{field}'")
        server_type, location = body["server_type"], body.get("location") or "fsn1"
        if server_type not in SERVER_TYPES:
            return self._error("invalid_input", f"server type {server_type} not found")
        if location not in LOCATIONS:
            # the real text: hetznercloud/terraform-provider-hcloud#493
            return self._error("invalid_input", f"location '{location}' not found")
        offered = self.offered.get(server_type, SERVER_TYPES[server_type].locations)
        if location not in offered:
            return self._error("invalid_input", UNSUPPORTED_LOCATION)
        if (server_type, location) in self.unavailable:
            return self._error("resource_unavailable")
        if (server_type, location) in self.misplaced:
            return self._error("placement_error")
        if any(s["name"] == body["name"] for s in self.servers.values()):
            return self._error("uniqueness_error")
        if self.quota is not None and len(self.servers) >= self.quota:
            return self._error("resource_limit_exceeded")
        if len(body.get("user_data", "").encode()) > 32 * 1024:
            return self._error("invalid_input", "user_data is too long (at most 32 KiB)")
        image = self._image(body["image"])
        if image is None:  # the real answer: vitobotta/hetzner-k3s#681
            return self._error("invalid_input", "image not found")
        server = self.add_server(body["name"], body.get("labels", {}), None, server_type, location)
        server["image"] = image
        server["user_data"] = body.get("user_data", "")  # kept for tests; not in the real API
        snapshot = image["id"] if image["id"] in self.snapshots else None
        for ref in body.get("firewalls", []):
            firewall = self.firewalls.get(ref["firewall"])
            if firewall is None:
                return self._error("not_found", f"firewall {ref['firewall']} not found")
            firewall["applied_to"].append({"type": "server", "server": {"id": server["id"]}})
            server["public_net"]["firewalls"].append({"id": firewall["id"], "status": "applied"})
        action = self._action(
            "create_server", [{"id": server["id"], "type": "server"}], running=self.boot is not None
        )
        if self.boot is not None:
            self._boot(server, action["id"], snapshot)
        if self.create_then_fail:  # made, and then the answer is lost to an error
            status, code = self.create_then_fail.pop(0)
            return status, error_body(code, MESSAGES.get(code, code)), {}
        self.stall_now = self.create_then_stall
        return (
            201,
            {"server": server, "action": action, "next_actions": [], "root_password": None},
            {},
        )

    def _firewalls(
        self, method: str, item: int | None, query: dict[str, str], body: dict[str, Any]
    ) -> Answer:
        if item is None and method == "GET":
            return self._page(
                "firewalls", self._select(list(self.firewalls.values()), query), query
            )
        if item is None and method == "POST":
            return self._create_firewall(body)
        firewall = self.firewalls.get(item or -1)
        if firewall is None:
            return self._error("not_found", f"firewall with ID '{item}' not found")
        if method == "GET":
            return 200, {"firewall": firewall}, {}
        if method == "PUT":
            firewall["labels"] = body.get("labels", firewall["labels"])
            firewall["name"] = body.get("name", firewall["name"])
            return 200, {"firewall": firewall}, {}
        if method == "DELETE":
            if firewall["applied_to"]:
                return self._error(
                    "resource_in_use", f"firewall with ID {firewall['id']} is still in use"
                )
            del self.firewalls[firewall["id"]]
            return 204, None, {}
        return self._error("method_not_allowed")

    def _create_firewall(self, body: dict[str, Any]) -> Answer:
        if not body.get("name"):
            return self._error("invalid_input", "invalid input in field 'name'")
        if any(f["name"] == body["name"] for f in self.firewalls.values()):
            return self._error("uniqueness_error", "firewall name is already used")
        created: dict[str, Any] = {
            "id": self._id(), "name": body["name"], "labels": body.get("labels", {}),
            "rules": body.get("rules", []), "applied_to": [], "created": iso(datetime.now(UTC)),
        }  # fmt: skip
        self.firewalls[created["id"]] = created
        if self.create_then_fail:  # made, and then the answer is lost to an error
            status, code = self.create_then_fail.pop(0)
            return status, error_body(code, MESSAGES.get(code, code)), {}
        return 201, {"firewall": created, "actions": []}, {}


def _handler(fake: FakeHetzner) -> type[BaseHTTPRequestHandler]:
    """The request handler class that answers each request from ``fake``'s state."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def log_message(self, *_: object) -> None:
            pass

        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            with fake._lock:
                fake.requests.append((self.command, url.path))
                status, body, headers = fake.answer(
                    self.command, url.path.removeprefix("/v1"), query, raw,
                    self.headers.get("Authorization", ""),
                )  # fmt: skip
                stall, fake.stall_now = fake.stall_now, None
            if stall:  # outside the lock: other requests go on meanwhile
                time.sleep(stall)
            data = b"" if body is None else json.dumps(body).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)
            except OSError:  # the client gave up waiting (a stalled answer)
                self.close_connection = True

        do_GET = do_POST = do_PUT = do_DELETE = _handle

    return Handler
