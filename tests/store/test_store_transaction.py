"""One transaction for several store calls (an agent's poll): all commit together, a call that
raises inside is undone alone, and an error of the whole undoes every call of it."""

from __future__ import annotations

import pytest

from sp00ky_infra.store import SqlStore, StaleAttempt
from tests.store.test_store_contract import LEASE, T0, claim_one, new


def test_calls_inside_a_transaction_commit_together_and_a_refused_one_is_undone_alone(
    store: SqlStore,
) -> None:
    store.enqueue(new(), T0), store.enqueue(new(), T0)
    one, two = claim_one(store, T0), claim_one(store, T0)
    first, second = one, two  # in the order they were claimed
    with store.transaction():
        store.complete(first.id, one.attempt, {"n": 1}, T0 + 1)
        with pytest.raises(StaleAttempt):
            store.complete(second.id, "not-the-attempt", {}, T0 + 1)
        assert store.renew([(second.id, two.attempt)], T0 + 1, LEASE) == {second.id}
    assert store.get(first.id).status == "success"
    assert store.get(second.id).status == "processing"
    assert store.get(second.id).lease_expires_at == T0 + 1 + LEASE
    # a result recorded twice inside one transaction: the second is refused, exactly once
    with store.transaction(), pytest.raises(StaleAttempt):
        store.complete(first.id, one.attempt, {"n": 2}, T0 + 2)
    assert store.get(first.id).result == {"n": 1}


def test_an_error_of_the_whole_transaction_undoes_every_call_in_it(store: SqlStore) -> None:
    job = store.enqueue(new(), T0)
    running = claim_one(store, T0)
    with pytest.raises(RuntimeError), store.transaction():
        store.complete(job.id, running.attempt, {"n": 1}, T0 + 1)
        raise RuntimeError("the poll failed after the result")
    assert store.get(job.id).status == "processing"
    store.complete(job.id, running.attempt, {"n": 1}, T0 + 2)  # it can still be recorded
    assert store.get(job.id).result == {"n": 1}
