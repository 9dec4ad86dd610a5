"""Lease safety, pure: when the agent must give a job up.

The controller counts an attempt's lease from when it *processed* the renewing poll; the
agent counts from when it *sent* that poll, which is never later. Giving the job up a safety
margin before (send time + lease) therefore stops it before the controller can count the
lease as expired and hand the attempt to another machine, whatever the network's delay; the
margin also absorbs the two clocks running at slightly different rates.

The agent enforces that point on its own clock (a watchdog thread, ``agent.watchdog``), never
only between network calls: a poll blocked by a silent partition cannot delay it. Every call
is also given a timeout that ends by then (``bounded_timeout``).
"""

from __future__ import annotations

MIN_MARGIN_SECONDS = 2.0
MIN_CALL_SECONDS = 0.05  # a call gets at least this long, even with no time left
RENEW_AFTER_DIVISOR = 30  # a poll renews a lease once it is lease / 30 old
WATCH_SECONDS = 1.0  # the watchdog looks at least this often
MIN_WATCH_SECONDS = 0.005  # and sleeps at least this long


def safety_margin(lease: float) -> float:
    """A tenth of the lease, at least 2 s, at most a third of it (9 s for the default 90 s)."""
    return min(lease / 3, max(MIN_MARGIN_SECONDS, lease / 10))


def renewal_due(renewed_at: float, now: float, lease: float) -> bool:
    """Whether a poll sent at ``now`` asks to renew a lease last renewed by the poll sent at
    ``renewed_at``: once it is a thirtieth of the lease old (3 s of the default 90 s). A
    younger lease is left as it is, which saves the controller a write for every running job
    on every poll (under load a machine polls every few milliseconds); the agent counts only
    the polls that renewed, so its own clock still gives the job up in time."""
    return now - renewed_at >= lease / RENEW_AFTER_DIVISOR


def watch_pause(
    now: float, give_up: float | None, poll_sent: float, lease: float, margin: float
) -> float:
    """How long the watchdog may sleep at ``now`` without a notification: until the first
    running job's give-up point (``give_up``; None when none runs) or the earliest a job the
    poll out now (sent at ``poll_sent``; any later poll is sent later) could be given up,
    whichever is first, at most WATCH_SECONDS. Renewals only move give-up points later, so
    nothing else can bring one closer."""
    first = poll_sent + lease - margin
    if give_up is not None:
        first = min(first, give_up)
    return max(MIN_WATCH_SECONDS, min(WATCH_SECONDS, first - now))


def abandon_at(renewal_sent_at: float, lease: float, margin: float) -> float:
    """When a job whose last successful renewal was sent at ``renewal_sent_at`` is given up."""
    return renewal_sent_at + lease - margin


def bounded_timeout(wanted: float, now: float, give_up_at: float | None) -> float:
    """A network call's timeout: what it wants, but never past the point of giving a job up
    (``give_up_at``, on the same clock as ``now``; None when no job holds a lease). A
    blocked call then returns in time for the loop to act on it; the watchdog gives the job
    up on its own clock whether or not the call returns."""
    if give_up_at is None:
        return wanted
    return max(MIN_CALL_SECONDS, min(wanted, give_up_at - now))
