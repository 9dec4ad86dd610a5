"""What the controller measures as things happen: dispatch, job and boot times, finished jobs,
ticks. Each controller has its own registry (tests run several in one process); /metrics
(``metrics.py``) adds what is read at scrape time.

Dispatch is "job due -> backend POST sent": the controller knows when a job was due and when a
poll claimed it; the agent (which keeps no listener) says, on its next poll or with the
result, how long after that poll's answer it sent the POST, on its own monotonic clock, so the
two clocks never have to agree.
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Histogram

# Dispatch is milliseconds on a warm machine and a boot (a minute or more) on a cold pool.
DISPATCH_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
JOB_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 1800, 3600, 4 * 3600, 8 * 3600)
BOOT_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 45, 60, 90, 120, 180, 300, 600)
TICK_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
MAX_PENDING_DISPATCHES = 100_000  # claimed attempts waiting for their agent's measurement


class Measures:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.dispatch = Histogram(
            "sp00ky_dispatch_seconds",
            "From a job being due to its backend POST being sent on a machine.",
            ["pool"],
            buckets=DISPATCH_BUCKETS,
            registry=self.registry,
        )
        self.job_duration = Histogram(
            "sp00ky_job_duration_seconds",
            "One attempt, from its claim to its result, by outcome (success, failed, cancelled).",
            ["pool", "outcome"],
            buckets=JOB_BUCKETS,
            registry=self.registry,
        )
        self.boot = Histogram(
            "sp00ky_boot_seconds",
            "A machine from requested to ready.",
            ["pool", "provider"],
            buckets=BOOT_BUCKETS,
            registry=self.registry,
        )
        self.finished = Counter(
            "sp00ky_jobs_finished",
            "Jobs that ended (success or failed for good), by the code of their last error.",
            ["pool", "outcome", "code"],
            registry=self.registry,
        )
        self.tick = Histogram(
            "sp00ky_tick_seconds",
            "One tick of the leader: sweep, observe, plan and apply.",
            buckets=TICK_BUCKETS,
            registry=self.registry,
        )
        self._lock = threading.Lock()
        self._claims: dict[str, tuple[str, float]] = {}  # attempt -> (pool, due -> claim)

    def claimed(self, attempt: str, pool: str, waited: float) -> None:
        """A poll handed out ``attempt``, ``waited`` seconds after its job was due."""
        with self._lock:
            if len(self._claims) >= MAX_PENDING_DISPATCHES:  # agents that never said: forget
                self._claims.pop(next(iter(self._claims)))
            self._claims[attempt] = (pool, max(waited, 0.0))

    def posted(self, attempt: str, after: float | None) -> None:
        """The agent sent ``attempt``'s POST ``after`` seconds after the poll answer that
        carried it: the dispatch is complete (counted once, whichever report comes first)."""
        if after is None:
            return
        with self._lock:
            claim = self._claims.pop(attempt, None)
        if claim is not None:
            pool, waited = claim
            self.dispatch.labels(pool).observe(waited + max(after, 0.0))

    def forget(self, attempt: str) -> None:
        with self._lock:
            self._claims.pop(attempt, None)

    def job_finished(self, pool: str, outcome: str, code: str = "") -> None:
        self.finished.labels(pool, outcome, code).inc()
