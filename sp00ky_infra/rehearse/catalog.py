"""What the fake Hetzner Cloud API knows without being asked: its token, locations, server
types, error codes with their statuses and messages, label selectors, and the JSON shapes of
its records.

Where each answer comes from (when a fact could not be confirmed, it says so):

- Statuses of the error codes: the API reference's errors table,
  https://docs.hetzner.cloud/reference/cloud#errors (400 json_error, 401 unauthorized,
  403 forbidden / resource_limit_exceeded, 404 not_found, 409 uniqueness_error / conflict,
  412 resource_unavailable, 422 invalid_input / service_error, 423 locked, 429
  rate_limit_exceeded, 500 server_error, 502 bad_gateway, 503 unavailable, 504 timeout);
  hcloud-go's own tests answer service_error with 422 too (``hcloud/client_test.go``).
- A server type not sold in a location: ``invalid_input`` (422), "unsupported location for
  server type"; the API has no code of its own for it (seen in the field:
  testflows/TestFlows-GitHub-Hetzner-Runners#96, autobase-tech/autobase#1403).
- Out of capacity: ``resource_unavailable`` (412), "error during placement"
  (hetznercloud/terraform-provider-hcloud#531, pulumi/pulumi-hcloud#104).
- ``placement_error``: listed for POST /servers by the reference and hcloud-go
  (``hcloud/error.go``: "an error during the placement occurred"); its status and message are
  not documented and not confirmed. This fake answers 412 "error during placement".
- Quota: ``resource_limit_exceeded`` (403), "server limit exceeded"
  (hetzneronline/community-content#933, mysticaltech/terraform-hcloud-kube-hetzner#760).
- A taken name: ``uniqueness_error`` (409), "server name is already used"
  (23technologies/gardener-extension-provider-hcloud#10).
- ``locked`` (423): "cannot perform operation because server is locked"
  (hetznercloud/terraform-provider-hcloud#492; jenkinsci/hetzner-cloud-plugin#92 shows 423).
- Rate limiting (reference, "Rate Limiting"): every answer, authenticated or not, carries
  ``RateLimit-Limit`` (requests per hour, 3600 by default), ``RateLimit-Remaining`` and
  ``RateLimit-Reset``, the unix time at which the budget is full again; the budget refills
  gradually (1 request a second at 3600/h). Real headers seen in
  hetznercloud/packer-plugin-hcloud#205. Whether a 429 also carries Retry-After is not
  documented: this fake sends it only when a test injects it. The messages of 429,
  ``conflict``, ``not_found``, ``unauthorized`` and the 5xx answers are not confirmed: they
  are the reference's descriptions or placeholders.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

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
    "json_error": 400, "unauthorized": 401, "token_readonly": 401, "forbidden": 403,
    "maintenance": 403, "resource_limit_exceeded": 403, "not_found": 404,
    "method_not_allowed": 405, "uniqueness_error": 409, "conflict": 409,
    "resource_unavailable": 412, "placement_error": 412, "invalid_input": 422,
    "service_error": 422, "unsupported_error": 422, "locked": 423, "protected": 423,
    "rate_limit_exceeded": 429, "server_error": 500, "bad_gateway": 502, "unavailable": 503,
    "timeout": 504,
    "resource_in_use": 409,  # DELETE /firewalls' own code; its status is not documented
}  # fmt: skip
MESSAGES = {
    "resource_unavailable": "error during placement",
    "placement_error": "error during placement",
    "resource_limit_exceeded": "server limit exceeded",
    "uniqueness_error": "server name is already used",
    "locked": "cannot perform operation because server is locked",
    "conflict": "The resource has changed during the request, please retry",
    "rate_limit_exceeded": "limit of requests per hour reached",
    "unauthorized": "unable to authenticate",
    "service_error": "Error within a service",
    "server_error": "Error within the API backend",
    "bad_gateway": "The request could not be answered by the API backend, please retry",
    "unavailable": "A service or product is currently not available",
    "timeout": "The request could not be answered in time, please retry",
    "method_not_allowed": "The request method is not allowed",
}
UNSUPPORTED_LOCATION = "unsupported location for server type"


def iso(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S+00:00")


def location_json(name: str) -> dict[str, Any]:
    city, country, zone = LOCATIONS[name]
    return {
        "id": list(LOCATIONS).index(name) + 1, "name": name, "description": city,
        "country": country, "city": city, "latitude": 0.0, "longitude": 0.0, "network_zone": zone,
    }  # fmt: skip


def server_type_json(name: str) -> dict[str, Any]:
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


def error_body(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": {}}}
