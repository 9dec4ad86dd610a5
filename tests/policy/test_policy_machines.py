"""The machine lifecycle table, and a real store that moves machines only as it allows."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sp00ky_infra.policy.machines import (
    LIVE_STATES,
    STATES,
    TRANSITIONS,
    ForbiddenMove,
    MachineState,
    Move,
    Reason,
    allowed,
    idle_since,
    next_state,
    rule,
)
from sp00ky_infra.store import Conflict, open_store
from sp00ky_infra.store.machines import Change
from tests.helpers import examples

R = Reason
# Every allowed move, with its reason: the lifecycle of the Machine pools docs, left to right, and
# failed (never ready, or stopped answering) then destroyed all the same.
EXPECTED = {
    ("requested", "booting", R.PROVISIONED),  # the provisioner made it
    ("requested", "booting", R.JOINED),  # its agent joined before the provisioner answered
    ("booting", "booting", R.JOINED),  # its agent joined: the session is bound, once
    ("booting", "ready", R.READY),  # its backend answers its healthcheck
    ("requested", "failed", R.BOOT_FAILED),  # its agent says the backend never became ready
    ("booting", "failed", R.BOOT_FAILED),
    ("requested", "failed", R.REFUSED),  # the provider would not create it
    ("booting", "failed", R.REFUSED),  # (Pulumi says so after its update)
    ("requested", "failed", R.BOOT_TIMEOUT),  # not ready within the boot timeout
    ("booting", "failed", R.BOOT_TIMEOUT),
    ("ready", "failed", R.SILENT),  # stopped answering
    ("draining", "failed", R.SILENT),
    ("ready", "draining", R.IDLE_SURPLUS),  # idle for idleTimeout, more than the pool needs
    ("ready", "draining", R.MAX_LIFETIME),  # lived maxLifetime
    ("ready", "draining", R.REVISION_CHANGED),  # a deploy changed what it runs
    ("ready", "draining", R.MANUAL),  # an operator drained it by hand
    ("ready", "draining", R.AGENT_STOP),  # its agent was stopped on the machine
    ("requested", "draining", R.SHUTDOWN),  # the controller stops and takes it along (dev)
    ("booting", "draining", R.SHUTDOWN),
    ("ready", "draining", R.SHUTDOWN),
    ("draining", "destroyed", R.DESTROYED),  # the provisioner destroyed it
    ("failed", "destroyed", R.DESTROYED),
    ("requested", "destroyed", R.LEFT_BEHIND),  # reaped at start: an earlier run left it
    ("booting", "destroyed", R.LEFT_BEHIND),
    ("ready", "destroyed", R.LEFT_BEHIND),
    ("draining", "destroyed", R.LEFT_BEHIND),
    ("failed", "destroyed", R.LEFT_BEHIND),
}


def test_the_table_lists_every_allowed_move_with_its_reason() -> None:
    assert {(m.source, m.target, m.reason) for m in TRANSITIONS} == EXPECTED
    assert len(TRANSITIONS) == len(EXPECTED)  # no move listed twice


def test_destroyed_is_final_and_every_state_is_reachable() -> None:
    assert not [m for m in TRANSITIONS if m.source == "destroyed"]
    reached, frontier = {"requested"}, ["requested"]
    while frontier:
        state = frontier.pop()
        for move in TRANSITIONS:
            if move.source == state and move.target not in reached:
                reached.add(move.target)
                frontier.append(move.target)
    assert reached == set(STATES)
    assert set(LIVE_STATES) == set(STATES) - {"failed", "destroyed"}


def test_each_reason_moves_to_one_state_or_is_no_move() -> None:
    for reason in Reason:
        if reason in (R.SCALE_UP, R.DRAINED):  # creating a row, deciding a destroy
            with pytest.raises(ForbiddenMove, match="moves no machine"):
                rule(reason)
        else:
            found = rule(reason)
            assert {Move(s, found.target, reason) for s in found.sources} <= set(TRANSITIONS)


def test_forbidden_moves_are_named_as_such() -> None:
    assert allowed("ready", "requested") == frozenset()
    assert allowed("destroyed", "ready") == frozenset()
    assert next_state("ready", R.READY) is None
    assert next_state("draining", R.IDLE_SURPLUS) is None
    assert next_state("failed", R.DESTROYED) == "destroyed"
    assert allowed("booting", "failed") == {R.BOOT_FAILED, R.REFUSED, R.BOOT_TIMEOUT}


@pytest.mark.parametrize(
    ("state", "busy", "since", "expected"),
    [
        ("ready", 0, None, 100.0),  # idle from now on
        ("ready", 0, 40.0, 40.0),  # still idle: the clock runs on
        ("ready", 1, 40.0, None),  # a job: the clock stops
        ("ready", 2, None, None),
        ("booting", 0, None, None),  # only a ready machine is idle
        ("draining", 0, 40.0, 40.0),  # kept as it was
    ],
)
def test_the_idle_clock(
    state: MachineState, busy: int, since: float | None, expected: float | None
) -> None:
    assert idle_since(state, busy, since, 100.0) == expected


# --- the table and a real store, driven by random events ---------------------------------------

JOIN = "join"  # the agent's join: a move that also binds a session, only once
events = st.lists(st.sampled_from([*Reason, JOIN]), max_size=12)


def test_a_real_store_moves_machines_only_as_the_table_allows(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/state.db")
    names = (f"m{n}" for n in itertools.count())

    @settings(
        max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )  # bounded: a few seconds
    @given(events)
    def run(sequence: list[Reason | str]) -> None:
        name = next(names)
        machines = store.machines
        state: MachineState = machines.add(name, "render", "local", "r1", 1, 0.0).state
        joined = False
        for at, event in enumerate(sequence, start=1):
            before = state
            if event == JOIN:
                expected = next_state(state, R.JOINED) if not joined else None
                if expected is None:
                    with pytest.raises(Conflict):
                        machines.join(name, "session", float(at))
                else:
                    machines.join(name, "session", float(at))
                    joined = True
            else:
                reason = Reason(event)
                if reason in (R.SCALE_UP, R.DRAINED):
                    with pytest.raises(ForbiddenMove):
                        machines.move(name, reason, float(at))
                    continue
                expected = next_state(state, reason)
                moved = machines.move(name, reason, float(at), Change(detail="why"))
                assert moved == (expected is not None), (before, reason)
            state = machines.get(name).state
            assert state in STATES and state == (expected or before)
            if state != before:  # a move the table allows, and for this reason
                assert (R.JOINED if event == JOIN else Reason(event)) in allowed(before, state)

    try:
        run()
    finally:
        store.close()
