"""The agent's lease arithmetic, pure: it always gives a job up before the controller can
count the lease as expired and hand the attempt to another machine."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agent.leases import (
    MIN_CALL_SECONDS,
    MIN_MARGIN_SECONDS,
    MIN_WATCH_SECONDS,
    WATCH_SECONDS,
    abandon_at,
    bounded_timeout,
    renewal_due,
    safety_margin,
    watch_pause,
)

leases = st.floats(min_value=30, max_value=3600)  # lint: lease is at least 30 s


def test_margins_for_the_docs_lease_and_short_test_leases() -> None:
    assert safety_margin(90) == 9.0  # a tenth of the default 90 s lease
    assert safety_margin(30) == 3.0
    assert safety_margin(3) == 1.0  # test timings: never more than a third of the lease
    assert safety_margin(10) == MIN_MARGIN_SECONDS


@given(
    lease=leases,
    sent=st.floats(min_value=0, max_value=1e6),
    delay=st.floats(min_value=0, max_value=600),  # the poll's trip to the controller
    drift=st.floats(min_value=0, max_value=0.05),  # the agent's clock this much slower
)
def test_the_agent_gives_up_before_the_controller_expires_the_lease(
    lease: float, sent: float, delay: float, drift: float
) -> None:
    margin = safety_margin(lease)
    # The controller renews when it *processes* the poll, at least `delay` after the send.
    expires = sent + delay + lease
    # The agent counts from the *send*, on a clock that may run up to 5% slow: its
    # `lease - margin` seconds take up to (lease - margin) / (1 - drift) real seconds.
    gives_up = sent + (abandon_at(sent, lease, margin) - sent) / (1 - drift)
    assert gives_up < expires


@given(lease=leases, renewals=st.lists(st.floats(min_value=0, max_value=100), max_size=20))
def test_only_a_successful_renewal_moves_the_point_of_giving_up(
    lease: float, renewals: list[float]
) -> None:
    margin = safety_margin(lease)
    sent = 0.0
    for step in renewals:  # each renewal is sent later than the last
        sent += step
        assert abandon_at(sent, lease, margin) == sent + lease - margin
    assert abandon_at(sent, lease, margin) > sent


@given(
    wanted=st.floats(min_value=0.1, max_value=120),
    now=st.floats(min_value=0, max_value=1e6),
    left=st.one_of(st.none(), st.floats(min_value=-100, max_value=200)),
)
def test_no_call_waits_past_the_point_of_giving_a_job_up(
    wanted: float, now: float, left: float | None
) -> None:
    give_up = None if left is None else now + left
    timeout = bounded_timeout(wanted, now, give_up)
    assert MIN_CALL_SECONDS <= timeout <= max(wanted, MIN_CALL_SECONDS)
    if give_up is None:
        assert timeout == wanted
    else:  # it ends by the give-up point (a call with no time left gets the minimum)
        assert now + timeout <= max(give_up, now + MIN_CALL_SECONDS) + 1e-6


def test_a_poll_renews_a_lease_once_it_is_a_thirtieth_of_the_lease_old() -> None:
    assert not renewal_due(100.0, 102.9, 90)  # renewed 2.9 s ago: left as it is
    assert renewal_due(100.0, 103.0, 90)  # 3 s of the default 90 s
    assert renewal_due(100.0, 101.0, 30)  # 1 s of the minimum 30 s
    assert not renewal_due(100.0, 100.05, 3)  # a test's short lease: a tenth of a second
    assert renewal_due(100.0, 100.125, 3)


@given(
    lease=st.floats(min_value=3, max_value=3600),  # short test leases too
    renewed=st.floats(min_value=0, max_value=1e6),
    trip=st.floats(min_value=0, max_value=0.2),  # each poll's round trip
)
def test_polls_that_keep_succeeding_renew_a_lease_well_before_the_agent_gives_it_up(
    lease: float, renewed: float, trip: float
) -> None:
    """A busy agent polls at least every min(1 s, lease / 6) after the last answer: the
    first poll that finds the lease due is sent long before the job would be given up."""
    every = min(1.0, lease / 6) + trip
    sent = renewed + every
    while not renewal_due(renewed, sent, lease):
        sent += every
    assert sent + trip < abandon_at(renewed, lease, safety_margin(lease)) - lease / 6


@given(
    lease=st.floats(min_value=3, max_value=3600),
    now=st.floats(min_value=0, max_value=1e6),
    running=st.lists(st.floats(min_value=0, max_value=3600), max_size=4),  # renewed this ago
    out_for=st.floats(min_value=0, max_value=3600),  # the poll out now was sent this ago
    later=st.floats(min_value=0, max_value=3600),  # a poll sent after it, this much later
)
def test_the_watchdog_never_sleeps_past_a_give_up_point(
    lease: float, now: float, running: list[float], out_for: float, later: float
) -> None:
    """Of a job running now, or of one that the poll out now, or any sent after it, brings:
    the watchdog wakes by the job's give-up point (or at once when it is past)."""
    margin = safety_margin(lease)
    points = [abandon_at(now - ago, lease, margin) for ago in running]
    poll_sent = now - out_for
    pause = watch_pause(now, min(points, default=None), poll_sent, lease, margin)
    assert MIN_WATCH_SECONDS <= pause <= WATCH_SECONDS
    arriving = [abandon_at(poll_sent, lease, margin), abandon_at(poll_sent + later, lease, margin)]
    for point in points + arriving:
        assert now + pause <= max(point, now + MIN_WATCH_SECONDS) + 1e-6
