"""A fake Hetzner Cloud API on 127.0.0.1 for tests: servers, firewalls, actions, locations,
server types, labels and label selectors, pagination, and the API's error answers in its
real JSON shapes (the official ``hcloud`` client accepts them).

Knobs: ``unavailable`` {(server_type, location)} answers ``resource_unavailable``;
``offered`` {server_type: {locations}} answers ``unsupported_location_for_server_type``
elsewhere; ``quota`` caps servers (``resource_limit_exceeded``); ``fail_next`` queues
(status, code, retry_after) answers for the next requests (429, 5xx, ...).
"""

from __future__ import annotations

import json
import re
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

TOKEN = "fake-hcloud-token"
LOCATIONS = {
    "fsn1": ("Falkenstein", "DE", "eu-central"),
    "nbg1": ("Nuremberg", "DE", "eu-central"),
    "hel1": ("Helsinki", "FI", "eu-central"),
    "ash": ("Ashburn, VA", "US", "us-east"),
    "hil": ("Hillsboro, OR", "US", "us-west"),
    "sin": ("Singapore", "SG", "ap-southeast"),
}
SERVER_TYPES = {
    "cx22": (2, 4.0, 40, "x86"), "cx33": (4, 8.0, 80, "x86"), "cpx42": (8, 16.0, 320, "x86"),
    "cpx52": (12, 24.0, 480, "x86"), "ccx33": (8, 32.0, 240, "x86"), "cax21": (4, 8.0, 80, "arm"),
}  # fmt: skip
STATUS_OF = {
    "invalid_input": 400, "unauthorized": 401, "forbidden": 403, "resource_limit_exceeded": 403,
    "not_found": 404, "uniqueness_error": 409, "resource_in_use": 409,
    "resource_unavailable": 412, "unsupported_location_for_server_type": 412, "locked": 423,
    "rate_limit_exceeded": 429, "service_error": 503,
}  # fmt: skip


