"""One pool of a sp00ky.yml through the simulator: settings (and overrides) in, a Report out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sp00ky_infra.config.durations import parse_duration
from sp00ky_infra.config.model import Config, Pool
from sp00ky_infra.policy.breaker import FIRST_PAUSE_SECONDS, MAX_PAUSE_SECONDS
from sp00ky_infra.policy.cost import Billing, Price
from sp00ky_infra.simulate.engine import Outcome, simulate
from sp00ky_infra.simulate.model import PolicyPool
from sp00ky_infra.simulate.providers import ProviderModel
from sp00ky_infra.simulate.report import Report, report
from sp00ky_infra.simulate.workload import Arrival

# The pool settings a sweep may vary: sp00ky.yml's name -> (the model's field, its parser).
INTS = ("min", "max", "buffer", "slots")
DURATIONS = {
    "idleTimeout": "idle_timeout",
    "maxLifetime": "max_lifetime",
    "bootTimeout": "boot_timeout",
    "queueTimeout": "queue_timeout",
}
FLAGS = {"packJobs": "pack_jobs", "keepPaidHours": "keep_paid_hours"}
SETTINGS = (*INTS, *DURATIONS, *FLAGS)


class SettingError(ValueError):
    """A pool setting the simulator cannot vary, or a value it cannot read."""


def setting(key: str, text: str) -> tuple[str, Any]:
    """(the model's field, the value) for ``key=text`` as written in sp00ky.yml."""
    if key in INTS:
        try:
            return key, int(text)
        except ValueError:
            raise SettingError(f"{key}={text}: {key} is a whole number") from None
    if key in FLAGS:
        if text.lower() not in ("true", "false"):
            raise SettingError(f"{key}={text}: {key} is true or false")
        return FLAGS[key], text.lower() == "true"
    if key in DURATIONS:
        try:
            return DURATIONS[key], parse_duration(text)
        except ValueError as exc:
            raise SettingError(f"{key}={text}: {exc}") from None
    raise SettingError(f"{key}: the simulator varies {', '.join(SETTINGS)}")


def with_settings(pool: Pool, changes: Mapping[str, Any]) -> Pool:
    """The pool with ``changes`` (model field names); setting max makes it autoscale."""
    changed = replace(pool, **changes)
    if "max" in changes and not changed.autoscale:
        changed = replace(changed, autoscale=True)
    return changed


@dataclass(frozen=True, slots=True)
class Run:
    """Everything one simulation of one pool needs."""

    pool: Pool
    arrivals: Sequence[Arrival]
    provider: ProviderModel
    price: Price
    concurrency: int | None = None
    tick: float = 2.0
    window: float = 0.0
    seed: int = 0
    breaker_first_pause: float = FIRST_PAUSE_SECONDS
    breaker_max_pause: float = MAX_PAUSE_SECONDS

    def outcome(self) -> Outcome:
        pool = self.pool
        decisions = PolicyPool(
            pool.name,
            pool,
            queue_timeout=pool.queue_timeout,
            max_queued=pool.max_queued,
            concurrency=self.concurrency,
            breaker_first_pause=self.breaker_first_pause,
            breaker_max_pause=self.breaker_max_pause,
            billing=self.billing(),
        )
        return simulate(
            decisions,
            self.arrivals,
            self.provider,
            pool.slots,
            pool.recycle,
            self.tick,
            self.window,
            self.seed,
        )

    def billing(self) -> Billing | None:
        """How the provider bills the pool's machines (None: they cost nothing)."""
        provider = self.provider
        if provider.billing_hour is None:
            return None
        return Billing.of(provider.name, self.tick, provider.billing_hour)

    def report(self, window: float = 0.0) -> Report:
        """The run's report, its euros over ``window`` (at least the run's own span)."""
        return report(self.pool.name, self.outcome(), self.price, window)


def pool_run(
    config: Config,
    pool_name: str,
    arrivals: Sequence[Arrival],
    provider: ProviderModel,
    price: Price,
    changes: Mapping[str, Any] | None = None,
    **options: Any,
) -> Run:
    pool = with_settings(config.pools[pool_name], changes or {})
    backend = config.backend_for(pool_name)
    concurrency = backend.method.concurrency if backend.method else None
    own = [a for a in arrivals if a.backend in (None, backend.name)]
    return Run(pool, own, provider, price, concurrency, **options)
