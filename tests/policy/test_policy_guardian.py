"""The guardian's verdicts, pure: table cases and invariants."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sp00ky_infra.policy.guardian import MAX_AGE_SECONDS, Machine, Why, cap, verdicts

NOW = 1_800_000_000.0
HOUR = 3600.0


def m(
    id: int, age_h: float = 1, project: str = "p", pool: str = "render", limit: int | None = 2
) -> Machine:
    return Machine(id, f"{pool}-{id}", project, pool, NOW - age_h * HOUR, limit)


LIVE = {"p": NOW - 60}


def _why(found: list) -> dict[int, Why]:  # type: ignore[type-arg]
    return {v.machine.id: v.why for v in found}


def test_a_pool_exactly_at_its_cap_loses_nothing() -> None:
    assert cap(2) == 5
    assert verdicts([m(i) for i in range(5)], LIVE, NOW) == []


def test_beyond_the_cap_the_newest_go_and_never_below_it() -> None:
    machines = [m(i, age_h=10 - i) for i in range(8)]  # m7 is the newest
    found = verdicts(machines, LIVE, NOW)
    assert _why(found) == {7: Why.OVER_CAP, 6: Why.OVER_CAP, 5: Why.OVER_CAP}
    assert "pool p/render has 8 machines; the cap is 5" in found[0].detail


def test_older_than_72_hours() -> None:
    found = verdicts([m(1, age_h=72.1), m(2, age_h=71.9)], LIVE, NOW)
    assert _why(found) == {1: Why.TOO_OLD}


def test_a_silent_scheduler_loses_its_machines_a_live_one_keeps_them() -> None:
    beats = {"quiet": NOW - 31 * 60, "p": NOW - 29 * 60}
    found = verdicts([m(1, project="quiet"), m(2, project="p")], beats, NOW)
    assert _why(found) == {1: Why.SILENT_SCHEDULER}
    # never stamped: its machines go once they are older than the silence
    assert _why(
        verdicts([m(3, age_h=0.4, project="new"), m(4, age_h=1, project="new")], {}, NOW)
    ) == {4: Why.SILENT_SCHEDULER}


def test_a_fixed_pool_caps_at_twice_min_plus_one_and_a_missing_limit_caps_nothing() -> None:
    assert len(verdicts([m(i, limit=1) for i in range(4)], LIVE, NOW)) == 1
    assert verdicts([m(i, limit=None) for i in range(40)], LIVE, NOW) == []


LIMITS = {"a": {"x": 1, "y": 2}, "b": {"x": 0, "y": 3}}  # one limit a pool, as its labels say


def _with_pool_limit(found: list[Machine]) -> list[Machine]:
    return [
        Machine(x.id, x.name, x.project, x.pool, x.created, LIMITS[x.project][x.pool])
        for x in found
    ]


machines = st.lists(
    st.builds(
        Machine,
        id=st.integers(1, 10**6),
        name=st.just("m"),
        project=st.sampled_from(["a", "b"]),
        pool=st.sampled_from(["x", "y"]),
        created=st.floats(NOW - 100 * HOUR, NOW),
        limit=st.just(0),
    ),
    max_size=40,
    unique_by=lambda machine: machine.id,
).map(_with_pool_limit)
beats = st.fixed_dictionaries(
    {"a": st.floats(NOW - 2 * HOUR, NOW), "b": st.floats(NOW - 2 * HOUR, NOW)}
)


@given(machines, beats)
def test_after_a_pass_no_pool_is_above_its_cap(
    found: list[Machine], heard: dict[str, float]
) -> None:
    destroyed = {v.machine.id for v in verdicts(found, heard, NOW)}
    left: dict[tuple[str, str], list[Machine]] = {}
    for machine in found:
        if machine.id not in destroyed:
            left.setdefault((machine.project, machine.pool), []).append(machine)
    for members in left.values():
        assert len(members) <= cap(members[0].limit or 0)


@given(machines, beats)
def test_a_live_schedulers_young_machines_within_the_cap_are_never_chosen(
    found: list[Machine], heard: dict[str, float]
) -> None:
    chosen = verdicts(found, heard, NOW)
    for verdict in chosen:
        machine = verdict.machine
        live = NOW - heard[machine.project] <= 30 * 60
        young = NOW - machine.created <= MAX_AGE_SECONDS
        if live and young:
            assert verdict.why == Why.OVER_CAP
            peers = [x for x in found if (x.project, x.pool) == (machine.project, machine.pool)]
            assert len(peers) > cap(machine.limit or 0)
            newer = [x for x in peers if (x.created, x.id) > (machine.created, machine.id)]
            assert len(newer) < len(peers) - cap(machine.limit or 0)  # only the newest excess
