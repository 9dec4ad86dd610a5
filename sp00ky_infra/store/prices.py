"""Prices read from the provider's API, kept so that a controller that cannot reach the API
(restarted offline, the API down) prices its pools as of the last reading.

A reading is saved whole, in one transaction that replaces the one before: a type the API no
longer lists goes with it, and a failed reading (never saved) leaves the last one in place.
Each price keeps the day it was read (``LocationPrice.date``) and where from (``source``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from sp00ky_infra.policy.server_types import LocationPrice
from sp00ky_infra.store.dialect import Dialect

PriceKind = Literal["server_type", "primary_ipv4"]
IPV4 = "ipv4"  # the primary IPv4's row name (the API prices one kind of primary IP per server)
COLUMNS = "kind, name, location, hourly, monthly, read_on, read_at, source"


@dataclass(frozen=True, slots=True)
class PriceReading:
    """One reading of the provider's prices at ``read_at`` (unix time): each server type's
    net price per location, and the primary IPv4's per location (billed with every server
    that has one)."""

    read_at: float
    server_types: Mapping[str, tuple[LocationPrice, ...]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    primary_ipv4: tuple[LocationPrice, ...] = ()


class PriceTable:
    """The last reading of the provider's prices (migration 10's ``provider_prices``)."""

    def __init__(self, db: Dialect) -> None:
        self._db = db

    def save(self, reading: PriceReading) -> None:
        """Replace the kept reading with ``reading``, at once."""
        entries = [
            *(("server_type", name, p) for name, ps in reading.server_types.items() for p in ps),
            *(("primary_ipv4", IPV4, p) for p in reading.primary_ipv4),
        ]
        rows = [
            (kind, name, p.location, p.hourly, p.monthly, p.date, reading.read_at, p.source)
            for kind, name, p in entries
        ]
        with self._db.write() as sql:
            sql.execute("DELETE FROM provider_prices")
            sql.executemany(
                f"INSERT INTO provider_prices ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows
            )

    def read(self, server_types: Collection[str] | None = None) -> PriceReading | None:
        """The kept reading (of ``server_types`` only, when given: the types the pools run,
        and the primary IPv4's); None when no reading was ever kept."""
        where = ""
        params: tuple[str, ...] = ()
        if server_types is not None:
            marks = ", ".join("?" for _ in server_types) or "NULL"
            where = f" WHERE kind = 'primary_ipv4' OR name IN ({marks})"
            params = tuple(server_types)
        with self._db.read() as sql:
            rows = sql.execute(
                f"SELECT {COLUMNS} FROM provider_prices{where} ORDER BY kind, name, location",
                params,
            ).fetchall()
        if not rows:
            return None
        types: dict[str, tuple[LocationPrice, ...]] = {}
        ipv4: list[LocationPrice] = []
        for kind, name, location, hourly, monthly, read_on, _, source in rows:
            price = LocationPrice(location, float(hourly), float(monthly), read_on, source)
            if kind == "primary_ipv4":
                ipv4.append(price)
            else:
                types[name] = (*types.get(name, ()), price)
        read_at = max(float(row[6]) for row in rows)
        return PriceReading(read_at, MappingProxyType(types), tuple(ipv4))
