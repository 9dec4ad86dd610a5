"""Pulumi machines: the controller writes ``sp00ky:machines`` into a stack's config and runs
``up`` through ``pulumi.automation``.

One update runs at a time per stack, in a thread of its own. While it runs, newer desired
sets wait, and the next update converges to the newest (a burst of creates and destroys
costs one or two updates, not one each). An update starts once the desired set has been
still for SETTLE_SECONDS: a tick's creates reach the provisioner one by one (each machine's
row is written first), and without the pause the first would go alone and the others wait
for its whole update before their own. Each update's outcome comes back per machine:
created (with the server's id) or failed (refused, capacity, quota), which the tick applies
to the machine rows, so the breaker counts the failures. Update durations are logged and kept.
Each update also writes ``sp00ky:images``: what each baked pool's new machines boot, as its
bake stands (``controller/baking.py``).

A stack locked by another update (a `pulumi up` by hand, another controller's) is not a
failure of the machines: the update waits and tries again (LOCK_RETRY_SECONDS, doubling up
to LOCK_RETRY_MAX_SECONDS), the machines stay requested, and the breaker counts nothing.

A controller killed mid-update leaves the stack as its `pulumi up` left it, and the next
leader puts it right before it relies on it (``Recovery``, after adopt() and after an update
that failed): the lock of a holder that is gone (a lock file of a ``file://`` backend naming
this host and a pid that no longer runs) is removed, with a log line; one whose holder lives,
or that another host holds, is waited for as above (logged), and the recovery is done once
it is gone: that holder may itself be killed mid-update. The state's pending operations (an
update killed while it created or deleted) are dropped, and each machine it was creating is
looked up by name: one the store still wants is made by the next update, which takes the
server already there as its own (infra/machine.py); one it no longer wants has its server
deleted. The controller's sweep (controller/sweep.py) is the backstop for what is left.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable
from urllib.parse import unquote, urlsplit

from sp00ky_infra.controller.provisioners.base import MachineSpec, Outcome, Provisioned, Refused
from sp00ky_infra.controller.provisioners.inline import (
    InlineStack,
    project_program,
    without_grpc_fork_support,
)
from sp00ky_infra.hetzner import HetznerAPI
from sp00ky_infra.policy.explain import Bake
from sp00ky_infra.shared import labels
from sp00ky_infra.shared.desired import Desired
from sp00ky_infra.shared.extras import require

log = logging.getLogger("sp00ky.controller")
__all__ = ["Outcome", "PulumiProvisioner", "Stack", "automation_stack"]

LOCK_RETRY_SECONDS = 2.0
LOCK_RETRY_MAX_SECONDS = 30.0
LOCK_HINT_SECONDS = 600.0  # a stack locked this long: the log says how to end a dead update
# Far longer than the gap between two creates of one tick (a few store writes), far shorter
# than an update (seconds: the engine and the program start every time).
SETTLE_SECONDS = 0.25
SETTLE_MAX_SECONDS = 1.0  # a steady trickle of changes holds an update back no longer


class Stack(Protocol):
    """The part of ``pulumi.automation.Stack`` the provisioner uses."""

    def get_all_config(self) -> Mapping[str, Any]: ...
    def set_config(self, key: str, value: Any, *, path: bool = False) -> None: ...
    def up(
        self,
        *,
        on_output: Callable[[str], Any] | None = ...,
        on_event: Callable[[Any], Any] | None = ...,
    ) -> Any: ...
    def outputs(self) -> MutableMapping[str, Any]: ...


@runtime_checkable
class Recoverable(Protocol):
    """What the real stack also has, which ``Recovery`` uses: its name, its workspace (the
    backend's URL, the project's name) and its state."""

    @property
    def name(self) -> str: ...
    @property
    def workspace(self) -> Any: ...
    def export_stack(self) -> Any: ...
    def import_stack(self, state: Any) -> None: ...


def automation_stack(stack: str, work_dir: str) -> Stack:
    """The real stack (needs the pulumi CLI on PATH), its program run in this process
    (``inline.py``, which marks the run as the controller's: only such a run may take
    machines away, a `pulumi up` by hand keeps what exists); it never downloads a plugin."""
    require("pulumi", "the pulumi provisioner")
    without_grpc_fork_support()
    from pulumi import automation

    program = project_program(work_dir)
    return InlineStack(
        automation.create_or_select_stack(
            stack_name=stack,
            work_dir=work_dir,
            opts=automation.LocalWorkspaceOptions(
                # nothing is downloaded at run time: every resource is a dynamic provider,
                # whose host runs on this interpreter, as the program does
                env_vars={
                    "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
                    "PULUMI_PYTHON_CMD": sys.executable,
                }
            ),
        ),
        program,
    )


# The stack config that must say what the controller says (one source: the controller's
# settings), with the settings' names for messages.
PINNED = {
    "sp00ky:project": "SPKY_PROJECT",
    "sp00ky:poolUrl": "SPKY_POOL_PUBLIC_URL",
    "sp00ky:poolSecret": "SPKY_POOL_SECRET",
}


class PoolBakes(Protocol):
    """The deploy's bakes of its baked pools (``controller/baking.py``), kept here."""

    def state(self, pool: str) -> Bake | None: ...
    def close(self) -> None: ...


