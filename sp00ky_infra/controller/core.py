"""The controller's state and the agents' operations: join, rejoin, ready, poll, result,
drained.

Its errors (ControllerError and below, with their HTTP statuses) are in ``errors.py``.
"""

from __future__ import annotations

import hmac
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from sp00ky_infra.config import Backend, Config, Pool
from sp00ky_infra.config.env_sources import resolve_env
from sp00ky_infra.controller.errors import Gone, NotLeader, Refusal, Unauthorized
from sp00ky_infra.controller.executor import Executor
from sp00ky_infra.controller.images import ImageServer, PoolImage, UnknownImage
from sp00ky_infra.controller.measures import Measures
from sp00ky_infra.controller.protocol import (
    AgentSettings,
    Assignment,
    BackendInfo,
    FinishedAttempt,
    ImageSource,
    JoinReply,
    PollReply,
    PollRequest,
    RegistryCredentials,
    ResultAck,
    ResultRequest,
    Stop,
)
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
from sp00ky_infra.policy.plan import Plan
from sp00ky_infra.shared import tokens
from sp00ky_infra.shared.names import pool_image
from sp00ky_infra.store import Conflict, Job, JobNotFound, SqlStore, StaleAttempt
from sp00ky_infra.store.dialect import Later
from sp00ky_infra.store.machines import Machine, MachineNotFound, machine_key
from sp00ky_infra.store.model import Recorded, Running, Started

