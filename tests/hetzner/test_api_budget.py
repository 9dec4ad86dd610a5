"""The Hetzner API budget: every request counted on both ends, what an hour of a controller
holding 50 machines spends, and the reserve the controller leaves for the guardian."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import struct_pb2
from prometheus_client import generate_latest
from pulumi.dynamic.dynamic import serialize_provider
from pulumi.runtime.proto import provider_pb2

from sp00ky_infra.controller import explain
from sp00ky_infra.controller.metrics import HetznerBudgetCollector
from sp00ky_infra.controller.provisioners import MachineSpec, Provisioned
from sp00ky_infra.hetzner import HcloudError, HetznerAPI
from sp00ky_infra.hetzner.budget import RESERVE_ENV, Budget, pattern, reserve_from_env
from sp00ky_infra.hetzner.heartbeat import Stamper
from sp00ky_infra.infra.machine import HetznerMachineProvider
from sp00ky_infra.policy.machines import Reason
from sp00ky_infra.policy.plan import Create, Destroy, Drain, Plan
from sp00ky_infra.rehearse.cloud import TOKEN, FakeHetzner
from sp00ky_infra.shared import labels
from tests.controllers import add_ready_machine
from tests.dynamic_host import dynamic_host
from tests.hetzner.api_hour import Elsewhere, a_controller, an_hour, machine_props

URN = "urn:pulumi:prod::shop::sp00ky:infra:HetznerPool$pulumi-python:dynamic:Resource::render-0"


@pytest.fixture
def fake() -> Iterator[FakeHetzner]:
    with FakeHetzner() as api:
        yield api


def _api(fake: FakeHetzner, budget: Budget, caller: str = "test") -> HetznerAPI:
    return HetznerAPI(
        TOKEN, fake.url, wait=lambda attempt, after: 0.0, sleep=lambda _: None,
        caller=caller, budget=budget,
    )  # fmt: skip


def test_a_request_is_named_by_its_method_and_path_pattern() -> None:
    assert pattern("get", "/servers/1042?x=1") == "GET /servers/{id}"
    assert pattern("POST", "/servers/7/actions/create_image") == (
        "POST /servers/{id}/actions/create_image"
    )
    assert pattern("GET", "/servers") == "GET /servers"


def test_the_client_and_the_fake_count_the_same_requests_retries_included(
    fake: FakeHetzner,
) -> None:
    budget = Budget()
    api = _api(fake, budget, caller="guardian")
    fake.add_server("a", {"sp00ky/project": "shop"})
    fake.fail_next = [(503, "unavailable", None)]  # one GET answered 503, then again
    (server,) = api.servers("sp00ky/project")
    api.get_server(server.id)
    api.delete_server(server.id)
    expected = Counter({"GET /servers": 2, "GET /servers/{id}": 1, "DELETE /servers/{id}": 1})
    assert fake.counted() == expected and api.sent == expected
    assert budget.sent() == {("guardian", "GET"): 3, ("guardian", "DELETE"): 1}
    assert budget.last is not None and budget.last.remaining == 3600 - 4


def test_below_the_reserve_the_budget_is_low_and_the_reserve_is_a_setting(
    fake: FakeHetzner, monkeypatch: pytest.MonkeyPatch
) -> None:
    budget = Budget()
    api = _api(fake, budget)
    assert not budget.low()  # no answer seen yet: nothing to hold back for
    fake.rate_limit_remaining = 361.0
    api.servers()
    assert budget.last is not None and budget.last.remaining == 360 and not budget.low()
    api.servers()
    assert budget.low() and "359 of 3600" in budget.why_low()
    monkeypatch.setenv(RESERVE_ENV, "0.05")
    assert not budget.low()
    monkeypatch.setenv(RESERVE_ENV, "ten percent")
    with pytest.raises(HcloudError, match=f"{RESERVE_ENV} is 'ten percent': set it to a fraction"):
        reserve_from_env()
    assert reserve_from_env({}) == 0.1


def test_a_heartbeat_stamp_is_one_request_after_the_first_and_survives_a_deleted_firewall(
    fake: FakeHetzner,
) -> None:
    stamper, api = Stamper(), _api(fake, Budget())
    stamper.stamp(api, "shop", 100.0)
    assert fake.counted() == Counter({"GET /firewalls": 1, "POST /firewalls": 1})
    fake.requests.clear()
    stamper.stamp(api, "shop", 160.0)
    assert fake.counted() == Counter({"PUT /firewalls/{id}": 1})
    (firewall,) = fake.firewalls.values()
    assert firewall["labels"]["sp00ky/heartbeat"] == "160"
    fake.firewalls.clear()  # deleted by hand: found missing, made again
    stamper.stamp(api, "shop", 220.0)
    (again,) = fake.firewalls.values()
    assert again["labels"]["sp00ky/heartbeat"] == "220"


def test_metrics_export_the_requests_by_caller_and_method_and_the_budget_left(
    fake: FakeHetzner,
) -> None:
    budget = Budget(reserve=0.1)
    assert b"\nsp00ky_hetzner_ratelimit_remaining " not in generate_latest(
        HetznerBudgetCollector(budget)
    )  # no sample before the first answer
    _api(fake, budget, caller="heartbeat").firewalls()
    _api(fake, budget, caller="prices").pricing()
    text = generate_latest(HetznerBudgetCollector(budget)).decode()
    assert 'sp00ky_hetzner_requests_total{caller="heartbeat",method="GET"} 1.0' in text
    assert 'sp00ky_hetzner_requests_total{caller="prices",method="GET"} 1.0' in text
    assert "sp00ky_hetzner_ratelimit_remaining 3598.0" in text
    assert "sp00ky_hetzner_ratelimit_limit 3600.0" in text
    assert "sp00ky_hetzner_budget_low 0.0" in text


class OnHetzner(Elsewhere):
    """A provisioner of Hetzner machines that remembers what it was asked."""

    name = "onhetzner"
    runs_on = "hetzner"

    def __init__(self) -> None:
        self.made: list[str] = []
        self.destroyed: list[str] = []

    def create(self, spec: MachineSpec) -> Provisioned:
        self.made.append(spec.name)
        return super().create(spec)

    def destroy(self, name: str, provider_id: str | None, provider_state: str | None) -> None:
        self.destroyed.append(name)


def test_below_the_reserve_new_machines_and_idle_drains_wait_and_failed_ones_still_go(
    tmp_path: Path,
) -> None:
    provisioner = OnHetzner()
    with a_controller(tmp_path, provisioner) as controller:
        store = controller.store
        executor, deployment, now = controller.executor, controller.deployment, time.time()
        executor.budget = Budget()  # this test's, not the process's
        machines = store.machines
        add_ready_machine(store, "render-idle", "r", 1, "session", now)
        machines.add("render-broken", "render", provisioner.name, "r", 1, now)
        machines.move("render-broken", Reason.PROVISIONED, now)
        machines.move("render-broken", Reason.BOOT_TIMEOUT, now)  # failed: destroyable
        with FakeHetzner() as fake:
            fake.rate_limit_remaining = 300.0  # under 10% of 3,600
            _api(fake, executor.budget).servers()
        low = Plan("render", 2, 2, 0, create=Create("render", 2),
                   drain=(Drain("render-idle", Reason.IDLE_SURPLUS),),
                   destroy=(Destroy("render-broken", Reason.BOOT_TIMEOUT),))  # fmt: skip
        assert executor.apply(low, deployment, now) == []
        assert provisioner.made == [] and provisioner.destroyed == ["render-broken"]
        assert machines.get("render-idle").state == "ready"
        told = [e.message for e in controller.events.recent(50) if e.kind == "budget_wait"]
        assert len(told) == 1  # once a minute per pool, not once per action
        assert told[0].startswith("new machines and drains of idle ones wait") and (
            "299 of 3600 requests left this hour, 10% kept for the guardian" in told[0]
        )
        explained = explain.pool(controller, "render")  # `explain pool` says it too
        assert explained["api_budget_held"] == told[0] and told[0] in explained["notes"]
        # the budget refilled: the next tick's plan goes ahead
        with FakeHetzner() as fake:
            _api(fake, executor.budget).servers()
        assert executor.apply(low, deployment, now + 1) == []
        assert len(provisioner.made) == 2 and machines.get("render-idle").state == "draining"
        assert explain.pool(controller, "render")["api_budget_held"] is None


def test_an_hour_of_50_machines_a_scale_event_a_minute_and_the_guardian_spends_under_a_third(
    tmp_path: Path,
) -> None:
    with an_hour(tmp_path) as hour:
        hour.run()
        for line in hour.lines():
            print(line)
        assert hour.destroyed_by_guardian == 0 and len(hour.cloud.servers) == 50
        assert hour.spent["scale_up"] == Counter({"POST /servers": 30})
        assert hour.spent["scale_down"] == Counter({"DELETE /servers/{id}": 30})
        # the heartbeat's first stamp lists and makes its firewall, then one PUT a minute;
        # the prices are read once (GET /pricing, and the project's snapshots); the server
        # sweep lists the project's machines every five minutes, as the guardian does
        assert hour.spent["tick"] == Counter(
            {"GET /firewalls": 1, "POST /firewalls": 1, "PUT /firewalls/{id}": 59,
             "GET /pricing": 1, "GET /images": 1, "GET /servers": 6 + 2 * 6}
        )  # fmt: skip
        # twelve passes, each one listing of the heartbeats and one of the servers, a page
        # a 50 of them: six passes see 50, six (after a scale-up) 51
        assert hour.spent["guardian"] == Counter({"GET /servers": 6 + 2 * 6, "GET /firewalls": 12})
        assert hour.total() < 3600 // 3


def test_a_refresh_reads_every_machine_from_one_listing_in_the_provider_host(
    fake: FakeHetzner,
) -> None:
    """The reads of a ``pulumi refresh`` come at once, on the provider host's threads."""
    mine = {labels.PROJECT: "shop", labels.POOL: "render"}
    ids = [
        fake.add_server(f"render-{n}", {**mine, labels.MACHINE: f"render-{n}"})["id"]
        for n in range(50)
    ]
    provider = serialize_provider(HetznerMachineProvider())
    with dynamic_host(_host_env(fake)) as host:

        def read(server_id: int) -> str:
            props = _struct({"__provider": provider, "labels": mine})
            request = provider_pb2.ReadRequest(id=str(server_id), urn=URN, properties=props)
            return str(host.Read(request, timeout=60).id)

        with ThreadPoolExecutor(8) as pool:
            assert list(pool.map(read, ids)) == [str(i) for i in ids]
        assert fake.counted() == Counter({"GET /servers": 1})
        assert read(99999) == ""  # not in the listing: read by id, and gone
        assert fake.counted() == Counter({"GET /servers": 1, "GET /servers/{id}": 1})


def test_the_creates_of_one_update_resolve_their_snapshot_selector_once(
    fake: FakeHetzner,
) -> None:
    snapshot = fake.add_snapshot({"sp00ky/pool": "render", "sp00ky/role": "snapshot"})
    provider = serialize_provider(HetznerMachineProvider())
    with dynamic_host(_host_env(fake)) as host:

        def create(name: str) -> None:
            props = {**machine_props(name), "image": "sp00ky/pool=render,sp00ky/role=snapshot"}
            request = provider_pb2.CreateRequest(
                urn=URN, properties=_struct({"__provider": provider, **props})
            )
            host.Create(request, timeout=60)

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(create, [f"render-{n}" for n in range(4)]))
    assert fake.counted() == Counter({"GET /images": 1, "POST /servers": 4})
    assert {s["image"]["id"] for s in fake.servers.values()} == {snapshot["id"]}


def _host_env(fake: FakeHetzner) -> dict[str, str]:
    return {"HCLOUD_TOKEN": TOKEN, "HCLOUD_ENDPOINT": fake.url, "PULUMI_PROJECT": "shop"}


def _struct(values: dict[str, Any]) -> struct_pb2.Struct:
    made = struct_pb2.Struct()
    made.update(values)
    return made