class StackDisagrees(Refused):
    """The stack's config names another project, pool URL or secret than the controller."""


class PulumiProvisioner:
    """Adopts, ReportsOutcomes; the program issues each machine's join token itself."""

    name = "pulumi"
    delivers_join_token = False  # infra/program.py issues it at `pulumi up`

    def __init__(
        self,
        stack_factory: Callable[[], Stack],
        clock: Callable[[], float] = time.monotonic,
        lock_retry: float = LOCK_RETRY_SECONDS,
        settle: float = SETTLE_SECONDS,
    ) -> None:
        self._stack_factory = stack_factory
        self.lock_retry = lock_retry
        self.settle = settle
        # since when the stack has been locked by another update (None: it is not)
        self.locked_since: float | None = None
        self.lock_message = ""
        self.runs_on = "hetzner"  # the stack's sp00ky:provider, read by pin(): how it bills
        self.project = ""  # the stack's sp00ky:project, as pin() made it
        self._stack: Stack | None = None
        self.clock = clock
        self.desired: dict[str, set[str]] = {}
        self.pool_of: dict[str, str] = {}
        self.revision_of: dict[str, str] = {}
        self.applied: dict[str, set[str]] = {}
        # what a baked pool's new machines boot (sp00ky:images), set by its bake
        self.images: dict[str, str] = {}
        self.bakes: PoolBakes | None = None
        self.durations: deque[float] = deque(maxlen=50)
        self.updates = 0
        self._outcomes: deque[Outcome] = deque()
        self._changed = threading.Condition()
        self._closing = False
        self._busy = False
        self._lock_tries = 0
        self._recover_due = False  # look for what a killed update left (Recovery) first
        self._stale = False  # an update is due though the desired set did not change
        self._retry_now = False  # a dead holder's lock was removed: no wait before the next try
        # machines whose create a killed update left pending: their servers may exist outside
        # the state until an update makes them (Recovery)
        self._adrift: set[str] = set()
        # the first change the next update will carry, and the last (clock readings)
        self._pending_since: float | None = None
        self._changed_last = 0.0
        # each resource step of an update as it happens (UpProgress): logged, and kept
        self.progress: deque[str] = deque(maxlen=200)
        self._thread = threading.Thread(target=self._run, name="pulumi-updates", daemon=True)
        self._thread.start()

    # --- the provisioner port ----------------------------------------------------------------

    def create(self, spec: MachineSpec) -> Provisioned:
        with self._changed:
            self.desired.setdefault(spec.pool, set()).add(spec.name)
            self.pool_of[spec.name] = spec.pool
            self.revision_of[spec.name] = spec.revision
            self._noted()
        return Provisioned(provider_id="", provider_state="pending")

    def destroy(self, name: str, provider_id: str | None, provider_state: str | None) -> None:
        with self._changed:
            pool = self.pool_of.get(name)
            if pool is not None and name in self.desired.get(pool, set()):
                self.desired[pool].discard(name)
                self._noted()

    def adopt(self, machines: Mapping[str, Mapping[str, str]]) -> None:
        """Start from the machines the store has (this controller starts leading): without
        this, the next update would write a smaller set and destroy them. The store is the
        truth: what another leader destroyed meanwhile is not brought back."""
        with self._changed:
            self.desired = {pool: set(names) for pool, names in machines.items()}
            self.applied = {pool: set(names) for pool, names in machines.items()}
            self.pool_of.update({name: pool for pool, names in machines.items() for name in names})
            self.revision_of.update(
                {name: revision for names in machines.values() for name, revision in names.items()}
            )
            # the last leader may have been killed mid-update (a stack of the Automation API)
            self._recover_due = isinstance(self._stack, Recoverable)
            self._changed.notify()

    def pin(self, settings: Mapping[str, str]) -> None:
        """Make the stack say what the controller says: ``settings`` maps sp00ky:project,
        sp00ky:poolUrl and sp00ky:poolSecret to the controller's values. A value the stack
        has already must be the same (StackDisagrees names both, never a secret's value);
        one it lacks is written. The machines are labelled with the project and dial the
        URL; the guardian reads the heartbeat the controller stamps under the same project."""
        stack = self._get_stack()
        found = stack.get_all_config()
        self.project = settings.get("sp00ky:project", "")
        runs_on = found.get("sp00ky:provider")
        self.runs_on = str(getattr(runs_on, "value", runs_on) or "hetzner")
        for key, mine in settings.items():
            theirs = getattr(found.get(key), "value", found.get(key))
            if theirs is None:
                secret = key == "sp00ky:poolSecret"
                stack.set_config(key, _config_value(mine, secret=secret))
            elif theirs != mine:
                shown = "another secret" if key == "sp00ky:poolSecret" else repr(theirs)
                raise StackDisagrees(
                    f"the stack's {key} is {shown} but {PINNED.get(key, key)} is "
                    f"{'set to another' if key == 'sp00ky:poolSecret' else repr(mine)}: they "
                    f"must be the same. Set {PINNED.get(key, key)} to the stack's value, or "
                    f"`pulumi config set {key} ...` on the stack to the controller's"
                )

    def set_image(self, pool: str, image: str) -> None:
        """What the pool's machines created from the next update on boot; no update for it
        (a machine keeps the image it booted)."""
        with self._changed:
            self.images[pool] = image

    def outcomes(self) -> list[Outcome]:
        """What updates did since the last call (the tick applies them)."""
        with self._changed:
            found = list(self._outcomes)
            self._outcomes.clear()
            return found

    def close(self) -> None:
        if self.bakes is not None:
            self.bakes.close()
        with self._changed:
            self._closing = True
            self._changed.notify()
        self._thread.join(timeout=5)

    def idle(self) -> bool:
        with self._changed:
            return not (self._busy or self._recover_due or self._due())

    # --- the update loop ---------------------------------------------------------------------

    def _snapshot(self) -> dict[str, set[str]]:
        return {pool: set(names) for pool, names in self.desired.items()}

    def _noted(self) -> None:
        """Under the lock: the desired set changed (the update loop is woken)."""
        self._changed_last = self.clock()
        if self._pending_since is None:
            self._pending_since = self._changed_last
        self._changed.notify()

    def _settled(self) -> None:
        """Under the lock: wait until the desired set has been still for ``settle`` seconds,
        or SETTLE_MAX_SECONDS have passed since its first change the update will carry."""
        while not self._closing:
            since = self._changed_last if self._pending_since is None else self._pending_since
            now = self.clock()
            left = min(self._changed_last + self.settle, since + SETTLE_MAX_SECONDS) - now
            if left <= 0:
                return
            self._changed.wait(left)

    def _run(self) -> None:
        while True:
            with self._changed:
                while not (self._closing or self._recover_due or self._due()):
                    self._pending_since = None  # changes that undid each other carry nothing
                    self._changed.wait()
                recover, self._recover_due = self._recover_due, False
            if recover:
                if not self._recover():  # a live update holds the stack: look again later
                    with self._changed:
                        self._changed.wait_for(lambda: self._closing, timeout=self._backoff())
                        self._recover_due = not self._closing
                continue
            with self._changed:
                self._settled()
                if self._closing:
                    return
                wanted = self._snapshot()  # the newest desired set: bursts coalesce here
                self._pending_since = None
                self._busy = True
            try:
                locked = not self._update(wanted)
            finally:
                with self._changed:
                    self._busy = False
            if locked:
                with self._changed:  # wait, then try again (close() wakes it at once)
                    if self._retry_now:
                        self._retry_now = False
                        continue
                    self._changed.wait_for(lambda: self._closing, timeout=self._backoff())

    def _backoff(self) -> float:
        """Under the lock: how long to wait for another update's lock before trying again."""
        return min(self.lock_retry * 2.0 ** min(self._lock_tries, 8), LOCK_RETRY_MAX_SECONDS)

    def _cancel_hint(self) -> str:
        """What ends a lock no update holds any more, where this controller cannot tell."""
        name = getattr(self._stack, "name", None) or "STACK"
        return (
            f"; locked for {LOCK_HINT_SECONDS / 60:.0f} min or more: if no update runs anywhere "
            "(one killed on another host, or on a Pulumi Cloud backend, which leaves no lock "
            f"file here), `pulumi cancel --yes --stack {name}` in the project ends it"
        )

    def _held(self, since: float, message: str) -> None:
        """Under the lock: another update holds the stack (since ``since``, at the latest)."""
        if self.locked_since is None:
            self.locked_since = since
        self._lock_tries += 1
        self.lock_message = message

    def _update(self, wanted: dict[str, set[str]]) -> bool:
        """One `pulumi up` toward ``wanted``; False when the stack was locked (try again)."""
        started = self.clock()
        before = self.applied
        machines = Desired.parse(
            {
                pool: {name: self.revision_of.get(name) for name in names}
                for pool, names in wanted.items()
            }
        ).as_json()
        with self._changed:
            images = dict(self.images)
        steps = UpProgress(self.on_progress)
        try:
            stack = self._get_stack()
            stack.set_config("sp00ky:machines", _config_value(json.dumps(machines)))
            if images:
                stack.set_config("sp00ky:images", _config_value(json.dumps(images)))
            result = stack.up(
                on_output=lambda line: log.debug("pulumi: %s", line.rstrip()),
                on_event=steps.event,
            )
            # the update's own answer carries them: asking again costs two CLI runs
            outputs = getattr(result, "outputs", None)
            if outputs is None:
                outputs = stack.outputs()
        except Exception as exc:  # CommandError and friends: the message names the machines
            return self._not_updated(exc, started, (wanted, before), steps)
        self._unlocked()
        elapsed = self.clock() - started
        self.durations.append(elapsed)
        self.updates += 1
        ids = _machine_ids(outputs)
        with self._changed:
            self.applied = wanted
            self._stale = False
            for pool, names in wanted.items():
                for name in names - before.get(pool, set()):
                    self._outcomes.append(Outcome(name, "created", ids.get(name, "")))
            for pool, names in before.items():
                for name in names - wanted.get(pool, set()):
                    self._outcomes.append(Outcome(name, "destroyed"))
        self._forget_adrift(_names(wanted))
        summary = getattr(result, "summary", None)
        log.info("pulumi up took %.1fs (%s)", elapsed, getattr(summary, "result", "succeeded"))
        return True

    def _forget_adrift(self, made: set[str]) -> None:
        """After an update that went through: the server of a machine adrift that it did not
        make (its row ended between the recovery and the update) is deleted by name."""
        with self._changed:
            adrift, self._adrift = self._adrift - made, set()
        recovery = self._recovery() if adrift else None
        if recovery is None:
            return
        for name in sorted(adrift):
            try:
                recovery.forget(name)
            except Exception as exc:  # the sweep is the backstop
                log.warning("could not delete the server of machine %s: %s", name, exc)

    def _not_updated(
        self, exc: Exception, started: float,
        update: tuple[dict[str, set[str]], dict[str, set[str]]], steps: UpProgress,
    ) -> bool:  # fmt: skip
        """An update that did not go through: False when the stack was locked (try again),
        at once when its holder was gone; the machines failed otherwise."""
        if _locked(exc):
            if self._lock_left_by_the_dead():
                with self._changed:
                    self._retry_now = True
                return False
            with self._changed:
                self._held(started, _first_line(str(exc).split("stderr:")[-1]))
                held_for = self.clock() - (self.locked_since or started)
            log.warning(
                "the stack is locked by another update; trying again (%s)%s", self.lock_message,
                self._cancel_hint() if held_for >= LOCK_HINT_SECONDS else "",
            )  # fmt: skip
            return False
        elapsed = self.clock() - started
        self.durations.append(elapsed)
        self._failed(*update, str(exc), steps)
        log.warning("pulumi up failed after %.1fs: %s", elapsed, _first_line(str(exc)))
        self._unlocked()
        with self._changed:
            self._recover_due = isinstance(self._stack, Recoverable)  # the engine may have died
        return True

    def _due(self) -> bool:
        """Under the lock: an update has something to do."""
        return self._stale or self.applied != self._snapshot()

    def _recovery(self) -> Recovery | None:
        stack = self._stack
        if not isinstance(stack, Recoverable):
            return None
        forget = forget_server(self.project) if self.runs_on == "hetzner" else _keep
        return Recovery(stack, forget)

    def _lock_left_by_the_dead(self) -> bool:
        recovery = self._recovery()
        try:
            return recovery is not None and recovery.take_over_lock()
        except Exception as exc:  # the lock is then waited for, as any other
            log.warning("could not read the stack's lock: %s", exc)
            return False

    def _recover(self) -> bool:
        """Put right what a killed update left (``Recovery``) before the next update; the
        machines whose create it dropped that are still wanted are made by that update.
        False while a live update holds the stack: what it left is not known until it ends
        (it may itself be killed), so this is done again after a wait."""
        try:
            self._get_stack()
        except Refused:
            return True  # the update fails the machines, saying why
        recovery = self._recovery()
        if recovery is None:
            return True
        with self._changed:
            self._busy = True
            wanted = _names(self.desired)
        holder = ""
        try:
            took = recovery.take_over_lock()
            holder = recovery.holder()
            remade = set() if holder else recovery.pending(wanted)
        except Exception as exc:  # the next update goes as it would have
            log.warning("could not look at the stack for a killed update: %s", exc)
            took, remade = False, set()
        with self._changed:
            self._busy = False
            if holder:
                self._held(self.clock(), f"the stack is locked by {holder}")
                log.warning(
                    "event=stack_lock_held stack=%s holder=%s: its process runs; waiting for "
                    "its update to end", recovery.stack.name, holder,
                )  # fmt: skip
                return False
            self._unlocked()
            self._adrift |= remade
            if took or remade:
                self._stale = True
                self.applied = {pool: names - remade for pool, names in self.applied.items()}
                self._changed.notify()
        return True

    def on_progress(self, line: str) -> None:
        """One resource step of the running update, forwarded: the controller's log says
        what `pulumi up` is doing while it runs (a server's create takes about a minute)."""
        self.progress.append(line)
        log.info("pulumi up: %s", line)

    def _unlocked(self) -> None:
        with self._changed:
            self.locked_since, self.lock_message, self._lock_tries = None, "", 0

    def _failed(
        self, wanted: dict[str, set[str]], before: dict[str, set[str]], message: str,
        steps: UpProgress,
    ) -> None:  # fmt: skip
        """Map a failed update back to machines. Failed: those an error line of the message
        names, else (none named, none made) every machine the update was to create; they
        leave the desired set (the tick fails them). Made: those the engine's events say it
        created, with their servers' ids (with no events: every other new one, as Pulumi goes
        on with the others). A new machine neither made nor failed was never tried, and a
        removed one not deleted is still there: the next update sees to both."""
        new = _names(wanted) - _names(before)
        named = {name for name in new if _errors_name(message, name)}
        made = set(steps.made) & new if steps.heard else set()
        failed = named or (set() if made else new)
        made = made if steps.heard else new - failed
        kept = (_names(before) - _names(wanted)) - steps.deleted if steps.heard else set()
        with self._changed:
            for name in sorted(failed):
                self._outcomes.append(Outcome(name, "failed", _reason(message, name)))
                pool = self.pool_of.get(name)
                if pool is not None:
                    self.desired.get(pool, set()).discard(name)
            for name in sorted(made - failed):
                self._outcomes.append(Outcome(name, "created", steps.made.get(name, "")))
            self._stale = False  # what is left to do shows in applied: no loop of failures
            self.applied = {
                pool: (wanted.get(pool, set()) & (before.get(pool, set()) | made))
                | (before.get(pool, set()) & kept)
                for pool in set(wanted) | set(before)
            }

    def _get_stack(self) -> Stack:
        if self._stack is None:
            try:
                self._stack = self._stack_factory()
            except Exception as exc:
                raise Refused(f"cannot open the Pulumi stack: {exc}") from exc
        return self._stack


