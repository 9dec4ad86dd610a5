"""The client's snapshots against the fake API: create_image and its action, the listing by
label selector and type, newest first, and the delete."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sp00ky_infra.hetzner import HcloudError, HetznerAPI
from sp00ky_infra.hetzner.domain import Action, Image, Pricing
from sp00ky_infra.rehearse.cloud import TOKEN, FakeHetzner


@pytest.fixture
def fake() -> Iterator[FakeHetzner]:
    with FakeHetzner() as api:
        yield api


def _api(fake: FakeHetzner) -> HetznerAPI:
    return HetznerAPI(TOKEN, fake.url, wait=lambda *_: 0.0, sleep=lambda _: None)


def test_a_snapshot_is_made_labelled_listed_newest_first_and_deleted(fake: FakeHetzner) -> None:
    api = _api(fake)
    server = fake.add_server("bake-1", {"sp00ky/pool": "render"})
    labels = {"sp00ky/pool": "render", "sp00ky/recipe": "abc"}
    image, action = api.create_image(server["id"], "render abc", labels)
    assert (image.type, image.description, dict(image.labels)) == ("snapshot", "render abc", labels)
    assert image.name is None and image.disk_size == 80
    assert action.command == "create_image"
    assert api.wait_action(action, timeout=10).status == "success"
    newer, _ = api.create_image(server["id"], "render def", {**labels, "sp00ky/recipe": "def"})
    listed = api.images(label_selector="sp00ky/pool=render", type="snapshot")
    assert [i.id for i in listed] == [newer.id, image.id]  # newest first
    assert all(i.status == "available" and (i.image_size or 0) > 0 for i in listed)
    assert [i.id for i in api.images(label_selector="sp00ky/recipe=abc")] == [image.id]
    assert {i.id for i in api.images(type="system")}.isdisjoint({image.id, newer.id})
    assert api.delete_image(image.id) is True
    assert api.delete_image(image.id) is False  # already gone
    assert [i.id for i in api.images(type="snapshot")] == [newer.id]
    assert ("DELETE", f"/v1/images/{image.id}") in fake.requests


def test_only_a_snapshot_is_made_and_only_of_a_server_that_exists(fake: FakeHetzner) -> None:
    api = _api(fake)
    server = fake.add_server("bake-1", {})
    with pytest.raises(HcloudError) as backup:
        api.request(
            "POST", f"/servers/{server['id']}/actions/create_image", json={"type": "backup"}
        )
    assert backup.value.code == "invalid_input"
    with pytest.raises(HcloudError) as missing:
        api.create_image(999999, "gone", {})
    assert (missing.value.code, missing.value.status) == ("not_found", 404)


def test_an_action_that_fails_or_outlives_its_wait_is_an_error(fake: FakeHetzner) -> None:
    api = _api(fake)
    now = [0.0]
    api.clock, api.sleep = (lambda: now[0]), (lambda s: now.__setitem__(0, now[0] + s))
    running = fake._action("create_image", [], running=True)
    with pytest.raises(HcloudError) as late:
        api.wait_action(Action.from_json(running), timeout=5, every=1)
    assert late.value.code == "timeout" and now[0] > 5
    fake._finish(running["id"], "disk read failed")
    with pytest.raises(HcloudError) as failed:
        api.wait_action(Action.from_json(running), timeout=5)
    assert failed.value.code == "action_failed" and "disk read failed" in failed.value.message


def test_an_image_record_reads_the_api_shape() -> None:
    body = {
        "id": 4711, "type": "snapshot", "status": "creating", "name": None,
        "description": "render", "image_size": None, "disk_size": 40,
        "created": "2026-01-30T23:50:00+00:00", "labels": {"sp00ky/recipe": "abc"},
        "created_from": {"id": 1, "name": "bake-1"}, "os_flavor": "debian",
    }  # fmt: skip
    image = Image.from_json(body)
    assert (image.id, image.status, image.image_size, image.disk_size) == (
        4711, "creating", None, 40.0,
    )  # fmt: skip
    assert Image.from_json({**body, "image_size": 2.3}).image_size == 2.3


def test_pricing_reads_the_price_of_a_gb_of_snapshot_a_month() -> None:
    body = {"currency": "EUR", "vat_rate": "19.00", "server_types": [], "primary_ips": []}
    image = {"price_per_gb_month": {"net": "0.0119", "gross": "0.0142"}}
    assert Pricing.from_json({**body, "image": image}, "2026-12-05").image_per_gb_month == 0.0119
    assert Pricing.from_json(body, "2026-12-05").image_per_gb_month == 0.0  # not answered
