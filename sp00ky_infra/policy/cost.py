"""What machines cost: the server types' dated prices (``server_types.py``) and Hetzner's
billing rule. Pure.

The rule (Hetzner's Cloud billing FAQ, https://docs.hetzner.com/cloud/billing/faq, and
"Billing system", https://docs.hetzner.com/general/billing-and-account-management/
billing-at-hetzner/billing-system-hetzner, both read 2026-06):

- a server is billed from its creation until it is deleted, whatever its state;
- "The hourly usage of a server is always rounded up": every started hour is a full hour,
  so a server that lived a few minutes costs one hour;
- "The total costs is never more than the monthly price": the bill is
  min(monthly price, started hours x hourly price).

The monthly cap is per calendar month; a machine here lives at most ``maxLifetime`` (24 h by
default), so the cap is applied per machine and per 30 days of its life (an approximation
that only matters to machines older than a month).

Snapshots: Hetzner bills them "on a per gigabyte per month basis" (Cloud FAQ, "What are
snapshots and backups?", https://docs.hetzner.com/cloud/general/faq), for as long as they
exist, by the rule "Billing system" states for every product: the hourly price while a
product has not been used for almost the whole month, "We round up partial hours", "The
total costs is never more than the monthly price". Only the monthly price of a GB is
published (GET /pricing's ``image.price_per_gb_month``), so the hourly price here is the
monthly one's share of the 30 days above (720 hours): a whole month costs the monthly price.

Idle euros are the share of a machine's bill spent with no job on it:
bill x idle seconds / lifetime seconds (the time it booted and drained counts as idle too:
it is paid for and runs nothing).

Local and docker machines run on hardware already paid for: they cost nothing here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from sp00ky_infra.policy.server_types import SERVER_TYPES, LocationPrice

HOUR = 3600.0
MONTH = 30 * 24 * HOUR  # the cap's period, per machine (see above)
PRICES_DATE = max(p.date for t in SERVER_TYPES.values() for p in t.prices)


@dataclass(frozen=True, slots=True)
class Price:
    """One server type's price in EUR, excluding VAT: per started hour, and its monthly cap."""

    hourly: float
    monthly: float
    source: str = ""


class UnknownPrice(KeyError):
    """A server type the table has no price for; the message says how to give one."""

    def __str__(self) -> str:
        return str(self.args[0])


def _price(entry: LocationPrice) -> Price:
    return Price(entry.hourly, entry.monthly, f"{entry.source}, {entry.location}, {entry.date}")


# Each server type's price where it is priced (server_types.py, net of VAT): its newest-dated
# price, fsn1's first. A type missing here has no known price: it is never free.
HETZNER_PRICES: Mapping[str, Price] = MappingProxyType(
    {
        name: _price(entry)
        for name, kind in SERVER_TYPES.items()
        if (entry := kind.price_at()) is not None
    }
)


def billed_hours(seconds: float) -> int:
    """Started hours: a server that existed at all is billed one hour at least."""
    if seconds <= 0:
        return 0
    return max(1, math.ceil(seconds / HOUR - 1e-9))


# Seconds from a destroy being asked for to the provider no longer billing the machine: on
# Hetzner a Pulumi update (the engine starts, plans, deletes) then the delete action, about
# half a minute, taken at a minute; a container or a process stops in about a second.
DESTROY_SECONDS: Mapping[str, float] = MappingProxyType(
    {"hetzner": 60.0, "docker": 2.0, "local": 1.0}
)
AGENT_LEAVES_SECONDS = 1.0  # from a drain heard to the agent's "drained": it stops its backend


@dataclass(frozen=True, slots=True)
class Billing:
    """How a provider bills a machine: per started ``hour`` from its creation. An idle surplus
    machine is kept until ``margin`` seconds before its next hour would begin: its drain, the
    tick that destroys it and the destroy itself must be done by then."""

    hour: float = HOUR
    margin: float = 150.0

    @classmethod
    def of(cls, provider: str, tick: float, hour: float = HOUR) -> Billing:
        """A provider's billing, its margin twice what a drain and a destroy take (a tick to
        order the drain, the agent's leaving, a tick to destroy, the destroy): never so
        close that a slow destroy starts a new hour. At most a quarter of the hour."""
        destroy = DESTROY_SECONDS.get(provider, DESTROY_SECONDS["hetzner"])
        latency = 2 * tick + AGENT_LEAVES_SECONDS + destroy
        return cls(hour, min(2 * latency, hour / 4))

    def paid_until(self, created_at: float, now: float) -> float:
        """The end of the hour the machine is in at ``now`` (each started hour is paid)."""
        return created_at + (math.floor(max(now - created_at, 0.0) / self.hour) + 1) * self.hour

    def drain_due(self, created_at: float, now: float) -> bool:
        """An idle surplus machine goes now: its paid hour ends within the margin."""
        return self.paid_until(created_at, now) - now <= self.margin