class UpProgress:
    """Turns the Automation API's engine events into one line per resource step: when a step
    starts (``create machine render-3f2a1c``) and how it ended (``... created in 41.2s`` or
    ``... failed``). Only steps that change something are told; the stack's unchanged
    resources (``same``) and reads stay quiet. Times come from the events' own clock."""

    QUIET: ClassVar[frozenset[str]] = frozenset({"same", "read", "refresh"})
    DONE: ClassVar[Mapping[str, str]] = {
        "create": "created",
        "update": "updated",
        "delete": "deleted",
        "replace": "replaced",
        "create-replacement": "created (replacement)",
        "delete-replaced": "deleted (replaced)",
    }

    def __init__(self, emit: Callable[[str], None]) -> None:
        self.emit = emit
        self.started: dict[str, int] = {}  # urn -> the step's start (event timestamp, seconds)
        # what a failed update did before it stopped, by resource name: the servers it made
        # (their ids), the resources it deleted; ``heard``: the engine sent events at all
        self.heard = False
        self.made: dict[str, str] = {}
        self.deleted: set[str] = set()

    def event(self, event: Any) -> None:
        try:
            self._event(event)
        except Exception as exc:  # progress must never fail an update
            log.debug("pulumi progress: %s", exc)

    def _event(self, event: Any) -> None:
        for attribute, phase in (
            ("resource_pre_event", "start"),
            ("res_outputs_event", "done"),
            ("res_op_failed_event", "failed"),
        ):
            found = getattr(event, attribute, None)
            if found is None or getattr(found, "metadata", None) is None:
                continue
            meta = found.metadata
            op = str(getattr(meta.op, "value", meta.op))
            self.heard = True
            if phase == "done":
                self._done(op, meta)
            if op in self.QUIET or getattr(found, "planning", False):
                return
            kind = _kind(meta.type)
            what = _resource_name(meta.urn) + (f" ({kind})" if kind != "Resource" else "")
            if phase == "start":
                self.started[meta.urn] = int(event.timestamp)
                self.emit(f"{op} {what} ...")
            else:
                took = int(event.timestamp) - self.started.pop(meta.urn, int(event.timestamp))
                ended = self.DONE.get(op, op) if phase == "done" else f"{op} failed"
                self.emit(f"{what} {ended} in {took}s")
            return

    def _done(self, op: str, meta: Any) -> None:
        name = _resource_name(meta.urn)
        if op == "create":
            outputs = getattr(getattr(meta, "new", None), "outputs", None) or {}
            self.made[name] = str(outputs.get("server_id") or "")
        elif op == "delete":
            self.deleted.add(name)


