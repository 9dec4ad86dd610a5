"""Lease safety, pure: when the agent must give a job up.

The controller counts an attempt's lease from when it *processed* the renewing poll; the
agent counts from when it *sent* that poll, which is never later. Giving the job up a safety
margin before (send time + lease) therefore stops it before the controller can count the
lease as expired and hand the attempt to another machine, whatever the network's delay; the
margin also absorbs the two clocks running at slightly different rates.
"""

from __future__ import annotations

MIN_MARGIN_SECONDS = 2.0


def safety_margin(lease: float) -> float:
    """A tenth of the lease, at least 2 s, at most a third of it (9 s for the default 90 s)."""
    return min(lease / 3, max(MIN_MARGIN_SECONDS, lease / 10))


def abandon_at(renewal_sent_at: float, lease: float, margin: float) -> float:
    """When a job whose last successful renewal was sent at ``renewal_sent_at`` is given up."""
    return renewal_sent_at + lease - margin