# A poll writes the machine's last sighting at most this often: silence is judged over a
# whole lease (30 s at least), so a second's resolution changes no verdict, and a busy
# machine's polls (one a job) skip a write each.
SEEN_RESOLUTION_SECONDS = 1.0
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
        self.measures = Measures()
        self.plans: Mapping[str, Plan] = {}  # the last tick's, by pool (what /metrics shows)
        self.executor = Executor(
            settings, store, provisioner, self.pool_states, self.events, self.wake, self.measures
        )
        self.load(config, images)

    def load(self, config: Config, images: Mapping[str, PoolImage] | None = None) -> None:
        """Take a (new) configuration, with each pool's image as settled for it (pinned in the
        revisions). Pause flags live in the store: a deploy never un-pauses."""
        self.deployment = Deployment.of(config, self.settings.pool, images)
        self.pool_states.reload(self.deployment.pools)

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

    # --- the agents -------------------------------------------------------------------------

    def _require_leader(self) -> None:
        if not self.leader:
            raise NotLeader("this controller is not the leader of its store; retry shortly")

    def _holding(
        self,
        name: str,
        held: Callable[[Machine], str | None],
        offered: str,
        what: str,
        read: Later[Machine] | None = None,
    ) -> Machine:
        """Machine ``name`` (``read``: its row, sent already), if ``offered`` is the hash it
        holds (its session's or its credential's): Unauthorized for an unknown machine or
        another secret, Gone for a failed or destroyed one."""
        self._require_leader()
        try:
            machine = (read or self.store.machines.send_get(name)).result()
        except MachineNotFound as exc:
            raise Unauthorized(f"unknown machine {name!r}") from exc
        stored = held(machine)
        if stored is None or not hmac.compare_digest(stored, offered):
            raise Unauthorized(f"{what} is not machine {name!r}'s")
        if machine.state in ("failed", "destroyed"):
            raise Gone(f"machine {name} is {machine.state}; shut down")
        return machine

    def _authenticate(self, name: str, session: str, read: Later[Machine] | None = None) -> Machine:
        offered = tokens.session_hash(session)
        machine = self._holding(name, lambda m: m.session_hash, offered, "session", read)
        if machine.pool not in self.pools:
            raise Gone(f"pool {machine.pool} is no longer configured; shut down")
        return machine

    def join(self, name: str, token: str) -> JoinReply:
        """Trade a one-time join token for a session, the backend's spec and its env, and the
        machine credential its agent rejoins with after a reboot (issued only here, once)."""
        self._require_leader()
        now = self.clock()
        try:
            claim = tokens.verify_join_token(self.settings.secret, token, name, now)
        except tokens.TokenError as exc:
            raise Unauthorized(str(exc)) from exc
        if not self.store.machines.use_nonce(claim.nonce, name, now):
            raise Unauthorized("join token was used before (a replay)")
        session, credential = tokens.new_session_token(), tokens.new_machine_credential()
        try:
            machine = self.executor.joined(
                name, tokens.session_hash(session), now, tokens.credential_hash(credential)
            )
        except (Conflict, MachineNotFound) as exc:
            raise Unauthorized(str(exc)) from exc
        return self._session_reply(machine, session, credential)

    def rejoin(self, name: str, credential: str) -> JoinReply:
        """A machine's agent back after a reboot or a restart, with the credential of its first
        join: a new session and the same reply as a join (without a new credential). The state
        stays: a ready machine is ready, and polls as before; the jobs still bound to it are
        resent by its polls (the same attempts, under their leases), so none runs twice.
        Unauthorized for an unknown machine or another credential, Gone for a machine that is
        failed or destroyed."""
        offered = tokens.credential_hash(credential)
        self._holding(name, lambda m: m.credential_hash, offered, "credential")
        now = self.clock()
        session = tokens.new_session_token()
        try:
            machine = self.executor.rejoined(name, offered, tokens.session_hash(session), now)
        except Conflict as exc:  # failed or destroyed since it was read
            raise Gone(f"machine {name} is no longer live; shut down ({exc})") from exc
        return self._session_reply(machine, session, None)

    def _session_reply(self, machine: Machine, session: str, credential: str | None) -> JoinReply:
        pool = self.pools.get(machine.pool)
        if pool is None:
            raise Gone(f"pool {machine.pool} is no longer configured; shut down")
        backend = self.backends[machine.pool]
        return JoinReply(
            session=session,
            machine=machine.name,
            pool=machine.pool,
            backend=BackendInfo(
                name=backend.name,
                port=backend.deploy.port,
                healthcheck=backend.deploy.healthcheck,
                command=list(backend.deploy.command),
                image=pool_image(backend.name),
                image_source=self.image_source(machine.pool),
                env=machine_env(backend, self.deployment.config.root),
            ),
            settings=self.agent_settings(pool),
            credential=credential,
        )

    def image_source(self, pool: str) -> ImageSource | None:
        """Where the pool's machines fetch its image; the registry's credentials ride here,
        in the join reply to an authenticated machine, never in user-data or labels."""
        image = self.deployment.images.get(pool)
        if image is None:
            return None
        auth = image.auth
        return ImageSource(
            source=image.source,
            reference=image.reference,
            name=pool_image(self.backends[pool].name) if image.source == "controller" else None,
            auth=RegistryCredentials(**auth.as_dict()) if auth else None,
        )

    def image(self, name: str, session: str, image_id: str) -> Iterator[bytes]:
        """The machine's own pool image, streamed as ``docker save`` writes it."""
        machine = self._authenticate(name, session)
        image = self.deployment.images.get(machine.pool)
        if image is None or image.source != "controller" or image.reference != image_id:
            raise UnknownImage(f"image {image_id} is not the one pool {machine.pool} runs")
        if self.image_server is None:
            raise UnknownImage(f"image {image_id}: this controller serves no images")
        return self.image_server.stream(image_id)

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
            self.executor.ready(machine, now)
        else:
            self.executor.boot_failure(machine, reason or "the backend did not become ready", now)

    def poll(self, name: str, session: str, request: PollRequest, renew: bool = True) -> PollReply:
        """Record the results the poll carries, renew the leases the machine asks to renew
        (and tell it which attempts it reports are stale), then hand it cancels, work and
        drain: in one store transaction (one commit a poll).

        A long-poll renews once, when the request arrives (``renew``); the passes after each
        wake-up only look for kills, drain and work.

        On PostgreSQL the statements travel in two round trips: the machine, its running
        jobs and the results; then the renewals and the claim with the COMMIT (read after
        it: the reply is built from what committed).
        """
        self._require_leader()
        with self.store.transaction(key=machine_key(name)):
            answer = self._poll(name, session, request, renew)
        return answer()

    def _poll(
        self, name: str, session: str, request: PollRequest, renew: bool
    ) -> Callable[[], PollReply]:
        # One read of the machine's running jobs (a few columns each: Running): the attempts
        # it reports checked, its kills, and below its lost assignments and free slots. Sent
        # with the machine's row and the results' batch, before either is read.
        machine_read = self.store.machines.send_get(name)
        running_read = self.store.send_running(name)
        now = self.clock()
        successes = [done for done in request.results if done.status == "success"] if renew else []
        recorded = self.store.send_complete_many(
            [(done.job, done.attempt, done.result) for done in successes], now, machine=name
        )
        machine = self._authenticate(name, session, machine_read)
        pool = self.pools[machine.pool]
        running = running_read.result()
        reported = [(each.job, each.attempt) for each in request.running]
        for each in request.running:
            self.measures.posted(each.attempt, each.posted)
        acks: list[ResultAck] = []
        renewed: Later[set[str]] = Later.ready(set())
        current = {(job.id, job.attempt): job for job in running}
        held = set(current)  # the attempts current as this poll read them
        if renew:
            # Results first: their slots are free for the work this same poll claims.
            acks = self._record_all(machine, request.results, now, current, recorded.result())
            running = list(current.values())  # the recorded ones run no more
            last = machine.last_seen_at
            if last is None or not 0 <= now - last < SEEN_RESOLUTION_SECONDS:
                self.store.machines.seen(name, now)
            # The leases the agent asks to renew (it leaves alone those renewed a moment ago:
            # agent.leases.renewal_due); the others it reports are only checked as current.
            due = [(each.job, each.attempt) for each in request.running if not each.fresh]
            renewed = self.store.send_renew(due, now, pool.lease)
        cancelled = [
            Stop(job=job.id, attempt=job.attempt or "", reason="cancelled")
            for job in running
            if job.cancel_requested
        ]
        assignments: list[Assignment] = []
        claimed: Later[list[Started]] = Later.ready([])
        if machine.state == "ready" and self.leader:
            known = {job for job, _ in reported} | {done.job for done in request.results}
            # Jobs bound to this machine that it does not know of: a poll answer that never
            # arrived (a dropped connection, a controller restart). They are its own: resend.
            assignments += self._resend(
                [job for job in running if job.id not in known and not job.cancel_requested],
                now,
                pool.lease,
            )
            free = min(request.free_slots, pool.slots - sum(job.slots for job in running))
            if free > 0 and not self.pool_states.paused(machine.pool):
                backend = self.backends[machine.pool]
                claimed = self.store.send_start(
                    self.table_of(machine.pool),
                    free,
                    self.settings.controller_id,
                    now,
                    pool.lease,
                    machine=name,
                    concurrency=backend.method.concurrency if backend.method else None,
                )
                # An idle machine that takes work: its busy period opens in this transaction
                # (the claim read before the COMMIT). A ready machine with its idle clock
                # stopped is busy already (the tick opens the period too when it stops the
                # clock): no write, none inside PostgreSQL's admission lock.
                if machine.idle_since is not None and claimed.result():
                    self.executor.claimed(name, now)

        def reply() -> PollReply:
            kept = renewed.result()
            stop = [
                Stop(job=each.job, attempt=each.attempt, reason="stale")
                for each in request.running
                if renew
                and not ((each.job, each.attempt) in held if each.fresh else each.job in kept)
            ]
            for job in claimed.result():
                assignments.append(_assignment(job))
                self.measures.claimed(job.attempt or "", machine.pool, now - job.run_after)
            return PollReply(
                assignments=assignments,
                stop=stop + cancelled,
                drain=machine.state == "draining",
                lease=pool.lease,
                now=now,
                results=acks,
            )

        return reply

    def _resend(self, lost: list[Running], now: float, lease: float) -> list[Assignment]:
        """The assignments of ``lost`` (running on the machine, which does not know of them),
        their leases renewed now (rare: a lost answer). The agent counts a job's lease from
        the send time of the poll that brings it, so the lease must start no earlier: the
        claim's, counted from the lost answer, may be about to run out."""
        current = self.store.renew([(each.id, each.attempt or "") for each in lost], now, lease)
        assignments = []
        for each in lost:
            if each.id not in current:  # no longer its attempt (swept, killed, done)
                continue
            try:
                job = self.store.get(each.id)
            except JobNotFound:  # deleted meanwhile: nothing to send
                continue
            assignments.append(_assignment(job))
        return assignments

    def _record_all(
        self,
        machine: Machine,
        results: Sequence[FinishedAttempt],
        now: float,
        current: dict[tuple[str, str | None], Running],
        batch: list[Recorded],
    ) -> list[ResultAck]:
        """A poll's results, acknowledged in order: the successes recorded in one batch
        (``batch``, ``store.send_complete_many``'s outcome: one statement on PostgreSQL), the
        others one by one. The jobs recorded leave ``current`` (the machine's running jobs as
        this poll read them)."""
        recorded = iter(batch)
        acks: list[ResultAck] = []
        for done in results:
            key = (done.job, done.attempt)
            if done.status != "success":
                try:
                    status = self._record(
                        machine, done.job, done.attempt, done, now, current.get(key)
                    )
                except Refusal as exc:
                    acks.append(ResultAck(job=done.job, attempt=done.attempt, refused=str(exc)))
                else:
                    current.pop(key, None)
                    acks.append(ResultAck(job=done.job, attempt=done.attempt, job_status=status))
                continue
            outcome = next(recorded)
            self.measures.posted(done.attempt, done.posted)
            self.measures.forget(done.attempt)
            if outcome.refused is not None:
                acks.append(
                    ResultAck(job=done.job, attempt=done.attempt, refused=str(outcome.refused))
                )
                continue
            current.pop(key, None)
            self._ended(
                machine.pool, "success", outcome.started_at, outcome.status, outcome.code, now
            )
            acks.append(ResultAck(job=done.job, attempt=done.attempt, job_status=outcome.status))
        return acks

    def _ended(
        self,
        pool: str,
        reported: str,
        started_at: float | None,
        status: str | None,
        code: str,
        now: float,
    ) -> None:
        """An attempt's result was recorded: how long it ran (by what the machine reported)
        and, when the job finished with it, the finished counter (by status and last code)."""
        if started_at is not None:
            self.measures.job_duration.labels(pool, reported).observe(max(now - started_at, 0.0))
        if status in ("success", "failed"):
            self.measures.job_finished(pool, status, code)

    def result(
        self, name: str, session: str, job_id: str, attempt: str, report: ResultRequest
    ) -> str:
        """Record what the backend answered (or why it could not), for the current attempt:
        one transaction, as a poll's (one commit, and this process's writers in turn)."""
        with self.store.transaction(key=machine_key(name)):
            machine = self._authenticate(name, session)
            status = self._record(machine, job_id, attempt, report, self.clock())
        self.wake.machine(name)  # a slot is free again
        return status

    def _record(
        self,
        machine: Machine,
        job_id: str,
        attempt: str,
        report: ResultRequest | FinishedAttempt,
        now: float,
        running: Running | None = None,
    ) -> str:
        """One attempt's result, posted alone or carried on a poll: Refusal if stale.
        ``running``: the attempt as this transaction read it running on the machine, when it
        did (no need to read the job again to know it is this machine's)."""
        name = machine.name
        self.measures.posted(attempt, report.posted)
        self.measures.forget(attempt)
        try:
            if running is None:
                job = self.store.get(job_id)
                if job.machine != name and job.attempt == attempt:
                    raise Refusal(f"attempt {attempt} of {job_id} is not machine {name}'s")
                started_at = job.started_at
            else:
                started_at = running.started_at
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
        self._ended(machine.pool, report.status, started_at, done.status, last_code(done), now)
        return done.status

    def drained(self, name: str, session: str) -> None:
        """The agent finished its jobs and is leaving; the tick destroys the machine."""
        machine = self._authenticate(name, session)
        if not self.executor.agent_drained(machine, self.clock()):
            raise Refusal(f"machine {name} is {machine.state}, not draining")


def last_code(job: Job) -> str:
    """The code of a job's last error ("" when it has none)."""
    return str(job.errors[-1].get("code", "")) if job.errors else ""


def machine_env(backend: Backend, root: str = ".") -> dict[str, str]:
    """What a machine's backend runs with: its own env with its sources resolved here, on
    the controller (``config.env_sources``: env files, inline values, references), plus
    SPKY_ENV, SPKY_DB_NS and SPKY_DB_NAME when the controller has them; never the store or
    the pool secret. The values live only in this reply to an authenticated agent."""
    env = resolve_env(backend, root, os.environ)
    for name in ("SPKY_ENV", "SPKY_DB_NS", "SPKY_DB_NAME"):
        if os.environ.get(name):
            env[name] = os.environ[name]
    return env


def _assignment(job: Any) -> Assignment:
    """The assignment of an attempt a claim started (Started) or sent again (its Job)."""
    return Assignment(
        job=job.id,
        attempt=job.attempt,
        path=job.path,
        payload=job.payload,
        deadline=job.deadline,
        lease_expires_at=job.lease_expires_at,
    )
