"""The Hetzner machine provider, serialized as Pulumi serializes it and driven through the real
provider host (`python -m pulumi.dynamic`) over gRPC, against the fake Hetzner API.

The host is started as the engine starts it: from the project directory, in the project's
virtual environment, with nothing added to PYTHONPATH.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import grpc
import pytest
import requests
from google.protobuf import struct_pb2
from pulumi.dynamic.dynamic import serialize_provider
from pulumi.runtime.proto import provider_pb2, provider_pb2_grpc

from sp00ky_infra.hetzner import HcloudError, HetznerAPI
from sp00ky_infra.infra.machine import HetznerMachineProvider, create_server
from sp00ky_infra.rehearse.cloud import TOKEN, FakeHetzner
from tests.dynamic_host import dynamic_host

URN = "urn:pulumi:prod::shop::sp00ky:infra:HetznerPool$pulumi-python:dynamic:Resource::render-a1"


@pytest.fixture
def fake() -> Iterator[FakeHetzner]:
    with FakeHetzner() as api:
        yield api


@pytest.fixture
def host(fake: FakeHetzner) -> Iterator[provider_pb2_grpc.ResourceProviderStub]:
    with dynamic_host(
        {"HCLOUD_TOKEN": TOKEN, "HCLOUD_ENDPOINT": fake.url, "PULUMI_PROJECT": "shop"}
    ) as stub:
        yield stub


def _props(**overrides: Any) -> dict[str, Any]:
    props = {
        "__provider": serialize_provider(HetznerMachineProvider()),
        "name": "render-a1",
        "server_type": "cpx42",
        "fallback_types": ["ccx33"],
        "locations": ["fsn1", "nbg1"],
        "labels": {"sp00ky/pool": "render", "sp00ky/machine": "render-a1", "sp00ky/revision": "r1"},
        "user_data": "#cloud-config\n{}\n",
        "firewall_ids": [],
        "image": "debian-12",
    }
    props.update(overrides)
    return props


def _struct(values: dict[str, Any]) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update(values)
    return struct


def _create(stub: Any, props: dict[str, Any]) -> Any:
    return stub.Create(provider_pb2.CreateRequest(urn=URN, properties=_struct(props)), timeout=60)


def test_the_first_location_out_of_capacity_lands_the_machine_in_the_second(
    fake: FakeHetzner, host: Any
) -> None:
    fake.unavailable.add(("cpx42", "fsn1"))
    created = _create(host, _props())
    server = fake.servers[int(created.id)]
    assert server["location"]["name"] == "nbg1" and server["server_type"]["name"] == "cpx42"
    outs = dict(created.properties)
    assert outs["location"] == "nbg1" and outs["skipped"] == ["cpx42@fsn1: resource_unavailable"]
    assert server["labels"]["sp00ky/machine"] == "render-a1"


def test_the_server_type_fallback_when_every_location_lacks_the_type(
    fake: FakeHetzner, host: Any
) -> None:
    fake.unavailable.update({("cpx42", "fsn1"), ("cpx42", "nbg1")})
    fake.offered["ccx33"] = {"nbg1"}  # ccx33 is not sold in fsn1 at all
    created = _create(host, _props())
    server = fake.servers[int(created.id)]
    assert (server["server_type"]["name"], server["location"]["name"]) == ("ccx33", "nbg1")
    assert dict(created.properties)["skipped"] == [
        "cpx42@fsn1: resource_unavailable",
        "cpx42@nbg1: resource_unavailable",
        "ccx33@fsn1: invalid_input (unsupported location for server type)",
    ]


def test_the_unsupported_location_answer_is_hetzners_own() -> None:
    with FakeHetzner() as fake:
        fake.offered["ccx33"] = {"nbg1"}
        answer = requests.post(
            f"{fake.url}/servers",
            json={"name": "m", "server_type": "ccx33", "image": "debian-12", "location": "fsn1"},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=10,
        )
    assert answer.status_code == 422
    assert answer.json()["error"] == {
        "code": "invalid_input",
        "message": "unsupported location for server type",
        "details": {},
    }


def test_a_label_selector_boots_the_newest_available_snapshot_that_matches(
    fake: FakeHetzner, host: Any
) -> None:
    fake.add_snapshot({"sp00ky/agent": "abc"}, datetime(2026, 1, 1, tzinfo=UTC))
    newest = fake.add_snapshot({"sp00ky/agent": "abc"}, datetime(2026, 6, 1, tzinfo=UTC))
    fake.add_snapshot({"sp00ky/agent": "old"}, datetime(2026, 9, 1, tzinfo=UTC))
    created = _create(host, _props(image="sp00ky/agent=abc"))
    assert fake.servers[int(created.id)]["image"]["id"] == newest["id"]
    assert dict(created.properties)["created_image"] == newest["id"]


def test_a_label_selector_that_matches_nothing_is_a_clear_error(
    fake: FakeHetzner, host: Any
) -> None:
    fake.add_snapshot({"sp00ky/agent": "abc"})
    with pytest.raises(grpc.RpcError) as caught:
        _create(host, _props(image="sp00ky/agent=xyz"))
    assert (
        "no available x86 snapshot matches the label selector 'sp00ky/agent=xyz' "
        "(machine.image); make one with those labels, or name an image instead"
    ) in caught.value.details()
    assert fake.servers == {}


def test_the_default_image_is_docker_ce_and_a_snapshot_id_boots_that_snapshot(
    fake: FakeHetzner,
) -> None:
    api = HetznerAPI(TOKEN, fake.url, wait=lambda *_: 0.0, sleep=lambda _: None)
    server, _ = create_server(api, _props(image=None))
    assert fake.servers[server.id]["image"]["name"] == "docker-ce"
    snapshot = fake.add_snapshot({})
    again, _ = create_server(api, _props(name="render-b2", image=str(snapshot["id"])))
    assert fake.servers[again.id]["image"]["id"] == snapshot["id"]


def test_an_unknown_image_name_is_the_apis_refusal(fake: FakeHetzner, host: Any) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        _create(host, _props(image="debian-99"))
    assert "invalid_input: image not found (HTTP 422)" in caught.value.details()


def test_a_placement_error_moves_on_to_the_next_location(fake: FakeHetzner, host: Any) -> None:
    fake.misplaced.add(("cpx42", "fsn1"))
    created = _create(host, _props())
    assert fake.servers[int(created.id)]["location"]["name"] == "nbg1"
    assert dict(created.properties)["skipped"] == ["cpx42@fsn1: placement_error"]


def test_all_out_of_capacity_is_a_clear_error(fake: FakeHetzner, host: Any) -> None:
    fake.unavailable.update({(t, loc) for t in ("cpx42", "ccx33") for loc in ("fsn1", "nbg1")})
    with pytest.raises(grpc.RpcError) as caught:
        _create(host, _props())
    details = caught.value.details()
    assert "no location or server type could take server render-a1" in details
    assert "ccx33@nbg1: resource_unavailable" in details
    assert fake.servers == {}


def test_a_quota_refusal_is_not_retried_elsewhere(fake: FakeHetzner, host: Any) -> None:
    fake.quota = 0
    with pytest.raises(grpc.RpcError) as caught:
        _create(host, _props())
    assert "resource_limit_exceeded: server limit exceeded (HTTP 403)" in caught.value.details()
    assert [r for r in fake.requests if r[0] == "POST"] == [("POST", "/v1/servers")]


def test_deleting_a_server_that_is_gone_succeeds(fake: FakeHetzner, host: Any) -> None:
    created = _create(host, _props())
    request = provider_pb2.DeleteRequest(id=created.id, urn=URN, properties=created.properties)
    host.Delete(request, timeout=60)
    assert fake.servers == {}
    host.Delete(request, timeout=60)  # already gone: done, not an error


def _diff(host: Any, olds: dict[str, Any], news: dict[str, Any]) -> Any:
    request = provider_pb2.DiffRequest(id="1", urn=URN, olds=_struct(olds), news=_struct(news))
    return host.Diff(request, timeout=60)


def test_a_deploy_never_replaces_a_server_and_labels_change_in_place(
    fake: FakeHetzner, host: Any
) -> None:
    created = _create(host, _props())
    olds = dict(created.properties)
    labels = olds["labels"]
    # What matters to new machines only: no change at all, so no API call.
    for news in (
        _props(user_data="#cloud-config\n{write_files: []}\n"),  # a fresh join token
        _props(server_type="cx33", fallback_types=[], locations=["hel1"], image="debian-13"),
        _props(firewall_ids=["4242"]),
        _props(labels={**labels, "sp00ky/revision": "r2"}),  # it keeps its own revision
    ):
        diff = _diff(host, olds, news)
        assert list(diff.replaces) == []
        assert diff.changes == provider_pb2.DiffResponse.DIFF_NONE
    # A deploy that also changes a label: an in-place change, never a replacement.
    news = _props(labels={**labels, "sp00ky/revision": "r2", "sp00ky/limit": "8"})
    diff = _diff(host, olds, news)
    assert list(diff.replaces) == [] and diff.changes == provider_pb2.DiffResponse.DIFF_SOME
    before = len(fake.requests)
    updated = host.Update(
        provider_pb2.UpdateRequest(
            id=created.id, urn=URN, olds=created.properties, news=_struct(news)
        ),
        timeout=60,
    )
    server = fake.servers[int(created.id)]
    assert server["labels"] == {**labels, "sp00ky/limit": "8"}  # revision r1: its own
    assert dict(dict(updated.properties)["labels"]) == server["labels"]
    assert fake.requests[before:] == [("PUT", f"/v1/servers/{created.id}")]
    assert list(fake.servers) == [int(created.id)]  # the same server, never a second one


def test_a_create_answered_with_a_5xx_after_the_server_was_made_returns_that_server(
    fake: FakeHetzner, host: Any
) -> None:
    fake.create_then_fail = [(504, "timeout")]
    created = _create(host, _props())
    assert list(fake.servers) == [int(created.id)]
    posts = [r for r in fake.requests if r[0] == "POST"]
    assert posts == [("POST", "/v1/servers")]  # looked up by name, not created again
    assert ("GET", "/v1/servers") in fake.requests


def test_a_create_that_times_out_after_the_server_was_made_returns_that_server(
    fake: FakeHetzner,
) -> None:
    fake.create_then_stall = 2.0
    api = HetznerAPI(TOKEN, fake.url, timeout=0.3, wait=lambda *_: 0.0, sleep=lambda _: None)
    server, skipped = create_server(api, _props())
    assert list(fake.servers) == [server.id] and skipped == []
    assert server.name == "render-a1" and server.labels["sp00ky/machine"] == "render-a1"
    assert [r for r in fake.requests if r[0] == "POST"] == [("POST", "/v1/servers")]


def test_a_create_that_failed_before_making_the_server_is_tried_again(
    fake: FakeHetzner,
) -> None:
    fake.fail_next = [(503, "unavailable", None)]
    api = HetznerAPI(TOKEN, fake.url, wait=lambda *_: 0.0, sleep=lambda _: None)
    server, _ = create_server(api, _props())
    assert list(fake.servers) == [server.id]
    assert [r[0] for r in fake.requests] == ["POST", "GET", "POST"]


def test_deleting_a_locked_server_waits_for_it(fake: FakeHetzner, host: Any) -> None:
    created = _create(host, _props())
    fake.fail_next = [(423, "locked", None)]
    request = provider_pb2.DeleteRequest(id=created.id, urn=URN, properties=created.properties)
    host.Delete(request, timeout=60)
    assert fake.servers == {}
    assert [r for r in fake.requests if r[0] == "DELETE"] == [
        ("DELETE", f"/v1/servers/{created.id}")
    ] * 2


def test_the_token_is_read_at_run_time_and_never_stored(fake: FakeHetzner, host: Any) -> None:
    created = _create(host, _props())
    assert TOKEN not in str(created.properties)


# --- the API client itself ---------------------------------------------------------------------


def _api(fake: FakeHetzner, waits: list[float]) -> HetznerAPI:
    return HetznerAPI(
        TOKEN, fake.url, wait=lambda attempt, after: after if after is not None else 0.01 * attempt,
        sleep=waits.append,
    )  # fmt: skip


def test_rate_limits_are_waited_out_honouring_retry_after(fake: FakeHetzner) -> None:
    waits: list[float] = []
    fake.fail_next = [(429, "rate_limit_exceeded", 7.0), (503, "service_error", None)]
    assert _api(fake, waits).servers() == []
    assert waits == [7.0, 0.02]


def test_listing_follows_every_page(fake: FakeHetzner) -> None:
    for n in range(130):
        fake.add_server(f"s{n}", {"sp00ky/pool": "render" if n % 2 else "other"})
    api = _api(fake, [])
    assert len(api.servers()) == 130
    assert len(api.servers("sp00ky/pool=render")) == 65
    assert len([r for r in fake.requests if r == ("GET", "/v1/servers")]) == 3 + 2


def test_errors_carry_the_api_code(fake: FakeHetzner) -> None:
    with pytest.raises(HcloudError, match="unauthorized") as caught:
        HetznerAPI("wrong", fake.url).servers()
    assert caught.value.status == 401
    with pytest.raises(HcloudError, match="HCLOUD_TOKEN is not set"):
        HetznerAPI.from_env({})
    assert _api(fake, []).delete_server(424242) is False
    waits: list[float] = []
    fake.fail_next = [(503, "service_error", None)] * 5
    with pytest.raises(HcloudError) as failed:
        _api(fake, waits).servers()
    assert failed.value.code == "service_error" and len(waits) == 4


def test_a_machine_keeps_the_image_it_booted_when_its_baked_pool_gets_its_snapshot(
    fake: FakeHetzner, host: Any
) -> None:
    """A baked pool's machines boot docker-ce until the bake is done, then its snapshot's
    selector: the machine made before keeps its server, no call is made."""
    created = _create(host, _props(image="docker-ce"))
    olds = dict(created.properties)
    assert olds["created_image"] == "docker-ce"
    before = len(fake.requests)
    selector = "sp00ky/project=shop,sp00ky/pool=render,sp00ky/role=snapshot,sp00ky/recipe=abc"
    diff = _diff(host, olds, _props(image=selector))
    assert list(diff.replaces) == [] and diff.changes == provider_pb2.DiffResponse.DIFF_NONE
    assert fake.requests[before:] == []
    assert fake.servers[int(created.id)]["image"]["name"] == "docker-ce"
