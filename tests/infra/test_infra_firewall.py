"""The pool firewall's provider, serialized as Pulumi serializes it and driven through the real
provider host (`python -m pulumi.dynamic`) over gRPC, against the fake Hetzner API; the
machine provider runs in the same host where a test needs a server the firewall guards."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from google.protobuf import struct_pb2
from pulumi.dynamic.dynamic import serialize_provider
from pulumi.runtime.proto import provider_pb2, provider_pb2_grpc

from sp00ky_infra.hetzner import HetznerAPI
from sp00ky_infra.infra.firewall import (
    IN_USE_TRIES,
    FirewallError,
    HetznerFirewallProvider,
    delete_firewall,
)
from sp00ky_infra.infra.machine import HetznerMachineProvider
from sp00ky_infra.rehearse.cloud import TOKEN, FakeHetzner
from tests.dynamic_host import dynamic_host

URN = "urn:pulumi:prod::shop::sp00ky:infra:HetznerPool$pulumi-python:dynamic:Resource::"
LABELS = {"sp00ky/project": "shop", "sp00ky/pool": "render", "sp00ky/limit": "2"}


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
        "__provider": serialize_provider(HetznerFirewallProvider()),
        "name": "sp00ky-shop-render",
        "labels": LABELS,
    }
    props.update(overrides)
    return props


def _struct(values: dict[str, Any]) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update(values)
    return struct


def _create(host: Any, props: dict[str, Any], name: str = "render-firewall") -> Any:
    request = provider_pb2.CreateRequest(urn=URN + name, properties=_struct(props))
    return host.Create(request, timeout=60)


def _delete(host: Any, created: Any, name: str = "render-firewall") -> None:
    request = provider_pb2.DeleteRequest(
        id=created.id, urn=URN + name, properties=created.properties
    )
    host.Delete(request, timeout=60)


def _deletes(fake: FakeHetzner, firewall_id: str) -> list[tuple[str, str]]:
    return [r for r in fake.requests if r == ("DELETE", f"/v1/firewalls/{firewall_id}")]


def test_create_makes_a_firewall_with_no_rules_and_the_pools_labels(
    fake: FakeHetzner, host: Any
) -> None:
    created = _create(host, _props())
    firewall = fake.firewalls[int(created.id)]
    assert firewall["name"] == "sp00ky-shop-render" and firewall["labels"] == LABELS
    assert firewall["rules"] == []  # no in rule: all inbound dropped; no out rule: all goes
    outs = dict(created.properties)
    assert outs["firewall_id"] == int(created.id) and dict(outs["labels"]) == LABELS
    assert TOKEN not in str(created.properties)  # read at run time, never stored
    assert [r for r in fake.requests if r[0] == "POST"] == [("POST", "/v1/firewalls")]


def test_a_create_answered_with_a_5xx_after_the_firewall_was_made_returns_it(
    fake: FakeHetzner, host: Any
) -> None:
    fake.create_then_fail = [(504, "timeout")]
    created = _create(host, _props())
    assert list(fake.firewalls) == [int(created.id)]
    assert [r for r in fake.requests if r[0] == "POST"] == [("POST", "/v1/firewalls")]
    assert ("GET", "/v1/firewalls") in fake.requests  # looked up by name, not made again


def test_read_finds_the_firewall_and_a_firewall_deleted_behind_its_back_is_gone(
    fake: FakeHetzner, host: Any
) -> None:
    created = _create(host, _props())
    fake.firewalls[int(created.id)]["labels"] = {**LABELS, "by": "hand"}
    request = provider_pb2.ReadRequest(id=created.id, urn=URN, properties=created.properties)
    found = host.Read(request, timeout=60)
    assert found.id == created.id
    assert dict(dict(found.properties)["labels"]) == {**LABELS, "by": "hand"}  # as it is
    del fake.firewalls[int(created.id)]
    gone = host.Read(request, timeout=60)
    assert gone.id == ""  # so `pulumi refresh` drops it from the state


def _diff(host: Any, created: Any, news: dict[str, Any]) -> Any:
    request = provider_pb2.DiffRequest(
        id=created.id, urn=URN, olds=created.properties, news=_struct(news)
    )
    return host.Diff(request, timeout=60)


def test_labels_and_name_change_in_place_never_by_replacement(fake: FakeHetzner, host: Any) -> None:
    created = _create(host, _props())
    assert _diff(host, created, _props()).changes == provider_pb2.DiffResponse.DIFF_NONE
    news = _props(labels={**LABELS, "sp00ky/limit": "8"})
    diff = _diff(host, created, news)
    assert diff.changes == provider_pb2.DiffResponse.DIFF_SOME and list(diff.replaces) == []
    before = len(fake.requests)
    updated = host.Update(
        provider_pb2.UpdateRequest(
            id=created.id, urn=URN, olds=created.properties, news=_struct(news)
        ),
        timeout=60,
    )
    assert fake.requests[before:] == [("PUT", f"/v1/firewalls/{created.id}")]
    assert list(fake.firewalls) == [int(created.id)]  # the same firewall, never a second
    assert fake.firewalls[int(created.id)]["labels"] == {**LABELS, "sp00ky/limit": "8"}
    assert dict(dict(updated.properties)["labels"])["sp00ky/limit"] == "8"
    renamed = _props(name="sp00ky-shop-render2")
    diff = _diff(host, created, renamed)
    assert diff.changes == provider_pb2.DiffResponse.DIFF_SOME and list(diff.replaces) == []


def test_delete_waits_for_a_server_deleted_in_the_same_update_to_let_go(
    fake: FakeHetzner, host: Any
) -> None:
    firewall = _create(host, _props())
    server_props = {
        "__provider": serialize_provider(HetznerMachineProvider()),
        "name": "render-a1", "server_type": "cx33", "fallback_types": [],
        "locations": ["fsn1"], "labels": {**LABELS, "sp00ky/machine": "render-a1"},
        "user_data": "#cloud-config\n{}\n", "firewall_ids": [firewall.id],
        "image": "debian-12",
    }  # fmt: skip
    server = _create(host, server_props, "render-a1")
    applied = fake.firewalls[int(firewall.id)]["applied_to"]
    assert applied == [{"type": "server", "server": {"id": int(server.id)}}]
    # The server's deletion runs on after its DELETE is answered: the firewall is still
    # applied to it at the firewall's first DELETE, and free at the next.
    fake.server_delete_lag = 1
    _delete(host, server, "render-a1")
    _delete(host, firewall)
    assert fake.firewalls == {} and fake.servers == {}
    assert len(_deletes(fake, firewall.id)) == 2


def test_a_firewall_in_use_for_too_long_fails_saying_so(fake: FakeHetzner) -> None:
    slept: list[float] = []
    api = HetznerAPI(
        TOKEN, fake.url, busy_tries=IN_USE_TRIES, wait=lambda n, _: float(n), sleep=slept.append
    )
    firewall_id = api.create_firewall("sp00ky-shop-render", LABELS).id
    server = fake.add_server("render-a1", {})  # not being deleted: it keeps the firewall
    fake.firewalls[firewall_id]["applied_to"].append(
        {"type": "server", "server": {"id": server["id"]}}
    )
    assert api.get_firewall(firewall_id).servers == (server["id"],)
    with pytest.raises(FirewallError) as caught:
        delete_firewall(api, str(firewall_id), "sp00ky-shop-render")
    assert str(caught.value).startswith(
        f"firewall sp00ky-shop-render ({firewall_id}) is still applied to servers after "
        f"{IN_USE_TRIES} tries (resource_in_use: firewall with ID {firewall_id} is still in "
        "use (HTTP 422)); servers deleted in this update may still be shutting down"
    )
    assert len(_deletes(fake, str(firewall_id))) == IN_USE_TRIES
    assert slept == [float(n) for n in range(1, IN_USE_TRIES)]  # bounded: no wait after the last
    assert firewall_id in fake.firewalls


def test_deleting_a_firewall_that_is_gone_is_done(fake: FakeHetzner, host: Any) -> None:
    created = _create(host, _props())
    del fake.firewalls[int(created.id)]
    _delete(host, created)  # not found: done, not an error
    assert _deletes(fake, created.id) == [("DELETE", f"/v1/firewalls/{created.id}")]
