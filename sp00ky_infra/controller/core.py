"""The controller's state and the agents' operations: join, ready, poll, result, drained.

Its errors (ControllerError and below, with their HTTP statuses) are in ``errors.py``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sp00ky_infra.config import Backend, Config, Pool
from sp00ky_infra.controller.errors import ControllerError as ControllerError
from sp00ky_infra.controller.errors import Gone as Gone
from sp00ky_infra.controller.errors import NotLeader as NotLeader
from sp00ky_infra.controller.errors import Refusal as Refusal
from sp00ky_infra.controller.errors import Unauthorized as Unauthorized
from sp00ky_infra.controller.protocol import (
    AgentSettings,
    Assignment,
    BackendInfo,
    JoinReply,
    PollReply,
    PollRequest,
    ResultRequest,
    Stop,
)
from sp00ky_infra.controller.provisioners import Provisioner
from sp00ky_infra.controller.settings import ControllerSettings
from sp00ky_infra.policy.breaker import Breaker
from sp00ky_infra.shared import tokens
from sp00ky_infra.shared.names import pool_image
from sp00ky_infra.store import Conflict, JobNotFound, SqlStore, StaleAttempt
from sp00ky_infra.store.machines import Machine, MachineNotFound

log = logging.getLogger("sp00ky.controller")
MAX_EVENTS = 200


@dataclass(frozen=True, slots=True)
class Event:
    at: float
    pool: str
    kind: str  # scale_up, ready, drain, destroy, failed, breaker_open, breaker_closed, ...
    message: str


class Controller:
    """Everything the tick, the agents' endpoint and the admin API share."""

    def __init__(
        self,
        settings: ControllerSettings,
        config: Config,
        store: SqlStore,
        provisioner: Provisioner,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.config = config
        self.store = store
        self.provisioner = provisioner
        self.clock = clock
        self.leader = False
        self.leader_lock = store.leader_lock()
        self.last_prune = 0.0
        self.last_heartbeat = 0.0
        self.events: deque[Event] = deque(maxlen=MAX_EVENTS)
        self._events_lock = threading.Lock()
        self.notify_machine: Callable[[str], None] = lambda name: None
        self.notify_pool: Callable[[str], None] = lambda pool: None
        self.pools: dict[str, Pool] = {}
        self.backends: dict[str, Backend] = {}
        self.revisions: dict[str, str] = {}
        self.paused: dict[str, bool] = {}
        self.breakers: dict[str, Breaker] = {}
        self.load(config)

    def load(self, config: Config) -> None:
        """Take a (new) configuration. Pause flags live in the store: a deploy never un-pauses."""
        self.config = config
        self.pools = {name: self.settings.pool(pool) for name, pool in config.pools.items()}
        self.backends = {name: config.backend_for(name) for name in self.pools}
        self.revisions = {
            name: self.backends[name].revision(pool) for name, pool in config.pools.items()
        }
        for name in self.pools:
            state = self.store.pools.state(name)
            self.paused[name] = state.paused
            self.breakers[name] = state.breaker

    def event(self, pool: str, kind: str, message: str) -> None:
        with self._events_lock:
            self.events.append(Event(self.clock(), pool, kind, message))
        log.info("pool=%s event=%s %s", pool, kind, message)

    def recent_events(self, limit: int = 20) -> list[Event]:
        with self._events_lock:
            return list(self.events)[-limit:]

    def pool_of(self, machine: str) -> str:
        """The pool of ``machine`` ("" when unknown: authentication will say so)."""
        try:
            return self.store.machines.get(machine).pool
        except MachineNotFound:
            return ""

    def table_of(self, pool: str) -> str:
        method = self.backends[pool].method
        assert method is not None, "lint guarantees a pool backend has an outbox table"
        return method.table

    # --- the agents -------------------------------------------------------------------------

    def _require_leader(self) -> None:
        if not self.leader:
            raise NotLeader("this controller is not the leader of its store; retry shortly")

    def _authenticate(self, name: str, session: str) -> Machine:
        self._require_leader()
        try:
            machine = self.store.machines.get(name)
        except MachineNotFound as exc:
            raise Unauthorized(f"unknown machine {name!r}") from exc
        if machine.session_hash is None or machine.session_hash != tokens.session_hash(session):
            raise Unauthorized(f"session is not machine {name!r}'s")
        if machine.state in ("failed", "destroyed"):
            raise Gone(f"machine {name} is {machine.state}; shut down")
        if machine.pool not in self.pools:
            raise Gone(f"pool {machine.pool} is no longer configured; shut down")
        return machine

    def join(self, name: str, token: str) -> JoinReply:
        """Trade a one-time join token for a session, the backend's spec and its env."""
        self._require_leader()
        now = self.clock()
        try:
            claim = tokens.verify_join_token(self.settings.secret, token, name, now)
        except tokens.TokenError as exc:
            raise Unauthorized(str(exc)) from exc
        if not self.store.machines.use_nonce(claim.nonce, name, now):
            raise Unauthorized("join token was used before (a replay)")
        session = tokens.new_session_token()
        try:
            machine = self.store.machines.join(name, tokens.session_hash(session), now)
        except (Conflict, MachineNotFound) as exc:
            raise Unauthorized(str(exc)) from exc
        pool = self.pools.get(machine.pool)
        if pool is None:
            raise Gone(f"pool {machine.pool} is no longer configured; shut down")
        backend = self.backends[machine.pool]
        self.event(machine.pool, "joined", f"{name} joined")
        return JoinReply(
            session=session,
            machine=name,
            pool=machine.pool,
            backend=BackendInfo(
                name=backend.name,
                port=backend.deploy.port,
                healthcheck=backend.deploy.healthcheck,
                command=list(backend.deploy.command),
                image=pool_image(backend.name),
                env=machine_env(backend),
            ),
            settings=self.agent_settings(pool),
        )

    def agent_settings(self, pool: Pool) -> AgentSettings:
        return AgentSettings(
            slots=pool.slots,
            lease=pool.lease,
            poll_wait=self.poll_wait(pool),
            recycle=pool.recycle,
            boot_timeout=pool.boot_timeout,
            max_offline=3 * pool.lease,
        )

    def poll_wait(self, pool: Pool) -> float:
        """A long-poll never outlasts a third of the lease, so renewals keep flowing."""
        return min(self.settings.poll_wait, pool.lease / 3)

    def ready(self, name: str, session: str, ok: bool, reason: str | None) -> None:
        machine = self._authenticate(name, session)
        now = self.clock()
        if ok:
            if self.store.machines.move(
                name, ["booting"], "ready", now, ready_at=now, idle_since=now
            ):
                self.event(
                    machine.pool, "ready", f"{name} is ready ({now - machine.created_at:.1f}s)"
                )
                self.boot_succeeded(machine.pool)
                self.notify_machine(name)
            return
        why = reason or "the backend did not become ready"
        if self.store.machines.move(
            name, ["requested", "booting"], "failed", now, failed_reason=why
        ):
            self.event(machine.pool, "failed", f"{name} failed to boot: {why}")
            self.boot_failed(machine.pool, f"{name}: {why}")

    def boot_succeeded(self, pool: str) -> None:
        if self.breakers[pool] != Breaker():
            was_open = self.breakers[pool].is_open(self.clock())
            self.breakers[pool] = Breaker()
            self.store.pools.save_breaker(pool, Breaker(), self.clock())
            if (
                self.store.pools.close_incidents(pool, "pool_breaker_open", self.clock())
                or was_open
            ):
                self.event(pool, "breaker_closed", "a machine booted fine; the breaker is closed")

    def boot_failed(self, pool: str, why: str) -> None:
        now = self.clock()
        before = self.breakers[pool]
        after = before.failed(
            now, self.settings.breaker_first_pause, self.settings.breaker_max_pause
        )
        self.breakers[pool] = after
        self.store.pools.save_breaker(pool, after, now)
        if after.opened > before.opened and after.open_until is not None:
            pause = after.open_until - now
            message = (
                f"{after.failures} failed boots in a row (last: {why}); no new machines "
                f"for {pause:.0f}s"
            )
            self.store.pools.open_incident(pool, "pool_breaker_open", message, now)
            self.event(pool, "breaker_open", message)

    def poll(self, name: str, session: str, request: PollRequest, renew: bool = True) -> PollReply:
        """Renew the leases the machine reports, then hand it cancels, work and drain.

        A long-poll renews once, when the request arrives (``renew``); the passes after each
        wake-up only look for kills, drain and work.
        """
        machine = self._authenticate(name, session)
        now = self.clock()
        pool = self.pools[machine.pool]
        reported = [(each.job, each.attempt) for each in request.running]
        stop: list[Stop] = []
        if renew:
            self.store.machines.seen(name, now)
            renewed = self.store.renew(reported, now, pool.lease)
            stop = [
                Stop(job=job, attempt=attempt, reason="stale")
                for job, attempt in reported
                if job not in renewed
            ]
        stop += [
            Stop(job=job, attempt=attempt, reason="cancelled")
            for job, attempt in self.store.cancels_for(name)
        ]
        assignments: list[Assignment] = []
        if machine.state == "ready" and self.leader:
            known = {job for job, _ in reported}
            running = self.store.running_on(name)
            # Jobs bound to this machine that it does not know of: a poll answer that never
            # arrived (a dropped connection, a controller restart). They are its own: resend.
            assignments += [
                _assignment(job)
                for job in running
                if job.id not in known and not job.cancel_requested
            ]
            free = min(request.free_slots, pool.slots - sum(job.slots for job in running))
            if free > 0 and not self.paused.get(machine.pool, False):
                backend = self.backends[machine.pool]
                claimed = self.store.claim(
                    self.table_of(machine.pool),
                    free,
                    self.settings.controller_id,
                    now,
                    pool.lease,
                    machine=name,
                    concurrency=backend.method.concurrency if backend.method else None,
                )
                assignments += [_assignment(job) for job in claimed]
                if claimed:
                    self.store.machines.update(name, idle_since=None)
        return PollReply(
            assignments=assignments,
            stop=stop,
            drain=machine.state == "draining",
            lease=pool.lease,
            now=now,
        )

    def result(
        self, name: str, session: str, job_id: str, attempt: str, report: ResultRequest
    ) -> str:
        """Record what the backend answered (or why it could not), for the current attempt."""
        self._authenticate(name, session)
        now = self.clock()
        try:
            job = self.store.get(job_id)
            if job.machine != name and job.attempt == attempt:
                raise Refusal(f"attempt {attempt} of {job_id} is not machine {name}'s")
            if report.status == "success":
                done = self.store.complete(job_id, attempt, report.result, now)
            elif report.status == "cancelled":
                done = self.store.confirm_cancel(job_id, attempt, now)
            else:
                error = report.error
                if error is None:
                    raise Refusal("a failed result needs an error {code, reason}")
                entry: dict[str, Any] = {"code": error.code, "reason": error.reason}
                if error.status is not None:
                    entry["status"] = error.status
                done = self.store.fail_attempt(job_id, attempt, entry, now)  # type: ignore[arg-type]
        except StaleAttempt as exc:
            raise Refusal(str(exc)) from exc
        except JobNotFound as exc:
            raise Refusal(str(exc)) from exc
        except Conflict as exc:
            raise Refusal(str(exc)) from exc
        self.notify_machine(name)  # a slot is free again
        return done.status

    def drained(self, name: str, session: str) -> None:
        """The agent finished its jobs and is leaving; the tick destroys the machine."""
        machine = self._authenticate(name, session)
        now = self.clock()
        if machine.state == "ready":  # the agent was stopped on its machine (SIGTERM)
            self.store.machines.move(name, ["ready"], "draining", now, drain_reason="agent_stop")
            self.event(machine.pool, "drain", f"{name}: stopped on the machine")
        elif machine.state != "draining":
            raise Refusal(f"machine {name} is {machine.state}, not draining")
        self.store.machines.update(name, drained=1, updated_at=now)


def machine_env(backend: Backend) -> dict[str, str]:
    """What a machine's backend runs with: its own env, plus SPKY_ENV, SPKY_DB_NS and
    SPKY_DB_NAME when the controller has them; never the store or the pool secret."""
    env = dict(backend.env)
    for name in ("SPKY_ENV", "SPKY_DB_NS", "SPKY_DB_NAME"):
        if os.environ.get(name):
            env[name] = os.environ[name]
    return env


def _assignment(job: Any) -> Assignment:
    return Assignment(
        job=job.id,
        attempt=job.attempt,
        path=job.path,
        payload=job.payload,
        deadline=job.deadline,
        lease_expires_at=job.lease_expires_at,
    )
