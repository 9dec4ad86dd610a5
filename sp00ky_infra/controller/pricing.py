"""Hetzner's prices, read from its API and kept in the store: the leader's tick's step.

With HCLOUD_TOKEN set (whatever provisions the pools: the price is what the same machine time
costs on Hetzner), the leader reads GET /pricing at its first tick and then every day, off
the tick's thread: a slow or failing API never holds the tick up. A reading is kept in the
store (``store/prices.py``) with the day it was read, so a controller restarted without the
API prices its pools as of the last reading; ``costs.py`` says which price wins.

The same pass lists the project's snapshots (one GET /images: type snapshot, the project's
``sp00ky/role=snapshot`` label) and keeps each one's pool, size and creation with the price
of a GB a month the prices were read with (``store/snapshots.py``): what each pool's
snapshots cost. ``refresh_snapshots`` does that alone, for a bake that just made or deleted
one.

A failed reading (the API down or refusing, an answer in another currency) keeps the last
prices, or the last snapshots, is logged as a warning and is tried again an hour later. It
is tried once each time (the client's retries would only hold a thread while the last
reading serves).
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable
from typing import TypeVar

from sp00ky_infra.controller.core import Controller
from sp00ky_infra.hetzner import HetznerAPI
from sp00ky_infra.hetzner.domain import PRICING_SOURCE, Image, Pricing
from sp00ky_infra.shared import labels
from sp00ky_infra.store.dialect import Dialect
from sp00ky_infra.store.prices import PriceReading, PriceTable
from sp00ky_infra.store.snapshots import Snapshot, SnapshotReading, SnapshotTable

log = logging.getLogger("sp00ky.controller")

DEFAULT_PROJECT = "dev"  # the project whose labels an unnamed one's resources carry
READ_EVERY = 24 * 3600.0  # Hetzner changes prices rarely, and announces it weeks ahead
RETRY_AFTER = 3600.0  # after a failed reading
CURRENCY = "EUR"  # what the costs are shown in
T = TypeVar("T")


class PriceRefresh:
    """When the next reading is due (the controller's clock), and the one under way."""

    def __init__(self) -> None:
        self.next_at = float("-inf")  # due at the first tick
        self.thread: threading.Thread | None = None

    def due(self, now: float) -> bool:
        """True when no reading is under way and the next one's time has come."""
        running = self.thread is not None and self.thread.is_alive()
        return not running and now >= self.next_at

    def wait(self, timeout: float | None = None) -> None:
        """Until the reading under way (if any) has ended."""
        if self.thread is not None:
            self.thread.join(timeout)


_REFRESH: weakref.WeakKeyDictionary[Controller, PriceRefresh] = weakref.WeakKeyDictionary()


def price_refresh(controller: Controller) -> PriceRefresh:
    return _REFRESH.setdefault(controller, PriceRefresh())


def _in_euros(pricing: Pricing) -> Pricing:
    """``pricing``, or ValueError when its prices are in another currency than the costs'."""
    if pricing.currency != CURRENCY:
        raise ValueError(
            f"GET /pricing answered prices in {pricing.currency}, not {CURRENCY}: "
            "give prices in EUR under `prices:` in sp00ky.yml"
        )
    return pricing


def reading_of(pricing: Pricing, now: float) -> PriceReading:
    """What the store keeps of GET /pricing's answer; ValueError for an answer that would
    price nothing or price in another currency than the costs'."""
    _in_euros(pricing)
    if not pricing.server_types:
        raise ValueError("GET /pricing answered no server type's price")
    return PriceReading(now, pricing.server_types, pricing.primary_ipv4)


def snapshots_selector(project: str) -> str:
    """The label selector of every snapshot of the project, whatever its pool."""
    return labels.selector({labels.PROJECT: project, labels.ROLE: "snapshot"})


def snapshot_reading(images: list[Image], pricing: Pricing, now: float) -> SnapshotReading:
    """What the store keeps of the project's snapshots (``images``, GET /images' answer) at
    ``pricing``'s price of a GB a month; a snapshot with no pool label is no pool's."""
    snapshots = tuple(
        Snapshot(image.id, image.labels[labels.POOL], image.image_size, image.created)
        for image in images
        if image.type == "snapshot" and image.labels.get(labels.POOL)
    )
    price = _in_euros(pricing).image_per_gb_month
    return SnapshotReading(now, pricing.date, price, PRICING_SOURCE, snapshots)


def keep_snapshots(
    store: Dialect, api: HetznerAPI, project: str, pricing: Pricing, now: float
) -> SnapshotReading:
    """List the project's snapshots and keep them at ``pricing``'s price of a GB a month."""
    images = api.images(snapshots_selector(project), type="snapshot")
    reading = snapshot_reading(images, pricing, now)
    SnapshotTable(store).save(reading)
    return reading


def refresh_snapshots(store: Dialect, api: HetznerAPI, project: str, now: float) -> SnapshotReading:
    """List the project's snapshots and keep them, with GET /pricing's price of a GB a month:
    for the bake, right after it made or deleted one. Raises what the API raised (the last
    reading then stays)."""
    return keep_snapshots(store, api, project, api.pricing(), now)


def _attempt(read: Callable[[], T], failed: str) -> T | None:
    """``read()``'s answer; None when it raised, logged as ``failed`` (the last reading stays,
    and the pass is tried again an hour later)."""
    try:
        return read()
    except Exception as exc:  # logged; the last reading stays, and an hour later, again
        log.warning("%s, and it is tried again in an hour: %s", failed, exc)
        return None


def _read(controller: Controller, now: float) -> bool:
    """GET /pricing and the project's snapshots, each kept; False when either failed."""
    api = HetznerAPI.from_env(clock=controller.clock, max_tries=1, caller="prices")
    store, project = controller.store, controller.settings.project or DEFAULT_PROJECT

    def prices() -> Pricing:
        pricing = api.pricing()
        PriceTable(store).save(reading_of(pricing, now))
        return pricing

    pricing = _attempt(prices, "reading Hetzner's prices (GET /pricing) failed; the last "
                               "prices stay")  # fmt: skip
    if pricing is None:
        return False
    log.info("event=prices_read server_types=%d", len(pricing.server_types))
    listed = _attempt(
        lambda: keep_snapshots(store, api, project, pricing, now),
        f"listing project {project}'s snapshots (GET /images) failed; the last reading stays",
    )
    if listed is None:
        return False
    log.info("event=snapshots_read snapshots=%d", len(listed.snapshots))
    return True


def maybe_refresh_prices(controller: Controller, now: float) -> None:
    """Start a reading of Hetzner's prices and of the project's snapshots in a thread of its
    own, when one is due."""
    if not os.environ.get("HCLOUD_TOKEN"):
        return
    refresh = price_refresh(controller)
    if not refresh.due(now):
        return

    def read() -> None:
        refresh.next_at = now + (READ_EVERY if _read(controller, now) else RETRY_AFTER)

    refresh.thread = threading.Thread(target=read, name="prices", daemon=True)
    refresh.thread.start()
