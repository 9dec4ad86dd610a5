"""The queue counts /metrics serves are read off the scrape's path: the first scrape reads
them, later scrapes serve the last reading (at most QUEUE_READ_SECONDS old), and the reading
thread stops when nobody scrapes."""

from __future__ import annotations

import threading
import time

import pytest

from sp00ky_infra.controller import metrics
from sp00ky_infra.controller.metrics import QueueReadings
from sp00ky_infra.store.jobs import QueueStats
from tests.controllers import wait_for


def test_scrapes_serve_the_last_reading_and_the_thread_refreshes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(metrics, "QUEUE_READ_SECONDS", 0.05)
    reads: list[str] = []
    backlog = {"render": 100_000}

    def read(pool: str) -> QueueStats:
        reads.append(pool)
        return QueueStats(backlog[pool], 0, 0, 1.0)

    clock = [0.0]
    readings = QueueReadings(read, clock=lambda: clock[0])
    assert readings.get(["render"])["render"].due == 100_000  # the first scrape reads
    assert reads == ["render"]
    backlog["render"] = 3
    wait_for(lambda: readings.get(["render"])["render"].due == 3, timeout=5, what="a refresh")
    before = len(reads)
    clock[0] += metrics.QUEUE_READ_IDLE_SECONDS + 1  # nobody scrapes any more
    wait_for(
        lambda: not any(t.name == "metrics-queue" and t.is_alive() for t in threading.enumerate()),
        timeout=5, what="the reading thread to stop",
    )  # fmt: skip
    time.sleep(0.2)
    assert len(reads) <= before + 2  # it stopped reading


def test_a_failed_reading_keeps_the_last_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "QUEUE_READ_SECONDS", 0.05)
    calls = [0]

    def read(pool: str) -> QueueStats:
        calls[0] += 1
        if calls[0] > 1:
            raise OSError("the store is down")
        return QueueStats(7, 1, 2, None)

    readings = QueueReadings(read)
    assert readings.get(["render"])["render"] == QueueStats(7, 1, 2, None)
    wait_for(lambda: calls[0] >= 3, timeout=5, what="failed refreshes")
    assert readings.get(["render"])["render"] == QueueStats(7, 1, 2, None)
