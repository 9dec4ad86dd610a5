"""The per-pool breaker on failed boots. Pure: state in, state out, ``now`` an argument.

After three failed boots in a row the pool creates no machine for a minute; each time it
opens again the pause doubles, up to fifteen minutes. A machine that boots fine closes it.
A provisioner's refusal (a machine cap, a quota) counts as a failed boot.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

FAILURES_TO_OPEN = 3  # the Machine pools docs: "After three failed boots in a row"
FIRST_PAUSE_SECONDS = 60.0  # "stops creating machines for a minute"
MAX_PAUSE_SECONDS = 900.0  # "doubling up to fifteen"


@dataclass(frozen=True, slots=True)
class Breaker:
    failures: int = 0  # failed boots in a row
    opened: int = 0  # times it opened since it last closed: the next pause doubles
    open_until: float | None = None

    def allows(self, now: float) -> bool:
        """Whether the pool may create a machine at ``now``."""
        return self.open_until is None or now >= self.open_until

    def is_open(self, now: float) -> bool:
        return not self.allows(now)

    def failed(
        self,
        now: float,
        first_pause: float = FIRST_PAUSE_SECONDS,
        max_pause: float = MAX_PAUSE_SECONDS,
    ) -> Breaker:
        """A boot failed: count it, and open (again) once three in a row have failed."""
        failures = self.failures + 1
        if failures < FAILURES_TO_OPEN or self.is_open(now):
            return replace(self, failures=failures)
        return Breaker(
            failures=failures,
            opened=self.opened + 1,
            open_until=now + pause(self.opened, first_pause, max_pause),
        )

    def succeeded(self) -> Breaker:
        """A machine booted fine: the breaker closes and forgets."""
        return Breaker()


def pause(
    opened_before: int, first: float = FIRST_PAUSE_SECONDS, cap: float = MAX_PAUSE_SECONDS
) -> float:
    """The pause of the breaker's (``opened_before`` + 1)th opening: 1, 2, 4, 8, 15 minutes."""
    return min(first * 2.0 ** min(opened_before, 32), cap)