def _resource_name(urn: str) -> str:
    return urn.rsplit("::", 1)[-1]


def _kind(resource_type: str) -> str:
    """The type's last part: ``Resource`` for every dynamic resource (then the name says
    what it is: the program names servers after their machines)."""
    return resource_type.rsplit(":", 1)[-1] if resource_type else "resource"


def _config_value(text: str, secret: bool = False) -> Any:
    from pulumi.automation import ConfigValue

    return ConfigValue(value=text, secret=secret)


def _machine_ids(outputs: Mapping[str, Any]) -> dict[str, str]:
    found = outputs.get("machines")
    value = getattr(found, "value", found) or {}
    return {str(name): str(server) for name, server in dict(value).items()}


def _locked(exc: Exception) -> bool:
    """The update did not run because another holds the stack's lock."""
    from pulumi.automation.errors import ConcurrentUpdateError

    return isinstance(exc, ConcurrentUpdateError) or "the stack is currently locked" in str(exc)


def _names(machines: Mapping[str, set[str]]) -> set[str]:
    return {name for names in machines.values() for name in names}


def _errors_name(message: str, machine: str) -> bool:
    """An error line of the update's message names ``machine`` (Pulumi's progress lines name
    every machine it made: they are not errors)."""
    name = re.compile(rf"(?<![\w-]){re.escape(machine)}(?![\w-])")
    return any(name.search(line) for line in message.splitlines() if "error" in line.lower())


