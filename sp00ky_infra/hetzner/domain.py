"""Typed records of what the API returns: plain data, parsed once at the edge."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sp00ky_infra.policy.server_types import LocationPrice, ServerType


def _time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True, slots=True)
class Server:
    id: int
    name: str
    created: float  # unix time
    labels: Mapping[str, str] = field(default_factory=dict)
    status: str = ""
    location: str | None = None
    server_type: str | None = None
    image: int | None = None  # the image it was created from (a snapshot's id, for one)

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Server:
        location = body.get("location") or (body.get("datacenter") or {}).get("location") or {}
        return cls(
            id=int(body["id"]),
            name=str(body["name"]),
            created=_time(body["created"]),
            labels=dict(body.get("labels") or {}),
            status=str(body.get("status", "")),
            location=location.get("name"),
            server_type=(body.get("server_type") or {}).get("name"),
            image=int(image["id"]) if (image := body.get("image")) else None,
        )


@dataclass(frozen=True, slots=True)
class FirewallRule:
    """One rule of a firewall (the API's ``rules[]``): which traffic it lets through."""

    direction: str  # "in" or "out"
    protocol: str  # "tcp", "udp", "icmp", "esp" or "gre"
    port: str | None = None  # "80", "1024-2048", or None (icmp, esp, gre)
    source_ips: tuple[str, ...] = ()
    destination_ips: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> FirewallRule:
        return cls(
            direction=str(body["direction"]),
            protocol=str(body["protocol"]),
            port=body.get("port"),
            source_ips=tuple(body.get("source_ips") or ()),
            destination_ips=tuple(body.get("destination_ips") or ()),
        )


@dataclass(frozen=True, slots=True)
class Firewall:
    """A firewall as GET /firewalls/{id} answers it. ``servers`` are the ids of the servers it
    is applied to, directly or through a label selector (``applied_to[]``, whose label-selector
    entries list what they reach in ``applied_to_resources``); a firewall with servers cannot
    be deleted (``resource_in_use``)."""

    id: int
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    rules: tuple[FirewallRule, ...] = ()
    servers: tuple[int, ...] = ()

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Firewall:
        servers: list[int] = []
        for applied in body.get("applied_to") or []:
            reached = [applied, *(applied.get("applied_to_resources") or [])]
            servers += [int(r["server"]["id"]) for r in reached if r.get("type") == "server"]
        return cls(
            id=int(body["id"]),
            name=str(body["name"]),
            labels=dict(body.get("labels") or {}),
            rules=tuple(FirewallRule.from_json(r) for r in body.get("rules") or []),
            servers=tuple(dict.fromkeys(servers)),
        )


def header_number(text: str | None) -> float | None:
    """A header's number, or None when it is missing or not a number (an HTTP date)."""
    try:
        return float(text) if text else None
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class RateLimit:
    """The rate-limit headers the API sends on every answer
    (https://docs.hetzner.cloud/reference/cloud#rate-limiting): ``limit`` requests per hour,
    ``remaining`` now, and ``reset``, the unix time at which the budget is full again. The
    budget refills gradually (at 3600/h, one request a second), so it is not a window edge.
    hcloud-go reads Reset the same way (``hcloud/client_handler_rate_limit.go``)."""

    limit: int
    remaining: int
    reset: float  # unix time

    @classmethod
    def from_headers(cls, headers: Mapping[str, str]) -> RateLimit | None:
        limit = header_number(headers.get("RateLimit-Limit"))
        remaining = header_number(headers.get("RateLimit-Remaining"))
        reset = header_number(headers.get("RateLimit-Reset"))
        if limit is None or remaining is None or reset is None:
            return None
        return cls(int(limit), int(remaining), reset)


PRICING_SOURCE = "Hetzner Pricing API (GET /pricing)"
SERVER_TYPES_SOURCE = "Hetzner API (GET /server_types)"


def _net(amount: Mapping[str, Any]) -> float:
    return float(amount["net"])


def _location_prices(
    prices: list[Mapping[str, Any]], date: str, source: str
) -> tuple[LocationPrice, ...]:
    """A server type's ``prices[]`` (hcloud-go ``schema.PricingServerTypePrice``), net EUR."""
    return tuple(
        LocationPrice(
            str(p["location"]),
            _net(p["price_hourly"]),
            _net(p["price_monthly"]),
            date,
            source,
        )
        for p in prices
    )


@dataclass(frozen=True, slots=True)
class Pricing:
    """GET /pricing as read on ``date`` (hcloud-go ``schema.Pricing``): every server type's net
    price per location and the primary IPv4's per location (its hourly price as answered), and
    the net price of a GB of snapshot a month (``image.price_per_gb_month``, hcloud-go
    ``schema.PricingImage``)."""

    currency: str
    vat_rate: float
    server_types: Mapping[str, tuple[LocationPrice, ...]]
    primary_ipv4: tuple[LocationPrice, ...]
    date: str
    image_per_gb_month: float = 0.0

    @classmethod
    def from_json(cls, body: Mapping[str, Any], date: str) -> Pricing:
        server_types = {
            str(t["name"]): _location_prices(t.get("prices") or [], date, PRICING_SOURCE)
            for t in body.get("server_types") or []
        }
        ipv4: Mapping[str, Any] = next(
            (p for p in body.get("primary_ips") or [] if p.get("type") == "ipv4"), {}
        )
        return cls(
            currency=str(body["currency"]),
            vat_rate=float(body["vat_rate"]),
            server_types=server_types,
            primary_ipv4=_location_prices(ipv4.get("prices") or [], date, PRICING_SOURCE),
            date=date,
            image_per_gb_month=_net(
                (body.get("image") or {}).get("price_per_gb_month") or {"net": 0}
            ),
        )


def server_type_from_json(body: Mapping[str, Any], date: str) -> ServerType:
    """One of GET /server_types (hcloud-go ``schema.ServerType``) as the catalog's record: sold
    where its ``locations[]`` say (its priced locations when the answer has none)."""
    prices = _location_prices(body.get("prices") or [], date, SERVER_TYPES_SOURCE)
    listed = [str(loc["name"]) for loc in body.get("locations") or []]
    return ServerType(
        name=str(body["name"]),
        cores=int(body["cores"]),
        memory=float(body["memory"]),
        disk=int(body["disk"]),
        architecture="arm" if body.get("architecture") == "arm" else "x86",
        cpu_type="dedicated" if body.get("cpu_type") == "dedicated" else "shared",
        locations=tuple(listed or (p.location for p in prices)),
        prices=prices,
        deprecated=bool(body.get("deprecated")) or body.get("deprecation") is not None,
        source=f"{SERVER_TYPES_SOURCE}, {date}",
    )


@dataclass(frozen=True, slots=True)
class Action:
    """An action as the API answers it (hcloud-go ``schema.Action``): ``status`` is
    ``running``, ``success`` or ``error`` (with ``error``'s code and message)."""

    id: int
    command: str
    status: str
    progress: int = 0
    error: str | None = None

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Action:
        error = body.get("error") or None
        return cls(
            id=int(body["id"]),
            command=str(body.get("command", "")),
            status=str(body["status"]),
            progress=int(body.get("progress") or 0),
            error=f"{error.get('code')}: {error.get('message')}" if error else None,
        )


@dataclass(frozen=True, slots=True)
class Image:
    """An image as GET /images answers it (hcloud-go ``schema.Image``). A snapshot has no
    ``name``, its ``description`` says what it is; ``image_size`` (GB, what is billed) is
    None while it is being made, ``disk_size`` (GB) is the disk it was taken of; ``status``
    is ``creating``, ``available`` or ``unavailable``."""

    id: int
    type: str  # system, snapshot, backup or app
    status: str
    created: float  # unix time
    name: str | None = None
    description: str = ""
    image_size: float | None = None
    disk_size: float = 0.0
    labels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Image:
        size = body.get("image_size")
        return cls(
            id=int(body["id"]),
            type=str(body["type"]),
            status=str(body.get("status", "")),
            created=_time(body["created"]),
            name=body.get("name"),
            description=str(body.get("description") or ""),
            image_size=None if size is None else float(size),
            disk_size=float(body.get("disk_size") or 0.0),
            labels=dict(body.get("labels") or {}),
        )
