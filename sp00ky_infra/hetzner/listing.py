"""One listing of servers answers the reads of many: a ``pulumi refresh`` reads every machine
of the stack, and ``GET /servers?label_selector=`` (a request a 50 servers) costs less than
one ``GET /servers/{id}`` each.

A listing is kept ``ttl`` seconds per (endpoint, selector), in the process that made it. The
Pulumi engine runs the dynamic providers of one update in one provider host process, its
reads on threads of that process, so a listing there serves that update's reads and no later
update's (the next one is another process). A server not in the listing is read by id, so a
listing never hides a server it does not show.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from sp00ky_infra.hetzner.client import HetznerAPI
from sp00ky_infra.hetzner.domain import Server

LISTING_SECONDS = 30.0  # far longer than a refresh's reads, far shorter than between updates


class Listings:
    def __init__(
        self, ttl: float = LISTING_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl = ttl
        self.clock = clock
        self._lock = threading.Lock()  # the reads that come at once wait for one listing
        self._kept: dict[tuple[str, str], tuple[float, dict[int, Server]]] = {}

    def server(self, api: HetznerAPI, selector: str, server_id: int | str) -> Server | None:
        """The server as the selector's listing has it; None when the listing lacks it."""
        key = (api.endpoint, selector)
        with self._lock:
            kept = self._kept.get(key)
            if kept is None or self.clock() - kept[0] > self.ttl:
                listed = {each.id: each for each in api.servers(label_selector=selector)}
                kept = self._kept[key] = (self.clock(), listed)
        return kept[1].get(int(server_id))