def _first_line(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else message


def _reason(message: str, machine: str) -> str:
    """The error line of the update that speaks of ``machine`` (Pulumi prints the resource
    first, then its error), else the update's first line."""
    lines = [line.strip() for line in message.splitlines() if machine in line]
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or [_first_line(message)])[-1][:500]


# --- what a killed update left ----------------------------------------------------------------

DYNAMIC = "pulumi-python:dynamic:Resource"  # the type of every machine (and firewall) resource


def lock_files(backend_url: str, project: str, stack: str) -> list[Path]:
    """The lock files of ``stack`` in a ``file://`` backend (another backend keeps its locks
    to itself: none)."""
    if not backend_url.startswith("file://"):
        return []
    locks = Path(unquote(urlsplit(backend_url).path)) / ".pulumi" / "locks"
    short = stack.rsplit("/", 1)[-1]
    return [*locks.glob(f"*/{project}/{short}/*.json"), *locks.glob(f"{short}/*.json")]


def stale_locks(backend_url: str, project: str, stack: str, host: str) -> list[Path]:
    """The lock files of ``stack`` whose holder was a process of ``host`` that no longer
    runs."""
    found = []
    for path in lock_files(backend_url, project, stack):
        try:
            holder = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being written or removed right now: its holder decides
        if holder.get("hostname") == host and not _runs(int(holder.get("pid") or 0)):
            found.append(path)
    return found


