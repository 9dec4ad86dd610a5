"""The agents' operations on the controller: join, rejoin, ready, image, poll, result,
drained; and before the join, a booting machine's: its agent archive and its failed boot.
Each authenticates its machine (its session, for a rejoin its credential, before the join
its join token) and acts through the controller's store and executor; only the leader
answers.

A poll runs in one store transaction (one commit a poll). On PostgreSQL its statements
travel in two round trips: the machine, its running jobs and the results; then the renewals
and the claim with the COMMIT (read after it: the reply is built from what committed).
"""

from __future__ import annotations

import functools
import hmac
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sp00ky_infra.config import Backend, Pool
from sp00ky_infra.config.env_sources import resolve_env
from sp00ky_infra.controller.core import Controller, last_code
from sp00ky_infra.controller.errors import Gone, NotLeader, Refusal, Unauthorized
from sp00ky_infra.controller.images import UnknownImage
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
from sp00ky_infra.policy.placement import Standing
from sp00ky_infra.shared import cloud_init, tokens
from sp00ky_infra.shared.names import pool_image
from sp00ky_infra.store import Conflict, JobNotFound, SqlStore, StaleAttempt
from sp00ky_infra.store.dialect import Later
from sp00ky_infra.store.machines import Machine, MachineNotFound, machine_key
from sp00ky_infra.store.model import Recorded, Running, Started

# A poll writes the machine's last sighting at most this often: silence is judged over a
# whole lease (30 s at least), so a second's resolution changes no verdict, and a busy
# machine's polls (one a job) skip a write each.
SEEN_RESOLUTION_SECONDS = 1.0


@dataclass
class Sight:
    """What a poll's transaction read of its machine: its row, its pool, its running jobs
    (a few columns each), and when."""

    machine: Machine
    pool: Pool
    now: float
    running: list[Running]


@dataclass
class Offer:
    """What a poll hands its machine besides its stale attempts and acknowledgements: the
    cancels of its running jobs, the assignments it lost and those claimed for it."""

    sight: Sight
    cancelled: list[Stop]
    assignments: list[Assignment] = field(default_factory=list)
    claimed: Later[list[Started]] = field(default_factory=lambda: Later.ready([]))


class Line(Protocol):
    """The held polls (``controller.hub``): ``may_claim`` says whether a machine looking for
    a packing pool's work with ``standing`` takes it now or leaves it to another; ``freed``
    answers a machine's held poll once a result posted on its own frees a slot."""

    def may_claim(self, pool: str, machine: str, standing: Standing) -> bool: ...

    def freed(self, machine: str) -> None: ...


