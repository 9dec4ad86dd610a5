"""A watcher sees another connection's change, at once in a burst and after a quiet spell."""

from __future__ import annotations

import time

from sp00ky_infra.store import SqlStore
from tests.test_store_contract import T0, new


def test_a_watcher_wakes_for_each_new_job_and_not_without_one(store: SqlStore) -> None:
    watcher = store.watch()
    try:
        assert watcher.wait(0.05) is False  # nothing changed
        for _ in range(3):  # a burst: each change is seen
            store.enqueue(new(), T0)
            assert watcher.wait(5) is True
        time.sleep(1.2)  # quiet: the SQLite watcher slows down; a change is still seen
        store.enqueue(new(), T0)
        assert watcher.wait(5) is True
        assert watcher.wait(0.05) is False
    finally:
        watcher.close()
