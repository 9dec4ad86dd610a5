"""One answer for many asks: a ``pulumi refresh`` reads every machine of the stack, and one
``GET /servers?label_selector=`` (a request a 50 servers) costs less than a ``GET
/servers/{id}`` each; an update that makes several machines of a baked pool resolves their
snapshot selector once, not once a machine.

An answer is kept ``ttl`` seconds by key (the endpoint first), in the process that asked.
The Pulumi engine runs the dynamic providers of one update in one provider host process, the
resources' calls on threads of that process, so an answer kept there serves that update and
no later one (the next update is another process). A server not in the listing is read by
id, so a listing never hides a server it does not show.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from sp00ky_infra.hetzner.client import HetznerAPI
from sp00ky_infra.hetzner.domain import Server

KEPT_SECONDS = 30.0  # far longer than one update's calls, far shorter than between updates
T = TypeVar("T")


class Kept(Generic[T]):
    """Answers kept ``ttl`` seconds by key; those who ask at once wait for one answer."""

    def __init__(self, ttl: float = KEPT_SECONDS, clock: Callable[[], float] = time.monotonic):
        self.ttl = ttl
        self.clock = clock
        self._lock = threading.Lock()
        self._kept: dict[Hashable, tuple[float, T]] = {}

    def get(self, key: Hashable, ask: Callable[[], T]) -> T:
        with self._lock:
            kept = self._kept.get(key)
            if kept is None or self.clock() - kept[0] > self.ttl:
                kept = self._kept[key] = (self.clock(), ask())
            return kept[1]


class Listings:
    """Servers as one listing by label selector has them."""

    def __init__(self, ttl: float = KEPT_SECONDS) -> None:
        self._kept: Kept[dict[int, Server]] = Kept(ttl)

    def server(self, api: HetznerAPI, selector: str, server_id: int | str) -> Server | None:
        """The server as the selector's listing has it; None when the listing lacks it."""
        listed = self._kept.get(
            (api.endpoint, selector),
            lambda: {each.id: each for each in api.servers(label_selector=selector)},
        )
        return listed.get(int(server_id))
