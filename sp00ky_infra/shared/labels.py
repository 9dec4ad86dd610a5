"""The cloud labels every sp00ky resource carries.

Hetzner servers and firewalls, Docker containers, networks and images all use these keys; the
guardian finds a project's machines by them, so each key is spelled here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal

PREFIX: Final = "sp00ky/"
PROJECT: Final = "sp00ky/project"
POOL: Final = "sp00ky/pool"
MACHINE: Final = "sp00ky/machine"
REVISION: Final = "sp00ky/revision"  # hash of what the machine runs
LIMIT: Final = "sp00ky/limit"  # the pool's size limit: the guardian's cap is 2 x limit + 1
ROLE: Final = "sp00ky/role"  # what a resource is for, on resources that are not machines
HEARTBEAT: Final = "sp00ky/heartbeat"  # unix time of the scheduler's last stamp
RECIPE: Final = "sp00ky/recipe"  # hash of what a baked snapshot holds (shared/recipe.py)

Role = Literal["machine", "machine-image", "pool-image", "heartbeat", "snapshot"]


def machine_labels(
    project: str, pool: str, machine: str, revision: str, **extra: str
) -> dict[str, str]:
    """The labels of one pool machine (and of what belongs to it alone)."""
    return {PROJECT: project, POOL: pool, MACHINE: machine, REVISION: revision, **extra}


def selector(labels: Mapping[str, str | None]) -> str:
    """A Hetzner label selector: ``key=value`` pairs, or ``key`` alone for a value of None."""
    return ",".join(key if value is None else f"{key}={value}" for key, value in labels.items())
