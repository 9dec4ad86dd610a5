"""What a pool's machines cost, read from their rows; the rule and the prices are
``policy/cost.py``'s (Hetzner's dated table, overridden by sp00ky.yml's ``prices``).

Every pool is priced as the Hetzner server type it declares (``machine.type``), whatever runs
its machines: on ``dev``'s local processes and on Docker this is what the same machine time
would have cost on Hetzner, which is the figure worth seeing before going there.
"""

from __future__ import annotations

from collections.abc import Mapping

from sp00ky_infra.config import Config
from sp00ky_infra.policy.cost import PoolBill, Price, UnknownPrice, pool_bill, price_of
from sp00ky_infra.store import SqlStore


def pool_price(config: Config, pool: str) -> Price:
    """The pool's server type's price (sp00ky.yml's ``prices`` first); a type with no known
    price costs nothing, and its source says so."""
    server_type = config.pools[pool].machine.type
    try:
        return price_of(server_type, config.prices, "hetzner")
    except UnknownPrice as exc:
        return Price(0.0, 0.0, f"{exc}; add it under `prices:` in sp00ky.yml")


def pool_cost(
    store: SqlStore,
    config: Config,
    pool: str,
    table: str,
    now: float,
    counts: Mapping[str, int] | None = None,
) -> PoolBill:
    """The pool's bill at ``now``: every machine it ever had, live ones up to ``now``.
    ``counts`` are the table's jobs by status (``store.counts``), if the caller has read
    them already (a read walks the whole backlog)."""
    lives = [(life.seconds(now), life.busy(now)) for life in store.machines.lifetimes(pool)]
    if counts is None:
        counts = store.counts(table=table)
    return pool_bill(pool_price(config, pool), lives, counts["success"] + counts["failed"])
