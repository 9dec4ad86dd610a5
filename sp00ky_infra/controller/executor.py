"""The executor: the only code that changes a machine's state or calls a provisioner.

Every move goes through the lifecycle table (``policy.machines``) and the store's one
compare-and-set; the breaker counts the boots that fail and closes on one that works. The
tick's plans, the agents' operations (join, ready, drained, a claimed job), the admin's drain,
a controller's start (reap, adopt) and its shutdown all come here, each with ``now``.

Each action of a plan is applied on its own: one that fails is logged and retried next tick,
and never stops the others.

Below the Hetzner API budget's reserve (``hetzner/budget.py``) a pool on Hetzner makes no new
machine and drains no idle one (an idle machine still takes the next job): they wait, said
in the log and the events once a minute. Failed and drained machines are still destroyed:
they serve nothing and cost money, and each is one request.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from agent.tail import output_summary
from sp00ky_infra.config.env_sources import EnvSourceError, resolve_env
from sp00ky_infra.controller.measures import Measures
from sp00ky_infra.controller.provisioners import (
    Adopts,
    MachineSpec,
    Provisioner,
    ProvisionerError,
    Reaps,
    Refused,
    ReportsOutcomes,
    made_by,
    members,
    serving,
)
from sp00ky_infra.controller.provisioners.output import ShowsOutput, backend_lines
from sp00ky_infra.controller.settings import ControllerSettings
from sp00ky_infra.controller.state import Deployment, Event, EventLog, PoolStates, Wake
from sp00ky_infra.hetzner.budget import LEDGER
from sp00ky_infra.policy.breaker import Breaker
from sp00ky_infra.policy.machines import FAILED_BOOTS, IdleClock, Reason, rule
from sp00ky_infra.policy.plan import Create, Destroy, Drain, Fail, Plan
from sp00ky_infra.shared import tokens
from sp00ky_infra.shared.names import machine_name
from sp00ky_infra.store import SqlStore
from sp00ky_infra.store.machines import Change, Machine, MachineNotFound

log = logging.getLogger("sp00ky.controller")
DESTROYABLE = rule(Reason.DESTROYED).sources  # what the provisioner may destroy
BUDGET_EVENT_SECONDS = 60.0  # how often a pool's waiting for the API budget is told
Action = Create | Drain | Fail | Destroy | IdleClock


class Executor:
    def __init__(
        self,
        settings: ControllerSettings,
        store: SqlStore,
        provisioner: Provisioner,
        pools: PoolStates,
        events: EventLog,
        wake: Wake,
        measures: Measures | None = None,
    ) -> None:
        self.measures = measures or Measures()
        self.settings = settings
        self.store = store
        self.provisioner = provisioner
        self.pools = pools
        self.events = events
        self.wake = wake
        # machine -> pool: failed for silence, not yet confirmed gone; its jobs keep their
        # leases meanwhile (``hold_fenced``). In memory: a new leader sweeps them as usual.
        self.fenced: dict[str, str] = {}
        self.budget = LEDGER  # the Hetzner API budget this process has seen
        self._budget_told: dict[str, float] = {}  # pool -> when its wait was last told

    def event(self, at: float, pool: str, kind: str, message: str) -> None:
        self.events.add(Event(at, pool, kind, message))
        log.info("pool=%s event=%s %s", pool, kind, message)

    # --- the tick's plans --------------------------------------------------------------------

    def apply(self, plan: Plan, deployment: Deployment, now: float) -> list[str]:
        """Apply one pool's plan; returns what failed (each action isolated from the others)."""
        errors: list[str] = []
        for action in plan.actions():
            try:
                self._apply(plan.pool, action, deployment, now)
            except Exception as exc:  # isolate: one failed action never stops the others
                message = f"{type(action).__name__.lower()} in pool {plan.pool} failed: {exc}"
                log.exception(message)
                errors.append(message)
        return errors

    def _apply(self, pool: str, action: Action, deployment: Deployment, now: float) -> None:
        if isinstance(action, IdleClock):
            if action.since is None:  # it runs a job: its busy period opens, if not open
                self.store.machines.busy(action.machine, now)
            else:
                self.store.machines.set_idle(action.machine, action.since)
            self.wake.idle_clock(action.machine, action.since)
        elif isinstance(action, Create):
            if not self.pools.breaker(pool).allows(now):
                return  # this plan's own failed boots opened the breaker: no machine for now
            if self._waits_for_budget(pool, now):
                return
            for _ in range(action.count):
                if not self.create(deployment, pool, now):
                    break  # refused: the breaker counts it; try again next tick
        elif isinstance(action, Drain):
            if action.reason is Reason.IDLE_SURPLUS and self._waits_for_budget(pool, now):
                return
            self.drain(pool, action.machine, action.reason, now)
        elif isinstance(action, Fail):
            detail = self._boot_timeout(deployment, pool, action.machine)
            self.fail(pool, action.machine, action.reason, now, detail)
            self.destroy(pool, action.machine, now)
        else:
            self.destroy(pool, action.machine, now)

    def budget_holds(self, pool: str) -> str | None:
        """Why the pool's new machines and idle drains wait for the Hetzner API budget (it
        is on Hetzner and the budget is below its reserve); None when they do not."""
        if getattr(serving(self.provisioner, pool), "runs_on", None) != "hetzner":
            return None
        if not self.budget.low():
            return None
        return f"new machines and drains of idle ones wait: {self.budget.why_low()}"

    def _waits_for_budget(self, pool: str, now: float) -> bool:
        """``budget_holds``, told in the log and the events at most once a minute a pool."""
        held = self.budget_holds(pool)
        if held is None:
            return False
        if now - self._budget_told.get(pool, -BUDGET_EVENT_SECONDS) >= BUDGET_EVENT_SECONDS:
            self._budget_told[pool] = now
            self.event(now, pool, "budget_wait", held)
        return True

    # --- moves -------------------------------------------------------------------------------

    def create(self, deployment: Deployment, pool: str, now: float) -> bool:
        """Ask the pool's provisioner for one machine; False when it was refused (a failed
        boot)."""
        settings = self.settings
        name = machine_name(pool)
        provisioner = serving(self.provisioner, pool)
        machine = self.store.machines.add(
            name,
            pool,
            provisioner.name,
            deployment.revisions[pool],
            deployment.pools[pool].slots,
            now,
        )
        try:
            self._check_env(deployment, pool)
            cap = settings.max_machines  # counted only under a cap: a create reads no rows
            if cap is not None and self.store.machines.count_live() > cap:
                raise Refused(
                    f"the project's machine cap is {cap} (all pools, booting and draining included)"
                )
            made = provisioner.create(
                MachineSpec(
                    name=name,
                    pool=pool,
                    backend=deployment.backends[pool].name,
                    revision=machine.revision,
                    controller_url=settings.agents_url,
                    join_token=self._join_token(provisioner, name, now),
                    workdir=deployment.config.root,
                )
            )
        except ProvisionerError as exc:
            self.refused(pool, name, str(exc), now)
            return False
        self.store.machines.move(
            name,
            Reason.PROVISIONED,
            now,
            Change(provider_id=made.provider_id, provider_state=made.provider_state),
        )
        self.event(now, pool, "scale_up", f"{name} requested ({provisioner.name})")
        return True

    def _check_env(self, deployment: Deployment, pool: str) -> None:
        """The backend's env sources resolve here, on the controller, before a machine is
        made for them: one that does not is a failed boot naming the field (the values are
        dropped: the agent's join gets them)."""
        try:
            resolve_env(deployment.backends[pool], deployment.config.root, os.environ)
        except EnvSourceError as exc:
            raise Refused(str(exc)) from exc

    def _join_token(self, provisioner: Provisioner, name: str, now: float) -> str | None:
        """A join token for a provisioner that delivers it; the Pulumi program issues its own."""
        if not provisioner.delivers_join_token:
            return None
        return tokens.issue_join_token(self.settings.secret, name, now, self.settings.join_ttl)

    def drain(self, pool: str, name: str, reason: Reason, now: float) -> bool:
        """A ready machine starts draining; its agent hears of it on its next poll."""
        if not self.store.machines.move(name, reason, now):
            return False
        self.event(now, pool, "drain", f"{name}: {reason.value}")
        self.wake.machine(name)
        return True

    def fail(
        self, pool: str, name: str, reason: Reason, now: float, detail: str | None = None
    ) -> bool:
        """The plan failed it (boot timeout, silence); False when its state no longer allows
        it. A boot that timed out counts towards the pool's breaker. ``detail`` (the cause,
        when known) is its failed reason and the one message of the event and the breaker."""
        if not self.store.machines.move(name, reason, now, Change(detail=detail)):
            return False
        why = f"{name}: {detail or reason.value}"
        self.event(now, pool, "failed", why)
        if reason in FAILED_BOOTS:
            self.boot_failed(pool, why, now)
        return True

    def _boot_timeout(self, deployment: Deployment, pool: str, name: str) -> str | None:
        """Why a machine's boot timed out, from the backend's last lines where its provisioner
        can read them (redacted: the backend's env values and anything token-like)."""
        machine = self.store.machines.get(name)
        settings = deployment.pools.get(pool)
        if machine.state not in ("requested", "booting") or settings is None:
            return None
        why = f"not ready within the boot timeout ({settings.boot_timeout:g}s)"
        provisioner = serving(self.provisioner, pool)
        if machine.state == "requested" or not isinstance(provisioner, ShowsOutput):
            return why
        try:
            lines = backend_lines(provisioner.last_output(name, machine.provider_id))
        except Exception as exc:  # the output is a help, never a reason to fail otherwise
            log.warning("output of machine %s: %s", name, exc)
            return why
        backend = deployment.backends[pool]
        try:
            secrets = list(resolve_env(backend, deployment.config.root, os.environ).values())
        except EnvSourceError:
            secrets = list(backend.env.values())
        return f"{why}; {output_summary(lines, secrets)}"

    def boot_failure(self, machine: Machine, why: str, now: float) -> None:
        """Its agent says the backend never became ready: a failed boot."""
        if self.store.machines.move(machine.name, Reason.BOOT_FAILED, now, Change(detail=why)):
            self.event(now, machine.pool, "failed", f"{machine.name} failed to boot: {why}")
            self.boot_failed(machine.pool, f"{machine.name}: {why}", now)

    def refused(self, pool: str, name: str, detail: str, now: float) -> None:
        """The provider would not create it: failed (a failed boot), then destroyed at once,
        since nothing exists to destroy."""
        why = f"refused: {detail}"
        if self.store.machines.move(name, Reason.REFUSED, now, Change(detail=why)):
            self.event(now, pool, "refused", f"{name}: {detail}")
            self.boot_failed(pool, why, now)
            self.store.machines.move(name, Reason.DESTROYED, now)

    def destroy(self, pool: str, name: str, now: float) -> bool:
        """Destroy a draining or failed machine through the provisioner that made it, then its
        row."""
        machine = self.store.machines.get(name)
        if machine.state not in DESTROYABLE:
            return False  # destroyed already, or it moved on since it was planned
        made_by(self.provisioner, pool, machine.provider).destroy(
            name, machine.provider_id, machine.provider_state
        )
        if not self.store.machines.move(name, Reason.DESTROYED, now):
            return False
        self.event(
            now, pool, "destroyed", f"{name} destroyed after {now - machine.created_at:.0f}s"
        )
        return True

    # --- fencing: an attempt that may still be working never runs twice ----------------------

    def fence(self, pool: str, fails: Sequence[Fail], now: float) -> None:
        """Fail the silent machines of ``pool`` (the plan's ``fences``) before the sweep puts
        their jobs back in the queue; ``hold_fenced`` destroys them."""
        for action in fails:
            if self.fail(pool, action.machine, action.reason, now):
                self.fenced[action.machine] = pool

    def hold_fenced(self, now: float, lease_of: Callable[[str], float]) -> list[str]:
        """Destroy each fenced machine (again, after a failed destroy) and, until it is
        confirmed gone, renew the leases of the jobs it ran, so the sweep leaves them be.
        Gone: destroyed by a synchronous provisioner (local: no process of its session left;
        docker: its container removed), or reported destroyed by an asynchronous one (the
        server deleted). Returns what failed."""
        errors: list[str] = []
        for name, pool in list(self.fenced.items()):
            try:
                self.destroy(pool, name, now)
            except Exception as exc:  # held below; tried again next tick
                message = f"destroy of silent machine {name} in pool {pool} failed: {exc}"
                log.warning(message)
                errors.append(message)
            machine = self.store.machines.get(name)
            if self._gone(machine):
                del self.fenced[name]
                continue
            held = [(job.id, job.attempt) for job in self.store.running_on(name) if job.attempt]
            if held:
                self.store.renew(held, now, lease_of(pool))
        return errors

    def _gone(self, machine: Machine) -> bool:
        if machine.state != "destroyed":
            return False
        maker = made_by(self.provisioner, machine.pool, machine.provider)
        return not isinstance(maker, ReportsOutcomes) or (machine.provider_state == "destroyed")

    # --- the agents --------------------------------------------------------------------------

    def joined(
        self, name: str, session_hash: str, now: float, credential_hash: str | None = None
    ) -> Machine:
        """Its agent joined: the session and the machine credential are bound (Conflict when
        it joined already)."""
        machine = self.store.machines.join(name, session_hash, now, credential_hash)
        self.event(now, machine.pool, "joined", f"{name} joined")
        return machine

    def rejoined(self, name: str, credential_hash: str, session_hash: str, now: float) -> Machine:
        """Its agent came back with its machine credential: a new session, the same state
        (Conflict when the machine is not live or the credential is another)."""
        machine = self.store.machines.rejoin(name, credential_hash, session_hash, now)
        self.event(now, machine.pool, "rejoined", f"{name} rejoined ({machine.state})")
        return machine

    def ready(self, machine: Machine, now: float) -> None:
        """Its backend answers: ready, and the pool's breaker closes."""
        if self.store.machines.move(machine.name, Reason.READY, now):
            took = now - machine.created_at
            self.measures.boot.labels(machine.pool, machine.provider).observe(max(took, 0.0))
            self.event(now, machine.pool, "ready", f"{machine.name} is ready ({took:.1f}s)")
            self.boot_succeeded(machine.pool, now)
            self.wake.machine(machine.name)

    def claimed(self, name: str, now: float) -> None:
        """The machine took work: its idle clock stops (the tick restarts it once it is idle)
        and its busy time runs (what is not busy is idle in the pool's cost)."""
        self.store.machines.busy(name, now)

    def agent_drained(self, machine: Machine, now: float) -> bool:
        """Its agent finished its jobs and left (after a drain, or stopped on the machine);
        False when the machine was neither ready nor draining."""
        if machine.state == "ready":  # the agent was stopped on its machine (SIGTERM)
            if self.store.machines.move(machine.name, Reason.AGENT_STOP, now):
                self.event(now, machine.pool, "drain", f"{machine.name}: stopped on the machine")
        elif machine.state != "draining":
            return False
        self.store.machines.mark_drained(machine.name, now)
        return True

    # --- the breaker -------------------------------------------------------------------------

    def boot_succeeded(self, pool: str, now: float) -> None:
        self.close_breaker(pool, now, "a machine booted fine")

    def close_breaker(self, pool: str, now: float, why: str) -> Breaker:
        """Close the pool's breaker and forget its failed boots (a boot that worked, or a
        reset by hand); an event says why when it was open. Returns the breaker before."""
        before, after = self.pools.change_breaker(pool, lambda _: Breaker(), now)
        if before != after and (
            self.store.pools.close_incidents(pool, "pool_breaker_open", now) or before.is_open(now)
        ):
            self.event(now, pool, "breaker_closed", f"{why}; the breaker is closed")
        return before

    def boot_failed(self, pool: str, why: str, now: float) -> None:
        settings = self.settings
        before, after = self.pools.change_breaker(
            pool,
            lambda breaker: breaker.failed(
                now, settings.breaker_first_pause, settings.breaker_max_pause
            ),
            now,
        )
        if after.opened > before.opened and after.open_until is not None:
            message = (
                f"{after.failures} failed boots in a row (last: {why}); no new machines "
                f"for {after.open_until - now:.0f}s"
            )
            self.store.pools.open_incident(pool, "pool_breaker_open", message, now)
            self.event(now, pool, "breaker_open", message)

    # --- what an asynchronous provisioner reports, start and shutdown -------------------------

    def record_outcomes(self, now: float) -> None:
        """What an asynchronous provisioner (Pulumi) reports back: servers created (their ids
        go on the rows, so a restarted controller knows what exists) or refused (failed boots)."""
        machines = self.store.machines
        reported = [p for p in members(self.provisioner) if isinstance(p, ReportsOutcomes)]
        for outcome in [outcome for each in reported for outcome in each.outcomes()]:
            try:
                machine = machines.get(outcome.machine)
            except MachineNotFound:  # a machine unknown to the store: nothing to record
                continue
            if outcome.kind == "created":
                machines.set_provider(outcome.machine, outcome.detail or None, "created")
            elif outcome.kind == "destroyed":
                machines.set_provider_state(outcome.machine, "destroyed")
            else:
                self.refused(machine.pool, outcome.machine, outcome.detail, now)

    def adopt(self) -> None:
        """Hand each provisioner the machines the store has of it (this controller starts
        leading)."""
        for provisioner in members(self.provisioner):
            if not isinstance(provisioner, Adopts):
                continue
            live: dict[str, dict[str, str]] = {}
            for machine in self.store.machines.live():
                if machine.provider == provisioner.name:
                    live.setdefault(machine.pool, {})[machine.name] = machine.revision
            provisioner.adopt(live)

    def reap(self, now: float, keep_live: bool = True) -> int:
        """Remove what an earlier run left behind and say so in the rows. The machines the
        store has live keep running and reconnect (a restart loses nothing), unless
        ``keep_live`` is False (``dev``: a new run starts from nothing)."""
        reaped: list[str] = []
        for provisioner in members(self.provisioner):
            if not isinstance(provisioner, Reaps):
                continue
            keep: set[str] = set()
            if keep_live:
                live = self.store.machines.live()
                keep = {m.name for m in live if m.provider == provisioner.name}
            reaped += provisioner.reap(keep)
        for name in reaped:
            self.store.machines.move(name, Reason.LEFT_BEHIND, now)
        return len(reaped)

    def shutdown(self, now: float) -> int:
        """Destroy every live machine, all at once (``dev`` on Ctrl-C leaves no process)."""
        machines = self.store.machines.live()
        live = {machine.name for machine in machines}
        machines += [  # failed for silence, their destroy not yet confirmed
            self.store.machines.get(name) for name in self.fenced if name not in live
        ]

        def destroy(machine: Machine) -> None:
            self.store.machines.move(machine.name, Reason.SHUTDOWN, now)
            self.destroy(machine.pool, machine.name, now)

        with ThreadPoolExecutor(max_workers=max(1, min(32, len(machines)))) as pool:
            list(pool.map(destroy, machines))
        return len(machines)
