"""What a controller acts on, each part with one owner and one source.

- ``Deployment``: the configuration (pools, their backends, their images as settled at start,
  and revisions); frozen, replaced whole when a configuration is loaded.
- ``PoolStates``: each pool's pause flag and breaker, as the store has them. The store is the
  truth: every change is written there first. They are reloaded whenever this controller gains
  leadership, because another leader may have paused a pool or opened a breaker meanwhile.
- ``EventLog``: the recent events the admin API and ``dev`` show.
- ``Wake``: whom to wake when something changes (the hub's waiting long-polls, once serving).
- ``Periodic``: the tick's own schedules (pruning, the guardian's heartbeat).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from sp00ky_infra.config import Backend, Config, Pool
from sp00ky_infra.controller.images import PoolImage
from sp00ky_infra.policy.breaker import Breaker
from sp00ky_infra.store import SqlStore
from sp00ky_infra.store.machines import PoolState

MAX_EVENTS = 200


@dataclass(frozen=True, slots=True)
class Deployment:
    """The pools a configuration declares, as this controller runs them."""

    config: Config
    pools: Mapping[str, Pool]
    backends: Mapping[str, Backend]
    revisions: Mapping[str, str]
    images: Mapping[str, PoolImage]  # by pool, when settled (images.settle_images)

    @classmethod
    def of(
        cls,
        config: Config,
        pool: Callable[[Pool], Pool],
        images: Mapping[str, PoolImage] | None = None,
    ) -> Deployment:
        """``pool`` applies the controller's settings (test timings) to each pool; each
        pool's settled image, if any, is pinned in its revision."""
        images = dict(images or {})
        pools = {name: pool(each) for name, each in config.pools.items()}
        backends = {name: config.backend_for(name) for name in pools}
        return cls(
            config=config,
            pools=pools,
            backends=backends,
            revisions={
                name: backends[name].revision(
                    each, images[name].reference if name in images else None
                )
                for name, each in config.pools.items()
            },
            images=images,
        )

    def table_of(self, pool: str) -> str:
        method = self.backends[pool].method
        assert method is not None, "lint guarantees a pool backend has an outbox table"
        return method.table


class PoolStates:
    """Pause flags and breakers: the store's, as last read or written by this controller."""

    def __init__(self, store: SqlStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._states: Mapping[str, PoolState] = {}
        self._held = False  # a draining stop: every pool takes nothing new, in memory only

    def hold(self) -> None:
        """A draining stop: no pool binds new work from now on (``paused``), without writing
        a pause to the store (the next controller starts with the pools as they were)."""
        self._held = True

    def reload(self, pools: Iterable[str]) -> None:
        """Read every pool's state from the store (on start, and when leadership is gained)."""
        states = {name: self._store.pools.state(name) for name in pools}
        with self._lock:
            self._states = states

    def get(self, pool: str) -> PoolState:
        with self._lock:
            return self._states.get(pool) or PoolState(pool)

    def paused(self, pool: str) -> bool:
        """Whether the pool binds no new work: paused in the store, or held by a stop."""
        return self._held or self.get(pool).paused

    def breaker(self, pool: str) -> Breaker:
        return self.get(pool).breaker

    def set_paused(self, pool: str, paused: bool, now: float) -> None:
        with self._lock:
            self._store.pools.set_paused(pool, paused, now)
            self._put(replace(self._states.get(pool) or PoolState(pool), paused=paused))

    def change_breaker(
        self, pool: str, change: Callable[[Breaker], Breaker], now: float
    ) -> tuple[Breaker, Breaker]:
        """Apply ``change`` to the pool's breaker (store first); returns (before, after)."""
        with self._lock:  # a tick's failed boot and an agent's good one may race
            state = self._states.get(pool) or PoolState(pool)
            after = change(state.breaker)
            if after != state.breaker:
                self._store.pools.save_breaker(pool, after, now)
                self._put(replace(state, breaker=after))
            return state.breaker, after

    def _put(self, state: PoolState) -> None:
        self._states = {**self._states, state.pool: state}


@dataclass(frozen=True, slots=True)
class Event:
    at: float
    pool: str
    kind: str  # scale_up, ready, drain, destroy, failed, breaker_open, breaker_closed, ...
    message: str
    id: int = 0  # the log's count when added: events of one instant stay told apart


class EventLog:
    def __init__(self, limit: int = MAX_EVENTS) -> None:
        self._events: deque[Event] = deque(maxlen=limit)
        self._lock = threading.Lock()
        self._added = 0

    def add(self, event: Event) -> None:
        with self._lock:
            self._added += 1
            self._events.append(replace(event, id=self._added))

    def recent(self, limit: int) -> list[Event]:
        with self._lock:
            return list(self._events)[-limit:]


class Notify(Protocol):
    def notify_machine(self, machine: str) -> None: ...
    def notify_pool(self, pool: str) -> None: ...
    def restand(self, machine: str, idle_since: float | None) -> None: ...


class Wake:
    """Wakes waiting long-polls through the hub it is attached to; nothing until then."""

    def __init__(self) -> None:
        self._hub: Notify | None = None

    def attach(self, hub: Notify) -> None:
        self._hub = hub

    def machine(self, name: str) -> None:
        if self._hub is not None:
            self._hub.notify_machine(name)

    def pool(self, name: str) -> None:
        if self._hub is not None:
            self._hub.notify_pool(name)

    def idle_clock(self, machine: str, since: float | None) -> None:
        """A machine's idle clock started or stopped: where its waiting poll stands in the
        order its pool offers work (``policy.placement``)."""
        if self._hub is not None:
            self._hub.restand(machine, since)


class Periodic:
    """Something the tick does every ``every`` seconds."""

    def __init__(self, every: float) -> None:
        self.every = every
        self._last = 0.0

    def due(self, now: float) -> bool:
        """True (and counted as done at ``now``) when ``every`` has passed since last time."""
        if now - self._last < self.every:
            return False
        self._last = now
        return True
