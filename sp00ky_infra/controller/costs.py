"""What a pool's machines cost, read from their rows; the billing rule is ``policy/cost.py``'s.

A pool's price, first found first:

1. sp00ky.yml's ``prices`` for its server type;
2. Hetzner's own, as last read from its API (GET /pricing, kept in the store by
   ``pricing.py``): the type's net price plus its primary IPv4's, at the same location;
3. the dated table (``policy/server_types.py``).

The rule, the same in ``pools get``, ``/metrics``, ``simulate`` and ``dev``'s summary: a pool
costs what the provider sp00ky.yml declares for it charges. A ``hetzner`` pool is priced as the
server type it declares (``machine.type``), at its first location when it names some,
wherever its machines run: on ``dev``'s local processes or Docker (and under
SPKY_POOL_PROVIDER) this is what the same machine time would cost on Hetzner, the figure worth
seeing before going there. A ``docker`` pool runs on hardware already paid for: 0 EUR. A
hetzner pool's type with no known price is never shown as free: its euros are unknown (None),
with how to give a price.

The primary IPv4: every server this project makes on Hetzner gets one (``infra/machine.py``
creates servers with the API's default public network, and the configuration has no way to
turn it off), so the API's price includes it. Its hourly and monthly prices are added to the
server's, and the billing rule applied to the sum (so the monthly cap is the two caps'
sum). The dated table has no hourly price for it, and stays the server's alone.

Snapshots: a pool that boots a snapshot pays for it too, per GB and month for as long as it
exists. Its snapshots as last listed (``pricing.py``, kept in the store) are shown beside the
machines' bill (``snapshots``: count, GB, euros a month, euros so far, and the day read), and
``total_euros`` is the two together: the machines' bill and what the snapshots the pool has
now cost since each was made. Snapshots never listed are unknown (None), and so is the total.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sp00ky_infra.config import Config
from sp00ky_infra.policy.cost import PoolBill, Price, pool_bill, price_of
from sp00ky_infra.policy.server_types import PREFERENCE, SERVER_TYPES, LocationPrice
from sp00ky_infra.store import SqlStore
from sp00ky_infra.store.machines import Lifetime
from sp00ky_infra.store.prices import PriceReading, PriceTable
from sp00ky_infra.store.snapshots import SnapshotReading, SnapshotTable

FREE = Price(0.0, 0.0)  # only to count machine-hours and jobs when the euros are unknown
WITH_IPV4 = "with its primary IPv4"  # said in an API price's source, when it is included


@dataclass(frozen=True, slots=True)
class PoolPrice:
    """A pool's price, and the day it dates from (None: sp00ky.yml's, which has no date)."""

    price: Price
    date: str | None = None

    def as_json(self) -> dict[str, Any]:
        price = self.price
        return {
            "hourly": price.hourly, "monthly": price.monthly, "source": price.source,
            "date": self.date,
        }  # fmt: skip


def cached_prices(store: SqlStore, config: Config) -> PriceReading | None:
    """The last reading of Hetzner's prices the store keeps, for the pools' server types."""
    return PriceTable(store).read({pool.machine.type for pool in config.pools.values()})


def _rank(price: LocationPrice) -> int:
    return PREFERENCE.index(price.location) if price.location in PREFERENCE else len(PREFERENCE)


def _at(prices: Sequence[LocationPrice], location: str | None) -> LocationPrice | None:
    """The price at ``location`` when there is one, else at the first location of PREFERENCE
    that has one (as the table's prices stand for a type)."""
    there = [p for p in prices if p.location == location]
    return there[0] if there else min(prices, key=_rank, default=None)


def _dated(entry: LocationPrice, ipv4: LocationPrice | None = None) -> PoolPrice:
    """``entry`` (plus ``ipv4``'s price when given) as a pool's price, sourced and dated."""
    hourly, monthly = entry.hourly, entry.monthly
    source = f"{entry.source}, {entry.location}, {entry.date}"
    if ipv4 is not None:
        # rounded: the sum of two 4-decimal prices, without a float's trailing digits
        hourly, monthly = round(hourly + ipv4.hourly, 10), round(monthly + ipv4.monthly, 10)
        source = f"{source}, {WITH_IPV4}"
    return PoolPrice(Price(hourly, monthly, source), entry.date)


def _api_price(listed: PriceReading, server_type: str, location: str | None) -> PoolPrice | None:
    entry = _at(listed.server_types.get(server_type, ()), location)
    if entry is None:
        return None
    ipv4 = next((p for p in listed.primary_ipv4 if p.location == entry.location), None)
    return _dated(entry, ipv4)


def _table_price(server_type: str, location: str | None) -> PoolPrice | None:
    kind = SERVER_TYPES.get(server_type)
    entry = None if kind is None else kind.price_at(location) or kind.price_at()
    return None if entry is None else _dated(entry)


def priced(config: Config, pool: str, listed: PriceReading | None) -> PoolPrice | str:
    """The pool's price (nothing for a pool whose declared provider is not hetzner; else
    sp00ky.yml's, else the API's as last read, ``listed``, else the dated table's), or why
    there is none and how to give one."""
    declared = config.pools[pool]
    machine = declared.machine
    if declared.provider != "hetzner":
        return PoolPrice(price_of(machine.type, provider=declared.provider))
    location = machine.locations[0] if machine.locations else None
    if machine.type in config.prices:
        return PoolPrice(config.prices[machine.type])
    found = _api_price(listed, machine.type, location) if listed is not None else None
    found = found or _table_price(machine.type, location)
    if found is not None:
        return found
    return (
        f"no price is known for server type {machine.type!r}; give one under `prices:` "
        f"in sp00ky.yml, e.g. `prices: {{{machine.type}: {{hourly: 0.0104, monthly: 6.49}}}}`"
    )


def pool_price(config: Config, pool: str, listed: PriceReading | None) -> PoolPrice | None:
    """``priced``'s price; None: not known."""
    found = priced(config, pool, listed)
    return found if isinstance(found, PoolPrice) else None


def pool_cost(
    store: SqlStore,
    config: Config,
    pool: str,
    table: str,
    now: float,
    counts: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The pool's bill at ``now`` (every machine it ever had, live ones up to ``now``) with
    the price it was computed at; with no known price the euros and the price are None and
    ``price_unknown`` says how to give one. ``counts`` are the table's jobs by status
    (``store.counts``), if the caller has read them already (a read walks the whole
    backlog)."""
    if counts is None:
        counts = store.counts(table=table)
    jobs = counts["success"] + counts["failed"]
    shown = lifetimes_cost(store, config, pool, store.machines.lifetimes(pool), now, jobs)
    return with_snapshots(shown, SnapshotTable(store).read(), pool, now)


def lifetimes_cost(
    store: SqlStore, config: Config, pool: str, lifetimes: Iterable[Lifetime], now: float, jobs: int
) -> dict[str, Any]:
    """The bill of some of the pool's machines (``lifetimes``, live ones up to ``now``) over
    ``jobs`` finished jobs, at the pool's price (``cost_json``'s answer)."""
    lives = [(life.seconds(now), life.busy(now)) for life in lifetimes]
    found = priced(config, pool, cached_prices(store, config))
    price = found.price if isinstance(found, PoolPrice) else FREE
    return cost_json(config, pool, pool_bill(price, lives, jobs), found)


def cost_json(config: Config, pool: str, bill: PoolBill, found: PoolPrice | str) -> dict[str, Any]:
    """``bill`` with the price it was computed at (``priced``'s answer)."""
    shown: dict[str, Any] = {**bill.as_json(), "server_type": config.pools[pool].machine.type}
    if isinstance(found, PoolPrice):
        return {**shown, "price": found.as_json()}
    return {
        **shown, "euros": None, "idle_euros": None, "euros_per_job": None, "price": None,
        "price_unknown": found,
    }  # fmt: skip


def with_snapshots(
    cost: dict[str, Any], listed: SnapshotReading | None, pool: str, now: float
) -> dict[str, Any]:
    """``cost`` (``cost_json``'s) with the pool's snapshots as last ``listed``, the machines'
    euros named apart, and the two together (None when either is unknown)."""
    snapshots = None if listed is None else listed.pool(pool).as_json(now)
    machines = cost["euros"]
    both = None if snapshots is None or machines is None else machines + snapshots["euros"]
    return {
        **cost, "machine_euros": machines, "snapshots": snapshots,
        "total_euros": None if both is None else round(both, 4),
    }  # fmt: skip
