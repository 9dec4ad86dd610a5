"""The project's Hetzner API budget as this process sees it: what it spent, what is left.

Hetzner allows a project ``RateLimit-Limit`` requests an hour (3,600), refilled one a second,
and every answer says what is left (``RateLimit-Remaining``, ``domain.RateLimit``). Every
client of a process writes to one ``Budget`` (``LEDGER``): the requests it sent, by caller
(``heartbeat``, ``prices``, ``guardian``, ...) and method, and the last RateLimit it read.

The reserve: below ``reserve`` of the limit (SPKY_HETZNER_RESERVE, a fraction, 0.1 unless
set) ``low()`` is true, and the controller sends nothing that can wait (new machines, the
drains of idle machines), so the guardian, which never waits, always has the requests it
needs to delete. ``pattern`` names a request the way the counts do (``GET /servers/{id}``).
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Mapping

from sp00ky_infra.hetzner.domain import RateLimit
from sp00ky_infra.hetzner.errors import HcloudError

RESERVE_ENV = "SPKY_HETZNER_RESERVE"
DEFAULT_RESERVE = 0.1
INVALID_SETTING = "invalid_setting"


def pattern(method: str, path: str) -> str:
    """``GET /servers/{id}`` for ``GET /servers/1042?x=1``: ids become ``{id}``, the query
    goes, so the requests of one kind count together."""
    parts = path.split("?", 1)[0].strip("/").split("/")
    named = ["{id}" if part.isdigit() else part for part in parts]
    return f"{method.upper()} /{'/'.join(named)}"


def reserve_from_env(env: Mapping[str, str] | None = None) -> float:
    """SPKY_HETZNER_RESERVE as a fraction of the hourly limit; DEFAULT_RESERVE when unset."""
    env = os.environ if env is None else env
    text = env.get(RESERVE_ENV, "").strip()
    if not text:
        return DEFAULT_RESERVE
    try:
        reserve = float(text)
    except ValueError:
        reserve = -1.0
    if not 0.0 <= reserve < 1.0:
        raise HcloudError(
            INVALID_SETTING,
            f"{RESERVE_ENV} is {text!r}: set it to a fraction of the hourly request limit "
            f"from 0 to below 1 (e.g. {DEFAULT_RESERVE}), or unset it",
        )
    return reserve


class Budget:
    """Requests sent by (caller, method) and the last RateLimit read; thread-safe."""

    def __init__(self, reserve: float | None = None) -> None:
        self._reserve = reserve
        self._lock = threading.Lock()
        self._sent: Counter[tuple[str, str]] = Counter()
        self._last: RateLimit | None = None

    @property
    def reserve(self) -> float:
        """The fraction kept: as given, else SPKY_HETZNER_RESERVE read now."""
        return reserve_from_env() if self._reserve is None else self._reserve

    def spent(self, caller: str, method: str, rate_limit: RateLimit | None) -> None:
        """One request sent; ``rate_limit`` is what its answer said (None: no answer)."""
        with self._lock:
            self._sent[(caller, method.upper())] += 1
            if rate_limit is not None:
                self._last = rate_limit

    def sent(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._sent)

    @property
    def last(self) -> RateLimit | None:
        return self._last

    def low(self) -> bool:
        """The last answer left less than the reserve (False before any answer)."""
        last = self._last
        return last is not None and last.remaining < self.reserve * last.limit

    def why_low(self) -> str:
        """What ``low()`` saw, for a log line or an event."""
        last = self._last
        if last is None:
            return "no Hetzner API answer seen yet"
        return (
            f"the Hetzner API budget is below its reserve: {last.remaining} of {last.limit} "
            f"requests left this hour, {self.reserve:.0%} kept for the guardian ({RESERVE_ENV})"
        )


LEDGER = Budget()  # this process's: every HetznerAPI writes here unless given another
