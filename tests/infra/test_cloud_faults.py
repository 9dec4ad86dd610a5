"""A scale-up of 20 machines through the real Pulumi engine while the fake Hetzner API
misbehaves as the real one does under load: 5xx storms, 429s (their wait read from the
RateLimit-* headers every answer carries), creates whose answer is lost after the server was
made, and the project's server limit (``resource_limit_exceeded``) reached in the middle of
the batch. What is checked is the cloud's own list of servers: exactly the machines the store
holds, none made twice, none left behind, and the quota refusals counted by the breaker as
failed boots. Once the limit is lifted the pool converges to its 20."""

from __future__ import annotations

import time
from pathlib import Path

from sp00ky_infra.rehearse.cloud import FakeHetzner
from sp00ky_infra.shared import labels
from sp00ky_infra.store import SqlStore, open_store
from tests.infra.stack_controller import converge, firewalled_stack, fresh_controller

WANTED = 20
QUOTA = 15
STORM = [
    (503, "unavailable", None), (502, "bad_gateway", None), (429, "rate_limit_exceeded", None),
    (500, "server_error", None), (429, "rate_limit_exceeded", None), (503, "unavailable", None),
    (429, "rate_limit_exceeded", None), (504, "timeout", None),
]  # fmt: skip
LOST = [(504, "timeout"), (502, "bad_gateway"), (503, "unavailable")]  # made, answer lost


def _held(cloud: FakeHetzner, store: SqlStore) -> dict[str, str]:
    """Each server in the cloud, by name, checked against the store: a server per live row
    and its id on the row, nothing else."""
    servers = list(cloud.servers.values())
    names = [s["name"] for s in servers]
    assert len(names) == len(set(names))  # none twice
    assert all(s["labels"][labels.MACHINE] == s["name"] for s in servers)
    live = {m.name: m for m in store.machines.live("render")}
    assert sorted(names) == sorted(live)  # none left behind, none missing
    ids = {s["name"]: str(s["id"]) for s in servers}
    assert {name: m.provider_id for name, m in live.items()} == ids
    return ids


def test_a_scale_up_of_20_through_api_faults_makes_each_machine_once(
    tmp_path: Path, pulumi_bin: str
) -> None:
    with FakeHetzner() as cloud:
        project, _ = firewalled_stack(tmp_path, pulumi_bin, cloud)
        cloud.rate_limit = cloud.rate_limit_remaining = 360_000  # a 429's Reset: a second away
        store = open_store(f"sqlite:///{tmp_path}/state.db")
        try:
            # no project: no heartbeat, so every answer lost after a create is a server's
            fresh = fresh_controller(
                tmp_path, project, store, WANTED, breaker_first_pause=30.0, project=""
            )
            with fresh as (controller, provisioner):
                cloud.quota = QUOTA
                cloud.fail_next = list(STORM)
                cloud.create_then_fail = list(LOST)
                converge(controller, provisioner)
                assert not cloud.fail_next and not cloud.create_then_fail  # every fault served
                assert cloud.requests.count(("POST", "/v1/servers")) > WANTED  # tried again
                first = _held(cloud, store)
                assert len(first) == QUOTA
                refused = [
                    m
                    for m in store.machines.recent("render", limit=100)
                    if (m.failed_reason or "").startswith("refused")
                ]
                # the 5 over the limit, and any replacement the pool asked for before three
                # refusals in a row opened its breaker: each refused, each counted
                assert len(refused) >= WANTED - QUOTA
                assert all("resource_limit_exceeded" in (m.failed_reason or "") for m in refused)
                breaker = controller.pool_states.breaker("render")
                assert breaker.failures == len(refused) and breaker.is_open(time.time())

                cloud.quota = None  # the limit raised: the pool gets its 20 after the pause (30s)
                converge(controller, provisioner, updates=len(provisioner.durations) + 1)
                assert len(_held(cloud, store)) == WANTED
                assert controller.pool_states.breaker("render").failures == len(refused)
        finally:
            store.close()
