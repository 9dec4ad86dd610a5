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
- Server types and their prices: ``policy/server_types.py`` (dated, sourced entry by entry),
  in the JSON shapes of hcloud-go's ``hcloud/schema/server_type.go`` and ``pricing.go``
  (hetznercloud/hcloud-go at b8cfa39, 2026-08-18). A type is sold where the catalog says.
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
- Firewalls (reference, "Firewalls"; hcloud-python ``hcloud/firewalls/client.py``): POST
  /firewalls answers 201 ``{"firewall": {...}, "actions": [...]}`` (the actions apply it to
  its ``apply_to`` resources; none here), GET and PUT /firewalls/{id} ``{"firewall": {...}}``
  (PUT replaces the whole set of labels), DELETE answers 204 with no body (hcloud-python
  returns no action for it). A firewall is ``id``, ``name``, ``labels``, ``created``,
  ``rules`` and ``applied_to`` (``{"type": "server", "server": {"id": ...}}``). No ``in``
  rule means every inbound packet is dropped, no ``out`` rule that all outbound goes.
- Deleting a firewall still applied to a server: ``resource_in_use`` (reference: "Firewall
  must not be in use to be deleted"), HTTP 422 "firewall with ID 1103544 is still in use"
  with ``"details": null`` (seen in ansible-collections/hetzner.hcloud#380 and
  vitobotta/hetzner-k3s#625, where it lingered after the servers were deleted).
- A taken firewall name: ``uniqueness_error`` (409) like a taken server name; the firewall's
  message is not confirmed.
- Images (reference, "Images"; hcloud-go ``hcloud/schema/image.go`` at b8cfa39 for the shape,
  ``hcloud/image.go`` ``ImageListOpts`` for the filters): GET /images filters by ``type``
  (system, app, snapshot, backup), ``name``, ``label_selector``, ``architecture``, ``status``
  and ``bound_to``, leaves deprecated images out unless ``include_deprecated=true`` (hcloud-go:
  "In contrast to Get, this method also returns deprecated images"), and sorts by ``sort``
  (``id``, ``name``, ``created``, ``description``, each ``:asc`` or ``:desc``); a repeated
  filter keeps its last value here, where the API takes each. GET /images/{id} answers
  ``{"image": ...}``. A snapshot has no name (``"name": null``: syself/
  cluster-api-provider-hetzner#128), so ``name`` never finds one. The public images are
  config/machine_images.py's KNOWN_IMAGES (the docker-ce app and a few system images), with
  ids of this fake's own.
- POST /servers takes its image as an id (a number, or a string of digits) or a name
  (hcloud-go ``schema.IDOrName``); an image it cannot find is ``invalid_input`` (422) "image
  not found" with ``"details": {}`` (seen in vitobotta/hetzner-k3s#681). An unknown image id
  in GET /images/{id} is ``not_found`` (404); that message is not confirmed, nor is the
  answer to a label selector that does not parse (here ``invalid_input``, 422).
- A deleted server's delete_server action runs a while, and its firewalls count it as
  applied until it is done (the lingering above); whether the server is still listed
  meanwhile (status ``deleting``) is not confirmed: this fake drops it at once.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sp00ky_infra.config.machine_images import KNOWN_IMAGES, KnownImage, parse_selector
from sp00ky_infra.policy.server_types import (
    PRIMARY_IPV4_MONTHLY,
    SERVER_TYPES,
    LocationPrice,
    ServerType,
)

TOKEN = "fake-hcloud-token"
LOCATIONS = {
    "fsn1": ("Falkenstein", "DE", "eu-central"),
    "nbg1": ("Nuremberg", "DE", "eu-central"),
    "hel1": ("Helsinki", "FI", "eu-central"),
    "ash": ("Ashburn, VA", "US", "us-east"),
    "hil": ("Hillsboro, OR", "US", "us-west"),
    "sin": ("Singapore", "SG", "ap-southeast"),
}
STATUS_OF = {
    "json_error": 400, "unauthorized": 401, "token_readonly": 401, "forbidden": 403,
    "maintenance": 403, "resource_limit_exceeded": 403, "not_found": 404,
    "method_not_allowed": 405, "uniqueness_error": 409, "conflict": 409,
    "resource_unavailable": 412, "placement_error": 412, "invalid_input": 422,
    "service_error": 422, "unsupported_error": 422, "locked": 423, "protected": 423,
    "rate_limit_exceeded": 429, "server_error": 500, "bad_gateway": 502, "unavailable": 503,
    "timeout": 504,
    "resource_in_use": 422,  # DELETE /firewalls' own code (ansible-collections/hetzner.hcloud#380)
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
VAT_RATE = "19.00"  # a German customer's; the real API answers the account's own rate


def iso(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S+00:00")


def location_json(name: str) -> dict[str, Any]:
    city, country, zone = LOCATIONS[name]
    return {
        "id": list(LOCATIONS).index(name) + 1, "name": name, "description": city,
        "country": country, "city": city, "latitude": 0.0, "longitude": 0.0, "network_zone": zone,
    }  # fmt: skip


def _amount(net: float) -> dict[str, str]:
    """A price as the API writes it: net and gross strings, gross from VAT_RATE."""
    gross = net * (1 + float(VAT_RATE) / 100)
    return {"net": f"{net:.10f}", "gross": f"{gross:.10f}"}


def price_json(price: LocationPrice) -> dict[str, Any]:
    """One location's price of a server type (hcloud-go ``schema.PricingServerTypePrice``);
    included traffic and its overage price are not known here: 0."""
    return {
        "location": price.location, "price_hourly": _amount(price.hourly),
        "price_monthly": _amount(price.monthly), "included_traffic": 0,
        "price_per_tb_traffic": _amount(0.0),
    }  # fmt: skip


def _type_id(name: str) -> int:
    return list(SERVER_TYPES).index(name) + 1


def server_type_json(name: str) -> dict[str, Any]:
    """hcloud-go ``schema.ServerType``: every location selling it, priced where known."""
    kind: ServerType = SERVER_TYPES[name]
    deprecation = (
        {"announced": "2025-10-16T00:00:00+00:00", "unavailable_after": "2025-12-31T23:59:59+00:00"}
        if kind.deprecated
        else None
    )
    locations = [
        {"id": list(LOCATIONS).index(n) + 1, "name": n, "recommended": False, "available": True,
         "deprecation": deprecation}
        for n in kind.locations
    ]  # fmt: skip
    return {
        "id": _type_id(name), "name": name, "description": name.upper(), "category": "",
        "cores": kind.cores, "memory": kind.memory, "disk": kind.disk,
        "deprecated": kind.deprecated, "prices": [price_json(p) for p in kind.prices],
        "storage_type": "local", "cpu_type": kind.cpu_type, "architecture": kind.architecture,
        "included_traffic": 0, "deprecation": deprecation, "locations": locations,
    }  # fmt: skip


def pricing_json() -> dict[str, Any]:
    """GET /pricing's ``pricing`` (hcloud-go ``schema.Pricing``): the server types' prices per
    location and the primary IPv4's, from the catalog. What the catalog does not know (the
    primary IPv4's hourly price, images, volumes, backups, traffic) is answered as 0."""
    ipv4 = [
        {"location": n, "price_hourly": _amount(0.0),
         "price_monthly": _amount(PRIMARY_IPV4_MONTHLY.monthly)}
        for n in LOCATIONS
    ]  # fmt: skip
    zero = {"price_per_gb_month": _amount(0.0)}
    return {
        "currency": "EUR", "vat_rate": VAT_RATE, "image": zero, "volume": zero,
        "floating_ip": {"price_monthly": _amount(0.0)}, "floating_ips": [],
        "primary_ips": [{"type": "ipv4", "prices": ipv4}],
        "traffic": {"price_per_tb": _amount(0.0)}, "server_backup": {"percentage": "0.00"},
        "server_types": [
            {"id": _type_id(n), "name": n, "prices": [price_json(p) for p in t.prices]}
            for n, t in SERVER_TYPES.items()
        ],
        "load_balancer_types": [],
    }  # fmt: skip


def matches(labels: dict[str, str], selector: str) -> bool:
    """Hetzner label selectors: ``k=v``, ``k!=v``, ``k``, ``!k``, ``k in (a,b)``, comma = and
    (parsed by config/machine_images.py, which lint reads too)."""
    return all(term.matches(labels) for term in parse_selector(selector))


PUBLIC_IMAGE_ID = 100  # the public images' ids start here, below every id the fake hands out
IMAGE_CREATED = "2024-06-03T00:00:00+00:00"  # the docker-ce app's last rebuild (e9d196f)


def image_json(
    image_id: int, kind: str, name: str | None, description: str, os_flavor: str,
    os_version: str | None, labels: dict[str, str], created: str,
) -> dict[str, Any]:  # fmt: skip
    """hcloud-go ``schema.Image``: an available x86 image, never deprecated (the tests make
    one so by setting ``deprecated``)."""
    return {
        "id": image_id, "type": kind, "status": "available", "name": name,
        "description": description, "image_size": None if kind != "snapshot" else 1.2,
        "disk_size": 5, "created": created, "created_from": None, "bound_to": None,
        "os_flavor": os_flavor, "os_version": os_version, "architecture": "x86",
        "rapid_deploy": kind != "snapshot", "protection": {"delete": False},
        "deprecated": None, "deleted": None, "labels": dict(labels),
    }  # fmt: skip


def public_images_json() -> list[dict[str, Any]]:
    """The public images the fake knows: KNOWN_IMAGES, in order."""
    known: list[KnownImage] = list(KNOWN_IMAGES.values())
    return [
        image_json(PUBLIC_IMAGE_ID + index, each.type, each.name, each.description,
                   each.os_flavor, each.os_version, {}, IMAGE_CREATED)
        for index, each in enumerate(known)
    ]  # fmt: skip


IMAGE_SORTS = ("id", "name", "created", "description")
IMAGE_FILTERS = ("type", "name", "architecture", "status", "bound_to")


def select_images(images: list[dict[str, Any]], query: dict[str, str]) -> list[dict[str, Any]]:
    """GET /images' filters and sort, as the API applies them (the module docstring)."""
    found = [i for i in images if query.get("include_deprecated") == "true" or not i["deprecated"]]
    for key in IMAGE_FILTERS:
        if key in query:
            found = [i for i in found if str(i[key]) == query[key]]
    if "label_selector" in query:
        found = [i for i in found if matches(i["labels"], query["label_selector"])]
    field, _, order = query.get("sort", "id").partition(":")
    if field not in IMAGE_SORTS:
        raise ValueError(f"invalid sort field {field!r}")
    # ties (created is to the second) in the order the images were made: ids grow with it
    return sorted(
        found, key=lambda i: (i[field] is None, i[field] or "", i["id"]), reverse=order == "desc"
    )


def error_body(code: str, message: str) -> dict[str, Any]:
    details: dict[str, Any] | None = None if code == "resource_in_use" else {}  # null, as seen
    return {"error": {"code": code, "message": message, "details": details}}
