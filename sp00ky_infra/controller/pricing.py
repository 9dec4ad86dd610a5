"""Hetzner's prices, read from its API and kept in the store: the leader's tick's step.

With HCLOUD_TOKEN set (whatever provisions the pools: the price is what the same machine time
costs on Hetzner), the leader reads GET /pricing at its first tick and then every day, off
the tick's thread: a slow or failing API never holds the tick up. A reading is kept in the
store (``store/prices.py``) with the day it was read, so a controller restarted without the
API prices its pools as of the last reading; ``costs.py`` says which price wins.

A failed reading (the API down or refusing, an answer in another currency) keeps the last
prices, is logged as a warning and is tried again an hour later. It is tried once each time
(the client's retries would only hold a thread while the last prices serve).
"""

from __future__ import annotations

import logging
import os
import threading
import weakref

from sp00ky_infra.controller.core import Controller
from sp00ky_infra.hetzner import HetznerAPI
from sp00ky_infra.hetzner.domain import Pricing
from sp00ky_infra.store.prices import PriceReading, PriceTable

log = logging.getLogger("sp00ky.controller")

READ_EVERY = 24 * 3600.0  # Hetzner changes prices rarely, and announces it weeks ahead
RETRY_AFTER = 3600.0  # after a failed reading
CURRENCY = "EUR"  # what the costs are shown in


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


def reading_of(pricing: Pricing, now: float) -> PriceReading:
    """What the store keeps of GET /pricing's answer; ValueError for an answer that would
    price nothing or price in another currency than the costs'."""
    if pricing.currency != CURRENCY:
        raise ValueError(
            f"GET /pricing answered prices in {pricing.currency}, not {CURRENCY}: "
            "give prices in EUR under `prices:` in sp00ky.yml"
        )
    if not pricing.server_types:
        raise ValueError("GET /pricing answered no server type's price")
    return PriceReading(now, pricing.server_types, pricing.primary_ipv4)


def maybe_refresh_prices(controller: Controller, now: float) -> None:
    """Start a reading of Hetzner's prices in a thread of its own, when one is due."""
    if not os.environ.get("HCLOUD_TOKEN"):
        return
    refresh = price_refresh(controller)
    if not refresh.due(now):
        return

    def read() -> None:
        try:
            api = HetznerAPI.from_env(clock=controller.clock, max_tries=1)
            reading = reading_of(api.pricing(), now)
            PriceTable(controller.store).save(reading)
        except Exception as exc:  # logged; the last prices stay, and an hour later, again
            refresh.next_at = now + RETRY_AFTER
            log.warning(
                "reading Hetzner's prices (GET /pricing) failed; the last prices stay, and it "
                "is tried again in an hour: %s",
                exc,
            )
            return
        refresh.next_at = now + READ_EVERY
        log.info("event=prices_read server_types=%d", len(reading.server_types))

    refresh.thread = threading.Thread(target=read, name="prices", daemon=True)
    refresh.thread.start()
