"""Each table's job policy in the store: sp00ky.yml's written only where the file's lines
changed, a live retune kept across deploys that leave them alone, bad values refused, and the
retries a new job takes when it sets none."""

from __future__ import annotations

import pytest

from sp00ky_infra.client import Client
from sp00ky_infra.store import InvalidJob, SqlStore
from sp00ky_infra.store.policies import TablePolicy
from tests.helpers import ROOT

T0 = 1_700_000_000.0


def test_a_live_retune_outlives_an_unchanged_file_and_a_changed_one_wins(
    store: SqlStore,
) -> None:
    file = {"job": TablePolicy(8), "mail": TablePolicy(None, 5, "exponential")}
    assert store.policies.declare(file, T0) == ["job", "mail"]
    assert store.policies.declare(file, T0 + 1) == []  # a restart with the same file
    store.policies.retune("job", {"concurrency": 20}, T0 + 2, "jobs policy")
    assert store.policies.declare(file, T0 + 3) == []
    kept = store.policies.read()
    assert kept["job"].policy == TablePolicy(20) and kept["job"].updated_by == "jobs policy"
    assert kept["mail"].policy == TablePolicy(None, 5, "exponential")
    changed = {**file, "job": TablePolicy(12)}
    assert store.policies.declare(changed, T0 + 4) == ["job"]  # the deploy changed the line
    after = store.policies.read()["job"]
    assert after.policy == TablePolicy(12) and after.updated_by == "sp00ky.yml"
    assert after.updated_at == T0 + 4


def test_a_retune_changes_only_what_it_names_and_refuses_bad_values(store: SqlStore) -> None:
    store.policies.declare({"job": TablePolicy(8, 2, "linear")}, T0)
    kept = store.policies.retune("job", {"max_retries": 0}, T0 + 1, "admin API")
    assert kept.policy == TablePolicy(8, 0, "linear")
    kept = store.policies.retune("job", {"concurrency": None}, T0 + 2, "admin API")
    assert kept.policy == TablePolicy(None, 0, "linear")  # no cap
    for changes, message in (
        ({"concurrency": 0}, "concurrency 0: at least 1"),
        ({"max_retries": -1}, "max_retries -1: 0 or more"),
        ({"retry_strategy": "random"}, "retry_strategy 'random': one of linear, exponential"),
        ({"priority": 3}, "no policy setting priority"),
    ):
        with pytest.raises(InvalidJob, match=message):
            store.policies.retune("job", changes, T0 + 3, "admin API")
    assert store.policies.read()["job"].policy == TablePolicy(None, 0, "linear")


def test_a_new_job_takes_its_table_s_retries_unless_it_sets_its_own(store: SqlStore) -> None:
    client = Client(store, ROOT / "examples" / "sp00ky.yml")
    assert client.run("renderer", "/render", {"gameId": "a"}).max_retries == 3  # the default
    store.policies.retune("render_job", {"max_retries": 7, "retry_strategy": "exponential"},
                          T0, "jobs policy")  # fmt: skip
    client._policies_at = float("-inf")  # read again now, not at the next refresh
    taken = client.run("renderer", "/render", {"gameId": "b"})
    assert (taken.max_retries, taken.retry_strategy) == (7, "exponential")
    own = client.run("renderer", "/render", {"gameId": "c"}, max_retries=1)
    assert (own.max_retries, own.retry_strategy) == (1, "exponential")
