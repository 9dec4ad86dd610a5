"""How many machines a pool wants: the docs' rule, evaluated every tick. Pure.

capacity = busy slots + queued jobs + buffer x slots
needed   = ceil(capacity / slots)
desired  = autoscale ? clamp(max(min, needed), min, max) : min
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol


class SizingSettings(Protocol):
    """A pool's sizing settings as the config model has them (``config.Pool`` is one)."""

    @property
    def min(self) -> int: ...
    @property
    def max(self) -> int | None: ...
    @property
    def autoscale(self) -> bool: ...
    @property
    def buffer(self) -> int: ...
    @property
    def slots(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Shape:
    """The sizing settings of one pool."""

    min: int
    max: int | None
    autoscale: bool
    buffer: int
    slots: int

    @classmethod
    def of(cls, pool: SizingSettings) -> Shape:
        """The shape of a configured pool (the controller and the simulator both size by it)."""
        return cls(pool.min, pool.max, pool.autoscale, pool.buffer, pool.slots)


def capacity(shape: Shape, busy_slots: int, queued: int) -> int:
    """Slots the pool should have: busy ones, the queued jobs' (``queued`` counts the slots
    they need, not the jobs: a job of poolSlots 2 needs two), and the warm buffer."""
    return busy_slots + queued + shape.buffer * shape.slots


def desired_machines(shape: Shape, busy_slots: int, queued: int) -> int:
    """The machines the pool wants now."""
    if not shape.autoscale:
        return shape.min
    needed = math.ceil(capacity(shape, busy_slots, queued) / shape.slots)
    top = shape.max if shape.max is not None else shape.min
    return max(shape.min, min(max(shape.min, needed), top))


def queue_cap(shape: Shape) -> int:
    """Queued jobs beyond this cannot change the desired count: a count may stop here.

    Counting at most this many keeps a tick's cost flat in the number of pending jobs.
    """
    top = shape.max if shape.autoscale and shape.max is not None else shape.min
    return top * shape.slots + 1
