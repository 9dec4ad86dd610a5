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
