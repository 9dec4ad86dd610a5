"""Typed records of what the API returns: plain data, parsed once at the edge."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


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
        )


@dataclass(frozen=True, slots=True)
class Firewall:
    id: int
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Firewall:
        return cls(
            id=int(body["id"]), name=str(body["name"]), labels=dict(body.get("labels") or {})
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