class Agents:
    """The operations the agents' endpoint serves, on one controller."""

    def __init__(self, controller: Controller, line: Line | None = None) -> None:
        self.controller = controller
        self.line = line  # None: every look claims (no long-polls wait: tests, in process)

    @property
    def store(self) -> SqlStore:
        return self.controller.store

    # --- who is asking ----------------------------------------------------------------------

    def require_leader(self) -> None:
        if not self.controller.leader:
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
        self.require_leader()
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

    def authenticate(self, name: str, session: str, read: Later[Machine] | None = None) -> Machine:
        offered = tokens.session_hash(session)
        machine = self._holding(name, lambda m: m.session_hash, offered, "session", read)
        if machine.pool not in self.controller.pools:
            raise Gone(f"pool {machine.pool} is no longer configured; shut down")
        return machine

    # --- joining ----------------------------------------------------------------------------

    def join(self, name: str, token: str, agent: str | None = None) -> JoinReply:
        """Trade a one-time join token for a session, the backend's spec and its env, and the
        machine credential its agent rejoins with after a reboot (issued only here, once).
        ``agent``: the archive the agent says it runs; one that does not say runs the one
        served (its bootstrap checked it against the sha256 this controller pinned)."""
        self.require_leader()
        now = self.controller.clock()
        try:
            claim = tokens.verify_join_token(self.controller.settings.secret, token, name, now)
        except tokens.TokenError as exc:
            raise Unauthorized(str(exc)) from exc
        if not self.store.machines.use_nonce(claim.nonce, name, now):
            raise Unauthorized("join token was used before (a replay)")
        session, credential = tokens.new_session_token(), tokens.new_machine_credential()
        try:
            machine = self.controller.executor.joined(
                name, tokens.session_hash(session), now, tokens.credential_hash(credential)
            )
        except (Conflict, MachineNotFound) as exc:
            raise Unauthorized(str(exc)) from exc
        ran = agent or served_agent()
        if ran:
            self.store.machines.ran_agent(name, ran)
        return self._session_reply(machine, session, credential)

    def rejoin(self, name: str, credential: str, agent: str | None = None) -> JoinReply:
        """A machine's agent back after a reboot or a restart, with the credential of its first
        join: a new session and the same reply as a join (without a new credential). The state
        stays: a ready machine is ready, and polls as before; the jobs still bound to it are
        resent by its polls (the same attempts, under their leases), so none runs twice.
        ``agent``: the archive the agent says it runs now (one that does not say runs the one
        recorded before). Unauthorized for an unknown machine or another credential, Gone for
        a machine that is failed or destroyed."""
        offered = tokens.credential_hash(credential)
        self._holding(name, lambda m: m.credential_hash, offered, "credential")
        now = self.controller.clock()
        session = tokens.new_session_token()
        try:
            machine = self.controller.executor.rejoined(
                name, offered, tokens.session_hash(session), now
            )
        except Conflict as exc:  # failed or destroyed since it was read
            raise Gone(f"machine {name} is no longer live; shut down ({exc})") from exc
        if agent:
            self.store.machines.ran_agent(name, agent)
        return self._session_reply(machine, session, None)

    def _session_reply(self, machine: Machine, session: str, credential: str | None) -> JoinReply:
        pool = self.controller.pools.get(machine.pool)
        if pool is None:
            raise Gone(f"pool {machine.pool} is no longer configured; shut down")
        backend = self.controller.backends[machine.pool]
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
                env=machine_env(backend, self.controller.config.root),
            ),
            settings=self.agent_settings(pool),
            credential=credential,
            agent=served_agent(),
        )

    def image_source(self, pool: str) -> ImageSource | None:
        """Where the pool's machines fetch its image; the registry's credentials ride here,
        in the join reply to an authenticated machine, never in user-data or labels."""
        image = self.controller.deployment.images.get(pool)
        if image is None:
            return None
        auth = image.auth
        backend = self.controller.backends[pool]
        return ImageSource(
            source=image.source,
            reference=image.reference,
            name=pool_image(backend.name) if image.source == "controller" else None,
            auth=RegistryCredentials(**auth.as_dict()) if auth else None,
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
        return min(self.controller.settings.poll_wait, pool.lease / 3)

    # --- before the join: the bootstrap, with the join token ---------------------------------

    def booting(self, name: str, token: str) -> Machine:
        """Machine ``name``, for a request its bootstrap makes with its join token before the
        join: the token's signature, machine and expiry checked, its nonce left for the join
        to spend. Once the machine has joined, its token authorizes nothing more.
        Unauthorized for a bad token, an unknown machine or one that has joined; Gone for a
        failed or destroyed one."""
        self.require_leader()
        try:
            tokens.verify_join_token(
                self.controller.settings.secret, token, name, self.controller.clock()
            )
            machine = self.store.machines.get(name)
        except tokens.TokenError as exc:
            raise Unauthorized(str(exc)) from exc
        except MachineNotFound as exc:
            raise Unauthorized(f"unknown machine {name!r}") from exc
        if machine.state in ("failed", "destroyed"):
            raise Gone(f"machine {name} is {machine.state}; shut down")
        if machine.joined_at is not None:
            raise Unauthorized(f"machine {name} has joined: its join token is spent")
        return machine

    def agent_archive(self, name: str, bearer: str) -> bytes:
        """The agent archive: for the bootstrap to check against the user-data's sha256 (with
        the join token, before the join), or for a joined agent's upgrade (with its session)
        to check against the sha256 of its join or poll reply."""
        try:
            self.authenticate(name, bearer)
        except Unauthorized:
            self.booting(name, bearer)
        return cloud_init.agent_archive()

    def boot_failed(self, name: str, token: str, reason: str) -> None:
        """The bootstrap did not install the agent (an archive whose sha256 is not the
        user-data's, an install that failed): a failed boot, with its reason."""
        machine = self.booting(name, token)
        self.controller.executor.boot_failure(machine, reason, self.controller.clock())

    # --- booting and leaving ----------------------------------------------------------------

    def image(self, name: str, session: str, image_id: str) -> Iterator[bytes]:
        """The machine's own pool image, streamed as ``docker save`` writes it."""
        machine = self.authenticate(name, session)
        image = self.controller.deployment.images.get(machine.pool)
        if image is None or image.source != "controller" or image.reference != image_id:
            raise UnknownImage(f"image {image_id} is not the one pool {machine.pool} runs")
        if self.controller.image_server is None:
            raise UnknownImage(f"image {image_id}: this controller serves no images")
        return self.controller.image_server.stream(image_id)

    def ready(self, name: str, session: str, ok: bool, reason: str | None) -> None:
        machine = self.authenticate(name, session)
        now = self.controller.clock()
        if ok:
            self.controller.executor.ready(machine, now)
        else:
            reason = reason or "the backend did not become ready"
            self.controller.executor.boot_failure(machine, reason, now)

    def drained(self, name: str, session: str) -> None:
        """The agent finished its jobs and is leaving; the tick destroys the machine."""
        machine = self.authenticate(name, session)
        if not self.controller.executor.agent_drained(machine, self.controller.clock()):
            raise Refusal(f"machine {name} is {machine.state}, not draining")

    # --- polls ------------------------------------------------------------------------------

    def poll(self, name: str, session: str, request: PollRequest) -> PollReply:
        """Record the results the poll carries, renew the leases the machine asks to renew
        (and tell it which attempts it reports are stale), then hand it cancels, work and
        drain: in one store transaction."""
        self.require_leader()
        with self.store.transaction(key=machine_key(name)):
            answer = self._report(name, session, request)
        return answer()

    def look(self, name: str, session: str, request: PollRequest) -> PollReply:
        """A long-poll's pass after a wake-up: its first pass (``poll``) took its results,
        leases and last sighting; this one only looks for cancels, drain and work."""
        self.require_leader()
        with self.store.transaction(key=machine_key(name)):
            sight, _ = self._read(name, session, request, [])
            offer = self._offer(sight, request, resend=False)
        return self._reply(offer, [], [])

    def _read(
        self,
        name: str,
        session: str,
        request: PollRequest,
        successes: Sequence[tuple[str, str, Any]],
    ) -> tuple[Sight, Later[list[Recorded]]]:
        """The machine's row and running jobs, sent with the batch of ``successes`` before
        either is read; the machine authenticated. One read of its running jobs serves the
        whole poll: the attempts it reports checked, its cancels, its lost assignments and
        free slots."""
        machine_read = self.store.machines.send_get(name)
        running_read = self.store.send_running(name)
        now = self.controller.clock()
        recorded = self.store.send_complete_many(successes, now, machine=name)
        machine = self.authenticate(name, session, machine_read)
        running = running_read.result()
        for each in request.running:
            self.controller.measures.posted(each.attempt, each.posted)
        return Sight(machine, self.controller.pools[machine.pool], now, running), recorded

    def _report(self, name: str, session: str, request: PollRequest) -> Callable[[], PollReply]:
        """A poll's first pass: results, the last sighting and renewals, then the offer."""
        successes = [(d.job, d.attempt, d.result) for d in request.results if d.status == "success"]
        sight, recorded = self._read(name, session, request, successes)
        current = {(job.id, job.attempt): job for job in sight.running}
        held = set(current)  # the attempts current as this poll read them
        # Results first: their slots are free for the work this same poll claims.
        acks = self._record_all(
            sight.machine, request.results, sight.now, current, recorded.result()
        )
        sight.running = list(current.values())  # the recorded ones run no more
        self._seen(sight)
        # The leases the agent asks to renew (it leaves alone those renewed a moment ago:
        # agent.leases.renewal_due); the others it reports are only checked as current.
        due = [(each.job, each.attempt) for each in request.running if not each.fresh]
        renewed = self.store.send_renew(due, sight.now, sight.pool.lease)
        offer = self._offer(sight, request)

        def reply() -> PollReply:
            kept = renewed.result()
            stale = [
                Stop(job=each.job, attempt=each.attempt, reason="stale")
                for each in request.running
                if not ((each.job, each.attempt) in held if each.fresh else each.job in kept)
            ]
            return self._reply(offer, stale, acks)

        return reply

    def _seen(self, sight: Sight) -> None:
        last = sight.machine.last_seen_at
        if last is None or not 0 <= sight.now - last < SEEN_RESOLUTION_SECONDS:
            self.store.machines.seen(sight.machine.name, sight.now)

    def _offer(self, sight: Sight, request: PollRequest, resend: bool = True) -> Offer:
        """The cancels of the machine's running jobs and, for a ready machine of the leader,
        the assignments it lost (``resend``: a poll's first pass; a later one would count as
        lost the jobs a poll beside it took meanwhile) and the work claimed for its free
        slots."""
        cancelled = [
            Stop(job=job.id, attempt=job.attempt or "", reason="cancelled")
            for job in sight.running
            if job.cancel_requested
        ]
        offer = Offer(sight, cancelled)
        if sight.machine.state == "ready" and self.controller.leader:
            if resend:
                offer.assignments += self._resend(sight, request)
            offer.claimed = self._claim(sight, request.free_slots)
        return offer

    def _resend(self, sight: Sight, request: PollRequest) -> list[Assignment]:
        """Jobs bound to this machine that it does not know of: a poll answer that never
        arrived (a dropped connection, a controller restart). They are its own: resend them,
        their leases renewed now (rare). The agent counts a job's lease from the send time of
        the poll that brings it, so the lease must start no earlier: the claim's, counted from
        the lost answer, may be about to run out."""
        known = {each.job for each in request.running} | {done.job for done in request.results}
        lost = [job for job in sight.running if job.id not in known and not job.cancel_requested]
        current = self.store.renew(
            [(each.id, each.attempt or "") for each in lost], sight.now, sight.pool.lease
        )
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

    def _claim(self, sight: Sight, free_slots: int) -> Later[list[Started]]:
        """Work for the machine's free slots, unless its pool is paused."""
        machine, pool = sight.machine, sight.pool
        busy = sum(job.slots for job in sight.running)
        free = min(free_slots, pool.slots - busy)
        if free <= 0 or self.controller.pool_states.paused(machine.pool):
            return Later.ready([])
        standing = Standing(busy, machine.idle_since, free)
        if self.line is not None and not self.line.may_claim(machine.pool, machine.name, standing):
            return Later.ready([])
        claimed = self.store.send_start(
            self.controller.table_of(machine.pool),
            free,
            self.controller.settings.controller_id,
            sight.now,
            pool.lease,
            machine=machine.name,
            concurrency=self.controller.concurrency_of(machine.pool),
        )
        # An idle machine that takes work: its busy period opens in this transaction (the
        # claim read before the COMMIT). A ready machine with its idle clock stopped is busy
        # already (the tick opens the period too when it stops the clock): no write, none
        # inside PostgreSQL's admission lock.
        if machine.idle_since is not None and claimed.result():
            self.controller.executor.claimed(machine.name, sight.now)
        return claimed

    def _reply(self, offer: Offer, stale: list[Stop], acks: list[ResultAck]) -> PollReply:
        sight = offer.sight
        assignments = list(offer.assignments)
        for job in offer.claimed.result():
            assignments.append(_assignment(job))
            self.controller.measures.claimed(
                job.attempt or "", sight.machine.pool, sight.now - job.run_after
            )
        served = served_agent()
        return PollReply(
            assignments=assignments,
            stop=stale + offer.cancelled,
            drain=sight.machine.state == "draining",
            lease=sight.pool.lease,
            now=sight.now,
            results=acks,
            agent=served if served and sight.machine.agent not in (None, served) else None,
        )

    # --- results ---------------------------------------------------------------------------

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
            self.controller.measures.posted(done.attempt, done.posted)
            self.controller.measures.forget(done.attempt)
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
            self.controller.measures.job_duration.labels(pool, reported).observe(
                max(now - started_at, 0.0)
            )
        if status in ("success", "failed"):
            self.controller.measures.job_finished(pool, status, code)

    def result(
        self, name: str, session: str, job_id: str, attempt: str, report: ResultRequest
    ) -> str:
        """Record what the backend answered (or why it could not), for the current attempt:
        one transaction, as a poll's (one commit, and this process's writers in turn)."""
        with self.store.transaction(key=machine_key(name)):
            machine = self.authenticate(name, session)
            status = self._record(machine, job_id, attempt, report, self.controller.clock())
        if self.line is not None:
            self.line.freed(name)  # a slot is free: the held poll answers, to offer or fill it
        else:
            self.controller.wake.machine(name)
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
        self.controller.measures.posted(attempt, report.posted)
        self.controller.measures.forget(attempt)
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


@functools.cache
def served_agent() -> str | None:
    """The sha256 of the agent archive this controller serves (taken once: every poll reply
    compares it with its machine's); None where this install has no archive to serve (a
    package installed without the checkout's cloud-init/: local machines only, which run the
    agent installed with it)."""
    try:
        return cloud_init.agent_sha256()
    except OSError:
        return None


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
