"""The guardian's verdicts, pure: which machines the cloud side destroys, whatever the
scheduler does (the Machine pools docs, "Sp00ky Cloud also watches from its side").

- no machine lives longer than 72 hours;
- machines of a scheduler silent for half an hour are destroyed;
- a pool never has more than 2 x limit + 1 machines (limit: max, or min for a fixed pool;
  the headroom covers a deploy's old machines draining while new ones start): the newest
  beyond that are destroyed, never bringing the pool below the cap.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

MAX_AGE_SECONDS = 72 * 3600.0
SILENCE_SECONDS = 30 * 60.0


class Why(StrEnum):
    TOO_OLD = "too_old"  # older than 72 hours
    SILENT_SCHEDULER = "silent_scheduler"  # its scheduler's heartbeat is 30 minutes old
    OVER_CAP = "over_cap"  # beyond 2 x limit + 1 machines in its pool
    PROJECT_DESTROYED = "project_destroyed"


@dataclass(frozen=True, slots=True)
class Machine:
    id: int
    name: str
    project: str
    pool: str
    created: float  # unix time
    limit: int | None  # from sp00ky/limit; None when missing or not a number


@dataclass(frozen=True, slots=True)
class Verdict:
    machine: Machine
    why: Why
    detail: str


def cap(limit: int) -> int:
    return 2 * limit + 1


def verdicts(
    machines: Iterable[Machine],
    heartbeats: Mapping[str, float],
    now: float,
    max_age: float = MAX_AGE_SECONDS,
    silence: float = SILENCE_SECONDS,
) -> list[Verdict]:
    """Every machine to destroy, once each, with the first reason that condemns it."""
    chosen: dict[int, Verdict] = {}
    by_pool: dict[tuple[str, str], list[Machine]] = defaultdict(list)
    for machine in machines:
        age = now - machine.created
        heard = heartbeats.get(machine.project)
        if age > max_age:
            hours = age / 3600
            chosen[machine.id] = Verdict(machine, Why.TOO_OLD, f"{hours:.1f} h old (at most 72)")
        elif heard is not None and now - heard > silence:
            minutes = (now - heard) / 60
            detail = f"scheduler of {machine.project} silent for {minutes:.0f} min"
            chosen[machine.id] = Verdict(machine, Why.SILENT_SCHEDULER, detail)
        elif heard is None and age > silence:
            detail = f"scheduler of {machine.project} never stamped a heartbeat"
            chosen[machine.id] = Verdict(machine, Why.SILENT_SCHEDULER, detail)
        else:
            by_pool[(machine.project, machine.pool)].append(machine)
    for (project, pool), members in by_pool.items():
        limits = {m.limit for m in members if m.limit is not None}
        if not limits:
            continue  # no usable limit label: the other rules still hold
        most = cap(min(limits))
        newest_first = sorted(members, key=lambda m: (m.created, m.id), reverse=True)
        excess = len(members) - most
        for machine in newest_first[: max(0, excess)]:
            detail = f"pool {project}/{pool} has {len(members)} machines; the cap is {most}"
            chosen[machine.id] = Verdict(machine, Why.OVER_CAP, detail)
    return sorted(chosen.values(), key=lambda v: (v.machine.project, v.machine.pool, v.machine.id))