def iso(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S+00:00")


def _location(name: str) -> dict[str, Any]:
    city, country, zone = LOCATIONS[name]
    return {
        "id": list(LOCATIONS).index(name) + 1, "name": name, "description": city,
        "country": country, "city": city, "latitude": 0.0, "longitude": 0.0, "network_zone": zone,
    }  # fmt: skip


def _server_type(name: str) -> dict[str, Any]:
    cores, memory, disk, arch = SERVER_TYPES[name]
    return {
        "id": list(SERVER_TYPES).index(name) + 1, "name": name, "description": name.upper(),
        "cores": cores, "memory": memory, "disk": disk, "deprecated": False, "prices": [],
        "storage_type": "local", "cpu_type": "shared", "architecture": arch, "deprecation": None,
    }  # fmt: skip


def matches(labels: dict[str, str], selector: str) -> bool:
    """Hetzner label selectors: ``k=v``, ``k!=v``, ``k``, ``!k``, ``k in (a,b)``, comma = and."""
    for term in filter(None, (t.strip() for t in re.split(r",(?![^(]*\))", selector))):
        if found := re.fullmatch(r"(\S+) (notin|in) \((.*)\)", term):
            key, op, values = found.groups()
            inside = labels.get(key) in [v.strip() for v in values.split(",")]
            if inside != (op == "in"):
                return False
        elif "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.split("=", 1)
            if labels.get(key.rstrip("=")) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


class FakeHetzner:
    def __init__(self) -> None:
        self.servers: dict[int, dict[str, Any]] = {}
        self.firewalls: dict[int, dict[str, Any]] = {}
        self.actions: dict[int, dict[str, Any]] = {}
        self.unavailable: set[tuple[str, str]] = set()
        self.offered: dict[str, set[str]] = {}
        self.quota: int | None = None
        self.fail_next: list[tuple[int, str, float | None]] = []
        self.requests: list[tuple[str, str]] = []
        self._next_id = 1000
        self._lock = threading.Lock()
        fake = self

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
                data = b"" if body is None else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHetzner:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    # --- state -----------------------------------------------------------------------------

    def _id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _action(self, command: str, resources: list[dict[str, Any]]) -> dict[str, Any]:
        now = iso(datetime.now(UTC))
        action: dict[str, Any] = {
            "id": self._id(), "command": command, "status": "success", "progress": 100,
            "started": now, "finished": now, "resources": resources, "error": None,
        }  # fmt: skip
        self.actions[action["id"]] = action
        return action

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
            "private_net": [], "server_type": _server_type(server_type),
            "location": _location(location),
            "datacenter": {"id": 1, "name": f"{location}-dc1", "description": location,
                           "location": _location(location),
                           "server_types": {"supported": [], "available": [],
                                            "available_for_migration": []}},
            "image": {"id": 1, "type": "system", "status": "available", "name": "debian-12",
                      "description": "Debian 12", "os_flavor": "debian", "os_version": "12",
                      "architecture": "x86", "labels": {}, "protection": {"delete": False}},
            "iso": None, "rescue_enabled": False, "locked": False, "backup_window": None,
            "outgoing_traffic": 0, "ingoing_traffic": 0, "included_traffic": 21990232555520,
            "protection": {"delete": False, "rebuild": False}, "labels": dict(labels),
            "volumes": [], "load_balancers": [], "primary_disk_size": 80, "placement_group": None,
        }  # fmt: skip
        self.servers[server_id] = server
        return server

    # --- the API ----------------------------------------------------------------------------

    def answer(
        self, method: str, path: str, query: dict[str, str], raw: bytes, auth: str
    ) -> tuple[int, Any, dict[str, str]]:
        if auth != f"Bearer {TOKEN}":
            return self._error("unauthorized", "unable to authenticate")
        if self.fail_next:
            status, code, retry_after = self.fail_next.pop(0)
            headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
            return (
                status,
                {"error": {"code": code, "message": f"injected {code}", "details": {}}},
                headers,
            )
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            return self._error("json_error", "invalid JSON")
        parts = [p for p in path.split("/") if p]
        resource = parts[0] if parts else ""
        item = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
        if resource == "locations":
            return self._page("locations", [_location(n) for n in LOCATIONS], query)
        if resource == "server_types":
            return self._page("server_types", [_server_type(n) for n in SERVER_TYPES], query)
        if resource == "actions" and item is not None:
            action = self.actions.get(item)
            return (
                (200, {"action": action}, {})
                if action
                else self._error("not_found", "action not found")
            )
        if resource == "servers":
            return self._servers(method, item, query, body)
        if resource == "firewalls":
            return self._firewalls(method, item, query, body)
        return self._error("not_found", f"no route {method} {path}")

    def _error(self, code: str, message: str) -> tuple[int, Any, dict[str, str]]:
        return (
            STATUS_OF.get(code, 400),
            {"error": {"code": code, "message": message, "details": {}}},
            {},
        )

    def _page(
        self, key: str, items: list[dict[str, Any]], query: dict[str, str]
    ) -> tuple[int, Any, dict[str, str]]:
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
        if "label_selector" in query:
            items = [i for i in items if matches(i["labels"], query["label_selector"])]
        if "name" in query:
            items = [i for i in items if i["name"] == query["name"]]
        return sorted(items, key=lambda i: i["id"])

    def _servers(
        self, method: str, item: int | None, query: dict[str, str], body: dict[str, Any]
    ) -> tuple[int, Any, dict[str, str]]:
        if item is None and method == "GET":
            return self._page("servers", self._select(list(self.servers.values()), query), query)
        if item is None and method == "POST":
            return self._create_server(body)
        server = self.servers.get(item or -1)
        if server is None:
            return self._error("not_found", f"server with ID '{item}' not found")
        if method == "GET":
            return 200, {"server": server}, {}
        if method == "PUT":
            server["labels"] = body.get("labels", server["labels"])
            server["name"] = body.get("name", server["name"])
            return 200, {"server": server}, {}
        if method == "DELETE":
            del self.servers[server["id"]]
            for firewall in self.firewalls.values():
                firewall["applied_to"] = [
                    a for a in firewall["applied_to"] if a["server"]["id"] != server["id"]
                ]
            return (
                200,
                {"action": self._action("delete_server", [{"id": server["id"], "type": "server"}])},
                {},
            )
        return self._error("invalid_input", f"{method} not allowed")

    def _create_server(self, body: dict[str, Any]) -> tuple[int, Any, dict[str, str]]:
        for field in ("name", "server_type", "image"):
            if not body.get(field):
                return self._error("invalid_input", f"invalid input in field '{field}'")
        server_type, location = body["server_type"], body.get("location") or "fsn1"
        if server_type not in SERVER_TYPES:
            return self._error("invalid_input", f"unknown server type {server_type!r}")
        if location not in LOCATIONS:
            return self._error("invalid_input", f"unknown location {location!r}")
        if server_type in self.offered and location not in self.offered[server_type]:
            return self._error(
                "unsupported_location_for_server_type",
                f"{server_type} is not offered in {location}",
            )
        if (server_type, location) in self.unavailable:
            return self._error(
                "resource_unavailable", f"{server_type} is unavailable in {location}"
            )
        if any(s["name"] == body["name"] for s in self.servers.values()):
            return self._error("uniqueness_error", "server name is already used")
        if self.quota is not None and len(self.servers) >= self.quota:
            return self._error("resource_limit_exceeded", "server limit reached for this project")
        if len(body.get("user_data", "").encode()) > 32 * 1024:
            return self._error("invalid_input", "user_data is too long (at most 32 KiB)")
        server = self.add_server(body["name"], body.get("labels", {}), None, server_type, location)
        server["user_data"] = body.get("user_data", "")  # kept for tests; not in the real API
        for ref in body.get("firewalls", []):
            firewall = self.firewalls.get(ref["firewall"])
            if firewall is None:
                return self._error("not_found", f"firewall {ref['firewall']} not found")
            firewall["applied_to"].append({"type": "server", "server": {"id": server["id"]}})
            server["public_net"]["firewalls"].append({"id": firewall["id"], "status": "applied"})
        action = self._action("create_server", [{"id": server["id"], "type": "server"}])
        return (
            201,
            {"server": server, "action": action, "next_actions": [], "root_password": None},
            {},
        )

    def _firewalls(
        self, method: str, item: int | None, query: dict[str, str], body: dict[str, Any]
    ) -> tuple[int, Any, dict[str, str]]:
        if item is None and method == "GET":
            return self._page(
                "firewalls", self._select(list(self.firewalls.values()), query), query
            )
        if item is None and method == "POST":
            created: dict[str, Any] = {
                "id": self._id(), "name": body.get("name", ""), "labels": body.get("labels", {}),
                "rules": body.get("rules", []), "applied_to": [], "created": iso(datetime.now(UTC)),
            }  # fmt: skip
            self.firewalls[created["id"]] = created
            return 201, {"firewall": created, "actions": []}, {}
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
                return self._error("resource_in_use", "firewall is still applied to servers")
            del self.firewalls[firewall["id"]]
            return 204, None, {}
        return self._error("invalid_input", f"{method} not allowed")
