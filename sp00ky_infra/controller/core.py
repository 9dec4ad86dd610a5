"""The controller's state: its settings, store, provisioner and clock, the deployment, the
pools' states, the executor and the leadership. The agents' operations on it are in
``agents.py``.

Its errors (ControllerError and below, with their HTTP statuses) are in ``errors.py``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from sp00ky_infra.config import Backend, Config, Pool
from sp00ky_infra.controller.executor import Executor
from sp00ky_infra.controller.images import ImageServer, PoolImage
from sp00ky_infra.controller.measures import Measures
from sp00ky_infra.controller.provisioners import Provisioner
from sp00ky_infra.controller.settings import ControllerSettings
from sp00ky_infra.controller.state import (
    Deployment,
    Event,
    EventLog,
    Periodic,
    PoolStates,
    Wake,
)
from sp00ky_infra.controller.sweep import ServerSweep
from sp00ky_infra.policy.plan import Plan, PoolView
from sp00ky_infra.store import Job, SqlStore
from sp00ky_infra.store.capacity import KeptCapacity
from sp00ky_infra.store.machines import MachineNotFound
from sp00ky_infra.store.policies import TablePolicy, declared_policies

log = logging.getLogger("sp00ky.controller")


class Controller:
    """What the tick, the agents' endpoint and the admin API share: the ports (settings,
    store, provisioner, clock), the deployment, the pools' states and the executor, the one
    way machines change. Leadership is gained and lost in ``lead()``; gaining it reloads what
    another leader may have changed meanwhile."""

    deployment: Deployment

    def __init__(
        self,
        settings: ControllerSettings,
        config: Config,
        store: SqlStore,
        provisioner: Provisioner,
        clock: Callable[[], float] = time.time,
        images: Mapping[str, PoolImage] | None = None,
        image_server: ImageServer | None = None,
    ) -> None:
        self.settings = settings
        self.image_server = image_server  # serves the images it built (deploy.dockerfile)
        self.store = store
        self.provisioner = provisioner
        self.clock = clock
        self.leader_lock = store.leader_lock()
        self._leader = False
        self._resigned = False  # stopping: never lead again, whatever the lock says
        # called with True when this controller gains leadership, False when it loses it
        self.on_leadership: list[Callable[[bool], None]] = []
        self.events = EventLog()
        self.wake = Wake()
        self.pool_states = PoolStates(store)
        self.prune = Periodic(settings.prune_every)
        self.heartbeat = Periodic(settings.heartbeat_every)
        self.orphans = Periodic(settings.orphans_every)  # controller/orphans.py
        self.server_sweep = ServerSweep(settings.sweep_every, settings.sweep_grace)
        self.measures = Measures()
        self.plans: Mapping[str, Plan] = {}  # the last tick's, by pool (what /metrics shows)
        self.planned_views: Mapping[str, PoolView] = {}  # what each of those was made from
        self.policies: Mapping[str, TablePolicy] = {}  # by table, as read at the last tick
        self.capacities: Mapping[str, KeptCapacity] = {}  # by pool, as read at the last tick
        self.executor = Executor(
            settings, store, provisioner, self.pool_states, self.events, self.wake, self.measures
        )
        self.load(config, images)

    def load(self, config: Config, images: Mapping[str, PoolImage] | None = None) -> None:
        """Take a (new) configuration, with each pool's image as settled for it (pinned in the
        revisions). Pause flags live in the store: a deploy never un-pauses."""
        self.declared = Deployment.of(config, self.settings.pool, images)
        self.deployment = self.declared
        self.pool_states.reload(self.deployment.pools)
        written = self.store.policies.declare(declared_policies(config), self.clock())
        if written:
            log.info("event=job_policy tables=%s written from sp00ky.yml", ",".join(written))
        capacities = {name: pool.limit * pool.slots for name, pool in self.declared.pools.items()}
        for kept in self.store.capacities.declare(capacities, self.clock()):
            if kept.draining_from is not None:
                log.info("pool=%s event=capacity lowering from %d to %d slots: the jobs queued "
                         "now drain first, new ones are refused meanwhile", kept.pool,
                         kept.draining_from, kept.capacity)  # fmt: skip
        self.read_policies()
        self.read_capacities()

    def read_capacities(self) -> None:
        """Each pool's capacity as the store holds it: a pool that still drains the queue of
        a higher one is sized by that one (``widened``) until it has."""
        self.capacities = self.store.capacities.read()
        pools = {
            name: widened(pool, self.capacities.get(name))
            for name, pool in self.declared.pools.items()
        }
        self.deployment = replace(self.declared, pools=pools)

    def read_policies(self) -> None:
        """Each table's job policy as kept in the store (every tick: a live retune counts
        from the next one)."""
        self.policies = {table: kept.policy for table, kept in self.store.policies.read().items()}

    def concurrency_of(self, pool: str) -> int | None:
        """How many of the pool's table's jobs may run at once: the kept policy's."""
        kept = self.policies.get(self.table_of(pool))
        if kept is not None:
            return kept.concurrency
        method = self.backends[pool].method
        return method.concurrency if method else None

    @property
    def config(self) -> Config:
        return self.deployment.config

    @property
    def pools(self) -> Mapping[str, Pool]:
        return self.deployment.pools

    @property
    def backends(self) -> Mapping[str, Backend]:
        return self.deployment.backends

    @property
    def revisions(self) -> Mapping[str, str]:
        return self.deployment.revisions

    @property
    def leader(self) -> bool:
        return self._leader

    def lead(self) -> bool:
        """Take (or keep) the store's leadership if free. Gaining it reloads the pools' states
        (pause, breakers) and hands the provisioner the store's machines before anything acts:
        a failover never runs on the copy this controller read when it started."""
        was_leader = self._leader
        if self._resigned:
            return False
        try:
            leader = self.leader_lock.try_acquire()
            if leader and not was_leader:
                self.pool_states.reload(self.pools)
                self.executor.adopt()
        except Exception as exc:  # the store is unreachable: do nothing this tick
            leader = False
            log.warning("cannot reach the store for leadership: %s", exc)
        self._leader = leader
        if leader != was_leader:
            kind = "leader" if leader else "follower"
            self.event("*", kind, f"{self.settings.controller_id} is the {kind}")
            for hook in self.on_leadership:
                try:
                    hook(leader)
                except Exception:  # a hook (the state file) never costs the leadership
                    log.exception("leadership hook failed")
        return leader

    @property
    def resigned(self) -> bool:
        """Whether the controller is stopping (``resign``): it leads no more, nor waits to."""
        return self._resigned

    def resign(self) -> None:
        """Stop acting as the leader (the controller is stopping): agents' calls are refused
        as from a standby, so held long-polls end at once. The lock itself is kept until the
        controller closes, so no other controller adopts machines this one still destroys."""
        self._resigned = True
        self._leader = False

    def event(self, pool: str, kind: str, message: str) -> None:
        self.executor.event(self.clock(), pool, kind, message)

    def recent_events(self, limit: int = 20) -> list[Event]:
        return self.events.recent(limit)

    def pool_of(self, machine: str) -> str:
        """The pool of ``machine`` ("" when unknown: authentication will say so)."""
        try:
            return self.store.machines.get(machine).pool
        except MachineNotFound:
            return ""

    def table_of(self, pool: str) -> str:
        return self.deployment.table_of(pool)

    def packs(self, pool: str) -> bool:
        """Whether the pool hands work to the machine that ran work most recently
        (``packJobs``): its long-polls are woken one at a time (``controller.hub``)."""
        found = self.pools.get(pool)
        return found is not None and found.pack_jobs


def last_code(job: Job) -> str:
    """The code of a job's last error ("" when it has none)."""
    return str(job.errors[-1].get("code", "")) if job.errors else ""


def widened(pool: Pool, kept: KeptCapacity | None) -> Pool:
    """``pool`` sized to the capacity in force: while a lowered capacity drains its old queue,
    the higher one's machines (never fewer than the file's)."""
    if kept is None or kept.draining_from is None or pool.slots <= 0:
        return pool
    machines = math.ceil(kept.draining_from / pool.slots)
    if pool.autoscale:
        return replace(pool, max=max(pool.max or 0, machines))
    return replace(pool, min=max(pool.min, machines))
