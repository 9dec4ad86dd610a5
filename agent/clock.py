"""The agent's time: a clock its waits take (the machine's monotonic clock, or a test's) and
the schedule of a check repeated until something answers.

A check that waits for something about to happen (a backend starting, the Docker engine
coming up) looks again soon at first and less often the longer it waits: it sees a quick
start within tens of milliseconds, and a slow one costs ten looks a second, not a busy loop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Protocol

FIRST_LOOK_SECONDS = 0.05
# A look is a connection over loopback: cheap. A longer pause would only add to the boot
# (on average half a pause) of every backend that takes more than a moment to start.
LOOK_CAP_SECONDS = 0.1


class Clock(Protocol):
    """Monotonic time and a wait that an event can end early (``Monotonic``, or a test's)."""

    def now(self) -> float: ...

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """Wait until ``event`` is set or ``seconds`` have passed; whether it is set."""
        ...


class Monotonic:
    def now(self) -> float:
        return time.monotonic()

    def wait(self, event: threading.Event, seconds: float) -> bool:
        return event.wait(seconds)


def looks(first: float = FIRST_LOOK_SECONDS, cap: float = LOOK_CAP_SECONDS) -> Iterator[float]:
    """The pauses between looks: ``first``, doubling each time, never more than ``cap``."""
    pause = first
    while True:
        yield pause
        pause = min(pause * 2, cap)
