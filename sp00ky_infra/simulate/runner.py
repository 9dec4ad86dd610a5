"""One pool of a sp00ky.yml through the simulator: settings (and overrides) in, a Report out.

A pool on Hetzner that boots a snapshot (``machine.image``: a snapshot id, a label selector of
snapshots, or ``baked``) also pays for keeping it, at the dated price of a GB a month
(``policy/server_types.py``). Its size is ``snapshotGigabytes`` when given (``sp00ky-infra
image bake`` and ``pools get`` show the real one); else it is assumed to be the server type's
disk, the most a snapshot of that disk can hold (GET /images' ``image_size`` is the compressed
data saved, never more than its ``disk_size``): an upper bound, never an underestimate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sp00ky_infra.config.durations import parse_duration
from sp00ky_infra.config.machine_images import image_kind
from sp00ky_infra.config.model import Config, Pool
from sp00ky_infra.policy.breaker import FIRST_PAUSE_SECONDS, MAX_PAUSE_SECONDS
from sp00ky_infra.policy.cost import Billing, Price
from sp00ky_infra.policy.server_types import SERVER_TYPES, SNAPSHOT_GB_MONTHLY
from sp00ky_infra.simulate.engine import Outcome, simulate
from sp00ky_infra.simulate.model import PolicyPool
from sp00ky_infra.simulate.providers import ProviderModel
from sp00ky_infra.simulate.report import Report, Snapshot, report
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
SNAPSHOT_GB = "snapshotGigabytes"  # the size of the snapshot the pool boots, not a pool field
SNAPSHOT_FIELD = "snapshot_gigabytes"
SETTINGS = (*INTS, *DURATIONS, *FLAGS, SNAPSHOT_GB)
BAKED = "baked"  # machine.image's value that boots the pool's baked snapshot


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
    if key == SNAPSHOT_GB:
        return SNAPSHOT_FIELD, _gigabytes(text)
    raise SettingError(f"{key}: the simulator varies {', '.join(SETTINGS)}")


def _gigabytes(text: str) -> float:
    try:
        size = float(text)
    except ValueError:
        size = -1.0
    if not size >= 0:
        raise SettingError(f"{SNAPSHOT_GB}={text}: a size in GB, 0 or more, e.g. 2.5")
    return size


def _given(gigabytes: float) -> str:
    return f"{SNAPSHOT_GB}={gigabytes:g}"


def boots_snapshot(image: str) -> bool:
    """Whether ``machine.image`` names a snapshot: an id, a label selector, or ``baked``."""
    return image == BAKED or image_kind(image) in ("id", "selector")


def booted_snapshot(pool: Pool, provider: str, gigabytes: float | None) -> Snapshot | None:
    """The snapshot a pool on Hetzner boots, ``gigabytes`` large when given, else as large as
    its server type's disk (the module docstring); None for a pool that boots none."""
    if provider != "hetzner" or not boots_snapshot(pool.machine.image):
        return None
    price = SNAPSHOT_GB_MONTHLY.monthly
    if gigabytes is not None:
        return Snapshot(gigabytes, price, _given(gigabytes))
    kind = SERVER_TYPES.get(pool.machine.type)
    if kind is None or not kind.disk:
        raise SettingError(
            f"pool {pool.name} boots a snapshot of unknown size: give --set {SNAPSHOT_GB}=N "
            "(`sp00ky-infra image bake` prints it)"
        )
    return Snapshot(float(kind.disk), price, f"at most {kind.name}'s {kind.disk} GB disk")


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
    snapshot: Snapshot | None = None  # the snapshot the pool boots, kept the whole window

    def changed(self, changes: Mapping[str, Any]) -> Run:
        """The run with ``changes`` (model field names): the pool's settings, and the size of
        the snapshot it boots (if it boots one)."""
        settings = {key: value for key, value in changes.items() if key != SNAPSHOT_FIELD}
        run = replace(self, pool=with_settings(self.pool, settings))
        gigabytes = changes.get(SNAPSHOT_FIELD)
        if gigabytes is None or run.snapshot is None:
            return run
        given = replace(run.snapshot, gigabytes=gigabytes, source=_given(gigabytes))
        return replace(run, snapshot=given)

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
        return report(self.pool.name, self.outcome(), self.price, window, self.snapshot)


def pool_run(
    config: Config,
    pool_name: str,
    arrivals: Sequence[Arrival],
    provider: ProviderModel,
    price: Price,
    changes: Mapping[str, Any] | None = None,
    **options: Any,
) -> Run:
    changes = changes or {}
    pool = config.pools[pool_name]
    backend = config.backend_for(pool_name)
    concurrency = backend.method.concurrency if backend.method else None
    own = [a for a in arrivals if a.backend in (None, backend.name)]
    # billed by the provider sp00ky.yml declares, whatever boot model is simulated
    snapshot = booted_snapshot(pool, pool.provider, changes.get(SNAPSHOT_FIELD))
    return Run(pool, own, provider, price, concurrency, snapshot=snapshot, **options).changed(
        changes
    )