def machine_euros(price: Price, seconds: float) -> float:
    """What one machine that existed for ``seconds`` costs: per started hour, never more than
    the monthly price (for each 30 days of its life)."""
    if seconds <= 0:
        return 0.0
    months, rest = divmod(seconds, MONTH)
    euros = months * price.monthly
    if rest > 0:
        euros += min(price.monthly, billed_hours(rest) * price.hourly)
    return euros


def snapshot_euros(gigabytes: float, per_gb_month: float, seconds: float) -> float:
    """What ``gigabytes`` of snapshot kept for ``seconds`` cost at ``per_gb_month`` (net EUR
    a GB and month): per started hour at the month's 720th part, never more than the monthly
    price (for each 30 days)."""
    monthly = gigabytes * per_gb_month
    return machine_euros(Price(monthly * HOUR / MONTH, monthly), seconds)


def idle_euros(bill: float, lifetime: float, idle_seconds: float) -> float:
    """The share of ``bill`` spent with no job on the machine."""
    if lifetime <= 0:
        return 0.0
    return bill * min(max(idle_seconds, 0.0), lifetime) / lifetime


def price_of(
    server_type: str,
    overrides: Mapping[str, Price] | None = None,
    provider: str = "hetzner",
    location: str | None = None,
) -> Price:
    """The price of ``server_type`` (an override first, then its price at ``location`` when
    one is given and priced there); free for local and docker machines."""
    if provider != "hetzner":
        return Price(0.0, 0.0, f"{provider} machines run on hardware already paid for")
    if overrides and server_type in overrides:
        return overrides[server_type]
    kind = SERVER_TYPES.get(server_type)
    there = kind.price_at(location) if kind is not None and location is not None else None
    if there is not None:
        return _price(there)
    table = {**HETZNER_PRICES, **(overrides or {})}
    try:
        return table[server_type]
    except KeyError:
        known = ", ".join(sorted(table))
        raise UnknownPrice(
            f"no price for server type {server_type!r} (known: {known}); give one with "
            f"--price {server_type}=HOURLY/MONTHLY"
        ) from None


def parse_price(text: str) -> tuple[str, Price]:
    """``TYPE=HOURLY/MONTHLY`` (EUR), e.g. ``cpx42=0.0304/18.99``."""
    server_type, _, amounts = text.partition("=")
    hourly, _, monthly = amounts.partition("/")
    try:
        price = Price(float(hourly), float(monthly), "given on the command line")
    except ValueError:
        raise ValueError(
            f"price {text!r}: write TYPE=HOURLY/MONTHLY in EUR, e.g. cx33=0.0104/6.49"
        ) from None
    if not server_type or price.hourly < 0 or price.monthly < 0:
        raise ValueError(f"price {text!r}: write TYPE=HOURLY/MONTHLY in EUR, e.g. cx33=0.0104/6.49")
    return server_type, price


@dataclass(frozen=True, slots=True)
class PoolBill:
    """What a pool's machines cost: the billing rule applied to each one's recorded life."""

    machines: int
    machine_seconds: float
    euros: float
    idle_euros: float  # the share spent with no job running
    jobs: int  # jobs the pool finished (success or failed)

    @property
    def euros_per_job(self) -> float | None:
        return self.euros / self.jobs if self.jobs else None

    def as_json(self) -> dict[str, float | int | None]:
        per_job = self.euros_per_job
        return {
            "machines": self.machines,
            "machine_hours": round(self.machine_seconds / HOUR, 4),
            "euros": round(self.euros, 4),
            "idle_euros": round(self.idle_euros, 4),
            "jobs": self.jobs,
            "euros_per_job": None if per_job is None else round(per_job, 6),
        }


def pool_bill(price: Price, lives: Iterable[tuple[float, float]], jobs: int = 0) -> PoolBill:
    """The bill of a pool whose machines lived ``(seconds, busy seconds)`` each: every machine
    billed on its own (per started hour, capped monthly), idle euros its share with no job."""
    count, seconds, euros, idle = 0, 0.0, 0.0, 0.0
    for lifetime, busy in lives:
        bill = machine_euros(price, lifetime)
        count += 1
        seconds += lifetime
        euros += bill
        idle += idle_euros(bill, lifetime, lifetime - busy)
    return PoolBill(count, seconds, euros, idle, jobs)
