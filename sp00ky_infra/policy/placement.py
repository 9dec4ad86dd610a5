"""Which ready machine takes the next due job. Pure.

A pool that packs (``packJobs``, the default) offers work to the machine that is fullest,
then to the one that ran work most recently: surplus machines stay idle, so they can reach
``idleTimeout`` and drain. Handing work to the machine that has waited longest instead gives
every machine a job before it can be idle that long, and a pool under steady load never
shrinks. The controller (``controller.hub``) and the simulator (``simulate.model``) both order
their machines here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Standing", "before", "first", "packed", "rank_of"]


@dataclass(frozen=True, slots=True)
class Standing:
    """A ready machine as the next job's placement sees it: its row's busy slots and idle
    clock (stopped, None, while it runs work and until the tick sees it idle), and the slots
    it offers now."""

    busy_slots: int
    idle_since: float | None
    free_slots: int


Rank = tuple[int, int, float, str]


def rank_of(name: str, busy_slots: int, idle_since: float | None) -> Rank:
    """Lower goes first: the most busy slots, then a stopped idle clock (it works, or has just
    finished), then the latest idle clock, then the name (one order on every side)."""
    if idle_since is None:
        return (-busy_slots, 0, 0.0, name)
    return (-busy_slots, 1, -idle_since, name)


def rank(name: str, standing: Standing) -> Rank:
    return rank_of(name, standing.busy_slots, standing.idle_since)


def before(a: tuple[str, Standing], b: tuple[str, Standing]) -> bool:
    """Whether machine ``a`` is offered work before machine ``b``."""
    return rank(*a) < rank(*b)


def first(machines: Iterable[tuple[str, Standing]]) -> str | None:
    """The machine offered work first, of those that offer a slot; None if none does."""
    offering = [each for each in machines if each[1].free_slots > 0]
    return min(offering, key=lambda each: rank(*each))[0] if offering else None


def packed(machines: Iterable[tuple[str, Standing]]) -> list[str]:
    """The machines that offer a slot, in the order they are offered work."""
    return [
        name
        for name, standing in sorted(machines, key=lambda each: rank(*each))
        if standing.free_slots > 0
    ]
