"""What a pool's machines cost, read from their rows; the rule and the prices are
``policy/cost.py``'s (the server types' dated prices, overridden by sp00ky.yml's ``prices``).

Every pool is priced as the Hetzner server type it declares (``machine.type``), at its first
location when it names some, whatever runs its machines: on ``dev``'s local processes and on
Docker this is what the same machine time would have cost on Hetzner, which is the figure worth
seeing before going there. A type with no known price is never shown as free: its euros are
unknown (None), with how to give a price.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sp00ky_infra.config import Config
from sp00ky_infra.policy.cost import PoolBill, Price, UnknownPrice, pool_bill, price_of
from sp00ky_infra.store import SqlStore

FREE = Price(0.0, 0.0)  # only to count machine-hours and jobs when the euros are unknown


def _priced(config: Config, pool: str) -> Price | str:
    """The pool's price, or why there is none and how to give one."""
    machine = config.pools[pool].machine
    location = machine.locations[0] if machine.locations else None
    try:
        return price_of(machine.type, config.prices, "hetzner", location)
    except UnknownPrice:
        return (
            f"no price is known for server type {machine.type!r}; give one under `prices:` "
            f"in sp00ky.yml, e.g. `prices: {{{machine.type}: {{hourly: 0.0104, monthly: 6.49}}}}`"
        )


def pool_price(config: Config, pool: str) -> Price | None:
    """The pool's server type's price (sp00ky.yml's ``prices`` first); None: not known."""
    found = _priced(config, pool)
    return found if isinstance(found, Price) else None


def pool_cost(
    store: SqlStore,
    config: Config,
    pool: str,
    table: str,
    now: float,
    counts: Mapping[str, int] | None = None,
) -> PoolBill:
    """The pool's bill at ``now``: every machine it ever had, live ones up to ``now`` (its
    euros are 0 when the price is unknown: ``cost_json`` says unknown instead).
    ``counts`` are the table's jobs by status (``store.counts``), if the caller has read
    them already (a read walks the whole backlog)."""
    lives = [(life.seconds(now), life.busy(now)) for life in store.machines.lifetimes(pool)]
    if counts is None:
        counts = store.counts(table=table)
    price = pool_price(config, pool) or FREE
    return pool_bill(price, lives, counts["success"] + counts["failed"])


def cost_json(config: Config, pool: str, bill: PoolBill) -> dict[str, Any]:
    """``bill`` (``pool_cost``'s) with the price it was computed at; with no known price the
    euros and the price are None and ``price_unknown`` says how to give one."""
    found = _priced(config, pool)
    shown: dict[str, Any] = {**bill.as_json(), "server_type": config.pools[pool].machine.type}
    if isinstance(found, Price):
        return {
            **shown,
            "price": {"hourly": found.hourly, "monthly": found.monthly, "source": found.source},
        }
    return {
        **shown, "euros": None, "idle_euros": None, "euros_per_job": None, "price": None,
        "price_unknown": found,
    }  # fmt: skip