def _runs(pid: int) -> bool:
    """Whether a process of that id runs here (one we may not signal runs; no pid: unknown,
    so it runs)."""
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Recovery:
    """Puts right what a killed update left on the stack (the module's docstring)."""

    def __init__(self, stack: Recoverable, forget: Callable[[str], None]) -> None:
        self.stack = stack
        self.forget = forget  # deletes the server of a machine nobody wants, by its name
        self._found: tuple[str, str, str] | None = None

    def _where(self) -> tuple[str, str, str]:
        """The backend's URL, the project's name and the stack's (asked once: each question
        to the workspace is a run of the CLI)."""
        if self._found is None:
            workspace = self.stack.workspace
            self._found = (
                workspace.who_am_i().url, workspace.project_settings().name, self.stack.name
            )  # fmt: skip
        return self._found

    def take_over_lock(self) -> bool:
        """Remove the locks whose holder is gone; whether there was one."""
        removed = False
        for path in stale_locks(*self._where(), socket.gethostname()):
            holder = path.read_text().strip()
            path.unlink(missing_ok=True)
            removed = True
            log.warning(
                "event=stack_lock_taken_over stack=%s lock=%s holder=%s: its process no longer "
                "runs (killed mid-update)", self.stack.name, path, holder,
            )  # fmt: skip
        return removed

    def holder(self) -> str:
        """Who holds the stack's lock (its lock file's text), or "" when nobody does."""
        for path in lock_files(*self._where()):
            try:
                return path.read_text().strip()
            except OSError:
                continue  # removed right now: its holder is done
        return ""

    def pending(self, wanted: set[str]) -> set[str]:
        """Drop the state's pending operations; the machines whose create was pending that
        are still ``wanted`` (the next update makes them). The others' servers are deleted.
        Not while a live update holds the stack: its pending operations are its own."""
        if lock_files(*self._where()):
            return set()
        state = self.stack.export_stack()
        deployment = dict(state.deployment or {})
        operations = deployment.get("pending_operations") or []
        if not operations:
            return set()
        creating = {  # Hetzner machines: a firewall or a container has no server type
            _resource_name(op["resource"]["urn"])
            for op in operations
            if op.get("type") == "creating" and op["resource"].get("type") == DYNAMIC
            and "server_type" in (op["resource"].get("inputs") or {})
        }  # fmt: skip
        log.warning("event=pending_operations stack=%s dropped=%s: an update was killed while "
                    "it ran", self.stack.name,
                    ",".join(f"{op.get('type')}:{_resource_name(op['resource']['urn'])}"
                             for op in operations))  # fmt: skip
        deployment["pending_operations"] = []
        self.stack.import_stack(type(state)(version=state.version, deployment=deployment))
        for name in sorted(creating - wanted):
            self.forget(name)
        return creating & wanted


def _keep(name: str) -> None:
    """A stack of containers (sp00ky:provider docker): there is no server to delete."""


def forget_server(project: str) -> Callable[[str], None]:
    """Deletes the Hetzner server of a machine the store no longer wants, found by its name,
    when it carries ``project``'s label (another's is never touched)."""

    def forget(name: str) -> None:
        api = HetznerAPI.from_env()
        server = api.server_named(name)
        if server is None or server.labels.get(labels.PROJECT) != project:
            return
        api.delete_server(server.id)
        log.warning("event=server_deleted machine=%s server=%d: its create was pending in a "
                    "killed update and no machine row wants it", name, server.id)  # fmt: skip

    return forget
