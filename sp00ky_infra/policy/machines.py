"""The machine lifecycle as data: its states, the moves allowed between them, and the reason
each move happens. Pure; the store applies a move with one compare-and-set on the state and
refuses any move this table does not list.

    requested -> booting -> ready -> draining -> destroyed
         \\__________\\________\\________\\-> failed -> destroyed

A machine moves left to right; one that never becomes ready or stops answering is failed
instead, and is destroyed all the same (the Machine pools docs, "Machine lifecycle").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

MachineState = Literal["requested", "booting", "ready", "draining", "failed", "destroyed"]
STATES: tuple[MachineState, ...] = (
    "requested",
    "booting",
    "ready",
    "draining",
    "failed",
    "destroyed",
)
LIVE_STATES: tuple[MachineState, ...] = ("requested", "booting", "ready", "draining")
INITIAL: MachineState = "requested"  # a new row, asked of the provisioner for SCALE_UP


class Reason(StrEnum):
    """Why a machine is created or moves; the value is what its row records."""

    SCALE_UP = "scale_up"  # desired above the machines the pool has: a new, requested row
    PROVISIONED = "provisioned"  # the provisioner made it (it exists, not yet ready)
    JOINED = "joined"  # its agent traded its join token for a session
    READY = "ready"  # its backend answers its healthcheck
    BOOT_FAILED = "boot_failed"  # its agent says the backend never became ready
    REFUSED = "refused"  # the provider would not create it (a cap, a quota): a failed boot
    BOOT_TIMEOUT = "boot_timeout"  # not ready within the boot timeout
    SILENT = "silent"  # stopped answering
    IDLE_SURPLUS = "idle_surplus"  # idle for idleTimeout while the pool has more than it needs
    MAX_LIFETIME = "max_lifetime"  # lived maxLifetime: renewed piece by piece
    REVISION_CHANGED = "revision_changed"  # a deploy changed what it runs
    MANUAL = "manual"  # an operator drained it by hand
    AGENT_STOP = "agent_stop"  # its agent was stopped on the machine (SIGTERM)
    SHUTDOWN = "shutdown"  # the controller stops and takes its machines with it (`dev`)
    DRAINED = "drained"  # draining and no job left: destroy
    DESTROYED = "destroyed"  # the provisioner destroyed it (drained, failed or shut down)
    LEFT_BEHIND = "left by an earlier run"  # the provisioner reaped it when the controller started


@dataclass(frozen=True, slots=True)
class Move:
    """One allowed transition: from ``source`` to ``target``, because of ``reason``."""

    source: MachineState
    target: MachineState
    reason: Reason


def _moves(sources: Iterable[MachineState], target: MachineState, reason: Reason) -> list[Move]:
    return [Move(source, target, reason) for source in sources]


BOOTING: tuple[MachineState, ...] = ("requested", "booting")
SERVING: tuple[MachineState, ...] = ("ready", "draining")

TRANSITIONS: tuple[Move, ...] = (
    Move("requested", "booting", Reason.PROVISIONED),
    # An agent may join before the provisioner has answered; joining binds its session once.
    *_moves(BOOTING, "booting", Reason.JOINED),
    Move("booting", "ready", Reason.READY),
    *_moves(BOOTING, "failed", Reason.BOOT_FAILED),
    # Pulumi reports a refusal after its update, when the row may already be booting.
    *_moves(BOOTING, "failed", Reason.REFUSED),
    *_moves(BOOTING, "failed", Reason.BOOT_TIMEOUT),
    *_moves(SERVING, "failed", Reason.SILENT),
    Move("ready", "draining", Reason.IDLE_SURPLUS),
    Move("ready", "draining", Reason.MAX_LIFETIME),
    Move("ready", "draining", Reason.REVISION_CHANGED),
    Move("ready", "draining", Reason.MANUAL),
    Move("ready", "draining", Reason.AGENT_STOP),
    *_moves(("requested", "booting", "ready"), "draining", Reason.SHUTDOWN),
    *_moves(("draining", "failed"), "destroyed", Reason.DESTROYED),
    *_moves((*LIVE_STATES, "failed"), "destroyed", Reason.LEFT_BEHIND),
)

DRAIN_REASONS = frozenset(m.reason for m in TRANSITIONS if m.target == "draining")
FAIL_REASONS = frozenset(m.reason for m in TRANSITIONS if m.target == "failed")
# The failures the pool's breaker counts: a machine that never became ready, for whatever
# reason ("Machines keep failing to boot ... a refusal counts as a failed boot").
FAILED_BOOTS = frozenset({Reason.BOOT_FAILED, Reason.REFUSED, Reason.BOOT_TIMEOUT})


class ForbiddenMove(ValueError):
    """A move the table does not list: a bug in the caller, never a race."""


@dataclass(frozen=True, slots=True)
class Rule:
    """Every move one reason allows: from any of ``sources`` to ``target``."""

    reason: Reason
    sources: tuple[MachineState, ...]
    target: MachineState


def rule(reason: Reason) -> Rule:
    """The moves ``reason`` allows; ForbiddenMove when it allows none (SCALE_UP creates a row,
    DRAINED decides a destroy: neither moves a machine itself)."""
    moves = [move for move in TRANSITIONS if move.reason == reason]
    if not moves:
        raise ForbiddenMove(f"{reason.value!r} moves no machine; the lifecycle table lists none")
    (target,) = {move.target for move in moves}  # one reason, one target: the table says so
    return Rule(reason, tuple(move.source for move in moves), target)


def allowed(source: MachineState, target: MachineState) -> frozenset[Reason]:
    """The reasons for which a machine may move from ``source`` to ``target`` (none: never)."""
    return frozenset(m.reason for m in TRANSITIONS if (m.source, m.target) == (source, target))


def next_state(state: MachineState, reason: Reason) -> MachineState | None:
    """Where a machine in ``state`` goes for ``reason``; None when the table forbids it."""
    found = rule(reason)
    return found.target if state in found.sources else None


@dataclass(frozen=True, slots=True)
class IdleClock:
    """The idle clock of a ready machine: idle since ``since`` (None: it has a job)."""

    machine: str
    since: float | None


def idle_since(
    state: MachineState, busy_slots: int, since: float | None, now: float
) -> float | None:
    """Since when a machine is idle at ``now``: a ready machine with no job keeps its clock
    (or starts it now), a busy one has none; other states keep what they had."""
    if state != "ready":
        return since
    if busy_slots:
        return None
    return now if since is None else since
